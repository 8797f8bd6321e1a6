package link

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/testenv"
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
		pkts[i].Buf = make([]byte, MaxPacket+128)
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
		os.WriteFile(shmPath(dir, bad), content, 0o600)
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
	if _, err := os.Stat(shmPath(dir, baddr)); !errors.Is(err, os.ErrNotExist) {
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
// descriptors go (and with them its lock), its files stay.
func die(l *ShmLink) {
	l.closed.Store(true) // its Close, at the test's end, then does nothing
	unix.Munmap(l.mem)
	for _, p := range l.peers {
		unix.Munmap(p.mem)
		p.f.Close()
		p.bell.Close()
	}
	l.f.Close()
	if l.bell != nil {
		// Closing the bell removes its pipe; a dead process leaves one
		// that nobody reads.
		l.bell.Close()
		unix.Mkfifo(shmBellPath(shmPath(l.cfg.Dir, l.local)), 0o600)
	}
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
	ctx := testenv.Context(t)
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
		t.Fatalf("WaitRead for a datagram: %v", err)
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
	if !testenv.Eventually(testenv.Timeout, func() bool { return b.r.sleep.Load() != 0 }) { // until WaitRead sleeps
		t.Fatal("timed out waiting for WaitRead to sleep")
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
	if _, err := os.Lstat(shmBellPath(shmPath(b.cfg.Dir, b.LocalAddr()))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left its bell: %v", err)
	}
	if _, err := b.ReadBatch(rxPackets(1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("ReadBatch after Close: %v", err)
	}
	if _, err := b.WriteBatch(shmPackets(a.LocalAddr(), 1, 64)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WriteBatch after Close: %v", err)
	}
}

// A link whose bell cannot be made (its path is taken by a directory)
// polls its ring: what a sender writes without being able to ring it is
// read, and cancellation and Close still end WaitRead. A datagram no bell
// announces (an earlier version's sender, which rang a futex) is found
// within a link's slice.
func TestShmLinkNoBell(t *testing.T) {
	dir := t.TempDir()
	addr := netip.MustParseAddrPort("10.1.0.3:4791")
	if err := os.Mkdir(shmBellPath(shmPath(dir, addr)), 0o700); err != nil {
		t.Fatal(err)
	}
	a, _ := shmPair(t, ShmConfig{Dir: dir})
	b, err := ListenShm(addr, ShmConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.bell != nil {
		t.Fatal("a bell over a directory")
	}
	ctx := testenv.Context(t)
	in := rxPackets(4)
	for i := range 3 {
		done := make(chan error, 1)
		go func() { done <- b.WaitRead(ctx, time.Time{}) }()
		// Ring a bell that does not exist as if b slept (b polls and does
		// not announce itself); the datagram must arrive all the same.
		b.r.sleep.Add(1)
		if n, err := a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64)); n != 1 || err != nil {
			t.Fatalf("WriteBatch: %d, %v", n, err)
		}
		b.r.sleep.Add(^uint32(0))
		if err := testenv.Recv(t, done, "the WaitRead a datagram ends"); err != nil {
			t.Fatal(err)
		}
		if got, _ := b.ReadBatch(in); got != 1 {
			t.Fatalf("round %d: read %d", i, got)
		}
		if a.peers[b.LocalAddr()].mute.IsZero() {
			t.Fatal("a ring that found no reader did not mute the bell")
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.WaitRead(cctx, time.Time{}) }()
	cancel()
	if err := testenv.Recv(t, done, "the WaitRead a cancel ends"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	go func() { done <- b.WaitRead(ctx, time.Time{}) }()
	b.Close()
	if err := testenv.Recv(t, done, "the WaitRead a Close ends"); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WaitRead across Close: %v", err)
	}

	// An unannounced datagram, and a link that parks on its bell.
	c, d := shmPair(t, ShmConfig{Dir: t.TempDir()})
	d.slice = 5 * time.Millisecond
	go func() { done <- d.WaitRead(ctx, time.Time{}) }()
	if !testenv.Eventually(testenv.Timeout, func() bool { return d.r.sleep.Load() != 0 }) { // until WaitRead sleeps
		t.Fatal("timed out waiting for WaitRead to sleep")
	}
	pos, _ := claim(&d.r)
	shm.Put32(d.r.slot(pos), slotOffLen, 64)
	shm.Put32(d.r.slot(pos), slotOffPort, uint32(c.LocalAddr().Port()))
	d.r.seq(pos).Store(pos + 1)
	if err := testenv.Recv(t, done, "the WaitRead an unannounced datagram ends"); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.ReadBatch(in); got != 1 {
		t.Fatalf("read %d unannounced datagrams", got)
	}
}

// Links whose WaitRead sleeps hold no OS thread each: they park in the
// netpoller, not in a system call.
func TestShmLinkIdleThreads(t *testing.T) {
	const n = 100
	dir := t.TempDir()
	links := make([]*ShmLink, n)
	for i := range links {
		l, err := ListenShm(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 0), ShmConfig{Dir: dir, Slots: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		links[i] = l
	}
	before := testenv.Threads(t)
	done := make(chan error, n)
	for _, l := range links {
		go func() { done <- l.WaitRead(context.Background(), time.Time{}) }()
	}
	for _, l := range links {
		if !testenv.Eventually(testenv.Timeout, func() bool { return l.r.sleep.Load() != 0 }) { // until its WaitRead sleeps
			t.Fatal("timed out waiting for a link's WaitRead to sleep")
		}
	}
	got := testenv.Threads(t)
	t.Logf("%d sleeping links: %d threads, %d before", n, got, before)
	if got > before+n/2 {
		t.Errorf("%d sleeping links hold %d threads (%d before)", n, got, before)
	}
	for _, l := range links {
		l.Close()
	}
	for range n {
		if err := testenv.Recv(t, done, "the WaitReads a Close ends"); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("WaitRead across Close: %v", err)
		}
	}
}

// shmWakeEnv names the directory of TestShmLinkWakeProcesses's rings in
// its second process.
const shmWakeEnv = "WEFT_SHM_WAKE_DIR"

var shmWakeA, shmWakeB = netip.MustParseAddrPort("10.1.0.1:4791"), netip.MustParseAddrPort("10.1.0.2:4791")

// shmWakeRounds is TestShmLinkWakeProcesses's number of round trips.
func shmWakeRounds() int {
	if testing.Short() {
		return 10000
	}
	return 100000
}

// A ping-pong between two processes in which both sides sleep in
// WaitRead whenever they wait, with no deadline and no slice: every
// wake-up is a ring of the bell, and a lost one stalls the test until
// its context's bound (testenv.Timeout) fails it.
func TestShmLinkWakeProcesses(t *testing.T) {
	if dir := os.Getenv(shmWakeEnv); dir != "" {
		shmWakeChild(t, dir)
		return
	}
	dir := t.TempDir()
	a, err := ListenShm(shmWakeA, ShmConfig{Dir: dir, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.slice = 0
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmLinkWakeProcesses$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), shmWakeEnv+"="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // should this process die hung
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var berr error
	go func() {
		berr = cmd.Wait()
		close(exited)
		cancel() // a WaitRead for a side that is gone ends
	}()
	defer func() {
		cmd.Process.Kill() // if it still runs
		<-exited
	}()
	rounds := shmWakeRounds()
	in := rxPackets(8)
	out1 := shmPackets(shmWakeB, 1, 8)
	// recv reads the datagram numbered want, sleeping until it comes.
	recv := func(want uint64) {
		t.Helper()
		for {
			n, err := a.ReadBatch(in[:1])
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				if got := binary.LittleEndian.Uint64(in[0].Buf); in[0].N != 8 || got != want {
					t.Fatalf("received %d (%d bytes), want %d", got, in[0].N, want)
				}
				return
			}
			if err := a.WaitRead(ctx, time.Time{}); err != nil {
				t.Fatalf("waiting for %d: %v; side B: %s", want, err, out.String())
			}
		}
	}
	recv(0) // side B listens
	for i := uint64(1); i <= uint64(rounds); i++ {
		binary.LittleEndian.PutUint64(out1[0].Buf, i)
		if n, err := a.WriteBatch(out1); n != 1 || err != nil {
			t.Fatalf("WriteBatch %d: %d, %v", i, n, err)
		}
		recv(i)
	}
	testenv.Recv(t, exited, "side B's exit")
	if berr != nil {
		t.Fatalf("side B: %v\n%s", berr, out.String())
	}
	b := "side B's parks not found"
	if _, after, ok := strings.Cut(out.String(), "side B parked"); ok {
		b, _, _ = strings.Cut(after, "\n")
		b = "side B parked" + b
	}
	t.Logf("%d round trips, this side parked %d times, %s", rounds, a.parks.Load(), b)
	if a.Drops() != 0 {
		t.Fatalf("%d drops", a.Drops())
	}
}

// shmWakeChild is side B of TestShmLinkWakeProcesses: it answers every
// datagram with the same, sleeping in WaitRead between them.
func shmWakeChild(t *testing.T, dir string) {
	b, err := ListenShm(shmWakeB, ShmConfig{Dir: dir, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.slice = 0
	reply := shmPackets(shmWakeA, 1, 8)
	binary.LittleEndian.PutUint64(reply[0].Buf, 0) // datagram 0: listening
	if n, err := b.WriteBatch(reply); n != 1 || err != nil {
		t.Fatalf("hello: %d, %v", n, err)
	}
	in := rxPackets(8)
	for i := uint64(1); i <= uint64(shmWakeRounds()); {
		n, err := b.ReadBatch(in)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if err := b.WaitRead(context.Background(), time.Time{}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for _, p := range in[:n] {
			if got := binary.LittleEndian.Uint64(p.Buf); p.N != 8 || got != i {
				t.Fatalf("received %d (%d bytes), want %d", got, p.N, i)
			}
			copy(reply[0].Buf, p.Buf[:8])
			if n, err := b.WriteBatch(reply); n != 1 || err != nil {
				t.Fatalf("WriteBatch %d: %d, %v", i, n, err)
			}
			i++
		}
	}
	t.Logf("side B parked %d times", b.parks.Load())
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
			if p.N > MaxPacket || p.N < -1 {
				t.Fatalf("N %d", p.N)
			}
		}
		a.WriteBatch(shmPackets(b.LocalAddr(), 2, 64))
		b.ReadBatch(in)
		view(mem) // must not panic whatever the header says
	})
}

// A peer that closed and removed its ring is let go: the sender unmaps
// the old ring, whose memory (up to 4.5 MB of the host's shared memory,
// the file being gone) would otherwise stay with every engine that ever
// sent to it, and still counts what it sends there as dropped.
func TestShmLinkReleasesGonePeer(t *testing.T) {
	a, b := shmPair(t, ShmConfig{})
	baddr := b.LocalAddr()
	if n, _ := a.WriteBatch(shmPackets(baddr, 1, 64)); n != 1 || a.Drops() != 0 {
		t.Fatalf("to a live ring: %d, %d drops", n, a.Drops())
	}
	b.Close()
	for i := range 2 { // the first finds the ring closed, the second its file gone
		if n, _ := a.WriteBatch(shmPackets(baddr, 1, 64)); n != 1 || a.Drops() != uint64(i+1) {
			t.Fatalf("to a closed ring: %d, %d drops", n, a.Drops())
		}
	}
	if a.reaches(baddr) {
		t.Fatal("a closed ring reaches its owner")
	}
	a.wmu.Lock()
	n := len(a.peers)
	a.wmu.Unlock()
	if n != 0 {
		t.Fatalf("the sender still maps %d rings, one of an owner that closed and removed it", n)
	}
}

// Of two links that start at one address at the same moment (two
// processes sharing an address, started together), one takes the ring
// and the other is refused: neither may believe it owns a ring file that
// the other's replaced, which its peers' datagrams would never reach.
func TestShmLinkStartTogether(t *testing.T) {
	dir := t.TempDir()
	addr := netip.MustParseAddrPort("10.1.0.7:4791")
	var second *ShmLink
	var secondErr error
	shmTakeHook = func(bool) {
		shmTakeHook = nil // the second runs its whole ListenShm here
		second, secondErr = ListenShm(addr, ShmConfig{Dir: dir})
	}
	t.Cleanup(func() { shmTakeHook = nil })
	first, err := ListenShm(addr, ShmConfig{Dir: dir})
	if secondErr != nil {
		t.Fatalf("the link that started second, and took the address first: %v", secondErr)
	}
	defer second.Close()
	if err == nil {
		first.Close()
		t.Fatal("both links at one address believe they own its ring")
	}
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("the link that lost the address: %v, want EADDRINUSE", err)
	}
	// The winner's ring is the address's: a sender reaches it.
	a, err := ListenShm(netip.MustParseAddrPort("10.1.0.8:4791"), ShmConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if n, _ := a.WriteBatch(shmPackets(addr, 1, 64)); n != 1 {
		t.Fatal("write")
	}
	if got, _ := second.ReadBatch(rxPackets(2)); got != 1 {
		t.Fatalf("the owner read %d of 1", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 4 { // two rings, two bells
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the directory holds %q, want two rings and their bells", names)
	}
}

// Of two links that take over a dead owner's ring at the same moment, one
// owns it and the other is refused.
func TestShmLinkTakeOverTogether(t *testing.T) {
	dir := t.TempDir()
	addr := netip.MustParseAddrPort("10.1.0.7:4791")
	dead, err := ListenShm(addr, ShmConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	die(dead)
	var second *ShmLink
	var secondErr error
	shmTakeHook = func(takeover bool) {
		if takeover { // the first is replacing the dead file: the second starts
			shmTakeHook = nil
			second, secondErr = ListenShm(addr, ShmConfig{Dir: dir})
		}
	}
	t.Cleanup(func() { shmTakeHook = nil })
	first, err := ListenShm(addr, ShmConfig{Dir: dir})
	if err != nil {
		t.Fatalf("the first successor: %v", err)
	}
	defer first.Close()
	if secondErr == nil {
		second.Close()
		t.Fatal("two successors both believe they own the ring")
	}
	if !errors.Is(secondErr, unix.EADDRINUSE) {
		t.Fatalf("the second successor: %v, want EADDRINUSE", secondErr)
	}
}

// TestShmLinkVersion1Refused: a ring of version 1, whose producers do
// not count themselves into slots (so one stalled past the consumer's
// skip could write unseen into an unsealed datagram), is not reached:
// link=auto then joins the two engines over UDP.
func TestShmLinkVersion1Refused(t *testing.T) {
	a, b := shmPair(t, ShmConfig{})
	shm.Put32(b.mem, shmOffVersion, 1) // b's ring, as an engine of version 1 makes it
	if a.reaches(b.LocalAddr()) {
		t.Fatal("a ring of version 1 is reached")
	}
	if n, _ := a.WriteBatch(shmPackets(b.LocalAddr(), 1, 64)); n != 0 && a.Drops() == 0 {
		t.Fatal("a datagram went into a ring of version 1")
	}
}
