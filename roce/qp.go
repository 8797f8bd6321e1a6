package roce

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
	"github.com/weft-io/weft/internal/spin"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// QPType is the transport service of a queue pair: wire.QPType, so that
// the verbs backend and the exchanges name it without the engine.
type QPType = wire.QPType

// Queue pair types.
const (
	RC = wire.RC // reliable connected
	UD = wire.UD // unreliable datagram
)

// QPState is the state of a queue pair, as in verbs.
type QPState uint8

// Queue pair states. A QP moves RESET → INIT → RTR (ready to receive) →
// RTS (ready to send); any state can go to ERR (work is flushed) or back
// to RESET.
const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateErr
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "ERR"}

// String returns the verbs name of the state.
func (s QPState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "QPState(?)"
}

// CQ is a completion queue; several queue pairs may share one.
type CQ struct{ q *cq.Queue }

// CreateCQ creates a completion queue of the given capacity (0: 4096)
// whose Wait spins for spin before sleeping.
func (e *Engine) CreateCQ(size int, spin time.Duration) *CQ {
	return &CQ{q: cq.New(size, spin)}
}

// Poll implements fabric.CompletionQueue.
func (c *CQ) Poll(out []fabric.Completion) int { return c.q.Poll(out) }

// Wait implements fabric.CompletionQueue.
func (c *CQ) Wait(ctx context.Context, out []fabric.Completion) (int, error) {
	return c.q.Wait(ctx, out)
}

// Len implements fabric.CompletionQueue.
func (c *CQ) Len() int { return c.q.Len() }

// QPConfig are the creation parameters of a queue pair (verbs
// ibv_qp_init_attr). The zero value is an RC QP with default sizes.
type QPConfig struct {
	// Type is RC (default) or UD.
	Type QPType
	// SQDepth is the number of outstanding send work requests (0: 512).
	SQDepth int
	// RecvBuffer is the size of the receive buffer, in bytes, where
	// arrived messages wait for Recv (0: 8 MiB for RC, 1 MiB for UD).
	// When it is full, RC answers RNR NAK and UD drops. The buffer starts
	// small (64 KiB) and doubles up to this size as arrivals need room,
	// so an idle or lightly used QP costs little memory.
	RecvBuffer int
	// MaxMsgSize is the largest message the QP receives (0: 1 MiB).
	MaxMsgSize int
	// InlineSize is the size up to which Send copies the payload, so the
	// caller's buffers are free when Send returns (0: 4096). The copies
	// live in a ring that starts at 64 KiB and doubles up to
	// (SQDepth+1)×InlineSize, enough for a full send queue of inline
	// messages.
	InlineSize int
	// CQ receives the QP's completions (nil: a CQ of its own).
	CQ *CQ
	// Spin is the busy-poll budget of blocking calls (see fabric.Options).
	Spin time.Duration
}

// QPAttr are the connection attributes of a queue pair (verbs
// ibv_qp_attr), set with Modify or Connect.
type QPAttr struct {
	// PathMTU is the payload size per packet: 256, 512, 1024, 2048 or 4096.
	PathMTU int
	// Dest is the peer's IP address (its GID); DestQPN its QP number.
	Dest    netip.Addr
	DestQPN uint32
	// RQPSN is the first PSN expected from the peer; SQPSN the first PSN
	// sent.
	RQPSN, SQPSN wire.PSN
	// Timeout is the local ACK timeout exponent: 4.096 µs × 2^Timeout
	// (0: wait forever).
	Timeout uint8
	// RetryCnt is how many times a request is retransmitted after a
	// timeout before the QP fails (0-7).
	RetryCnt uint8
	// RNRRetry is how many RNR NAKs are tolerated (0-7; 7 is infinite).
	RNRRetry uint8
	// MinRNRTimer is the RNR NAK delay this QP asks for when it cannot
	// take a message.
	MinRNRTimer wire.RNRTimer
	// MaxRDAtomic is the number of RDMA reads and atomics this QP keeps
	// outstanding (0: 16).
	MaxRDAtomic int
	// QKey is the UD queue key: received datagrams must carry it, and sent
	// ones carry it.
	QKey uint32
	// FlowLabel selects the UDP source port (0: derived from the QPNs).
	FlowLabel uint32
	// PKey is the partition key (0: 0xffff, the default partition).
	PKey uint16
	// KeepAlive, if non-zero, probes the peer after this long without
	// traffic (a zero-length RDMA WRITE with an old PSN, which any RC
	// responder acknowledges as a duplicate), so a dead peer is noticed
	// as retries exceeded even on an idle connection.
	KeepAlive time.Duration
}

// TimeoutDuration returns the local ACK timeout that exponent t means.
func TimeoutDuration(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	return time.Duration(4096<<min(t, 31)) * time.Nanosecond
}

// maxSGE is the longest SGE list of a work request.
const maxSGE = 32

