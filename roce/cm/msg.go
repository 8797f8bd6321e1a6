package cm

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// Private-data capacities of the messages (IBA table 99).
const (
	REQPrivateDataSize     = 92
	MRAPrivateDataSize     = 222
	REJPrivateDataSize     = 148
	REPPrivateDataSize     = 196
	RTUPrivateDataSize     = 224
	DREQPrivateDataSize    = 220
	DREPPrivateDataSize    = 224
	SIDRReqPrivateDataSize = 216
	SIDRRepPrivateDataSize = 136

	// ARISize is the capacity of a REJ's additional reject information
	// and of a SIDR_REP's additional information.
	ARISize = 72
)

// TransportType is the transport service type of a REQ.
type TransportType uint8

// Transport service types.
const (
	TransportRC TransportType = 0
	TransportUC TransportType = 1
	TransportRD TransportType = 2
)

// MTU is an IBA path MTU code, as in a REQ.
type MTU uint8

// Path MTU codes.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid code.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUOf returns the largest MTU code not above n bytes (at least MTU256).
func MTUOf(n int) MTU {
	m := MTU4096
	for m > MTU256 && m.Bytes() > n {
		m--
	}
	return m
}

// Timeout converts a 5-bit IBA time exponent (CM response timeouts, local
// ACK timeouts, service timeouts) to a duration: 4.096 µs × 2^t.
func Timeout(t uint8) time.Duration {
	return time.Duration(4096<<(t&31)) * time.Nanosecond
}

// MsgKind says which message a REJ or MRA refers to.
type MsgKind uint8

// Message kinds of REJ's "message rejected" and MRA's "message MRAed".
const (
	MsgREQ   MsgKind = 0
	MsgREP   MsgKind = 1
	MsgOther MsgKind = 2 // REJ: other; MRA: LAP
)

// checkMessage validates the fields of message attr that have a limited
// range. The caller has checked len(b) == DataSize.
func checkMessage(attr AttrID, b []byte) error {
	ok := true
	switch attr {
	case AttrREQ:
		r := REQ(b)
		ok = r.PathMTU().Bytes() != 0 && r.TransportType() <= TransportRD
	case AttrMRA:
		ok = MRA(b).MessageMRAed() <= MsgOther
	case AttrREJ:
		r := REJ(b)
		ok = r.MessageRejected() <= MsgOther && int(r.ARILength()) <= ARISize
	case AttrSIDRRep:
		ok = int(SIDRRep(b).AddInfoLength()) <= ARISize
	}
	if !ok {
		return malformed(ReasonField)
	}
	return nil
}

func gidAt(b []byte) netip.Addr { return netip.AddrFrom16([16]byte(b[:16])) }

func putGID(b []byte, a netip.Addr) {
	g := a.As16() // IPv4 becomes ::ffff:a.b.c.d, the RoCEv2 GID of an IPv4 address
	copy(b[:16], g[:])
}

// Byte offsets of REQ fields (IBA table 106), relative to the message.
const (
	reqLocalCommID = 0
	reqServiceID   = 8
	reqLocalCAGUID = 16
	reqLocalQKey   = 28
	reqLocalQPN    = 32 // QPN(24) | ResponderResources(8)
	reqLocalEECN   = 36 // EECN(24) | InitiatorDepth(8)
	reqRemoteEECN  = 40 // EECN(24) | RemoteCMResponseTimeout(5) TransportType(2) E2EFlowControl(1)
	reqStartPSN    = 44 // PSN(24) | LocalCMResponseTimeout(5) RetryCount(3)
	reqPKey        = 48
	reqByte50      = 50 // PathMTU(4) RDCExists(1) RNRRetryCount(3)
	reqByte51      = 51 // MaxCMRetries(4) SRQ(1) ExtendedTransportType(3)
	reqPrimary     = 52 // primary path, 44 bytes
	reqAlternate   = 96 // alternate path, 44 bytes
	reqPrivateData = 140
)

// REQ is a connection request (IBA 12.6.5, table 106), the message after
// the MAD header. The accessors require len(r) >= DataSize (IsValid).
type REQ []byte

// IsValid reports whether r is long enough to be a REQ.
func (r REQ) IsValid() bool { return len(r) >= DataSize }

// LocalCommID returns the sender's communication id.
func (r REQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[reqLocalCommID:]) }

