package sock

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// The Oversubscribed benchmarks measure Weft where it does not own the
// cores: blocking calls that sleep at once instead of spinning, more
// connections busy than there are cores, and many connections that wait
// idle. TCP over loopback, whose waiting goroutines park in the Go
// runtime's network poller, is the reference of the same run.
const (
	// oversubPairs is the number of ping-pong pairs of Pairs16.
	oversubPairs = 16
	// oversubIdle is the number of connections of Idle1000.
	oversubIdle = 1000
	// ntbQueues is the number of connections one ntb listener accepts:
	// one per transport queue of its bridge (see ntb/listen.go).
	ntbQueues = 8
	// Idle1000 measures once the connections are open and the process's
	// OS threads have not changed for idleSettle (or after
	// idleSettleMax); idleWindow is how long it measures.
	idleSettle    = time.Second
	idleSettleMax = 10 * time.Second
	idleWindow    = time.Second
)

// envIdleChild names the backend whose Idle1000 measurement the test
// binary takes when it runs as the child of benchIdle.
const envIdleChild = "WEFT_OVERSUB_IDLE_CHILD"

// BenchmarkOversubscribed measures what Weft costs when it shares the
// cores, over ntb (the emulated shared-memory bridge) and TCP loopback:
//
//   - PingPong: 64-byte round trips between two goroutines, with
//     fabric.Options.Spin -1, so every wait sleeps at once (us/rt).
//   - Pairs16: 16 clients at once, each with its own connection to an
//     echo goroutine, with the default spin: the total rate (rt/s) and
//     the median and 99th percentile of the round trips (p50-us, p99-us).
//   - Idle1000: 1000 open connections, each with a goroutine blocked in
//     Read on the accepting side, nothing sent: the CPU the process uses
//     (cpu%, of one core) and its OS threads (threads). Each measurement
//     runs in a child process of its own (see benchIdle); ns/op is the
//     child's whole run. Not in -short mode.
func BenchmarkOversubscribed(b *testing.B) {
	ntb := backendNamed(b, "ntb")
	b.Run("PingPong", func(b *testing.B) {
		cfg := &Config{Options: fabric.Options{Spin: -1}}
		benchConnsOver(b, []backend{ntb}, cfg, func(b *testing.B, a, c net.Conn) {
			benchRoundTrip64(b, a, c)
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N), "us/rt")
		})
	})
	b.Run("Pairs16", func(b *testing.B) {
		b.Run("ntb", func(b *testing.B) {
			as, cs := connsOn(b, ntb, nil, oversubPairs, ntbQueues)
			benchPairs(b, as, cs)
		})
		b.Run("tcp", func(b *testing.B) {
			as, cs := tcpPairs(b, oversubPairs)
			benchPairs(b, as, cs)
		})
	})
	b.Run("Idle1000", func(b *testing.B) {
		if testing.Short() {
			b.Skip("opens 1000 connections; not in -short mode")
		}
		b.Run("ntb", func(b *testing.B) {
			benchIdle(b, "ntb", func(b *testing.B) (as, cs []net.Conn) {
				return connsOn(b, ntb, nil, oversubIdle, ntbQueues)
			})
		})
		b.Run("tcp", func(b *testing.B) {
			benchIdle(b, "tcp", func(b *testing.B) (as, cs []net.Conn) {
				return tcpPairs(b, oversubIdle)
			})
		})
	})
}

func backendNamed(t testing.TB, name string) backend {
	t.Helper()
	for _, be := range backends {
		if be.name == name {
			return be
		}
	}
	t.Fatalf("no backend %q", name)
	return backend{}
}

// connsOn returns n connected pairs over be, a backend with a listener,
// made as a server makes them: each listener accepts perListener
// connections (an ntb bridge serves one per queue) and is then closed.
// Up to setupWorkers listeners make their connections at once.
func connsOn(t testing.TB, be backend, cfg *Config, n, perListener int) (as, cs []net.Conn) {
	t.Helper()
	as, cs = make([]net.Conn, n), make([]net.Conn, n)
	var next atomic.Int64 // the first connection of the next listener
	var wg sync.WaitGroup
	fails := make(chan string, setupWorkers)
	for range min(setupWorkers, (n+perListener-1)/perListener) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &goroutineTB{TB: t}
			defer func() {
				if g.msg != "" {
					fails <- g.msg
				}
			}()
			for {
				first := int(next.Add(int64(perListener))) - perListener
				if first >= n {
					return
				}
				l := be.listen(g, cfg)
				for k := first; k < min(first+perListener, n); k++ {
					as[k], cs[k] = connOn(g, be, l, cfg)
				}
				l.Close()
			}
		}()
	}
	wg.Wait()
	close(fails)
	for msg := range fails {
		t.Fatal(msg)
	}
	return as, cs
}

// setupWorkers is how many listeners connsOn fills at once: an ntb
// connection's set-up mostly waits for the polls of the bridge and the
// listener.
const setupWorkers = 8

// goroutineTB is the testing.TB of a set-up goroutine, which may not end
// the test: Fatal and Fatalf record the message and end the goroutine,
// and whoever waits for it fails the test with the message.
type goroutineTB struct {
	testing.TB
	msg string
}

