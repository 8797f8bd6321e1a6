// Package spin is the one wait policy of Weft's blocking calls: poll for
// a spin budget (what keeps latency low), then block (what keeps an idle
// caller cheap).
//
// Spin is the first phase, which every backend's busy-poll uses: the
// caller polls while Next reports true, and once the budget is spent
// blocks on its own wake-up (a channel, a doorbell, poll(2) on a socket).
// Waiter is both phases for callers without a wake-up to block on, such
// as a poller over many endpoints: after the budget it sleeps in growing
// steps up to a ceiling.
//
// The budget is fabric.Options.SpinBudget. Start spins exactly that long;
// a Budget spins at most that long, and only while spinning pays (below).
// A zero budget does not spin at all.
//
// # Adaptive budgets
//
// A Budget is the spin budget of one wait site (an endpoint's receive
// side, say), and this is its policy and the reasons for it.
//
// Only a spin that runs out costs its whole budget: one that ends in an
// arrival costs the time to the arrival, which blocking would have cost
// too, and saves the wake-up (tens of µs). So the budget follows how
// spins end:
//
//   - It starts at the maximum, the configured budget (what Start would
//     spin), and never exceeds it.
//   - A spin that ends in an arrival (Arrived) doubles the budget it had,
//     up to the maximum. The growth is free while arrivals go on, and
//     doubling climbs from the floor to the maximum in four arrivals.
//   - A spin that runs out (Slept) halves the budget it had, down to the
//     floor. A site that goes idle thus wastes less than twice the
//     maximum over the change (max + max/2 + max/4 + ...) and then the
//     floor per wait. The factors are one another's inverse, so the
//     budget climbs while more than half of the spins end in arrivals and
//     falls while fewer do; an additive step (+25%) would take a dozen
//     arrivals to recover from the floor, and fairness between competing
//     flows, which additive increase buys TCP, is not at stake here.
//   - The floor is max/Shrink (6.25 µs for the default 100 µs), not zero:
//     a spin of zero can never see an arrival, so a budget that reached
//     zero could never learn to grow again. At the floor a spin still
//     catches a shared-memory round trip (a few µs), and costs an idle
//     site a sixteenth of what a fixed budget did.
//   - Every ProbeEvery-th spin below the maximum is a probe that spins the
//     whole maximum. Floor-long spins never see an arrival that comes
//     later than the floor but within the maximum (a round trip through a
//     NIC: tens of µs), so without probes such traffic would keep the
//     budget at the floor for good, and every message would pay a
//     wake-up. A probe that catches an arrival doubles its own budget
//     (the maximum): one probe restores it. One that runs out changes
//     nothing (halving the maximum does not lower a smaller budget).
//     Probes cost an idle site max/ProbeEvery per wait on average, as
//     much again as the floor.
//
// # Oversubscription
//
// A spin holds a processor that something else could run on. When more
// is runnable than there are processors, the thing it waits for (a peer
// goroutine, a peer process, the kernel thread that delivers a packet)
// may be what it keeps off the processor: Budget.Start then returns a
// spin of zero, and a spin under way stops at its next reading of the
// clock. One reading decides:
//
//   - Not this process's goroutines (runtime/metrics' running plus
//     runnable above GOMAXPROCS, which goOver still reads for tests): a
//     spinning goroutine yields its P every Every polls, so one it waits
//     for in the same process runs anyway. Measured with 16 ping-pong
//     pairs over ntb in one process on 2 Ps (BenchmarkOversubscribed/
//     Pairs16, where 32 goroutines always want a P): with this reading
//     every wait slept, 0.11 M round trips/s, p99 1.1-2.2 ms; without it
//     0.6-1.0 M/s, p99 39-76 µs.
//   - On the machine (Linux), the fourth field of /proc/loadavg, the
//     threads running or runnable (the reader included), above the CPUs
//     online. Not runtime.NumCPU, which counts the process's affinity
//     mask: /proc/loadavg counts every CPU's threads, and a process pinned
//     to 4 of 64 CPUs (as latency-minded deployments pin) would never spin
//     on a host with a few busy cores elsewhere. Oversubscription of the
//     pinned CPUs alone shows only in the process's own reading, and in
//     spins that run out.
//
// Off by default. On this 2-core host, busy with other work, the
// machine's reading said "oversubscribed" most of the time, and with it
// 16 ping-pong pairs of one process over ntb (BenchmarkOversubscribed/
// Pairs16, default options) made 60-76 k round trips/s with a p99 of
// 4.1-4.3 ms, against 0.6-1.0 M/s and 39-76 µs with spins (and 0.11-0.16
// M/s, 0.6-1 ms, with this session's starting fixed spin): every wait
// slept, and a sleep costs more than a yielding spin. The adaptive budget
// alone already stops an idle site from spinning more than a sixteenth
// of its maximum. The rule stays (honour) for a deployment that wants
// spinners to yield to other processes, and its tests keep it correct.
//
// The reading says "oversubscribed" only if it says so twice in a row
// (a few µs apart): a goroutine that yields (every spin does, every Every
// polls) waits in the run queue for a moment while its P is counted as
// running, and with two spinners on two Ps one reading of the metrics
// saw more goroutines than Ps in about one sample of six, two readings in
// one of fifty; a real excess shows in both.
//
// The verdict is shared by every budget and taken again at most once per
// Recheck, by a goroutine that waits anyway: a stale "not
// oversubscribed" by the first clock reading of a spin (after Every
// polls, so a wait answered at once never pays for a reading, and
// /proc/loadavg costs a few µs), a stale "oversubscribed" by Start, whose
// caller is about to block. A spin that starts on a stale verdict thus
// polls Every times at most before a fresh one can stop it. Between
// readings, checking the verdict costs an atomic load or two beside the
// clock reading that the spin makes anyway, and allocates nothing
// (BenchmarkOversubscribed). A spin that ended for this reason, or
// because its context was done, leaves its budget alone: it says nothing
// about when arrivals come.
package spin

