package ethernet_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
	"golang.org/x/sys/unix"
)

// parked counts the goroutines whose stack passes through fn (a
// function's qualified name) and that are blocked: not running or
// runnable (in a channel, the network poller, or a system call).
func parked(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		_, state, ok := strings.Cut(head, "[")
		if !ok || strings.HasPrefix(state, "running") || strings.HasPrefix(state, "runnable") {
			continue
		}
		if strings.Contains(g, fn+"(") {
			count++
		}
	}
	return count
}

// recvErr waits for a waiter's result. The bound, some 10^5 times what a
// wake-up takes, only keeps a lost one from hanging the test; it is no
// measure of promptness.
func recvErr[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not woken", what)
		panic("unreachable")
	}
}

// TestRecvWaitThreads: 200 goroutines blocked in Queue.RecvWait, one on
// each of 200 queues, park in the Go runtime's network poller and hold
// no OS thread (poll(2) held one each); a cancelled context wakes one of
// them while the others sleep on; Close wakes all the others with
// os.ErrClosed.
func TestRecvWaitThreads(t *testing.T) {
	const queues = 200
	p := newPair(t, netns.PairConfig{Queues: queues})
	ids := make([]int, queues)
	for i := range ids {
		ids[i] = i
	}
	// No spin: RecvWait sleeps at once.
	port := openPort(t, p.A, p.NameA, &ethernet.Config{Queues: ids, Frames: 16, RingSize: 16, Spin: -1})
	require.Len(t, port.Queues(), queues)

	before := testenv.Threads(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make([]chan error, queues)
	for i, q := range port.Queues() {
		c := context.Background()
		if i == 0 {
			c = ctx
		}
		errs[i] = make(chan error, 1)
		go func() {
			_, err := q.RecvWait(c, make([]ethernet.Frame, 4))
			errs[i] <- err
		}()
	}
	const fn = "ethernet.(*Queue).RecvWait"
	require.True(t, testenv.Eventually(time.Minute, func() bool { return parked(fn) >= queues }),
		"%d of %d waiters blocked", parked(fn), queues)
	after := testenv.Threads(t)
	t.Logf("threads: %d before, %d with %d goroutines blocked in RecvWait", before, after, queues)
	require.Less(t, after-before, 20, "blocked RecvWait calls hold OS threads")

	cancel()
	require.ErrorIs(t, recvErr(t, errs[0], "cancelled RecvWait"), context.Canceled)
	for i := 1; i < queues; i++ {
		select {
		case err := <-errs[i]:
			t.Fatalf("RecvWait %d returned %v before Close", i, err)
		default:
		}
	}
	require.NoError(t, port.Close())
	for i := 1; i < queues; i++ {
		require.ErrorIs(t, recvErr(t, errs[i], "RecvWait at Close"), os.ErrClosed)
	}
}

// TestPollWaiters: several goroutines wait on one socket at once. Each
// one's context ends its own wait only, whether it sleeps in the poller
// or behind the one that does; when that one leaves, another takes its
// place, so a frame still wakes them all; Close wakes them all.
func TestPollWaiters(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	a := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: f, Spin: -1})
	b := openPort(t, p.B, p.NameB, &ethernet.Config{RingSize: 64, Frames: 256})
	qa := a.Queue(0)
	s := qa.Socket()
	type result struct {
		ev  int16
		err error
	}
	poll := func(ctx context.Context, want int16) <-chan result {
		ch := make(chan result, 1)
		go func() {
			ev, err := s.Poll(ctx, want)
			ch <- result{ev, err}
		}()
		return ch
	}
	const fn = "xsk.(*Socket).Poll"
	waitParked := func(n int) {
		t.Helper()
		require.True(t, testenv.Eventually(time.Minute, func() bool { return parked(fn) == n }),
			"%d waiters blocked, want %d", parked(fn), n)
	}
	bg := context.Background()

	// The first waiter sleeps in the poller; the others behind it.
	lctx, lcancel := context.WithCancel(bg)
	defer lcancel()
	leader := poll(lctx, unix.POLLIN)
	waitParked(1)
	var followers []<-chan result
	for range 8 {
		followers = append(followers, poll(bg, unix.POLLIN))
	}
	waitParked(9)

	// A deadline or a cancellation ends one waiter's wait.
	dctx, dcancel := context.WithTimeout(bg, time.Millisecond)
	defer dcancel()
	require.ErrorIs(t, recvErr(t, poll(dctx, unix.POLLIN), "Poll past its deadline").err, context.DeadlineExceeded)
	cctx, ccancel := context.WithCancel(bg)
	c := poll(cctx, unix.POLLIN)
	waitParked(10)
	ccancel()
	require.ErrorIs(t, recvErr(t, c, "cancelled Poll").err, context.Canceled)
	ev, err := s.PollFor(unix.POLLIN, time.Millisecond)
	require.NoError(t, err)
	require.Zero(t, ev)
	// The one in the poller: another takes its place.
	lcancel()
	require.ErrorIs(t, recvErr(t, leader, "cancelled Poll in the poller").err, context.Canceled)
	waitParked(8)
	for i, ch := range followers {
		select {
		case r := <-ch:
			t.Fatalf("waiter %d returned %+v with nothing received", i, r)
		default:
		}
	}

	// A frame wakes every waiter (none takes it off the ring).
	qb := b.Queue(0)
	fr := make([]ethernet.Frame, 1)
	require.Equal(t, 1, qb.Alloc(fr))
	ethernet.PutEthernet(qb.Buffer(fr[0]), p.MACA, p.MACB, ethernet.EtherTypeWeft)
	fr[0].Len = 60
	n, err := qb.Send(fr)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for i, ch := range followers {
		r := recvErr(t, ch, "Poll at a frame")
		require.NoError(t, r.err, "waiter %d", i)
		require.Equal(t, int16(unix.POLLIN), r.ev, "waiter %d", i)
	}
	n, err = qa.RecvWait(bg, make([]ethernet.Frame, 4))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// Waiting for room on a full TX ring kicks the kernel (copy mode
	// sends in the kick), as poll(2) did. The frames are not steered to
	// A's socket (another EtherType).
	bs := qb.Socket()
	require.False(t, bs.ZeroCopy(), "veth has no AF_XDP zero-copy")
	tx := bs.TX()
	full := make([]ethernet.Frame, tx.Size())
	require.Equal(t, len(full), qb.Alloc(full))
	idx, got := tx.Reserve(len(full))
	require.Equal(t, len(full), got)
	for i := range full {
		ethernet.PutEthernet(qb.Buffer(full[i]), p.MACA, p.MACB, ethernet.EtherTypeWeft+1)
		d := tx.Desc(idx + uint32(i))
		d.Addr, d.Len, d.Options = full[i].Addr, 60, 0
	}
	tx.Submit(got)
	require.Zero(t, tx.Free())
	r := recvErr(t, func() <-chan result {
		ch := make(chan result, 1)
		go func() { ev, err := bs.Poll(bg, unix.POLLOUT); ch <- result{ev, err} }()
		return ch
	}(), "Poll(POLLOUT) on a full TX ring")
	require.NoError(t, r.err)
	require.Equal(t, int16(unix.POLLOUT), r.ev)
	ev, err = bs.PollFor(unix.POLLIN|unix.POLLOUT, -1)
	require.NoError(t, err)
	require.Equal(t, int16(unix.POLLOUT), ev)

	// Close wakes every waiter, in the poller and behind it, and later
	// calls fail at once.
	var all []<-chan result
	for range 6 {
		all = append(all, poll(bg, unix.POLLIN))
	}
	forever := make(chan result, 1)
	go func() { ev, err := s.PollFor(unix.POLLIN, -1); forever <- result{ev, err} }()
	all = append(all, forever)
	require.True(t, testenv.Eventually(time.Minute, func() bool {
		return parked(fn) == 6 && parked("xsk.(*Socket).PollFor") == 1
	}), "waiters not blocked")
	require.NoError(t, a.Close())
	for _, ch := range all {
		require.ErrorIs(t, recvErr(t, ch, "Poll at Close").err, os.ErrClosed)
	}
	_, err = s.Poll(bg, unix.POLLIN)
	require.ErrorIs(t, err, os.ErrClosed)
}

