package link

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/internal/testenv"
)

// autoRig is an AutoLink and, beside it, a UDP link and a ring of other
// addresses that write to it (and are written to), all rings in a
// directory of the test's.
type autoRig struct {
	a   *AutoLink
	udp *UDPLink // a UDP peer
	shm *ShmLink // a ring peer
}

func newAutoRig(t testing.TB) *autoRig {
	t.Helper()
	dir := t.TempDir()
	addr := shmAddr()
	u, err := ListenUDPConfig(netip.AddrPortFrom(addr, 0), UDPConfig{NoRaw: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ListenShm(u.LocalAddr(), ShmConfig{Dir: dir})
	if err != nil {
		u.Close()
		t.Fatal(err)
	}
	a, err := NewAutoLink(u, s)
	if err != nil {
		u.Close()
		s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	r := &autoRig{a: a}
	peer, ring := shmAddr(), shmAddr()
	for peer == addr || ring == addr || ring == peer {
		peer, ring = shmAddr(), shmAddr()
	}
	if r.udp, err = ListenUDPConfig(netip.AddrPortFrom(peer, 0), UDPConfig{NoRaw: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.udp.Close() })
	if r.shm, err = ListenShm(netip.AddrPortFrom(ring, 0), ShmConfig{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.shm.Close() })
	return r
}

// sendUDP sends n datagrams from the UDP peer to the AutoLink and waits
// until its socket holds them.
func (r *autoRig) sendUDP(t *testing.T, n int) {
	t.Helper()
	pkts := shmPackets(r.a.LocalAddr(), n, 60)
	for i := range pkts {
		// The destination QP (BTH bytes 5-7) in the link's block: its
		// port is steered by QPN.
		binary.BigEndian.PutUint32(pkts[i].Buf[4:], r.a.QPNBlock()<<QPNBlockBits|1)
	}
	if k, err := r.udp.WriteBatch(pkts); k != n || err != nil {
		t.Fatalf("UDP WriteBatch: %d of %d, %v", k, n, err)
	}
	var fd int
	r.a.udp.rc.Control(func(f uintptr) { fd = int(f) })
	if !testenv.Eventually(testenv.Timeout, func() bool {
		var queued int
		queued, _ = unix.IoctlGetInt(fd, unix.SIOCINQ)
		return queued > 0
	}) {
		t.Fatal("the UDP datagrams did not reach the AutoLink's socket")
	}
}

// readUntilUDP calls ReadBatch (bursts of 8) until a datagram from the
// UDP peer comes, and returns how many calls that took (0: none in max).
func (r *autoRig) readUntilUDP(max int) int {
	rx := rxPackets(8)
	for call := 1; call <= max; call++ {
		n, _ := r.a.ReadBatch(rx)
		for i := range n {
			if rx[i].Addr.Addr() == r.udp.LocalAddr().Addr() {
				return call
			}
		}
	}
	return 0
}

// UDP peers do not starve behind a busy ring: with the ring full, a UDP
// datagram is read within autoUDPSkip+1 calls.
func TestAutoLinkBusyRing(t *testing.T) {
	r := newAutoRig(t)
	r.sendUDP(t, 1)
	if k, err := r.shm.WriteBatch(shmPackets(r.a.LocalAddr(), 200, 60)); k != 200 || err != nil {
		t.Fatalf("ring WriteBatch: %d of 200, %v", k, err)
	}
	if calls := r.readUntilUDP(25); calls == 0 || calls > autoUDPSkip+1 {
		t.Fatalf("the UDP datagram came after %d reads of a busy ring (0: not in 25), want at most %d", calls, autoUDPSkip+1)
	}
}

// A poll that finds the ring empty reads UDP (ReadBatch's 0 means both
// are empty), and so does the first poll after a wait, whatever is in the
// ring.
func TestAutoLinkReadsUDP(t *testing.T) {
	r := newAutoRig(t)
	rx := rxPackets(8)
	for range 2 * autoUDPSkip {
		if n, err := r.a.ReadBatch(rx); n != 0 || err != nil {
			t.Fatalf("ReadBatch of an idle link: %d, %v", n, err)
		}
	}
	r.sendUDP(t, 1)
	if calls := r.readUntilUDP(1); calls != 1 {
		t.Fatal("a poll of an empty ring did not read the UDP datagram waiting")
	}
	// Take the busy ring's turns, then wait: UDP comes first after it.
	if k, err := r.shm.WriteBatch(shmPackets(r.a.LocalAddr(), 100, 60)); k != 100 || err != nil {
		t.Fatalf("ring WriteBatch: %d of 100, %v", k, err)
	}
	for range autoUDPSkip - 1 {
		r.a.ReadBatch(rx)
	}
	r.sendUDP(t, 1)
	if err := r.a.WaitRead(testenv.Context(t), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.a.ReadBatch(rx); n == 0 || rx[0].Addr.Addr() != r.udp.LocalAddr().Addr() {
		t.Fatal("the first poll after a wait did not read UDP first")
	}
}

// Each packet goes out through the carrier its Shm field names.
func TestAutoLinkWrite(t *testing.T) {
	r := newAutoRig(t)
	out := shmPackets(r.udp.LocalAddr(), 3, 60)
	out[0].Addr, out[0].Shm = r.shm.LocalAddr(), true
	out[2].Addr, out[2].Shm = r.shm.LocalAddr(), true
	binary.BigEndian.PutUint32(out[1].Buf[4:], r.udp.QPNBlock()<<QPNBlockBits|1) // steered by QPN
	if n, err := r.a.WriteBatch(out); n != 3 || err != nil {
		t.Fatalf("WriteBatch: %d, %v", n, err)
	}
	rx := rxPackets(4)
	if n, _ := r.shm.ReadBatch(rx); n != 2 || rx[0].SrcPort != out[0].SrcPort || rx[1].SrcPort != out[2].SrcPort {
		t.Fatalf("the ring peer read %d datagrams, want the 2 marked Shm", n)
	}
	// (A UDPLink's WaitRead waits for datagrams that arrive after it
	// starts: the caller has read the socket empty before.)
	n := 0
	testenv.Eventually(testenv.Timeout, func() bool {
		k, _ := r.udp.ReadBatch(rx[n:])
		n += k
		return n > 0
	})
	if n != 1 || rx[0].SrcPort != out[1].SrcPort {
		t.Fatalf("the UDP peer read %d datagrams, want the 1 not marked", n)
	}
	if c := r.a.Counts(); c.ShmTx != 2 {
		t.Fatalf("Counts().ShmTx = %d, want 2", c.ShmTx)
	}
}

// WaitRead ends at its deadline, when its context ends, and with
// os.ErrClosed when the link closes under it; Close is idempotent.
func TestAutoLinkWait(t *testing.T) {
	r := newAutoRig(t)
	if err := r.a.WaitRead(context.Background(), time.Now().Add(time.Millisecond)); err != nil {
		t.Fatalf("WaitRead to a deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	parks := r.a.Counts().Parks
	go func() { done <- r.a.WaitRead(ctx, time.Time{}) }()
	if !testenv.Eventually(testenv.Timeout, func() bool { return r.a.Counts().Parks > parks }) {
		t.Fatal("WaitRead did not park")
	}
	cancel()
	if err := testenv.Recv(t, done, "WaitRead after its context was cancelled"); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitRead after cancel: %v, want context.Canceled", err)
	}
	parks = r.a.Counts().Parks
	go func() { done <- r.a.WaitRead(context.Background(), time.Time{}) }()
	if !testenv.Eventually(testenv.Timeout, func() bool { return r.a.Counts().Parks > parks }) {
		t.Fatal("WaitRead did not park")
	}
	err1 := r.a.Close()
	if err := testenv.Recv(t, done, "WaitRead after Close"); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WaitRead after Close: %v, want os.ErrClosed", err)
	}
	if err2 := r.a.Close(); err2 != err1 {
		t.Fatalf("a second Close returned %v, the first %v", err2, err1)
	}
	if err := r.a.WaitRead(context.Background(), time.Time{}); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WaitRead on a closed link: %v", err)
	}
}

// An AutoLink whose ring has no bell (no pipe could be made) waits as
// UDP does, looking at the ring between; once closed, its WaitRead
// reports os.ErrClosed without looking at the ring, whose mapping Close
// has removed (the engine's loop may wait once more after Close).
func TestAutoLinkNoBellClosed(t *testing.T) {
	u, err := ListenUDPConfig(netip.AddrPortFrom(shmAddr(), 0), UDPConfig{NoRaw: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ListenShm(u.LocalAddr(), ShmConfig{Dir: t.TempDir()})
	if err != nil {
		u.Close()
		t.Fatal(err)
	}
	s.bell.Close()
	s.bell = nil
	a, err := NewAutoLink(u, s)
	if err != nil {
		u.Close()
		s.Close()
		t.Fatal(err)
	}
	if err := a.WaitRead(context.Background(), time.Now().Add(time.Millisecond)); err != nil {
		t.Fatalf("WaitRead to a deadline: %v", err)
	}
	a.Close()
	if err := a.WaitRead(context.Background(), time.Now().Add(time.Millisecond)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WaitRead on a closed link: %v, want os.ErrClosed", err)
	}
}

// An idle link's polls make no receive on its UDP socket: its readiness
// answers that it is empty (TestAutoLinkReadsUDP: exactly).
func TestAutoLinkIdleNoReceive(t *testing.T) {
	r := newAutoRig(t)
	rx := rxPackets(8)
	c0 := r.a.Counts()
	for range 10 {
		if n, err := r.a.ReadBatch(rx); n != 0 || err != nil {
			t.Fatalf("ReadBatch of an idle link: %d, %v", n, err)
		}
	}
	if c := r.a.Counts(); c.UDPSkips-c0.UDPSkips != 10 {
		t.Fatalf("10 polls of an idle link: %d answered by the socket's readiness, want 10", c.UDPSkips-c0.UDPSkips)
	}
}

// BenchmarkAutoLinkIdleRead is an idle automatic link's poll: its ring
// and its UDP socket both empty (an engine's usual poll while it spins).
func BenchmarkAutoLinkIdleRead(b *testing.B) {
	r := newAutoRig(b)
	rx := rxPackets(64)
	for b.Loop() {
		if n, _ := r.a.ReadBatch(rx); n != 0 {
			b.Fatal(n)
		}
	}
}
