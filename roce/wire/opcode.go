package wire

import "strconv"

// OpCode is the BTH opcode. Its top three bits select the transport
// service ([Transport]) and its low five bits the operation.
type OpCode uint8

// Transport is the transport service of an opcode: the opcode's top three
// bits.
type Transport uint8

// Transport services.
const (
	TransportRC  Transport = 0x00 // reliable connection
	TransportUC  Transport = 0x20 // unreliable connection
	TransportRD  Transport = 0x40 // reliable datagram (not supported by this package)
	TransportUD  Transport = 0x60 // unreliable datagram
	TransportCNP Transport = 0x80 // congestion notification (RoCEv2)
	TransportXRC Transport = 0xa0 // extended reliable connection (not supported by this package)
)

// String returns the short name of the transport, such as "RC".
func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportUD:
		return "UD"
	case TransportCNP:
		return "CNP"
	case TransportXRC:
		return "XRC"
	}
	return "Transport(0x" + strconv.FormatUint(uint64(t), 16) + ")"
}

// Opcodes supported by this package. The operation codes are shared by
// the transports; each constant includes its transport bits.
const (
	OpRCSendFirst              OpCode = 0x00
	OpRCSendMiddle             OpCode = 0x01
	OpRCSendLast               OpCode = 0x02
	OpRCSendLastWithImmediate  OpCode = 0x03
	OpRCSendOnly               OpCode = 0x04
	OpRCSendOnlyWithImmediate  OpCode = 0x05
	OpRCWriteFirst             OpCode = 0x06
	OpRCWriteMiddle            OpCode = 0x07
	OpRCWriteLast              OpCode = 0x08
	OpRCWriteLastWithImmediate OpCode = 0x09
	OpRCWriteOnly              OpCode = 0x0a
	OpRCWriteOnlyWithImmediate OpCode = 0x0b
	OpRCReadRequest            OpCode = 0x0c
	OpRCReadResponseFirst      OpCode = 0x0d
	OpRCReadResponseMiddle     OpCode = 0x0e
	OpRCReadResponseLast       OpCode = 0x0f
	OpRCReadResponseOnly       OpCode = 0x10
	OpRCAcknowledge            OpCode = 0x11
	OpRCAtomicAcknowledge      OpCode = 0x12
	OpRCCompareSwap            OpCode = 0x13
	OpRCFetchAdd               OpCode = 0x14
	OpRCSendLastWithInvalidate OpCode = 0x16
	OpRCSendOnlyWithInvalidate OpCode = 0x17
	OpUCSendFirst              OpCode = 0x20
	OpUCSendMiddle             OpCode = 0x21
	OpUCSendLast               OpCode = 0x22
	OpUCSendLastWithImmediate  OpCode = 0x23
	OpUCSendOnly               OpCode = 0x24
	OpUCSendOnlyWithImmediate  OpCode = 0x25
	OpUCWriteFirst             OpCode = 0x26
	OpUCWriteMiddle            OpCode = 0x27
	OpUCWriteLast              OpCode = 0x28
	OpUCWriteLastWithImmediate OpCode = 0x29
	OpUCWriteOnly              OpCode = 0x2a
	OpUCWriteOnlyWithImmediate OpCode = 0x2b
	OpUDSendOnly               OpCode = 0x64
	OpUDSendOnlyWithImmediate  OpCode = 0x65
	OpCNP                      OpCode = 0x81
)

// ExtHeader names an extended transport header that can follow the BTH.
type ExtHeader uint8

// Extended transport headers.
const (
	ExtNone         ExtHeader = iota // no header; terminates an [ExtHeaders] list
	ExtRETH                          // RDMA extended transport header
	ExtAETH                          // ACK extended transport header
	ExtImmDt                         // immediate data
	ExtIETH                          // invalidate extended transport header
	ExtDETH                          // datagram extended transport header
	ExtAtomicETH                     // atomic extended transport header
	ExtAtomicAckETH                  // atomic acknowledge extended transport header
	numExt
)

var extSizes = [numExt]uint8{
	ExtRETH:         RETHSize,
	ExtAETH:         AETHSize,
	ExtImmDt:        ImmDtSize,
	ExtIETH:         IETHSize,
	ExtDETH:         DETHSize,
	ExtAtomicETH:    AtomicETHSize,
	ExtAtomicAckETH: AtomicAckETHSize,
}

var extNames = [numExt]string{
	ExtNone:         "none",
	ExtRETH:         "RETH",
	ExtAETH:         "AETH",
	ExtImmDt:        "ImmDt",
	ExtIETH:         "IETH",
	ExtDETH:         "DETH",
	ExtAtomicETH:    "AtomicETH",
	ExtAtomicAckETH: "AtomicAckETH",
}

