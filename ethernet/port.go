package ethernet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/spin"
	"golang.org/x/sys/unix"
)

// Config configures a Port. The zero value selects every default: queue
// 0, no filter (TX only: nothing is steered), automatic attach and bind
// modes, 4096-byte frames.
type Config struct {
	// Queues lists the queue ids to open, one AF_XDP socket each (nil:
	// queue 0). AllQueues opens every RX queue of the interface.
	Queues []int
	// AllQueues opens one socket on each of the interface's RX queues.
	AllQueues bool
	// Filter selects the frames steered to the sockets. With the zero
	// Filter no program is attached and the port can only send, unless
	// NoProgram is set and the caller steers frames with a program of
	// its own (Queue.Socket().FD() goes into its XSKMAP).
	Filter Filter
	// NoProgram skips loading and attaching Weft's XDP program.
	NoProgram bool
	// Attach selects native or generic XDP (default: native, then
	// generic).
	Attach AttachMode
	// Bind selects zero-copy or copy mode (default: zero-copy where the
	// driver has it, copy otherwise).
	Bind xsk.BindMode
	// FrameSize is the UMEM frame size (0: 4096).
	FrameSize int
	// Frames is the number of UMEM frames per queue (0: 4096).
	Frames int
	// RingSize sizes the RX, TX, fill and completion rings (0: 2048).
	RingSize int
	// SeparateUMEM gives each queue a UMEM of its own instead of one
	// shared UMEM (XDP_SHARED_UMEM) for all of them.
	SeparateUMEM bool
	// BusyPoll configures busy polling of every socket.
	BusyPoll xsk.BusyPoll
	// NoNeedWakeup disables need_wakeup.
	NoNeedWakeup bool
	// TXBudget is how many copy-mode frames one kick (sendto) sends,
	// XDP_MAX_TX_SKB_BUDGET (0: 256 where the kernel has the option, its
	// default of 32 elsewhere; negative: the kernel's default).
	TXBudget int
	// Spin is how long RecvWait busy-polls before it sleeps in the Go
	// runtime's network poller (0: fabric.DefaultSpin; negative: sleep at
	// once).
	Spin time.Duration

	// raw leaves frame management to the caller (the fabric endpoint):
	// queues get no frame pool and the fill ring starts empty.
	raw bool
}

// Port is an interface opened for AF_XDP: Weft's XDP program attached
// (if a filter is set) and one Queue per requested queue id, all on one
// shared UMEM by default. It is the raw-frame API for routers: bursts of
// frames in and out of an interface queue, DPDK rte_eth_rx_burst style.
type Port struct {
	link   LinkInfo
	cfg    Config
	prog   *Program
	sp     *sharedProg
	umems  []*xsk.UMEM
	queues []*Queue
	closed atomic.Bool
	once   sync.Once
	err    error
}

// Open opens the named interface (in the calling thread's network
// namespace).
func Open(ifname string, cfg *Config) (*Port, error) {
	li, err := LinkByName(ifname)
	if err != nil {
		return nil, err
	}
	return OpenLink(li, cfg)
}

