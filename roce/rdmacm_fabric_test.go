package roce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
)

// cmFabricPair opens two endpoints over rdma_cm through fabric.Open: a
// listener on 127.0.0.1 and a dialer on 127.0.0.2.
func cmFabricPair(t testing.TB, query string) (a, b fabric.Endpoint) {
	t.Helper()
	// UDP, whoever owns the rings of these addresses (see rcPair).
	return cmFabricPairAt(t, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), "link=udp&"+query, "link=udp&"+query)
}

// cmFabricPairAt is cmFabricPair with the listener on la, the dialer on
// lb, and their parameters qa and qb.
func cmFabricPairAt(t testing.TB, la, lb netip.Addr, qa, qb string) (a, b fabric.Endpoint) {
	t.Helper()
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		ep  fabric.Endpoint
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ep, err := fabric.Open(ctx, "roce", fmt.Sprintf("rdmacm://listen:%s:%d?%s", la, port, qa), nil)
		ch <- res{ep, err}
	}()
	var z fabric.Endpoint
	var err error
	for {
		// Refused until the listener is up.
		z, err = fabric.Open(ctx, "roce", fmt.Sprintf("%s:%d?cm=1&local=%s&%s", la, port, lb, qb), nil)
		if err == nil || !errors.Is(err, fabric.ErrRefused) || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := testenv.Recv(t, ch, "the listener's Open")
	if err != nil || r.err != nil {
		if z != nil {
			z.Close()
		}
		if r.ep != nil {
			r.ep.Close()
		}
		t.Fatalf("open: %v / %v", r.err, err)
	}
	t.Cleanup(func() { z.Close(); r.ep.Close() })
	return r.ep, z
}

// TestConformanceCM runs the conformance suite over connections that
// rdma_cm set up, through fabric.Open.
func TestConformanceCM(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		return cmFabricPair(t, "")
	})
}

// TestCMPeerGone: Close sends a DREQ, and the peer sees EventPeerGone.
func TestCMPeerGone(t *testing.T) {
	a, b := cmFabricPair(t, "keepalive=0")
	if a.RemoteAddr() != b.LocalAddr() || b.RemoteAddr() != a.LocalAddr() {
		t.Errorf("addresses %s %s / %s %s", a.LocalAddr(), a.RemoteAddr(), b.LocalAddr(), b.RemoteAddr())
	}
	b.Close()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-a.Events():
			if ev.Kind == fabric.EventPeerGone {
				return
			}
		case <-timeout:
			t.Fatal("no EventPeerGone after the peer's Close")
		}
	}
}