func (g *goroutineTB) Fatal(args ...any) {
	g.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (g *goroutineTB) Fatalf(format string, args ...any) {
	g.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func tcpPairs(t testing.TB, n int) (as, cs []net.Conn) {
	t.Helper()
	for range n {
		a, c := tcpPair(t)
		as, cs = append(as, a), append(cs, c)
	}
	return as, cs
}

// benchPairs runs b.N 64-byte round trips in all, from every conn of cs
// at once to an echo on its peer in as. Each round trip is timed into a
// slice allocated before the clock starts.
func benchPairs(b *testing.B, as, cs []net.Conn) {
	bufs := make([][]byte, len(cs))
	for i, a := range as {
		go echo(a, 64)
		bufs[i] = make([]byte, 64)
		if err := roundTrip(cs[i], bufs[i]); err != nil { // the handshake's wait
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	errs := make(chan error, len(cs))
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1) - 1
				if k >= int64(len(lat)) {
					return
				}
				t0 := time.Now()
				if err := roundTrip(c, bufs[i]); err != nil {
					errs <- err
					return
				}
				lat[k] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
	slices.Sort(lat)
	b.ReportMetric(percentileUS(lat, 50), "p50-us")
	b.ReportMetric(percentileUS(lat, 99), "p99-us")
}

// percentileUS returns the p-th percentile of sorted in microseconds.
func percentileUS(sorted []time.Duration, p int) float64 {
	return float64(sorted[(len(sorted)-1)*p/100]) / float64(time.Microsecond)
}

// benchIdle measures oversubIdle idle connections that open makes, in a
// child process: the Go runtime keeps every OS thread it has started, so
// in this process the threads of whatever ran before (an earlier
// measurement, another backend) would be counted too. The child is this
// test binary running this benchmark alone, once, with envIdleChild set
// to name; there measureIdle takes the measurement, and here its cpu% and
// threads are read off the child's result line. Each iteration of the
// loop is one child; the metrics are the means over the children.
func benchIdle(b *testing.B, name string, open func(b *testing.B) (as, cs []net.Conn)) {
	if os.Getenv(envIdleChild) == name {
		measureIdle(b, open)
		return
	}
	pattern := "^BenchmarkOversubscribed$/^Idle1000$/^" + name + "$"
	// The child's temporary files, the ntb bridges among them, go to
	// memory where the host has a tmpfs: set-up clears about 10 MiB of
	// each of the 250 bridge sides, which the host would otherwise write
	// back to disk.
	tmp := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		tmp = "/dev/shm"
	}
	dir, err := os.MkdirTemp(tmp, "weft-oversub-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir) // the child's, if it was killed
	var cpu, threads float64
	runs := 0
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$", "-test.bench="+pattern,
			"-test.benchtime=1x", "-test.count=1")
		cmd.Env = append(os.Environ(), envIdleChild+"="+name, "TMPDIR="+dir)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			b.Fatalf("child: %v\n%s", err, out)
		}
		m := benchMetrics(out, "BenchmarkOversubscribed/Idle1000/"+name)
		c, okc := m["cpu%"]
		t, okt := m["threads"]
		if !okc || !okt {
			b.Fatalf("no cpu%% and threads in the child's output:\n%s", out)
		}
		cpu, threads, runs = cpu+c, threads+t, runs+1
	}
	b.ReportMetric(cpu/float64(runs), "cpu%")
	b.ReportMetric(threads/float64(runs), "threads")
}

// benchMetrics returns the metrics (value by unit) of the first result
// line of benchmark name in out, the output of a test binary.
func benchMetrics(out []byte, name string) map[string]float64 {
	for line := range bytes.Lines(out) {
		f := strings.Fields(string(line))
		if len(f) < 2 || (f[0] != name && !strings.HasPrefix(f[0], name+"-")) {
			continue
		}
		m := map[string]float64{}
		for i := 3; i < len(f); i += 2 { // name, iterations, then value-unit pairs
			if v, err := strconv.ParseFloat(f[i-1], 64); err == nil {
				m[f[i]] = v
			}
		}
		return m
	}
	return nil
}

// measureIdle opens the connections, starts a goroutine blocked in Read
// on the accepting side of each, lets them settle and measures over
// idleWindow the CPU time the process uses (user and system, as a
// percentage of one core) and, at its end, the process's OS threads.
func measureIdle(b *testing.B, open func(b *testing.B) (as, cs []net.Conn)) {
	as, _ := open(b)
	var returned atomic.Int64
	for _, a := range as {
		go func() {
			buf := make([]byte, 64)
			a.Read(buf)
			returned.Add(1)
		}()
	}
	settleThreads(b)
	b.ResetTimer()
	cpu0, wall0 := cpuTime(b), time.Now()
	time.Sleep(idleWindow)
	cpu, wall := cpuTime(b)-cpu0, time.Since(wall0)
	threads := testenv.Threads(b)
	b.StopTimer()
	if n := returned.Load(); n != 0 {
		b.Fatalf("%d of %d idle Reads returned", n, len(as))
	}
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu%")
	b.ReportMetric(float64(threads), "threads")
}

// settleThreads waits, up to idleSettleMax, for the process's OS threads
// to stop growing for idleSettle: the runtime starts a thread for a
// goroutine blocked in a system call only when it takes its processor
// back, a few at a time.
func settleThreads(t testing.TB) {
	const step = 50 * time.Millisecond
	n, since := testenv.Threads(t), time.Now()
	for start := time.Now(); time.Since(since) < idleSettle && time.Since(start) < idleSettleMax; {
		time.Sleep(step)
		if m := testenv.Threads(t); m != n {
			n, since = m, time.Now()
		}
	}
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