// maxInflight bounds the packets sent and not yet acknowledged; the
// requester's window (cwnd) moves between minWindow and maxInflight. It
// doubles every window acknowledged up to the threshold (ssthresh), and
// then grows by one packet a window; a sequence NAK halves it, a
// retransmission timeout drops it to minWindow (see rewind), and a round
// trip longer than a quarter of the timeout shrinks it (delaySample).
//
// The bound stays well below the queues a packet meets on Linux: a tap's
// or veth's txqueuelen and the receiver's netdev_max_backlog are 1000
// packets by default. RoCE assumes a lossless fabric and recovers a loss
// by going back N, so a window larger than the slowest queue overflows it
// whenever the responder falls behind, and each loss costs the rest of
// the window again: at 1024, Linux rxe in an emulated guest on a busy
// host dropped the end of the window and 900 packets went twice, with a
// round trip still far below a quarter of rdma_cm's 2 s timeout. 512
// packets (2 MiB at a 4096 B MTU) is still many times the
// bandwidth-delay product of any path the engine drives.
//
// maxInflightLossless is the bound over a link that pushes back rather
// than drop (link=shm, whose rings hold 1024 datagrams): no queue
// overflows there, and on a busy host, where the receiver runs late, the
// larger window keeps the sender going (link=shm streamed 64 KiB at 1.1
// GB/s with 1024 against 0.7 with 512, medians of 3 in one loaded run).
const (
	maxInflightLossless = 1024
	maxInflight         = 512
	minWindow           = 8
	initWindow          = 128
)

// work request opcodes
type wop uint8

const (
	wopSend wop = iota
	wopWrite
	wopRead
	wopFetchAdd
	wopCmpSwap
)

// wqe is a send work request in flight.
type wqe struct {
	op     wop
	flags  fabric.MsgFlags
	imm    uint32
	ctx    uint64
	nsge   int
	sge    [maxSGE]fabric.SGE
	inline []byte // payload copied at post time, or nil
	length int
	remote fabric.RemoteIOV
	swap   uint64
	cmp    uint64
	psn    wire.PSN // first PSN
	inlPos uint64   // inline ring position at post: the ring is free up to the oldest wqe's
	npkts  int      // PSNs consumed
	rdDone int      // read: bytes received in order
	rdReq  int      // read: rdDone when the request was last sent
	done   bool     // read, atomic: response complete
	issued bool     // read, atomic: counted in rdOut
}

// QP is a queue pair. It owns the state machine and the attributes
// both sides share (state, type, QPN, destination, the transmit batch);
// its requester, responder and waiters hold the rest.
type QP struct {
	e   *Engine
	pd  *PD
	cfg QPConfig
	qpn uint32
	cq  *CQ
	ctr fabric.Counters
	evs chan fabric.Event

	// epoch is ViewEpoch: resetLocked adds one before the receive
	// ring's positions go back to 0, where the next connection's
	// messages overwrite the memory of views still outstanding.
	epoch atomic.Uint64

	mu    sync.Mutex
	state QPState
	attr  QPAttr
	mtu   int
	sport uint16
	dest  netip.AddrPort
	// viaShm sends the QP's packets through the peer engine's
	// shared-memory ring (link.Packet.Shm, the engine's AutoLink); set
	// before the QP connects (Engine.viaShm decides), read-only after.
	viaShm bool
	// listed is the QP's index in Engine.qpList (objMu).
	listed int
	status fabric.Status // why the QP is in ERR
	closed atomic.Bool

	lastActive int64 // nanotime of the last packet sent or received
	icrcBuf    [48 + wire.BTHSize]byte
	trace      [32][3]uint32
	traceN     int

	requester
	responder
	waiters

	txPkts []link.Packet // txBatch packets and a queued acknowledgement
	txBufs [][]byte
	txN    int
}

// waiters owns what RecvWait, SendWait and wait sets block on.
type waiters struct {
	spin time.Duration
	// recvSpin and sendSpin are the spin budgets of RecvWait and
	// SendWait (of at most spin).
	recvSpin, sendSpin spin.Budget

	recvWaiters atomic.Int32
	recvCh      chan struct{}
	armed       atomic.Pointer[fabric.Waker] // a wait set's, while armed (wait.go)
	sendWaiters atomic.Int32
	sendCh      chan struct{}
	done        chan struct{}
}

type atomicResult struct {
	psn   wire.PSN
	orig  uint64
	valid bool
}

const (
	recFlagImm   = 1
	recFlagWrite = 2 // RDMA write with immediate
	recFlagPad   = 4
	recHdr       = 16
	txBatch      = 32
)

// CreateQP creates a queue pair in the RESET state.
func (pd *PD) CreateQP(cfg QPConfig) (*QP, error) {
	e := pd.e
	if e.closed.Load() {
		return nil, os.ErrClosed
	}
	if cfg.Type == 0 {
		cfg.Type = RC
	}
	if cfg.SQDepth <= 0 {
		cfg.SQDepth = 512
	}
	if cfg.MaxMsgSize <= 0 {
		cfg.MaxMsgSize = 1 << 20
	}
	if cfg.RecvBuffer <= 0 {
		cfg.RecvBuffer = 8 << 20
		if cfg.Type == UD {
			cfg.RecvBuffer = 1 << 20
		}
	}
	if cfg.InlineSize <= 0 {
		cfg.InlineSize = 4096
	}
	cfg.RecvBuffer = (cfg.RecvBuffer + 15) &^ 15
	if cfg.Type == RC && cfg.RecvBuffer < 2*(cfg.MaxMsgSize+2*recHdr) {
		return nil, fmt.Errorf("roce: receive buffer %d cannot hold two messages of %d bytes: %w",
			cfg.RecvBuffer, cfg.MaxMsgSize, fabric.ErrInvalid)
	}
	c := cfg.CQ
	spin := (&fabric.Options{Spin: cfg.Spin}).SpinBudget()
	if c == nil {
		c = e.CreateCQ(0, spin)
	}
	qp := &QP{e: e, pd: pd, cfg: cfg, cq: c, evs: make(chan fabric.Event, 64),
		requester: requester{sq: make([]wqe, min(initSQ, cfg.SQDepth)), inlineBuf: make([]byte, min(initRing, (cfg.SQDepth+1)*cfg.InlineSize))},
		responder: responder{rq: make([]byte, initRecvRing(cfg.RecvBuffer))},
		waiters:   waiters{spin: spin, recvCh: make(chan struct{}, 1), sendCh: make(chan struct{}, 1), done: make(chan struct{})},
		txPkts:    make([]link.Packet, txBatch+1), txBufs: make([][]byte, txBatch)}
	qp.recvSpin.Init(spin)
	qp.sendSpin.Init(spin)
	e.objMu.Lock()
	for tries := 0; ; tries++ {
		if tries > int(e.qpnMask) {
			e.objMu.Unlock()
			return nil, fmt.Errorf("roce: all %d QP numbers of the engine are in use: %w", e.qpnMask+1, fabric.ErrNotSupported)
		}
		e.nextQP = e.qpnBase | (e.nextQP+1)&e.qpnMask
		if _, used := e.qps[e.nextQP]; e.nextQP > 1 && !used {
			break
		}
	}
	qp.qpn = e.nextQP
	e.qps[qp.qpn] = qp
	qp.listed = len(e.qpList)
	e.qpList = append(e.qpList, qp)
	e.objMu.Unlock()
	return qp, nil
}

