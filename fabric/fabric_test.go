package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func TestCheckSGEs(t *testing.T) {
	dom, other := &Domain{}, &Domain{}
	r := NewRegion(RegionConfig{Buf: make([]byte, 100), Access: AccessLocalWrite, Domain: dom})
	ro := NewRegion(RegionConfig{Buf: make([]byte, 100), Domain: dom})
	foreign := NewRegion(RegionConfig{Buf: make([]byte, 100), Domain: other})
	dead := NewRegion(RegionConfig{Buf: make([]byte, 100), Domain: dom})
	dead.Close()
	for _, c := range []struct {
		name string
		sges []SGE
		need Access
		want error
		n    int
	}{
		{"ok", []SGE{{Region: r, Offset: 10, Length: 20}, {Region: ro, Length: 5}}, 0, nil, 25},
		{"nil region", []SGE{{Length: 1}}, 0, ErrInvalid, 0},
		{"closed", []SGE{SGEOf(dead)}, 0, os.ErrClosed, 0},
		{"other domain", []SGE{SGEOf(foreign)}, 0, ErrInvalid, 0},
		{"past end", []SGE{{Region: r, Offset: 90, Length: 11}}, 0, ErrBounds, 0},
		{"negative offset", []SGE{{Region: r, Offset: -1, Length: 1}}, 0, ErrBounds, 0},
		{"negative length", []SGE{{Region: r, Length: -1}}, 0, ErrBounds, 0},
		{"huge offset", []SGE{{Region: r, Offset: 1 << 62, Length: 1}}, 0, ErrBounds, 0},
		{"no local write", []SGE{SGEOf(ro)}, AccessLocalWrite, ErrAccess, 0},
		{"local write", []SGE{SGEOf(r)}, AccessLocalWrite, nil, 100},
	} {
		n, err := CheckSGEs(c.sges, dom, c.need)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) || n != c.n {
			t.Errorf("%s: CheckSGEs = %d, %v; want %d, %v", c.name, n, err, c.n, c.want)
		}
	}
	if n, err := CheckSGEs([]SGE{SGEOf(foreign)}, nil, 0); err != nil || n != 100 {
		t.Errorf("nil domain skips the domain check: %d, %v", n, err)
	}
}

func TestGatherScatter(t *testing.T) {
	a := NewRegion(RegionConfig{Buf: []byte("hello, "), Access: AccessLocalWrite})
	b := NewRegion(RegionConfig{Buf: []byte("world!"), Access: AccessLocalWrite})
	sges := []SGE{SGEOf(a), {Region: b, Length: 5}}
	dst := make([]byte, 20)
	if n := Gather(dst, sges); n != 12 || string(dst[:n]) != "hello, world" {
		t.Fatalf("Gather = %d %q", n, dst[:n])
	}
	if n := Gather(dst[:4], sges); n != 4 || string(dst[:4]) != "hell" {
		t.Fatalf("short Gather = %d %q", n, dst[:4])
	}
	if n := Scatter(sges, []byte("ABCDEFGHIJKLMNOP")); n != 12 || string(a.Bytes()) != "ABCDEFG" || string(b.Bytes()) != "HIJKL!" {
		t.Fatalf("Scatter = %d %q %q", n, a.Bytes(), b.Bytes())
	}
	if SGELen(sges) != 12 {
		t.Fatal("SGELen")
	}
	if (SGE{Region: a, Offset: 5, Length: 5}).Bytes() != nil {
		t.Fatal("SGE.Bytes past the end")
	}
}

func TestRegion(t *testing.T) {
	calls := 0
	r := NewRegion(RegionConfig{Buf: make([]byte, 64), Access: AccessLocalWrite | AccessRemoteRead, LocalKey: 1,
		RemoteKey: 2, Addr: 0x1000, Deregister: func() error { calls++; return errors.New("boom") }})
	if got := r.Remote(); got != (RemoteIOV{Addr: 0x1000, Len: 64, Key: 2}) {
		t.Fatalf("Remote = %v", got)
	}
	if got := r.Remote().Slice(8, 16); got.Addr != 0x1008 || got.Len != 16 {
		t.Fatalf("Slice = %v", got)
	}
	e1, e2 := r.Close(), r.Close()
	if calls != 1 || e1 == nil || e1 != e2 || !r.Closed() {
		t.Fatalf("Close: %d calls, %v, %v", calls, e1, e2)
	}
	if s := (AccessLocalWrite | AccessRemoteWrite).String(); s != "local-write|remote-write" {
		t.Fatalf("Access.String = %q", s)
	}
	if Access(0).String() != "none" || !AccessRemote.Has(AccessRemoteRead) {
		t.Fatal("Access helpers")
	}
}

