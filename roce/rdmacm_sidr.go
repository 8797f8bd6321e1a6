package roce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/wire"
)

// UD services through SIDR (service id resolution, IBA 12.11), as rdma_cm
// does for its UDP port space: the client sends a SIDR_REQ for a port, the
// server answers with the QPN and Q_Key of a UD queue pair (SIDR_REP), and
// datagrams flow. There is no connection to tear down.

// RDMACMUDPQKey is the Q_Key rdma_cm gives UD queue pairs of its UDP port
// space.
const RDMACMUDPQKey = 0x01234567

// UDService is a resolved UD service: the QP the server named and our UD
// QP, connected to it (its sends go there; it receives from anyone with
// the Q_Key).
type UDService struct {
	qp        *QP
	remoteQPN uint32
	qkey      uint32
	peerData  []byte
}

// QP returns the UD queue pair that sends to the service.
func (s *UDService) QP() *QP { return s.qp }

// RemoteQPN returns the service's queue pair number.
func (s *UDService) RemoteQPN() uint32 { return s.remoteQPN }

// QKey returns the service's Q_Key.
func (s *UDService) QKey() uint32 { return s.qkey }

// PrivateData returns the SIDR_REP's private data.
func (s *UDService) PrivateData() []byte { return s.peerData }

// ResolveUD resolves the UD service at raddr (IP address and rdma_cm port
// of the UDP port space), like rdma_connect on a UD rdma_cm id: it sends
// SIDR_REQs until the SIDR_REP comes (cfg's ResponseTimeout and
// MaxRetries), then returns a UD QP of pd connected to the service. A
// refusal is a *cm.SIDRError (errors.Is(err, fabric.ErrRefused) when
// nobody listens); no answer is cm.ErrTimeout.
func (m *CM) ResolveUD(ctx context.Context, pd *PD, raddr netip.AddrPort, cfg *ConnConfig) (*UDService, error) {
	if cfg == nil {
		cfg = &ConnConfig{}
	}
	o := cfg.withDefaults()
	if len(o.PrivateData) > cm.UserSIDRReqPrivateDataSize {
		return nil, fmt.Errorf("roce: %d bytes of private data, at most %d fit a SIDR_REQ: %w", len(o.PrivateData), cm.UserSIDRReqPrivateDataSize, fabric.ErrInvalid)
	}
	dst := raddr.Addr().Unmap()
	var pb [6]byte
	rand.Read(pb[:])
	srcPort := 0x8000 | binary.LittleEndian.Uint16(pb[:])&0x7fff
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, os.ErrClosed
	}
	c := m.newConn(o)
	c.active, c.ud = true, true
	c.peer = dst
	c.srcPort = srcPort
	c.sid = cm.RDMACMServiceID(cm.PortSpaceUDP, raddr.Port())
	c.tid = uint64(binary.LittleEndian.Uint32(pb[2:]))<<32 | uint64(c.localID)
	mad := cm.MAD(c.last[:])
	mad.Init(cm.AttrSIDRReq, c.tid)
	req := cm.SIDRReq(mad.Data())
	req.SetRequestID(c.localID)
	req.SetPKey(wire.DefaultPKey)
	req.SetServiceID(c.sid)
	cm.CMAHeader(req.PrivateData()).Set(netip.AddrPortFrom(m.e.local, srcPort), dst)
	copy(req.PrivateData()[cm.CMAHeaderSize:], o.PrivateData)
	c.state = cmReqSent
	c.send(true)
	m.mu.Unlock()

	if err := m.await(ctx, c, cmReqSent, nil); err != nil {
		return nil, err
	}
	m.mu.Lock()
	s := &UDService{remoteQPN: c.remoteQPN, qkey: c.qkey, peerData: c.peerData}
	m.mu.Unlock()
	qcfg := o.QP
	qcfg.Type = UD
	qp, err := pd.CreateQP(qcfg)
	if err != nil {
		return nil, err
	}
	if err := qp.Connect(&QPAttr{PathMTU: o.MTU, Dest: dst, DestQPN: s.remoteQPN, QKey: s.qkey, SQPSN: 0}); err != nil {
		qp.Destroy()
		return nil, err
	}
	s.qp = qp
	return s, nil
}