// SetLocalCommID sets the sender's communication id.
func (r REQ) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(r[reqLocalCommID:], v) }

// ServiceID returns the service id the request is for.
func (r REQ) ServiceID() ServiceID { return ServiceID(binary.BigEndian.Uint64(r[reqServiceID:])) }

// SetServiceID sets the service id.
func (r REQ) SetServiceID(v ServiceID) { binary.BigEndian.PutUint64(r[reqServiceID:], uint64(v)) }

// LocalCAGUID returns the sender's channel adapter GUID.
func (r REQ) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(r[reqLocalCAGUID:]) }

// SetLocalCAGUID sets the sender's channel adapter GUID.
func (r REQ) SetLocalCAGUID(v uint64) { binary.BigEndian.PutUint64(r[reqLocalCAGUID:], v) }

// LocalQKey returns the sender's Q_Key (meaningful for RD only).
func (r REQ) LocalQKey() uint32 { return binary.BigEndian.Uint32(r[reqLocalQKey:]) }

// SetLocalQKey sets the sender's Q_Key.
func (r REQ) SetLocalQKey(v uint32) { binary.BigEndian.PutUint32(r[reqLocalQKey:], v) }

// LocalQPN returns the sender's queue pair number.
func (r REQ) LocalQPN() uint32 { return get24(r[reqLocalQPN:]) }

// SetLocalQPN sets the sender's queue pair number (24 bits).
func (r REQ) SetLocalQPN(v uint32) { put24(r[reqLocalQPN:], v) }

// ResponderResources returns the number of RDMA READs and atomics the
// sender accepts outstanding as responder.
func (r REQ) ResponderResources() uint8 { return r[reqLocalQPN+3] }

// SetResponderResources sets the responder resources.
func (r REQ) SetResponderResources(v uint8) { r[reqLocalQPN+3] = v }

// LocalEECN returns the sender's EE context number (RD only).
func (r REQ) LocalEECN() uint32 { return get24(r[reqLocalEECN:]) }

// InitiatorDepth returns the number of RDMA READs and atomics the sender
// will have outstanding as requester.
func (r REQ) InitiatorDepth() uint8 { return r[reqLocalEECN+3] }

// SetInitiatorDepth sets the initiator depth.
func (r REQ) SetInitiatorDepth(v uint8) { r[reqLocalEECN+3] = v }

// RemoteEECN returns the EE context number at the receiver (RD only).
func (r REQ) RemoteEECN() uint32 { return get24(r[reqRemoteEECN:]) }

// RemoteCMResponseTimeout returns the time exponent (see Timeout) within
// which the receiver should answer this REQ.
func (r REQ) RemoteCMResponseTimeout() uint8 { return r[reqRemoteEECN+3] >> 3 }

// SetRemoteCMResponseTimeout sets the remote CM response timeout (5 bits).
func (r REQ) SetRemoteCMResponseTimeout(v uint8) { setBits(&r[reqRemoteEECN+3], 0xf8, 3, v) }

// TransportType returns the transport service type.
func (r REQ) TransportType() TransportType { return TransportType(r[reqRemoteEECN+3] >> 1 & 3) }

// SetTransportType sets the transport service type.
func (r REQ) SetTransportType(v TransportType) { setBits(&r[reqRemoteEECN+3], 0x06, 1, uint8(v)) }

// EndToEndFlowControl returns the end-to-end flow control bit.
func (r REQ) EndToEndFlowControl() bool { return r[reqRemoteEECN+3]&1 != 0 }

// SetEndToEndFlowControl sets the end-to-end flow control bit.
func (r REQ) SetEndToEndFlowControl(v bool) { setFlag(&r[reqRemoteEECN+3], 1, v) }

// StartingPSN returns the starting PSN. Linux (and so every rdma_cm peer
// this package was tested against) treats it as the PSN the REQ's sender
// expects to receive first: the receiver of the REQ sends from it, and the
// sender sends from the REP's (see testdata/README.md).
func (r REQ) StartingPSN() uint32 { return get24(r[reqStartPSN:]) }

// SetStartingPSN sets the starting PSN (24 bits).
func (r REQ) SetStartingPSN(v uint32) { put24(r[reqStartPSN:], v) }

// LocalCMResponseTimeout returns the time exponent within which the
// sender answers CM messages of this connection.
func (r REQ) LocalCMResponseTimeout() uint8 { return r[reqStartPSN+3] >> 3 }