// QPN returns the queue pair number.
func (qp *QP) QPN() uint32 { return qp.qpn }

// Type returns the QP type.
func (qp *QP) Type() QPType { return qp.cfg.Type }

// State returns the current state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// CQ returns the QP's completion queue.
func (qp *QP) CQ() *CQ { return qp.cq }

// Stats returns the QP's counters.
func (qp *QP) Stats() fabric.Stats { return qp.ctr.Snapshot() }

// Events returns the QP's event channel (errors, peer loss).
func (qp *QP) Events() <-chan fabric.Event { return qp.evs }

func (qp *QP) emit(ev fabric.Event) {
	select {
	case qp.evs <- ev:
	default:
		qp.ctr.Drop(fabric.DropEvent, 1)
	}
}

// udSrcPort is Linux rxe's UDP source port of a UD QP:
// 0xC000 + hash_32(qpn, 14) with the kernel's multiplicative hash.
func udSrcPort(qpn uint32) uint16 {
	return uint16(wire.UDPSrcPortMin + (qpn*0x61C88647)>>(32-14))
}

func validMTU(m int) bool {
	return m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096
}

// Modify moves the QP to state, applying the attributes that transition
// takes (verbs ibv_modify_qp): INIT takes QKey and PKey; RTR takes
// PathMTU, Dest, DestQPN, RQPSN, MinRNRTimer (and QKey for UD); RTS takes
// SQPSN, Timeout, RetryCnt, RNRRetry, MaxRDAtomic and KeepAlive. ERR
// flushes all work; RESET clears the QP.
func (qp *QP) Modify(state QPState, attr *QPAttr) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed.Load() {
		return os.ErrClosed
	}
	if attr == nil {
		attr = &QPAttr{}
	}
	from := qp.state
	bad := func() error {
		return fmt.Errorf("roce: QP %#x: %v -> %v: %w", qp.qpn, from, state, fabric.ErrInvalid)
	}
	switch state {
	case StateReset:
		qp.flushLocked(fabric.StatusFlushed)
		qp.resetLocked()
		return nil
	case StateErr:
		qp.errorLocked(fabric.StatusFlushed)
		return nil
	case StateInit:
		if from != StateReset && from != StateInit {
			return bad()
		}
		qp.attr.QKey = attr.QKey
		qp.attr.PKey = attr.PKey
		if qp.attr.PKey == 0 {
			qp.attr.PKey = 0xffff
		}
	case StateRTR:
		if from != StateInit {
			return bad()
		}
		mtu := attr.PathMTU
		if mtu == 0 {
			mtu = 1024
		}
		if !validMTU(mtu) {
			return fmt.Errorf("roce: path MTU %d: %w", attr.PathMTU, fabric.ErrInvalid)
		}
		if qp.e.maxMTU > 0 && mtu > qp.e.maxMTU {
			return fmt.Errorf("roce: path MTU %d: the engine's link carries %d at most: %w", mtu, qp.e.maxMTU, fabric.ErrInvalid)
		}
		if !attr.Dest.IsValid() || attr.DestQPN > 0xffffff || !attr.RQPSN.Valid() {
			return fmt.Errorf("roce: RTR needs Dest, DestQPN and a 24-bit RQPSN: %w", fabric.ErrInvalid)
		}
		qp.mtu = mtu
		qp.attr.PathMTU = mtu
		qp.attr.Dest = attr.Dest.Unmap()
		qp.attr.DestQPN = attr.DestQPN
		qp.attr.RQPSN = attr.RQPSN
		qp.attr.MinRNRTimer = attr.MinRNRTimer
		qp.attr.FlowLabel = attr.FlowLabel
		if attr.QKey != 0 {
			qp.attr.QKey = attr.QKey
		}
		qp.epsn = attr.RQPSN
		qp.dest = netip.AddrPortFrom(qp.attr.Dest, link.Port)
		qp.sport = wire.UDPSrcPort(attr.FlowLabel, qp.qpn, attr.DestQPN)
		if qp.cfg.Type == UD && attr.FlowLabel == 0 {
			// Linux gives a UD QP the port it picked at creation: a hash
			// of its own QPN (INTEROP.md, 4.2).
			qp.sport = udSrcPort(qp.qpn)
		}
	case StateRTS:
		if from != StateRTR {
			return bad()
		}
		if !attr.SQPSN.Valid() || attr.RetryCnt > 7 || attr.RNRRetry > 7 {
			return fmt.Errorf("roce: RTS attributes %+v: %w", *attr, fabric.ErrInvalid)
		}
		qp.attr.SQPSN, qp.attr.Timeout = attr.SQPSN, attr.Timeout
		qp.attr.RetryCnt, qp.attr.RNRRetry = attr.RetryCnt, attr.RNRRetry
		qp.attr.MaxRDAtomic = attr.MaxRDAtomic
		if qp.attr.MaxRDAtomic <= 0 {
			qp.attr.MaxRDAtomic = 16
		}
		qp.attr.KeepAlive = attr.KeepAlive
		qp.npsn, qp.txPSN, qp.una, qp.maxPSN = attr.SQPSN, attr.SQPSN, attr.SQPSN, attr.SQPSN
		qp.retries, qp.rnrRetries = int(attr.RetryCnt), int(attr.RNRRetry)
		qp.maxWnd = qp.e.maxWnd
		if qp.viaShm {
			// The peer's ring pushes back rather than drop (see
			// maxInflightLossless).
			qp.maxWnd = maxInflightLossless
		}
		qp.cwnd, qp.cwndAcc, qp.ssthresh = initWindow, 0, qp.maxWnd
		qp.rtoHold, qp.rttOn = false, false
		qp.lastActive = nanotime()
		qp.ackWait = int64(ackDelay)
		if d := qp.timeoutDur(); d > 0 {
			qp.ackWait = min(qp.ackWait, int64(d/8))
		}
	default:
		return bad()
	}
	qp.state = state
	return nil
}

