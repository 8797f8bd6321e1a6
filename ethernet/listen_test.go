package ethernet_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
	"golang.org/x/sys/unix"
)

var nsSeq atomic.Uint32

// listenTopo is a veth pair between two named namespaces: listeners in
// A, dialers in B. Addresses name the namespace (netns=), so fabrictest
// can listen and dial from any goroutine.
type listenTopo struct {
	p      *netns.Pair
	nsA    string
	nsB    string
	listen string // what Listen takes
}

func newListenTopo(t testing.TB, framing string) *listenTopo {
	t.Helper()
	name := fmt.Sprintf("wl%d-%d", os.Getpid(), nsSeq.Add(1))
	p := newPair(t, netns.PairConfig{NameNS: name})
	lt := &listenTopo{p: p, nsA: name + "-a", nsB: name + "-b"}
	lt.listen = p.NameA + ":netns=" + lt.nsA
	if framing == "udp" {
		lt.listen += ",local=" + p.IPA.String()
	}
	return lt
}

// dial maps a listener's address (its own interface) to what a client
// in namespace B types: B's interface, same options, B's namespace.
func (lt *listenTopo) dial(l fabric.Listener) string {
	_, opts, _ := strings.Cut(l.Addr(), "?")
	return lt.p.NameB + "?" + opts + "&netns=" + lt.nsB
}

// halfOpen sends one raw hello from namespace B to the listener at addr
// (an AF_PACKET socket, no AF_XDP) and never answers.
func (lt *listenTopo) halfOpen(t testing.TB, addr string) func() {
	c, err := ethernet.ParseAddr(addr)
	require.NoError(t, err)
	var b [12]byte
	rand.Read(b[:])
	frame := ethernet.HelloFrame(c.PeerMAC, lt.p.MACB, binary.BigEndian.Uint32(b[:4])|1, binary.BigEndian.Uint64(b[4:])|1)
	lt.sendRaw(t, frame)
	return func() {}
}

func (lt *listenTopo) sendRaw(t testing.TB, frame []byte) {
	t.Helper()
	require.NoError(t, lt.p.B.Do(func() error {
		idx, err := lt.p.B.Index(lt.p.NameB)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6})
	}))
}

func TestListener(t *testing.T) {
	lt := newListenTopo(t, "")
	fabrictest.TestListener(t, fabrictest.ListenSetup{
		Backend:  "ethernet",
		Addr:     lt.listen,
		Dial:     func(l fabric.Listener, _ int) string { return lt.dial(l) },
		HalfOpen: lt.halfOpen,
	})
}

func TestListenerUDP(t *testing.T) {
	lt := newListenTopo(t, "udp")
	fabrictest.TestListener(t, fabrictest.ListenSetup{
		Backend:  "ethernet",
		Addr:     lt.listen,
		Dial:     func(l fabric.Listener, _ int) string { return lt.dial(l) },
		Clients:  16,
		Messages: 2000,
	})
}

// TestConformanceListenPair runs the conformance cases over pairs made
// by Listen and Accept.
func TestConformanceListenPair(t *testing.T) {
	lt := newListenTopo(t, "")
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) {
		a, b = fabrictest.ListenPairDial(t, "ethernet", lt.listen, lt.dial, nil)
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	})
}

