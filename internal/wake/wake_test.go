//go:build linux

package wake

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

// TestEventfd: a ring before the wait and a ring during it both end it,
// and the condition is what decides.
func TestEventfd(t *testing.T) {
	p, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var flag atomic.Bool
	flag.Store(true)
	p.Ring()
	testenv.Await(t, "a Wait whose ring came first", func() { err = p.Wait(flag.Load) })
	if err != nil {
		t.Fatal(err)
	}
	flag.Store(false)
	parked := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		n := 0
		done <- p.Wait(func() bool {
			if n++; n == 2 { // the second check is after a drain found nothing
				close(parked)
			}
			return flag.Load()
		})
	}()
	testenv.Recv(t, parked, "the waiter's second check of its condition")
	flag.Store(true)
	p.Ring()
	if err := testenv.Recv(t, done, "the Wait a ring ends"); err != nil {
		t.Fatal(err)
	}
}

// TestClose: Close wakes every waiter with os.ErrClosed, and a thousand
// waiters hold no thousand threads.
func TestClose(t *testing.T) {
	const n = 1000
	before := testenv.Threads(t)
	ps := make([]*Parker, n)
	var wg sync.WaitGroup
	var started atomic.Int32
	errs := make(chan error, n)
	for i := range ps {
		p, err := NewEventfd()
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- p.Wait(func() bool { started.Add(1); return false })
		}()
	}
	if !testenv.Eventually(testenv.Timeout, func() bool { return started.Load() >= n }) {
		t.Fatalf("timed out waiting for %d waiters to start (%d did)", n, started.Load())
	}
	time.Sleep(20 * time.Millisecond) // let them park (not needed for the check below to be valid)
	if got := testenv.Threads(t); got > before+20 {
		t.Errorf("%d waiters use %d threads (from %d)", n, got, before)
	}
	for _, p := range ps {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
	}
	testenv.Await(t, "the waiters Close wakes", wg.Wait)
	close(errs)
	for err := range errs {
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Wait after Close: %v, want os.ErrClosed", err)
		}
	}
}

