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
		tr.eps = []*Endpoint{e}
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