// Size returns the length of the header in bytes, or 0 for ExtNone and
// unknown values.
func (e ExtHeader) Size() int {
	if e < numExt {
		return int(extSizes[e])
	}
	return 0
}

// String returns the header's name, such as "RETH".
func (e ExtHeader) String() string {
	if e < numExt {
		return extNames[e]
	}
	return "ExtHeader(" + strconv.Itoa(int(e)) + ")"
}

// MaxExtHeaders is the largest number of extended headers an opcode of this
// package carries, and the length of an [ExtHeaders] list.
const MaxExtHeaders = 2

// ExtHeaders lists the extended headers that follow the BTH, in wire
// order, padded with ExtNone.
type ExtHeaders [MaxExtHeaders]ExtHeader

// Len returns the number of headers in the list.
func (h ExtHeaders) Len() int {
	n := 0
	for _, e := range h {
		if e != ExtNone {
			n++
		}
	}
	return n
}

// opFlags are properties of an opcode.
type opFlags uint8

const (
	flagValid    opFlags = 1 << iota // supported by this package
	flagPayload                      // may carry a payload
	flagRequest                      // sent by the requester
	flagResponse                     // sent by the responder
	flagFirst                        // first (or only) packet of a message
	flagLast                         // last (or only) packet of a message
)

// opInfo is the table entry for one opcode.
type opInfo struct {
	name   string
	ext    ExtHeaders
	flags  opFlags
	hdrLen uint8         // BTH, extended headers and (CNP) reserved bytes
	off    [numExt]uint8 // offset of each extended header from the BTH; 0 if absent
}

// cnpReservedSize is the length of the reserved field that follows the BTH
// of a CNP.
const cnpReservedSize = 16

const (
	req   = flagValid | flagRequest
	resp  = flagValid | flagResponse
	first = flagFirst
	mid   = opFlags(0)
	last  = flagLast
	only  = flagFirst | flagLast
	pay   = flagPayload
)

