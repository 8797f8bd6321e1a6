//go:build linux && cgo && rdma

package verbs

// Tests of the binding itself. Those that need an RDMA device skip
// without one (and fail under CI=true); roce/verbs/rxe_test.go runs them
// inside the Soft-RoCE VMs, where rxe0 is, with CI=true.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/ibvpp"
	"github.com/weft-io/weft/internal/testenv"
	_ "github.com/weft-io/weft/roce" // the user-space engine, for the mixed tests
	"github.com/weft-io/weft/roce/cm"
)

// TestDevicesNoRDMA checks the mapping of a kernel without RDMA (libibverbs
// says ENOSYS) to ErrNoDevice, on hosts that have no device.
func TestDevicesNoRDMA(t *testing.T) {
	devs, err := Devices()
	if err == nil {
		// CI runs this test on its host without RDMA to check the mapping;
		// a host that grew a device would no longer check it.
		testenv.SkipOrFail(t, fmt.Sprintf("this host has RDMA devices (%d): the no-RDMA mapping cannot be checked", len(devs)))
	}
	if !errors.Is(err, ErrNoDevice) || !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("Devices: %v; want ErrNoDevice (and ErrNotSupported)", err)
	}
	t.Logf("Devices: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Open fails with the same error once the exchange connects.
	errc := make(chan error, 1)
	go func() {
		_, err := fabric.Open(ctx, "verbs", "listen:127.0.0.1:18777", nil)
		errc <- err
	}()
	_, err = fabric.Open(ctx, "verbs", "127.0.0.1:18777", nil)
	if !errors.Is(err, ErrNoDevice) {
		t.Errorf("Open (dialer): %v, want ErrNoDevice", err)
	}
	if err := testenv.Recv(t, errc, "the listener's Open"); !errors.Is(err, ErrNoDevice) {
		t.Errorf("Open (listener): %v, want ErrNoDevice", err)
	}
	// rdma_cm: librdmacm finds no device either (no /dev/infiniband).
	if _, err := fabric.Open(ctx, "verbs", "rdmacm://127.0.0.1:7471", nil); !errors.Is(err, ErrNoDevice) {
		t.Errorf("Open rdmacm: %v, want ErrNoDevice", err)
	}
	if _, err := fabric.Listen(ctx, "verbs", "rdmacm://127.0.0.1:0", nil); !errors.Is(err, ErrNoDevice) || !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("Listen rdmacm: %v, want ErrNoDevice", err)
	}
}

// device returns the first device's RoCEv2 IPv4 address, or skips.
func device(t testing.TB) (DeviceInfo, netip.Addr) {
	t.Helper()
	devs, err := Devices()
	if err != nil {
		testenv.SkipOrFail(t, fmt.Sprintf("no RDMA device: %v", err))
	}
	for _, d := range devs {
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				if g.Type == GIDRoCEv2 && g.Addr().Is4() {
					return d, g.Addr()
				}
			}
		}
	}
	testenv.SkipOrFail(t, "no device with an IPv4 RoCEv2 GID")
	return DeviceInfo{}, netip.Addr{}
}

var portSeq atomic.Uint32

// loopPair connects two endpoints on the same device (through its own
// GID), with the exchange over loopback TCP.
func loopPair(t testing.TB, params string) (a, b fabric.Endpoint) {
	t.Helper()
	_, ip := device(t)
	port := 19000 + int(portSeq.Add(1))%2000
	q := "?local=" + ip.String() + "&maxmsg=65536"
	if params != "" {
		q += "&" + params
	}
	return fabrictest.OpenPair(t, 60*time.Second, func(ctx context.Context, s fabrictest.Side) (fabric.Endpoint, error) {
		if s == fabrictest.SideA {
			return fabric.Open(ctx, "verbs", "listen:127.0.0.1:"+strconv.Itoa(port)+q, nil)
		}
		return fabric.Open(ctx, "verbs", "127.0.0.1:"+strconv.Itoa(port)+q, nil)
	})
}