// SetLocalCMResponseTimeout sets the local CM response timeout (5 bits).
func (r REQ) SetLocalCMResponseTimeout(v uint8) { setBits(&r[reqStartPSN+3], 0xf8, 3, v) }

// RetryCount returns the transport retry count the receiver should use.
func (r REQ) RetryCount() uint8 { return r[reqStartPSN+3] & 7 }

// SetRetryCount sets the retry count (3 bits).
func (r REQ) SetRetryCount(v uint8) { setBits(&r[reqStartPSN+3], 0x07, 0, v) }

// PKey returns the partition key.
func (r REQ) PKey() uint16 { return binary.BigEndian.Uint16(r[reqPKey:]) }

// SetPKey sets the partition key.
func (r REQ) SetPKey(v uint16) { binary.BigEndian.PutUint16(r[reqPKey:], v) }

// PathMTU returns the path MTU code.
func (r REQ) PathMTU() MTU { return MTU(r[reqByte50] >> 4) }

// SetPathMTU sets the path MTU code.
func (r REQ) SetPathMTU(v MTU) { setBits(&r[reqByte50], 0xf0, 4, uint8(v)) }

// RDCExists returns the RDC-exists bit (RD only).
func (r REQ) RDCExists() bool { return r[reqByte50]&0x08 != 0 }

// RNRRetryCount returns the RNR retry count the receiver should use.
func (r REQ) RNRRetryCount() uint8 { return r[reqByte50] & 7 }

// SetRNRRetryCount sets the RNR retry count (3 bits).
func (r REQ) SetRNRRetryCount(v uint8) { setBits(&r[reqByte50], 0x07, 0, v) }

// MaxCMRetries returns how many times the sender retries a CM message.
func (r REQ) MaxCMRetries() uint8 { return r[reqByte51] >> 4 }

// SetMaxCMRetries sets the maximum CM retries (4 bits).
func (r REQ) SetMaxCMRetries(v uint8) { setBits(&r[reqByte51], 0xf0, 4, v) }

// SRQ returns whether the sender's QP uses a shared receive queue.
func (r REQ) SRQ() bool { return r[reqByte51]&0x08 != 0 }

// SetSRQ sets the SRQ bit.
func (r REQ) SetSRQ(v bool) { setFlag(&r[reqByte51], 0x08, v) }

// ExtendedTransportType returns the extended transport type (XRC: 1).
func (r REQ) ExtendedTransportType() uint8 { return r[reqByte51] & 7 }

// Primary returns the primary path.
func (r REQ) Primary() Path { return Path(r[reqPrimary : reqPrimary+PathSize]) }

// Alternate returns the alternate path (all zero when there is none).
func (r REQ) Alternate() Path { return Path(r[reqAlternate : reqAlternate+PathSize]) }

// PrivateData returns the private data (REQPrivateDataSize bytes).
func (r REQ) PrivateData() []byte { return r[reqPrivateData:DataSize:DataSize] }

// PathSize is the size of a path description in a REQ.
const PathSize = 44

// Path is a path description in a REQ (primary or alternate): the sender
// is "local", the receiver "remote". On RoCE the GIDs are the IP
// addresses (IPv4-mapped for IPv4) and the LIDs carry no meaning.
type Path []byte

// LocalLID returns the sender's port LID.
func (p Path) LocalLID() uint16 { return binary.BigEndian.Uint16(p[0:]) }

// SetLocalLID sets the sender's port LID.
func (p Path) SetLocalLID(v uint16) { binary.BigEndian.PutUint16(p[0:], v) }

// RemoteLID returns the receiver's port LID.
func (p Path) RemoteLID() uint16 { return binary.BigEndian.Uint16(p[2:]) }

// SetRemoteLID sets the receiver's port LID.
func (p Path) SetRemoteLID(v uint16) { binary.BigEndian.PutUint16(p[2:], v) }

// LocalGID returns the sender's port GID.
func (p Path) LocalGID() netip.Addr { return gidAt(p[4:]) }

// SetLocalGID sets the sender's port GID (an IPv4 address is stored
// IPv4-mapped).
func (p Path) SetLocalGID(a netip.Addr) { putGID(p[4:], a) }

// RemoteGID returns the receiver's port GID.
func (p Path) RemoteGID() netip.Addr { return gidAt(p[20:]) }

