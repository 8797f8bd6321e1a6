package link

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/roce/wire"
)

// rocePacket returns a RoCEv2 UDP payload to dst (a BTH, 64 bytes of
// data, an ICRC of zeros: unsealed) and the same with its ICRC sealed as
// from src.
func rocePacket(src, dst netip.AddrPort, sport uint16) (unsealed, sealed []byte) {
	b := make([]byte, wire.BTHSize+64+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: wire.DefaultPKey, DestQP: 0x123, PSN: 7})
	for i := wire.BTHSize; i < len(b)-wire.ICRCSize; i++ {
		b[i] = byte(i)
	}
	sealed = bytes.Clone(b)
	var h sealHdr
	wire.SealICRC(h[:], sealed, src.Addr(), dst.Addr(), sport)
	return b, sealed
}

// A datagram written unsealed into a ring that reads such datagrams
// arrives unsealed and says so (its ICRC bytes as sent: nobody computed
// one); a sealed one arrives sealed and not marked. Both ends are Weft,
// and the ring is memory: the ICRC would guard nothing.
func TestShmLinkUnsealed(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 8})
	raw, sealed := rocePacket(a.LocalAddr(), b.LocalAddr(), 50001)
	out := []Packet{
		{Buf: bytes.Clone(raw), N: len(raw), Addr: b.LocalAddr(), SrcPort: 50001, Unsealed: true},
		{Buf: bytes.Clone(sealed), N: len(sealed), Addr: b.LocalAddr(), SrcPort: 50001},
	}
	if n, err := a.WriteBatch(out); n != 2 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	in := rxPackets(4)
	if n, err := b.ReadBatch(in); n != 2 || err != nil {
		t.Fatalf("ReadBatch = %d, %v; want 2", n, err)
	}
	if p := in[0]; !p.Unsealed || !bytes.Equal(p.Buf[:p.N], raw) || p.SrcPort != 50001 {
		t.Errorf("unsealed datagram arrived Unsealed=%v, port %d, bytes as sent %v: want marked, 50001, as sent (no ICRC computed)",
			p.Unsealed, p.SrcPort, bytes.Equal(p.Buf[:p.N], raw))
	}
	if p := in[1]; p.Unsealed || !bytes.Equal(p.Buf[:p.N], sealed) || p.SrcPort != 50001 {
		t.Errorf("sealed datagram arrived Unsealed=%v, port %d: want unmarked, 50001, as sent", p.Unsealed, p.SrcPort)
	}
	if a.Torn() != 0 || b.Torn() != 0 {
		t.Errorf("Torn = %d and %d, want 0", a.Torn(), b.Torn())
	}
}

// A ring whose owner did not say it reads unsealed datagrams (a ring of
// an earlier version: the header word is 0) gets them sealed, with a
// valid ICRC, and not marked: its reader checks every ICRC.
func TestShmLinkUnsealedOldReader(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 8})
	shm.U32(b.mem, shmOffSeal).Store(0)
	raw, sealed := rocePacket(a.LocalAddr(), b.LocalAddr(), 50001)
	out := []Packet{{Buf: raw, N: len(raw), Addr: b.LocalAddr(), SrcPort: 50001, Unsealed: true}}
	if n, err := a.WriteBatch(out); n != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	if p := readOne(t, b); p.Unsealed || !bytes.Equal(p.Buf[:p.N], sealed) {
		t.Fatalf("to an older reader: Unsealed=%v, ICRC %#x; want sealed %#x", p.Unsealed,
			binary.LittleEndian.Uint32(p.Buf[p.N-4:p.N]), binary.LittleEndian.Uint32(sealed[len(sealed)-4:]))
	}
}

