package roce

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/link"
)

// TestGoBackNOnNAK streams messages over RC through links that drop 3% of
// the datagrams each way, and checks who recovered the losses: the
// requester must go back on the responder's PSN-sequence NAKs, and those
// rewinds must carry the recovery, with the retransmission timer left for
// what no NAK can report (a lost NAK, a loss at the end of a burst).
// Timeouts alone also deliver every message, only several times slower:
// without this test a requester that ignored sequence NAKs passed
// everything else.
func TestGoBackNOnNAK(t *testing.T) {
	const n, burst, size = 20_000, 64, 32
	ea, eb, lossy := enginePair(t, 4791, link.LossConfig{Drop: 0.03, Seed: 11})
	// The timeout (16.8 ms) is far above the loopback round trip, so the
	// timer only fires for losses that nothing else reports.
	a, b, pa, pb := connect(t, ea, eb, QPConfig{SQDepth: 1024}, QPAttr{Timeout: 12, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
	src, _ := pa.RegMR(make([]byte, burst*size), 0)
	dst, _ := pb.RegMR(make([]byte, burst*size), fabric.AccessLocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		msgs := make([]fabric.Message, burst)
		for i := range msgs {
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: i * size, Length: size}}}
		}
		for next := 0; next < n; {
			k, err := b.RecvWait(ctx, msgs)
			if err != nil {
				errc <- err
				return
			}
			for i := 0; i < k; i++ {
				if got := binary.LittleEndian.Uint64(dst.Bytes()[i*size:]); got != uint64(next) {
					errc <- fmt.Errorf("message %d arrived where %d was due", got, next)
					return
				}
				next++
			}
		}
		errc <- nil
	}()
	msgs := make([]fabric.Message, burst)
	for sent := 0; sent < n; {
		k := min(burst, n-sent)
		for i := 0; i < k; i++ {
			binary.LittleEndian.PutUint64(src.Bytes()[i*size:], uint64(sent+i))
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * size, Length: size}}}
		}
		m, err := a.SendWait(ctx, msgs[:k])
		if err != nil {
			t.Fatalf("send at %d: %v (retransmissions %+v)", sent, err, a.retransmissions())
		}
		sent += m
		// The same rule as at the end, checked on the way once the
		// timer has fired often enough to judge: a requester that leaves
		// the recovery to the timer fails here in a fraction of a second
		// rather than after a slow stream.
		if r := a.retransmissions(); r[retxTimeout].rewinds >= 20 && r[retxNAK].rewinds <= 2*r[retxTimeout].rewinds {
			t.Fatalf("after %d messages: %d rewinds on sequence NAKs, %d on timeouts", sent, r[retxNAK].rewinds, r[retxTimeout].rewinds)
		}
	}
	if err := testenv.Recv(t, errc, "the receiver"); err != nil {
		t.Fatal(err)
	}
	var dropped uint64
	for _, l := range lossy {
		dropped += l.Faults().Dropped
	}
	r := a.retransmissions()
	nak, tmo := r[retxNAK], r[retxTimeout]
	t.Logf("%d drops injected; NAK: %d rewinds, %d packets; timeout: %d rewinds, %d packets; stats %+v",
		dropped, nak.rewinds, nak.packets, tmo.rewinds, tmo.packets, a.Stats())
	if dropped == 0 {
		t.Fatal("no datagram was dropped: the test proves nothing")
	}
	if nak.rewinds == 0 || nak.packets == 0 {
		t.Fatalf("no retransmission on a sequence NAK (timeouts: %d rewinds, %d packets)", tmo.rewinds, tmo.packets)
	}
	if nak.packets <= 2*tmo.packets || nak.rewinds <= 2*tmo.rewinds {
		t.Fatalf("sequence NAKs did not carry the recovery: %d rewinds and %d packets on NAKs, %d and %d on timeouts",
			nak.rewinds, nak.packets, tmo.rewinds, tmo.packets)
	}
}

// stallLink is a Link whose writes can be held back: while stalled it
// queues every datagram, and release sends them in order. Under a
// requester's peer it plays a responder that stops answering for longer
// than the requester's timeout and then acknowledges everything it
// received, as Linux rxe in an emulated guest did under a window it
// could not keep up with (issue 28).
type stallLink struct {
	link.Link
	mu      sync.Mutex
	stalled bool
	held    []link.Packet
}

func (l *stallLink) WriteBatch(pkts []link.Packet) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stalled {
		return l.Link.WriteBatch(pkts)
	}
	for _, p := range pkts {
		p.Buf = bytes.Clone(p.Buf[:p.N])
		l.held = append(l.held, p)
	}
	return len(pkts), nil
}

// QPNBlock returns the block of the link it wraps (the engine takes its
// QPNs from it: packets for other QPNs go to other sockets).
func (l *stallLink) QPNBlock() uint32 {
	if b, ok := l.Link.(interface{ QPNBlock() uint32 }); ok {
		return b.QPNBlock()
	}
	return 0
}

func (l *stallLink) stall() {
	l.mu.Lock()
	l.stalled = true
	l.mu.Unlock()
}

