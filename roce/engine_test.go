package roce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/internal/mmsg"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

var soakN = flag.Int("soak", 0, "messages in the lossy RC soak (0: 1e6, or 2e5 under the race detector)")

// engines starts two engines on 127.0.0.1 and 127.0.0.2 (UDP port port),
// each link wrapped with the given faults.
func enginePair(t testing.TB, port uint16, loss link.LossConfig) (*Engine, *Engine, []*link.LossyLink) {
	t.Helper()
	var out [2]*Engine
	var lossy []*link.LossyLink
	for i, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		l, err := link.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(ip), port))
		if err != nil {
			t.Fatal(err)
		}
		var lk link.Link = l
		if loss != (link.LossConfig{}) {
			ll := link.NewLossyLink(l, loss)
			lossy = append(lossy, ll)
			lk = ll
		}
		e, err := NewEngine(EngineConfig{Link: lk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		out[i] = e
	}
	return out[0], out[1], lossy
}

// connect creates and connects a QP pair directly (no TCP exchange).
func connect(t testing.TB, ea, eb *Engine, cfg QPConfig, attr QPAttr) (*QP, *QP, *PD, *PD) {
	t.Helper()
	pa, pb := ea.AllocPD(), eb.AllocPD()
	a, err := pa.CreateQP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pb.CreateQP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Destroy(); b.Destroy() })
	if attr.PathMTU == 0 {
		attr.PathMTU = 1024
	}
	aa, ba := attr, attr
	aa.Dest, aa.DestQPN, aa.RQPSN, aa.SQPSN = ea.LocalAddr().Next(), b.QPN(), 0xfffff0, 0x100
	aa.Dest = eb.LocalAddr()
	ba.Dest, ba.DestQPN, ba.RQPSN, ba.SQPSN = ea.LocalAddr(), a.QPN(), 0x100, 0xfffff0
	if err := a.Connect(&aa); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(&ba); err != nil {
		t.Fatal(err)
	}
	return a, b, pa, pb
}

func TestRawReceive(t *testing.T) {
	l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:4791"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.Raw() {
		testenv.SkipOrFail(t, "no raw socket (needs CAP_NET_RAW): IPv4 ICRCs are checked over rebuilt headers")
	}
}