// Connect moves a QP from RESET to RTS in one call, with the attributes
// of all three transitions.
func (qp *QP) Connect(attr *QPAttr) error {
	for _, s := range []QPState{StateInit, StateRTR, StateRTS} {
		if err := qp.Modify(s, attr); err != nil {
			return err
		}
	}
	return nil
}

func (qp *QP) resetLocked() {
	qp.epoch.Add(1) // views outstanding are void (ViewEpoch)
	qp.state = StateReset
	qp.status = fabric.StatusOK
	qp.sqHead, qp.sqNext, qp.sqTail, qp.nextPkt = 0, 0, 0, 0
	qp.rdOut, qp.inSend, qp.inWrite, qp.nakSent, qp.ackDirty = 0, false, false, false, false
	qp.deadline, qp.rnrUntil = time.Time{}, time.Time{}
	qp.rqHead, qp.rqRel, qp.rqTail, qp.rqCur, qp.rqCurLen = 0, 0, 0, 0, 0
	qp.inlTail = 0
	qp.vHead, qp.vTail = 0, 0
	qp.msn = 0
	qp.atomics = [16]atomicResult{}
}

// errorLocked moves the QP to ERR: outstanding work completes with
// StatusFlushed, the first error is kept as the reason, and waiters wake.
func (qp *QP) errorLocked(st fabric.Status) {
	if qp.state == StateErr {
		return
	}
	if debugRoce {
		println("QP ERROR", qp.qpn, st.String(), "epsn", qp.epsn, "inSend", qp.inSend, "inWrite", qp.inWrite)
	}
	qp.state = StateErr
	if qp.status == fabric.StatusOK {
		qp.status = st
	}
	qp.flushLocked(fabric.StatusFlushed)
	qp.wakeAll()
	kind := fabric.EventError
	if st == fabric.StatusRetryExceeded || st == fabric.StatusPeerGone || st == fabric.StatusPeerClosed {
		kind = fabric.EventPeerGone
	}
	qp.emit(fabric.Event{Kind: kind, Time: time.Now(), Err: st.Err()})
}

// flushLocked completes every outstanding work request with st.
func (qp *QP) flushLocked(st fabric.Status) {
	for ; qp.sqHead < qp.sqTail; qp.sqHead++ {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		qp.complete(w, st)
	}
	qp.sqNext, qp.nextPkt = qp.sqTail, 0
	qp.rdOut = 0
	qp.deadline, qp.rnrUntil = time.Time{}, time.Time{}
}

func (qp *QP) wakeAll() {
	qp.wakeSet()
	select {
	case qp.recvCh <- struct{}{}:
	default:
	}
	select {
	case qp.sendCh <- struct{}{}:
	default:
	}
}

// complete reports a work request on the CQ if it was signaled or failed.
func (qp *QP) complete(w *wqe, st fabric.Status) {
	if st == fabric.StatusOK && w.flags&fabric.FlagSignal == 0 {
		return
	}
	qp.cq.q.Push(fabric.Completion{Context: w.ctx, Op: wopOps[w.op], Status: st, Len: w.length})
}

var wopOps = [...]fabric.Op{wopSend: fabric.OpSend, wopWrite: fabric.OpWrite, wopRead: fabric.OpRead,
	wopFetchAdd: fabric.OpFetchAdd, wopCmpSwap: fabric.OpCompareSwap}

