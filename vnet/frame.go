package vnet

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// Frame encapsulation on the fabric. Every fabric message a Bridge sends
// is one frame:
//
//	[0, 2)  magic 'W' 'V'
//	[2]     version (1)
//	[3]     flags: FlagVnetHdr (a virtio-net header precedes the frame), FlagTUN (the frame is an IP packet, not Ethernet)
//	[4, 8)  length of what follows, big endian
//	[8, …)  [virtio-net header (10 bytes)] frame
//
// The length must equal the message length less HeaderLen, so a message
// cut short or padded is caught, not delivered.
const (
	// HeaderLen is the size of the frame header.
	HeaderLen = 8
	// Version is the encapsulation version this package speaks.
	Version = 1
	// VnetHdrLen is the size of the virtio-net header (struct
	// virtio_net_hdr, without num_buffers) that precedes a frame when
	// offloads are on.
	VnetHdrLen = 10
	// MaxFrame is the largest frame (Ethernet header and payload, or IP
	// packet) a Bridge carries: a 64 KiB MTU, or a TSO/GSO super-frame.
	MaxFrame = 65535 + 14 + 4
	// MaxMessage is the largest fabric message a Bridge sends.
	MaxMessage = HeaderLen + VnetHdrLen + MaxFrame

	magic0 = 'W'
	magic1 = 'V'
)

// Header flags.
const (
	// FlagVnetHdr: a virtio-net header precedes the frame.
	FlagVnetHdr uint8 = 1 << iota
	// FlagTUN: the frame is an IP packet (TUN), not an Ethernet frame.
	FlagTUN

	knownFlags = FlagVnetHdr | FlagTUN
)

// Header is a typed view of a frame header at the start of a fabric
// message, in the style of gVisor's tcpip/header: it aliases the bytes
// and decodes fields on access. Check IsValid before trusting fields.
type Header []byte

// Magic reports whether the header starts with the encapsulation magic.
func (h Header) Magic() bool { return h[0] == magic0 && h[1] == magic1 }

// Version returns the encapsulation version.
func (h Header) Version() uint8 { return h[2] }

// Flags returns the header flags.
func (h Header) Flags() uint8 { return h[3] }

// Length returns the length of what follows the header.
func (h Header) Length() int { return int(binary.BigEndian.Uint32(h[4:8])) }

// Encode writes a header for a payload of length n with flags.
func (h Header) Encode(flags uint8, n int) {
	h[0], h[1], h[2], h[3] = magic0, magic1, Version, flags
	binary.BigEndian.PutUint32(h[4:8], uint32(n))
}

// IsValid reports whether h is a complete, well-formed header for a
// message of msgLen bytes (h included): magic, version, known flags and a
// length that accounts for the message exactly.
func (h Header) IsValid(msgLen int) bool {
	return len(h) >= HeaderLen && h.Magic() && h.Version() == Version &&
		h.Flags()&^knownFlags == 0 && h.Length() == msgLen-HeaderLen
}

// Frame errors. Each wraps fabric.ErrMalformed, so errors.Is(err,
// fabric.ErrMalformed) holds for every frame the bridge drops as bad
// input; use errors.Is with these for the reason.
var (
	// ErrTruncated: the message is shorter than its header says, or
	// shorter than the smallest frame.
	ErrTruncated = fmt.Errorf("vnet: truncated frame: %w", fabric.ErrMalformed)
	// ErrOversized: the frame is larger than MaxFrame or the bridge's
	// limit.
	ErrOversized = fmt.Errorf("vnet: oversized frame: %w", fabric.ErrMalformed)
	// ErrBadHeader: bad magic, version, flags or length.
	ErrBadHeader = fmt.Errorf("vnet: bad frame header: %w", fabric.ErrMalformed)
	// ErrBadVnetHdr: a virtio-net header the kernel must not see
	// (unknown flags or GSO type, checksum or header offsets outside the
	// frame), or an offload this side has not enabled.
	ErrBadVnetHdr = fmt.Errorf("vnet: bad virtio-net header: %w", fabric.ErrMalformed)
	// ErrBadFrame: the frame itself is malformed (not an Ethernet frame,
	// or for TUN not an IPv4 or IPv6 packet).
	ErrBadFrame = fmt.Errorf("vnet: malformed frame: %w", fabric.ErrMalformed)
)

// virtio-net header fields (include/uapi/linux/virtio_net.h).
const (
	vnetFlagNeedsCsum = 1
	vnetFlagDataValid = 2

	gsoNone  = 0
	gsoTCPv4 = 1
	gsoUDP   = 3
	gsoTCPv6 = 4
	gsoUDPL4 = 5
	gsoECN   = 0x80
)

// VnetHdr is a typed view of a virtio-net header (little endian, as TAP
// uses it on little-endian hosts and as virtio 1.0 defines it).
type VnetHdr []byte

// Flags returns the header's flags (NEEDS_CSUM 1, DATA_VALID 2).
func (v VnetHdr) Flags() uint8 { return v[0] }

