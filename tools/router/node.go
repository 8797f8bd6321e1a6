package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
)

// NodeConfig configures one forwarding node.
type NodeConfig struct {
	Rank, Nodes int
	Backplane   string // "" or "none": a single node, no back-plane
	Dir         string // where NTB bridges live
	Routes      int
	Settings    Settings
	Rejoin      bool // restarted: dial every peer (they wait for us)
	// Addrs are the nodes' back-plane addresses by rank, when each node
	// is on a machine of its own (verbs: the address of its RDMA device).
	Addrs []netip.Addr
}

// NodeStats are a node's counters, reported as a JSON line.
type NodeStats struct {
	Rank     int               `json:"rank"`
	RX       uint64            `json:"rx"`        // frames from the ingress port
	Verdicts map[string]uint64 `json:"verdicts"`  // per ForwardFrame verdict
	Local    uint64            `json:"local"`     // forwarded out of our own port
	Handoff  uint64            `json:"handoff"`   // handed to a peer node
	FromPeer uint64            `json:"from_peer"` // received from peers, sent out
	PeerDown uint64            `json:"peer_down"` // dropped: owner node is gone
	BPDrop   uint64            `json:"bp_drop"`   // dropped: back-plane pushed back
	TXDrop   uint64            `json:"tx_drop"`   // dropped: egress ring or pool full
	TX       uint64            `json:"tx"`        // frames put on the egress ring
	Rejoins  uint64            `json:"rejoins"`
	// Mallocs is the heap allocations of the whole process between
	// "ready" and the end (runtime.MemStats.Mallocs): an upper bound of
	// the forwarding loop's, which BenchmarkForward measures alone.
	Mallocs uint64 `json:"mallocs"`
	// Batch counts the coalescers' and splitters' work on the batched
	// back-planes (sent: coalescers; received: splitters).
	BatchSent, BatchRecv batch.Stats
	// In and Out are the kernel's counters of the AF_XDP sockets.
	In, Out xsk.Statistics
}

// Forwarder is a node's data path: ingress frames go through ForwardFrame
// and out of the egress port or over the back-plane; frames from the
// back-plane go out of the egress port. It is driven by one goroutine.
type Forwarder struct {
	fib  *FIB
	rank int
	c    Counters
	st   NodeStats

	in, out  *ethernet.Queue
	rx       []ethernet.Frame
	tx       []ethernet.Frame
	txN      int // tx[:txN] hold packets
	txHave   int // tx[:txHave] are allocated from the egress pool
	src, dst [6]byte

	bp    *Backplane // nil on a single node
	links []*Link
	emitF func([]byte)
	// ws is the idle loop's one wake-up for the ingress port and every
	// back-plane link; nil while one of them has no wake-up a set can
	// watch (the loop then naps).
	ws *fabric.WaitSet
}

// idleMax bounds an idle sleep, so the loop still looks at its channels
// (link events, reports) ten times a second when nothing arrives.
const idleMax = 100 * time.Millisecond

// watch builds the idle loop's wait set over the ingress port and the
// links that are up. Any member without a wake-up leaves ws nil.
func (f *Forwarder) watch() {
	if f.ws != nil {
		f.ws.Close()
		f.ws = nil
	}
	ws, err := fabric.NewWaitSet()
	if err != nil {
		return
	}
	members := []any{f.in}
	for _, l := range f.links {
		if l != nil {
			members = append(members, l.conn)
		}
	}
	for _, m := range members {
		w, ok := m.(fabric.Waitable)
		if !ok || ws.Add(w) != nil {
			ws.Close()
			return
		}
	}
	f.ws = ws
}

// idle parks the loop until the ingress port or a link may have work or
// a batch is due: in Go's netpoller through the wait set, or, without
// one, in a nanosleep nap.
func (f *Forwarder) idle(ctx context.Context, now time.Time) {
	if f.ws == nil {
		nap()
		return
	}
	d := idleMax
	for _, l := range f.links {
		switch {
		case l == nil || !l.up:
		case l.co != nil:
			if due, ok := l.co.Due(); ok {
				d = min(d, max(due.Sub(now), time.Microsecond))
			}
		case l.npending > 0: // the peer pushed back: try again soon
			d = min(d, 50*time.Microsecond)
		}
	}
	f.ws.WaitFor(ctx, d)
}

// handle forwards one ingress frame.
func (f *Forwarder) handle(frame []byte) {
	r, v := ForwardFrame(f.fib, frame)
	f.c[v]++
	if v != Forward {
		return
	}
	if int(r.Owner) == f.rank || f.bp == nil {
		f.st.Local++
		f.emit(frame)
		return
	}
	switch l := f.links[r.Owner]; {
	case l == nil || !l.up:
		f.st.PeerDown++
	case !l.Stage(frame):
		f.st.BPDrop++
	default:
		f.st.Handoff++
	}
}

// fromPeer sends out a frame a peer handed us (already forwarded there).
func (f *Forwarder) fromPeer(frame []byte) {
	if len(frame) < ethernet.EthHdrLen {
		f.c[Malformed]++
		return
	}
	f.st.FromPeer++
	f.emit(frame)
}

