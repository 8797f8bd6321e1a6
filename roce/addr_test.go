package roce

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/addrparam"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
)

func TestSplitAddr(t *testing.T) {
	for _, c := range []struct {
		in, boot string
		listen   bool
	}{
		{"10.0.0.1", "10.0.0.1:18515", false},
		{"listen:10.0.0.1:99?mtu=4096", "10.0.0.1:99", true},
		{"[fd00::1]", "[fd00::1]:18515", false},
	} {
		l, b, p, err := SplitAddr(c.in)
		if err != nil || l != c.listen || b != c.boot || p == nil {
			t.Errorf("SplitAddr(%q) = %v %q %v %v", c.in, l, b, p, err)
		}
	}
	for _, bad := range []string{"", "listen:", "h?%zz"} {
		if _, _, _, err := SplitAddr(bad); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("SplitAddr(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if o, err := ParseAddr("listen:127.0.0.1?type=ud&mtu=4096"); err != nil || !o.Listen || o.Type != UD || o.MTU != 4096 || o.Bootstrap != "127.0.0.1:18515" {
		t.Errorf("ParseAddr = %+v, %v", o, err)
	}
}

// Every malformed value and every unknown parameter of a roce address
// is an error matching fabric.ErrInvalid that names the key.
func TestParseAddrMalformed(t *testing.T) {
	for _, c := range []struct{ addr, key string }{
		{"h?mtu=1000", "mtu"}, {"h?mtu=x", "mtu"}, {"h?type=uc", "type"}, {"h?local=banana", "local"},
		{"h?port=65536", "port"}, {"h?timeout=32", "timeout"}, {"h?retry=8", "retry"}, {"h?rnr=-1", "rnr"},
		{"h?qkey=0x100000000", "qkey"}, {"h?keepalive=-1s", "keepalive"}, {"h?keepalive=soon", "keepalive"},
		{"h?dialretry=-2s", "dialretry"}, {"h?noicrc=maybe", "noicrc"}, {"h?raw=2", "raw"},
		{"h?maxmsg=-1", "maxmsg"}, {"h?inline=1G1", "inline"}, {"h?nope=1", "nope"}, {"h?cm=1", "cm"},
	} {
		_, err := ParseAddr(c.addr)
		if !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), c.key) {
			t.Errorf("ParseAddr(%q) = %v, want ErrInvalid naming %s", c.addr, err, c.key)
		}
	}
	o, err := ParseAddr("[fd00::1]:7?keepalive=0&dialretry=-1&noicrc=1&raw=0&qkey=0x1234&timeout=14&maxmsg=8192")
	if err != nil || o.Bootstrap != "[fd00::1]:7" || o.KeepAlive != 0 || o.DialRetry != -1 || !o.NoICRC || !o.NoRaw ||
		o.QKey != 0x1234 || o.Timeout != 14 || o.QP.MaxMsgSize != 8192 || o.MTU != 1024 || o.Retry != 7 {
		t.Errorf("ParseAddr = %+v, %v", o, err)
	}
	if _, _, err := parseCMAddr(context.Background(), "h?cm=1&retry=9"); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("parseCMAddr: %v, want ErrInvalid", err)
	}
	o, ap, err := parseCMAddr(context.Background(), "rdmacm://listen:10.0.0.1?mtu=4096")
	if err != nil || !o.Listen || ap.String() != "10.0.0.1:7471" || o.MTU != 4096 {
		t.Errorf("parseCMAddr = %+v %v %v", o, ap, err)
	}
}