// onSIDRRep handles the answer to our SIDR_REQ. The caller holds m.mu.
func (m *CM) onSIDRRep(rep cm.SIDRRep, src netip.Addr) bool {
	c := m.conns[rep.RequestID()]
	if c == nil || !c.ud || !c.active || c.peer != src || c.state != cmReqSent || rep.ServiceID() != c.sid {
		return false
	}
	c.peerData = append([]byte(nil), rep.PrivateData()...)
	if rep.Status() != cm.SIDRSuccess {
		c.fail(&cm.SIDRError{Status: rep.Status(), PrivateData: c.peerData})
		return true
	}
	c.remoteQPN, c.qkey = rep.QPN(), rep.QKey()
	c.established()
	c.finish() // nothing to tear down
	return true
}

// onSIDRReq handles service id resolution for our UD listeners. The
// caller holds m.mu.
func (m *CM) onSIDRReq(mad cm.MAD, req cm.SIDRReq, src netip.Addr) bool {
	if c := m.peers[peerKey{src, req.RequestID()}]; c != nil && c.ud {
		if c.state == cmTimewait { // our SIDR_REP was lost
			m.ctr.retx.Add(1)
			m.sendMAD(c.peer, c.last[:], false)
		}
		return true
	}
	sid := req.ServiceID()
	var lst *CMListener
	if sid.IsRDMACM() && sid.PortSpace() == cm.PortSpaceUDP {
		lst = m.udListeners[sid.Port()]
	}
	hdr := cm.CMAHeader(req.PrivateData())
	status := cm.SIDRSuccess
	switch {
	case lst == nil:
		status = cm.SIDRUnsupported
	case hdr.Check() != nil:
		m.ctr.drops.Add(hdr.Check())
		status = cm.SIDRReject
	}
	if status != cm.SIDRSuccess {
		var b [cm.MADSize]byte
		out := cm.MAD(b[:])
		out.Init(cm.AttrSIDRRep, mad.TID())
		r := cm.SIDRRep(out.Data())
		r.SetRequestID(req.RequestID())
		r.SetStatus(status)
		r.SetServiceID(sid)
		m.sendMAD(src, b[:], false)
		return true
	}
	c := m.newConn(lst.cfg)
	c.ud = true
	c.tid = mad.TID()
	c.peer = src
	c.remoteID = req.RequestID()
	c.sid = sid
	c.srcPort = hdr.Port()
	c.peerData = append([]byte(nil), req.PrivateData()[cm.CMAHeaderSize:]...)
	c.lst = lst
	c.state = cmReqRcvd
	m.peers[peerKey{src, c.remoteID}] = c
	if !lst.offer(&ConnRequest{c: c}) {
		c.sidrReply(cm.SIDRReject, 0, 0, nil)
		c.finish()
		return true
	}
	c.arm(cm.Timeout(c.cfg.ResponseTimeout) * 4)
	return true
}

// sidrReply sends the SIDR_REP of a UD request and keeps it for a
// retransmitted SIDR_REQ. The caller holds m.mu.
func (c *cmConn) sidrReply(status cm.SIDRStatus, qpn, qkey uint32, data []byte) {
	mad := cm.MAD(c.last[:])
	mad.Init(cm.AttrSIDRRep, c.tid)
	r := cm.SIDRRep(mad.Data())
	r.SetRequestID(c.remoteID)
	r.SetStatus(status)
	r.SetQPN(qpn)
	r.SetServiceID(c.sid)
	r.SetQKey(qkey)
	copy(r.PrivateData(), data)
	c.m.sendMAD(c.peer, c.last[:], false)
}

// ListenUD starts taking SIDR requests for rdma_cm port port of the UDP
// port space, like rdma_listen on a UD rdma_cm id.
func (m *CM) ListenUD(port uint16, backlog int, cfg *ConnConfig) (*CMListener, error) {
	return m.listen(port, backlog, cfg, true)
}

// AcceptUD answers a UD service request (from a CMListener of ListenUD)
// with the QPN and Q_Key of qp, a UD queue pair that takes the client's
// datagrams, and private data (at most cm.SIDRRepPrivateDataSize bytes).
func (r *ConnRequest) AcceptUD(qp *QP, qkey uint32, data []byte) error {
	c := r.c
	m := c.m
	if qp.Type() != UD || len(data) > cm.SIDRRepPrivateDataSize {
		return fmt.Errorf("roce: AcceptUD needs a UD QP and at most %d bytes of private data: %w", cm.SIDRRepPrivateDataSize, fabric.ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !c.ud || c.state != cmReqRcvd {
		return fmt.Errorf("roce: no UD service request pending: %w", fabric.ErrInvalid)
	}
	c.stopTimer()
	c.sidrReply(cm.SIDRSuccess, qp.QPN(), qkey, data)
	c.timewait() // answer retransmitted SIDR_REQs for a while, then forget
	return nil
}
