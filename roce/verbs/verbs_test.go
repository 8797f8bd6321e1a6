package verbs

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/roce/exchange"
	"github.com/weft-io/weft/roce/wire"
)

func TestParseAddr(t *testing.T) {
	o, err := ParseAddr("listen:10.0.0.1?dev=mlx5_0&ib_port=2&gid=3&type=ud&mtu=4096&timeout=12&retry=5&rnr=6&qkey=0x1234&keepalive=0&dialretry=-1&maxmsg=8192&depth=64&inline=1024&signal=8")
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Listen: true, Bootstrap: "10.0.0.1:18515", Device: "mlx5_0", Port: 2, GIDIndex: 3, Type: wire.UD,
		MTU: 4096, Timeout: 12, Retry: 5, RNRRetry: 6, QKey: 0x1234, DialRetry: -1, MaxMsg: 8192, Depth: 64, Inline: 1024, Signal: 8}
	if o != want {
		t.Errorf("ParseAddr = %+v\nwant %+v", o, want)
	}
	o, err = ParseAddr("[fd00::1]:9999")
	if err != nil || o.Listen || o.Bootstrap != "[fd00::1]:9999" || o.Type != wire.RC || o.GIDIndex != -1 ||
		o.KeepAlive != 100*time.Millisecond || o.Timeout != 14 || o.DialRetry != exchange.DefaultDialRetry {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	for _, bad := range []string{"", "h?mtu=1000", "h?type=uc", "h?nope=1", "h?gid=x", "h?keepalive=-1s", "h?dialretry=-2s", "h?dialretry=x", "h?local=banana", "h?%zz",
		"h?data=x", "h?resp_res=1", "rdmacm://", "rdmacm://h?gid=1", "rdmacm://h?dev=rxe0", "rdmacm://h?mtu=1024",
		"rdmacm://h?qkey=1", "rdmacm://h?ib_port=1", "rdmacm://h?resp_res=300",
		"rdmacm://h?data=" + strings.Repeat("x", 57), "rdmacm://listen:h?data=" + strings.Repeat("x", 197)} {
		if _, err := ParseAddr(bad); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("ParseAddr(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// rdma_cm addresses: the scheme or cm=1, port 7471 by default, the
// connection parameters of librdmacm.
func TestParseAddrCM(t *testing.T) {
	o, err := ParseAddr("rdmacm://10.0.0.2?data=hello&resp_res=4&init_depth=2&retry=5&local=10.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if !o.CM || o.Listen || o.Bootstrap != "10.0.0.2:7471" || o.PrivateData != "hello" || o.RespRes != 4 || o.InitDepth != 2 ||
		o.Retry != 5 || o.Local.String() != "10.0.0.1" || o.Timeout != 0 {
		t.Errorf("ParseAddr = %+v", o)
	}
	o, err = ParseAddr("rdmacm://listen:[fd00::1]:9000?data=" + strings.Repeat("x", 196))
	if err != nil || !o.CM || !o.Listen || o.Bootstrap != "[fd00::1]:9000" {
		t.Errorf("listen: %+v, %v", o, err)
	}
	o, err = ParseAddr("10.0.0.2:7000?cm=1&maxmsg=4096&timeout=12")
	if err != nil || !o.CM || o.Bootstrap != "10.0.0.2:7000" || o.MaxMsg != 4096 || o.Timeout != 12 {
		t.Errorf("cm=1: %+v, %v", o, err)
	}
	if _, err := ParseAddr("rdmacm://h?type=ud"); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("rdma_cm UD: %v, want ErrNotSupported", err)
	}
	// The pingpong form listens nowhere: Listen says so.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if l, err := fabric.Listen(ctx, "verbs", "127.0.0.1:0", nil); !errors.Is(err, fabric.ErrNotSupported) {
		if l != nil {
			l.Close()
		}
		t.Errorf("Listen on a pingpong address: %v, want ErrNotSupported", err)
	}
	if _, err := fabric.Listen(ctx, "verbs", "rdmacm://h?gid=1", nil); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("Listen on a bad address: %v, want ErrInvalid", err)
	}
}

func TestRegistered(t *testing.T) {
	u, err := fabric.Usage("verbs")
	if err != nil || u == "" {
		t.Fatalf("Usage(verbs) = %q, %v", u, err)
	}
}

// Without the binding, every way in says ErrNotSupported, at once.
func TestStub(t *testing.T) {
	if Supported {
		t.Skip("this build has the binding (rdma tag)")
	}
	if _, err := Devices(); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("Devices: %v, want ErrNotSupported", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, err := fabric.Open(ctx, "verbs", "127.0.0.1:1", nil)
	if ep != nil || !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("Open: %v, %v; want ErrNotSupported", ep, err)
	}
	if _, err := fabric.Open(ctx, "verbs", "rdmacm://127.0.0.1:1", nil); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("Open rdmacm: %v; want ErrNotSupported", err)
	}
	if _, err := fabric.Listen(ctx, "verbs", "rdmacm://127.0.0.1:0", nil); !errors.Is(err, fabric.ErrNotSupported) {
		t.Errorf("Listen rdmacm: %v; want ErrNotSupported", err)
	}
}