// OpenLink opens the interface li describes.
func OpenLink(li LinkInfo, cfg *Config) (*Port, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.RingSize == 0 {
		c.RingSize = 2048
	}
	if c.Frames == 0 {
		c.Frames = 4096
	}
	if c.FrameSize == 0 {
		c.FrameSize = 4096
	}
	switch {
	case c.TXBudget == 0:
		c.TXBudget = min(256, c.RingSize)
	case c.TXBudget < 0:
		c.TXBudget = 0
	}
	queues := c.Queues
	if c.AllQueues {
		queues = nil
		for i := 0; i < max(li.RXQueues, 1); i++ {
			queues = append(queues, i)
		}
	}
	if len(queues) == 0 {
		queues = []int{0}
	}
	for _, q := range queues {
		if q < 0 || (li.RXQueues > 0 && q >= max(li.RXQueues, li.TXQueues)) {
			return nil, portErr(li, fmt.Errorf("queue %d of %d: %w", q, li.RXQueues, fabric.ErrInvalid))
		}
	}
	c.Queues = queues
	p := &Port{link: li, cfg: c}
	fail := func(err error) (*Port, error) {
		p.Close()
		return nil, portErr(li, err)
	}
	steer := !c.NoProgram && (c.Filter.All || len(c.Filter.EtherTypes) > 0 || len(c.Filter.UDPPorts) > 0)
	if steer {
		sp, err := acquireProgram(li, c.Filter, queues, c.Attach)
		if err != nil {
			return nil, portErr(li, err)
		}
		p.sp, p.prog = sp, sp.prog
	}
	bind := c.Bind
	if p.prog != nil && p.prog.Mode() == AttachGeneric && bind == xsk.ModeAuto {
		bind = xsk.ModeCopy
	}
	var shared *xsk.UMEM
	for _, q := range queues {
		u := shared
		if u == nil || c.SeparateUMEM {
			frames := c.Frames
			if !c.SeparateUMEM {
				frames *= len(queues)
			}
			var err error
			u, err = xsk.NewUMEM(xsk.UMEMConfig{FrameSize: c.FrameSize, Frames: frames,
				FillSize: c.RingSize, CompletionSize: c.RingSize})
			if err != nil {
				return fail(err)
			}
			p.umems = append(p.umems, u)
			if !c.SeparateUMEM {
				shared = u
			}
		}
		s, err := xsk.NewSocket(u, li.Index, q, &xsk.Config{RXSize: c.RingSize, TXSize: c.RingSize,
			Mode: bind, NoNeedWakeup: c.NoNeedWakeup, BusyPoll: c.BusyPoll, TXBudget: c.TXBudget})
		if err != nil {
			return fail(err)
		}
		qu := newQueue(p, s, len(p.queues), c.Frames)
		p.queues = append(p.queues, qu)
		if p.prog != nil {
			if err := p.prog.Register(q, s.FD()); err != nil {
				return fail(err)
			}
		}
	}
	return p, nil
}

func portErr(li LinkInfo, err error) error {
	return &fabric.OpError{Op: "open", Backend: "ethernet", Addr: li.Name, Err: err}
}

// Link returns the interface's information as of Open.
func (p *Port) Link() LinkInfo { return p.link }

// Program returns the attached XDP program, nil without one. Ports of
// the process on the same interface share it (one XDP program per
// interface): it stays attached until the last of them closes.
func (p *Port) Program() *Program { return p.prog }

// Queues returns the port's queues, in the order of Config.Queues.
func (p *Port) Queues() []*Queue { return p.queues }

// Queue returns the i-th queue (not queue id i; see Queue.ID).
func (p *Port) Queue(i int) *Queue { return p.queues[i] }

// Close closes every socket, detaches the program Weft attached (never
// another) and frees the UMEMs. It is idempotent.
func (p *Port) Close() error {
	p.once.Do(func() {
		p.closed.Store(true)
		var errs []error
		if p.sp != nil {
			// Unsteer first (and detach, with the program's last user)
			// so no frame goes to a closing socket, and empty the XSKMAP
			// so it holds no socket while the kernel frees it.
			errs = append(errs, p.sp.release(p.cfg.Queues))
		}
		for _, q := range p.queues {
			errs = append(errs, q.close())
		}
		for _, u := range p.umems {
			errs = append(errs, u.Close())
		}
		p.err = errors.Join(errs...)
	})
	return p.err
}

// Frame is a handle to a packet buffer in the port's UMEM: the packet
// is Len bytes at Addr. Frames from Recv and Alloc belong to the caller
// until it passes them to Send (which takes the ones it sends) or
// Release.
type Frame struct {
	Addr uint64
	Len  int
}

// QueueStats are a queue's counters.
type QueueStats struct {
	RXPackets, RXBytes uint64
	TXPackets, TXBytes uint64
	// TXCompleted counts frames whose transmission completed.
	TXCompleted uint64
	// Kicks counts sendto/recvfrom/poll wake-ups issued.
	Kicks uint64
	// Kernel holds the socket's kernel counters.
	Kernel xsk.Statistics
}

// Queue is one AF_XDP socket of a Port, bound to one interface queue,
// with a pool of free frames.
//
// Like a DPDK queue, a Queue belongs to one goroutine at a time: Recv,
// RecvWait, Release, Alloc, Send and Flush must not be called
// concurrently (they take no locks, which is what lets them run at the
// C reference's rate). Stats, ID, ZeroCopy and Port.Close may be called
// from any goroutine at any time: a Close that races with a burst makes
// the burst return an error matching os.ErrClosed, never a fault.
type Queue struct {
	p       *Port
	s       *xsk.Socket
	u       *xsk.UMEM
	free    []uint64 // free frame addresses
	comp    [256]uint64
	spin    spin.Budget
	fillLow int
	// inFill counts frames given to the fill ring and not yet received
	// back on the RX ring, so refills need not read the kernel's
	// consumer index.
	inFill int
	closed atomic.Bool

	rxPackets, rxBytes atomic.Uint64
	txPackets, txBytes atomic.Uint64
	txDone             atomic.Uint64
	inFlight           int
	armed              atomic.Pointer[fabric.Waker] // a wait set's (wait.go)
}

