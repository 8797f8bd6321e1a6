package cm

import "encoding/binary"

// Sizes and well-known values of the MAD layer.
const (
	// MADSize is the size of every management datagram: a UD SEND to the
	// GSI carries exactly this many bytes.
	MADSize = 256

	// HeaderSize is the size of the common MAD header.
	HeaderSize = 24

	// DataSize is the size of a CM message: the MAD after its header.
	DataSize = MADSize - HeaderSize

	// GSIQPN is the queue pair number of the General Services Interface,
	// to which every CM MAD is sent and from which it is sent.
	GSIQPN = 1

	// GSIQKey is the Q_Key of the GSI queue pair (IBA 13.5.3.1).
	GSIQKey = 0x80010000

	// BaseVersion is the MAD base version of the format.
	BaseVersion = 1

	// ClassCM is the management class of Communication Management.
	ClassCM = 0x07

	// ClassVersion is the CM class version (IBA 1.2 and later) that Linux
	// sends and requires.
	ClassVersion = 2
)

// Method is a MAD method.
type Method uint8

// MAD methods used by the CM class. Bit 7 marks a response.
const (
	MethodGet     Method = 0x01
	MethodSet     Method = 0x02
	MethodSend    Method = 0x03 // every CM message is a Send
	MethodGetResp Method = 0x81
)

// AttrID is a MAD attribute id; for the CM class it names the message.
type AttrID uint16

// CM attribute ids (IBA table 101).
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRReq       AttrID = 0x0017
	AttrSIDRRep       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001a
)

var attrNames = [...]string{
	AttrClassPortInfo: "ClassPortInfo",
	AttrREQ:           "REQ",
	AttrMRA:           "MRA",
	AttrREJ:           "REJ",
	AttrREP:           "REP",
	AttrRTU:           "RTU",
	AttrDREQ:          "DREQ",
	AttrDREP:          "DREP",
	AttrSIDRReq:       "SIDR_REQ",
	AttrSIDRRep:       "SIDR_REP",
	AttrLAP:           "LAP",
	AttrAPR:           "APR",
}

// String returns the message name, such as "REQ".
func (a AttrID) String() string {
	if int(a) < len(attrNames) && attrNames[a] != "" {
		return attrNames[a]
	}
	return "attribute " + hex16(uint16(a))
}

// Supported reports whether a is one of the messages this package parses:
// REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP. (LAP and APR,
// for alternate paths, are not supported.)
func (a AttrID) Supported() bool { return a >= AttrREQ && a <= AttrSIDRRep }

// Byte offsets of the common MAD header.
const (
	madBaseVersion  = 0
	madMgmtClass    = 1
	madClassVersion = 2
	madMethod       = 3
	madStatus       = 4
	madClassSpec    = 6
	madTID          = 8
	madAttrID       = 16
	madResv         = 18
	madAttrMod      = 20
)

// MAD is a management datagram: the 24-byte common header followed by the
// message.
//
//	byte 0      BaseVersion
//	byte 1      MgmtClass
//	byte 2      ClassVersion
//	byte 3      R | Method(7)
//	bytes 4-5   Status
//	bytes 6-7   ClassSpecific
//	bytes 8-15  TransactionID
//	bytes 16-17 AttributeID
//	bytes 18-19 reserved
//	bytes 20-23 AttributeModifier
//
// The accessors require len(m) >= HeaderSize; Data requires MADSize.
type MAD []byte

// IsValid reports whether m is long enough to hold a whole MAD.
func (m MAD) IsValid() bool { return len(m) >= MADSize }

// BaseVersion returns the MAD base version.
func (m MAD) BaseVersion() uint8 { return m[madBaseVersion] }

// MgmtClass returns the management class.
func (m MAD) MgmtClass() uint8 { return m[madMgmtClass] }

// ClassVersion returns the class version.
func (m MAD) ClassVersion() uint8 { return m[madClassVersion] }

// Method returns the method, including the response bit.
func (m MAD) Method() Method { return Method(m[madMethod]) }

// Status returns the status field.
func (m MAD) Status() uint16 { return binary.BigEndian.Uint16(m[madStatus:]) }

