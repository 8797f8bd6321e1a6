package roce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/wire"
)

// CM is an engine's communication manager: the IB CM protocol (IBA vol. 1
// ch. 12) on the engine's GSI, with the rdma_cm conventions of Linux and
// librdmacm on top (service ids in the TCP port space, the CMA header in
// the REQ's private data). It connects RC queue pairs with peers that run
// rdma_cm — Linux Soft-RoCE, RDMA NICs, other engines — through
// Dial and Listen. Get it with Engine.CM.
type CM struct {
	e   *Engine
	ctr gsiCounters

	mu          sync.Mutex
	conns       map[uint32]*cmConn     // by local communication id
	peers       map[peerKey]*cmConn    // by the peer's address and communication id
	listeners   map[uint16]*CMListener // by rdma_cm port (TCP port space)
	udListeners map[uint16]*CMListener // by rdma_cm port (UDP port space, rdmacm_sidr.go)
	guid        uint64
	closed      bool
}

type peerKey struct {
	addr netip.Addr
	id   uint32
}

// cmShmMark, in bits 40 to 55 of the channel adapter GUID a Weft engine
// sends in its REQs and REPs (otherwise zero there), offers the peer the
// engine's shared-memory ring (link=auto), as exchange.WeftShmLID does in
// the pingpong exchange: the rdma_cm private data belongs to the
// application. Linux's CM and librdmacm keep a peer's GUID as a name and
// read nothing into it.
const (
	cmShmMark = 0x5746 << 40
	cmGUIDTag = 0x02 << 56 // the top byte of every Weft engine's GUID
)

// cmOffersShm reports whether a peer's channel adapter GUID offers its
// shared-memory ring: a Weft GUID (cmGUIDTag) with cmShmMark. The top
// 24 bits are checked, not the mark's 16 alone: those of an EUI-64 GUID
// made from a MAC (rxe's, a NIC's) are the MAC's second and third bytes,
// which may be anything.
func cmOffersShm(guid uint64) bool { return guid>>40 == (cmGUIDTag|cmShmMark)>>40 }

// CM returns the engine's communication manager, starting it on first
// use. From then on the engine answers CM datagrams: a REQ for a port
// nobody listens on is rejected (which the peer's rdma_connect reports as
// connection refused).
func (e *Engine) CM() *CM {
	if m := e.gsi.Load(); m != nil {
		return m
	}
	m := &CM{e: e, conns: map[uint32]*cmConn{}, peers: map[peerKey]*cmConn{}, listeners: map[uint16]*CMListener{},
		udListeners: map[uint16]*CMListener{}}
	// A channel adapter GUID: EUI-64 style, from the engine's address,
	// marked where the engine offers its shared-memory ring.
	a := e.local.As16()
	m.guid = 0x0200_0000_0000_0000 | uint64(binary.BigEndian.Uint32(a[12:]))<<8 | uint64(a[11])
	if e.shmRing() {
		m.guid |= cmShmMark
	}
	if e.gsi.CompareAndSwap(nil, m) {
		return m
	}
	return e.gsi.Load()
}

// ConnConfig are the parameters of a connection made by Dial or accepted
// from a CMListener. The zero value is the default.
type ConnConfig struct {
	// PrivateData is the user data sent with the REQ (at most
	// cm.UserREQPrivateDataSize bytes: 56), the REP
	// (cm.UserREPPrivateDataSize: 196) or the REJ.
	PrivateData []byte
	// ResponderResources is how many RDMA READs and atomics the QP accepts
	// outstanding from the peer; InitiatorDepth how many it issues. The
	// peer's answer lowers them (0: 16 each).
	ResponderResources, InitiatorDepth uint8
	// MTU is the largest path MTU to use (0: 1024). The connecting side
	// chooses; the accepting side takes the REQ's.
	MTU int
	// ResponseTimeout is the CM response timeout exponent: a REQ, REP or
	// DREQ is sent again after 4.096 µs × 2^ResponseTimeout without an
	// answer (0: 18, about 1.07 s), at most MaxRetries times (0: 8).
	ResponseTimeout, MaxRetries uint8
	// ACKTimeout is the transport's local ACK timeout exponent (4.096 µs
	// × 2^ACKTimeout; 0: DefaultCMACKTimeout, 19, 2.1 s, what Linux's
	// rdma_cm asks for on a RoCE path). The connecting side asks for it
	// in the REQ (the primary path's local ACK timeout), which a Linux
	// peer's QP takes as its own, and its QP uses it. The accepting side's
	// QP takes the REQ's, as Linux's does, or its own ACKTimeout where
	// that is larger (a REQ asking for none, 0, gets the default). The
	// engine's QP backs a timeout off by doubling it up to 2 s, and does
	// not double one that is longer already, so at 19 with Retry 7 a peer
	// gone without a DREQ is noticed after about 17 s, as by Linux's rxe
	// (14: about 8 s); set a smaller ACKTimeout where that matters more
	// than a slow peer. Retry and RNRRetry are the retry counts the peer's
	// QP should use for ours (0: 7; rxe treats 7 as infinite).
	ACKTimeout, Retry, RNRRetry uint8
	// KeepAlive is the QP's idle keep-alive (see QPAttr.KeepAlive).
	KeepAlive time.Duration
	// QP are the queue pair's sizes; its Type is always RC.
	QP QPConfig

	ackDefault bool // ACKTimeout was 0: the default, not the application's
}

