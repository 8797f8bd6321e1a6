package ntb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/testenv"
)

const helperEnv = "WEFT_NTB_HELPER_PATH"

// TestHelperProcess is side B for the multi-process tests: it opens the
// bridge, echoes messages, and waits to be killed.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv(helperEnv)
	if path == "" {
		t.Skip("helper process for other tests")
	}
	ctx := context.Background()
	ep, err := DialShm(ctx, path, ShmConfig{}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := ep.Alloc(4096, fabric.AccessLocalWrite)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	for {
		msgs[0].SGEs[0].Length = 4096
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			os.Exit(3)
		}
		msgs[0].SGEs[0].Length = msgs[0].Len
		ep.SendWait(ctx, msgs)
	}
}

func startHelper(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func echo(t *testing.T, ep fabric.Endpoint, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf, _ := ep.Alloc(4096, fabric.AccessLocalWrite)
	defer buf.Close()
	n := copy(buf.Bytes(), payload)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: n}}}}
	if _, err := ep.SendWait(ctx, msgs); err != nil {
		t.Fatalf("send: %v", err)
	}
	msgs[0].SGEs[0].Length = 4096
	if _, err := ep.RecvWait(ctx, msgs); err != nil {
		t.Fatalf("recv: %v", err)
	}
	if got := string(buf.Bytes()[:msgs[0].Len]); got != payload {
		t.Fatalf("echo %q, want %q", got, payload)
	}
}

func waitEvent(t *testing.T, ep fabric.Endpoint, kind fabric.EventKind) fabric.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-ep.Events():
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event", kind)
		}
	}
}