// SetRemoteGID sets the receiver's port GID.
func (p Path) SetRemoteGID(a netip.Addr) { putGID(p[20:], a) }

// FlowLabel returns the flow label (20 bits).
func (p Path) FlowLabel() uint32 { return binary.BigEndian.Uint32(p[36:]) >> 12 }

// SetFlowLabel sets the flow label (20 bits), keeping the packet rate.
func (p Path) SetFlowLabel(v uint32) {
	w := binary.BigEndian.Uint32(p[36:])
	binary.BigEndian.PutUint32(p[36:], w&0x3f|(v&0xfffff)<<12)
}

// PacketRate returns the packet (static) rate code.
func (p Path) PacketRate() uint8 { return p[39] & 0x3f }

// SetPacketRate sets the packet rate code (6 bits).
func (p Path) SetPacketRate(v uint8) { setBits(&p[39], 0x3f, 0, v) }

// TrafficClass returns the traffic class (the IP DSCP/ECN byte on RoCEv2).
func (p Path) TrafficClass() uint8 { return p[40] }

// SetTrafficClass sets the traffic class.
func (p Path) SetTrafficClass(v uint8) { p[40] = v }

// HopLimit returns the hop limit (the IP TTL on RoCEv2).
func (p Path) HopLimit() uint8 { return p[41] }

// SetHopLimit sets the hop limit.
func (p Path) SetHopLimit(v uint8) { p[41] = v }

// SL returns the service level.
func (p Path) SL() uint8 { return p[42] >> 4 }

// SetSL sets the service level (4 bits).
func (p Path) SetSL(v uint8) { setBits(&p[42], 0xf0, 4, v) }

// SubnetLocal returns the subnet-local bit.
func (p Path) SubnetLocal() bool { return p[42]&0x08 != 0 }

// SetSubnetLocal sets the subnet-local bit.
func (p Path) SetSubnetLocal(v bool) { setFlag(&p[42], 0x08, v) }

// LocalACKTimeout returns the transport ACK timeout exponent (see
// Timeout) the receiver should use.
func (p Path) LocalACKTimeout() uint8 { return p[43] >> 3 }

// SetLocalACKTimeout sets the local ACK timeout (5 bits).
func (p Path) SetLocalACKTimeout(v uint8) { setBits(&p[43], 0xf8, 3, v) }

// MRA acknowledges a REQ, REP or LAP that will take longer than the
// sender's timeout to answer (IBA table 107).
type MRA []byte

// IsValid reports whether m is long enough to be an MRA.
func (m MRA) IsValid() bool { return len(m) >= DataSize }

// LocalCommID returns the sender's communication id.
func (m MRA) LocalCommID() uint32 { return binary.BigEndian.Uint32(m[0:]) }

// SetLocalCommID sets the sender's communication id.
func (m MRA) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(m[0:], v) }

// RemoteCommID returns the receiver's communication id.
func (m MRA) RemoteCommID() uint32 { return binary.BigEndian.Uint32(m[4:]) }

// SetRemoteCommID sets the receiver's communication id.
func (m MRA) SetRemoteCommID(v uint32) { binary.BigEndian.PutUint32(m[4:], v) }

// MessageMRAed returns which message is acknowledged.
func (m MRA) MessageMRAed() MsgKind { return MsgKind(m[8] >> 6) }

// SetMessageMRAed sets which message is acknowledged.
func (m MRA) SetMessageMRAed(v MsgKind) { setBits(&m[8], 0xc0, 6, uint8(v)) }

// ServiceTimeout returns the time exponent the sender needs to answer.
func (m MRA) ServiceTimeout() uint8 { return m[9] >> 3 }

// SetServiceTimeout sets the service timeout (5 bits).
func (m MRA) SetServiceTimeout(v uint8) { setBits(&m[9], 0xf8, 3, v) }

// PrivateData returns the private data.
func (m MRA) PrivateData() []byte { return m[10:DataSize:DataSize] }

// REJ rejects a REQ or REP, or a connection in general (IBA table 108).
type REJ []byte

// IsValid reports whether r is long enough to be a REJ.
func (r REJ) IsValid() bool { return len(r) >= DataSize }

// LocalCommID returns the sender's communication id (0 if it has none).
func (r REJ) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[0:]) }

// SetLocalCommID sets the sender's communication id.
func (r REJ) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(r[0:], v) }

