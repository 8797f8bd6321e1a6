package roce

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
)

// TestWindowBelowQueues streams over a lossless link (shared memory, with
// backpressure) long enough for the requester's window to open all the
// way, and checks where it stops. Over a network path (the shm link
// seen as a plain Link, as a UDP or XDP link is): below the 1000-packet
// queues a packet meets on Linux (a tap's or veth's txqueuelen,
// netdev_max_backlog), which a window of 1024 overflowed against a slow
// Linux rxe guest (see maxInflight). Over the shm link as itself, which
// pushes back rather than drop: maxInflightLossless. The timeout is long
// (4.3 s), so no round trip under load reaches the delay target and
// shrinks the window before it is full.
func TestWindowBelowQueues(t *testing.T) {
	const linuxQueue = 1000 // Linux's default txqueuelen and netdev_max_backlog
	if cwnd := windowAfterStream(t, false); cwnd > linuxQueue/2+linuxQueue/20 || cwnd != maxInflight {
		t.Fatalf("window %d packets over a network path: want maxInflight (%d), at most about half of Linux's %d-packet queues", cwnd, maxInflight, linuxQueue)
	}
	if cwnd := windowAfterStream(t, true); cwnd != maxInflightLossless {
		t.Fatalf("window %d packets over a link that pushes back, want maxInflightLossless (%d)", cwnd, maxInflightLossless)
	}
}

// plainLink hides every method of a Link but the interface's (so an
// ShmLink does not say it is lossless).
type plainLink struct{ link.Link }

// windowAfterStream streams over a pair of shm links, seen as themselves
// (lossless) or as plain links, and returns the sender's window at the end.
func windowAfterStream(t *testing.T, lossless bool) int {
	dir := t.TempDir()
	var eng [2]*Engine
	for i, ip := range []string{"10.1.0.1", "10.1.0.2"} {
		l, err := link.ListenShm(netip.AddrPortFrom(netip.MustParseAddr(ip), 4791), link.ShmConfig{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		var lk link.Link = l
		if !lossless {
			lk = plainLink{l}
		}
		e, err := NewEngine(EngineConfig{Link: lk})
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		eng[i] = e
	}
	a, b, pa, pb := connect(t, eng[0], eng[1], QPConfig{SQDepth: 256}, QPAttr{Timeout: 20, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
	// 1024 messages of 4 packets at the 1024 B path MTU: the window
	// doubles from initWindow after each window acknowledged, so it
	// reaches maxInflight within the first thousand packets.
	const n, size, burst = 1024, 4096, 32
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
		for got := 0; got < n; {
			k, err := b.RecvWait(ctx, msgs)
			if err != nil {
				errc <- err
				return
			}
			got += k
		}
		errc <- nil
	}()
	msgs := make([]fabric.Message, burst)
	for i := range msgs {
		msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * size, Length: size}}}
	}
	for sent := 0; sent < n; {
		k, err := a.SendWait(ctx, msgs[:min(burst, n-sent)])
		if err != nil {
			t.Fatalf("send at %d: %v", sent, err)
		}
		sent += k
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	cwnd, ssthresh := a.cwnd, a.ssthresh
	a.mu.Unlock()
	if r := a.retransmissions(); r != [numRetxCauses]retxCount{} {
		t.Fatalf("a lossless link resent: %+v", r)
	}
	if ssthresh != cwnd {
		t.Fatalf("window %d, threshold %d: the threshold moved on a lossless stream", cwnd, ssthresh)
	}
	return cwnd
}