// TestPeerDeathAndRestart kills the peer process with SIGKILL: the link
// must be seen down, with ErrPeerGone, and a new peer process must be able
// to attach and renegotiate with the surviving side. The design bound for
// noticing the death is a few milliseconds (see below), but this is a
// correctness test, not a timed one: it fails only past 2 s, and logs the
// delay it saw.
func TestPeerDeathAndRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	cmd := startHelper(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ep, err := DialShm(ctx, path, ShmConfig{}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	echo(t, ep, "before the crash")
	for len(ep.Events()) > 0 {
		<-ep.Events()
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	ev := waitEvent(t, ep, fabric.EventLinkDown)
	took := ev.Time.Sub(killed)
	t.Logf("SIGKILL to link-down event: %v", took)
	// The design bound is the 2 ms link poll plus the kernel's teardown of
	// the dead process (typically 5-15 ms here, see the closing note of
	// issue 2); the assertion is loose because CI machines are shared.
	if took > 2*time.Second {
		t.Errorf("peer death detected after %v", took)
	}
	if !errors.Is(ev.Err, fabric.ErrPeerGone) {
		t.Errorf("link-down event error %v", ev.Err)
	}
	one := []fabric.Message{{}}
	if _, err := ep.Send(one); !errors.Is(err, fabric.ErrPeerGone) {
		t.Errorf("Send with the peer dead: %v, want ErrPeerGone", err)
	}
	cmd.Wait()

	// A new process attaches; the survivor renegotiates.
	startHelper(t, path)
	waitEvent(t, ep, fabric.EventLinkUp)
	echo(t, ep, "after the restart")
}

// TestSurvivorRestart restarts the other side within one process: close
// and reopen side B while A stays up, several times.
func TestSurvivorRestart(t *testing.T) {
	a, b := pair(t, ShmConfig{}, Config{})
	path := b.t.dev.(*ShmDevice).Path()
	go echoLoop(b)
	echo(t, a, "first")
	for i := 0; i < 3; i++ {
		b.Close()
		waitEvent(t, a, fabric.EventLinkDown)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nb, err := DialShm(ctx, path, ShmConfig{}, Config{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		b = nb
		defer b.Close()
		go echoLoop(b)
		waitEvent(t, a, fabric.EventLinkUp)
		echo(t, a, "again")
	}
}

func echoLoop(ep *Endpoint) {
	ctx := context.Background()
	buf, err := ep.Alloc(4096, fabric.AccessLocalWrite)
	if err != nil {
		return
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	for {
		msgs[0].SGEs[0].Length = 4096
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			return
		}
		msgs[0].SGEs[0].Length = msgs[0].Len
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			return
		}
	}
}

// TestHostilePeer has side B write garbage where A reads: ring headers,
// consumer positions, region table entries. A must drop and count, report
// an error event, never panic or touch memory outside its windows, and
// recover by renegotiating.
func TestHostilePeer(t *testing.T) {
	// small is a session whose messages are at most 2048 bytes: a
	// 3000-byte record fits in its ring and in A's 4096-byte buffer, so
	// only the MaxMsgSize check stands in its way.
	small := Config{MaxMsgSize: 2048}
	cases := []struct {
		name string
		cfg  Config
		harm func(b *Endpoint)
		// trigger makes A read the garbage.
		trigger func(a *Endpoint) error
	}{
		{"HugeLength", Config{}, func(b *Endpoint) { forgeRecord(b, 1<<30, 0) }, recvOnce},
		{"LengthPastRingEnd", Config{}, func(b *Endpoint) { forgeRecord(b, len(b.txRing)-8, 0) }, recvOnce},
		{"OverMaxMsgSize", small, func(b *Endpoint) { forgeRecord(b, 3000, 0) }, recvOnce},
		{"OverMaxMsgSizeViews", small, func(b *Endpoint) { forgeRecord(b, 3000, 0) }, recvViewsOnce},
		{"BadFlags", Config{}, func(b *Endpoint) { forgeRecord(b, 10, 0x80) }, recvOnce},
		{"BadPadding", Config{}, func(b *Endpoint) { forgeRecord(b, 100, recFlagPad) }, recvOnce},
		{"WrongSequence", Config{}, func(b *Endpoint) { shm.U32(b.txRing, 0).Store(0x12345678) }, recvOnce},
		{"ConsumerPastProducer", Config{}, func(b *Endpoint) { b.rxHeadP.Store(1 << 40) }, fillSend},
		{"ConsumerBackwards", Config{}, func(b *Endpoint) { b.rxHeadP.Store(^uint64(0)) }, fillSend},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, ShmConfig{}, c.cfg)
			b.txMu.Lock()
			b.rxMu.Lock()
			c.harm(b)
			b.rxMu.Unlock()
			b.txMu.Unlock()
			err := c.trigger(a)
			if !errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("reading the garbage: %v, want an error matching ErrMalformed", err)
			}
			if d := a.Stats().Drops[fabric.DropMalformed]; d == 0 {
				t.Errorf("malformed input not counted")
			}
			waitEvent(t, a, fabric.EventError)
			// The session renegotiates and works again.
			waitEvent(t, a, fabric.EventLinkDown)
			waitEvent(t, a, fabric.EventLinkUp)
			// B finishes its side of the handshake a moment later.
			for deadline := time.Now().Add(10 * time.Second); !b.t.Up(); {
				if time.Now().After(deadline) {
					t.Fatal("B did not come back up")
				}
				time.Sleep(time.Millisecond)
			}
			go echoLoop(b)
			echo(t, a, "recovered")
		})
	}
}

// forgeRecord writes a record with a valid sequence word at B's send
// position, bypassing Send's checks.
func forgeRecord(b *Endpoint, n int, flags uint32) {
	off := int(b.txTail % uint64(len(b.txRing)))
	shm.Put32(b.txRing, off+4, uint32(n))
	shm.Put32(b.txRing, off+12, flags)
	shm.U32(b.txRing, off).Store(seqOf(b.txTail, b.txSalt))
}

func recvOnce(a *Endpoint) error {
	buf, _ := a.Alloc(4096, fabric.AccessLocalWrite)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := a.Recv(msgs)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
	return errors.New("nothing arrived")
}

// recvViewsOnce is recvOnce on the zero-copy path: a view the peer's
// garbage made must not be handed out.
func recvViewsOnce(a *Endpoint) error {
	views := make([]fabric.View, 4)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := a.RecvViews(views)
		if err != nil {
			return err
		}
		if n > 0 {
			a.ReleaseViews(n)
			return fmt.Errorf("got a view of %d bytes (max message size %d)", len(views[0].Data), a.t.cfg.MaxMsgSize)
		}
	}
	return errors.New("nothing arrived")
}

func fillSend(a *Endpoint) error {
	buf, _ := a.Alloc(4096, 0)
	msgs := make([]fabric.Message, 32)
	for i := range msgs {
		msgs[i] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}
	}
	for i := 0; i < 10000; i++ {
		if _, err := a.Send(msgs); err != nil {
			return err
		}
	}
	return errors.New("sent 320000 messages into a ring nobody drains")
}

