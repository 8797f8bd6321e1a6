package roce

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// The hostile peer (issue 29): an engine on a link that only records what
// it sends, and a test that plays the peer, building its packets with
// roce/wire and handing them to the engine's input path as the link
// would (ICRC sealed, parsed, checked, dispatched). Every forged packet is
// taken synchronously, so a test reads the counters right after it; what
// the engine answers is read from the link, with a deadline.

// capLink is a Link that keeps a copy of every datagram written and never
// receives: the test injects the peer's datagrams (peer.inject).
type capLink struct {
	addr   netip.AddrPort
	mu     sync.Mutex
	sent   []capSent
	wrote  chan struct{} // signalled on every write
	closed chan struct{}
	once   sync.Once
	// freezeOn, if set, freezes the link's clock once a datagram it
	// matches is written (see freeze).
	freezeOn func(*wire.Packet) bool
	frozen   bool
}

type capSent struct {
	to  netip.AddrPort
	pkt wire.Packet // parsed from a copy of the datagram
}

func newCapLink(addr netip.AddrPort) *capLink {
	return &capLink{addr: addr, wrote: make(chan struct{}, 1), closed: make(chan struct{})}
}

// errFrozen is what a frozen link's ReadBatch returns.
var errFrozen = errors.New("link frozen by the test")

// ReadBatch finds nothing to read. Frozen, it fails: the engine then
// does not note the link drained, and no timer whose deadline came after
// the freeze fires (see Engine.drained) until thaw.
func (l *capLink) ReadBatch([]link.Packet) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.frozen {
		return 0, errFrozen
	}
	return 0, nil
}

// freezeAfter freezes the link's timers as soon as the engine writes a
// datagram that match accepts (in the write itself, before the timer
// that follows it is armed).
func (l *capLink) freezeAfter(match func(*wire.Packet) bool) {
	l.mu.Lock()
	l.freezeOn = match
	l.mu.Unlock()
}

// thaw lets timers run again.
func (l *capLink) thaw() {
	l.mu.Lock()
	l.frozen, l.freezeOn = false, nil
	l.mu.Unlock()
}

func (l *capLink) WriteBatch(pkts []link.Packet) (int, error) {
	l.mu.Lock()
	for _, p := range pkts {
		pkt, err := wire.Parse(bytes.Clone(p.Buf[:p.N]))
		if err != nil {
			panic("roce: the engine sent a malformed packet: " + err.Error())
		}
		l.sent = append(l.sent, capSent{to: p.Addr, pkt: pkt})
		if l.freezeOn != nil && l.freezeOn(&pkt) {
			l.frozen = true
		}
	}
	l.mu.Unlock()
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return len(pkts), nil
}

func (l *capLink) WaitRead(ctx context.Context, deadline time.Time) error {
	d := time.Millisecond
	if !deadline.IsZero() {
		d = min(d, time.Until(deadline))
	}
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-l.closed:
		return os.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (l *capLink) LocalAddr() netip.AddrPort { return l.addr }

func (l *capLink) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// snapshot returns what the engine has sent so far.
func (l *capLink) snapshot() []capSent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]capSent(nil), l.sent...)
}

// peer is the hostile peer of one engine: the engine runs at 127.0.0.1,
// the peer claims 127.0.0.2, and a third party 127.0.0.9.
type peer struct {
	t    testing.TB
	e    *Engine
	link *capLink
	addr netip.Addr // the peer's address
	next int        // the first sent packet expect has not looked at
}

var (
	engineAddr = netip.MustParseAddr("127.0.0.1")
	peerAddr   = netip.MustParseAddr("127.0.0.2")
	strayAddr  = netip.MustParseAddr("127.0.0.9")
)

// peerQPN is the QP number the hostile peer claims.
const peerQPN = 0x77

