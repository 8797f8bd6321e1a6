package wire

import "encoding/binary"

// Packet is a parsed RoCEv2 packet: views into the UDP payload it was
// parsed from. Extended headers the opcode does not carry are nil.
type Packet struct {
	BTH          BTH
	RETH         RETH
	AETH         AETH
	ImmDt        ImmDt
	IETH         IETH
	DETH         DETH
	AtomicETH    AtomicETH
	AtomicAckETH AtomicAckETH

	// Payload is the payload, without the pad bytes.
	Payload []byte

	// ICRC is the invariant CRC the packet carries (read little-endian).
	// Parse does not check it: that needs the IP header (see VerifyICRC).
	ICRC uint32
}

// OpCode returns the packet's opcode.
func (p *Packet) OpCode() OpCode { return p.BTH.OpCode() }

// Parse parses a RoCEv2 UDP payload: b starts with the BTH and ends with
// the ICRC. It must be exactly the UDP payload (as the UDP length gives
// it), without any Ethernet padding that follows.
//
// Parse checks that the opcode is supported and its transport header
// version 0, that the packet holds the extended headers of its opcode and
// the ICRC, that its length is a multiple of four, and that the pad count
// fits the payload (opcodes without payload must have neither payload nor
// pad). On success the Packet's fields are sub-slices of b. On failure
// the error is a *fabric.MalformedError that matches fabric.ErrMalformed.
//
// Parse does not allocate.
func Parse(b []byte) (Packet, error) { return parse(b, b) }

// MaxHeaderLen is the longest HeaderLen of any opcode (the BTH and an
// AtomicETH).
const MaxHeaderLen = BTHSize + AtomicETHSize

// ParseShared is Parse for a UDP payload b in memory that another party
// may write while it is read (a shared-memory ring): it copies b's first
// MaxHeaderLen bytes into hdr, which the caller owns, and parses the
// headers there, so that each header field and the bounds of the payload
// are read once, and a later change to b changes nothing in the Packet but
// the bytes of Payload and the ICRC (read once too). The Packet's headers
// are sub-slices of hdr, its Payload of b.
//
// ParseShared does not allocate.
func ParseShared(b []byte, hdr *[MaxHeaderLen]byte) (Packet, error) {
	k := copy(hdr[:], b)
	return parse(b, hdr[:k])
}

// parse parses b, reading its headers from h: b itself, or a copy of its
// first bytes (at least min(len(b), MaxHeaderLen) of them).
func parse(b, h []byte) (Packet, error) {
	var p Packet
	if len(b) < BTHSize+ICRCSize {
		return p, malformed(ReasonShort)
	}
	if len(b)&3 != 0 {
		return p, malformed(ReasonUnaligned)
	}
	bth := BTH(h[:BTHSize])
	info := &opTable[bth.OpCode()]
	if info.flags&flagValid == 0 {
		return p, malformed(ReasonOpCode)
	}
	if bth.TVer() != 0 {
		return p, malformed(ReasonTVer)
	}
	hl := int(info.hdrLen)
	end := len(b) - ICRCSize
	if end < hl {
		return p, malformed(ReasonHeaders)
	}
	pad := bth.PadCount()
	body := b[hl:end]
	if info.flags&flagPayload == 0 {
		if len(body) != 0 {
			return p, malformed(ReasonPayload)
		}
		if pad != 0 {
			return p, malformed(ReasonPad)
		}
	} else if pad > len(body) {
		return p, malformed(ReasonPad)
	}
	p.BTH = bth
	for _, e := range info.ext {
		if e == ExtNone {
			break
		}
		off := int(info.off[e])
		x := h[off : off+int(extSizes[e])]
		switch e {
		case ExtRETH:
			p.RETH = RETH(x)
		case ExtAETH:
			p.AETH = AETH(x)
		case ExtImmDt:
			p.ImmDt = ImmDt(x)
		case ExtIETH:
			p.IETH = IETH(x)
		case ExtDETH:
			p.DETH = DETH(x)
		case ExtAtomicETH:
			p.AtomicETH = AtomicETH(x)
		case ExtAtomicAckETH:
			p.AtomicAckETH = AtomicAckETH(x)
		}
	}
	p.Payload = body[:len(body)-pad]
	p.ICRC = binary.LittleEndian.Uint32(b[end:])
	return p, nil
}