func newQueue(p *Port, s *xsk.Socket, idx, frames int) *Queue {
	u := s.UMEM()
	q := &Queue{p: p, s: s, u: u}
	q.spin.Init((&fabric.Options{Spin: p.cfg.Spin}).SpinBudget())
	base := 0
	if !p.cfg.SeparateUMEM {
		base = idx * frames
	}
	if p.cfg.raw {
		return q
	}
	q.free = make([]uint64, 0, frames)
	for i := frames - 1; i >= 0; i-- {
		q.free = append(q.free, u.FrameAddr(base+i))
	}
	// Half the frames go to the fill ring for reception, the rest stay
	// for transmission.
	q.fillLow = min(s.Fill().Size(), frames/2)
	q.refillLocked()
	return q
}

// Socket returns the queue's AF_XDP socket.
func (q *Queue) Socket() *xsk.Socket { return q.s }

// ID returns the interface queue id.
func (q *Queue) ID() int { return q.s.Queue() }

// ZeroCopy reports whether the socket is in zero-copy mode.
func (q *Queue) ZeroCopy() bool { return q.s.ZeroCopy() }

// Data returns the bytes of f (Len bytes at Addr).
func (q *Queue) Data(f Frame) []byte { return q.u.Frame(f.Addr)[:f.Len] }

// Buffer returns the whole buffer f can hold, from Addr to the end of
// its UMEM frame, to write a packet into before Send.
func (q *Queue) Buffer(f Frame) []byte { return q.u.Frame(f.Addr) }

// refillLocked tops the fill ring up to fillLow frames from the pool.
func (q *Queue) refillLocked() {
	fr := q.s.Fill()
	want := q.fillLow - q.inFill
	if want <= 0 || len(q.free) == 0 {
		return
	}
	want = min(want, len(q.free))
	idx, n := fr.Reserve(want)
	top := len(q.free)
	for i := 0; i < n; i++ {
		fr.Set(idx+uint32(i), q.free[top-1-i])
	}
	q.free = q.free[:top-n]
	fr.Submit(n)
	q.inFill += n
}

// reapLocked moves completed TX frames back to the pool.
func (q *Queue) reapLocked() {
	cr := q.s.Completion()
	for {
		n := cr.Get(q.comp[:])
		if n == 0 {
			return
		}
		q.free = append(q.free, q.comp[:n]...)
		q.inFlight -= n
		q.txDone.Add(uint64(n))
		if n < len(q.comp) {
			return
		}
	}
}

func (q *Queue) errClosed(op string) error {
	return &fabric.OpError{Op: op, Backend: "ethernet", Addr: q.p.link.Name, Err: fabric.ErrClosed}
}

// Recv moves up to len(frames) received packets into frames and returns
// how many; it never blocks. The frames belong to the caller until it
// passes them to Release or Send. Recv refills the fill ring and wakes
// the driver when it asks for it.
func (q *Queue) Recv(frames []Frame) (int, error) {
	if q.closed.Load() {
		return 0, q.errClosed("recv")
	}
	rx := q.s.RX()
	idx, n := rx.Peek(len(frames))
	var bytes uint64
	for i := 0; i < n; i++ {
		d := rx.Desc(idx + uint32(i))
		frames[i] = Frame{Addr: d.Addr, Len: int(d.Len)}
		bytes += uint64(d.Len)
	}
	if q.closed.Load() {
		// Close raced with the burst: what was read may be garbage.
		return 0, q.errClosed("recv")
	}
	var err error
	if n > 0 {
		rx.Release(n)
		q.inFill -= n
		q.rxPackets.Add(uint64(n))
		q.rxBytes.Add(bytes)
		if len(q.free) > 0 {
			q.refillLocked()
		}
	} else if q.s.Fill().NeedsWakeup() || q.s.BusyPolling() {
		err = q.s.WakeRX()
	}
	return n, err
}

