package wire

import "encoding/binary"

// Lengths of the extended transport headers.
const (
	RETHSize         = 16 // RDMA extended transport header
	AETHSize         = 4  // ACK extended transport header
	ImmDtSize        = 4  // immediate data
	IETHSize         = 4  // invalidate extended transport header
	DETHSize         = 8  // datagram extended transport header
	AtomicETHSize    = 28 // atomic extended transport header
	AtomicAckETHSize = 8  // atomic acknowledge extended transport header
)

// RETH is the RDMA extended transport header of RDMA write and read
// requests: the remote virtual address, the remote key and the length of
// the whole transfer.
//
//	bytes 0-7   VA
//	bytes 8-11  R_Key
//	bytes 12-15 DMA length
//
// The accessors require len(b) >= RETHSize.
type RETH []byte

// IsValid reports whether b is long enough to hold a RETH.
func (b RETH) IsValid() bool { return len(b) >= RETHSize }

// VA returns the remote virtual address.
func (b RETH) VA() uint64 { return binary.BigEndian.Uint64(b[0:]) }

// SetVA sets the remote virtual address.
func (b RETH) SetVA(v uint64) { binary.BigEndian.PutUint64(b[0:], v) }

// RKey returns the remote key.
func (b RETH) RKey() uint32 { return binary.BigEndian.Uint32(b[8:]) }

// SetRKey sets the remote key.
func (b RETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[8:], v) }

// DMALength returns the length of the whole RDMA transfer in bytes.
func (b RETH) DMALength() uint32 { return binary.BigEndian.Uint32(b[12:]) }

// SetDMALength sets the length of the whole RDMA transfer.
func (b RETH) SetDMALength(v uint32) { binary.BigEndian.PutUint32(b[12:], v) }

// RETHFields holds the fields of a RETH, for [RETH.Encode].
type RETHFields struct {
	VA        uint64
	RKey      uint32
	DMALength uint32
}

// Encode writes all the fields of the RETH.
func (b RETH) Encode(f *RETHFields) {
	_ = b[RETHSize-1]
	b.SetVA(f.VA)
	b.SetRKey(f.RKey)
	b.SetDMALength(f.DMALength)
}

// AETH is the ACK extended transport header of acknowledgements and RDMA
// read responses: an 8-bit [Syndrome] and a 24-bit message sequence
// number.
//
// The accessors require len(b) >= AETHSize.
type AETH []byte

// IsValid reports whether b is long enough to hold an AETH.
func (b AETH) IsValid() bool { return len(b) >= AETHSize }

// Syndrome returns the syndrome: ACK, RNR NAK or NAK, with its argument.
func (b AETH) Syndrome() Syndrome { return Syndrome(b[0]) }

// SetSyndrome sets the syndrome.
func (b AETH) SetSyndrome(s Syndrome) { b[0] = uint8(s) }

// MSN returns the message sequence number (24 bits).
func (b AETH) MSN() uint32 { return get24(b[1:]) }

// SetMSN sets the message sequence number. Only the low 24 bits are used.
func (b AETH) SetMSN(v uint32) { put24(b[1:], v) }

// Encode writes the syndrome and the MSN.
func (b AETH) Encode(s Syndrome, msn uint32) {
	_ = b[AETHSize-1]
	b[0] = uint8(s)
	put24(b[1:], msn)
}

// ImmDt is the immediate data header of the WITH_IMMEDIATE opcodes: four
// bytes delivered to the receiver's completion as they are.
//
// The accessors require len(b) >= ImmDtSize.
type ImmDt []byte

// IsValid reports whether b is long enough to hold an ImmDt.
func (b ImmDt) IsValid() bool { return len(b) >= ImmDtSize }

// Imm returns the immediate data, read as a big-endian number. (The verbs
// API hands the four bytes over in network order; this is that value
// converted to host order.)
func (b ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(b) }

// SetImm sets the immediate data, written big-endian.
func (b ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(b, v) }

// IETH is the invalidate extended transport header of the
// SEND_WITH_INVALIDATE opcodes: the remote key the responder invalidates.
//
// The accessors require len(b) >= IETHSize.
type IETH []byte

// IsValid reports whether b is long enough to hold an IETH.
func (b IETH) IsValid() bool { return len(b) >= IETHSize }