// emit copies frame into an egress frame with our MAC as source and the
// next hop's as destination.
func (f *Forwarder) emit(frame []byte) {
	if f.txN == f.txHave {
		f.txHave += f.out.Alloc(f.tx[f.txHave:])
		if f.txN == f.txHave {
			f.st.TXDrop++
			return
		}
	}
	b := f.out.Buffer(f.tx[f.txN])
	if len(frame) > len(b) {
		f.st.TXDrop++
		return
	}
	copy(b, frame)
	copy(b[0:6], f.dst[:])
	copy(b[6:12], f.src[:])
	f.tx[f.txN].Len = len(frame)
	if f.txN++; f.txN == len(f.tx) {
		f.flushTX()
	}
}

// flushTX puts the egress frames on the TX ring; what does not fit is
// dropped, as a hardware router drops at a full output queue.
func (f *Forwarder) flushTX() error {
	if f.txN == 0 {
		return nil
	}
	n, err := f.out.Send(f.tx[:f.txN])
	f.st.TX += uint64(n)
	if n < f.txN {
		f.st.TXDrop += uint64(f.txN - n)
		f.txN = n // the unsent frames stay allocated and are reused
	}
	copy(f.tx, f.tx[f.txN:f.txHave])
	f.txHave -= f.txN
	f.txN = 0
	return err
}

// poll runs one iteration: an ingress burst, the back-plane in both
// directions and the egress burst. It returns how much work it found.
func (f *Forwarder) poll(now time.Time) (int, error) {
	n, err := f.in.Recv(f.rx)
	if err != nil {
		return 0, err
	}
	for _, fr := range f.rx[:n] {
		f.handle(f.in.Data(fr))
	}
	f.in.Release(f.rx[:n])
	f.st.RX += uint64(n)
	work := n
	for _, l := range f.links {
		if l == nil || !l.up {
			continue
		}
		d, _ := f.bp.Flush(l, now)
		f.st.BPDrop += uint64(d)
		k, _ := l.Receive(f.emitF)
		work += k
	}
	if err := f.flushTX(); err != nil {
		return work, err
	}
	if work == 0 {
		f.out.Flush()
	}
	return work, nil
}

// stats returns the counters.
func (f *Forwarder) stats() NodeStats {
	s := f.st
	s.Rank = f.rank
	s.In, s.Out = f.in.Stats().Kernel, f.out.Stats().Kernel
	for _, l := range f.links {
		if l == nil {
			continue
		}
		if l.co != nil {
			cs := l.co.Stats()
			s.BatchSent.Add(&cs)
		}
		ss := l.sp.Stats()
		s.BatchRecv.Add(&ss)
	}
	s.Verdicts = map[string]uint64{}
	for v, n := range f.c {
		s.Verdicts[Verdict(v).String()] = n
	}
	return s
}

// runNode is a forwarding node: it opens its ports, joins the mesh,
// says "ready" on stdout, then forwards until SIGTERM, printing its
// counters as a JSON line on every SIGUSR1 and at the end.
func runNode(c NodeConfig) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	var report atomic.Bool
	usr := make(chan os.Signal, 1)
	signal.Notify(usr, syscall.SIGUSR1)
	go func() {
		for range usr {
			report.Store(true)
		}
	}()
	fib, err := GenFIB(c.Routes, c.Nodes, nil)
	if err != nil {
		return err
	}
	burst := max(c.Settings.Burst, 1)
	f := &Forwarder{fib: fib, rank: c.Rank, rx: make([]ethernet.Frame, burst), tx: make([]ethernet.Frame, 2*burst)}
	f.emitF = f.fromPeer
	in, err := ethernet.Open("in", &ethernet.Config{
		Filter: ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeIPv4}}, FrameSize: 2048,
	})
	if err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	defer in.Close()
	out, err := ethernet.Open("out", &ethernet.Config{FrameSize: 2048})
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	defer out.Close()
	f.in, f.out = in.Queue(0), out.Queue(0)
	copy(f.src[:], out.Link().MAC)
	nh, err := ethernet.ResolveMAC(out.Link().Index, sinkIP(c.Rank), 3*time.Second)
	if err != nil {
		return fmt.Errorf("next hop %v: %w", sinkIP(c.Rank), err)
	}
	copy(f.dst[:], nh)
	if c.Backplane != "" && c.Backplane != "none" && c.Nodes > 1 {
		bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
		f.bp, err = openBackplane(bctx, c,
			func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
		bcancel()
		if err != nil {
			return fmt.Errorf("back-plane: %w", err)
		}
		defer f.bp.Close()
		f.bp.ctx = ctx
		f.links = f.bp.links
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	f.watch()
	defer func() {
		if f.ws != nil {
			f.ws.Close()
		}
	}()
	fmt.Println("ready")
	enc := json.NewEncoder(os.Stdout)
	sp := newSpinner(time.Duration(c.Settings.Spin))
	for ctx.Err() == nil {
		now := time.Now()
		work, err := f.poll(now)
		if err != nil {
			return err
		}
		if work > 0 {
			sp.work()
		} else if sp.idle(ctx) {
			f.idle(ctx, now) // give the core away until there is work
		}
		if f.bp != nil {
			select {
			case ev := <-f.bp.Events():
				f.bp.Rejoin(ev)
			case l := <-f.bp.Ups():
				f.bp.links[l.rank] = l
				f.st.Rejoins++
				f.watch()
			default:
			}
		}
		if report.Swap(false) {
			enc.Encode(f.stats())
		}
	}
	f.flushTX()
	st := f.stats()
	runtime.ReadMemStats(&ms)
	st.Mallocs = ms.Mallocs - mallocs
	return enc.Encode(st)
}