// TestLossySoak sends many messages over RC through links that drop,
// reorder, duplicate and corrupt 5% of the packets in each direction,
// and checks that every message arrives exactly once and in order. The
// PSNs start just below the 24-bit wrap, so PSN arithmetic wraps too.
func TestLossySoak(t *testing.T) {
	n := *soakN
	if n == 0 {
		n = 1_000_000
		if raceEnabled || testing.Short() {
			n = 200_000
		}
	}
	loss := link.LossConfig{Drop: 0.05, Reorder: 0.01, Duplicate: 0.01, Corrupt: 0.005, Seed: 42}
	ea, eb, lossy := enginePair(t, 4791, loss)
	a, b, pa, pb := connect(t, ea, eb, QPConfig{SQDepth: 1024}, QPAttr{Timeout: 10, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
	const burst = 64
	const size = 32
	src, _ := pa.RegMR(make([]byte, burst*size), 0)
	dst, _ := pb.RegMR(make([]byte, burst*size), fabric.AccessLocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
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
				got := binary.LittleEndian.Uint64(dst.Bytes()[i*size:])
				if got != uint64(next) || msgs[i].Len != size {
					errc <- errors.New("out of order, lost or duplicated: got " + itoa(int(got)) + " want " + itoa(next))
					return
				}
				next++
			}
		}
		errc <- nil
	}()
	msgs := make([]fabric.Message, burst)
	start := time.Now()
	for sent := 0; sent < n; {
		k := min(burst, n-sent)
		for i := 0; i < k; i++ {
			binary.LittleEndian.PutUint64(src.Bytes()[i*size:], uint64(sent+i))
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * size, Length: size}}}
		}
		m, err := a.SendWait(ctx, msgs[:k])
		if err != nil {
			b.mu.Lock()
			t.Logf("responder: epsn %d nakSent %v ackDirty %v rq %d/%d state %v", b.epsn, b.nakSent, b.ackDirty, b.rqHead, b.rqTail, b.state)
			for i := 0; i < len(b.trace); i++ {
				e := b.trace[(b.traceN+i)%len(b.trace)]
				t.Logf("  trace psn %d epsn %d op %#x", e[0], e[1], e[2])
			}
			b.mu.Unlock()
			for i := 0; i < len(a.trace); i++ {
				e := a.trace[(a.traceN+i)%len(a.trace)]
				t.Logf("  requester trace psn %d una %d op/syn %#x", e[0], e[1], e[2])
			}
			t.Logf("requester stats %+v", a.Stats())
			t.Logf("responder stats %+v", b.Stats())
			for _, e := range []*Engine{ea, eb} {
				var ul *link.UDPLink
				switch l := e.link.(type) {
				case *link.LossyLink:
					ul, _ = l.Link.(*link.UDPLink)
				case *link.UDPLink:
					ul = l
				}
				q := -1
				if ul != nil {
					fd := ul.ReceiveFD()
					q, _ = unix.IoctlGetInt(fd, unix.SIOCINQ)
					pb := make([]byte, 4096)
					n, _, _, _, perr := unix.Recvmsg(fd, pb, nil, unix.MSG_PEEK|unix.MSG_DONTWAIT)
					t.Logf("  peek: %d bytes, %v; head % x", n, perr, pb[:max(0, min(n, 48))])
					tb := mmsg.NewBatch(4)
					tm := []mmsg.Message{{Buf: make([]byte, 9000)}}
					k, rerr := tb.Recv(fd, tm)
					t.Logf("  fresh recvmmsg: %d %v n=%d", k, rerr, tm[0].N)
				}
				locked := !e.pollMu.TryLock()
				if !locked {
					e.pollMu.Unlock()
				}
				t.Logf("engine %v: spinner %d pollMu locked %v queued bytes %d", e.local, e.spinner.Load(), locked, q)
				for _, l := range e.debugEvents() {
					t.Logf("    %s", l)
				}
			}
			if debugRoce {
				buf := make([]byte, 1<<20)
				t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
			}
			t.Logf("engine A %+v", ea.Stats())
			t.Logf("engine B %+v", eb.Stats())
			t.Fatalf("send at %d: %v", sent, err)
		}
		sent += m
	}
	if err := testenv.Recv(t, errc, "the receiver"); err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	st := a.Stats()
	var faults link.LossFaults
	for _, l := range lossy {
		f := l.Faults()
		faults.Dropped += f.Dropped
		faults.Reordered += f.Reordered
		faults.Duplicated += f.Duplicated
		faults.Corrupted += f.Corrupted
	}
	t.Logf("%d messages in %v (%.0f msg/s) under %v: %d retransmitted packets; injected %d drops, %d reorders, %d duplicates, %d corruptions; checksum drops %d+%d",
		n, el.Round(time.Millisecond), float64(n)/el.Seconds(), loss, st.Retransmits, faults.Dropped, faults.Reordered, faults.Duplicated, faults.Corrupted,
		ea.Stats().Drops[fabric.DropChecksum], eb.Stats().Drops[fabric.DropChecksum])
	if faults.Dropped == 0 || faults.Corrupted == 0 || st.Retransmits == 0 {
		t.Errorf("the soak injected no faults or needed no retransmission")
	}
	if ea.Stats().Drops[fabric.DropChecksum]+eb.Stats().Drops[fabric.DropChecksum] == 0 {
		t.Errorf("corrupted packets were not caught by the ICRC")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestLossyRMA writes and reads large buffers over lossy links and checks
// every byte, including multi-packet reads whose responses are lost: the
// links must have dropped datagrams both ways, and the requester must have
// retransmitted, both writes and reads.
func TestLossyRMA(t *testing.T) {
	ea, eb, lossy := enginePair(t, 4791, link.LossConfig{Drop: 0.05, Reorder: 0.02, Duplicate: 0.02, Seed: 7})
	a, b, pa, pb := connect(t, ea, eb, QPConfig{}, QPAttr{Timeout: 11, RetryCnt: 7, RNRRetry: 7})
	const size = 256 << 10
	target, _ := pb.RegMR(make([]byte, size), fabric.AccessLocalWrite|fabric.AccessRemoteWrite|fabric.AccessRemoteRead)
	src, _ := pa.RegMR(make([]byte, size), 0)
	back, _ := pa.RegMR(make([]byte, size), fabric.AccessLocalWrite)
	var readRetx uint64
	for round := 0; round < 8; round++ {
		for i := range src.Bytes() {
			src.Bytes()[i] = byte(i*7 + round*13)
		}
		w := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Remote: target.Remote(), Flags: fabric.FlagSignal, Context: 1}}
		if _, err := a.Write(w); err != nil {
			t.Fatal(err)
		}
		waitCompletion(t, a, 1)
		// The write's completion at A is no synchronisation with B's
		// memory (the ACK crossed a socket, which the race detector
		// cannot see, and RDMA promises the target's CPU nothing by it):
		// look at the target under the lock B's responder wrote it with.
		b.mu.Lock()
		same := bytes.Equal(target.Bytes(), src.Bytes())
		b.mu.Unlock()
		if !same {
			t.Fatalf("round %d: written bytes differ", round)
		}
		clear(back.Bytes())
		before := a.Stats().Retransmits
		r := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(back)}, Remote: target.Remote(), Flags: fabric.FlagSignal, Context: 2}}
		if _, err := a.Read(r); err != nil {
			t.Fatal(err)
		}
		waitCompletion(t, a, 2)
		if !bytes.Equal(back.Bytes(), src.Bytes()) {
			t.Fatalf("round %d: read bytes differ", round)
		}
		readRetx += a.Stats().Retransmits - before
	}
	retx := a.Stats().Retransmits
	t.Logf("retransmitted packets: %d (%d for reads); retransmissions by cause %+v", retx, readRetx, a.retransmissions())
	for i, l := range lossy {
		f := l.Faults()
		d, r, u := f.Dropped, f.Reordered, f.Duplicated
		t.Logf("link %d: %d drops, %d reorders, %d duplicates", i, d, r, u)
		if d == 0 {
			t.Errorf("link %d dropped nothing: the test proves nothing", i)
		}
	}
	if retx == 0 || readRetx == 0 || retx == readRetx {
		t.Errorf("%d packets retransmitted, %d of them for reads: the losses did not exercise both writes and reads", retx, readRetx)
	}
}