// drain waits until every posted work request has completed (the QP is
// idle), the QP fails or timeout passes, driving the engine meanwhile.
func (qp *QP) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && !qp.closed.Load() {
		qp.mu.Lock()
		idle := qp.sqHead == qp.sqTail || qp.state != StateRTS
		qp.mu.Unlock()
		if idle {
			return
		}
		if qp.e.poll() <= 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// Destroy destroys the QP (verbs ibv_destroy_qp): work is flushed,
// blocked calls return os.ErrClosed, and its QPN stops receiving.
func (qp *QP) Destroy() error {
	if qp.closed.Swap(true) {
		return nil
	}
	qp.mu.Lock()
	// Acknowledge what was received: the peer's requests must not wait
	// out its retries for an acknowledgement that was only queued.
	if qp.state == StateRTS || qp.state == StateRTR {
		qp.sendAckLocked()
	}
	qp.flushLocked(fabric.StatusFlushed)
	qp.state = StateErr
	qp.mu.Unlock()
	close(qp.done)
	qp.wakeSet()
	e := qp.e
	e.objMu.Lock()
	delete(e.qps, qp.qpn)
	last := e.qpList[len(e.qpList)-1]
	e.qpList[qp.listed], last.listed = last, qp.listed
	e.qpList[len(e.qpList)-1] = nil
	e.qpList = e.qpList[:len(e.qpList)-1]
	e.objMu.Unlock()
	if qp.cfg.CQ == nil {
		qp.cq.q.Close()
	}
	return nil
}

// input dispatches a packet addressed to this QP.
func (qp *QP) input(p *wire.Packet, src netip.Addr) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.state != StateRTR && qp.state != StateRTS {
		if debugRoce {
			println("drop in state", qp.qpn, qp.state.String())
		}
		qp.ctr.Drop(fabric.DropOther, 1)
		return
	}
	op := p.OpCode()
	if qp.cfg.Type == UD {
		if op != wire.OpUDSendOnly && op != wire.OpUDSendOnlyWithImmediate {
			qp.ctr.Drop(fabric.DropMalformed, 1)
			return
		}
		qp.udInput(p)
		return
	}
	if op.Transport() != wire.TransportRC || src != qp.attr.Dest {
		qp.ctr.Drop(fabric.DropMalformed, 1)
		return
	}
	qp.ctr.RxPackets.Add(1)
	qp.lastActive = qp.e.rxNow
	if qp.lastActive == 0 {
		qp.lastActive = nanotime() // a packet injected by a test
	}
	qp.probeAt = time.Time{}
	if op.IsResponse() {
		if qp.state == StateRTS {
			qp.response(p)
		}
		return
	}
	qp.request(p)
}

// timer runs the QP's timers and returns its next deadline. drained is
// when the engine last found the link empty: a timer past its deadline
// waits until the link was drained after it (see Engine.drained).
func (qp *QP) timer(now, drained time.Time) time.Time {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.state != StateRTS {
		return time.Time{}
	}
	if !qp.rnrUntil.IsZero() {
		if now.Before(qp.rnrUntil) {
			return qp.rnrUntil
		}
		qp.rnrUntil = time.Time{}
		qp.transmit()
	}
	if !qp.deadline.IsZero() && !now.Before(qp.deadline) {
		if drained.Before(qp.deadline) {
			return qp.deadline // due, once the link is drained
		}
		qp.onTimeout(now)
	} else if qp.sqNext < qp.sqTail && qp.rnrUntil.IsZero() {
		// Work that the window held back and no event released (a
		// safety net: acknowledgements normally restart the transmitter).
		qp.transmit()
	}
	next := qp.deadline
	if k := qp.keepAlive(now, drained); !k.IsZero() && (next.IsZero() || k.Before(next)) {
		next = k
	}
	return next
}

// keepAlive probes an idle connection so that a peer that went away is
// noticed: after KeepAlive without traffic it sends a zero-length RDMA
// WRITE with an old PSN. The responder sees a duplicate and acknowledges
// it again (no memory, key or permission is involved, so any RC peer
// answers); a probe left unanswered is sent again with the timeout's
// backoff, and when the retries run out the QP fails with
// StatusRetryExceeded (fabric.ErrPeerGone). It returns when it next needs
// to run.
func (qp *QP) keepAlive(now, drained time.Time) time.Time {
	ka := qp.attr.KeepAlive
	if ka <= 0 || qp.cfg.Type != RC || qp.sqHead != qp.sqTail || qp.una != qp.txPSN {
		qp.probeAt = time.Time{}
		return time.Time{}
	}
	if qp.probeAt.IsZero() {
		if idle := epoch.Add(time.Duration(qp.lastActive) + ka); now.Before(idle) {
			return idle
		}
		qp.probeTries = int(qp.attr.RetryCnt)
		qp.sendProbe(now)
	} else if wait := backoff(max(qp.timeoutDur(), time.Millisecond), int(qp.attr.RetryCnt)-qp.probeTries); !now.Before(qp.probeAt.Add(wait)) && !drained.Before(qp.probeAt.Add(wait)) {
		if qp.probeTries <= 0 {
			qp.errorLocked(fabric.StatusRetryExceeded)
			return time.Time{}
		}
		qp.probeTries--
		qp.sendProbe(now)
	}
	return qp.probeAt.Add(backoff(max(qp.timeoutDur(), time.Millisecond), int(qp.attr.RetryCnt)-qp.probeTries))
}

