package ntb

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
	"github.com/weft-io/weft/internal/shm"
)

// aligned returns n zero bytes aligned for 64-bit atomics, like the
// page-aligned window memory they stand for (a plain make may be placed
// on the stack with byte alignment).
func aligned(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), n)
}

// inside reports whether b lies within mem.
func inside(b, mem []byte) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(mem))
}

// FuzzRecvRing feeds arbitrary ring contents to the receive path: the
// fuzzer controls every header field and payload byte; the harness makes
// each header's sequence word valid (unless the input's first byte says
// otherwise), so the parser gets past it. Whatever the peer wrote, Recv
// must not panic, must not report more bytes than the buffers hold, and
// may only fail with ErrMalformed; a data record longer than the maximum
// message size (2048 here) must be refused as malformed even when it fits
// the ring and the buffers would take it truncated. With bit 1 of the
// first byte it receives views instead, which must lie inside the ring
// and be no longer than the maximum message size.
func FuzzRecvRing(f *testing.F) {
	rec := func(n int, flags uint32, imm uint32) []byte {
		b := make([]byte, align16(recHdr+n))
		binary.LittleEndian.PutUint32(b[4:], uint32(n))
		binary.LittleEndian.PutUint32(b[8:], imm)
		binary.LittleEndian.PutUint32(b[12:], flags)
		return b
	}
	var seed []byte
	seed = append(seed, rec(5, 0, 0)...)
	seed = append(seed, rec(100, recFlagImm, 7)...)
	seed = append(seed, rec(0, recFlagRMA|recFlagImm, 9)...)
	f.Add(byte(0), seed)
	f.Add(byte(0), rec(1<<20, 0, 0))
	f.Add(byte(1), rec(8, recFlagPad, 0))
	f.Add(byte(0), []byte{})
	f.Add(byte(2), seed)
	// A record over the maximum message size that fits the ring, on the
	// copy path and on the view path.
	f.Add(byte(0), rec(3000, 0, 0))
	f.Add(byte(2), rec(3000, recFlagImm, 1))
	f.Fuzz(func(t *testing.T, mode byte, data []byte) {
		const ring = 8192
		tr := &Transport{cfg: Config{MaxMsgSize: 2048}, kick: make(chan struct{}, 1)}
		e := &Endpoint{t: tr, cq: cq.New(16, 0), evs: make(chan fabric.Event, 64)}
		tr.setEndpoints([]*Endpoint{e})
		e.rxRing = aligned(ring)
		e.rxHeadP, e.txSleep = new(atomic.Uint64), new(atomic.Uint32)
		copy(e.rxRing, data)
		e.rxValid, e.rxUp, e.rxSalt = true, true, 0x1234567
		buf := make([]byte, 1024)
		reg := fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: fabric.AccessLocalWrite, Domain: &tr.dom})
		msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: reg, Length: 700}, {Region: reg, Offset: 800, Length: 224}}}}
		for i := 0; i < 64; i++ {
			if mode&1 == 0 {
				shm.U32(e.rxRing, int(e.rxHead%ring)).Store(seqOf(e.rxHead, e.rxSalt))
			}
			// What the record at the head says, if it is a data record.
			off := int(e.rxHead % ring)
			fl := shm.Get32(e.rxRing, off+12)
			ln := int(shm.Get32(e.rxRing, off+4))
			oversize := mode&1 == 0 && fl&^recFlagImm == 0 && ln > tr.cfg.MaxMsgSize
			var n int
			var err error
			if mode&2 != 0 {
				// Zero-copy: views must lie inside the ring.
				views := make([]fabric.View, 2)
				n, err = e.RecvViews(views)
				for _, v := range views[:n] {
					if v.Len < 0 || len(v.Data) > 2048 || (len(v.Data) > 0 && !inside(v.Data, e.rxRing)) {
						t.Fatalf("view of %d bytes (Len %d) outside the ring", len(v.Data), v.Len)
					}
				}
				if rerr := e.ReleaseViews(n); rerr != nil {
					t.Fatalf("ReleaseViews(%d): %v", n, rerr)
				}
				msgs[0].Len, msgs[0].Flags = 0, 0 // the buffer check below is for copies
			} else {
				n, err = e.Recv(msgs)
			}
			if oversize && (n != 0 || !errors.Is(err, fabric.ErrMalformed)) {
				t.Fatalf("a %d-byte record (max %d): %d messages, %v; want ErrMalformed", ln, tr.cfg.MaxMsgSize, n, err)
			}
			if err != nil {
				if !errors.Is(err, fabric.ErrMalformed) {
					t.Fatalf("Recv failed with %v", err)
				}
				if e.Stats().Drops[fabric.DropMalformed] == 0 {
					t.Fatal("malformed record not counted")
				}
				return
			}
			if n == 0 {
				return
			}
			if msgs[0].Len < 0 || (msgs[0].Flags&fabric.FlagRemoteWrite == 0 && msgs[0].Len > 924) {
				t.Fatalf("Len %d for 924 bytes of buffers", msgs[0].Len)
			}
		}
	})
}