// RemoteCommID returns the receiver's communication id.
func (r REJ) RemoteCommID() uint32 { return binary.BigEndian.Uint32(r[4:]) }

// SetRemoteCommID sets the receiver's communication id.
func (r REJ) SetRemoteCommID(v uint32) { binary.BigEndian.PutUint32(r[4:], v) }

// MessageRejected returns which message is rejected.
func (r REJ) MessageRejected() MsgKind { return MsgKind(r[8] >> 6) }

// SetMessageRejected sets which message is rejected.
func (r REJ) SetMessageRejected(v MsgKind) { setBits(&r[8], 0xc0, 6, uint8(v)) }

// ARILength returns the length of the additional reject information.
func (r REJ) ARILength() uint8 { return r[9] >> 1 }

// Reason returns the reject reason.
func (r REJ) Reason() RejectReason { return RejectReason(binary.BigEndian.Uint16(r[10:])) }

// SetReason sets the reject reason.
func (r REJ) SetReason(v RejectReason) { binary.BigEndian.PutUint16(r[10:], uint16(v)) }

// ARI returns the additional reject information (ARILength bytes, at most
// ARISize).
func (r REJ) ARI() []byte { return r[12 : 12+min(int(r.ARILength()), ARISize)] }

// SetARI copies ari (at most ARISize bytes) into the message and sets its
// length; it returns the number of bytes copied.
func (r REJ) SetARI(ari []byte) int {
	n := copy(r[12:12+ARISize], ari)
	clear(r[12+n : 12+ARISize])
	setBits(&r[9], 0xfe, 1, uint8(n))
	return n
}

// PrivateData returns the private data.
func (r REJ) PrivateData() []byte { return r[84:DataSize:DataSize] }

// REP accepts a REQ (IBA table 110).
type REP []byte

// IsValid reports whether r is long enough to be a REP.
func (r REP) IsValid() bool { return len(r) >= DataSize }

// LocalCommID returns the sender's communication id.
func (r REP) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[0:]) }

// SetLocalCommID sets the sender's communication id.
func (r REP) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(r[0:], v) }

// RemoteCommID returns the receiver's communication id (the REQ's local
// one).
func (r REP) RemoteCommID() uint32 { return binary.BigEndian.Uint32(r[4:]) }

// SetRemoteCommID sets the receiver's communication id.
func (r REP) SetRemoteCommID(v uint32) { binary.BigEndian.PutUint32(r[4:], v) }

// LocalQKey returns the sender's Q_Key.
func (r REP) LocalQKey() uint32 { return binary.BigEndian.Uint32(r[8:]) }

// SetLocalQKey sets the sender's Q_Key.
func (r REP) SetLocalQKey(v uint32) { binary.BigEndian.PutUint32(r[8:], v) }

// LocalQPN returns the sender's queue pair number.
func (r REP) LocalQPN() uint32 { return get24(r[12:]) }

// SetLocalQPN sets the sender's queue pair number (24 bits).
func (r REP) SetLocalQPN(v uint32) { put24(r[12:], v) }

// LocalEECN returns the sender's EE context number (RD only).
func (r REP) LocalEECN() uint32 { return get24(r[16:]) }

// StartingPSN returns the starting PSN: the PSN the REP's sender expects
// to receive first, which the REQ's sender sends from (see REQ.StartingPSN).
func (r REP) StartingPSN() uint32 { return get24(r[20:]) }

// SetStartingPSN sets the starting PSN (24 bits).
func (r REP) SetStartingPSN(v uint32) { put24(r[20:], v) }

// ResponderResources returns the sender's responder resources.
func (r REP) ResponderResources() uint8 { return r[24] }

// SetResponderResources sets the responder resources.
func (r REP) SetResponderResources(v uint8) { r[24] = v }

// InitiatorDepth returns the sender's initiator depth.
func (r REP) InitiatorDepth() uint8 { return r[25] }

// SetInitiatorDepth sets the initiator depth.
func (r REP) SetInitiatorDepth(v uint8) { r[25] = v }

// TargetACKDelay returns the sender's ACK delay exponent.
func (r REP) TargetACKDelay() uint8 { return r[26] >> 3 }

// SetTargetACKDelay sets the target ACK delay (5 bits).
func (r REP) SetTargetACKDelay(v uint8) { setBits(&r[26], 0xf8, 3, v) }