// An engine is shared by the endpoints of its address only if they ask
// for its configuration: a conflicting noicrc, raw, link or gso is refused.
func TestEngineConfigConflict(t *testing.T) {
	addr := netip.MustParseAddrPort("127.0.0.9:0")
	mine := engineOpts{NoRaw: true}
	e, release, err := acquireEngine(addr, mine)
	if err != nil {
		t.Skip("no engine at", addr, err)
	}
	defer release()
	for _, c := range []engineOpts{{NoICRC: true, NoRaw: true}, {}, {NoRaw: true, Shm: true}, {NoRaw: true, GSO: true}} {
		if _, _, err := acquireEngine(addr, c); !errors.Is(err, fabric.ErrInvalid) ||
			!strings.Contains(err.Error(), "raw=0&link=udp&gso=0") {
			t.Errorf("acquireEngine(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	e2, release2, err := acquireEngine(addr, mine)
	if err != nil || e2 != e {
		t.Fatalf("same configuration: %v, %v", e2 == e, err)
	}
	release2()
	// Port 0 is the engine's port, 4791: an endpoint that names it (as
	// perftest's side in the rxe suite does) shares the engine of those
	// that do not, rather than starting a second one that cannot bind.
	e3, release3, err := acquireEngine(netip.AddrPortFrom(addr.Addr(), link.Port), mine)
	if err != nil || e3 != e {
		t.Fatalf("port %d: the same engine %v, %v", link.Port, e3 == e, err)
	}
	release3()
}

// TestBadAddrs: every exchange and rdma_cm address that cannot be valid
// fails through fabric.Open and fabric.Listen at once, with a nil
// interface and an error matching fabric.ErrInvalid that names the key,
// or the host or port at fault.
func TestBadAddrs(t *testing.T) {
	keys := []string{"mtu", "type", "local", "port", "timeout", "retry", "rnr", "qkey", "keepalive",
		"dialretry", "maxmsg", "inline", "noicrc", "raw", "link", "gso"}
	cases := fabrictest.BadAddrs("127.0.0.1:18515", keys...)
	cases = append(cases, fabrictest.BadAddrs("rdmacm://127.0.0.1:7471", keys...)...)
	for _, h := range []string{"", "rdmacm://"} {
		cases = append(cases, fabrictest.BadHostPorts(h)...)
		cases = append(cases,
			fabrictest.BadAddr{Addr: h + "127.0.0.1:4791?mtu=-1", Name: "mtu"},
			fabrictest.BadAddr{Addr: h + "127.0.0.1:4791?mtu=1000", Name: "mtu"},
			fabrictest.BadAddr{Addr: h + "127.0.0.1:4791?retry=-1", Name: "retry"},
			fabrictest.BadAddr{Addr: h + "127.0.0.1:4791?keepalive=-1s", Name: "keepalive"},
		)
	}
	fabrictest.TestBadAddrs(t, "roce", cases)
}

// FuzzParseAddr: no address panics the parsers of exchange and rdma_cm
// addresses; every refusal matches fabric.ErrInvalid, and every address
// taken has a host that can be looked up and a numeric port.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:18515", "listen:0.0.0.0:0?mtu=4096&gso=1", "[fd00::1]:7?keepalive=0",
		"rdmacm://listen:10.0.0.1?mtu=4096", "h?cm=1", "127.0.0.1:-1", "[::1", "a..b:1", "\x00:%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		var boot string
		var err error
		if cm.IsAddr(addr) {
			listen, hp, p, serr := splitAddr(strings.TrimPrefix(addr, cm.Scheme), cm.DefaultPort)
			if err = serr; err == nil {
				p.Bool("cm", true)
				_, err = parseOptions(listen, hp, p)
				boot = hp
			}
		} else {
			var o Options
			o, err = ParseAddr(addr)
			boot = o.Bootstrap
		}
		if err != nil {
			if !errors.Is(err, fabric.ErrInvalid) && !errors.Is(err, fabric.ErrNotSupported) {
				t.Fatalf("%q: %v, not ErrInvalid", addr, err)
			}
			return
		}
		host, port, serr := net.SplitHostPort(boot)
		if serr != nil || addrparam.CheckHost(host) != nil {
			t.Fatalf("%q taken as %q", addr, boot)
		}
		if _, perr := strconv.ParseUint(port, 10, 16); perr != nil {
			t.Fatalf("%q taken with port %q", addr, port)
		}
	})
}