// GSOType returns the segmentation type (0: none).
func (v VnetHdr) GSOType() uint8 { return v[1] }

// HdrLen returns the length of the headers before the segmented payload.
func (v VnetHdr) HdrLen() int { return int(binary.LittleEndian.Uint16(v[2:])) }

// GSOSize returns the segment size.
func (v VnetHdr) GSOSize() int { return int(binary.LittleEndian.Uint16(v[4:])) }

// CsumStart returns where checksumming starts.
func (v VnetHdr) CsumStart() int { return int(binary.LittleEndian.Uint16(v[6:])) }

// CsumOffset returns where, after CsumStart, the checksum is stored.
func (v VnetHdr) CsumOffset() int { return int(binary.LittleEndian.Uint16(v[8:])) }

// NeedsOffload reports whether the header asks the receiver for work
// (a partial checksum or segmentation), which only a TAP with offloads
// can accept.
func (v VnetHdr) NeedsOffload() bool {
	return v.Flags()&vnetFlagNeedsCsum != 0 || v.GSOType() != gsoNone
}

// IsValid reports whether the header is one the kernel may be given for a
// frame of frameLen bytes: known flags and GSO type, a checksum offset
// whose two bytes lie inside the frame, and a header length inside it.
func (v VnetHdr) IsValid(frameLen int) bool {
	if len(v) < VnetHdrLen || v.Flags()&^(vnetFlagNeedsCsum|vnetFlagDataValid) != 0 {
		return false
	}
	switch v.GSOType() &^ gsoECN {
	case gsoNone:
		if v.GSOType()&gsoECN != 0 {
			return false
		}
	case gsoTCPv4, gsoTCPv6, gsoUDP, gsoUDPL4:
		// Segmentation needs a segment size and a partial checksum.
		if v.GSOSize() == 0 || v.Flags()&vnetFlagNeedsCsum == 0 {
			return false
		}
	default:
		return false
	}
	if v.Flags()&vnetFlagNeedsCsum != 0 && v.CsumStart()+v.CsumOffset()+2 > frameLen {
		return false
	}
	return v.HdrLen() <= frameLen
}

// Kind is what a Bridge's device carries.
type Kind uint8

// Device kinds.
const (
	// TAP carries Ethernet frames (the default).
	TAP Kind = iota
	// TUN carries IP packets.
	TUN
)

// String returns "tap" or "tun".
func (k Kind) String() string {
	if k == TUN {
		return "tun"
	}
	return "tap"
}

// Parse validates a message of the encapsulation as a receiver must
// before anything reaches the kernel: the header, the virtio-net header if
// there is one, and the frame's minimal shape for kind, with maxFrame as
// the largest frame accepted. It returns the header flags, the virtio-net
// header (nil if none) and the frame. Errors wrap fabric.ErrMalformed
// and one of ErrTruncated, ErrOversized, ErrBadHeader, ErrBadVnetHdr,
// ErrBadFrame. It does not allocate.
func Parse(msg []byte, kind Kind, maxFrame int) (flags uint8, vh VnetHdr, frame []byte, err error) {
	if len(msg) < HeaderLen {
		return 0, nil, nil, ErrTruncated
	}
	h := Header(msg[:HeaderLen])
	if !h.Magic() || h.Version() != Version || h.Flags()&^knownFlags != 0 {
		return 0, nil, nil, ErrBadHeader
	}
	switch n := h.Length(); {
	case n > len(msg)-HeaderLen:
		return 0, nil, nil, ErrTruncated
	case n < len(msg)-HeaderLen:
		return 0, nil, nil, ErrBadHeader
	}
	flags = h.Flags()
	if (flags&FlagTUN != 0) != (kind == TUN) {
		return 0, nil, nil, ErrBadFrame
	}
	rest := msg[HeaderLen:]
	if flags&FlagVnetHdr != 0 {
		if len(rest) < VnetHdrLen {
			return 0, nil, nil, ErrTruncated
		}
		vh, rest = VnetHdr(rest[:VnetHdrLen]), rest[VnetHdrLen:]
	}
	if maxFrame <= 0 || maxFrame > MaxFrame {
		maxFrame = MaxFrame
	}
	if len(rest) > maxFrame {
		return 0, nil, nil, ErrOversized
	}
	if vh != nil && !vh.IsValid(len(rest)) {
		return 0, nil, nil, ErrBadVnetHdr
	}
	if kind == TUN {
		if len(rest) < 20 {
			return 0, nil, nil, ErrTruncated
		}
		switch rest[0] >> 4 {
		case 4:
		case 6:
			if len(rest) < 40 {
				return 0, nil, nil, ErrTruncated
			}
		default:
			return 0, nil, nil, ErrBadFrame
		}
	} else if len(rest) < 14 {
		return 0, nil, nil, ErrTruncated
	}
	return flags, vh, rest, nil
}

// dropReason maps a Parse error to the counter it is dropped under.
func dropReason(err error) fabric.DropReason {
	switch {
	case errors.Is(err, ErrTruncated):
		return fabric.DropTruncated
	default:
		return fabric.DropMalformed
	}
}
