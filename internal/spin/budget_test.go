package spin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"
)

// fakeLoad makes over the verdict, and the verdict of every reading
// until the test ends, and makes the verdict stale: the next check reads
// it again.
func fakeLoad(t *testing.T, over bool) {
	t.Helper()
	old := measure
	measure = func() bool { return over }
	verdict.next.Store(0)
	verdict.over.Store(over)
	honour.Store(true)
	t.Cleanup(func() {
		honour.Store(false)
		measure = old
		verdict.next.Store(0)
		verdict.over.Store(false)
	})
}

// spun returns a spin of budget d from a Budget, as Start would give it.
func spun(d time.Duration) *Spin {
	s := start(d, 0)
	s.adaptive = true
	return &s
}

func cur(b *Budget) time.Duration { return time.Duration(b.cur.Load()) }

// The budget halves on each sleep down to the floor, doubles on each
// arrival up to the maximum, and neither ever crosses its bound.
func TestBudgetArithmetic(t *testing.T) {
	const maxB = 100 * time.Microsecond
	var b Budget
	b.Init(maxB)
	if cur(&b) != maxB {
		t.Fatalf("starts at %v, want the maximum %v", cur(&b), maxB)
	}
	want := maxB
	for range 4 {
		b.Slept(spun(want))
		want /= 2
		if cur(&b) != want {
			t.Fatalf("after a sleep: %v, want %v", cur(&b), want)
		}
	}
	floor := maxB / Shrink
	if want != floor {
		t.Fatalf("four halvings reach %v, the floor is %v", want, floor)
	}
	b.Slept(spun(floor))
	if cur(&b) != floor {
		t.Fatalf("below the floor: %v, want %v", cur(&b), floor)
	}
	for range 4 {
		b.Arrived(spun(want))
		want *= 2
		if cur(&b) != want {
			t.Fatalf("after an arrival: %v, want %v", cur(&b), want)
		}
	}
	b.Arrived(spun(maxB))
	if cur(&b) != maxB {
		t.Fatalf("above the maximum: %v, want %v", cur(&b), maxB)
	}
	// An arrival never lowers the budget, a sleep never raises it (spins
	// of other goroutines, or probes, may have had other budgets).
	b.Arrived(spun(floor))
	if cur(&b) != maxB {
		t.Fatalf("an arrival lowered the budget to %v", cur(&b))
	}
	b.Slept(spun(maxB / 2))
	b.Slept(spun(maxB))
	if cur(&b) != maxB/4 {
		t.Fatalf("sleep of a longer spin raised the budget: %v, want %v", cur(&b), maxB/4)
	}
	// A maximum that does not divide still has a floor above zero.
	b.Init(10)
	for range 10 {
		b.Slept(spun(cur(&b)))
	}
	if cur(&b) != 1 {
		t.Fatalf("budget of 10ns fell to %v, want the floor 1ns", cur(&b))
	}
	// Growth near the largest Duration does not overflow.
	b.Init(time.Duration(1<<63 - 1))
	b.Slept(spun(cur(&b)))
	b.Arrived(spun(cur(&b)))
	if cur(&b) != time.Duration(1<<63-1) {
		t.Fatalf("huge budget: %v", cur(&b))
	}
}

// Start gives the current budget, and every ProbeEvery-th start below
// the maximum the maximum; a probe that catches an arrival restores the
// maximum, one that runs out changes nothing.
func TestBudgetProbe(t *testing.T) {
	fakeLoad(t, false)
	const maxB = 100 * time.Microsecond
	var b Budget
	b.Init(maxB)
	if s := b.Start(); s.budget != maxB {
		t.Fatalf("first spin %v, want %v", s.budget, maxB)
	}
	for cur(&b) > maxB/Shrink {
		s := spun(cur(&b))
		b.Slept(s)
	}
	floor := cur(&b)
	probe := func() *Spin {
		t.Helper()
		for i := 1; i < ProbeEvery; i++ {
			if s := b.Start(); s.budget != floor {
				t.Fatalf("start %d below the maximum: %v, want %v", i, s.budget, floor)
			}
		}
		s := b.Start()
		if s.budget != maxB {
			t.Fatalf("start %d below the maximum: %v, want a probe of %v", ProbeEvery, s.budget, maxB)
		}
		return &s
	}
	b.Slept(probe())
	if cur(&b) != floor {
		t.Fatalf("a probe that ran out moved the budget to %v", cur(&b))
	}
	b.Arrived(probe())
	if cur(&b) != maxB {
		t.Fatalf("a probe that caught an arrival: %v, want the maximum %v", cur(&b), maxB)
	}
	if s := b.Start(); s.budget != maxB {
		t.Fatalf("at the maximum: %v", s.budget)
	}
}