// FailoverAccepted returns the failover-accepted code (0: accepted).
func (r REP) FailoverAccepted() uint8 { return r[26] >> 1 & 3 }

// SetFailoverAccepted sets the failover-accepted code (2 bits).
func (r REP) SetFailoverAccepted(v uint8) { setBits(&r[26], 0x06, 1, v) }

// EndToEndFlowControl returns the end-to-end flow control bit.
func (r REP) EndToEndFlowControl() bool { return r[26]&1 != 0 }

// SetEndToEndFlowControl sets the end-to-end flow control bit.
func (r REP) SetEndToEndFlowControl(v bool) { setFlag(&r[26], 1, v) }

// RNRRetryCount returns the RNR retry count the receiver should use.
func (r REP) RNRRetryCount() uint8 { return r[27] >> 5 }

// SetRNRRetryCount sets the RNR retry count (3 bits).
func (r REP) SetRNRRetryCount(v uint8) { setBits(&r[27], 0xe0, 5, v) }

// SRQ returns whether the sender's QP uses a shared receive queue.
func (r REP) SRQ() bool { return r[27]&0x10 != 0 }

// SetSRQ sets the SRQ bit.
func (r REP) SetSRQ(v bool) { setFlag(&r[27], 0x10, v) }

// LocalCAGUID returns the sender's channel adapter GUID.
func (r REP) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(r[28:]) }

// SetLocalCAGUID sets the sender's channel adapter GUID.
func (r REP) SetLocalCAGUID(v uint64) { binary.BigEndian.PutUint64(r[28:], v) }

// PrivateData returns the private data.
func (r REP) PrivateData() []byte { return r[36:DataSize:DataSize] }

// RTU ("ready to use") completes the three-way handshake (IBA table 111).
type RTU []byte

// IsValid reports whether r is long enough to be an RTU.
func (r RTU) IsValid() bool { return len(r) >= DataSize }

// LocalCommID returns the sender's communication id.
func (r RTU) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[0:]) }

// SetLocalCommID sets the sender's communication id.
func (r RTU) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(r[0:], v) }

// RemoteCommID returns the receiver's communication id.
func (r RTU) RemoteCommID() uint32 { return binary.BigEndian.Uint32(r[4:]) }

// SetRemoteCommID sets the receiver's communication id.
func (r RTU) SetRemoteCommID(v uint32) { binary.BigEndian.PutUint32(r[4:], v) }

// PrivateData returns the private data.
func (r RTU) PrivateData() []byte { return r[8:DataSize:DataSize] }

// DREQ requests a disconnection (IBA table 112).
type DREQ []byte

// IsValid reports whether d is long enough to be a DREQ.
func (d DREQ) IsValid() bool { return len(d) >= DataSize }

// LocalCommID returns the sender's communication id.
func (d DREQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(d[0:]) }

// SetLocalCommID sets the sender's communication id.
func (d DREQ) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(d[0:], v) }

// RemoteCommID returns the receiver's communication id.
func (d DREQ) RemoteCommID() uint32 { return binary.BigEndian.Uint32(d[4:]) }

// SetRemoteCommID sets the receiver's communication id.
func (d DREQ) SetRemoteCommID(v uint32) { binary.BigEndian.PutUint32(d[4:], v) }

// RemoteQPN returns the receiver's queue pair number.
func (d DREQ) RemoteQPN() uint32 { return get24(d[8:]) }

// SetRemoteQPN sets the receiver's queue pair number (24 bits).
func (d DREQ) SetRemoteQPN(v uint32) { put24(d[8:], v) }

// PrivateData returns the private data.
func (d DREQ) PrivateData() []byte { return d[12:DataSize:DataSize] }

// DREP answers a DREQ (IBA table 113).
type DREP []byte

// IsValid reports whether d is long enough to be a DREP.
func (d DREP) IsValid() bool { return len(d) >= DataSize }

// LocalCommID returns the sender's communication id.
func (d DREP) LocalCommID() uint32 { return binary.BigEndian.Uint32(d[0:]) }

// SetLocalCommID sets the sender's communication id.
func (d DREP) SetLocalCommID(v uint32) { binary.BigEndian.PutUint32(d[0:], v) }

// RemoteCommID returns the receiver's communication id.
func (d DREP) RemoteCommID() uint32 { return binary.BigEndian.Uint32(d[4:]) }