func waitCompletion(t testing.TB, qp *QP, ctx uint64) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out := make([]fabric.Completion, 1)
	if _, err := qp.cq.Wait(c, out); err != nil {
		if debugRoce {
			qp.mu.Lock()
			t.Logf("QP: una %d tx %d deadline %v (in %v) rnrUntil %v state %v", qp.una, qp.txPSN, qp.deadline, time.Until(qp.deadline), qp.rnrUntil, qp.state)
			qp.mu.Unlock()
			for _, l := range qp.e.debugEvents() {
				t.Logf("    %s", l)
			}
		}
		t.Fatalf("waiting for completion %d: %v", ctx, err)
	}
	if out[0].Context != ctx || out[0].Status != fabric.StatusOK {
		t.Fatalf("completion %+v, want context %d ok (QP %v: %v)", out[0], ctx, qp.State(), qp.status)
	}
}

// TestAtomics runs fetch-and-add and compare-and-swap.
func TestAtomics(t *testing.T) {
	ea, eb, _ := enginePair(t, 4791, link.LossConfig{})
	a, _, pa, pb := connect(t, ea, eb, QPConfig{}, QPAttr{Timeout: 10, RetryCnt: 7})
	word, _ := pb.RegMR(make([]byte, 64), fabric.AccessLocalWrite|fabric.AccessRemoteAtomic)
	// The engine updates the word with atomics (as a NIC would, from
	// another agent): the test touches it with atomics too.
	w64 := (*atomic.Uint64)(unsafe.Pointer(&word.Bytes()[8]))
	w64.Store(40)
	res, _ := pa.RegMR(make([]byte, 8), fabric.AccessLocalWrite)
	remote := word.Remote().Slice(8, 8)
	if err := a.FetchAdd(fabric.SGEOf(res), remote, 2, 1, fabric.FlagSignal); err != nil {
		t.Fatal(err)
	}
	waitCompletion(t, a, 1)
	if got := binary.BigEndian.Uint64(res.Bytes()); got != 40 {
		t.Fatalf("fetch-add returned %d, want 40", got)
	}
	if err := a.CompareSwap(fabric.SGEOf(res), remote, 42, 7, 2, fabric.FlagSignal); err != nil {
		t.Fatal(err)
	}
	waitCompletion(t, a, 2)
	if got := binary.BigEndian.Uint64(res.Bytes()); got != 42 {
		t.Fatalf("compare-swap returned %d, want 42", got)
	}
	if got := w64.Load(); got != 7 {
		t.Fatalf("word is %d after the swap, want 7", got)
	}
	// An unaligned or unpermitted target is refused.
	if err := a.FetchAdd(fabric.SGEOf(res), word.Remote().Slice(4, 8), 1, 3, 0); err == nil {
		t.Fatal("unaligned atomic accepted")
	}
}