// Release returns frames to the queue's pool (and so to the fill ring).
// Frames of another queue of the same port are accepted when the UMEM
// is shared.
func (q *Queue) Release(frames []Frame) {
	mask := ^uint64(q.u.FrameSize() - 1)
	i := 0
	if want := q.fillLow - q.inFill; want > 0 && !q.closed.Load() {
		// Straight back to the fill ring, as far as it is below target.
		fr := q.s.Fill()
		idx, n := fr.Reserve(min(want, len(frames)))
		for ; i < n; i++ {
			fr.Set(idx+uint32(i), frames[i].Addr&mask)
		}
		if n > 0 {
			fr.Submit(n)
			q.inFill += n
		}
	}
	for ; i < len(frames); i++ {
		q.free = append(q.free, frames[i].Addr&mask)
	}
}

// Alloc takes up to len(frames) free frames from the pool for the
// caller to fill and Send, setting Len to 0, and returns how many; fewer
// than asked means the pool is short (frames are in flight).
func (q *Queue) Alloc(frames []Frame) int {
	if len(q.free) < len(frames) && !q.closed.Load() {
		q.reapLocked()
	}
	n := min(len(frames), len(q.free))
	top := len(q.free)
	for i := 0; i < n; i++ {
		frames[i] = Frame{Addr: q.free[top-1-i]}
	}
	q.free = q.free[:top-n]
	return n
}

// Send queues up to len(frames) frames for transmission and returns how
// many it queued: n < len(frames) is backpressure (TX ring full), and
// frames[n:] still belong to the caller. A frame counts as sent once it
// is on the TX ring; it returns to the pool when its completion comes
// back. Send kicks the kernel when need_wakeup asks for it.
func (q *Queue) Send(frames []Frame) (int, error) {
	if q.closed.Load() {
		return 0, q.errClosed("send")
	}
	q.reapLocked()
	tx := q.s.TX()
	idx, n := tx.Reserve(len(frames))
	var bytes uint64
	for i := 0; i < n; i++ {
		d := tx.Desc(idx + uint32(i))
		d.Addr, d.Len, d.Options = frames[i].Addr, uint32(frames[i].Len), 0
		bytes += uint64(frames[i].Len)
	}
	if q.closed.Load() {
		tx.Cancel(n)
		return 0, q.errClosed("send")
	}
	var err error
	if n > 0 {
		tx.Submit(n)
		q.inFlight += n
		q.txPackets.Add(uint64(n))
		q.txBytes.Add(bytes)
	}
	if n > 0 || q.inFlight > 0 {
		err = q.s.Drain(0)
	}
	return n, err
}

// Flush kicks the kernel to process frames left on the TX ring and
// reclaims completed ones; it reports how many are still in flight.
func (q *Queue) Flush() (int, error) {
	if q.closed.Load() {
		return 0, q.errClosed("flush")
	}
	var err error
	if q.inFlight > 0 {
		err = q.s.Drain(0)
	}
	q.reapLocked()
	return q.inFlight, err
}

// RecvWait is Recv that blocks until at least one packet arrived, ctx is
// done or the port is closed. It busy-polls for the spin budget, then
// sleeps in the Go runtime's network poller (xsk.Socket.Poll), holding
// no OS thread: Close wakes it at once with an error matching
// os.ErrClosed, a cancelled ctx at once with ctx's error. It allocates
// nothing, except when it sleeps with a ctx that can be cancelled and
// the previous sleep used another (see xsk.Socket.Poll).
func (q *Queue) RecvWait(ctx context.Context, frames []Frame) (int, error) {
	if len(frames) == 0 {
		return 0, nil
	}
	s := q.spin.Start()
	for s.Next(ctx) {
		n, err := q.Recv(frames)
		if n > 0 || err != nil {
			q.spin.Arrived(&s)
			return n, err
		}
	}
	q.spin.Slept(&s)
	for {
		n, err := q.Recv(frames)
		if n > 0 || err != nil {
			return n, err
		}
		if _, err := q.s.Poll(ctx, unix.POLLIN); err != nil {
			if q.closed.Load() {
				return 0, q.errClosed("recv")
			}
			return 0, err
		}
	}
}

// Stats returns the queue's counters.
func (q *Queue) Stats() QueueStats {
	st := QueueStats{RXPackets: q.rxPackets.Load(), RXBytes: q.rxBytes.Load(),
		TXPackets: q.txPackets.Load(), TXBytes: q.txBytes.Load(), TXCompleted: q.txDone.Load(),
		Kicks: q.s.Kicks.Load()}
	if !q.closed.Load() {
		st.Kernel, _ = q.s.Statistics()
	}
	return st
}

func (q *Queue) close() error {
	if q.closed.Swap(true) {
		return nil
	}
	if w := q.armed.Load(); w != nil {
		w.Wake() // closing the socket takes it out of the set's epoll
	}
	return q.s.Close()
}
