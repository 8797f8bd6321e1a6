package roce

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/shm"
)

// shmAddr returns a random loopback address for a ShmLink ring: rings are
// named after addresses host-wide, so tests of concurrent runs must not
// share one.
func shmAddr() netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))})
}

// shmPair opens two ShmLinks in a directory of the test's.
func shmPair(t *testing.T, cfg ShmConfig) (a, b *ShmLink) {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	var err error
	a, err = ListenShm(netip.AddrPortFrom(netip.MustParseAddr("10.1.0.1"), 0), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = ListenShm(netip.AddrPortFrom(netip.MustParseAddr("10.1.0.2"), 0), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

func shmPackets(to netip.AddrPort, n, size int) []Packet {
	pkts := make([]Packet, n)
	for i := range pkts {
		buf := make([]byte, size)
		for j := range buf {
			buf[j] = byte(i + j)
		}
		pkts[i] = Packet{Buf: buf, N: size, Addr: to, SrcPort: uint16(50000 + i)}
	}
	return pkts
}

func rxPackets(n int) []Packet {
	pkts := make([]Packet, n)
	for i := range pkts {
		pkts[i].Buf = make([]byte, rxBufSize)
	}
	return pkts
}

// Datagrams cross in order with their source, and a full ring pushes
// back without losing any.
func TestShmLink(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 8})
	out := shmPackets(b.LocalAddr(), 11, 100)
	n, err := a.WriteBatch(out)
	if err != nil || n != 8 {
		t.Fatalf("WriteBatch into 8 slots = %d, %v; want 8 (backpressure)", n, err)
	}
	in := rxPackets(16)
	got, err := b.ReadBatch(in)
	if err != nil || got != 8 {
		t.Fatalf("ReadBatch = %d, %v", got, err)
	}
	if m, err := a.WriteBatch(out[n:]); err != nil || m != 3 {
		t.Fatalf("WriteBatch after the read = %d, %v", m, err)
	}
	more, _ := b.ReadBatch(in[got:])
	if more != 3 {
		t.Fatalf("second ReadBatch = %d", more)
	}
	for i := range out {
		p := in[i]
		if p.N != 100 || string(p.Buf[p.Off:p.Off+p.N]) != string(out[i].Buf) {
			t.Fatalf("datagram %d: %d bytes, corrupted or out of order", i, p.N)
		}
		if p.Addr != netip.AddrPortFrom(a.LocalAddr().Addr(), out[i].SrcPort) || p.SrcPort != out[i].SrcPort {
			t.Fatalf("datagram %d from %v (port %d)", i, p.Addr, p.SrcPort)
		}
	}
	if got, _ := b.ReadBatch(in); got != 0 {
		t.Fatalf("empty ring read %d", got)
	}
	if a.Drops() != 0 {
		t.Fatalf("%d drops", a.Drops())
	}
}

// A destination without a ring, with a closed one or with a malformed
// file takes the datagrams and counts them dropped; a restarted peer is
// found again.
func TestShmLinkPeers(t *testing.T) {
	dir := t.TempDir()
	a, b := shmPair(t, ShmConfig{Dir: dir})
	nowhere := netip.MustParseAddrPort("10.1.0.9:4791")
	if n, err := a.WriteBatch(shmPackets(nowhere, 2, 64)); n != 2 || err != nil || a.Drops() != 2 {
		t.Fatalf("to no ring: %d, %v, %d drops", n, err, a.Drops())
	}
	bad := netip.MustParseAddrPort("10.1.0.8:4791")
	for _, content := range [][]byte{make([]byte, shmHeader), []byte("short"), bigHeader(t)} {
		os.WriteFile(ShmPath(dir, bad), content, 0o600)
		drops := a.Drops()
		if n, err := a.WriteBatch(shmPackets(bad, 1, 64)); n != 1 || err != nil || a.Drops() != drops+1 {
			t.Fatalf("to a malformed ring (%d bytes): %d, %v, %d drops", len(content), n, err, a.Drops()-drops)
		}
	}
	// A peer that closes, and one that comes back.
	if n, _ := a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64)); n != 1 || a.Drops() != 5 {
		t.Fatalf("to a live ring: %d, %d drops", n, a.Drops())
	}
	baddr := b.LocalAddr()
	b.Close()
	if n, _ := a.WriteBatch(shmPackets(baddr, 1, 64)); n != 1 || a.Drops() != 6 {
		t.Fatalf("to a closed ring: %d, %d drops", n, a.Drops())
	}
	if _, err := os.Stat(ShmPath(dir, baddr)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left its ring: %v", err)
	}
	b2, err := ListenShm(baddr, ShmConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	a.WriteBatch(shmPackets(baddr, 1, 64))
	if got, _ := b2.ReadBatch(rxPackets(4)); got != 1 || a.Drops() != 6 {
		t.Fatalf("restarted peer read %d, %d drops", got, a.Drops())
	}
}