// FuzzCheckRemote checks that whatever the peer publishes in its region
// table and whatever the application asks, an accepted RMA stays inside
// the peer's window and inside the entry.
func FuzzCheckRemote(f *testing.F) {
	f.Add(uint32(2), uint32(7), uint64(0x1100), uint64(4096), uint64(4096), uint64(0x1100), uint64(4096), uint64(0x1100), 100)
	f.Add(uint32(2), uint32(7), uint64(0x1100), ^uint64(0), uint64(4096), uint64(0x1100), ^uint64(0), uint64(0x1100), 100)
	f.Fuzz(func(t *testing.T, seq, acc uint32, key, base, size, addr, rlen, rkey uint64, n int) {
		if n < 0 || n > 1<<20 {
			return
		}
		tr := &Transport{win: aligned(16384)}
		pw := aligned(65536)
		idx := int(rkey & 0xff)
		e := mrOff + idx*mrEntrySize
		shm.U32(tr.win, e).Store(seq)
		shm.U32(tr.win, e+4).Store(acc)
		shm.U64(tr.win, e+8).Store(key)
		shm.U64(tr.win, e+16).Store(base)
		shm.U64(tr.win, e+24).Store(size)
		off, st := tr.checkRemote(pw, fabric.RemoteIOV{Addr: addr, Len: rlen, Key: fabric.Key(rkey)}, n, fabric.AccessRemoteWrite)
		if st != fabric.StatusOK {
			return
		}
		if off < 0 || off+n > len(pw) || uint64(off) < base || uint64(off+n) > base+size {
			t.Fatalf("accepted [%d, %d) for entry [%d, %d) in a %d-byte window", off, off+n, base, base+size, len(pw))
		}
		if key != rkey || fabric.Access(acc)&fabric.AccessRemoteWrite == 0 {
			t.Fatalf("accepted key %#x for entry key %#x access %#x", rkey, key, acc)
		}
	})
}

// fuzzMsg is a Messenger whose inbound registers the fuzzer fills:
// whenever side A finds no status bit set, the next bytes of the input
// give the status word (bits past the registers included) and every
// register's value.
type fuzzMsg struct {
	n      int
	data   []byte
	sts    uint64
	val    []uint32
	strays uint64 // bits cleared past the registers the channel uses
	mask   uint64
	ref    msgRef // what the messages delivered so far say
}

// msgRef is the fuzz target's own reading of the messages, from their
// documented layout: the last half at each place with its snapshot
// number; the words change when all sixteen places hold one number.
type msgRef struct {
	words [numSpads]uint32
	half  [msgHalves]uint32
	seq   [msgHalves]int
}

func (r *msgRef) reset() {
	for i := range r.seq {
		r.seq[i] = -1
	}
}

func (r *msgRef) feed(m uint32) {
	switch {
	case m == 0x2e<<26:
		r.words[spadState], r.words[spadNonce] = hsClosed, 0
		r.reset() // halves of an unfinished snapshot are dropped
	case m>>26 == 0x2d:
		place, seq := int(m>>16&15), int(m>>20&63)
		r.half[place], r.seq[place] = m&0xffff, seq
		for _, s := range r.seq {
			if s != seq {
				return
			}
		}
		for w := range r.words {
			r.words[w] = r.half[2*w] | r.half[2*w+1]<<16
		}
		r.reset()
	}
}