// sendProbe sends the keep-alive probe: RDMA WRITE ONLY, no data, with
// the PSN before the oldest unacknowledged one.
func (qp *QP) sendProbe(now time.Time) {
	f := wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCWriteOnly, PKey: qp.attr.PKey, DestQP: qp.attr.DestQPN,
		PSN: qp.una.Add(-1), AckReq: true}}
	buf := qp.probeBuf[:]
	n, _ := wire.Build(buf, &f, nil)
	u := qp.e.sealICRC(qp.icrcBuf[:], buf[:n], qp.dest.Addr(), qp.sport, qp.viaShm)
	qp.probePkt[0] = link.Packet{Buf: buf[:n], N: n, Addr: qp.dest, SrcPort: qp.sport, Shm: qp.viaShm, Unsealed: u}
	qp.e.send(qp.probePkt[:])
	qp.probeAt = now
}

// initRing is the starting size of a QP's receive and inline rings,
// which double on demand up to their configured sizes. Creating a QP
// used to allocate (and zero) both in full, 8 MiB + 2 MiB of the
// defaults: about 95 connections per second through the listener, and
// 11 MB for every peer of a multi-peer endpoint even when idle. Growing
// costs at most log2(8 MiB / 16 KiB) = 9 copies of a QP's life, all
// while the ring is still small; a stream of 64 KiB messages reaches its
// working size in its first few messages. (64 KiB at first: with the
// send queue and completion queue it made 305 KB a QP, against the
// multi-peer goal of 64 KiB a peer.)
const initRing = 16 << 10

// initRecvRing returns the starting size of a receive ring whose
// largest size is max: max halved while that stays at least initRing
// and a multiple of 16, so that doubling reaches max exactly and every
// size divides the next (growRecv relies on it).
func initRecvRing(max int) int {
	n := max
	for n/2 >= initRing && (n/2)%16 == 0 {
		n /= 2
	}
	return n
}

// recvRoom reports whether the receive buffer has room for a record of n
// payload bytes, growing it (up to cfg.RecvBuffer) if that gives room.
func (qp *QP) recvRoom(n int) bool {
	for {
		size := uint64(len(qp.rq))
		rec := uint64((recHdr + n + 15) &^ 15)
		off := qp.rqTail % size
		need := rec
		if off+rec > size {
			need += size - off // padding to the end
		}
		if qp.rqTail+need+recHdr-qp.rqRel <= size {
			return true
		}
		if len(qp.rq) >= qp.cfg.RecvBuffer {
			return false
		}
		qp.growRecv()
	}
}

// growRecv doubles the receive ring. Positions are absolute, so every
// byte of the live window [rqRel, rqRel+old size) moves to its position
// modulo the new size; since the new size is a multiple of the old one a
// record that was contiguous stays contiguous and padding records still
// end at a ring boundary. Views already handed out keep pointing into
// the old array, which stays valid while they are held, and are released
// by position as before.
func (qp *QP) growRecv() {
	old := qp.rq
	osz, nsz := uint64(len(old)), uint64(min(2*len(old), qp.cfg.RecvBuffer))
	nrq := make([]byte, nsz)
	for pos, end := qp.rqRel, qp.rqRel+osz; pos < end; {
		o, n := pos%osz, pos%nsz
		k := min(end-pos, osz-o, nsz-n)
		copy(nrq[n:n+k], old[o:o+k])
		pos += k
	}
	qp.rq = nrq
}

// initSQ is the starting number of send queue entries (a wqe is about
// 900 bytes, most of it room for maxSGE SGEs: 450 KB for the default
// depth of 512, allocated in full before). The queue doubles up to
// cfg.SQDepth when a post finds it full.
const initSQ = 8

// growSQ doubles the send queue (up to cfg.SQDepth), moving each
// outstanding work request to its absolute index modulo the new length.
func (qp *QP) growSQ() {
	old := qp.sq
	nsq := make([]wqe, min(2*len(old), qp.cfg.SQDepth))
	for i := qp.sqHead; i < qp.sqTail; i++ {
		nsq[i%uint64(len(nsq))] = old[i%uint64(len(old))]
	}
	qp.sq = nsq
}

// inlineSlot reserves n bytes of the inline ring for the work request
// being posted at sq[qp.sqTail] and returns them, or nil if the ring is
// full even at its largest (the caller then sees backpressure). The ring
// holds payloads in send-queue order and is free up to the oldest
// incomplete request's inlPos. Growing it does not move anything: older
// requests keep their slices of the old array.
func (qp *QP) inlineSlot(n int) []byte {
	head := qp.inlTail
	if qp.sqHead < qp.sqTail {
		head = qp.sq[qp.sqHead%uint64(len(qp.sq))].inlPos
	}
	maxSize := (qp.cfg.SQDepth + 1) * qp.cfg.InlineSize
	for {
		size := uint64(len(qp.inlineBuf))
		off := qp.inlTail % size
		start := qp.inlTail
		if off+uint64(n) > size {
			start += size - off // skip to the start of the ring
		}
		if start+uint64(n)-head <= size {
			qp.inlTail = start + uint64(n)
			o := start % size
			return qp.inlineBuf[o : o+uint64(n) : o+uint64(n)]
		}
		if len(qp.inlineBuf) >= maxSize {
			return nil
		}
		qp.inlineBuf = make([]byte, min(2*len(qp.inlineBuf), maxSize))
	}
}

