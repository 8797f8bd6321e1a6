package cm

import (
	"encoding/binary"
	"net/netip"
)

// ServiceID is a CM service id: the "port" a REQ or SIDR_REQ is addressed
// to.
type ServiceID uint64

// PortSpace is an rdma_cm port space (enum rdma_ucm_port_space).
type PortSpace uint16

// rdma_cm port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: connected (RC) services
	PortSpaceUDP   PortSpace = 0x0111 // RDMA_PS_UDP: UD services, resolved through SIDR
	PortSpaceIB    PortSpace = 0x013f // RDMA_PS_IB: either, addressed by service id (AF_IB)
)

const (
	rdmaCMServiceIDMask = 0xffffffffff000000
	rdmaCMServiceIDBase = 0x0000000001000000
)

// RDMACMServiceID returns the service id of rdma_cm port port in port
// space ps: ps << 16 | port, which lies in the IBA range reserved for
// rdma_cm (0x0000000001xxxxxx).
func RDMACMServiceID(ps PortSpace, port uint16) ServiceID {
	return ServiceID(uint64(ps)<<16 | uint64(port))
}

// IsRDMACM reports whether s lies in the service id range of rdma_cm.
func (s ServiceID) IsRDMACM() bool { return s&rdmaCMServiceIDMask == rdmaCMServiceIDBase }

// PortSpace returns the rdma_cm port space of s (meaningful if IsRDMACM).
func (s ServiceID) PortSpace() PortSpace { return PortSpace(s >> 16) }

// Port returns the rdma_cm port of s (meaningful if IsRDMACM).
func (s ServiceID) Port() uint16 { return uint16(s) }

// CMAHeaderSize is the size of the rdma_cm header at the start of the
// private data of a REQ or SIDR_REQ (for the TCP, UDP and IPoIB port
// spaces; AF_IB connections carry none).
const CMAHeaderSize = 36

// CMAVersion is the only rdma_cm header version.
const CMAVersion = 0

// Byte offsets of the rdma_cm header.
const (
	cmaVersion   = 0
	cmaIPVersion = 1 // version in bits 7:4
	cmaPort      = 2
	cmaSrcAddr   = 4
	cmaDstAddr   = 20
)

// CMAHeader is the rdma_cm header (Linux struct cma_hdr, IBA annex A11):
//
//	byte 0      CMA version (0)
//	byte 1      IP version (4 or 6) in bits 7:4
//	bytes 2-3   source port (the connecting side's rdma_cm port)
//	bytes 4-19  source address
//	bytes 20-35 destination address
//
// An IPv4 address takes the last four bytes of its 16 (the first twelve
// are zero, not an IPv4-mapped prefix). The user's private data follows
// the header. The accessors require len(h) >= CMAHeaderSize.
type CMAHeader []byte

// IsValid reports whether h is long enough to hold the header.
func (h CMAHeader) IsValid() bool { return len(h) >= CMAHeaderSize }

// Check reports whether h is a valid header: long enough, version 0, IP
// version 4 or 6. The error is a *fabric.MalformedError.
func (h CMAHeader) Check() error {
	if !h.IsValid() || h.Version() != CMAVersion || (h.IPVersion() != 4 && h.IPVersion() != 6) {
		return malformed(ReasonCMAHeader)
	}
	return nil
}

// Version returns the CMA version.
func (h CMAHeader) Version() uint8 { return h[cmaVersion] }

// IPVersion returns the IP version, 4 or 6 in a valid header.
func (h CMAHeader) IPVersion() uint8 { return h[cmaIPVersion] >> 4 }

// Port returns the source port.
func (h CMAHeader) Port() uint16 { return binary.BigEndian.Uint16(h[cmaPort:]) }

// Src returns the source address and port.
func (h CMAHeader) Src() netip.AddrPort {
	return netip.AddrPortFrom(h.addr(cmaSrcAddr), h.Port())
}

// Dst returns the destination address; its port is the service id's.
func (h CMAHeader) Dst() netip.Addr { return h.addr(cmaDstAddr) }

func (h CMAHeader) addr(off int) netip.Addr {
	if h.IPVersion() == 4 {
		return netip.AddrFrom4([4]byte(h[off+12 : off+16]))
	}
	return netip.AddrFrom16([16]byte(h[off : off+16]))
}

// Set writes a header for a connection from src to dst. Both must be of
// the same family; an IPv4-mapped IPv6 address counts as IPv4.
func (h CMAHeader) Set(src netip.AddrPort, dst netip.Addr) {
	_ = h[CMAHeaderSize-1]
	h[cmaVersion] = CMAVersion
	v := uint8(6)
	if src.Addr().Unmap().Is4() {
		v = 4
	}
	h[cmaIPVersion] = v << 4
	binary.BigEndian.PutUint16(h[cmaPort:], src.Port())
	putCMAAddr(h[cmaSrcAddr:], src.Addr(), v)
	putCMAAddr(h[cmaDstAddr:], dst, v)
}

func putCMAAddr(b []byte, a netip.Addr, v uint8) {
	clear(b[:16])
	if v == 4 {
		a4 := a.Unmap().As4()
		copy(b[12:16], a4[:])
		return
	}
	a16 := a.As16()
	copy(b[:16], a16[:])
}

// Private-data room left to the user of rdma_cm after the header (REQ,
// SIDR_REQ) or in the whole message (the others), as librdmacm reports it.
const (
	UserREQPrivateDataSize     = REQPrivateDataSize - CMAHeaderSize     // rdma_connect, RC: 56
	UserSIDRReqPrivateDataSize = SIDRReqPrivateDataSize - CMAHeaderSize // rdma_connect, UD: 180
	UserREPPrivateDataSize     = REPPrivateDataSize                     // rdma_accept: 196
	UserREJPrivateDataSize     = REJPrivateDataSize                     // rdma_reject: 148
)
