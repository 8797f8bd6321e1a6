package ntb

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/testenv"
)

func openPair(t *testing.T, c ShmConfig) (a, b *ShmDevice) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dev")
	a, err := OpenShm(path, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = OpenShm(path, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

func waitLink(t *testing.T, d *ShmDevice, up bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for d.LinkIsUp() != up {
		if time.Now().After(deadline) {
			t.Fatalf("link did not go %v", map[bool]string{true: "up", false: "down"}[up])
		}
		time.Sleep(time.Millisecond)
	}
}

func TestShmSidesAndBusy(t *testing.T) {
	a, b := openPair(t, ShmConfig{MemSize: 1 << 20})
	if a.Side() == b.Side() {
		t.Fatalf("both devices took side %d", a.Side())
	}
	if _, err := OpenShm(a.Path(), ShmConfig{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("third open: %v, want ErrBusy", err)
	}
	// The creator's geometry wins.
	if len(a.Memory()) != 1<<20 || len(b.Memory()) != 1<<20 {
		t.Fatalf("memory sizes %d, %d", len(a.Memory()), len(b.Memory()))
	}
	waitLink(t, a, true)
	waitLink(t, b, true)
	if err := b.LinkDisable(); err != nil {
		t.Fatal(err)
	}
	waitLink(t, a, false)
	b.LinkEnable()
	waitLink(t, a, true)
	b.Close()
	waitLink(t, a, false)
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := b.LinkEnable(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("LinkEnable after Close: %v", err)
	}
	// The freed side can be taken again.
	c, err := OpenShm(a.Path(), ShmConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitLink(t, a, true)
}

func TestShmNotABridge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(path, make([]byte, 8192), 0o600)
	if _, err := OpenShm(path, ShmConfig{}); err == nil {
		t.Fatal("opened a file of zeros as a bridge")
	}
	if _, err := OpenShm(filepath.Join(t.TempDir(), "x"), ShmConfig{MemSize: 1000}); err == nil {
		t.Fatal("accepted a memory size that is not a multiple of 4096")
	}
}

func TestShmMemoryWindows(t *testing.T) {
	a, b := openPair(t, ShmConfig{MemSize: 1 << 20})
	aa, sa, max, err := a.MWGetAlign(0)
	if err != nil || aa != 4096 || sa != 4096 || max != 1<<20 {
		t.Fatalf("MWGetAlign = %d %d %d %v", aa, sa, max, err)
	}
	if _, _, _, err := a.MWGetAlign(a.MWCount()); err == nil {
		t.Fatal("MWGetAlign accepted an index past MWCount")
	}
	if _, err := b.PeerMW(0); err == nil {
		t.Fatal("PeerMW succeeded before the peer set a translation")
	}
	for _, bad := range [][2]uint64{{1, 4096}, {0, 100}, {0, 0}, {4096, 1 << 20}, {1 << 21, 4096}} {
		if err := a.MWSetTrans(0, bad[0], bad[1]); err == nil {
			t.Errorf("MWSetTrans(%#x, %#x) accepted", bad[0], bad[1])
		}
	}
	if err := a.MWSetTrans(1, 8192, 16384); err != nil {
		t.Fatal(err)
	}
	w, err := b.PeerMW(1)
	if err != nil || len(w) != 16384 {
		t.Fatalf("PeerMW = %d bytes, %v", len(w), err)
	}
	// A store through the outbound window lands at the translation.
	copy(w[10:], "through the bridge")
	if got := string(a.Memory()[8192+10 : 8192+28]); got != "through the bridge" {
		t.Fatalf("translated memory holds %q", got)
	}
	a.MWClearTrans(1)
	if _, err := b.PeerMW(1); err == nil {
		t.Fatal("PeerMW succeeded after the translation was cleared")
	}
}

func TestShmDoorbellsAndScratchpads(t *testing.T) {
	a, b := openPair(t, ShmConfig{DoorbellBits: 8})
	if a.DBValidMask() != 0xff {
		t.Fatalf("valid mask %#x", a.DBValidMask())
	}
	if err := a.PeerDBSet(1 << 8); err == nil {
		t.Fatal("rang an invalid doorbell bit")
	}
	a.PeerDBSet(0b101)
	if got := b.DBRead(); got != 0b101 {
		t.Fatalf("DBRead = %#b", got)
	}
	b.DBClear(0b1)
	if got := b.DBRead(); got != 0b100 {
		t.Fatalf("after clear: %#b", got)
	}
	// A masked bit latches but does not wake DBWait.
	b.DBSetMask(0b10)
	a.PeerDBSet(0b10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	var got uint64
	var err error
	for got == 0 && err == nil { // (0, nil) is a WakeLocal, e.g. the link coming up
		got, err = b.DBWait(ctx, 0b10)
	}
	cancel()
	if got != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DBWait on a masked bit = %#b, %v", got, err)
	}
	b.DBClearMask(0b10)
	if got, err := b.DBWait(testenv.Context(t), 0b10); got != 0b10 || err != nil {
		t.Fatalf("DBWait after unmask = %#b, %v", got, err)
	}
	// A sleeping waiter is woken by the peer's doorbell.
	b.DBClear(0xff)
	woke := make(chan uint64)
	go func() {
		for {
			got, _ := b.DBWait(context.Background(), 0b1000)
			if got != 0 {
				woke <- got
				return
			}
		}
	}()
	if !testenv.Eventually(testenv.Timeout, func() bool { return shm.U32(b.my, sideDBWaiters).Load() != 0 }) { // until the waiter sleeps
		t.Fatal("timed out waiting for the DBWait to sleep")
	}
	a.PeerDBSet(0b1000)
	select {
	case got := <-woke:
		if got != 0b1000 {
			t.Fatalf("woke with %#b", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("DBWait was not woken")
	}
	// Scratchpads: a peer write is a local read, and the reverse.
	a.PeerSpadWrite(3, 0xdeadbeef)
	if v, _ := b.SpadRead(3); v != 0xdeadbeef {
		t.Fatalf("SpadRead = %#x", v)
	}
	b.SpadWrite(4, 42)
	if v, _ := a.PeerSpadRead(4); v != 42 {
		t.Fatalf("PeerSpadRead = %d", v)
	}
	if _, err := a.SpadRead(a.SpadCount()); err == nil {
		t.Fatal("SpadRead past SpadCount")
	}
	if err := a.PeerSpadWrite(-1, 0); err == nil {
		t.Fatal("PeerSpadWrite(-1)")
	}
}

// nextLinkEvent waits for a's next link event.
func nextLinkEvent(t *testing.T, d *ShmDevice, what string) LinkEvent {
	t.Helper()
	select {
	case ev := <-d.LinkEvents():
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no link event within 10 s: waited for %s", what)
		return LinkEvent{}
	}
}

// TestShmLinkEvents: the first event is the peer coming up (no down edge
// before it), its leaving is a down edge, and a restart between two polls
// (a new incarnation with the link still up) is a down edge for the old
// incarnation, then an up edge for the new one.
func TestShmLinkEvents(t *testing.T) {
	a, b := openPair(t, ShmConfig{MemSize: 1 << 20})
	inc := shm.U32(b.my, sideIncarn)
	if ev := nextLinkEvent(t, a, "the peer to come up"); !ev.Up || ev.PeerIncarnation != inc.Load() {
		t.Fatalf("first event %+v, want up with incarnation %#x", ev, inc.Load())
	}
	if err := b.LinkDisable(); err != nil {
		t.Fatal(err)
	}
	if ev := nextLinkEvent(t, a, "the peer to go down"); ev.Up {
		t.Fatalf("after the peer's LinkDisable: %+v, want down", ev)
	}
	b.LinkEnable()
	if ev := nextLinkEvent(t, a, "the peer to come back"); !ev.Up {
		t.Fatalf("after the peer's LinkEnable: %+v, want up", ev)
	}
	old := inc.Load()
	inc.Store(old + 2)
	if ev := nextLinkEvent(t, a, "the restart's down edge"); ev.Up || ev.PeerIncarnation != old {
		t.Fatalf("after a restart between polls: %+v, want down for incarnation %#x", ev, old)
	}
	if ev := nextLinkEvent(t, a, "the restart's up edge"); !ev.Up || ev.PeerIncarnation != old+2 || a.PeerIncarnation() != old+2 {
		t.Fatalf("after a restart between polls: %+v, want up for incarnation %#x", ev, old+2)
	}
	// The last scratchpad and the last doorbell bit are there; one past
	// each is refused.
	n := a.SpadCount()
	if err := a.PeerSpadWrite(n-1, 7); err != nil {
		t.Fatalf("PeerSpadWrite(%d), the last scratchpad: %v", n-1, err)
	}
	if v, err := b.SpadRead(n - 1); err != nil || v != 7 {
		t.Fatalf("SpadRead(%d) = %d, %v", n-1, v, err)
	}
	for _, i := range []int{n, -1} {
		if err := a.SpadWrite(i, 1); err == nil {
			t.Errorf("SpadWrite(%d) of %d scratchpads", i, n)
		}
		if _, err := a.PeerSpadRead(i); err == nil {
			t.Errorf("PeerSpadRead(%d) of %d scratchpads", i, n)
		}
	}
}