// A zero (or negative) budget never spins, whatever the spins report.
func TestBudgetZero(t *testing.T) {
	fakeLoad(t, false)
	var zero Budget
	for _, b := range []time.Duration{0, -1, -time.Second} {
		var bb Budget
		bb.Init(b)
		for _, bud := range []*Budget{&zero, &bb} {
			for range 2 * ProbeEvery {
				s := bud.Start()
				if s.Next(context.Background()) {
					t.Fatalf("Init(%v): Next = true", b)
				}
				bud.Slept(&s)
				bud.Arrived(spun(time.Millisecond))
				bud.Arrived(&s)
			}
			if cur(bud) != 0 {
				t.Fatalf("Init(%v): budget grew to %v", b, cur(bud))
			}
		}
	}
}

// Concurrent waiters at one site keep the budget within its bounds and
// on its steps (the maximum halved 0 to 4 times).
func TestBudgetConcurrent(t *testing.T) {
	fakeLoad(t, false)
	const maxB = 160 * time.Microsecond
	var b Budget
	b.Init(maxB)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 5000 {
				s := b.Start()
				if s.budget < maxB/Shrink || s.budget > maxB {
					t.Errorf("spin of %v", s.budget)
					return
				}
				if (i+g)%3 == 0 {
					b.Arrived(&s)
				} else {
					b.Slept(&s)
				}
			}
		})
	}
	wg.Wait()
	c := cur(&b)
	for k := 0; k <= 4; k++ {
		if c == maxB>>k {
			return
		}
	}
	t.Fatalf("budget %v is not one of the maximum's halvings", c)
}