// A slot a stalled producer may still write into (its count in the slot's
// port word, as a producer that the consumer skipped leaves it) spoils an
// unsealed datagram: the reader drops it (Torn), and from then on every
// producer seals what it writes into that ring, whose reader checks it; a
// sealed datagram from such a slot is returned for its check.
func TestShmLinkTornSlot(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 8})
	raw, sealed := rocePacket(a.LocalAddr(), b.LocalAddr(), 50001)
	next := b.r.tail.Load()
	b.r.port(next).Add(slotWriter) // the stalled producer
	b.r.port(next + 1).Add(slotWriter)
	pkt := func() []Packet {
		return []Packet{{Buf: bytes.Clone(raw), N: len(raw), Addr: b.LocalAddr(), SrcPort: 50001, Unsealed: true}}
	}
	if n, err := a.WriteBatch(pkt()); n != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	in := rxPackets(4)
	if n, err := b.ReadBatch(in); n != 0 || err != nil || b.Torn() != 1 {
		t.Fatalf("an unsealed datagram in a slot another writer may reach: ReadBatch = %d, %v, Torn %d; want it dropped (0, Torn 1)",
			n, err, b.Torn())
	}
	if in[0].Unsealed {
		t.Fatal("the dropped datagram's packet is left marked Unsealed: the next read into it (UDP) would skip its ICRC")
	}
	if w := b.r.seal.Load(); w&shmTorn == 0 {
		t.Fatalf("the ring's header word is %#x after a torn slot: want shmTorn set (producers seal)", w)
	}
	// The next slot is spoilt too, but what now arrives there is sealed.
	if n, err := a.WriteBatch(pkt()); n != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	if p := readOne(t, b); p.Unsealed || !bytes.Equal(p.Buf[:p.N], sealed) {
		t.Fatalf("after a torn slot: Unsealed=%v, sealed %v; want a sealed datagram for the engine to check", p.Unsealed,
			bytes.Equal(p.Buf[:p.N], sealed))
	}
	if n, err := a.WriteBatch(pkt()); n != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	if p := readOne(t, b); p.Unsealed || !bytes.Equal(p.Buf[:p.N], sealed) {
		t.Fatalf("a clean slot of a torn ring: Unsealed=%v; want sealed (the ring stays sealed)", p.Unsealed)
	}
}

// UDP never carries an unsealed datagram: a packet marked Unsealed that
// reaches a UDPLink (directly, or as an AutoLink's packet not marked Shm)
// goes out with a valid ICRC, byte for byte what the engine would have
// sealed.
func TestUDPLinkSealsUnsealed(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	u, err := ListenUDPConfig(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0), UDPConfig{NoRaw: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAutoLink(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, l := range []Link{u, a} {
		raw, sealed := rocePacket(u.LocalAddr(), dst, u.LocalAddr().Port())
		out := []Packet{{Buf: raw, N: len(raw), Addr: dst, Unsealed: true}}
		if n, err := l.WriteBatch(out); n != 1 || err != nil {
			t.Fatalf("%T.WriteBatch = %d, %v", l, n, err)
		}
		buf := make([]byte, 2048)
		rx.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := rx.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[:n], sealed) {
			t.Fatalf("%T sent an Unsealed packet with ICRC %#x, want it sealed: %#x", l,
				binary.LittleEndian.Uint32(buf[n-4:n]), binary.LittleEndian.Uint32(sealed[len(sealed)-4:]))
		}
	}
}

// An unsealed datagram is lent, not copied: its packet points into the
// ring, whose slot no producer may take until the next ReadBatch (the
// engine is done with a batch before it reads again); a sealed one is
// copied into the caller's buffer and its slot freed at once.
func TestShmLinkLends(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 4})
	raw, sealed := rocePacket(a.LocalAddr(), b.LocalAddr(), 50001)
	write := func(unsealed bool, n int) int {
		t.Helper()
		out := make([]Packet, n)
		for i := range out {
			src := sealed
			if unsealed {
				src = raw
			}
			out[i] = Packet{Buf: bytes.Clone(src), N: len(src), Addr: b.LocalAddr(), SrcPort: 50001, Unsealed: unsealed}
		}
		k, err := a.WriteBatch(out)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	inRing := func(buf []byte) bool {
		p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		m := uintptr(unsafe.Pointer(unsafe.SliceData(b.mem)))
		return p >= m && p < m+uintptr(len(b.mem))
	}
	if k := write(true, 4); k != 4 {
		t.Fatalf("4 datagrams into 4 free slots: %d taken", k)
	}
	in := rxPackets(8)
	if n, err := b.ReadBatch(in); n != 4 || err != nil {
		t.Fatalf("ReadBatch = %d, %v; want 4", n, err)
	}
	for i, p := range in[:4] {
		if !p.Unsealed || !inRing(p.Buf) || !bytes.Equal(p.Buf[:p.N], raw) {
			t.Fatalf("unsealed datagram %d: Unsealed %v, lent from the ring %v, as sent %v; want all three", i, p.Unsealed,
				inRing(p.Buf), bytes.Equal(p.Buf[:p.N], raw))
		}
	}
	// The batch is the reader's until it reads again.
	if k := write(true, 1); k != 0 {
		t.Fatalf("a producer took %d slot(s) lent to the reader", k)
	}
	for i, p := range in[:4] {
		if !bytes.Equal(p.Buf[:p.N], raw) {
			t.Fatalf("lent datagram %d changed before the next read", i)
		}
	}
	in = rxPackets(8)
	if n, err := b.ReadBatch(in); n != 0 || err != nil {
		t.Fatalf("ReadBatch of an empty ring = %d, %v", n, err)
	}
	if k := write(false, 4); k != 4 {
		t.Fatalf("after the next read the lent slots are free: %d of 4 taken", k)
	}
	if n, err := b.ReadBatch(in); n != 4 || err != nil {
		t.Fatalf("ReadBatch = %d, %v; want 4", n, err)
	}
	for i, p := range in[:4] {
		if p.Unsealed || inRing(p.Buf) || !bytes.Equal(p.Buf[:p.N], sealed) {
			t.Fatalf("sealed datagram %d: Unsealed %v, lent %v, as sent %v; want copied, unmarked", i, p.Unsealed, inRing(p.Buf),
				bytes.Equal(p.Buf[:p.N], sealed))
		}
	}
	if k := write(false, 4); k != 4 {
		t.Fatalf("the slots of copied datagrams are free at once: %d of 4 taken", k)
	}
}

