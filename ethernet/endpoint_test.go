package ethernet_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

// dialPair opens a connected pair of endpoints over a fresh veth pair,
// with addresses built from the format (given the interface name).
func dialPair(t testing.TB, c netns.PairConfig, addrA, addrB string) (a, b fabric.Endpoint) {
	t.Helper()
	p := newPair(t, c)
	return fabrictest.OpenPair(t, 10*time.Second, func(ctx context.Context, s fabrictest.Side) (ep fabric.Endpoint, err error) {
		ns, addr := p.A, fmt.Sprintf(addrA, p.NameA)
		if s == fabrictest.SideB {
			ns, addr = p.B, fmt.Sprintf(addrB, p.NameB)
		}
		err = ns.Do(func() error {
			var err error
			ep, err = fabric.Open(ctx, "ethernet", addr, nil)
			return err
		})
		return ep, err
	})
}

func TestConformance(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) {
		return dialPair(t, netns.PairConfig{}, "%s", "%s")
	})
}

func TestConformanceUDP(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) {
		return dialPair(t, netns.PairConfig{}, "%s:udp=10.11.0.2", "%s:udp=10.11.0.1")
	})
}

func TestEndpointBasics(t *testing.T) {
	a, b := dialPair(t, netns.PairConfig{}, "%s:peer=02:00:00:00:00:02", "%s")
	caps := a.Caps()
	require.True(t, caps.Reliable)
	require.False(t, caps.RMA)
	require.Equal(t, "ethernet", caps.Backend)
	_, err := a.Write(nil)
	require.ErrorIs(t, err, fabric.ErrNotSupported)
	_, err = a.Register(make([]byte, 8), fabric.AccessRemoteWrite)
	require.ErrorIs(t, err, fabric.ErrNotSupported)
	_ = b
	ee := a.(*ethernet.Endpoint)
	require.NotNil(t, ee.Port().Program())
}

// TestConformanceProcesses runs the conformance cases with side B in a
// child process (the test binary re-executed): the parent creates named
// namespaces and the veth pair, the child enters its namespace by name.
//
// It uses fabrictest.Cases with its own process harness rather than
// fabrictest.TestProcesses, whose deferred Kill of side B fires when
// role A calls t.Skip (runtime.Goexit) before B has exited, failing the
// RMA-only Refuse* cases on every backend without RMA. Those cases are
// covered in one process by TestConformance.
func TestConformanceProcesses(t *testing.T) {
	const envCase, envKey = "WEFT_ETH_PROC_CASE", "WEFT_ETH_PROC_KEY"
	open := func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint {
		name := fmt.Sprintf("weft-%x", fnv32(key))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var ns *netns.NS
		ifname := "veth0"
		if side == fabrictest.SideA {
			p := newPair(t, netns.PairConfig{NameNS: name})
			ns = p.A
		} else {
			ifname = "veth1"
			var err error
			ok := testenv.Eventually(15*time.Second, func() bool {
				if ns, err = netns.OpenNamed(name + "-b"); err != nil {
					return false
				}
				if _, err = ns.Index(ifname); err != nil {
					ns.Close()
					return false
				}
				return true
			})
			require.True(t, ok, "namespace %s-b: %v", name, err)
			t.Cleanup(func() { ns.Close() })
		}
		var ep fabric.Endpoint
		require.NoError(t, ns.Do(func() error {
			var err error
			ep, err = fabric.Open(ctx, "ethernet", ifname, nil)
			return err
		}))
		return ep
	}
	var cases []fabrictest.Case
	for _, c := range fabrictest.Cases() {
		if !strings.HasPrefix(c.Name, "Refuse") {
			cases = append(cases, c)
		}
	}
	if name := os.Getenv(envCase); name != "" {
		for _, c := range cases {
			if c.Name == name {
				ep := open(t, os.Getenv(envKey), fabrictest.SideB)
				defer ep.Close()
				c.B(t, ep)
				return
			}
		}
		t.Fatalf("no case %q", name)
	}
	testenv.RequireAFXDP(t)
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			key := fmt.Sprintf("%s-%d-%d", c.Name, os.Getpid(), i)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConformanceProcesses$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), envCase+"="+c.Name, envKey+"="+key)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			ep := open(t, key, fabrictest.SideA)
			func() {
				defer ep.Close()
				c.A(t, ep)
			}()
			if err := cmd.Wait(); err != nil {
				t.Errorf("side B failed: %v\n%s", err, out.String())
			}
		})
	}
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

func BenchmarkEndpoint(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (a, z fabric.Endpoint) {
		return dialPair(b, netns.PairConfig{}, "%s", "%s")
	})
}

// TestConformanceGeneric runs a few conformance cases with the XDP
// program in generic (skb) mode.
func TestConformanceGeneric(t *testing.T) {
	for _, c := range fabrictest.Cases() {
		switch c.Name {
		case "PingPongSizes", "OrderedBursts", "CloseWhileBlocked":
		default:
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			a, b := dialPair(t, netns.PairConfig{}, "%s:xdp=generic", "%s:xdp=generic")
			t.Run("A", func(t *testing.T) { t.Parallel(); defer a.Close(); c.A(t, a) })
			t.Run("B", func(t *testing.T) { t.Parallel(); defer b.Close(); c.B(t, b) })
		})
	}
}