func TestStatus(t *testing.T) {
	if StatusOK.Err() != nil {
		t.Fatal("StatusOK.Err")
	}
	for s := StatusOK + 1; s < numStatus; s++ {
		if s.Err() == nil || s.String() == "" || s.Err().Error() != s.String() {
			t.Errorf("status %d: %v %q", s, s.Err(), s)
		}
	}
	if !errors.Is(StatusRetryExceeded.Err(), ErrPeerGone) || !errors.Is(StatusRemoteAccess.Err(), ErrAccess) ||
		errors.Is(StatusRemoteAccess.Err(), ErrBounds) || !errors.Is(StatusFlushed.Err(), ErrFlushed) {
		t.Fatal("status error mapping")
	}
	if n := testing.AllocsPerRun(100, func() { _ = StatusRemoteBounds.Err() }); n != 0 {
		t.Fatalf("Status.Err allocates %v", n)
	}
	oe := &OpError{Op: "send", Backend: "ntb", Addr: "x", Err: ErrPeerGone}
	if !errors.Is(oe, ErrPeerGone) || oe.Error() != "ntb send x: peer gone" {
		t.Fatalf("OpError: %v", oe)
	}
}

type nopDriver struct{}

func (nopDriver) Open(context.Context, string, Options) (Endpoint, error) {
	return nil, ErrNotSupported
}
func (nopDriver) Usage() string { return "nothing" }

// registered counts the test backends registered in this process: the
// registry has no Unregister, and -count=N runs each test N times.
var registered atomic.Int64

// testBackend registers d under a name that no earlier run took.
func testBackend(prefix string, d Driver) string {
	name := fmt.Sprintf("%s-%d", prefix, registered.Add(1))
	RegisterBackend(name, d)
	return name
}

func TestRegistry(t *testing.T) {
	name := testBackend("test-nop", nopDriver{})
	defer func() {
		if recover() == nil {
			t.Error("registering a name twice did not panic")
		}
	}()
	if u, err := Usage(name); err != nil || u != "nothing" {
		t.Fatalf("Usage = %q, %v", u, err)
	}
	if _, err := Open(context.Background(), name, "", nil); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Open = %v", err)
	}
	found := false
	for _, b := range Backends() {
		found = found || b == name
	}
	if !found {
		t.Fatal("Backends misses", name)
	}
	RegisterBackend(name, nopDriver{})
}

func TestSpinBudget(t *testing.T) {
	if (*Options)(nil).SpinBudget() != DefaultSpin || (&Options{Spin: -1}).SpinBudget() != 0 ||
		(&Options{Spin: time.Second}).SpinBudget() != time.Second {
		t.Fatal("SpinBudget")
	}
}

// typedNilDriver fails the way a careless driver does: a nil pointer of
// its own endpoint and listener types, with an error.
type typedNilDriver struct{}

type typedNilEndpoint struct{ Endpoint }
type typedNilListener struct{ Listener }

func (typedNilDriver) Open(context.Context, string, Options) (Endpoint, error) {
	var ep *typedNilEndpoint
	return ep, ErrInvalid
}
func (typedNilDriver) Listen(context.Context, string, Options) (Listener, error) {
	var l *typedNilListener
	return l, ErrInvalid
}
func (typedNilDriver) Usage() string { return "fails" }

// TestFailedOpenIsNil: whatever the driver returns beside an error, a
// failed Open or Listen returns a nil interface, which the caller may
// compare with nil.
func TestFailedOpenIsNil(t *testing.T) {
	name := testBackend("test-typed-nil", typedNilDriver{})
	ep, err := Open(context.Background(), name, "", nil)
	if err == nil || ep != nil {
		t.Errorf("Open = %#v, %v; want a nil Endpoint and an error", ep, err)
	}
	l, err := Listen(context.Background(), name, "", nil)
	if err == nil || l != nil {
		t.Errorf("Listen = %#v, %v; want a nil Listener and an error", l, err)
	}
}

// TestOpErrorQuotesAddr: an address with bytes that do not print is
// quoted in the message; a plain one is not.
func TestOpErrorQuotesAddr(t *testing.T) {
	for addr, want := range map[string]string{
		"eth0\x00":   `ntb open "eth0\x00": invalid argument`,
		"a\xffb":     `ntb open "a\xffb": invalid argument`,
		"/dev/shm/x": `ntb open /dev/shm/x: invalid argument`,
	} {
		if got := (&OpError{Op: "open", Backend: "ntb", Addr: addr, Err: ErrInvalid}).Error(); got != want {
			t.Errorf("OpError for %q = %s, want %s", addr, got, want)
		}
	}
}