// beginRecord starts a record for a message of at most n bytes (room
// already checked) and returns its payload area.
func (rsp *responder) beginRecord(n int) {
	size := uint64(len(rsp.rq))
	rec := uint64((recHdr + n + 15) &^ 15)
	off := rsp.rqTail % size
	if off+rec > size {
		// Pad to the end of the ring.
		putU32(rsp.rq[off:], uint32(size-off-recHdr))
		putU32(rsp.rq[off+8:], recFlagPad)
		rsp.rqTail += size - off
	}
	rsp.rqCur, rsp.rqCurLen = rsp.rqTail, 0
}

func (rsp *responder) appendRecord(p []byte) {
	off := int(rsp.rqCur%uint64(len(rsp.rq))) + recHdr + rsp.rqCurLen
	rsp.rqCurLen += copy(rsp.rq[off:], p)
}

// commitRecord finishes the current record and wakes a waiting receiver.
func (qp *QP) commitRecord(imm uint32, flags uint32, n int) {
	off := qp.rqCur % uint64(len(qp.rq))
	putU32(qp.rq[off:], uint32(n))
	putU32(qp.rq[off+4:], imm)
	putU32(qp.rq[off+8:], flags)
	qp.rqTail = qp.rqCur + uint64((recHdr+max(qp.rqCurLen, 0)+15)&^15)
	if flags&recFlagWrite != 0 {
		qp.rqTail = qp.rqCur + recHdr
	}
	qp.ctr.RxMessages.Add(1)
	if qp.recvWaiters.Load() > 0 {
		select {
		case qp.recvCh <- struct{}{}:
		default:
		}
		qp.wakeSet()
	}
}