// die ends l as the death of its process would: its mappings and
// descriptor go (and with them its lock), its files stay.
func die(l *ShmLink) {
	l.closed.Store(true) // its Close, at the test's end, then does nothing
	unix.Munmap(l.mem)
	for _, p := range l.peers {
		unix.Munmap(p.mem)
		p.f.Close()
	}
	l.f.Close()
}

// bigHeader is a ring header that claims more slots than its file holds.
func bigHeader(t *testing.T) []byte {
	h := make([]byte, shmHeader+shmSlotSize)
	shm.Put32(h, shmOffMagic, shmMagic)
	shm.Put32(h, shmOffVersion, shmVersion)
	shm.Put32(h, shmOffSlots, 64)
	shm.Put32(h, shmOffSlotSize, shmSlotSize)
	return h
}

// An address is one link's: a second is refused while the first lives,
// and takes over the ring of one that died without closing.
func TestShmLinkOwner(t *testing.T) {
	dir := t.TempDir()
	a, b := shmPair(t, ShmConfig{Dir: dir})
	if l, err := ListenShm(b.LocalAddr(), ShmConfig{Dir: dir}); !errors.Is(err, syscall.EADDRINUSE) {
		if l != nil {
			l.Close()
		}
		t.Fatalf("second link at %v: %v, want EADDRINUSE", b.LocalAddr(), err)
	}
	// a maps b's ring; then b dies: its lock goes with its descriptor
	// and mapping, its file stays.
	if n, _ := a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64)); n != 1 || a.Drops() != 0 {
		t.Fatal("write to the first owner")
	}
	die(b)
	b2, err := ListenShm(b.LocalAddr(), ShmConfig{Dir: dir})
	if err != nil {
		t.Fatalf("taking over a dead owner's ring: %v", err)
	}
	defer b2.Close()
	if n, _ := a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64)); n != 1 {
		t.Fatal("write")
	}
	// a had mapped b's old ring, which the successor marked closed.
	if got, _ := b2.ReadBatch(rxPackets(2)); got != 0 {
		t.Fatalf("the successor read %d from a sender that still held the old ring", got)
	}
	a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64))
	if got, _ := b2.ReadBatch(rxPackets(2)); got != 1 {
		t.Fatalf("the successor read %d, want 1", got)
	}
	for _, c := range []ShmConfig{{Slots: 3}, {Slots: -1}, {Slots: 1 << 20}} {
		if _, err := ListenShm(netip.MustParseAddrPort("10.1.0.5:0"), ShmConfig{Dir: dir, Slots: c.Slots}); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("Slots %d: %v, want ErrInvalid", c.Slots, err)
		}
	}
	if _, err := ListenShm(netip.MustParseAddrPort("0.0.0.0:0"), ShmConfig{Dir: dir}); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("unspecified address: %v, want ErrInvalid", err)
	}
}