// TestListenCM accepts several dialers through one fabric.Listener.
func TestListenCM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	port := freePort(t)
	l, err := ListenCM(ctx, fmt.Sprintf("rdmacm://127.0.0.1:%d", port), fabric.Options{Backlog: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 6
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			for {
				// A full backlog refuses: try again, as a client would.
				ep, err := fabric.Open(ctx, "roce", l.Addr()+"?local=127.0.0.2", nil)
				if err == nil {
					ep.Close()
				}
				if !errors.Is(err, fabric.ErrRefused) {
					errs <- err
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	for i := 0; i < n; i++ {
		ep, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ep.Close()
	}
	for i := 0; i < n; i++ {
		if err := testenv.Recv(t, errs, "the dials"); err != nil {
			t.Error(err)
		}
	}
	if s := l.Stats(); s.Accepted != n {
		t.Errorf("stats %+v", s)
	}
}

// cmTestDriver exposes the rdma_cm address forms as a backend of their
// own for fabrictest.TestListener, which starts listeners through
// fabric.Listen. (The "roce" driver's Listen dispatches to ListenCM once
// the TCP-exchange listener lands; see cm.IsAddr.)
type cmTestDriver struct{}

func (cmTestDriver) Usage() string { return "rdma_cm addresses of roce (tests)" }

func (cmTestDriver) Open(ctx context.Context, addr string, o fabric.Options) (fabric.Endpoint, error) {
	return openCM(ctx, addr, o)
}

func (cmTestDriver) Listen(ctx context.Context, addr string, o fabric.Options) (fabric.Listener, error) {
	return ListenCM(ctx, addr, o)
}

func init() { fabric.RegisterBackend("roce-cm-test", cmTestDriver{}) }

// TestListenerCM runs the fabric listener cases over rdma_cm: 64 clients
// at once, Close waking Accept, the backlog refusing, addresses.
func TestListenerCM(t *testing.T) {
	port := freePort(t)
	fabrictest.TestListener(t, fabrictest.ListenSetup{
		Backend:  "roce-cm-test",
		Addr:     fmt.Sprintf("rdmacm://127.0.0.1:%d?keepalive=0", port),
		Dial:     func(l fabric.Listener, i int) string { return l.Addr() + "?local=127.0.0.2&keepalive=0" },
		Messages: 200,
		HalfOpen: cmHalfOpen,
		// 64 handshakes at once on two shared cores under the race
		// detector can take longer than the default 5 s.
		Options: &fabric.Options{HandshakeTimeout: 30 * time.Second},
	})
}

// cmHalfOpen sends the listener at addr a REQ from an address where
// nobody answers (127.0.0.3): the listener's REP goes unanswered, as if
// the peer vanished after its REQ.
func cmHalfOpen(t testing.TB, addr string) func() {
	_, ap, err := parseCMAddr(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	engines.Lock()
	s := engines.m[netip.AddrPortFrom(ap.Addr(), link.Port)] // acquireEngine's key for port 0
	engines.Unlock()
	if s == nil {
		t.Fatalf("no engine listens at %s", addr)
	}
	ghost := netip.MustParseAddr("127.0.0.3")
	var b [cm.MADSize]byte
	m := cm.MAD(b[:])
	m.Init(cm.AttrREQ, 1)
	r := cm.REQ(m.Data())
	var id [4]byte
	rand.Read(id[:])
	r.SetLocalCommID(binary.LittleEndian.Uint32(id[:]) | 1)
	r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, ap.Port()))
	r.SetLocalQPN(0x77)
	r.SetPathMTU(cm.MTU1024)
	r.SetRemoteCMResponseTimeout(14)
	r.SetMaxCMRetries(2)
	r.Primary().SetLocalGID(ghost)
	r.Primary().SetRemoteGID(ap.Addr())
	cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(ghost, 1), ap.Addr())
	inject(s.e, ghost, b[:])
	return func() {}
}

// TestCMAutoShm: over rdma_cm, two Weft engines of this host with the
// default link offer their rings in the REQ's and REP's channel adapter
// GUID (cmShmMark) and take them; a link=udp side offers none, and both
// stay on UDP.
func TestCMAutoShm(t *testing.T) {
	la, lb := shmAddr(), shmAddr()
	for la == lb {
		lb = shmAddr()
	}
	a, b := cmFabricPairAt(t, la, lb, "", "")
	if pa, pb := a.Caps().Path, b.Caps().Path; pa != "shm" || pb != "shm" {
		t.Fatalf("Caps().Path = %q and %q, want shm and shm", pa, pb)
	}
	pingPongN(t, a.(*Endpoint), b.(*Endpoint), 5)
	if ca, cb := autoCounts(t, a.(*Endpoint)), autoCounts(t, b.(*Endpoint)); ca.ShmRx < 5 || cb.ShmRx < 5 {
		t.Fatalf("5 round trips through the rings: a %+v, b %+v", ca, cb)
	}
	lc := shmAddr()
	for lc == la || lc == lb {
		lc = shmAddr()
	}
	c, d := cmFabricPairAt(t, la, lc, "", "link=udp")
	if pc, pd := c.Caps().Path, d.Caps().Path; pc != "udp" || pd != "udp" {
		t.Fatalf("against a link=udp peer: Caps().Path = %q and %q, want udp and udp", pc, pd)
	}
	pingPongN(t, c.(*Endpoint), d.(*Endpoint), 5)
}