// TestListenerBadHellos: truncated, malformed, forged and replayed
// hellos are refused and counted, hold no slot, and leave a good peer's
// connection and the listener working.
func TestListenerBadHellos(t *testing.T) {
	lt := newListenTopo(t, "")
	l := fabrictest.Listen(t, "ethernet", lt.listen, &fabric.Options{Backlog: 4, HandshakeTimeout: 200 * time.Millisecond})
	a, b := acceptOne(t, l, lt)
	defer a.Close()
	defer b.Close()
	before := l.Stats()

	macA := lt.p.MACA
	good := ethernet.HelloFrame(macA, lt.p.MACB, 0x1234, 0x5678)
	lt.sendRaw(t, good[:len(good)-4]) // truncated body
	bad := append([]byte(nil), good...)
	bad[14+1] = 9 // unknown version
	lt.sendRaw(t, bad)
	zero := ethernet.HelloFrame(macA, lt.p.MACB, 0x1234, 0)
	lt.sendRaw(t, zero) // no nonce
	forged := append([]byte(nil), good...)
	forged[len(forged)-1] = 1 // echoes a nonce the listener never gave
	lt.sendRaw(t, forged)
	// A frame for a connection id nobody has.
	stray := append([]byte(nil), good...)
	stray[14+2] = 1 // data
	binary.BigEndian.PutUint32(stray[14+24:], 0xdeadbeef)
	lt.sendRaw(t, stray)
	// The bad version is not recognisable as a hello: the queue counts
	// it as malformed. The other three reach the listener.
	require.Eventually(t, func() bool { return l.Stats().Failed >= before.Failed+3 }, 5*time.Second, 5*time.Millisecond,
		"bad hellos not counted: %+v", l.Stats())
	el := l.(*ethernet.Listener)
	require.Eventually(t, func() bool { d := el.DemuxStats(); return d.Unknown >= 1 && d.Malformed >= 1 },
		5*time.Second, 5*time.Millisecond, "%+v", el.DemuxStats())
	require.Equal(t, 0, l.Stats().Pending, "bad hellos took slots")
	f0 := l.Stats().Failed
	require.EqualValues(t, before.Failed+3, f0)

	// A hello starts a handshake that times out; replaying it later is
	// refused at once.
	lt.sendRaw(t, good)
	require.Eventually(t, func() bool { return l.Stats().Pending == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return l.Stats().Failed == f0+1 && l.Stats().Pending == 0 },
		5*time.Second, 5*time.Millisecond, "abandoned handshake: %+v", l.Stats())
	lt.sendRaw(t, good)
	require.Eventually(t, func() bool { return l.Stats().Failed == f0+2 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, 0, l.Stats().Pending, "a replayed hello took a slot")

	// The established connection never noticed.
	ra := []byte("still-here")
	sendRecv(t, b, a, ra)
	sendRecv(t, a, b, ra)
	require.Zero(t, b.Stats().Drops[fabric.DropMalformed])
}

// TestListenWindow: the window is a power of two from 16 to 16384;
// one below, one above and one not a power of two are refused with
// ErrInvalid.
func TestListenWindow(t *testing.T) {
	lt := newListenTopo(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		window int
		ok     bool
	}{{8, false}, {15, false}, {16, true}, {24, false}, {1 << 14, true}, {1<<14 + 1, false}, {1 << 15, false}} {
		l, err := fabric.Listen(ctx, "ethernet", fmt.Sprintf("%s,window=%d", lt.listen, c.window), nil)
		if !c.ok {
			require.ErrorIs(t, err, fabric.ErrInvalid, "window %d", c.window)
			continue
		}
		require.NoError(t, err, "window %d", c.window)
		require.NoError(t, l.Close())
	}
}

func acceptOne(t *testing.T, l fabric.Listener, lt *listenTopo) (a, b fabric.Endpoint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := make(chan error, 1)
	go func() {
		var err error
		b, err = fabric.Open(ctx, "ethernet", lt.dial(l), nil)
		ch <- err
	}()
	a, err := l.Accept(ctx)
	require.NoError(t, err)
	require.NoError(t, testenv.Recv(t, ch, "the dial"))
	return a, b
}

func sendRecv(t *testing.T, from, to fabric.Endpoint, msg []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	src, err := from.Register(append([]byte(nil), msg...), 0)
	require.NoError(t, err)
	_, err = from.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}}})
	require.NoError(t, err)
	dst, err := to.Alloc(256, fabric.AccessLocalWrite)
	require.NoError(t, err)
	m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
	_, err = to.RecvWait(ctx, m)
	require.NoError(t, err)
	require.Equal(t, msg, dst.Bytes()[:m[0].Len])
}