// A spin cut short by its context leaves the budget alone.
func TestBudgetCut(t *testing.T) {
	fakeLoad(t, false)
	var b Budget
	b.Init(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	s := b.Start()
	cancel()
	for n := 0; s.Next(ctx); n++ {
		if n > 4*Every {
			t.Fatal("the spin goes on after its context is done")
		}
	}
	b.Slept(&s)
	if cur(&b) != time.Hour {
		t.Fatalf("a cancelled spin shrank the budget to %v", cur(&b))
	}
}

// Never spin when oversubscribed: Start gives a spin of no time, a spin
// under way stops at its next reading, and neither moves the budget.
func TestOversubscribedNeverSpins(t *testing.T) {
	fakeLoad(t, true)
	var b Budget
	b.Init(time.Hour)
	for range 2 * ProbeEvery {
		s := b.Start()
		if s.Next(context.Background()) {
			t.Fatal("oversubscribed: Start gave a spin")
		}
		b.Slept(&s)
	}
	if cur(&b) != time.Hour {
		t.Fatalf("spins not taken shrank the budget to %v", cur(&b))
	}

	measure = func() bool { return false }
	verdict.next.Store(0)
	s := b.Start()
	if !s.Next(context.Background()) {
		t.Fatal("not oversubscribed: no spin")
	}
	measure = func() bool { return true }
	verdict.next.Store(0)
	n := 1
	for s.Next(context.Background()) {
		if n++; n > 4*Every {
			t.Fatalf("a spin under way went on for %d rounds after the host became oversubscribed", n)
		}
	}
	if n != Every-1 {
		t.Fatalf("spun %d rounds after the host became oversubscribed, want the %d up to the next reading", n, Every-1)
	}
	b.Slept(&s)
	if cur(&b) != time.Hour {
		t.Fatalf("a spin cut by oversubscription shrank the budget to %v", cur(&b))
	}
	// Start (no Budget) keeps its promise of the whole budget.
	p := Start(time.Hour)
	for range 4 * Every {
		if !p.Next(context.Background()) {
			t.Fatal("Start's spin stopped on oversubscription")
		}
	}
}

// IgnoreOversubscription lets budgets spin on an oversubscribed host
// until restored.
func TestIgnoreOversubscription(t *testing.T) {
	fakeLoad(t, true)
	var b Budget
	b.Init(time.Hour)
	restore := IgnoreOversubscription()
	inner := IgnoreOversubscription()
	s := b.Start()
	for range 4 * Every {
		if !s.Next(context.Background()) {
			t.Fatal("a spin stopped while oversubscription is ignored")
		}
	}
	inner()
	inner()
	verdict.next.Store(0)
	for range 4 * Every {
		if !s.Next(context.Background()) {
			t.Fatal("one restore of two ended the ignoring")
		}
	}
	restore()
	for n := 0; s.Next(context.Background()); n++ {
		if n > Every {
			t.Fatal("a spin went on after the restore, oversubscribed")
		}
	}
	if s := b.Start(); s.Next(context.Background()) {
		t.Fatal("oversubscribed after the restore: Start gave a spin")
	}
}

// The verdict is read at most once per Recheck.
func TestVerdictCached(t *testing.T) {
	fakeLoad(t, false)
	readings := 0
	measure = func() bool { readings++; return readings%2 == 1 }
	now := mono()
	for range 100 {
		if !oversubscribed(now) {
			t.Fatal("verdict changed without a reading")
		}
	}
	if readings != 1 {
		t.Fatalf("%d readings, want 1", readings)
	}
	next := verdict.next.Load()
	if next < now+int64(Recheck) {
		t.Fatalf("next reading %v after, want at least %v", time.Duration(next-now), Recheck)
	}
	if oversubscribed(next) || readings != 2 {
		t.Fatalf("%d readings at the next reading's time, want 2", readings)
	}
}

func TestVerdictRules(t *testing.T) {
	for _, c := range []struct {
		procs, running, runnable uint64
		over                     bool
	}{{2, 1, 0, false}, {2, 2, 0, false}, {2, 1, 1, false}, {2, 2, 1, true}, {1, 1, 1, true}, {8, 8, 3, true}} {
		if got := goOversubscribed(c.procs, c.running, c.runnable); got != c.over {
			t.Errorf("goOversubscribed(%d Ps, %d running, %d runnable) = %v", c.procs, c.running, c.runnable, got)
		}
	}
	for _, c := range []struct {
		running, cpus int
		over          bool
	}{{1, 2, false}, {2, 2, false}, {3, 2, true}, {64, 64, false}, {65, 64, true}} {
		if got := osOversubscribed(c.running, c.cpus); got != c.over {
			t.Errorf("osOversubscribed(%d running, %d CPUs) = %v", c.running, c.cpus, got)
		}
	}
}

func TestParseRunning(t *testing.T) {
	for in, want := range map[string]int{
		"0.61 0.48 0.52 3/215 9164\n":    3,
		"12.00 9.50 7.25 17/2048 1\n":    17,
		"0.00 0.00 0.00 0/1 1":           0,
		"0.00 0.00 0.00 1234567/99999 2": 1234567,
	} {
		if got, ok := parseRunning([]byte(in)); !ok || got != want {
			t.Errorf("parseRunning(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "0.61 0.48 0.52", "0.61 0.48 0.52 ", "0.61 0.48 0.52 x/2 1",
		"0.61 0.48 0.52 3 9", "0.61 0.48 0.52 3", "0.61 0.48 0.52 1234567890/2 1"} {
		if got, ok := parseRunning([]byte(in)); ok {
			t.Errorf("parseRunning(%q) = %d, want no reading", in, got)
		}
	}
}

func TestCountCPUs(t *testing.T) {
	for in, want := range map[string]int{"0\n": 1, "0-1\n": 2, "0-3,8,10-11\n": 7, "0-63": 64,
		"": 0, "x": 0, "3-1\n": 0, "0-\n": 0, "0,,1": 0} {
		if got := countCPUs(in); got != want {
			t.Errorf("countCPUs(%q) = %d, want %d", in, got, want)
		}
	}
}

// The real readings work here: the process's own (the reading goroutine
// is running), and on Linux the machine's (the reading thread is), and
// neither allocates.
func TestReadings(t *testing.T) {
	procs, running, _, ok := goReading()
	if !ok || procs != uint64(runtime.GOMAXPROCS(0)) || running < 1 {
		t.Fatalf("runtime/metrics: %d Ps, %d running, ok %v; GOMAXPROCS is %d", procs, running, ok, runtime.GOMAXPROCS(0))
	}
	if cpus < runtime.NumCPU() {
		t.Fatalf("%d CPUs online, fewer than runtime.NumCPU %d", cpus, runtime.NumCPU())
	}
	if runtime.GOOS == "linux" {
		n, ok := osReading()
		if !ok || n < 1 {
			t.Fatalf("/proc/loadavg: %d running, ok %v", n, ok)
		}
	}
	if a := testing.AllocsPerRun(100, func() {
		measureNow()
		goOver()
		osOver()
		verdict.next.Store(0)
		oversubscribed(mono())
	}); a != 0 {
		t.Fatalf("%v allocations per reading", a)
	}
}

// The descriptor kept open reads /proc/loadavg anew at each pread: its
// last field, the newest process ID, changes when a process starts.
func TestLoadavgFresh(t *testing.T) {
	if runtime.GOOS != "linux" {
		return // no machine-wide reading elsewhere
	}
	last := func() string {
		t.Helper()
		b, ok := readLoadavg()
		if !ok {
			t.Fatal("/proc/loadavg does not read")
		}
		f := bytes.Fields(b)
		if len(f) != 5 {
			t.Fatalf("/proc/loadavg: %q", b)
		}
		return string(f[4])
	}
	before := last()
	if err := exec.Command(os.Args[0], "-test.run=^$").Run(); err != nil {
		t.Fatal(err)
	}
	if after := last(); after == before {
		t.Fatalf("newest PID still %s after starting a process: pread at 0 does not read anew", before)
	}
}

// BenchmarkOversubscribed is the check every Budget.Start (and each clock
// reading of its spin) makes: the cached verdict, and once per Recheck a
// reading of both sources.
func BenchmarkOversubscribed(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		oversubscribed(mono())
	}
}

// BenchmarkVerdict is the check without its clock reading (which the
// spin makes anyway) and without readings: the cached verdict alone.
func BenchmarkVerdict(b *testing.B) {
	oversubscribed(mono())
	b.ReportAllocs()
	for b.Loop() {
		oversubscribed(0)
	}
}

// BenchmarkGoReading is one reading of runtime/metrics.
func BenchmarkGoReading(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		goReading()
	}
}

// BenchmarkOSReading is one pread and parse of /proc/loadavg.
func BenchmarkOSReading(b *testing.B) {
	if _, ok := osReading(); !ok {
		b.Skip("no /proc/loadavg")
	}
	b.ReportAllocs()
	for b.Loop() {
		osReading()
	}
}

// BenchmarkBudget is a wait's overhead with a Budget: Start, one poll
// and Arrived.
func BenchmarkBudget(b *testing.B) {
	var bud Budget
	bud.Init(time.Hour)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s := bud.Start()
		s.Next(ctx)
		bud.Arrived(&s)
	}
}

// BenchmarkMono and BenchmarkNow compare the clock Spin reads with
// time.Now, which it read before.
func BenchmarkMono(b *testing.B) {
	for b.Loop() {
		mono()
	}
}

func BenchmarkNow(b *testing.B) {
	for b.Loop() {
		time.Now()
	}
}
