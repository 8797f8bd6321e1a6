package verbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce"
)

func TestParseAddr(t *testing.T) {
	o, err := ParseAddr("listen:10.0.0.1?dev=mlx5_0&ib_port=2&gid=3&type=ud&mtu=4096&timeout=12&retry=5&rnr=6&qkey=0x1234&keepalive=0&maxmsg=8192&depth=64&inline=1024&signal=8")
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Listen: true, Bootstrap: "10.0.0.1:18515", Device: "mlx5_0", Port: 2, GIDIndex: 3, Type: roce.UD,
		MTU: 4096, Timeout: 12, Retry: 5, RNRRetry: 6, QKey: 0x1234, MaxMsg: 8192, Depth: 64, Inline: 1024, Signal: 8}
	if o != want {
		t.Errorf("ParseAddr = %+v\nwant %+v", o, want)
	}
	o, err = ParseAddr("[fd00::1]:9999")
	if err != nil || o.Listen || o.Bootstrap != "[fd00::1]:9999" || o.Type != roce.RC || o.GIDIndex != -1 ||
		o.KeepAlive != 100*time.Millisecond || o.Timeout != 14 {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	for _, bad := range []string{"", "h?mtu=1000", "h?type=uc", "h?nope=1", "h?gid=x", "h?keepalive=-1s", "h?local=banana", "h?%zz"} {
		if _, err := ParseAddr(bad); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("ParseAddr(%q) = %v, want ErrInvalid", bad, err)
		}
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
}

func ExampleParseAddr() {
	o, _ := ParseAddr("listen:10.77.0.2?dev=rxe0&mtu=1024")
	_ = o // o.Listen, o.Bootstrap == "10.77.0.2:18515", o.Device == "rxe0"
}