// TestPSNWindowHelpers covers the retransmission timer arithmetic.
func TestTimeoutDuration(t *testing.T) {
	if TimeoutDuration(0) != 0 || TimeoutDuration(14) != 67108864*time.Nanosecond {
		t.Fatalf("TimeoutDuration(14) = %v", TimeoutDuration(14))
	}
}

// TestRetryExceeded: a peer that vanishes fails the QP with
// StatusRetryExceeded, matching ErrPeerGone.
func TestRetryExceeded(t *testing.T) {
	ea, eb, _ := enginePair(t, 4791, link.LossConfig{})
	a, b, pa, _ := connect(t, ea, eb, QPConfig{}, QPAttr{Timeout: 4, RetryCnt: 2})
	b.Destroy()
	src, _ := pa.RegMR(make([]byte, 8), 0)
	if _, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Flags: fabric.FlagSignal, Context: 5}}); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]fabric.Completion, 1)
	if _, err := a.cq.Wait(c, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Status != fabric.StatusRetryExceeded || !errors.Is(out[0].Err(), fabric.ErrPeerGone) {
		t.Fatalf("completion %+v", out[0])
	}
	if a.State() != StateErr {
		t.Fatalf("state %v", a.State())
	}
	_, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}}})
	if !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("send in ERR: %v", err)
	}
}

// TestStalledPoller: acknowledgements that wait unread while the
// engine's poller is stalled (descheduled on a busy host) are not
// silence. A QP whose timeout passes many times over during the stall
// keeps its retries, and its send completes once polling resumes (timers
// fired on the clock alone failed it with "retry count exceeded", the
// peer alive and its acknowledgement queued).
func TestStalledPoller(t *testing.T) {
	ea, eb, _ := enginePair(t, 4791, link.LossConfig{})
	a, _, pa, _ := connect(t, ea, eb, QPConfig{}, QPAttr{Timeout: 1, RetryCnt: 1})
	src, _ := pa.RegMR(make([]byte, 8), 0)
	ea.pollMu.Lock() // the stall: nobody reads A's socket
	if _, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Flags: fabric.FlagSignal, Context: 5}}); err != nil {
		ea.pollMu.Unlock()
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // ~10^4 timeouts of 8 µs
	ea.pollMu.Unlock()
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]fabric.Completion, 1)
	if _, err := a.cq.Wait(c, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Status != fabric.StatusOK || out[0].Context != 5 {
		t.Fatalf("completion %+v after the stall, state %v", out[0], a.State())
	}
	// A peer that is really gone is still noticed (the link drains
	// and the timers run out): TestRetryExceeded.
}