func putU32(b []byte, v uint32) {
	_ = b[3]
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func getU32(b []byte) uint32 {
	_ = b[3]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// Recv moves arrived messages into the messages' SGEs. It never blocks.
func (qp *QP) Recv(msgs []fabric.Message) (int, error) {
	if qp.closed.Load() {
		return 0, opErr("recv", fabric.ErrClosed)
	}
	qp.e.pollAcks(false)
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.deliverLocked(len(msgs), func(i, ln int, imm uint32, flags fabric.MsgFlags, payload []byte) error {
		m := &msgs[i]
		if flags&fabric.FlagRemoteWrite != 0 {
			m.Len, m.Imm, m.Flags = ln, imm, flags
			return nil
		}
		capacity, err := fabric.CheckSGEs(m.SGEs, &qp.pd.dom, fabric.AccessLocalWrite)
		if err != nil {
			return opErr("recv", err)
		}
		m.Flags, m.Imm = flags, imm
		m.Len = fabric.Scatter(m.SGEs, payload)
		if ln > capacity {
			m.Flags |= fabric.FlagTruncated
			qp.ctr.Drop(fabric.DropTruncated, 1)
		}
		return nil
	})
}

// maxViews bounds the views a QP hands out before they are released.
const maxViews = 4096

// RecvViews hands out arrived messages as views of the receive ring
// (fabric.ViewReceiver). Their records stay in the ring, and count
// against its room (a full ring answers the peer with RNR NAKs), until
// ReleaseViews.
func (qp *QP) RecvViews(views []fabric.View) (int, error) {
	if qp.closed.Load() {
		return 0, opErr("recv", fabric.ErrClosed)
	}
	qp.e.pollAcks(false)
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.vq == nil {
		qp.vq = make([]uint64, maxViews)
	}
	want := min(len(views), maxViews-int(qp.vTail-qp.vHead))
	if want == 0 && len(views) > 0 {
		return 0, opErr("recv", fmt.Errorf("%d views outstanding, release some first: %w", maxViews, fabric.ErrInvalid))
	}
	return qp.deliverLocked(want, func(i, ln int, imm uint32, flags fabric.MsgFlags, payload []byte) error {
		views[i] = fabric.View{Data: payload, Imm: imm, Flags: flags, Len: ln}
		qp.vq[qp.vTail%maxViews] = qp.rqHead
		qp.vTail++
		return nil
	})
}

// ReleaseViews gives the oldest n views back (fabric.ViewReceiver).
func (qp *QP) ReleaseViews(n int) error {
	if qp.closed.Load() {
		return opErr("release", fabric.ErrClosed)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if out := int(qp.vTail - qp.vHead); n < 0 || n > out {
		return opErr("release", fmt.Errorf("%d views, %d outstanding: %w", n, out, fabric.ErrInvalid))
	}
	qp.vHead += uint64(n)
	qp.releaseLocked()
	return nil
}

// ViewRoom implements fabric.ViewRoom: views share the receive ring
// (QPConfig.RecvBuffer bytes at most) with the records still to arrive.
func (qp *QP) ViewRoom() (views, bytes int) { return maxViews, qp.cfg.RecvBuffer }

// ViewEpoch implements fabric.ViewRoom: it changes when the QP is
// moved to RESET (Modify), whose next connection writes its receive
// ring from the start, over the memory of views still outstanding.
// Nothing else resets the ring under them (nor Close: it is Go memory).
//
// As ntb's, it reads the epoch with a read-modify-write (adding 0), so
// that a copy made before the call is ordered before a later reset's
// writes.
func (qp *QP) ViewEpoch() uint64 { return qp.epoch.Add(0) }

// OutstandingViews returns the views not yet released.
func (qp *QP) OutstandingViews() int {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return int(qp.vTail - qp.vHead)
}

// releaseLocked moves the room mark to the oldest outstanding view, or to
// everything delivered.
func (rsp *responder) releaseLocked() {
	rsp.rqRel = rsp.rqHead
	if rsp.vHead != rsp.vTail {
		rsp.rqRel = rsp.vq[rsp.vHead%maxViews]
	}
}

// deliverLocked walks up to max arrived records, stepping over padding,
// and hands each to deliver with its index; deliver may fail, leaving the
// record for the next call.
func (qp *QP) deliverLocked(max int, deliver func(i, ln int, imm uint32, flags fabric.MsgFlags, payload []byte) error) (int, error) {
	size := uint64(len(qp.rq))
	n := 0
	var bytes uint64
	var err error
	for n < max && qp.rqHead < qp.rqTail {
		off := qp.rqHead % size
		ln := int(getU32(qp.rq[off:]))
		imm := getU32(qp.rq[off+4:])
		fl := getU32(qp.rq[off+8:])
		if fl&recFlagPad != 0 {
			qp.rqHead += uint64(ln + recHdr)
			continue
		}
		if fl&recFlagWrite != 0 {
			if err = deliver(n, ln, imm, fabric.FlagRemoteWrite|fabric.FlagImm, nil); err != nil {
				break
			}
			qp.rqHead += recHdr
			n++
			continue
		}
		var flags fabric.MsgFlags
		if fl&recFlagImm != 0 {
			flags = fabric.FlagImm
		}
		end := off + recHdr + uint64(ln)
		if err = deliver(n, ln, imm, flags, qp.rq[off+recHdr:end:end]); err != nil {
			break
		}
		bytes += uint64(ln)
		qp.rqHead += uint64((recHdr + ln + 15) &^ 15)
		n++
	}
	qp.releaseLocked()
	qp.ctr.RxBytes.Add(bytes)
	if err != nil {
		return n, err
	}
	if n == 0 && qp.state == StateErr {
		return 0, qp.stateErr("recv")
	}
	return n, nil
}

func (qp *QP) stateErr(op string) error {
	if qp.closed.Load() {
		return opErr(op, fabric.ErrClosed)
	}
	err := qp.status.Err()
	if err == nil {
		err = fabric.ErrFlushed
	}
	return opErr(op, fmt.Errorf("QP %#x in error state: %w", qp.qpn, err))
}

// wait spins on ready, driving the engine, for the spin budget, then
// sleeps on ch until woken, ctx is done or the QP is destroyed.
func (qp *QP) wait(ctx context.Context, b *spin.Budget, ready func() bool, waiters *atomic.Int32, ch chan struct{}) error {
	e := qp.e
	if qp.spin > 0 {
		e.spinner.Add(1)
		s := b.Start()
		for s.Next(ctx) {
			if ready() {
				e.spun()
				b.Arrived(&s)
				return nil
			}
			// The spin yields its Go processor every spin.Every polls, and
			// nothing more: a sched_yield every 16 empty polls (to let a
			// peer process run) handed the CPU to unrelated work on a
			// busy host. Measured side by side on this 2-vCPU host under
			// other sessions' builds and tests (load 2-6), weft-pingpong
			// -backend roce 64 B median 72-95 µs with it against 10-14
			// µs without, two QPs of one engine 114-122 against 47-51
			// µs, two engines 30-31 against 26.5 µs; with two busy loops
			// beside them, 10.5-20.4 against 9.8-12.2 µs.
			e.poll()
			if s.Rounds()%1024 == 0 {
				e.runTimers(time.Now())
			}
		}
		e.unspin()
		b.Slept(&s)
	}
	waiters.Add(1)
	defer waiters.Add(-1)
	if ready() {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-qp.done:
		return os.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (qp *QP) recvReady() bool {
	if qp.closed.Load() {
		return true
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.rqHead < qp.rqTail || qp.state == StateErr
}

// RecvWait is Recv that blocks until a message arrives.
func (qp *QP) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return qp.recvWait(ctx, len(msgs), func() (int, error) { return qp.Recv(msgs) })
}

// RecvViewsWait is RecvViews that blocks until a message arrives.
func (qp *QP) RecvViewsWait(ctx context.Context, views []fabric.View) (int, error) {
	return qp.recvWait(ctx, len(views), func() (int, error) { return qp.RecvViews(views) })
}

func (qp *QP) recvWait(ctx context.Context, want int, poll func() (int, error)) (int, error) {
	for {
		n, err := poll()
		if n > 0 || err != nil || want == 0 {
			return n, err
		}
		if err := qp.wait(ctx, &qp.recvSpin, qp.recvReady, &qp.recvWaiters, qp.recvCh); err != nil {
			if qp.closed.Load() {
				return 0, opErr("recv", fabric.ErrClosed)
			}
			return 0, err
		}
	}
}

func (qp *QP) sendReady() bool {
	if qp.closed.Load() {
		return true
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.sqTail-qp.sqHead < uint64(qp.cfg.SQDepth) || qp.state == StateErr
}

// SendWait is Send that blocks while the send queue is full.
func (qp *QP) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return qp.postWait(ctx, msgs, qp.Send)
}

func (qp *QP) postWait(ctx context.Context, msgs []fabric.Message, post func([]fabric.Message) (int, error)) (int, error) {
	for {
		n, err := post(msgs)
		if n > 0 || err != nil || len(msgs) == 0 {
			return n, err
		}
		if err := qp.wait(ctx, &qp.sendSpin, qp.sendReady, &qp.sendWaiters, qp.sendCh); err != nil {
			if qp.closed.Load() {
				return 0, opErr("send", fabric.ErrClosed)
			}
			return 0, err
		}
	}
}