// TestShmLinkReturnLent: ReturnLent gives a batch's lent slots back
// before the next ReadBatch: the engine
// returns them before it acknowledges the batch, so that a sender whose
// window the acknowledgement opens finds room (with the lossless window,
// as large as the ring, a batch still lent meant a full ring, dropped
// packets and a resent window: TestWindowBelowQueues, one run in three).
func TestShmLinkReturnLent(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 4})
	raw, _ := rocePacket(a.LocalAddr(), b.LocalAddr(), 50001)
	write := func(n int) int {
		t.Helper()
		out := make([]Packet, n)
		for i := range out {
			out[i] = Packet{Buf: bytes.Clone(raw), N: len(raw), Addr: b.LocalAddr(), SrcPort: 50001, Unsealed: true}
		}
		k, err := a.WriteBatch(out)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if k := write(4); k != 4 {
		t.Fatalf("4 datagrams into 4 free slots: %d taken", k)
	}
	in := rxPackets(8)
	if n, err := b.ReadBatch(in); n != 4 || err != nil {
		t.Fatalf("ReadBatch = %d, %v; want 4", n, err)
	}
	if k := write(1); k != 0 {
		t.Fatalf("a producer took %d slot(s) lent to the reader", k)
	}
	var l Lender = b
	l.ReturnLent()
	if k := write(4); k != 4 {
		t.Fatalf("after ReturnLent: %d of 4 slots taken, want the 4 lent ones", k)
	}
	// A second ReturnLent, with nothing lent, and one after Close, are
	// no-ops; the next ReadBatch finds the 4 new datagrams.
	l.ReturnLent()
	if n, err := b.ReadBatch(in); n != 4 || err != nil {
		t.Fatalf("ReadBatch = %d, %v; want 4", n, err)
	}
	b.Close()
	l.ReturnLent()
}

var (
	_ Lender = (*ShmLink)(nil)
	_ Lender = (*AutoLink)(nil)
)