// DefaultCMACKTimeout is the local ACK timeout exponent of an rdma_cm
// connection whose ConnConfig leaves ACKTimeout 0: 4.096 µs × 2^19, about
// 2.1 s. It is what Linux's rdma_cm puts in its REQ on a RoCE path
// (Debian 12's 6.1 kernel on rxe, seen on the wire: the path's packet
// life time, 18, plus one, which the CA's ACK delay, 15 on rxe, does not
// raise), and so the timeout a Linux peer's QP and ours use. With a
// shorter one (16.8 ms), against rxe in emulated guests, whose ACKs come
// late, both rxe and the engine sent a tenth or more of their request
// packets again.
const DefaultCMACKTimeout = 19

func (c *ConnConfig) withDefaults() ConnConfig {
	o := *c
	def := func(p *uint8, v uint8) {
		if *p == 0 {
			*p = v
		}
	}
	def(&o.ResponderResources, 16)
	def(&o.InitiatorDepth, 16)
	def(&o.ResponseTimeout, 18)
	def(&o.MaxRetries, 8)
	o.ackDefault = o.ACKTimeout == 0
	def(&o.ACKTimeout, DefaultCMACKTimeout)
	def(&o.Retry, 7)
	def(&o.RNRRetry, 7)
	if o.MTU == 0 {
		o.MTU = 1024
	}
	o.QP.Type = RC
	return o
}

// acceptACKTimeout is the local ACK timeout of an accepted connection's QP
// when the REQ asks for req (c with defaults): req itself, as Linux's CM
// takes it, raised to c's ACKTimeout if the application set one; the
// default if the REQ asks for none.
func (c *ConnConfig) acceptACKTimeout(req uint8) uint8 {
	t := req
	if !c.ackDefault {
		t = max(t, c.ACKTimeout)
	}
	if t == 0 {
		t = c.ACKTimeout
	}
	return t
}

// maxPendingRequest bounds how long a connection request waits for Accept.
const maxPendingRequest = 10 * time.Second

type cmState uint8

const (
	cmIdle cmState = iota
	cmReqSent
	cmReqRcvd
	cmRepSent
	cmEstablished
	cmDreqSent
	cmTimewait
)

