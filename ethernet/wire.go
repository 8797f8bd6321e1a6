package ethernet

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Frame layout constants.
const (
	// EthHdrLen is the length of an Ethernet header without VLAN tag.
	EthHdrLen = 14
	// IPv4HdrLen is the length of an IPv4 header without options.
	IPv4HdrLen = 20
	// UDPHdrLen is the length of a UDP header.
	UDPHdrLen = 8
	// UDP4HdrLen is the length of Ethernet + IPv4 + UDP headers.
	UDP4HdrLen = EthHdrLen + IPv4HdrLen + UDPHdrLen
	// EtherTypeWeft is the EtherType of Weft's raw-Ethernet framing,
	// 0x88B5 ("local experimental EtherType 1", IEEE 802).
	EtherTypeWeft = 0x88B5
	// EtherTypeIPv4 and EtherTypeIPv6 are the IP EtherTypes.
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86DD
)

// PutEthernet writes an Ethernet header into b[:14].
func PutEthernet(b []byte, dst, src net.HardwareAddr, etherType uint16) {
	_ = b[13]
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
}

// UDP4 describes the addressing of a UDP/IPv4 frame for PutUDP4.
type UDP4 struct {
	SrcMAC, DstMAC   net.HardwareAddr
	SrcIP, DstIP     netip.Addr
	SrcPort, DstPort uint16
	// TTL (0: 64).
	TTL uint8
}

// PutUDP4 writes Ethernet, IPv4 and UDP headers for a payload of n
// bytes into b[:UDP4HdrLen] and returns UDP4HdrLen. The IPv4 header
// checksum is computed; the UDP checksum is left zero (allowed over
// IPv4). It does not allocate.
func PutUDP4(b []byte, h *UDP4, n int) int {
	_ = b[UDP4HdrLen-1]
	PutEthernet(b, h.DstMAC, h.SrcMAC, EtherTypeIPv4)
	ip := b[EthHdrLen : EthHdrLen+IPv4HdrLen]
	ttl := h.TTL
	if ttl == 0 {
		ttl = 64
	}
	ip[0] = 0x45
	ip[1] = 0
	binary.BigEndian.PutUint16(ip[2:], uint16(IPv4HdrLen+UDPHdrLen+n))
	binary.BigEndian.PutUint16(ip[4:], 0)      // id
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = ttl
	ip[9] = 17
	ip[10], ip[11] = 0, 0
	s4, d4 := h.SrcIP.As4(), h.DstIP.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	u := b[EthHdrLen+IPv4HdrLen : UDP4HdrLen]
	binary.BigEndian.PutUint16(u[0:], h.SrcPort)
	binary.BigEndian.PutUint16(u[2:], h.DstPort)
	binary.BigEndian.PutUint16(u[4:], uint16(UDPHdrLen+n))
	u[6], u[7] = 0, 0
	return UDP4HdrLen
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// ParseUDP4 parses an Ethernet/IPv4/UDP frame and returns the UDP
// payload, the IPv4 header's offset-adjusted addressing and ok=false for
// anything else (fragments, bad lengths, bad header checksum). It does
// not allocate.
func ParseUDP4(f []byte, h *UDP4) (payload []byte, ok bool) {
	if len(f) < UDP4HdrLen || binary.BigEndian.Uint16(f[12:]) != EtherTypeIPv4 {
		return nil, false
	}
	ip := f[EthHdrLen:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < IPv4HdrLen || len(ip) < ihl+UDPHdrLen || ip[9] != 17 {
		return nil, false
	}
	if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 || ipChecksum(ip[:ihl]) != 0 {
		return nil, false
	}
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if tot < ihl+UDPHdrLen || tot > len(ip) {
		return nil, false
	}
	u := ip[ihl:tot]
	ul := int(binary.BigEndian.Uint16(u[4:]))
	if ul < UDPHdrLen || ul > len(u) {
		return nil, false
	}
	if h != nil {
		h.DstMAC, h.SrcMAC = net.HardwareAddr(f[0:6]), net.HardwareAddr(f[6:12])
		h.SrcIP = netip.AddrFrom4([4]byte(ip[12:16]))
		h.DstIP = netip.AddrFrom4([4]byte(ip[16:20]))
		h.SrcPort = binary.BigEndian.Uint16(u[0:])
		h.DstPort = binary.BigEndian.Uint16(u[2:])
		h.TTL = ip[8]
	}
	return u[UDPHdrLen:ul], true
}