func newPeer(t testing.TB) *peer {
	t.Helper()
	l := newCapLink(netip.AddrPortFrom(engineAddr, link.Port))
	e, err := NewEngine(EngineConfig{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return &peer{t: t, e: e, link: l, addr: peerAddr}
}

// injectPacket hands e the datagram that f and payload make, as if src
// had sent it (ICRC sealed for that source), through the input path of
// the engine's poller.
func injectPacket(e *Engine, src netip.Addr, f *wire.Fields, payload []byte) {
	b := make([]byte, wire.PacketLen(f.BTH.OpCode, len(payload)))
	n, err := wire.Build(b, f, payload)
	if err != nil {
		panic(err)
	}
	injectRaw(e, src, b[:n])
}

// injectRaw hands e the datagram b from src, its ICRC sealed.
func injectRaw(e *Engine, src netip.Addr, b []byte) {
	const sport = 0xc001
	if len(b) >= wire.BTHSize+wire.ICRCSize {
		e.sealICRCFrom(b, src, sport)
	}
	e.pollMu.Lock() // the poller's, as the input path's state is
	// Deferred: a panic in input (a mutant's) must not leave the lock to
	// Engine.Close, which the test's cleanup runs while it unwinds.
	defer e.pollMu.Unlock()
	e.input(&link.Packet{Buf: b, N: len(b), Addr: netip.AddrPortFrom(src, 55410), SrcPort: sport})
}

// inject hands e a datagram for QP 1 from src carrying payload (a MAD),
// as its link would.
func inject(e *Engine, src netip.Addr, payload []byte) {
	injectPacket(e, src, &wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: gsiQPN},
		QKey: cm.GSIQKey, SrcQP: gsiQPN}, payload)
}

// inject sends f and payload from the peer's address.
func (p *peer) inject(f *wire.Fields, payload []byte) { injectPacket(p.e, p.addr, f, payload) }

// injectMAD sends a CM MAD to the engine's QP 1 from src.
func (p *peer) injectMAD(src netip.Addr, mad []byte) { inject(p.e, src, mad) }

// expect returns the next packet the engine sent that match accepts,
// waiting for it at most 10 s; packets before it are passed over.
func (p *peer) expect(what string, match func(*wire.Packet) bool) wire.Packet {
	p.t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		sent := p.link.snapshot()
		for ; p.next < len(sent); p.next++ {
			if match(&sent[p.next].pkt) {
				p.next++
				return sent[p.next-1].pkt
			}
		}
		select {
		case <-p.link.wrote:
		case <-deadline.C:
			p.t.Fatalf("no %s from the engine within 10 s (it sent %d packets)", what, len(sent))
		}
	}
}

// count returns how many packets the engine has sent that match accepts.
func (p *peer) count(match func(*wire.Packet) bool) int {
	n := 0
	for _, s := range p.link.snapshot() {
		if match(&s.pkt) {
			n++
		}
	}
	return n
}

// isOp matches the packets of opcode op.
func isOp(op wire.OpCode) func(*wire.Packet) bool {
	return func(pk *wire.Packet) bool { return pk.OpCode() == op }
}

// isOpPSN matches the packets of opcode op with PSN psn.
func isOpPSN(op wire.OpCode, psn wire.PSN) func(*wire.Packet) bool {
	return func(pk *wire.Packet) bool { return pk.OpCode() == op && pk.BTH.PSN() == psn }
}

// isAck matches acknowledgements of the given type (and, for a NAK, code).
func isAck(typ wire.AckType, code wire.NAKCode) func(*wire.Packet) bool {
	return func(pk *wire.Packet) bool {
		if pk.OpCode() != wire.OpRCAcknowledge || pk.AETH.Syndrome().Type() != typ {
			return false
		}
		return typ != wire.AckTypeNAK || pk.AETH.Syndrome().NAKCode() == code
	}
}

// isMAD matches CM MADs of attribute attr.
func isMAD(attr cm.AttrID) func(*wire.Packet) bool {
	return func(pk *wire.Packet) bool {
		return pk.BTH.DestQP() == gsiQPN && len(pk.Payload) == cm.MADSize && cm.MAD(pk.Payload).AttrID() == attr
	}
}