func (f *fuzzMsg) MsgCount() int { return f.n }
func (f *fuzzMsg) MsgStatus() uint64 {
	if f.sts&f.mask == 0 && len(f.data) >= 2+4*f.n {
		f.sts = uint64(binary.LittleEndian.Uint16(f.data))
		for i := range f.val {
			f.val[i] = binary.LittleEndian.Uint32(f.data[2+4*i:])
		}
		f.data = f.data[2+4*f.n:]
		closed := false
		for i, v := range f.val {
			if f.sts&f.mask>>i&1 != 0 {
				if v == 0x2e<<26 {
					closed = true // applied after the rest of its batch
					continue
				}
				f.ref.feed(v)
			}
		}
		if closed {
			f.ref.feed(0x2e << 26)
		}
	}
	return f.sts
}
func (f *fuzzMsg) MsgClear(bits uint64) error {
	f.strays |= bits &^ f.mask
	f.sts &^= bits
	return nil
}
func (f *fuzzMsg) MsgRead(idx int) (uint32, error) {
	if idx < 0 || idx >= f.n {
		return 0, fabric.ErrBounds
	}
	return f.val[idx], nil
}
func (f *fuzzMsg) PeerMsgWrite(int, uint32) error { return ErrMsgBusy }

// FuzzMsgRecv feeds arbitrary message registers to the decode of
// inbound control messages (transport_msg.go): what a peer without
// scratchpads sends in the handshake. Whatever they hold, a poll must
// not panic, must take at most msgPollBudget batches, must fail only
// with a protocol error (ErrMalformed when the registers were
// readable), must clear no status bit past the registers it uses, and
// must read the peer's words as the message layout says: a close, or a
// whole snapshot (all sixteen halves of one seq since the last one),
// never a mix of two.
func FuzzMsgRecv(f *testing.F) {
	batch := func(sts uint16, words ...uint32) []byte {
		b := binary.LittleEndian.AppendUint16(nil, sts)
		for _, w := range words {
			b = binary.LittleEndian.AppendUint32(b, w)
		}
		return b
	}
	snap := func(seq uint8, w [numSpads]uint32) (b []byte) {
		for i, v := range w {
			b = append(b, batch(0x3, msgHalf(seq, i, 0, v), msgHalf(seq, i, 1, v))...)
		}
		return b
	}
	w := [numSpads]uint32{protoVersion, 1, 8192, 4000, 256, 0x5a5a5a5b, 0, hsPosted}
	// The first argument is the number of registers less 1.
	f.Add(byte(1), snap(1, w))
	f.Add(byte(1), append(snap(1, w)[:60], snap(2, w)...))
	f.Add(byte(1), batch(0x3, msgClose, msgClose|1))
	f.Add(byte(3), batch(0xffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff))
	f.Add(byte(0), batch(0x1, 0xdeadbeef))
	var flood []byte
	for range msgPollBudget + 8 {
		flood = append(flood, batch(0x1, msgHalf(3, 7, 1, 0))...)
	}
	f.Add(byte(0), flood)
	f.Add(byte(0), []byte{})
	f.Fuzz(func(t *testing.T, regs byte, data []byte) {
		n := int(regs)%16 + 1
		for h := 0; h+4 <= len(data) && h < 64; h++ {
			m := binary.LittleEndian.Uint32(data[h:])
			closed, seq, place, _, err := decodeMsg(m)
			if err != nil && (!errors.Is(err, fabric.ErrMalformed) || !errors.Is(err, errProtocol)) {
				t.Fatalf("message %#x: untyped error %v", m, err)
			}
			if err == nil && !closed && (seq > 63 || place < 0 || place >= msgHalves) {
				t.Fatalf("message %#x decoded to seq %d place %d", m, seq, place)
			}
		}
		fm := &fuzzMsg{n: n, data: data, val: make([]uint32, n)}
		fm.ref.reset()
		c := newMsgCtrl(noLink{}, fm)
		fm.mask = c.mask
		for polls := 0; polls < 1000; polls++ {
			left := len(fm.data)
			err := c.poll()
			if err != nil && (!errors.Is(err, errProtocol) || !errors.Is(err, fabric.ErrMalformed)) {
				t.Fatalf("poll: untyped error %v", err)
			}
			if took := (left - len(fm.data)) / (2 + 4*n); took > msgPollBudget+1 {
				t.Fatalf("one poll took %d batches, the budget is %d", took, msgPollBudget)
			}
			if fm.strays != 0 {
				t.Fatalf("cleared status bits %#x past the %d registers used", fm.strays, n)
			}
			if c.shadow != fm.ref.words {
				t.Fatalf("the peer's words are %x; its messages say %x", c.shadow, fm.ref.words)
			}
			if err == nil && len(fm.data) == left {
				break
			}
		}
	})
}

// noLink is a Device whose link is down; only LinkIsUp is called.
type noLink struct{ Device }

func (noLink) LinkIsUp() bool { return false }