func TestDevices(t *testing.T) {
	d, ip := device(t)
	t.Logf("%s: guid %#x, max_qp_wr %d, max_sge %d, atomics %v, ports %+v", d.Name, d.GUID, d.MaxQPWR, d.MaxSGE, d.Atomics, d.Ports)
	name, port, idx, err := FindGID([]DeviceInfo{d}, "", ip)
	if err != nil || name != d.Name || port == 0 {
		t.Fatalf("FindGID(%v) = %s %d %d %v", ip, name, port, idx, err)
	}
	if _, _, _, err := FindGID([]DeviceInfo{d}, "", netip.MustParseAddr("192.0.2.99")); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("FindGID of a foreign address: %v", err)
	}
}

// TestConformance runs the suite on two endpoints of one device.
func TestConformance(t *testing.T) {
	device(t)
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) { return loopPair(t, "") })
}

func TestConformanceUD(t *testing.T) {
	device(t)
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) { return loopPair(t, "type=ud") })
}

// TestAtomics runs fetch-and-add and compare-and-swap against a region of
// the peer, and checks them refused without the permission.
func TestAtomics(t *testing.T) {
	a, b := loopPair(t, "")
	defer a.Close()
	defer b.Close()
	ea := a.(*Endpoint)
	if !a.Caps().Atomics {
		t.Skip("device without atomics")
	}
	target, err := b.Alloc(64, fabric.AccessLocalWrite|fabric.AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(target.Bytes(), 40)
	old, _ := a.Alloc(8, fabric.AccessLocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wait := func(want uint64) fabric.Completion {
		t.Helper()
		out := make([]fabric.Completion, 1)
		if _, err := a.CQ().Wait(ctx, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Context != want {
			t.Fatalf("completion %+v, want context %d", out[0], want)
		}
		return out[0]
	}
	if err := ea.FetchAdd(fabric.SGEOf(old), target.Remote().Slice(0, 8), 2, 1, fabric.FlagSignal); err != nil {
		t.Fatal(err)
	}
	if c := wait(1); c.Err() != nil || binary.LittleEndian.Uint64(old.Bytes()) != 40 {
		t.Fatalf("fetch-add: %v, old %d", c.Err(), binary.LittleEndian.Uint64(old.Bytes()))
	}
	if err := ea.CompareSwap(fabric.SGEOf(old), target.Remote().Slice(0, 8), 42, 7, 2, fabric.FlagSignal); err != nil {
		t.Fatal(err)
	}
	if c := wait(2); c.Err() != nil || binary.LittleEndian.Uint64(old.Bytes()) != 42 {
		t.Fatalf("compare-swap: %v, old %d", c.Err(), binary.LittleEndian.Uint64(old.Bytes()))
	}
	if got := binary.LittleEndian.Uint64(target.Bytes()); got != 7 {
		t.Fatalf("target %d after the swap, want 7", got)
	}
	if err := ea.FetchAdd(fabric.SGE{Region: old, Length: 4}, target.Remote(), 1, 3, 0); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("4-byte atomic: %v", err)
	}
	noAtomic, _ := b.Alloc(64, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	if err := ea.FetchAdd(fabric.SGEOf(old), noAtomic.Remote().Slice(0, 8), 1, 4, 0); err != nil {
		t.Fatal(err)
	}
	if c := wait(4); !errors.Is(c.Err(), fabric.ErrAccess) {
		t.Fatalf("atomic without permission: %+v (%v), want ErrAccess", c, c.Err())
	}
}

// TestZeroAllocs: the burst paths allocate nothing.
func TestZeroAllocs(t *testing.T) {
	a, b := loopPair(t, "")
	defer a.Close()
	defer b.Close()
	sreg, _ := a.Alloc(4096, 0)
	rreg, _ := b.Alloc(4096, fabric.AccessLocalWrite)
	rem, _ := b.Alloc(4096, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	smsgs := make([]fabric.Message, 8)
	for i := range smsgs {
		smsgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: sreg, Offset: 64 * i, Length: 64}}}
	}
	wmsgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: sreg, Length: 1024}}, Remote: rem.Remote().Slice(0, 1024)}}
	rmsgs := make([]fabric.Message, 8)
	for i := range rmsgs {
		rmsgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: rreg, Offset: 512 * i, Length: 512}}}
	}
	comps := make([]fabric.Completion, 16)
	allocs := testing.AllocsPerRun(200, func() {
		n, err := a.Send(smsgs)
		if err != nil {
			t.Fatal(err)
		}
		for got := 0; got < n; {
			k, err := b.Recv(rmsgs)
			if err != nil {
				t.Fatal(err)
			}
			got += k
		}
		if _, err := a.Write(wmsgs); err != nil {
			t.Fatal(err)
		}
		a.CQ().Poll(comps)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Send+Recv+Write+Poll burst, want 0", allocs)
	}
	views := make([]fabric.View, 8)
	vr := b.(fabric.ViewReceiver)
	allocs = testing.AllocsPerRun(200, func() {
		n, err := a.Send(smsgs)
		if err != nil {
			t.Fatal(err)
		}
		for got := 0; got < n; {
			k, err := vr.RecvViews(views)
			if err != nil {
				t.Fatal(err)
			}
			if err := vr.ReleaseViews(k); err != nil {
				t.Fatal(err)
			}
			got += k
		}
		a.CQ().Poll(comps)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Send+RecvViews+ReleaseViews burst, want 0", allocs)
	}
}

// TestPeerGone: when the peer closes, the keep-alive notices and the
// endpoint reports ErrPeerGone.
func TestPeerGone(t *testing.T) {
	params := ""
	if p := os.Getenv("WEFT_PG_PARAMS"); p != "" {
		params = p
	}
	a, b := loopPair(t, params)
	defer a.Close()
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	reg, _ := a.Alloc(64, fabric.AccessLocalWrite)
	_, err := a.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}})
	if !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("RecvWait after the peer closed: %v, want ErrPeerGone", err)
	}
	t.Logf("peer loss noticed in %v", time.Since(start))
	select {
	case ev := <-a.Events():
		if ev.Kind != fabric.EventPeerGone {
			t.Errorf("event %v", ev.Kind)
		}
	default:
		t.Errorf("no event")
	}
}