// TestListenersAndDialersShareQueues: several endpoints of one process on one
// interface queue dial a listener, while a listener on that same queue
// is dialled from the other side: dialers and listeners share queues
// without conflict.
func TestListenersAndDialersShareQueues(t *testing.T) {
	lt := newListenTopo(t, "")
	la := fabrictest.Listen(t, "ethernet", lt.listen, nil)
	// A listener in B too: B's queue carries dialers and a listener,
	// and so does A's.
	lc := fabrictest.Listen(t, "ethernet", lt.p.NameB+":netns="+lt.nsB, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 4 {
		a, b := acceptOne(t, la, lt)
		defer a.Close()
		defer b.Close()
		sendRecv(t, b, a, []byte("hi"))
	}
	// A dials C from A's namespace.
	_, opts, _ := strings.Cut(lc.Addr(), "?")
	ch := make(chan error, 1)
	var b fabric.Endpoint
	go func() {
		var err error
		b, err = fabric.Open(ctx, "ethernet", lt.p.NameA+"?"+opts+"&netns="+lt.nsA, nil)
		ch <- err
	}()
	a, err := lc.Accept(ctx)
	require.NoError(t, err)
	require.NoError(t, testenv.Recv(t, ch, "the dial"))
	defer a.Close()
	defer b.Close()
	sendRecv(t, a, b, []byte("back"))
}

// TestCrossDial: both sides listen on their queue and dial the other's
// listener, as the ranks of a mesh do. A dial that names a listener
// (listener=1, which Addr carries) must reach that listener, never pair
// up with a dialer of the other side's that names this side, as a
// symmetric open does: that left both believing they had dialled, and
// the listeners without their connections. To make the crossing
// certain, A's dial of B waits in B's queue (A listens only later)
// while B dials A's listener.
func TestCrossDial(t *testing.T) {
	lt := newListenTopo(t, "")
	lb := fabrictest.Listen(t, "ethernet", lt.p.NameB+":netns="+lt.nsB, nil)
	require.Contains(t, lb.Addr(), "listener=1")
	_, optsB, _ := strings.Cut(lb.Addr(), "?")
	ctx, cancel := context.WithTimeout(context.Background(), fabrictest.Timeout)
	defer cancel()
	// B dials A, whose listener is not up yet: its hellos go unanswered.
	type opened struct {
		e   fabric.Endpoint
		err error
	}
	toA := make(chan opened, 1)
	go func() {
		e, err := fabric.Open(ctx, "ethernet", fmt.Sprintf("%s:peer=%s,listener=1,netns=%s", lt.p.NameB, lt.p.MACA, lt.nsB), nil)
		toA <- opened{e, err}
	}()
	time.Sleep(50 * time.Millisecond)
	// A dials B's listener: B's waiting dialer names A, but the hello is
	// for the listener.
	dA, err := fabric.Open(ctx, "ethernet", lt.p.NameA+"?"+optsB+"&netns="+lt.nsA, nil)
	require.NoError(t, err)
	defer dA.Close()
	aB, err := lb.Accept(ctx)
	require.NoError(t, err, "B's listener never saw A's dial")
	defer aB.Close()
	sendRecv(t, dA, aB, []byte("to B"))
	sendRecv(t, aB, dA, []byte("from B"))
	// Now A listens, and B's dial completes with A's listener.
	la := fabrictest.Listen(t, "ethernet", lt.listen, nil)
	aA, err := la.Accept(ctx)
	require.NoError(t, err)
	defer aA.Close()
	o := testenv.Recv(t, toA, "B's dial to complete with A's listener")
	require.NoError(t, o.err)
	defer o.e.Close()
	sendRecv(t, o.e, aA, []byte("to A"))
	sendRecv(t, aA, o.e, []byte("from A"))
}

// TestDialClosedListener: dialing a listener that is gone fails with
// the context's error, not a hang, and a refusal is a
// *fabric.RefusedError naming the listener and the full backlog, which
// matches ErrRefused.
func TestDialRefusedType(t *testing.T) {
	lt := newListenTopo(t, "")
	l := fabrictest.Listen(t, "ethernet", lt.listen, &fabric.Options{Backlog: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, err := fabric.Open(ctx, "ethernet", lt.dial(l), nil)
	require.NoError(t, err)
	defer ep.Close()
	_, err = fabric.Open(ctx, "ethernet", lt.dial(l), nil)
	require.ErrorIs(t, err, fabric.ErrRefused)
	var oe *fabric.OpError
	require.True(t, errors.As(err, &oe))
	var re *fabric.RefusedError
	require.True(t, errors.As(err, &re))
	require.Equal(t, "backlog full", re.Reason)
	require.NotEmpty(t, re.Addr)
	require.EqualValues(t, 1, l.Stats().Refused)
}

// TestStoppedHandshakes: a stop of the whole process in the middle of
// handshakes is not a handshake that ran out of time. Dialers connect
// in a loop, each exchanging one message with the accepted side, while
// the process is stopped four times for three times the listener's
// handshake limit; every dial must succeed and be answered. (Without
// the stall discount, half the runs lose a connection whose listener
// side gave up its handshake on the first tick after a stop.)
func TestStoppedHandshakes(t *testing.T) { dialChurn(t, 4) }

// TestDialChurn: dialers that connect and close in a loop, so that the
// interface's last endpoint closes while another dials. A dial that
// read the link just before the close tore down the shared queue found
// the queue still open, or Weft's own program still attached, and
// failed with ErrXDPInUse (five of 714 dials in one run).
func TestDialChurn(t *testing.T) { dialChurn(t, 0) }

// dialChurn runs six dialers against a listener for about a second, or
// through stops of the process, and checks that every dial succeeded
// and was answered.
func dialChurn(t *testing.T, stops int) {
	const limit = 100 * time.Millisecond
	lt := newListenTopo(t, "")
	l := fabrictest.Listen(t, "ethernet", lt.listen, &fabric.Options{HandshakeTimeout: limit, Backlog: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	// The accepted side echoes each dialer's message.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			ep, err := l.Accept(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer ep.Close()
				echo(ctx, ep)
			}()
		}
	}()
	stop := make(chan struct{})
	var dials, answered atomic.Int64
	errs := make(chan error, 64)
	var dwg sync.WaitGroup
	for range 6 {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				dials.Add(1)
				if err := dialEcho(ctx, lt.dial(l)); err != nil {
					errs <- err
					return
				}
				answered.Add(1)
			}
		}()
	}
	if stops == 0 {
		time.Sleep(time.Second)
	}
	for range stops {
		time.Sleep(50 * time.Millisecond)
		testenv.StopProcess(t, 3*limit)
	}
	close(stop)
	testenv.Await(t, "the dialers", dwg.Wait)
	cancel()
	l.Close()
	testenv.Await(t, "the echoes of the accepted endpoints", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d dials, %d answered; listener %+v, queue %+v", dials.Load(), answered.Load(), l.Stats(), l.(*ethernet.Listener).DemuxStats())
}

// echo receives one message on ep and sends it back.
func echo(ctx context.Context, ep fabric.Endpoint) error {
	r, err := ep.Alloc(64, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
	if _, err := ep.RecvWait(ctx, m); err != nil {
		return err
	}
	m[0].SGEs[0].Length = m[0].Len
	_, err = ep.SendWait(ctx, m)
	return err
}

// dialEcho dials addr, sends a message and waits for it to come back.
func dialEcho(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ep, err := fabric.Open(ctx, "ethernet", addr, nil)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer ep.Close()
	r, err := ep.Alloc(64, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	copy(r.Bytes(), "hello")
	m := []fabric.Message{{SGEs: []fabric.SGE{{Region: r, Length: 5}}}}
	if _, err := ep.SendWait(ctx, m); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	m[0].SGEs[0].Length = 64
	if _, err := ep.RecvWait(ctx, m); err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if string(r.Bytes()[:m[0].Len]) != "hello" {
		return fmt.Errorf("answer %q", r.Bytes()[:m[0].Len])
	}
	return nil
}