// TestSGEBounds: an SGE is in bounds up to exactly its region's end; one
// byte past, a negative offset or length, or no region gives nothing.
func TestSGEBounds(t *testing.T) {
	dom := &Domain{}
	r := NewRegion(RegionConfig{Buf: make([]byte, 100), Domain: dom})
	for _, c := range []struct {
		s  SGE
		ok bool
	}{
		{SGE{Region: r, Offset: 0, Length: 100}, true},
		{SGE{Region: r, Offset: 99, Length: 1}, true},
		{SGE{Region: r, Offset: 100, Length: 0}, true},
		{SGE{Region: r, Offset: 100, Length: 1}, false},
		{SGE{Region: r, Offset: 0, Length: 101}, false},
		{SGE{Region: r, Offset: 1, Length: 100}, false},
		{SGE{Region: r, Offset: -1, Length: 1}, false},
		{SGE{Region: r, Offset: 0, Length: -1}, false},
		{SGE{Offset: 0, Length: 0}, false},
	} {
		b := c.s.Bytes()
		if (b != nil) != c.ok || (c.ok && len(b) != c.s.Length) {
			t.Errorf("%+v: Bytes = %d bytes (nil %v), want ok %v", c.s, len(b), b == nil, c.ok)
		}
		_, err := CheckSGEs([]SGE{c.s}, dom, 0)
		if (err == nil) != c.ok {
			t.Errorf("%+v: CheckSGEs = %v, want ok %v", c.s, err, c.ok)
		}
	}
}

// TestHostDomain: a domain that takes host memory accepts regions of
// HostDomain; one that does not refuses them.
func TestHostDomain(t *testing.T) {
	host := NewRegion(RegionConfig{Buf: make([]byte, 8), Domain: HostDomain})
	if _, err := CheckSGEs([]SGE{SGEOf(host)}, &Domain{HostMemory: true}, 0); err != nil {
		t.Fatalf("a host-memory domain refused a host region: %v", err)
	}
	if _, err := CheckSGEs([]SGE{SGEOf(host)}, &Domain{}, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a device domain took a host region: %v", err)
	}
}

// TestOptionDefaults: zero and negative select the default; any positive
// value is taken as it is.
func TestOptionDefaults(t *testing.T) {
	for _, c := range []struct {
		o       *Options
		backlog int
		hs      time.Duration
	}{
		{nil, DefaultBacklog, DefaultHandshakeTimeout},
		{&Options{}, DefaultBacklog, DefaultHandshakeTimeout},
		{&Options{Backlog: -1, HandshakeTimeout: -1}, DefaultBacklog, DefaultHandshakeTimeout},
		{&Options{Backlog: 1, HandshakeTimeout: 1}, 1, 1},
	} {
		if b, h := c.o.BacklogSize(), c.o.HandshakeLimit(); b != c.backlog || h != c.hs {
			t.Errorf("%+v: BacklogSize %d, HandshakeLimit %v; want %d, %v", c.o, b, h, c.backlog, c.hs)
		}
	}
}

// TestUnknownBackend: Open and Listen of a backend nobody registered say
// so (ErrUnknownBackend), not that the backend cannot listen.
func TestUnknownBackend(t *testing.T) {
	if _, err := Listen(context.Background(), "no-such-backend", "x", nil); !errors.Is(err, ErrUnknownBackend) || errors.Is(err, ErrNotSupported) {
		t.Errorf("Listen = %v, want ErrUnknownBackend", err)
	}
	if _, err := Open(context.Background(), "no-such-backend", "x", nil); !errors.Is(err, ErrUnknownBackend) {
		t.Errorf("Open = %v, want ErrUnknownBackend", err)
	}
}

// TestPeerClosedMatches: ErrPeerClosed is its own sentinel and also
// matches ErrPeerGone (a peer that closed is gone), but not the reverse
// nor any other sentinel.
func TestPeerClosedMatches(t *testing.T) {
	wrapped := fmt.Errorf("send: %w", ErrPeerClosed)
	if !errors.Is(wrapped, ErrPeerClosed) || !errors.Is(wrapped, ErrPeerGone) {
		t.Fatalf("%v does not match ErrPeerClosed and ErrPeerGone", wrapped)
	}
	if errors.Is(ErrPeerGone, ErrPeerClosed) || errors.Is(ErrPeerClosed, ErrInvalid) || errors.Is(ErrPeerClosed, ErrClosed) {
		t.Fatal("ErrPeerClosed matches what it is not")
	}
}