// TestHostileRegionTable forges region table entries in A's window (where
// B publishes its table): entries past B's window, torn entries, wrong
// keys. A's RMA must refuse them all without touching memory.
func TestHostileRegionTable(t *testing.T) {
	a, b := pair(t, ShmConfig{}, Config{})
	target, _ := b.Alloc(4096, fabric.AccessRemoteWrite|fabric.AccessRemoteRead)
	before := bytes.Clone(target.Bytes())
	src, _ := a.Alloc(64, 0)
	copy(src.Bytes(), "must not land")
	idx := int(target.RemoteKey() & 0xff)
	e := mrOff + idx*mrEntrySize
	win := a.t.win
	write := func(r fabric.RemoteIOV) fabric.Status {
		t.Helper()
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Remote: r, Flags: fabric.FlagSignal}}
		if n, err := a.Write(msgs); n != 1 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		out := make([]fabric.Completion, 1)
		if n := a.CQ().Poll(out); n != 1 {
			t.Fatalf("no completion")
		}
		return out[0].Status
	}
	if st := write(target.Remote().Slice(0, 64)); st != fabric.StatusOK {
		t.Fatalf("legitimate write: %v", st)
	}
	copy(target.Bytes(), before)
	// Entry claims a region past the end of B's window.
	shm.U64(win, e+16).Store(uint64(len(b.t.win)) - 32)
	shm.U64(win, e+24).Store(1 << 20)
	if st := write(fabric.RemoteIOV{Addr: uint64(len(b.t.win)) - 32, Len: 64, Key: target.RemoteKey()}); st == fabric.StatusOK {
		t.Fatal("write past the peer's window accepted")
	}
	// Torn entry: odd sequence word.
	shm.U32(win, e).Store(shm.U32(win, e).Load() | 1)
	if st := write(target.Remote().Slice(0, 64)); st == fabric.StatusOK {
		t.Fatal("write through a torn entry accepted")
	}
	if !bytes.Equal(target.Bytes(), before) {
		t.Fatal("refused writes changed the target")
	}
}

// TestViewsAcrossRestart holds views while the peer restarts: they are
// void in the new session but still released without error, and views
// work again once the link is back.
func TestViewsAcrossRestart(t *testing.T) {
	a, b := pair(t, ShmConfig{}, Config{})
	path := b.t.dev.(*ShmDevice).Path()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	send := func(ep *Endpoint, p string) {
		t.Helper()
		src, err := ep.Alloc(64, 0)
		if err != nil {
			t.Fatal(err)
		}
		copy(src.Bytes(), p)
		if _, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(p)}}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"one", "two", "three"} {
		send(b, p)
	}
	views := make([]fabric.View, 8)
	for got := 0; got < 3; {
		n, err := a.RecvViewsWait(ctx, views[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if string(views[2].Data) != "three" {
		t.Fatalf("third view %q", views[2].Data)
	}
	b.Close()
	waitEvent(t, a, fabric.EventLinkDown)
	nb, err := DialShm(ctx, path, ShmConfig{}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Close()
	waitEvent(t, a, fabric.EventLinkUp)
	if n := a.OutstandingViews(); n != 3 {
		t.Fatalf("OutstandingViews = %d after the restart, want the 3 void ones", n)
	}
	if err := a.ReleaseViews(3); err != nil {
		t.Fatalf("releasing the void views: %v", err)
	}
	if err := a.ReleaseViews(1); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("releasing one view too many: %v", err)
	}
	send(nb, "after")
	n, err := a.RecvViewsWait(ctx, views)
	if err != nil || n != 1 || string(views[0].Data) != "after" {
		t.Fatalf("after the restart: %d views, %v", n, err)
	}
	if err := a.ReleaseViews(1); err != nil || a.OutstandingViews() != 0 {
		t.Fatalf("ReleaseViews: %v, %d outstanding", err, a.OutstandingViews())
	}
}

// TestRecvWaitPeerDeath: a RecvWait asleep (no spin) when the peer's
// process dies wakes with ErrPeerGone, and one asleep when its own
// endpoint closes wakes with os.ErrClosed.
func TestRecvWaitPeerDeath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	cmd := startHelper(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ep, err := DialShm(ctx, path, ShmConfig{}, Config{Spin: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	echo(t, ep, "before the crash")
	buf, _ := ep.Alloc(4096, fabric.AccessLocalWrite)
	done := make(chan error, 1)
	go func() {
		_, err := ep.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}})
		done <- err
	}()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Recv(t, done, "the RecvWait the peer's death ends"); !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("RecvWait with the peer killed: %v, want ErrPeerGone", err)
	}
	cmd.Wait()

	a, b := pair(t, ShmConfig{}, Config{Spin: -1})
	_ = a
	rbuf, _ := b.Alloc(4096, fabric.AccessLocalWrite)
	go func() {
		_, err := b.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rbuf)}}})
		done <- err
	}()
	b.Close()
	if err := testenv.Recv(t, done, "the RecvWait a Close ends"); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("RecvWait after Close: %v, want os.ErrClosed", err)
	}
}