func ExampleParseAddr() {
	o, _ := ParseAddr("listen:10.77.0.2?dev=rxe0&mtu=1024")
	_ = o // o.Listen, o.Bootstrap == "10.77.0.2:18515", o.Device == "rxe0"
}

// Failed rdma_cm events match their errno and the fabric sentinel.
func TestCMError(t *testing.T) {
	for _, c := range []struct {
		errno syscall.Errno
		want  error
	}{
		{syscall.ETIMEDOUT, context.DeadlineExceeded},
		{syscall.ENODEV, fabric.ErrNotSupported},
		{syscall.EADDRNOTAVAIL, ErrNoDevice},
		{syscall.ECONNREFUSED, fabric.ErrRefused},
		{syscall.EHOSTUNREACH, fabric.ErrPeerGone},
		{syscall.ENETUNREACH, fabric.ErrPeerGone},
	} {
		err := error(&CMError{Event: "RDMA_CM_EVENT_ADDR_ERROR", Status: -int(c.errno)})
		if !errors.Is(err, c.want) || !errors.Is(err, c.errno) {
			t.Errorf("%v: %v does not match %v and the errno", c.errno, err, c.want)
		}
		if errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("%v matches ErrInvalid", err)
		}
	}
	err := error(&CMError{Event: "RDMA_CM_EVENT_CONNECT_ERROR", Status: 5})
	for _, s := range []error{fabric.ErrRefused, fabric.ErrPeerGone, context.DeadlineExceeded, fabric.ErrNotSupported} {
		if errors.Is(err, s) {
			t.Errorf("%v (a transport status) matches %v", err, s)
		}
	}
	if err.Error() == "" {
		t.Error("empty message")
	}
}

// TestBadAddrs: every address that cannot be valid fails through
// fabric.Open and fabric.Listen at once (before any device is looked
// for), with a nil interface and an error matching fabric.ErrInvalid that
// names the key, or the host or port at fault.
func TestBadAddrs(t *testing.T) {
	keys := []string{"type", "local", "timeout", "retry", "rnr", "keepalive", "dialretry", "maxmsg",
		"depth", "inline", "signal"}
	cases := fabrictest.BadAddrs("127.0.0.1:18515", append(keys, "ib_port", "gid", "mtu", "qkey")...)
	cases = append(cases, fabrictest.BadAddrs("rdmacm://127.0.0.1:7471", append(keys, "resp_res", "init_depth")...)...)
	for _, h := range []string{"", "rdmacm://"} {
		cases = append(cases, fabrictest.BadHostPorts(h)...)
	}
	fabrictest.TestBadAddrs(t, "verbs", cases)
}