// SetRemoteCommID sets the receiver's communication id.
func (d DREP) SetRemoteCommID(v uint32) { binary.BigEndian.PutUint32(d[4:], v) }

// PrivateData returns the private data.
func (d DREP) PrivateData() []byte { return d[8:DataSize:DataSize] }

// SIDRReq asks for the QPN and Q_Key of a UD service (IBA table 119).
type SIDRReq []byte

// IsValid reports whether s is long enough to be a SIDR_REQ.
func (s SIDRReq) IsValid() bool { return len(s) >= DataSize }

// RequestID returns the request id, echoed in the SIDR_REP.
func (s SIDRReq) RequestID() uint32 { return binary.BigEndian.Uint32(s[0:]) }

// SetRequestID sets the request id.
func (s SIDRReq) SetRequestID(v uint32) { binary.BigEndian.PutUint32(s[0:], v) }

// PKey returns the partition key.
func (s SIDRReq) PKey() uint16 { return binary.BigEndian.Uint16(s[4:]) }

// SetPKey sets the partition key.
func (s SIDRReq) SetPKey(v uint16) { binary.BigEndian.PutUint16(s[4:], v) }

// ServiceID returns the service id asked for.
func (s SIDRReq) ServiceID() ServiceID { return ServiceID(binary.BigEndian.Uint64(s[8:])) }

// SetServiceID sets the service id.
func (s SIDRReq) SetServiceID(v ServiceID) { binary.BigEndian.PutUint64(s[8:], uint64(v)) }

// PrivateData returns the private data.
func (s SIDRReq) PrivateData() []byte { return s[16:DataSize:DataSize] }

// SIDRStatus is the status of a SIDR_REP (IBA table 121).
type SIDRStatus uint8

// SIDR_REP statuses.
const (
	SIDRSuccess            SIDRStatus = 0 // the QPN and Q_Key are valid
	SIDRUnsupported        SIDRStatus = 1 // service id not supported (nobody listens)
	SIDRReject             SIDRStatus = 2 // rejected by the service provider
	SIDRNoQP               SIDRStatus = 3 // no QP available
	SIDRRedirect           SIDRStatus = 4 // request redirected (ClassPortInfo in the additional information)
	SIDRUnsupportedVersion SIDRStatus = 5 // class version not supported
)

// SIDRRep answers a SIDR_REQ (IBA table 120).
type SIDRRep []byte

// IsValid reports whether s is long enough to be a SIDR_REP.
func (s SIDRRep) IsValid() bool { return len(s) >= DataSize }

// RequestID returns the request id of the SIDR_REQ answered.
func (s SIDRRep) RequestID() uint32 { return binary.BigEndian.Uint32(s[0:]) }

// SetRequestID sets the request id.
func (s SIDRRep) SetRequestID(v uint32) { binary.BigEndian.PutUint32(s[0:], v) }

// Status returns the status.
func (s SIDRRep) Status() SIDRStatus { return SIDRStatus(s[4]) }

// SetStatus sets the status.
func (s SIDRRep) SetStatus(v SIDRStatus) { s[4] = uint8(v) }

// AddInfoLength returns the length of the additional information.
func (s SIDRRep) AddInfoLength() uint8 { return s[5] }

// QPN returns the service's queue pair number.
func (s SIDRRep) QPN() uint32 { return get24(s[8:]) }

// SetQPN sets the queue pair number (24 bits).
func (s SIDRRep) SetQPN(v uint32) { put24(s[8:], v) }

// ServiceID returns the service id.
func (s SIDRRep) ServiceID() ServiceID { return ServiceID(binary.BigEndian.Uint64(s[12:])) }

// SetServiceID sets the service id.
func (s SIDRRep) SetServiceID(v ServiceID) { binary.BigEndian.PutUint64(s[12:], uint64(v)) }

// QKey returns the service's Q_Key.
func (s SIDRRep) QKey() uint32 { return binary.BigEndian.Uint32(s[20:]) }

// SetQKey sets the Q_Key.
func (s SIDRRep) SetQKey(v uint32) { binary.BigEndian.PutUint32(s[20:], v) }

// AddInfo returns the additional information (AddInfoLength bytes, at
// most ARISize).
func (s SIDRRep) AddInfo() []byte { return s[24 : 24+min(int(s.AddInfoLength()), ARISize)] }

// PrivateData returns the private data.
func (s SIDRRep) PrivateData() []byte { return s[96:DataSize:DataSize] }