// ---- rdma_cm (cm_rdma.go) on one device ----

// cmSetup is how the rdma_cm cases reach the device: a listener on its
// IPv4 address, port 0 (the rdma_cm picks one), and the query that both
// ends take.
func cmSetup(t testing.TB, params string) (addr, query string, opts *fabric.Options) {
	_, ip := device(t)
	query = "?maxmsg=65536"
	if params != "" {
		query += "&" + params
	}
	return "rdmacm://" + ip.String() + ":0" + query, query, &fabric.Options{HandshakeTimeout: 30 * time.Second}
}

// cmPair connects two endpoints through a verbs listener: a is accepted,
// b dialled, both with params.
func cmPair(t testing.TB, params string) (a, b fabric.Endpoint) {
	addr, query, opts := cmSetup(t, params)
	a, b = fabrictest.ListenPairDial(t, "verbs", addr, func(l fabric.Listener) string { return l.Addr() + query }, opts)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestConformanceCM runs the suite over rdma_cm connections.
func TestConformanceCM(t *testing.T) {
	device(t)
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) { return cmPair(t, "") })
}

// TestListenerCM runs the listener cases on the verbs listener, with
// fewer clients and messages than on the host backends: Soft-RoCE in an
// emulated VM is slow.
func TestListenerCM(t *testing.T) {
	addr, _, opts := cmSetup(t, "")
	fabrictest.TestListener(t, fabrictest.ListenSetup{Backend: "verbs", Addr: addr, Options: opts, Clients: 8, Messages: 300})
}