// TestEndpointLeaks: endpoints opened and closed leave no descriptors,
// goroutines or BPF programs behind.
func TestEndpointLeaks(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	open := func() (fabric.Endpoint, fabric.Endpoint) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var a, b fabric.Endpoint
		ch := make(chan error, 1)
		go func() {
			ch <- p.B.Do(func() (err error) {
				b, err = fabric.Open(ctx, "ethernet", p.NameB+":busypoll=20us,budget=16", nil)
				return
			})
		}()
		require.NoError(t, p.A.Do(func() (err error) { a, err = fabric.Open(ctx, "ethernet", p.NameA, nil); return }))
		require.NoError(t, testenv.Recv(t, ch, "the Open of side B"))
		return a, b
	}
	a, b := open()
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	runtime.GC()
	fds := testenv.FDCount(t)
	g := runtime.NumGoroutine()
	progs := progIDs(t)
	maps := mapIDs(t)
	for i := 0; i < 3; i++ {
		a, b := open()
		reg, _ := a.Alloc(16, 0)
		_, err := a.SendWait(testenv.Context(t), []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}})
		require.NoError(t, err)
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		require.NoError(t, a.Close())
		_, err = b.Recv(nil)
		require.ErrorIs(t, err, fabric.ErrClosed)
	}
	require.Equal(t, fds, testenv.FDCount(t), "fd leak")
	require.LessOrEqual(t, testenv.Goroutines(g, 2*time.Second), g, "goroutine leak")
	require.Empty(t, newWeftProgs(t, progs), "program leak")
	// Maps are freed in a deferred work item after their last reference.
	require.True(t, testenv.Eventually(2*time.Second, func() bool { return len(newWeftMaps(t, maps)) == 0 }),
		"map leak: %v", newWeftMaps(t, maps))
}

// TestShortPeerTimeout: keep-alives come at a quarter of the peer
// timeout when it is under a second, so an idle connection with a short
// timeout stays up (they came every second whatever the timeout, and a
// 300 ms timeout failed every idle connection), and data still flows
// after the idle spell.
func TestShortPeerTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	a, b := dialPair(t, netns.PairConfig{}, "%s:timeout=300ms", "%s:timeout=300ms")
	time.Sleep(5 * timeout)
	for _, e := range []fabric.Endpoint{a, b} {
		select {
		case ev := <-e.Events():
			t.Fatalf("idle endpoint with a %v peer timeout: %v %v", timeout, ev.Kind, ev.Err)
		default:
		}
	}
	sendRecv(t, a, b, []byte("after idle"))
}

// TestStoppedProcess: a stop of the whole process (a loaded host or a
// paused VM) longer than the peer timeout is not the peers' silence.
// Both ends of each pair are in the stopped process, so neither sent a
// keepalive during the stop; the first tick after it found the other
// side silent for longer than its timeout (the likely cause of four of
// TestListener's 64 connections failing as silent on the CI host).
//
// Which side runs first after the stop is up to the scheduler, and the
// failure needs one side to poll an empty ring before its peer's
// keepalive lands. On a host with spare cores all the ticks can run at
// once and the unfixed code pass (the likely reason the mutant survived
// a CI run; this 2-core host ran them in turn and failed it). So the
// test holds one side of every pair (its timer goroutine and callers)
// from before the stop until a while after it, the order in which the
// CI run failed: the held side has not yet run, the other side's ticks
// find its ring drained and nothing from the peer. The silence that
// does count (the last keepalive's age, the time before the stop, the
// hold after it, the allowance) stays under half the timeout.
// Every connection must survive two stops and carry data after.
func TestStoppedProcess(t *testing.T) {
	const (
		timeout = time.Second // keepalives every 250ms
		stop    = 3 * timeout / 2
		hold    = timeout / 4
	)
	var pairs [][2]fabric.Endpoint
	for range 4 {
		a, b := dialPair(t, netns.PairConfig{}, "%s:timeout=1s", "%s:timeout=1s")
		pairs = append(pairs, [2]fabric.Endpoint{a, b})
	}
	for range 2 {
		var release []func()
		for _, p := range pairs {
			release = append(release, ethernet.HoldTicks(p[1].(*ethernet.Endpoint)))
		}
		testenv.StopProcess(t, stop)
		time.Sleep(hold) // the other sides' ticks run: two or more
		for _, r := range release {
			r()
		}
		time.Sleep(timeout / 2) // the held sides' ticks after the stop
	}
	for i, p := range pairs {
		for _, e := range p {
			select {
			case ev := <-e.Events():
				t.Fatalf("pair %d after the stops: %v %v", i, ev.Kind, ev.Err)
			default:
			}
		}
		sendRecv(t, p[0], p[1], []byte("after the stops"))
		sendRecv(t, p[1], p[0], []byte("and back"))
	}
}

// TestStalledDrainer: frames that wait unread in the RX ring while the
// queue's drainer is stalled (a descheduled process) are not silence.
// An endpoint whose peer timeout passes several times over during the
// stall keeps its connection, and data flows once draining resumes
// (the timers ran on the clock alone, and 8 rank processes under the
// race detector on the loaded CI host failed live peers as silent).
func TestStalledDrainer(t *testing.T) {
	a, b := dialPair(t, netns.PairConfig{}, "%s:timeout=200ms", "%s:timeout=200ms")
	release := ethernet.StallRX(a.(*ethernet.Endpoint))
	time.Sleep(time.Second)
	release()
	select {
	case ev := <-a.Events():
		t.Fatalf("after a stall of its drainer: %v %v", ev.Kind, ev.Err)
	default:
	}
	sendRecv(t, b, a, []byte("after the stall"))
	sendRecv(t, a, b, []byte("and back"))
}