// TestRegionTableEdges: the region table is the peer's word on what it
// lets us reach; an RMA is checked against the entry and the entry
// against the peer's window, each at its last byte and one past it.
func TestRegionTableEdges(t *testing.T) {
	a, b := pair(t, ShmConfig{}, Config{})
	target, _ := b.Alloc(4096, fabric.AccessRemoteWrite|fabric.AccessRemoteRead)
	src, _ := a.Alloc(64, 0)
	copy(src.Bytes(), "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	win, bwin := a.t.win, b.t.win
	e := mrOff + int(target.RemoteKey()&0xff)*mrEntrySize
	write := func(what string, r fabric.RemoteIOV, want fabric.Status) {
		t.Helper()
		before := bytes.Clone(bwin)
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Remote: r, Flags: fabric.FlagSignal}}
		if n, err := a.Write(msgs); n != 1 || err != nil {
			t.Fatalf("%s: Write = %d, %v", what, n, err)
		}
		out := make([]fabric.Completion, 1)
		if n := a.CQ().Poll(out); n != 1 {
			t.Fatalf("%s: no completion", what)
		}
		if out[0].Status != want {
			t.Fatalf("%s: %v, want %v", what, out[0].Status, want)
		}
		if want != fabric.StatusOK && !bytes.Equal(before, bwin) {
			t.Fatalf("%s: refused, but the peer's window changed", what)
		}
	}
	base := target.Remote().Addr
	key := target.RemoteKey()
	write("the region's last 64 bytes", fabric.RemoteIOV{Addr: base + 4096 - 64, Len: 64, Key: key}, fabric.StatusOK)
	write("64 bytes one past the region", fabric.RemoteIOV{Addr: base + 4096 - 63, Len: 64, Key: key}, fabric.StatusRemoteBounds)
	write("one byte before the region", fabric.RemoteIOV{Addr: base - 1, Len: 64, Key: key}, fabric.StatusRemoteBounds)
	write("another key", fabric.RemoteIOV{Addr: base, Len: 64, Key: key ^ 0x100}, fabric.StatusRemoteAccess)
	// The peer's entry, forged: a region that ends exactly at the end of
	// its window is taken; one byte longer is not.
	end := uint64(len(bwin))
	shm.U64(win, e+16).Store(end - 64)
	shm.U64(win, e+24).Store(64)
	write("an entry that ends at the window's end", fabric.RemoteIOV{Addr: end - 64, Len: 64, Key: key}, fabric.StatusOK)
	if !bytes.Equal(bwin[end-64:], src.Bytes()) {
		t.Fatal("the write to the window's last 64 bytes did not land there")
	}
	shm.U64(win, e+24).Store(65)
	write("an entry one byte past the window", fabric.RemoteIOV{Addr: end - 64, Len: 64, Key: key}, fabric.StatusRemoteAccess)
	shm.U64(win, e+16).Store(end + 4096)
	shm.U64(win, e+24).Store(64)
	write("an entry past the window", fabric.RemoteIOV{Addr: end + 4096, Len: 64, Key: key}, fabric.StatusRemoteAccess)
	// An entry without write access.
	shm.U64(win, e+16).Store(base)
	shm.U64(win, e+24).Store(4096)
	shm.U32(win, e+4).Store(uint32(fabric.AccessRemoteRead))
	write("an entry without write access", fabric.RemoteIOV{Addr: base, Len: 64, Key: key}, fabric.StatusRemoteAccess)
}