// TestPollContexts: a context that a wait registered keeps waking the
// waits after it that use it (a loop waits with one context and
// allocates once), another context takes its place, and Close lets the
// socket go while the context lives on.
func TestPollContexts(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	var a *ethernet.Port
	require.NoError(t, p.A.Do(func() (err error) {
		a, err = ethernet.Open(p.NameA, &ethernet.Config{Filter: f, Spin: -1})
		return err
	}))
	b := openPort(t, p.B, p.NameB, &ethernet.Config{})
	qa, qb := a.Queue(0), b.Queue(0)
	send := func() {
		t.Helper()
		fr := make([]ethernet.Frame, 1)
		require.Equal(t, 1, qb.Alloc(fr))
		ethernet.PutEthernet(qb.Buffer(fr[0]), p.MACA, p.MACB, ethernet.EtherTypeWeft)
		fr[0].Len = 60
		n, err := qb.Send(fr)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	type result struct {
		n   int
		err error
	}
	const fn = "ethernet.(*Queue).RecvWait"
	// recv starts a RecvWait and returns once it sleeps.
	recv := func(ctx context.Context) <-chan result {
		t.Helper()
		ch := make(chan result, 1)
		go func() {
			frames := make([]ethernet.Frame, 4)
			n, err := qa.RecvWait(ctx, frames)
			qa.Release(frames[:n])
			ch <- result{n, err}
		}()
		require.True(t, testenv.Eventually(time.Minute, func() bool { return parked(fn) == 1 }), "RecvWait not blocked")
		return ch
	}
	bg := context.Background()

	ctx1, cancel1 := context.WithCancel(bg)
	defer cancel1()
	for range 3 {
		ch := recv(ctx1)
		send()
		r := recvErr(t, ch, "RecvWait at a frame")
		require.NoError(t, r.err)
		require.Equal(t, 1, r.n)
	}
	ch := recv(ctx1)
	cancel1()
	require.ErrorIs(t, recvErr(t, ch, "RecvWait with a context registered before").err, context.Canceled)

	ctx2, cancel2 := context.WithCancel(bg)
	defer cancel2()
	ctx3, cancel3 := context.WithCancel(bg)
	defer cancel3()
	ch = recv(ctx2)
	send()
	require.NoError(t, recvErr(t, ch, "RecvWait at a frame").err)
	ch = recv(ctx3)
	cancel2() // the earlier context: not this wait's
	send()
	r := recvErr(t, ch, "RecvWait at a frame")
	require.NoError(t, r.err)
	require.Equal(t, 1, r.n)
	ch = recv(ctx3)
	cancel3()
	require.ErrorIs(t, recvErr(t, ch, "cancelled RecvWait").err, context.Canceled)

	// A wait registers a context that outlives the port: Close drops it,
	// and the socket can be collected.
	ctx4, cancel4 := context.WithCancel(bg)
	defer cancel4()
	ch = recv(ctx4)
	require.NoError(t, a.Close())
	require.ErrorIs(t, recvErr(t, ch, "RecvWait at Close").err, os.ErrClosed)
	collected := make(chan struct{})
	runtime.AddCleanup(qa.Socket(), func(ch chan struct{}) { close(ch) }, collected)
	a, qa = nil, nil
	require.True(t, testenv.Eventually(time.Minute, func() bool {
		runtime.GC()
		select {
		case <-collected:
			return true
		default:
			return false
		}
	}), "a closed socket stays reachable from a context it waited with")
}

// TestRecvWaitBusyPoll: with busy polling configured, a sleeping Poll
// still wakes for each frame, and runs the device's NAPI loop (a
// recvfrom kick) before it sleeps, as poll(2) did.
func TestRecvWaitBusyPoll(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	busy := xsk.BusyPoll{Timeout: 20 * time.Microsecond, Budget: 64, Prefer: true}
	a := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: f, Spin: -1, BusyPoll: busy})
	b := openPort(t, p.B, p.NameB, &ethernet.Config{})
	qa, qb := a.Queue(0), b.Queue(0)
	require.True(t, qa.Socket().BusyPolling())
	const fn = "xsk.(*Socket).Poll"
	for i := range 20 {
		kicks := qa.Stats().Kicks
		ch := make(chan error, 1)
		go func() {
			if _, err := qa.Socket().Poll(context.Background(), unix.POLLIN); err != nil {
				ch <- err
				return
			}
			frames := make([]ethernet.Frame, 4)
			n, err := qa.RecvWait(context.Background(), frames)
			qa.Release(frames[:n])
			if err == nil && n != 1 {
				err = fmt.Errorf("%d frames", n)
			}
			ch <- err
		}()
		require.True(t, testenv.Eventually(time.Minute, func() bool { return parked(fn) == 1 }), "Poll not blocked")
		require.Greater(t, qa.Stats().Kicks, kicks, "no busy-poll kick before sleeping")
		fr := make([]ethernet.Frame, 1)
		require.Equal(t, 1, qb.Alloc(fr))
		ethernet.PutEthernet(qb.Buffer(fr[0]), p.MACA, p.MACB, ethernet.EtherTypeWeft)
		fr[0].Len = 60
		n, err := qb.Send(fr)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.NoError(t, recvErr(t, ch, "busy-polled Poll at a frame"), "frame %d", i)
	}
}