// ClassSpecific returns the class-specific field.
func (m MAD) ClassSpecific() uint16 { return binary.BigEndian.Uint16(m[madClassSpec:]) }

// TID returns the transaction id.
func (m MAD) TID() uint64 { return binary.BigEndian.Uint64(m[madTID:]) }

// AttrID returns the attribute id.
func (m MAD) AttrID() AttrID { return AttrID(binary.BigEndian.Uint16(m[madAttrID:])) }

// AttrMod returns the attribute modifier.
func (m MAD) AttrMod() uint32 { return binary.BigEndian.Uint32(m[madAttrMod:]) }

// Data returns the message after the header (DataSize bytes).
func (m MAD) Data() []byte { return m[HeaderSize:MADSize:MADSize] }

// SetTID sets the transaction id.
func (m MAD) SetTID(v uint64) { binary.BigEndian.PutUint64(m[madTID:], v) }

// SetStatus sets the status field.
func (m MAD) SetStatus(v uint16) { binary.BigEndian.PutUint16(m[madStatus:], v) }

// SetAttrMod sets the attribute modifier.
func (m MAD) SetAttrMod(v uint32) { binary.BigEndian.PutUint32(m[madAttrMod:], v) }

// Init writes the header of a CM message — base version 1, class CM,
// class version 2, method Send, status 0, the attribute and transaction
// id, modifier 0 — and zeroes the message, so that reserved fields and
// unused private data go out as zeros. It requires len(m) >= MADSize.
func (m MAD) Init(attr AttrID, tid uint64) {
	_ = m[MADSize-1]
	clear(m[:MADSize])
	m[madBaseVersion] = BaseVersion
	m[madMgmtClass] = ClassCM
	m[madClassVersion] = ClassVersion
	m[madMethod] = uint8(MethodSend)
	binary.BigEndian.PutUint64(m[madTID:], tid)
	binary.BigEndian.PutUint16(m[madAttrID:], uint16(attr))
}

// ParseMAD validates a received CM datagram and returns it as a MAD. b
// must be exactly MADSize bytes (the payload of a UD SEND to the GSI) with
// base version 1, class CM, class version 2, method Send and a supported
// attribute; the error is a *fabric.MalformedError (matching
// fabric.ErrMalformed) otherwise. Message fields are checked by the message views'
// Check methods, which ParseMAD calls for the attribute. It does not
// allocate.
func ParseMAD(b []byte) (MAD, error) {
	if len(b) != MADSize {
		return nil, malformed(ReasonSize)
	}
	m := MAD(b)
	switch {
	case m.BaseVersion() != BaseVersion:
		return nil, malformed(ReasonBaseVersion)
	case m.MgmtClass() != ClassCM:
		return nil, malformed(ReasonClass)
	case m.ClassVersion() != ClassVersion:
		return nil, malformed(ReasonClassVersion)
	case m.Method() != MethodSend:
		return nil, malformed(ReasonMethod)
	case !m.AttrID().Supported():
		return nil, malformed(ReasonAttribute)
	}
	if err := checkMessage(m.AttrID(), m.Data()); err != nil {
		return nil, err
	}
	return m, nil
}

func hex16(v uint16) string {
	const digits = "0123456789abcdef"
	return string([]byte{'0', 'x', digits[v>>12], digits[v>>8&15], digits[v>>4&15], digits[v&15]})
}

// get24 reads the 24 most significant bits of the big-endian word at b.
func get24(b []byte) uint32 {
	_ = b[2]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

// put24 writes v's low 24 bits as the 24 most significant bits of the
// word at b, keeping b[3].
func put24(b []byte, v uint32) {
	_ = b[2]
	b[0] = uint8(v >> 16)
	b[1] = uint8(v >> 8)
	b[2] = uint8(v)
}

// setBits replaces the bits of *p selected by mask with v shifted by shift.
func setBits(p *byte, mask, shift uint8, v uint8) {
	*p = *p&^mask | v<<shift&mask
}

func setFlag(p *byte, mask uint8, v bool) {
	if v {
		*p |= mask
	} else {
		*p &^= mask
	}
}