var cmStateNames = [...]string{"IDLE", "REQ_SENT", "REQ_RCVD", "REP_SENT", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT"}

func (s cmState) String() string { return cmStateNames[s] }

// cmConn is one connection's CM state. The CM's mutex guards it.
type cmConn struct {
	m        *CM
	state    cmState
	active   bool
	ud       bool   // a SIDR exchange (rdmacm_sidr.go), not a connection
	qkey     uint32 // SIDR: the service's Q_Key
	localID  uint32
	remoteID uint32
	tid      uint64
	peer     netip.Addr // the peer's IP address (its GID)
	cfg      ConnConfig

	qp *QP
	// The starting PSN of a REQ or REP is the PSN its sender expects to
	// receive first, which its peer sends from (Linux: the active side's
	// sq_psn comes from the REP, the passive side's from the REQ; see
	// testdata/README.md of roce/cm).
	psn       wire.PSN // the PSN we expect first (our RQPSN, sent in our REQ or REP)
	remoteQPN uint32
	remotePSN wire.PSN // the PSN the peer expects first (our SQPSN)
	mtu       int
	rr, depth uint8 // negotiated responder resources and initiator depth

	sid       cm.ServiceID
	srcPort   uint16 // the rdma_cm port of the connecting side
	peerData  []byte // the peer's private data (REQ: after the CMA header)
	peerShm   bool   // the REQ's GUID offered the peer's shared-memory ring (cmShmMark)
	remoteAck uint8  // REQ: the ACK timeout the connecting side asks us to use
	remoteRet uint8  // REQ: the retry count it asks for
	remoteRNR uint8  // REQ/REP: the RNR retry count it asks for

	last    [cm.MADSize]byte // the message to send again on timeout
	retries int
	timer   *time.Timer
	gen     uint64
	err     error
	done    chan struct{} // closed when the handshake ends (established or failed)
	closed  chan struct{} // closed when the disconnection ends (DREP, timeout)
	lst     *CMListener
}

// newConn allocates a connection with a fresh local communication id.
// The caller holds m.mu.
func (m *CM) newConn(cfg ConnConfig) *cmConn {
	c := &cmConn{m: m, cfg: cfg, done: make(chan struct{}), closed: make(chan struct{})}
	var b [8]byte
	for {
		rand.Read(b[:])
		c.localID = binary.LittleEndian.Uint32(b[:])
		if _, used := m.conns[c.localID]; c.localID != 0 && !used {
			break
		}
	}
	c.psn = wire.PSN(binary.LittleEndian.Uint32(b[4:]) & wire.PSNMask)
	m.conns[c.localID] = c
	return c
}

// forget removes c from the CM's tables. The caller holds m.mu.
func (m *CM) forget(c *cmConn) {
	c.stopTimer()
	if m.conns[c.localID] == c {
		delete(m.conns, c.localID)
	}
	k := peerKey{c.peer, c.remoteID}
	if m.peers[k] == c {
		delete(m.peers, k)
	}
}

// viaShm reports whether the connection's QP sends through the peer's
// shared-memory ring (link=auto): its CM messages go the same way, so
// that a DREQ or RTU keeps its place among the QP's packets.
// Before its QP, a passive connection answers (a REJ) through the ring
// the REQ offered, if alive: a link=shm peer reads nothing else.
func (c *cmConn) viaShm() bool {
	if c.qp == nil {
		return c.m.e.viaShm(RC, c.peerShm, c.peer)
	}
	return c.qp.viaShm
}

// send sends the message in c.last to the peer. With retry it arms the
// response timer, which sends it again up to cfg.MaxRetries times and then
// calls c.expire.
func (c *cmConn) send(retry bool) {
	c.m.sendMAD(c.peer, c.last[:], c.viaShm())
	c.stopTimer()
	if retry {
		c.retries = int(c.cfg.MaxRetries)
		c.arm(cm.Timeout(c.cfg.ResponseTimeout))
	}
}

func (c *cmConn) arm(d time.Duration) {
	c.gen++
	gen := c.gen
	c.timer = time.AfterFunc(d, func() { c.m.fire(c, gen) })
}

func (c *cmConn) stopTimer() {
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// fire runs c's response timer.
func (m *CM) fire(c *cmConn, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.gen != gen {
		return
	}
	c.timer = nil
	switch c.state {
	case cmReqSent, cmRepSent, cmDreqSent:
		if c.retries > 0 {
			c.retries--
			m.ctr.retx.Add(1)
			m.sendMAD(c.peer, c.last[:], c.viaShm())
			c.arm(cm.Timeout(c.cfg.ResponseTimeout))
			return
		}
		c.expire()
	case cmReqRcvd:
		// Nobody accepted in time.
		if c.ud {
			c.sidrReply(cm.SIDRReject, 0, 0, nil)
		} else {
			c.reject(cm.RejTimeout, cm.MsgREQ, nil)
		}
		c.fail(cm.ErrTimeout)
	case cmTimewait:
		c.finish()
	}
}

// expire ends a handshake or disconnection that got no answer.
func (c *cmConn) expire() {
	switch c.state {
	case cmReqSent:
		if !c.ud {
			c.reject(cm.RejTimeout, cm.MsgREQ, nil)
		}
		c.fail(cm.ErrTimeout)
	case cmRepSent:
		c.reject(cm.RejTimeout, cm.MsgREP, nil)
		c.fail(cm.ErrTimeout)
	case cmDreqSent:
		c.timewait()
	}
}

// fail ends a connection that is not established: the QP goes, Dial or
// Accept returns err. An established connection that fails is the peer's
// loss: its QP reports it.
func (c *cmConn) fail(err error) {
	was := c.state
	c.state = cmIdle
	c.m.forget(c)
	if c.err == nil {
		c.err = err
	}
	if c.qp != nil {
		c.qp.mu.Lock()
		c.qp.errorLocked(fabric.StatusPeerGone)
		c.qp.mu.Unlock()
	}
	if was != cmEstablished {
		closeOnce(c.done)
	}
	closeOnce(c.closed)
}

// timewait enters TIMEWAIT: the QP is in ERR, and the ids stay reserved
// for a while so that late messages of the connection match nothing new.
func (c *cmConn) timewait() { c.timewaitAs(fabric.StatusPeerGone) }

// timewaitAs is timewait with the status the QP fails with.
func (c *cmConn) timewaitAs(st fabric.Status) {
	c.state = cmTimewait
	c.stopTimer()
	if c.qp != nil {
		c.qp.mu.Lock()
		c.qp.errorLocked(st)
		c.qp.mu.Unlock()
	}
	closeOnce(c.done)
	closeOnce(c.closed)
	c.arm(cm.Timeout(c.cfg.ResponseTimeout))
}

// finish forgets a connection at the end of TIMEWAIT.
func (c *cmConn) finish() {
	c.state = cmIdle
	c.m.forget(c)
}

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// reject sends a REJ for c.
func (c *cmConn) reject(reason cm.RejectReason, which cm.MsgKind, data []byte) {
	var b [cm.MADSize]byte
	mad := cm.MAD(b[:])
	mad.Init(cm.AttrREJ, c.tid)
	r := cm.REJ(mad.Data())
	r.SetLocalCommID(c.localID)
	r.SetRemoteCommID(c.remoteID)
	r.SetMessageRejected(which)
	r.SetReason(reason)
	copy(r.PrivateData(), data)
	c.m.sendMAD(c.peer, b[:], c.viaShm())
}

// replyREJ answers a message that matches no connection with a REJ,
// through dst's shared-memory ring if shm.
func (m *CM) replyREJ(dst netip.Addr, tid uint64, remoteID uint32, which cm.MsgKind, reason cm.RejectReason, shm bool) {
	var b [cm.MADSize]byte
	mad := cm.MAD(b[:])
	mad.Init(cm.AttrREJ, tid)
	r := cm.REJ(mad.Data())
	r.SetRemoteCommID(remoteID)
	r.SetMessageRejected(which)
	r.SetReason(reason)
	m.sendMAD(dst, b[:], shm)
}

// input handles a valid CM MAD from src. It runs on the engine's polling
// thread and does not block.
func (m *CM) input(mad cm.MAD, src netip.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	ok := true
	d := mad.Data()
	switch mad.AttrID() {
	case cm.AttrREQ:
		ok = m.onREQ(mad, src)
	case cm.AttrREP:
		ok = m.onREP(mad, cm.REP(d), src)
	case cm.AttrRTU:
		r := cm.RTU(d)
		c := m.match(r.RemoteCommID(), r.LocalCommID(), src)
		ok = c != nil && c.state == cmRepSent
		if ok {
			c.established()
		}
	case cm.AttrREJ:
		ok = m.onREJ(cm.REJ(d), src)
	case cm.AttrMRA:
		r := cm.MRA(d)
		c := m.match(r.RemoteCommID(), r.LocalCommID(), src)
		ok = c != nil && ((c.state == cmReqSent && r.MessageMRAed() == cm.MsgREQ) || (c.state == cmRepSent && r.MessageMRAed() == cm.MsgREP))
		if ok {
			// The peer needs longer: wait its service time plus ours.
			c.stopTimer()
			c.retries = int(c.cfg.MaxRetries)
			c.arm(cm.Timeout(r.ServiceTimeout()) + cm.Timeout(c.cfg.ResponseTimeout))
		}
	case cm.AttrDREQ:
		ok = m.onDREQ(mad, cm.DREQ(d), src)
	case cm.AttrDREP:
		r := cm.DREP(d)
		c := m.match(r.RemoteCommID(), r.LocalCommID(), src)
		ok = c != nil && c.state == cmDreqSent
		if ok {
			c.timewait()
		}
	case cm.AttrSIDRReq:
		ok = m.onSIDRReq(mad, cm.SIDRReq(d), src)
	case cm.AttrSIDRRep:
		ok = m.onSIDRRep(cm.SIDRRep(d), src)
	}
	if !ok {
		m.ctr.unmatched.Add(1)
	}
}

// match finds the connection a message addressed to local id from the
// peer's remote id belongs to; remote 0 matches a connection that has not
// learnt the peer's id yet. A message from another address matches
// nothing (a forged or misdirected id).
func (m *CM) match(local, remote uint32, src netip.Addr) *cmConn {
	c := m.conns[local]
	if c == nil || c.peer != src || (c.remoteID != 0 && c.remoteID != remote) {
		return nil
	}
	return c
}

func (c *cmConn) established() {
	c.state = cmEstablished
	c.stopTimer()
	closeOnce(c.done)
}

// reqShm reports whether an answer to req, from src, goes through src's
// shared-memory ring: the REQ offered it (cmShmMark) and it is alive. A
// link=shm peer reads nothing else.
func (m *CM) reqShm(req cm.REQ, src netip.Addr) bool {
	return m.e.viaShm(RC, cmOffersShm(req.LocalCAGUID()), src)
}

// onREQ handles a connection request.
func (m *CM) onREQ(mad cm.MAD, src netip.Addr) bool {
	req := cm.REQ(mad.Data())
	if req.Primary().LocalGID().Unmap() != src {
		return false // the REQ names another sender
	}
	// A REQ sent again because our REP or MRA was lost.
	if c := m.peers[peerKey{src, req.LocalCommID()}]; c != nil && !c.ud {
		if c.state == cmRepSent {
			m.ctr.retx.Add(1)
			m.sendMAD(c.peer, c.last[:], c.viaShm())
		}
		return true
	}
	sid := req.ServiceID()
	var lst *CMListener
	if sid.IsRDMACM() && sid.PortSpace() == cm.PortSpaceTCP {
		lst = m.listeners[sid.Port()]
	}
	hdr := cm.CMAHeader(req.PrivateData())
	switch {
	case lst == nil:
		m.replyREJ(src, mad.TID(), req.LocalCommID(), cm.MsgREQ, cm.RejInvalidServiceID, m.reqShm(req, src))
		return true
	case req.TransportType() != cm.TransportRC || req.ExtendedTransportType() != 0:
		m.replyREJ(src, mad.TID(), req.LocalCommID(), cm.MsgREQ, cm.RejInvalidTransportType, m.reqShm(req, src))
		return true
	case hdr.Check() != nil:
		m.ctr.drops.Add(hdr.Check())
		m.replyREJ(src, mad.TID(), req.LocalCommID(), cm.MsgREQ, cm.RejConsumerDefined, m.reqShm(req, src))
		return true
	}
	// A new QP from the same peer QP while an old connection lives: the
	// old one is stale (its peer restarted).
	for _, o := range m.conns {
		if o.peer == src && o.remoteQPN == req.LocalQPN() && o.state == cmEstablished {
			m.replyREJ(src, mad.TID(), req.LocalCommID(), cm.MsgREQ, cm.RejStaleConn, m.reqShm(req, src))
			o.sendDREQ()
			return true
		}
	}
	c := m.newConn(lst.cfg)
	c.tid = mad.TID()
	c.peer = src
	c.remoteID = req.LocalCommID()
	c.remoteQPN = req.LocalQPN()
	c.remotePSN = wire.PSN(req.StartingPSN())
	c.mtu = req.PathMTU().Bytes()
	c.sid = sid
	c.srcPort = hdr.Port()
	c.peerData = append([]byte(nil), req.PrivateData()[cm.CMAHeaderSize:]...)
	c.peerShm = cmOffersShm(req.LocalCAGUID())
	c.remoteAck = req.Primary().LocalACKTimeout()
	c.remoteRet = req.RetryCount()
	c.remoteRNR = req.RNRRetryCount()
	// Negotiate: we read as many as the peer will answer, and answer as
	// many as it will issue.
	c.depth = min(c.cfg.InitiatorDepth, req.ResponderResources())
	c.rr = min(c.cfg.ResponderResources, req.InitiatorDepth())
	c.lst = lst
	c.state = cmReqRcvd
	m.peers[peerKey{src, c.remoteID}] = c
	if !lst.offer(&ConnRequest{c: c}) {
		c.reject(cm.RejConsumerDefined, cm.MsgREQ, nil) // backlog full
		c.finish()
		return true
	}
	// The peer waits this long for an answer before it gives up; an
	// application that has not accepted by then loses the request. The
	// wait is the peer's to choose, so it is capped: a flood of REQs with
	// huge timeouts must not hold the backlog for long.
	c.arm(min(cm.Timeout(req.RemoteCMResponseTimeout())*time.Duration(req.MaxCMRetries()+1), maxPendingRequest))
	return true
}

// onREP handles the answer to our REQ.
func (m *CM) onREP(mad cm.MAD, rep cm.REP, src netip.Addr) bool {
	c := m.match(rep.RemoteCommID(), rep.LocalCommID(), src)
	if c == nil || !c.active {
		return false
	}
	if c.state == cmEstablished && rep.LocalCommID() == c.remoteID {
		// Our RTU was lost: send it again.
		m.sendRTU(c)
		return true
	}
	if c.state != cmReqSent {
		return false
	}
	c.remoteID = rep.LocalCommID()
	c.remoteQPN = rep.LocalQPN()
	c.remotePSN = wire.PSN(rep.StartingPSN())
	c.depth = max(1, min(c.cfg.InitiatorDepth, rep.ResponderResources()))
	c.rr = rep.InitiatorDepth()
	c.peerData = append([]byte(nil), rep.PrivateData()...)
	m.peers[peerKey{src, c.remoteID}] = c
	c.qp.viaShm = m.e.viaShm(c.qp.cfg.Type, cmOffersShm(rep.LocalCAGUID()), src) // before the QP connects
	attr := &QPAttr{PathMTU: c.mtu, Dest: c.peer, DestQPN: c.remoteQPN, RQPSN: c.psn, SQPSN: c.remotePSN,
		Timeout: c.cfg.ACKTimeout, RetryCnt: c.cfg.Retry, RNRRetry: rep.RNRRetryCount(), MinRNRTimer: 12,
		MaxRDAtomic: int(c.depth), KeepAlive: c.cfg.KeepAlive}
	if err := c.qp.Connect(attr); err != nil {
		c.reject(cm.RejNoQP, cm.MsgREP, nil)
		c.fail(err)
		return true
	}
	m.sendRTU(c)
	c.established()
	return true
}

func (m *CM) sendRTU(c *cmConn) {
	var b [cm.MADSize]byte
	mad := cm.MAD(b[:])
	mad.Init(cm.AttrRTU, c.tid)
	r := cm.RTU(mad.Data())
	r.SetLocalCommID(c.localID)
	r.SetRemoteCommID(c.remoteID)
	m.sendMAD(c.peer, b[:], c.viaShm())
}

// onREJ handles a rejection of our REQ or REP, or of the connection.
func (m *CM) onREJ(rej cm.REJ, src netip.Addr) bool {
	c := m.match(rej.RemoteCommID(), rej.LocalCommID(), src)
	if c == nil {
		return false
	}
	switch c.state {
	case cmReqSent, cmRepSent, cmReqRcvd:
		c.fail(cm.NewRejectError(rej))
	case cmEstablished, cmDreqSent:
		c.timewait()
	default:
		return false
	}
	return true
}

// onDREQ handles the peer's disconnection.
func (m *CM) onDREQ(mad cm.MAD, dreq cm.DREQ, src netip.Addr) bool {
	c := m.match(dreq.RemoteCommID(), dreq.LocalCommID(), src)
	ok := c != nil && c.remoteID != 0 && (c.qp == nil || dreq.RemoteQPN() == c.qp.QPN())
	if ok {
		switch c.state {
		case cmEstablished, cmRepSent, cmDreqSent:
			c.timewaitAs(fabric.StatusPeerClosed) // the peer said goodbye
		case cmTimewait:
			m.ctr.retx.Add(1) // our DREP was lost
		default:
			ok = false
		}
	}
	// Answer even a DREQ for a connection we no longer know: the peer
	// may have missed our DREP before we forgot it.
	var b [cm.MADSize]byte
	out := cm.MAD(b[:])
	out.Init(cm.AttrDREP, mad.TID())
	r := cm.DREP(out.Data())
	r.SetLocalCommID(dreq.RemoteCommID())
	r.SetRemoteCommID(dreq.LocalCommID())
	// On the connection's carrier, as its DREQ came: a peer on link=shm
	// reads no UDP.
	m.sendMAD(src, b[:], c != nil && c.viaShm())
	return ok
}

// sendDREQ starts the disconnection of an established connection. The
// caller holds m.mu.
func (c *cmConn) sendDREQ() {
	if c.state != cmEstablished && c.state != cmRepSent {
		return
	}
	mad := cm.MAD(c.last[:])
	mad.Init(cm.AttrDREQ, c.tid)
	r := cm.DREQ(mad.Data())
	r.SetLocalCommID(c.localID)
	r.SetRemoteCommID(c.remoteID)
	r.SetRemoteQPN(c.remoteQPN)
	c.state = cmDreqSent
	if c.qp != nil {
		c.qp.mu.Lock()
		c.qp.errorLocked(fabric.StatusFlushed)
		c.qp.mu.Unlock()
	}
	c.send(true)
}

// Dial connects an RC queue pair of pd to the rdma_cm listener at raddr
// (IP address and rdma_cm port), like rdma_connect: REQ, REP, RTU. It
// returns when the connection is established, the peer rejects it (a
// *cm.RejectError: errors.Is(err, fabric.ErrRefused) when nobody listens
// or the application rejected), the peer does not answer (cm.ErrTimeout,
// matching context.DeadlineExceeded) or ctx is done.
func (m *CM) Dial(ctx context.Context, pd *PD, raddr netip.AddrPort, cfg *ConnConfig) (*Conn, error) {
	if cfg == nil {
		cfg = &ConnConfig{}
	}
	o := cfg.withDefaults()
	if len(o.PrivateData) > cm.UserREQPrivateDataSize {
		return nil, fmt.Errorf("roce: %d bytes of private data, at most %d fit a REQ: %w", len(o.PrivateData), cm.UserREQPrivateDataSize, fabric.ErrInvalid)
	}
	if !validMTU(o.MTU) {
		return nil, fmt.Errorf("roce: path MTU %d: %w", o.MTU, fabric.ErrInvalid)
	}
	qp, err := pd.CreateQP(o.QP)
	if err != nil {
		return nil, err
	}
	if err := qp.Modify(StateInit, &QPAttr{}); err != nil {
		qp.Destroy()
		return nil, err
	}
	dst := raddr.Addr().Unmap()
	var pb [2]byte
	rand.Read(pb[:])
	srcPort := 0x8000 | binary.LittleEndian.Uint16(pb[:])&0x7fff // an ephemeral rdma_cm port, as the kernel picks one

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		qp.Destroy()
		return nil, os.ErrClosed
	}
	c := m.newConn(o)
	c.active = true
	c.qp = qp
	c.peer = dst
	c.mtu = o.MTU
	c.srcPort = srcPort
	c.sid = cm.RDMACMServiceID(cm.PortSpaceTCP, raddr.Port())
	var tb [4]byte
	rand.Read(tb[:])
	c.tid = uint64(binary.LittleEndian.Uint32(tb[:]))<<32 | uint64(c.localID)
	mad := cm.MAD(c.last[:])
	mad.Init(cm.AttrREQ, c.tid)
	req := cm.REQ(mad.Data())
	req.SetLocalCommID(c.localID)
	req.SetServiceID(c.sid)
	req.SetLocalCAGUID(m.guid)
	req.SetLocalQPN(qp.QPN())
	req.SetResponderResources(o.ResponderResources)
	req.SetInitiatorDepth(o.InitiatorDepth)
	req.SetRemoteCMResponseTimeout(o.ResponseTimeout)
	req.SetTransportType(cm.TransportRC)
	req.SetStartingPSN(uint32(c.psn))
	req.SetLocalCMResponseTimeout(o.ResponseTimeout)
	req.SetRetryCount(o.Retry)
	req.SetPKey(wire.DefaultPKey)
	req.SetPathMTU(cm.MTUOf(o.MTU))
	req.SetRNRRetryCount(o.RNRRetry)
	req.SetMaxCMRetries(o.MaxRetries)
	p := req.Primary()
	p.SetLocalLID(0xffff) // LIDs mean nothing on RoCE; Linux sends the permissive LID
	p.SetRemoteLID(0xffff)
	p.SetLocalGID(m.e.local)
	p.SetRemoteGID(dst)
	p.SetHopLimit(64)
	p.SetLocalACKTimeout(o.ACKTimeout)
	cm.CMAHeader(req.PrivateData()).Set(netip.AddrPortFrom(m.e.local, srcPort), dst)
	copy(req.PrivateData()[cm.CMAHeaderSize:], o.PrivateData)
	c.state = cmReqSent
	c.send(true)
	m.mu.Unlock()

	if err := m.await(ctx, c, cmReqSent, func() { c.reject(cm.RejTimeout, cm.MsgREQ, nil) }); err != nil {
		qp.Destroy()
		return nil, err
	}
	return &Conn{c: c}, nil
}

// await waits until c's handshake ends, or ctx does while c is still in
// state pending: then giveUp (nil: nothing) tells the peer and c fails
// with ctx's error. It returns c's error. The caller does not hold m.mu.
func (m *CM) await(ctx context.Context, c *cmConn, pending cmState, giveUp func()) error {
	select {
	case <-c.done:
	case <-ctx.Done():
		m.mu.Lock()
		if c.state == pending {
			if giveUp != nil {
				giveUp()
			}
			c.fail(ctx.Err())
		}
		m.mu.Unlock()
		<-c.done
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return c.err
}

// CMListener takes rdma_cm connection requests for one port of the TCP port
// space, like rdma_listen.
type CMListener struct {
	m       *CM
	port    uint16
	ud      bool
	cfg     ConnConfig
	q       chan *ConnRequest
	done    chan struct{}
	closeMu sync.Once
}

// Listen starts taking connection requests for rdma_cm port port. backlog
// bounds the requests waiting for Accept (0: 128); more are rejected.
func (m *CM) Listen(port uint16, backlog int, cfg *ConnConfig) (*CMListener, error) {
	return m.listen(port, backlog, cfg, false)
}

func (m *CM) listen(port uint16, backlog int, cfg *ConnConfig, ud bool) (*CMListener, error) {
	if cfg == nil {
		cfg = &ConnConfig{}
	}
	if backlog <= 0 {
		backlog = 128
	}
	l := &CMListener{m: m, port: port, ud: ud, cfg: cfg.withDefaults(), q: make(chan *ConnRequest, backlog), done: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, os.ErrClosed
	}
	tab := m.listeners
	if ud {
		tab = m.udListeners
	}
	if _, used := tab[port]; used {
		return nil, fmt.Errorf("roce: rdma_cm port %d: address in use: %w", port, fabric.ErrInvalid)
	}
	tab[port] = l
	return l, nil
}

// offer queues a request; false if the backlog is full. The caller holds
// m.mu.
func (l *CMListener) offer(r *ConnRequest) bool {
	select {
	case l.q <- r:
		return true
	default:
		return false
	}
}

// Port returns the rdma_cm port the listener takes requests for.
func (l *CMListener) Port() uint16 { return l.port }

// Next returns the next connection request, waiting until one arrives,
// ctx is done or the listener is closed (os.ErrClosed).
func (l *CMListener) Next(ctx context.Context) (*ConnRequest, error) {
	for {
		select {
		case r := <-l.q:
			l.m.mu.Lock()
			live := r.c.state == cmReqRcvd
			l.m.mu.Unlock()
			if live {
				return r, nil
			}
		case <-l.done:
			return nil, os.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close stops taking requests; requests not yet accepted are rejected.
func (l *CMListener) Close() error {
	l.closeMu.Do(func() {
		m := l.m
		m.mu.Lock()
		tab := m.listeners
		if l.ud {
			tab = m.udListeners
		}
		if tab[l.port] == l {
			delete(tab, l.port)
		}
		close(l.done)
		for {
			select {
			case r := <-l.q:
				if r.c.state == cmReqRcvd {
					r.c.refuse(nil)
					r.c.fail(os.ErrClosed)
				}
				continue
			default:
			}
			break
		}
		m.mu.Unlock()
	})
	return nil
}

// ConnRequest is a connection request waiting for Accept or Reject.
type ConnRequest struct {
	c *cmConn
}

// RemoteAddr returns the connecting side's IP address and rdma_cm port.
func (r *ConnRequest) RemoteAddr() netip.AddrPort { return netip.AddrPortFrom(r.c.peer, r.c.srcPort) }

// PrivateData returns the user's private data of the REQ (after the CMA
// header; zero-padded to cm.UserREQPrivateDataSize bytes).
func (r *ConnRequest) PrivateData() []byte { return r.c.peerData }

// Reject refuses the request with private data (at most
// cm.UserREJPrivateDataSize bytes), like rdma_reject: the peer's Dial
// fails with a *cm.RejectError matching fabric.ErrRefused.
func (r *ConnRequest) Reject(data []byte) error {
	m := r.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.c.state != cmReqRcvd {
		return fmt.Errorf("roce: connection request no longer pending: %w", fabric.ErrInvalid)
	}
	r.c.refuse(data)
	r.c.fail(fabric.ErrRefused)
	return nil
}

// refuse answers a pending request with a REJ, or a SIDR_REP with status
// reject for a UD request. The caller holds m.mu.
func (c *cmConn) refuse(data []byte) {
	if c.ud {
		c.sidrReply(cm.SIDRReject, 0, 0, data)
		return
	}
	c.reject(cm.RejConsumerDefined, cm.MsgREQ, data)
}

// Accept accepts the request with an RC queue pair of pd, like
// rdma_accept: the QP is connected (RTS), the REP goes out with the
// private data of cfg (nil: the listener's), and Accept returns when the
// RTU arrives, the peer rejects or goes silent, or ctx is done.
func (r *ConnRequest) Accept(ctx context.Context, pd *PD, data []byte) (*Conn, error) {
	c := r.c
	m := c.m
	if len(data) > cm.UserREPPrivateDataSize {
		return nil, fmt.Errorf("roce: %d bytes of private data, at most %d fit a REP: %w", len(data), cm.UserREPPrivateDataSize, fabric.ErrInvalid)
	}
	qp, err := pd.CreateQP(c.cfg.QP)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if c.state != cmReqRcvd || c.ud {
		m.mu.Unlock()
		qp.Destroy()
		return nil, fmt.Errorf("roce: connection request no longer pending (or UD: see AcceptUD): %w", fabric.ErrInvalid)
	}
	c.stopTimer()
	mtu := c.mtu
	if !validMTU(mtu) {
		mtu = 1024
	}
	attr := &QPAttr{PathMTU: mtu, Dest: c.peer, DestQPN: c.remoteQPN, RQPSN: c.psn, SQPSN: c.remotePSN,
		Timeout: c.cfg.acceptACKTimeout(c.remoteAck), RetryCnt: c.remoteRet, RNRRetry: c.remoteRNR, MinRNRTimer: 12,
		MaxRDAtomic: max(1, int(c.depth)), KeepAlive: c.cfg.KeepAlive}
	qp.viaShm = m.e.viaShm(qp.cfg.Type, c.peerShm, c.peer) // before the QP connects
	if err := qp.Connect(attr); err != nil {
		c.reject(cm.RejNoQP, cm.MsgREQ, nil)
		c.fail(err)
		m.mu.Unlock()
		qp.Destroy()
		return nil, err
	}
	c.qp = qp
	mad := cm.MAD(c.last[:])
	mad.Init(cm.AttrREP, c.tid)
	rep := cm.REP(mad.Data())
	rep.SetLocalCommID(c.localID)
	rep.SetRemoteCommID(c.remoteID)
	rep.SetLocalQPN(qp.QPN())
	rep.SetStartingPSN(uint32(c.psn))
	rep.SetResponderResources(c.rr)
	rep.SetInitiatorDepth(c.depth)
	rep.SetTargetACKDelay(15)
	rep.SetRNRRetryCount(c.cfg.RNRRetry)
	rep.SetLocalCAGUID(m.guid)
	if data == nil {
		data = c.cfg.PrivateData
	}
	copy(rep.PrivateData(), data)
	c.state = cmRepSent
	c.send(true)
	m.mu.Unlock()

	if err := m.await(ctx, c, cmRepSent, func() { c.reject(cm.RejTimeout, cm.MsgREP, nil) }); err != nil {
		qp.Destroy()
		return nil, err
	}
	return &Conn{c: c}, nil
}

// Conn is an established rdma_cm connection: an RC queue pair connected
// to the peer's, and the CM state that disconnects it.
type Conn struct {
	c    *cmConn
	once sync.Once
}

// QP returns the connection's queue pair.
func (cn *Conn) QP() *QP { return cn.c.qp }

// PrivateData returns the peer's private data: the REP's for the
// connecting side, the REQ's user data for the accepting side.
func (cn *Conn) PrivateData() []byte { return cn.c.peerData }

// RemoteAddr returns the peer's IP address and rdma_cm port (the
// listener's port, or the connecting side's source port).
func (cn *Conn) RemoteAddr() netip.AddrPort {
	if cn.c.active {
		return netip.AddrPortFrom(cn.c.peer, cn.c.sid.Port())
	}
	return netip.AddrPortFrom(cn.c.peer, cn.c.srcPort)
}

// LocalAddr returns the local IP address and rdma_cm port.
func (cn *Conn) LocalAddr() netip.AddrPort {
	if cn.c.active {
		return netip.AddrPortFrom(cn.c.m.e.local, cn.c.srcPort)
	}
	return netip.AddrPortFrom(cn.c.m.e.local, cn.c.sid.Port())
}

// Disconnect sends a DREQ (the QP goes to the error state, like
// rdma_disconnect) and waits until the peer answers with a DREP, the CM
// retries run out or ctx is done. A connection the peer disconnected
// first returns at once. It does not destroy the QP.
func (cn *Conn) Disconnect(ctx context.Context) error {
	c := cn.c
	m := c.m
	cn.once.Do(func() {
		m.mu.Lock()
		c.sendDREQ()
		m.mu.Unlock()
	})
	select {
	case <-c.closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done returns a channel closed when the connection has ended: the peer
// disconnected or rejected it, or our disconnection completed.
func (cn *Conn) Done() <-chan struct{} { return cn.c.closed }