func TestStateMachine(t *testing.T) {
	ea, _, _ := enginePair(t, 4791, link.LossConfig{})
	qp, _ := ea.AllocPD().CreateQP(QPConfig{})
	defer qp.Destroy()
	if err := qp.Modify(StateRTS, &QPAttr{}); err == nil {
		t.Fatal("RESET -> RTS accepted")
	}
	if err := qp.Modify(StateInit, nil); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(StateRTR, &QPAttr{PathMTU: 1000, Dest: netip.MustParseAddr("127.0.0.2"), DestQPN: 5}); err == nil {
		t.Fatal("MTU 1000 accepted")
	}
	if err := qp.Modify(StateRTR, &QPAttr{PathMTU: 1024, Dest: netip.MustParseAddr("127.0.0.2"), DestQPN: 5, RQPSN: 1 << 24}); err == nil {
		t.Fatal("25-bit PSN accepted")
	}
	if err := qp.Modify(StateRTR, &QPAttr{PathMTU: 1024, Dest: netip.MustParseAddr("127.0.0.2"), DestQPN: 5}); err != nil {
		t.Fatal(err)
	}
	// Posting needs RTS: even an empty post is refused in RTR.
	if n, err := qp.Send(nil); n != 0 || !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("empty post in RTR: %d, %v; want ErrInvalid", n, err)
	}
	if err := qp.Modify(StateRTS, &QPAttr{RetryCnt: 8}); err == nil {
		t.Fatal("retry count 8 accepted")
	}
	if err := qp.Modify(StateRTS, &QPAttr{RetryCnt: 7}); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(StateErr, nil); err != nil || qp.State() != StateErr {
		t.Fatal(err)
	}
	if err := qp.Modify(StateReset, nil); err != nil || qp.State() != StateReset {
		t.Fatal(err)
	}
	qp.Destroy()
	if err := qp.Modify(StateInit, nil); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Modify after Destroy: %v", err)
	}
	_ = wire.PSNMask
}

// TestRNR fills a receiver that does not read: the requester gets RNR
// NAKs and waits them out (infinite RNR retries), without using up its
// transport retries, and every message arrives once the receiver reads.
func TestRNR(t *testing.T) {
	ea, eb, _ := enginePair(t, 4791, link.LossConfig{})
	cfg := QPConfig{RecvBuffer: 64 << 10, MaxMsgSize: 4096}
	// The transport timeout is generous (67 ms, 7 retries): the test is
	// about RNR, and a 1 ms timeout fails the requester for real on a
	// loaded machine, where a starved responder acknowledges late.
	a, b, pa, pb := connect(t, ea, eb, cfg, QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
	const n = 200
	src, _ := pa.RegMR(make([]byte, 1024), 0)
	msgs := make([]fabric.Message, n)
	for i := range msgs {
		msgs[i] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Imm: uint32(i), Flags: fabric.FlagImm}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for sent := 0; sent < n; {
		k, err := a.SendWait(ctx, msgs[sent:])
		if err != nil {
			t.Fatal(err)
		}
		sent += k
	}
	time.Sleep(200 * time.Millisecond) // the receiver is "busy": RNR NAKs flow
	// Read only after the first RNR NAK (an engine not yet run sent none).
	if !testenv.Eventually(10*time.Second, func() bool { return b.Stats().Drops[fabric.DropNoBuffer] != 0 }) {
		t.Fatalf("no RNR NAK while the receiver did not read (requester %v)", a.State())
	}
	dst, _ := pb.RegMR(make([]byte, 1024), fabric.AccessLocalWrite)
	rm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
	for i := 0; i < n; i++ {
		if _, err := b.RecvWait(ctx, rm); err != nil {
			t.Fatalf("message %d: %v (requester %v)", i, err, a.State())
		}
		if rm[0].Imm != uint32(i) {
			t.Fatalf("message %d carried %d", i, rm[0].Imm)
		}
	}
	if d := b.Stats().Drops[fabric.DropNoBuffer]; d == 0 {
		t.Errorf("no RNR NAK was sent")
	}
	if a.State() != StateRTS {
		t.Fatalf("requester state %v", a.State())
	}
}

// TestUDSrcPort checks the UD source port against the one Linux rxe sent
// for QPN 0x11 in roce/testdata/ud_pingpong_s64_n5.pcap (57236).
func TestUDSrcPort(t *testing.T) {
	if got := udSrcPort(0x11); got != 57236 {
		t.Fatalf("udSrcPort(0x11) = %d, want 57236", got)
	}
}
