package wire

import "encoding/binary"

// Sizes and well-known values of the format.
const (
	// UDPPort is the IANA-assigned UDP destination port of RoCEv2.
	UDPPort = 4791

	// BTHSize is the length of the base transport header.
	BTHSize = 12

	// ICRCSize is the length of the invariant CRC that ends every packet.
	ICRCSize = 4

	// DefaultPKey is the default partition key (full membership of the
	// default partition).
	DefaultPKey = 0xffff

	// MaxQPN is the largest queue pair number: QPNs are 24 bits.
	MaxQPN = 1<<24 - 1
)

// Byte offsets of BTH fields.
const (
	bthOpCode = 0
	bthFlags  = 1 // SE(7) M(6) PadCnt(5:4) TVer(3:0)
	bthPKey   = 2
	bthResv8a = 4 // FECN(7) BECN(6) reserved(5:0)
	bthDestQP = 5
	bthAPSN   = 8 // AckReq(7 of byte 8) reserved(6:0) PSN(24)
)

// BTH is the base transport header, the first 12 bytes of every RoCEv2
// UDP payload:
//
//	byte 0     OpCode
//	byte 1     SE | MigReq | PadCnt(2) | TVer(4)
//	bytes 2-3  P_Key
//	byte 4     FECN | BECN | reserved(6)   (the "Resv8a" byte)
//	bytes 5-7  DestQP
//	byte 8     AckReq | reserved(7)
//	bytes 9-11 PSN
//
// The accessors require len(b) >= BTHSize (see IsValid).
type BTH []byte

// IsValid reports whether b is long enough to hold a BTH.
func (b BTH) IsValid() bool { return len(b) >= BTHSize }

// OpCode returns the opcode.
func (b BTH) OpCode() OpCode { return OpCode(b[bthOpCode]) }

// SetOpCode sets the opcode.
func (b BTH) SetOpCode(op OpCode) { b[bthOpCode] = uint8(op) }

// SolicitedEvent returns the SE bit: the responder should raise a
// completion event for this message.
func (b BTH) SolicitedEvent() bool { return b[bthFlags]&0x80 != 0 }

// SetSolicitedEvent sets the SE bit.
func (b BTH) SetSolicitedEvent(v bool) { setBit(&b[bthFlags], 0x80, v) }

// MigReq returns the MigReq bit, used for automatic path migration.
func (b BTH) MigReq() bool { return b[bthFlags]&0x40 != 0 }

// SetMigReq sets the MigReq bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[bthFlags], 0x40, v) }

// PadCount returns the number of pad bytes (0-3) between the payload and
// the ICRC.
func (b BTH) PadCount() int { return int(b[bthFlags]>>4) & 3 }

// SetPadCount sets the pad count. Only the low two bits of n are used.
func (b BTH) SetPadCount(n int) { b[bthFlags] = b[bthFlags]&^0x30 | uint8(n&3)<<4 }

// TVer returns the transport header version. It is 0 in every packet of
// the current format.
func (b BTH) TVer() uint8 { return b[bthFlags] & 0x0f }

// SetTVer sets the transport header version. Only the low four bits of v
// are used.
func (b BTH) SetTVer(v uint8) { b[bthFlags] = b[bthFlags]&^0x0f | v&0x0f }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// SetPKey sets the partition key.
func (b BTH) SetPKey(v uint16) { binary.BigEndian.PutUint16(b[bthPKey:], v) }

// FECN returns the forward explicit congestion notification bit. RoCEv2
// signals congestion with IP ECN and CNPs instead; the bit is normally 0.
func (b BTH) FECN() bool { return b[bthResv8a]&0x80 != 0 }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[bthResv8a], 0x80, v) }

// BECN returns the backward explicit congestion notification bit. It is
// set in a CNP.
func (b BTH) BECN() bool { return b[bthResv8a]&0x40 != 0 }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[bthResv8a], 0x40, v) }

// DestQP returns the destination queue pair number (24 bits).
func (b BTH) DestQP() uint32 { return get24(b[bthDestQP:]) }

// SetDestQP sets the destination queue pair number. Only the low 24 bits
// of qpn are used.
func (b BTH) SetDestQP(qpn uint32) { put24(b[bthDestQP:], qpn) }

// AckReq returns the AckReq bit: the requester asks the responder to
// acknowledge this packet.
func (b BTH) AckReq() bool { return b[bthAPSN]&0x80 != 0 }

// SetAckReq sets the AckReq bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[bthAPSN], 0x80, v) }

// PSN returns the packet sequence number (24 bits).
func (b BTH) PSN() PSN { return PSN(get24(b[bthAPSN+1:])) }

// SetPSN sets the packet sequence number. Only the low 24 bits are used.
func (b BTH) SetPSN(p PSN) { put24(b[bthAPSN+1:], uint32(p)) }

// BTHFields holds the fields of a BTH, for [BTH.Encode].
type BTHFields struct {
	OpCode         OpCode
	SolicitedEvent bool
	MigReq         bool
	PadCount       int // 0-3
	TVer           uint8
	PKey           uint16
	FECN           bool
	BECN           bool
	DestQP         uint32 // 24 bits
	AckReq         bool
	PSN            PSN
}

// Encode writes all the fields of a BTH, zeroing the reserved bits.
func (b BTH) Encode(f *BTHFields) {
	_ = b[BTHSize-1]
	b[bthOpCode] = uint8(f.OpCode)
	flags := uint8(f.PadCount&3)<<4 | f.TVer&0x0f
	if f.SolicitedEvent {
		flags |= 0x80
	}
	if f.MigReq {
		flags |= 0x40
	}
	b[bthFlags] = flags
	binary.BigEndian.PutUint16(b[bthPKey:], f.PKey)
	var r uint8
	if f.FECN {
		r |= 0x80
	}
	if f.BECN {
		r |= 0x40
	}
	b[bthResv8a] = r
	put24(b[bthDestQP:], f.DestQP)
	var a uint8
	if f.AckReq {
		a = 0x80
	}
	b[bthAPSN] = a
	put24(b[bthAPSN+1:], uint32(f.PSN))
}

// Fields returns the fields of the BTH.
func (b BTH) Fields() BTHFields {
	return BTHFields{
		OpCode:         b.OpCode(),
		SolicitedEvent: b.SolicitedEvent(),
		MigReq:         b.MigReq(),
		PadCount:       b.PadCount(),
		TVer:           b.TVer(),
		PKey:           b.PKey(),
		FECN:           b.FECN(),
		BECN:           b.BECN(),
		DestQP:         b.DestQP(),
		AckReq:         b.AckReq(),
		PSN:            b.PSN(),
	}
}

func setBit(p *uint8, mask uint8, v bool) {
	if v {
		*p |= mask
	} else {
		*p &^= mask
	}
}

func put24(b []byte, v uint32) {
	_ = b[2]
	b[0] = uint8(v >> 16)
	b[1] = uint8(v >> 8)
	b[2] = uint8(v)
}

func get24(b []byte) uint32 {
	_ = b[2]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}