// PacketLen returns the length of the UDP payload of a packet with opcode
// op and a payload of payloadLen bytes: headers, payload, pad and ICRC. It
// returns 0 for unsupported opcodes.
func PacketLen(op OpCode, payloadLen int) int {
	hl := op.HeaderLen()
	if hl == 0 {
		return 0
	}
	return hl + payloadLen + PadLen(payloadLen) + ICRCSize
}

// PadLen returns the number of pad bytes that follow a payload of n bytes:
// the payload is padded to a multiple of four.
func PadLen(n int) int { return -n & 3 }

// Fields holds the header fields of a packet, for [Build]. Only the
// extended headers of the opcode in BTH.OpCode are written; the others are
// ignored.
type Fields struct {
	// BTH is the base transport header. Build computes the pad count from
	// the payload length and ignores BTH.PadCount.
	BTH BTHFields

	RETH       RETHFields      // RDMA writes (FIRST, ONLY) and read requests
	Syndrome   Syndrome        // AETH: acknowledgements, read responses
	MSN        uint32          // AETH: message sequence number
	Imm        uint32          // ImmDt: WITH_IMMEDIATE opcodes
	InvRKey    uint32          // IETH: WITH_INVALIDATE opcodes
	QKey       uint32          // DETH: UD
	SrcQP      uint32          // DETH: UD
	Atomic     AtomicETHFields // AtomicETH: COMPARE_SWAP, FETCH_ADD
	AtomicOrig uint64          // AtomicAckETH: original remote data
}

// Build writes a RoCEv2 UDP payload into b: the BTH and the extended
// headers of f.BTH.OpCode, a copy of payload, the pad bytes (zero) and a
// zero ICRC, to be filled in by [PutICRC] once the IP and UDP headers are
// in front of it. A CNP's 16 reserved bytes are zeroed. It returns the
// number of bytes written, [PacketLen](op, len(payload)).
//
// To write only the headers, for example in front of a payload that is
// already in place, use [BuildHeaders].
//
// Build does not allocate. It returns ErrShortBuffer if b is too small,
// and an error matching fabric.ErrInvalid for an unsupported opcode or a
// payload on an opcode without payload.
func Build(b []byte, f *Fields, payload []byte) (int, error) {
	op := f.BTH.OpCode
	n := PacketLen(op, len(payload))
	if n == 0 {
		return 0, errBuildOpCode
	}
	if len(b) < n {
		return 0, ErrShortBuffer
	}
	hl, err := BuildHeaders(b, f, len(payload))
	if err != nil {
		return 0, err
	}
	copy(b[hl:], payload)
	clear(b[hl+len(payload) : n])
	return n, nil
}

// BuildHeaders writes the BTH and the extended headers of f.BTH.OpCode
// into b, with the pad count for a payload of payloadLen bytes, and
// returns the header length ([OpCode.HeaderLen]). The payload, pad and
// ICRC that follow are left to the caller. It does not allocate.
func BuildHeaders(b []byte, f *Fields, payloadLen int) (int, error) {
	op := f.BTH.OpCode
	info := &opTable[op]
	if info.flags&flagValid == 0 {
		return 0, errBuildOpCode
	}
	if payloadLen != 0 && info.flags&flagPayload == 0 {
		return 0, errBuildPayload
	}
	hl := int(info.hdrLen)
	if len(b) < hl {
		return 0, ErrShortBuffer
	}
	bf := f.BTH
	bf.PadCount = PadLen(payloadLen)
	BTH(b).Encode(&bf)
	for _, e := range info.ext {
		if e == ExtNone {
			break
		}
		h := b[info.off[e]:]
		switch e {
		case ExtRETH:
			RETH(h).Encode(&f.RETH)
		case ExtAETH:
			AETH(h).Encode(f.Syndrome, f.MSN)
		case ExtImmDt:
			ImmDt(h).SetImm(f.Imm)
		case ExtIETH:
			IETH(h).SetRKey(f.InvRKey)
		case ExtDETH:
			DETH(h).Encode(f.QKey, f.SrcQP)
		case ExtAtomicETH:
			AtomicETH(h).Encode(&f.Atomic)
		case ExtAtomicAckETH:
			AtomicAckETH(h).SetOrigData(f.AtomicOrig)
		}
	}
	if op == OpCNP {
		clear(b[BTHSize:hl])
	}
	return hl, nil
}