// What a faulty sender leaves in the ring is refused or skipped: a
// length beyond the slot reads as N -1, and a slot claimed but never
// published stops the ring for no longer than shmStuck.
func TestShmLinkHostileSender(t *testing.T) {
	a, b := shmPair(t, ShmConfig{Slots: 8})
	r := &b.r
	// A slot published with a length beyond any datagram.
	pos, _ := claim(r)
	shm.Put32(r.slot(pos), slotOffLen, 1<<30)
	r.seq(pos).Store(pos + 1)
	// A slot claimed and never published, then a good datagram.
	claim(r)
	a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64))
	in := rxPackets(4)
	if got, _ := b.ReadBatch(in); got != 1 || in[0].N != -1 {
		t.Fatalf("read %d, N %d; want the oversized one as N -1", got, in[0].N)
	}
	start := time.Now()
	for {
		got, _ := b.ReadBatch(in)
		if got == 1 && in[0].N == 64 {
			break
		}
		if got != 0 || time.Since(start) > 5*shmStuck {
			t.Fatalf("read %d (N %d) after %v", got, in[0].N, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := time.Since(start); d < shmStuck {
		t.Fatalf("skipped an unpublished slot after %v, before %v", d, shmStuck)
	}
	// Ring words that never settle read as full, not as a hang.
	r.tail.Store(0)
	r.seq(0).Store(1 << 40)
	if _, ok := claim(r); ok {
		t.Fatal("claimed a slot of a corrupt ring")
	}
}

// WaitRead sleeps until a datagram comes, the deadline passes, the
// context ends or the link closes.
func TestShmLinkWait(t *testing.T) {
	a, b := shmPair(t, ShmConfig{})
	ctx := context.Background()
	start := time.Now()
	if err := b.WaitRead(ctx, time.Now().Add(30*time.Millisecond)); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}
	go func() {
		for b.r.sleep.Load() == 0 { // until WaitRead sleeps
			time.Sleep(time.Millisecond)
		}
		a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64))
	}()
	if err := b.WaitRead(ctx, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.ReadBatch(rxPackets(2)); got != 1 {
		t.Fatalf("woken with %d to read", got)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	if err := b.WaitRead(cctx, time.Time{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- b.WaitRead(ctx, time.Time{}) }()
	for b.r.sleep.Load() == 0 { // until WaitRead sleeps
		time.Sleep(time.Millisecond)
	}
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("WaitRead across Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end WaitRead")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := b.ReadBatch(rxPackets(1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("ReadBatch after Close: %v", err)
	}
	if _, err := b.WriteBatch(shmPackets(a.LocalAddr(), 1, 64)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WriteBatch after Close: %v", err)
	}
}

// shmAddrPair connects two endpoints over ShmLinks, with the TCP exchange
// on loopback.
func shmAddrPair(t testing.TB, query string) (a, b *Endpoint) {
	t.Helper()
	port := freePort(t)
	la, lb := shmAddr(), shmAddr()
	for lb == la {
		lb = shmAddr()
	}
	return fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, s fabrictest.Side) (*Endpoint, error) {
		addr := fmt.Sprintf("listen:127.0.0.1:%d?link=shm&local=%s&%s", port, la, query)
		if s == fabrictest.SideB {
			addr = fmt.Sprintf("127.0.0.1:%d?link=shm&local=%s&%s", port, lb, query)
		}
		ep, err := fabric.Open(ctx, "roce", addr, nil)
		if err != nil {
			return nil, err
		}
		return ep.(*Endpoint), nil
	})
}

func TestConformanceShm(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := shmAddrPair(t, "")
		return a, b
	})
}

// The same cases with the peer in another process: real shared memory
// between two address spaces.
func TestConformanceShmProcesses(t *testing.T) {
	fabrictest.TestProcesses(t, func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint {
		portFile := filepath.Join(os.TempDir(), "weft-roce-shm-ft-"+key)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if side == fabrictest.SideA {
			port := freePort(t)
			os.WriteFile(portFile+".tmp", []byte(strconv.Itoa(port)), 0o600)
			os.Rename(portFile+".tmp", portFile)
			t.Cleanup(func() { os.Remove(portFile) })
			ep, err := fabric.Open(ctx, "roce", fmt.Sprintf("listen:127.0.0.1:%d?link=shm&local=%s", port, shmAddr()), nil)
			if err != nil {
				t.Fatal(err)
			}
			return ep
		}
		var port int
		for {
			b, err := os.ReadFile(portFile)
			if err == nil {
				port, _ = strconv.Atoi(string(b))
				break
			}
			if ctx.Err() != nil {
				t.Fatal("no port file from side A")
			}
			time.Sleep(5 * time.Millisecond)
		}
		ep, err := fabric.Open(ctx, "roce", fmt.Sprintf("127.0.0.1:%d?link=shm&local=%s", port, shmAddr()), nil)
		if err != nil {
			t.Fatal(err)
		}
		return ep
	})
}

// BenchmarkEngineShm is BenchmarkEngine over ShmLinks: the engines of
// one host without the kernel's network stack. Run it beside
// BenchmarkEngine and BenchmarkTCP.
func BenchmarkEngineShm(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := shmAddrPair(b, "mtu=4096&keepalive=0")
		return x, y
	})
}

// FuzzShmRing writes arbitrary bytes over a ring's header and first slot
// and then reads and writes through it: nothing a sender leaves in shared
// memory may crash the reader, and a malformed header is refused.
func FuzzShmRing(f *testing.F) {
	f.Add(uint16(0), []byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(uint16(shmOffSlots), []byte{0, 0, 0, 0x80})
	f.Add(uint16(shmHeader+slotOffLen), []byte{0xff, 0xff, 0, 0})
	f.Add(uint16(shmHeader), []byte{1, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint16(shmOffTail), []byte{5})
	f.Fuzz(func(t *testing.T, off uint16, data []byte) {
		a, b := shmPair(t, ShmConfig{Slots: 2})
		a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64))
		mem := b.mem
		o := int(off) % len(mem)
		copy(mem[o:], data)
		in := rxPackets(4)
		got, _ := b.ReadBatch(in)
		for _, p := range in[:got] {
			if p.N > maxPacket || p.N < -1 {
				t.Fatalf("N %d", p.N)
			}
		}
		a.WriteBatch(shmPackets(b.LocalAddr(), 2, 64))
		b.ReadBatch(in)
		view(mem) // must not panic whatever the header says
	})
}
