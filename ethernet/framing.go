package ethernet

// Framing: the link (and IP/UDP) headers around Weft's header in a
// frame of the endpoint's memory.

import (
	"encoding/binary"
)

func (e *Endpoint) frame(i uint32) []byte {
	a := uint64(i) * e.fsize
	return e.mem[a : a+e.fsize : a+e.fsize]
}

// writeL2 writes the link (and IP/UDP) headers for a Weft packet of n
// bytes (header included) and returns the frame length.
func (e *Endpoint) writeL2(b []byte, n int) int {
	if e.cfg.UDP {
		PutUDP4(b, &e.udpHdr, n)
		return UDP4HdrLen + n
	}
	copy(b[0:6], e.peerMAC[:])
	if !e.peerKnown {
		copy(b[0:6], broadcast[:])
	}
	copy(b[6:12], e.localMAC[:])
	binary.BigEndian.PutUint16(b[12:], e.cfg.EtherType)
	return EthHdrLen + n
}

var broadcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// parseL2 checks the link (and IP/UDP) headers of a received frame as its
// queue does (linkHeader), and that it comes from this endpoint's peer;
// it returns the offset of the Weft header, or -1.
func (e *Endpoint) parseL2(b []byte) int {
	off := linkHeader(b, e.localMAC, e.cfg.UDP, e.cfg.EtherType, e.cfg.LocalPort)
	if off < 0 {
		return -1
	}
	if e.peerKnown && [6]byte(b[6:12]) != e.peerMAC {
		return -1
	}
	if e.cfg.UDP {
		ip, u := b[EthHdrLen:], b[off-UDPHdrLen:]
		if [4]byte(ip[12:16]) != e.cfg.PeerIP.As4() || binary.BigEndian.Uint16(u[0:]) != e.cfg.PeerPort {
			return -1
		}
	}
	return off
}

// linkHeader checks the link (and IP/UDP) headers of a received frame
// against a queue's address and framing (raw EtherType, or UDP/IPv4 to
// lport) and returns the offset of the Weft header, or -1. The queue's
// demultiplexer and every endpoint read frames through it.
func linkHeader(b []byte, lmac [6]byte, udp bool, etype, lport uint16) int {
	if len(b) < EthHdrLen+hdrLen {
		return -1
	}
	if dst := [6]byte(b[0:6]); dst != lmac && dst != broadcast {
		return -1
	}
	et := binary.BigEndian.Uint16(b[12:])
	if !udp {
		if et != etype {
			return -1
		}
		return EthHdrLen
	}
	if et != EtherTypeIPv4 || len(b) < UDP4HdrLen+hdrLen {
		return -1
	}
	ip := b[EthHdrLen:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < IPv4HdrLen || ip[9] != 17 || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return -1
	}
	off := EthHdrLen + ihl
	if len(b) < off+UDPHdrLen+hdrLen || binary.BigEndian.Uint16(b[off+2:]) != lport {
		return -1
	}
	return off + UDPHdrLen
}