// RKey returns the remote key to invalidate.
func (b IETH) RKey() uint32 { return binary.BigEndian.Uint32(b) }

// SetRKey sets the remote key to invalidate.
func (b IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b, v) }

// DETH is the datagram extended transport header of UD packets: the queue
// key and the source queue pair.
//
//	bytes 0-3  Q_Key
//	byte  4    reserved
//	bytes 5-7  source QP
//
// The accessors require len(b) >= DETHSize.
type DETH []byte

// IsValid reports whether b is long enough to hold a DETH.
func (b DETH) IsValid() bool { return len(b) >= DETHSize }

// QKey returns the queue key.
func (b DETH) QKey() uint32 { return binary.BigEndian.Uint32(b[0:]) }

// SetQKey sets the queue key.
func (b DETH) SetQKey(v uint32) { binary.BigEndian.PutUint32(b[0:], v) }

// SrcQP returns the source queue pair number (24 bits).
func (b DETH) SrcQP() uint32 { return get24(b[5:]) }

// SetSrcQP sets the source queue pair number. Only the low 24 bits are
// used.
func (b DETH) SetSrcQP(v uint32) { put24(b[5:], v) }

// Encode writes the queue key and the source QP and zeroes the reserved
// byte.
func (b DETH) Encode(qkey, srcQP uint32) {
	_ = b[DETHSize-1]
	b.SetQKey(qkey)
	b[4] = 0
	put24(b[5:], srcQP)
}

// AtomicETH is the atomic extended transport header of COMPARE_SWAP and
// FETCH_ADD requests.
//
//	bytes 0-7   VA
//	bytes 8-11  R_Key
//	bytes 12-19 swap (COMPARE_SWAP) or add (FETCH_ADD) data
//	bytes 20-27 compare data (COMPARE_SWAP)
//
// The accessors require len(b) >= AtomicETHSize.
type AtomicETH []byte

// IsValid reports whether b is long enough to hold an AtomicETH.
func (b AtomicETH) IsValid() bool { return len(b) >= AtomicETHSize }

// VA returns the remote virtual address of the 8-byte operand.
func (b AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(b[0:]) }

// SetVA sets the remote virtual address.
func (b AtomicETH) SetVA(v uint64) { binary.BigEndian.PutUint64(b[0:], v) }

// RKey returns the remote key.
func (b AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(b[8:]) }

// SetRKey sets the remote key.
func (b AtomicETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[8:], v) }

// SwapAdd returns the swap data of a COMPARE_SWAP or the addend of a
// FETCH_ADD.
func (b AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(b[12:]) }

// SetSwapAdd sets the swap or add data.
func (b AtomicETH) SetSwapAdd(v uint64) { binary.BigEndian.PutUint64(b[12:], v) }

// Compare returns the compare data of a COMPARE_SWAP.
func (b AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(b[20:]) }

// SetCompare sets the compare data.
func (b AtomicETH) SetCompare(v uint64) { binary.BigEndian.PutUint64(b[20:], v) }

// AtomicETHFields holds the fields of an AtomicETH, for
// [AtomicETH.Encode].
type AtomicETHFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// Encode writes all the fields of the AtomicETH.
func (b AtomicETH) Encode(f *AtomicETHFields) {
	_ = b[AtomicETHSize-1]
	b.SetVA(f.VA)
	b.SetRKey(f.RKey)
	b.SetSwapAdd(f.SwapAdd)
	b.SetCompare(f.Compare)
}

// AtomicAckETH is the atomic acknowledge extended transport header of an
// ATOMIC_ACKNOWLEDGE: the value the remote operand had before the atomic
// operation.
//
// The accessors require len(b) >= AtomicAckETHSize.
type AtomicAckETH []byte

// IsValid reports whether b is long enough to hold an AtomicAckETH.
func (b AtomicAckETH) IsValid() bool { return len(b) >= AtomicAckETHSize }

// OrigData returns the original remote data.
func (b AtomicAckETH) OrigData() uint64 { return binary.BigEndian.Uint64(b) }

// SetOrigData sets the original remote data.
func (b AtomicAckETH) SetOrigData(v uint64) { binary.BigEndian.PutUint64(b, v) }