// opTable describes every supported opcode. UC entries are filled in by
// init from the RC entries with the same operation.
var opTable = [256]opInfo{
	OpRCSendFirst:              {name: "SEND_FIRST", flags: req | pay | first},
	OpRCSendMiddle:             {name: "SEND_MIDDLE", flags: req | pay | mid},
	OpRCSendLast:               {name: "SEND_LAST", flags: req | pay | last},
	OpRCSendLastWithImmediate:  {name: "SEND_LAST_WITH_IMMEDIATE", flags: req | pay | last, ext: ExtHeaders{ExtImmDt}},
	OpRCSendOnly:               {name: "SEND_ONLY", flags: req | pay | only},
	OpRCSendOnlyWithImmediate:  {name: "SEND_ONLY_WITH_IMMEDIATE", flags: req | pay | only, ext: ExtHeaders{ExtImmDt}},
	OpRCWriteFirst:             {name: "RDMA_WRITE_FIRST", flags: req | pay | first, ext: ExtHeaders{ExtRETH}},
	OpRCWriteMiddle:            {name: "RDMA_WRITE_MIDDLE", flags: req | pay | mid},
	OpRCWriteLast:              {name: "RDMA_WRITE_LAST", flags: req | pay | last},
	OpRCWriteLastWithImmediate: {name: "RDMA_WRITE_LAST_WITH_IMMEDIATE", flags: req | pay | last, ext: ExtHeaders{ExtImmDt}},
	OpRCWriteOnly:              {name: "RDMA_WRITE_ONLY", flags: req | pay | only, ext: ExtHeaders{ExtRETH}},
	OpRCWriteOnlyWithImmediate: {name: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", flags: req | pay | only, ext: ExtHeaders{ExtRETH, ExtImmDt}},
	OpRCReadRequest:            {name: "RDMA_READ_REQUEST", flags: req | only, ext: ExtHeaders{ExtRETH}},
	OpRCReadResponseFirst:      {name: "RDMA_READ_RESPONSE_FIRST", flags: resp | pay | first, ext: ExtHeaders{ExtAETH}},
	OpRCReadResponseMiddle:     {name: "RDMA_READ_RESPONSE_MIDDLE", flags: resp | pay | mid},
	OpRCReadResponseLast:       {name: "RDMA_READ_RESPONSE_LAST", flags: resp | pay | last, ext: ExtHeaders{ExtAETH}},
	OpRCReadResponseOnly:       {name: "RDMA_READ_RESPONSE_ONLY", flags: resp | pay | only, ext: ExtHeaders{ExtAETH}},
	OpRCAcknowledge:            {name: "ACKNOWLEDGE", flags: resp | only, ext: ExtHeaders{ExtAETH}},
	OpRCAtomicAcknowledge:      {name: "ATOMIC_ACKNOWLEDGE", flags: resp | only, ext: ExtHeaders{ExtAETH, ExtAtomicAckETH}},
	OpRCCompareSwap:            {name: "COMPARE_SWAP", flags: req | only, ext: ExtHeaders{ExtAtomicETH}},
	OpRCFetchAdd:               {name: "FETCH_ADD", flags: req | only, ext: ExtHeaders{ExtAtomicETH}},
	OpRCSendLastWithInvalidate: {name: "SEND_LAST_WITH_INVALIDATE", flags: req | pay | last, ext: ExtHeaders{ExtIETH}},
	OpRCSendOnlyWithInvalidate: {name: "SEND_ONLY_WITH_INVALIDATE", flags: req | pay | only, ext: ExtHeaders{ExtIETH}},
	OpUDSendOnly:               {name: "SEND_ONLY", flags: req | pay | only, ext: ExtHeaders{ExtDETH}},
	OpUDSendOnlyWithImmediate:  {name: "SEND_ONLY_WITH_IMMEDIATE", flags: req | pay | only, ext: ExtHeaders{ExtDETH, ExtImmDt}},
	OpCNP:                      {name: "CNP", flags: flagValid | only},
}

func init() {
	// UC uses the RC send and RDMA write operations with the same headers.
	for op := OpRCSendFirst; op <= OpRCWriteOnlyWithImmediate; op++ {
		opTable[OpCode(TransportUC)|op] = opTable[op]
	}
	for i := range opTable {
		info := &opTable[i]
		if info.flags&flagValid == 0 {
			continue
		}
		t := Transport(i) & 0xe0
		if t == TransportCNP {
			info.name = "CNP"
		} else {
			info.name = t.String() + "_" + info.name
		}
		n := BTHSize
		for _, e := range info.ext {
			if e == ExtNone {
				break
			}
			info.off[e] = uint8(n)
			n += e.Size()
		}
		if OpCode(i) == OpCNP {
			n += cnpReservedSize
		}
		info.hdrLen = uint8(n)
	}
}

// Transport returns the transport service of the opcode.
func (op OpCode) Transport() Transport { return Transport(op) & 0xe0 }

// Valid reports whether the opcode is one this package can parse and
// build: the RC, UC and UD opcodes and CNP.
func (op OpCode) Valid() bool { return opTable[op].flags&flagValid != 0 }

// String returns the opcode's name, such as "RC_SEND_ONLY" or "CNP", or
// "OpCode(0xNN)" for opcodes this package does not support.
func (op OpCode) String() string {
	if info := &opTable[op]; info.flags&flagValid != 0 {
		return info.name
	}
	return "OpCode(0x" + strconv.FormatUint(uint64(op), 16) + ")"
}

// ExtHeaders returns the extended headers that follow the BTH of a packet
// with this opcode, in wire order. It returns an empty list for
// unsupported opcodes.
func (op OpCode) ExtHeaders() ExtHeaders { return opTable[op].ext }

// HeaderLen returns the length of the transport headers of a packet with
// this opcode: the BTH and the extended headers (for a CNP, also the 16
// reserved bytes that follow the BTH). The payload starts at this offset
// from the BTH. It returns 0 for unsupported opcodes.
func (op OpCode) HeaderLen() int { return int(opTable[op].hdrLen) }

// ExtOffset returns the offset of extended header e from the start of the
// BTH in a packet with this opcode, or -1 if the opcode does not carry e.
func (op OpCode) ExtOffset(e ExtHeader) int {
	if e >= numExt || e == ExtNone {
		return -1
	}
	if off := opTable[op].off[e]; off != 0 {
		return int(off)
	}
	return -1
}

// HasPayload reports whether packets with this opcode may carry a payload.
// Packets of other opcodes (RDMA read requests, acknowledgements, atomics,
// CNPs) must not, and have a pad count of zero.
func (op OpCode) HasPayload() bool { return opTable[op].flags&flagPayload != 0 }

// IsRequest reports whether the opcode is sent by a requester: sends, RDMA
// writes, RDMA read requests and atomics.
func (op OpCode) IsRequest() bool { return opTable[op].flags&flagRequest != 0 }

// IsResponse reports whether the opcode is sent by a responder: RDMA read
// responses and acknowledgements.
func (op OpCode) IsResponse() bool { return opTable[op].flags&flagResponse != 0 }

// IsFirst reports whether a packet with this opcode starts a message: the
// FIRST and ONLY opcodes and the single-packet operations.
func (op OpCode) IsFirst() bool {
	return opTable[op].flags&(flagValid|flagFirst) == flagValid|flagFirst
}

// IsLast reports whether a packet with this opcode ends a message: the
// LAST and ONLY opcodes and the single-packet operations.
func (op OpCode) IsLast() bool { return opTable[op].flags&(flagValid|flagLast) == flagValid|flagLast }