// TestCMPeerGone: Close disconnects (DREQ), and the peer sees
// EventPeerGone and ErrPeerGone at once, without waiting for the
// keep-alive (off here).
func TestCMPeerGone(t *testing.T) {
	a, b := cmPair(t, "keepalive=0")
	if a.RemoteAddr() == "" || a.LocalAddr() == "" || b.RemoteAddr() != a.LocalAddr() {
		t.Errorf("addresses: accepted %q %q, dialled %q %q", a.LocalAddr(), a.RemoteAddr(), b.LocalAddr(), b.RemoteAddr())
	}
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, _ := a.Alloc(64, fabric.AccessLocalWrite)
	_, err := a.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}})
	if !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("RecvWait after the peer's Close: %v, want ErrPeerGone", err)
	}
	select {
	case ev := <-a.Events():
		if ev.Kind != fabric.EventPeerGone {
			t.Errorf("event %v, want EventPeerGone", ev.Kind)
		}
	case <-ctx.Done():
		t.Errorf("no event")
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close after the peer's: %v", err)
	}
	if _, err := a.Send(nil); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Send after Close: %v, want os.ErrClosed", err)
	}
}

// TestCMRefused: a connect to a port nobody listens on is rejected by
// the kernel (REJ reason 8), a fabric.ErrRefused at once; then the
// private data of both sides arrives.
func TestCMRefused(t *testing.T) {
	_, ip := device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := fabric.Open(ctx, "verbs", "rdmacm://"+ip.String()+":1", nil)
	var rej *cm.RejectError
	if !errors.Is(err, fabric.ErrRefused) || !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID {
		t.Fatalf("Open with nobody listening: %v, want a REJ (invalid service id) matching ErrRefused", err)
	}
	t.Logf("refused in %v: %v", time.Since(start), err)

	// Each side's data= reaches the other: the REQ's the listener, the
	// REP's the dialler.
	addr, _, opts := cmSetup(t, "data=from-listener")
	a, b := fabrictest.ListenPairDial(t, "verbs", addr, func(l fabric.Listener) string { return l.Addr() + "?data=from-dialler" }, opts)
	defer a.Close()
	defer b.Close()
	t.Logf("private data as librdmacm delivers it: %d bytes to the listener, %d to the dialler",
		len(a.(*Endpoint).PeerPrivateData()), len(b.(*Endpoint).PeerPrivateData()))
	if got := string(bytes.TrimRight(a.(*Endpoint).PeerPrivateData(), "\x00")); got != "from-dialler" {
		t.Errorf("accepted side got private data %q, want the dialler's", got)
	}
	if got := string(bytes.TrimRight(b.(*Endpoint).PeerPrivateData(), "\x00")); got != "from-listener" {
		t.Errorf("dialled side got private data %q, want the listener's", got)
	}
}

// ---- the steps that the VM test (rxe_test.go) runs in the guests ----

func guestEnv(t *testing.T, k string) string {
	v := os.Getenv(k)
	if v == "" {
		t.Skipf("%s not set: run by roce/verbs/rxe_test.go in the Soft-RoCE guests", k)
	}
	return v
}