// TestNoLostWake: many waiters of one Parker, each waiting for its own
// flag, with one ring per change: a drain by one waiter must not make
// another sleep through its change.
func TestNoLostWake(t *testing.T) {
	p, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const waiters, rounds = 4, 2000
	// A lost wake-up fails the test here rather than hanging it.
	watchdog := time.AfterFunc(30*time.Second, func() { t.Error("a waiter slept through its wake-up"); p.Close() })
	defer watchdog.Stop()
	var seq [waiters]atomic.Int64
	var wg sync.WaitGroup
	for w := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := int64(1); r <= rounds; r++ {
				if err := p.Wait(func() bool { return seq[w].Load() >= r }); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for r := 1; r <= rounds; r++ {
		for w := range waiters {
			seq[w].Store(int64(r))
			p.Ring()
		}
	}
	wg.Wait()
}

// TestEpoll: a set over two eventfds wakes for either, stays ready while a
// member is, and ends its wait after one wake-up.
func TestEpoll(t *testing.T) {
	set, err := NewEpoll()
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	a, _ := NewEventfd()
	b, _ := NewEventfd()
	defer a.Close()
	defer b.Close()
	for _, m := range []*Parker{a, b} {
		if err := set.Watch(m.FD()); err != nil {
			t.Fatal(err)
		}
		if err := set.Watch(m.FD()); err != nil {
			t.Fatal("second Watch:", err)
		}
	}
	if set.Drain() {
		t.Fatal("empty set drained something")
	}
	done := make(chan error, 1)
	go func() { done <- set.Wait(nil) }()
	b.Ring()
	if err := testenv.Recv(t, done, "the set's Wait a member's ring ends"); err != nil {
		t.Fatal(err)
	}
	if !set.Drain() {
		t.Fatal("member b rang and was not consumed, but the set is not ready")
	}
	if !b.Drain() || set.Drain() {
		t.Fatal("the set is still ready after its member was consumed")
	}
	set.Unwatch(a.FD())
	a.Ring()
	if set.Drain() {
		t.Fatal("an unwatched member woke the set")
	}
	if err := NewEpollMisuse(); err == nil {
		t.Fatal("Watch on an eventfd Parker succeeded")
	}
}

func NewEpollMisuse() error {
	p, err := NewEventfd()
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Watch(0)
}

// TestFIFOAcrossProcesses: a child process rings this process's FIFO
// through a Ringer, rounds times, each after this side's flag file says it
// waits; the FIFO of a Ringer with no reader reports false.
func TestFIFOAcrossProcesses(t *testing.T) {
	if os.Getenv("WAKE_CHILD") != "" {
		child()
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bell")
	if NewRinger(path).Ring() {
		t.Fatal("Ring with no FIFO reported true")
	}
	p, err := ListenFIFO(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := os.WriteFile(filepath.Join(dir, "plain"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if q, err := ListenFIFO(filepath.Join(dir, "plain")); err == nil {
		q.Close()
		t.Fatal("ListenFIFO accepted a regular file")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFIFOAcrossProcesses$")
	cmd.Env = append(os.Environ(), "WAKE_CHILD="+path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child rings on its own; every ring wakes this side at least
	// once, until the child exits and the test closes p.
	woke := 0
	var exited atomic.Bool
	go func() { cmd.Wait(); exited.Store(true); p.Ring() }()
	testenv.Await(t, "the child's rings and its exit", func() {
		for !exited.Load() && err == nil {
			if err = p.Wait(nil); err == nil {
				woke++
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("child failed: %v", cmd.ProcessState)
	}
	if woke < 2 {
		t.Fatalf("woke %d times", woke)
	}
	p.Close()
	if NewRinger(path).Ring() {
		t.Fatal("Ring after the reader closed reported true")
	}
}

func child() {
	r := NewRinger(os.Getenv("WAKE_CHILD"))
	for range 100 {
		if !r.Ring() {
			os.Exit(3)
		}
		time.Sleep(100 * time.Microsecond)
	}
	r.Close()
}

// TestDrainLeavesPoller: a Drain while a goroutine waits in Wait leaves
// the wake-up to it (a wait set's member drains the FIFO a RecvWait may be
// parked on).
func TestDrainLeavesPoller(t *testing.T) {
	p, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 200 {
		var flag atomic.Bool
		done := make(chan error, 1)
		go func() { done <- p.Wait(flag.Load) }()
		for start := time.Now(); ; { // until the waiter polls the descriptor
			p.mu.Lock()
			polling := p.polling
			p.mu.Unlock()
			if polling {
				break
			}
			if time.Since(start) > testenv.Timeout {
				t.Fatalf("round %d: timed out after %gs waiting for the waiter to poll", i, testenv.Timeout.Seconds())
			}
			time.Sleep(10 * time.Microsecond)
		}
		flag.Store(true)
		p.Ring()
		if p.Drain() {
			t.Fatalf("round %d: Drain took the wake-up of a parked waiter", i)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter slept through its wake-up", i)
		}
	}
}

// TestEpollReady: Ready reports a set's readiness at once and exactly
// (a member rung just before is seen), consumes nothing, and reports
// true when it cannot tell (closed, not an epoll).
func TestEpollReady(t *testing.T) {
	set, err := NewEpoll()
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewEventfd()
	defer m.Close()
	if err := set.Watch(m.FD()); err != nil {
		t.Fatal(err)
	}
	if set.Ready() {
		t.Fatal("a set whose member is empty is ready")
	}
	m.Ring()
	if !set.Ready() || !set.Ready() {
		t.Fatal("a set whose member was rung is not ready, or Ready consumed the ring")
	}
	if !m.Drain() || set.Ready() {
		t.Fatal("the set is still ready after its member was consumed")
	}
	if !m.Ready() {
		t.Fatal("Ready of an eventfd Parker (which cannot tell) reports false")
	}
	set.Close()
	if !set.Ready() {
		t.Fatal("Ready of a closed set reports false")
	}
}