import (
	"context"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Every is how many polls a spin makes between two readings of the clock
// (and of the context). Each reading also yields the processor, so that
// a spinning goroutine shares it with the one it waits for (in the same
// process, on as few as one processor): 32 is the most often any
// backend's own loop yielded before they shared this one, so none yields
// less.
const Every = 32

// Spin is the spin phase of one wait.
//
//	s := spin.Start(budget)
//	for s.Next(ctx) {
//		if ready() {
//			return
//		}
//	}
//	// block on the wake-up
type Spin struct {
	budget   time.Duration // what it was given
	deadline int64         // on mono's clock
	rounds   uint
	live     bool // Next may still return true
	adaptive bool // from a Budget: stops when oversubscribed
	cut      bool // stopped before its deadline: context done, or oversubscribed
}

// Start begins a spin phase of budget; a budget of zero or less spins
// for no time.
func Start(budget time.Duration) Spin {
	if budget <= 0 {
		return Spin{}
	}
	return start(budget, mono())
}

func start(budget time.Duration, now int64) Spin {
	d := now + int64(budget)
	if d < now {
		d = math.MaxInt64
	}
	return Spin{budget: budget, deadline: d, live: true}
}

// Next reports whether to poll once more: true until the budget is spent
// or ctx is done (checked every Every polls, when it also yields the
// processor), false from then on. A spin of a Budget also stops when the
// host is oversubscribed.
func (s *Spin) Next(ctx context.Context) bool {
	s.rounds++
	if s.rounds&(Every-1) != 0 && s.live {
		return true // the common case, inlined
	}
	return s.check(ctx)
}

// check is Next's reading of the clock and the context.
func (s *Spin) check(ctx context.Context) bool {
	if s.live {
		now := mono()
		if ctx.Err() != nil || s.adaptive && oversubscribed(now) {
			s.cut = true
		}
		if !s.cut && now < s.deadline {
			runtime.Gosched()
			return true
		}
	}
	s.live = false
	s.rounds--
	return false
}

// Rounds returns how many times Next returned true.
func (s *Spin) Rounds() int { return int(s.rounds) }

// Sleep steps after the spin budget: the first sleep, and the ceiling
// the doubling stops at.
const (
	FirstSleep = 20 * time.Microsecond
	MaxSleep   = time.Millisecond
)

// Waiter is the state of one wait. The zero value spins for no time.
type Waiter struct {
	budget  time.Duration
	spin    Spin
	started bool
	sleep   time.Duration
}

// New returns a waiter that spins for budget before it sleeps.
func New(budget time.Duration) Waiter { return Waiter{budget: budget} }

// Wait waits once between two polls: it yields while the spin budget
// lasts, then sleeps, each sleep twice the last up to MaxSleep. It returns
// ctx's error once ctx is done.
func (w *Waiter) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.sleep == 0 {
		if !w.started {
			w.spin, w.started = Start(w.budget), true
		}
		if w.spin.Next(ctx) {
			if w.spin.rounds&(Every-1) != 0 { // Next yielded on the others
				runtime.Gosched()
			}
			return nil
		}
		w.sleep = FirstSleep
	} else {
		w.sleep = min(2*w.sleep, MaxSleep)
	}
	t, _ := timers.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(w.sleep)
	} else {
		t.Reset(w.sleep)
	}
	defer func() {
		t.Stop() // no stale tick after it (Go 1.23's timers)
		timers.Put(t)
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// timers are Waiter's sleep timers, reused: a sleep allocates none in
// the steady state (time.NewTimer allocates two objects), so that a
// polled wait (a hardware bridge's doorbell) allocates nothing per
// message.
var timers sync.Pool

// Reset starts a new wait: the next Wait spins again.
func (w *Waiter) Reset() { w.started, w.sleep = false, 0 }

// Budget policy constants (see the package documentation).
const (
	// Shrink is how far below the maximum a budget may fall: its floor
	// is max/Shrink.
	Shrink = 16
	// ProbeEvery: one spin in ProbeEvery below the maximum spins the
	// maximum.
	ProbeEvery = 16
	// Recheck is how long an oversubscription verdict is used before it
	// is read again.
	Recheck = time.Millisecond
)

// Budget is one wait site's adaptive spin budget (an endpoint's receive
// side, say): the package documentation has its policy. It is safe for
// concurrent use, and none of its methods allocates. The zero value
// never spins; Init sets the maximum. A Budget must not be copied after
// first use.
//
//	s := b.Start()
//	for s.Next(ctx) {
//		if ready() {
//			b.Arrived(&s)
//			return
//		}
//	}
//	b.Slept(&s)
//	// block on the wake-up
type Budget struct {
	max time.Duration
	cur atomic.Int64 // the budget, in ns
	n   atomic.Uint32
}

// Init sets the maximum, the configured budget (fabric.Options.SpinBudget),
// and starts the budget there; zero or less never spins. Call it before
// any other method.
func (b *Budget) Init(maximum time.Duration) {
	b.max = max(maximum, 0)
	b.cur.Store(int64(b.max))
	b.n.Store(0)
}

// floor is the least the budget falls to.
func (b *Budget) floor() time.Duration { return max(b.max/Shrink, 1) }

// Start begins a spin phase of the current budget: of no time if the
// budget is zero or the host is oversubscribed, of the maximum if it is
// a probe.
func (b *Budget) Start() Spin {
	cur := time.Duration(b.cur.Load())
	if cur <= 0 {
		return Spin{}
	}
	// A stale "oversubscribed" is read again here, where the caller
	// would block anyway; a stale "not" is read again by the spin's first
	// reading of the clock, while it waits.
	now := mono()
	if verdict.over.Load() && oversubscribed(now) {
		return Spin{}
	}
	if cur < b.max && b.n.Add(1)%ProbeEvery == 0 {
		cur = b.max
	}
	s := start(cur, now)
	s.adaptive = true
	return s
}

// Arrived reports that spin s of b ended because the awaited thing
// arrived: the budget becomes twice s's, up to the maximum, unless it is
// larger already.
func (b *Budget) Arrived(s *Spin) {
	if s.budget <= 0 {
		return
	}
	grow := b.max
	if s.budget < b.max/2 {
		grow = 2 * s.budget
	}
	for {
		cur := b.cur.Load()
		if cur >= int64(grow) || b.cur.CompareAndSwap(cur, int64(grow)) {
			return
		}
	}
}

// Slept reports that spin s of b ran out and the caller blocks: the
// budget becomes half of s's, down to the floor, unless it is smaller
// already. A spin of no time, or one cut short (its context done, the
// host oversubscribed) changes nothing.
func (b *Budget) Slept(s *Spin) {
	if s.budget <= 0 || s.cut {
		return
	}
	shrink := max(s.budget/2, b.floor())
	for {
		cur := b.cur.Load()
		if cur <= int64(shrink) || b.cur.CompareAndSwap(cur, int64(shrink)) {
			return
		}
	}
}

// epoch is the origin of mono's clock.
var epoch = time.Now()

// mono reads the monotonic clock, in ns since epoch (cheaper than
// time.Now, which also reads the wall clock).
func mono() int64 { return int64(time.Since(epoch)) }

// verdict is the shared oversubscription verdict.
var verdict struct {
	next atomic.Int64 // when (mono) to take the next reading
	over atomic.Bool
	mu   sync.Mutex // held by the one goroutine taking a reading
}

// measure takes a reading: whether the host is oversubscribed now. Tests
// replace it.
var measure = measureNow

// ignoring counts the IgnoreOversubscription calls not yet restored.
var ignoring atomic.Int32

// IgnoreOversubscription makes every Budget spin whatever the load until
// restore is called. It is for tests that must never reach a backend's
// sleep path on a loaded machine (a test of the spin, such as
// fabric/sock's TestNoAllocs, whose sleeping twin is
// TestNoAllocsSleeping); programs must not call it.
func IgnoreOversubscription() (restore func()) {
	verdict.mu.Lock()
	ignoring.Add(1)
	verdict.over.Store(false)
	verdict.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			verdict.mu.Lock()
			ignoring.Add(-1)
			verdict.next.Store(0)
			verdict.mu.Unlock()
		})
	}
}

// oversubscribed returns the verdict, taking a reading first if the last
// is Recheck old and no other goroutine is taking one.
func oversubscribed(now int64) bool {
	if !honour.Load() {
		return false
	}
	if now >= verdict.next.Load() && verdict.mu.TryLock() {
		if now >= verdict.next.Load() {
			verdict.over.Store(ignoring.Load() == 0 && measure())
			verdict.next.Store(mono() + int64(Recheck))
		}
		verdict.mu.Unlock()
	}
	return verdict.over.Load()
}

// honour turns the oversubscription rule on. It is off: see the package
// documentation ("Off by default"). Tests turn it on.
var honour atomic.Bool

// measureNow takes the machine's reading, twice in a row before it
// counts. The process's own reading (goOver) is not used: see the package
// documentation.
func measureNow() bool {
	return osOver() && osOver()
}