// TestGuestSide runs one side of the conformance suite against a peer on
// another host: WEFT_SIDE is A or B, WEFT_ADDR the address (side A
// listens), WEFT_BACKEND verbs (default) or roce.
func TestGuestSide(t *testing.T) {
	side := fabrictest.SideA
	if guestEnv(t, "WEFT_SIDE") == "B" {
		side = fabrictest.SideB
	}
	addr := guestEnv(t, "WEFT_ADDR")
	backend := os.Getenv("WEFT_BACKEND")
	if backend == "" {
		backend = "verbs"
	}
	first := true
	fabrictest.TestSide(t, side, func(t testing.TB, key string, s fabrictest.Side) fabric.Endpoint {
		d := 2 * time.Minute
		if first {
			d, first = 10*time.Minute, false // the peer may still be booting
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		ep, err := openRetry(ctx, backend, addr)
		if err != nil {
			t.Fatalf("Open(%s, %s): %v", backend, addr, err)
		}
		return ep
	})
}

// openRetry opens addr, dialling again while an rdma_cm peer refuses (it
// does not listen yet) or does not answer (it is still booting).
func openRetry(ctx context.Context, backend, addr string) (fabric.Endpoint, error) {
	for {
		ep, err := fabric.Open(ctx, backend, addr, nil)
		if err == nil || ctx.Err() != nil || !(errors.Is(err, fabric.ErrRefused) || errors.Is(err, context.DeadlineExceeded)) {
			return ep, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestGuestRdmaCM plays the protocol of librdmacm's rdma_client and
// rdma_server (one 16-byte SEND each way, the client's first) against the
// real programs, through the public API: WEFT_RC_ADDR is the rdmacm://
// address, with "listen:" for the server's part. The program disconnects
// after its last completion, which the endpoint must see as the peer's
// loss.
func TestGuestRdmaCM(t *testing.T) {
	addr := guestEnv(t, "WEFT_RC_ADDR")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ep, err := openRetry(ctx, "verbs", addr)
	if err != nil {
		t.Fatalf("Open(%s): %v", addr, err)
	}
	defer ep.Close()
	t.Logf("connected: local %s, remote %s, caps %+v", ep.LocalAddr(), ep.RemoteAddr(), ep.Caps())
	sreg, _ := ep.Alloc(16, 0)
	copy(sreg.Bytes(), "weft-rdmacm-0016")
	rreg, _ := ep.Alloc(64, fabric.AccessLocalWrite)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rreg)}}}
	recv := func() {
		t.Helper()
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			t.Fatalf("RecvWait: %v", err)
		}
		if msgs[0].Len != 16 {
			t.Fatalf("received %d bytes, want 16", msgs[0].Len)
		}
	}
	send := func() {
		t.Helper()
		if _, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(sreg)}}}); err != nil {
			t.Fatalf("SendWait: %v", err)
		}
	}
	if strings.Contains(addr, "listen:") {
		recv()
		send()
	} else {
		send()
		recv()
	}
	// The program's rdma_disconnect: its DREQ ends our endpoint.
	if _, err := ep.RecvWait(ctx, msgs); !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("RecvWait after the exchange: %v, want ErrPeerGone (the program's DREQ)", err)
	}
	select {
	case ev := <-ep.Events():
		if ev.Kind != fabric.EventPeerGone {
			t.Errorf("event %v, want EventPeerGone", ev.Kind)
		}
	case <-ctx.Done():
		t.Error("no EventPeerGone")
	}
}