// release sends what the stall held back and lets writes through again.
func (l *stallLink) release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stalled = false
	for len(l.held) > 0 {
		n, err := l.Link.WriteBatch(l.held)
		if err != nil {
			return err
		}
		l.held = l.held[n:]
		if n == 0 {
			time.Sleep(time.Millisecond) // backpressure
		}
	}
	return nil
}

// TestTimeoutAfterStall streams RDMA WRITEs to a responder whose
// acknowledgements are held back across two retransmission timeouts and
// then all delivered: the responder received the whole flight, so the
// timeouts were spurious. Each may resend only its probe (minWindow
// packets), not the flight: going back over all of it made Weft resend
// 6-10% of what it streamed into Linux rxe in an emulated guest, which
// stalled like this (issue 28).
func TestTimeoutAfterStall(t *testing.T) {
	const msgs, size = 16, 16 << 10 // 256 packets at MTU 1024: more than initWindow
	var engines [2]*Engine
	var sl *stallLink
	for i, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		l, err := link.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(ip), 4791))
		if err != nil {
			t.Fatal(err)
		}
		var link link.Link = l
		if i == 1 {
			sl = &stallLink{Link: l}
			link = sl
		}
		e, err := NewEngine(EngineConfig{Link: link})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		engines[i] = e
	}
	// Timeout 10 is 4.2 ms, doubled for the second timeout.
	a, b, pa, pb := connect(t, engines[0], engines[1], QPConfig{SQDepth: 64},
		QPAttr{Timeout: 10, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
	src, _ := pa.RegMR(make([]byte, msgs*size), 0)
	dst, _ := pb.RegMR(make([]byte, msgs*size), fabric.AccessRemoteWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sl.stall()
	m := make([]fabric.Message, msgs)
	for i := range m {
		m[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * size, Length: size}},
			Remote: fabric.RemoteIOV{Addr: dst.Addr() + uint64(i*size), Len: size, Key: dst.RemoteKey()}}
	}
	m[msgs-1].Flags = fabric.FlagSignal
	if _, err := a.postWait(ctx, m, a.Write); err != nil {
		t.Fatal(err)
	}
	for a.retransmissions()[retxTimeout].rewinds < 2 {
		if ctx.Err() != nil {
			t.Fatalf("no second timeout: retransmissions %+v", a.retransmissions())
		}
		time.Sleep(time.Millisecond)
	}
	if err := sl.release(); err != nil {
		t.Fatal(err)
	}
	out := make([]fabric.Completion, 1)
	if _, err := a.cq.Wait(ctx, out); err != nil {
		t.Fatal(err)
	}
	if err := out[0].Err(); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock() // the responder may still be taking in the last probe
	same := bytes.Equal(src.Bytes(), dst.Bytes())
	b.mu.Unlock()
	if !same {
		t.Fatal("the written data differs")
	}
	r := a.retransmissions()
	sent := a.Stats().TxPackets
	resent := int(sent) - msgs*size/1024
	t.Logf("%d packets sent for %d; retransmissions %+v", sent, msgs*size/1024, r)
	if most := int(r[retxTimeout].rewinds) * minWindow; resent > most || r[retxNAK].rewinds != 0 {
		t.Fatalf("%d packets resent after %d spurious timeouts (at most %d), %d NAK rewinds",
			resent, r[retxTimeout].rewinds, most, r[retxNAK].rewinds)
	}
}

// TestBackoff: a short timeout doubles on each consecutive timeout, at
// most 64-fold and up to maxBackoff; a timeout longer than maxBackoff
// (rdma_cm's default, 19: 2.1 s) is not doubled, so that a peer that is
// gone is noticed after the retries' timeouts, as by Linux's QPs, and
// not after minutes.
func TestBackoff(t *testing.T) {
	total := func(exp uint8, retries int) time.Duration {
		var sum time.Duration
		for n := range retries + 1 {
			sum += backoff(TimeoutDuration(exp), n)
		}
		return sum
	}
	d := TimeoutDuration(12) // 16.8 ms: 64-fold is 1.07 s, under the cap
	for n, want := range []time.Duration{d, 2 * d, 4 * d, 8 * d, 16 * d, 32 * d, 64 * d, 64 * d} {
		if got := backoff(d, n); got != want {
			t.Errorf("timeout 12, %d timeouts: %v, want %v", n, got, want)
		}
	}
	if got := backoff(TimeoutDuration(14), 6); got != maxBackoff {
		t.Errorf("timeout 14, 6 timeouts: %v, want the cap %v", got, maxBackoff)
	}
	long := TimeoutDuration(DefaultCMACKTimeout)
	for n := range 8 {
		if got := backoff(long, n); got != long {
			t.Errorf("timeout %d, %d timeouts: %v, want %v undoubled", DefaultCMACKTimeout, n, got, long)
		}
	}
	// Retry 7: the first wait and seven more.
	if got := total(12, 7); got > 3300*time.Millisecond {
		t.Errorf("a peer gone at timeout 12 is noticed after %v, over the 3.3 s the docs give", got)
	}
	if got := total(DefaultCMACKTimeout, 7); got > 18*time.Second {
		t.Errorf("a peer gone at timeout %d is noticed after %v, want about 17 s", DefaultCMACKTimeout, got)
	}
}