// The PSNs of an RC QP connected to the peer: the engine sends from
// qpSQPSN, and expects the peer's requests from qpRQPSN.
const (
	qpSQPSN wire.PSN = 500
	qpRQPSN wire.PSN = 100
)

// rcQP creates an RC QP of the engine connected to the peer's QP peerQPN.
// attr's PathMTU defaults to 256, its PSNs to qpSQPSN and qpRQPSN.
func (p *peer) rcQP(cfg QPConfig, attr QPAttr) (*QP, *PD) {
	p.t.Helper()
	pd := p.e.AllocPD()
	qp, err := pd.CreateQP(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { qp.Destroy() })
	if attr.PathMTU == 0 {
		attr.PathMTU = 256
	}
	attr.Dest, attr.DestQPN = p.addr, peerQPN
	if attr.SQPSN == 0 {
		attr.SQPSN = qpSQPSN
	}
	if attr.RQPSN == 0 {
		attr.RQPSN = qpRQPSN
	}
	if err := qp.Connect(&attr); err != nil {
		p.t.Fatal(err)
	}
	return qp, pd
}

// ack sends an acknowledgement for qp from the peer: syndrome syn, PSN psn.
func (p *peer) ack(qp *QP, psn wire.PSN, syn wire.Syndrome) {
	p.inject(&wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCAcknowledge, PKey: 0xffff, DestQP: qp.QPN(), PSN: psn},
		Syndrome: syn}, nil)
}

// request sends an RC request to qp from the peer.
func (p *peer) request(qp *QP, op wire.OpCode, psn wire.PSN, f wire.Fields, payload []byte) {
	f.BTH.OpCode, f.BTH.PKey, f.BTH.DestQP, f.BTH.PSN, f.BTH.AckReq = op, 0xffff, qp.QPN(), psn, true
	p.inject(&f, payload)
}

// send posts one signaled SEND of n bytes (filled with fill) on qp.
func postSend(t testing.TB, qp *QP, pd *PD, n int, fill byte, ctx uint64) *fabric.Region {
	t.Helper()
	mr, err := pd.RegMR(bytes.Repeat([]byte{fill}, max(n, 1)), 0)
	if err != nil {
		t.Fatal(err)
	}
	sge := fabric.SGEOf(mr)
	sge.Length = n
	if k, err := qp.Send([]fabric.Message{{SGEs: []fabric.SGE{sge}, Flags: fabric.FlagSignal, Context: ctx}}); k != 1 || err != nil {
		t.Fatalf("posting a send of %d bytes: %d posted, %v", n, k, err)
	}
	return mr
}

// completion waits at most 10 s for qp's next completion.
func completion(t testing.TB, qp *QP, what string) fabric.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]fabric.Completion, 1)
	if _, err := qp.cq.Wait(ctx, out); err != nil {
		t.Fatalf("waiting for the completion of %s: %v (QP %v)", what, err, qp.State())
	}
	return out[0]
}

// noCompletion checks that qp has no completion queued.
func noCompletion(t testing.TB, qp *QP, why string) {
	t.Helper()
	out := make([]fabric.Completion, 1)
	if n := qp.cq.Poll(out); n != 0 {
		t.Fatalf("%s: completion %+v", why, out[0])
	}
}

// drops returns qp's drop count for r.
func drops(qp *QP, r fabric.DropReason) uint64 { return qp.Stats().Drops[r] }

// received returns the messages that arrived on qp (up to 16, of up to
// 4096 bytes each).
func received(t testing.TB, qp *QP) []string {
	t.Helper()
	views := make([]fabric.View, 16)
	n, err := qp.RecvViews(views)
	if err != nil {
		t.Fatalf("receiving: %v", err)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = string(views[i].Data)
	}
	if err := qp.ReleaseViews(n); err != nil {
		t.Fatal(err)
	}
	return out
}