// TestGuestPingpong plays ibv_*_pingpong's protocol against the real
// program: WEFT_PP_ADDR is the verbs address, WEFT_PP_SIZE the message
// size, WEFT_PP_CLIENT=1 makes this side send first.
func TestGuestPingpong(t *testing.T) {
	addr := guestEnv(t, "WEFT_PP_ADDR")
	size, _ := strconv.Atoi(guestEnv(t, "WEFT_PP_SIZE"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := ibvpp.Run(ctx, ibvpp.Config{Backend: "verbs", Addr: addr, Size: size, Iters: 50, Client: os.Getenv("WEFT_PP_CLIENT") == "1"}); err != nil {
		t.Fatal(err)
	}
}

// rpingSize is rping's default ping size.
const rpingSize = 64

// TestGuestRping plays rping's protocol against the real program, through
// the public API (see roce/INTEROP.md, section 9): per ping the client
// SENDs the address, rkey and size (big-endian) of its source buffer, the
// server RDMA READs it and SENDs a go-ahead, the client advertises its
// sink, the server RDMA WRITEs the string back and SENDs a go-ahead; the
// client disconnects after the last ping. WEFT_RPING_ADDR is the rdmacm://
// address ("listen:" plays the server, for rping -c -V), WEFT_RPING_COUNT
// the number of pings.
func TestGuestRping(t *testing.T) {
	addr := guestEnv(t, "WEFT_RPING_ADDR")
	count, _ := strconv.Atoi(guestEnv(t, "WEFT_RPING_COUNT"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ep, err := openRetry(ctx, "verbs", addr)
	if err != nil {
		t.Fatalf("Open(%s): %v", addr, err)
	}
	defer ep.Close()
	info, _ := ep.Alloc(16, 0)
	in, _ := ep.Alloc(64, fabric.AccessLocalWrite)
	rw := fabric.AccessLocalWrite | fabric.AccessRemoteRead | fabric.AccessRemoteWrite
	buf, _ := ep.Alloc(rpingSize, rw)
	sink, _ := ep.Alloc(rpingSize, rw)
	comps := make([]fabric.Completion, 1)
	send := func() error {
		_, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(info)}}})
		return err
	}
	recv := func() error {
		m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(in)}}}
		if _, err := ep.RecvWait(ctx, m); err != nil {
			return err
		}
		if m[0].Len != 16 {
			return fmt.Errorf("rping message of %d bytes", m[0].Len)
		}
		return nil
	}
	advertise := func(r *fabric.Region) {
		b := info.Bytes()
		binary.BigEndian.PutUint64(b[0:], r.Addr())
		binary.BigEndian.PutUint32(b[8:], uint32(r.RemoteKey()))
		binary.BigEndian.PutUint32(b[12:], rpingSize)
	}
	rma := func(read bool, n int) error {
		b := in.Bytes()
		size := binary.BigEndian.Uint32(b[12:])
		if size == 0 || size > rpingSize {
			return fmt.Errorf("advertised %d bytes", size)
		}
		remote := fabric.RemoteIOV{Addr: binary.BigEndian.Uint64(b), Len: uint64(size), Key: fabric.Key(binary.BigEndian.Uint32(b[8:]))}
		n = min(n, int(size))
		m := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: n}}, Remote: remote.Slice(0, uint64(n)), Flags: fabric.FlagSignal}}
		post := ep.Write
		if read {
			post = ep.Read
		}
		if _, err := post(m); err != nil {
			return err
		}
		if _, err := ep.CQ().Wait(ctx, comps); err != nil {
			return err
		}
		return comps[0].Err()
	}
	if !strings.Contains(addr, "listen:") {
		start := buf.Bytes()
		first := byte(65)
		for ping := range count {
			n := copy(start, fmt.Sprintf("rdma-ping-%d: ", ping))
			for i, ch := n, first; i < rpingSize; i++ {
				start[i] = ch
				if ch++; ch > 122 {
					ch = 65
				}
			}
			if first++; first > 122 {
				first = 65
			}
			start[rpingSize-1] = 0
			clear(sink.Bytes())
			advertise(buf)
			if err := send(); err != nil {
				t.Fatalf("ping %d: %v", ping, err)
			}
			if err := recv(); err != nil { // the server has READ the source
				t.Fatalf("ping %d: %v", ping, err)
			}
			advertise(sink)
			if err := send(); err != nil {
				t.Fatalf("ping %d: %v", ping, err)
			}
			if err := recv(); err != nil { // the server has WRITTEN the sink
				t.Fatalf("ping %d: %v", ping, err)
			}
			if !bytes.Equal(start, sink.Bytes()) {
				t.Fatalf("ping %d: wrote back %q, want %q", ping, sink.Bytes(), start)
			}
		}
		return // Close disconnects: rping's server waits for the DREQ
	}
	for ping := 0; ; ping++ {
		if err := recv(); err != nil {
			if errors.Is(err, fabric.ErrPeerGone) && ping == count {
				return // the client disconnected after its last ping
			}
			t.Fatalf("after %d of %d pings: %v", ping, count, err)
		}
		if err := rma(true, rpingSize); err != nil {
			t.Fatalf("ping %d: read: %v", ping, err)
		}
		if err := send(); err != nil {
			t.Fatalf("ping %d: %v", ping, err)
		}
		if err := recv(); err != nil {
			t.Fatalf("ping %d: %v", ping, err)
		}
		n := bytes.IndexByte(buf.Bytes(), 0) + 1
		if n == 0 {
			n = rpingSize
		}
		if err := rma(false, n); err != nil {
			t.Fatalf("ping %d: write: %v", ping, err)
		}
		if err := send(); err != nil {
			t.Fatalf("ping %d: %v", ping, err)
		}
	}
}
