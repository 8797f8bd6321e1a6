package addrparam

import (
	"errors"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

type color int

var colors = map[string]color{"red": 1, "green": 2}

// all reads every parameter the tests use, as a backend would.
type all struct {
	I    int
	U    uint64
	S    int
	D    time.Duration
	B    bool
	IP   netip.Addr
	E    color
	Str  string
	Even int
}

func readAll(p *Params) all {
	var a all
	a.I = p.Int("i", 7, -3, 100)
	a.U = p.Uint("u", 9, 0xffff)
	a.S = p.Size("s", 5, 1<<20)
	a.D = p.Duration("d", time.Second, 0, time.Minute)
	a.B = p.Bool("b", true)
	a.IP = p.IP("ip", netip.Addr{})
	a.E = Enum(p, "e", color(1), colors)
	a.Str = p.String("str", "x")
	p.Value("even", func(v string) error {
		if v != "2" && v != "4" {
			return errors.New("want 2 or 4")
		}
		a.Even = int(v[0] - '0')
		return nil
	})
	return a
}

func TestGetters(t *testing.T) {
	head, p, err := Split("host:1?i=-3&u=0x10&s=64K&d=0&b=0&ip=fd00::1&e=GREEN&str=a%20b&even=4&i=100")
	if err != nil || head != "host:1" {
		t.Fatalf("Split = %q, %v", head, err)
	}
	got := readAll(p)
	want := all{I: 100, U: 16, S: 64 << 10, D: 0, B: false, IP: netip.MustParseAddr("fd00::1"), E: 2, Str: "a b", Even: 4}
	if got != want || p.Err() != nil {
		t.Fatalf("got %+v, %v\nwant %+v", got, p.Err(), want)
	}
	// Defaults.
	_, p, _ = Split("host")
	if got := readAll(p); got != (all{I: 7, U: 9, S: 5, D: time.Second, B: true, E: 1, Str: "x"}) || p.Err() != nil {
		t.Fatalf("defaults: %+v, %v", got, p.Err())
	}
}

// Every malformed value, and every unknown key, is an error that matches
// fabric.ErrInvalid and names the key.
func TestMalformed(t *testing.T) {
	for _, c := range []struct{ query, key string }{
		{"i=x", "i"}, {"i=-4", "i"}, {"i=101", "i"}, {"i=", "i"}, {"i=1.5", "i"}, {"i", "i"},
		{"u=-1", "u"}, {"u=0x10000", "u"}, {"u=ten", "u"},
		{"s=-1", "s"}, {"s=2M", "s"}, {"s=K", "s"}, {"s=12x", "s"}, {"s=", "s"},
		{"d=1", "d"}, {"d=-1s", "d"}, {"d=2m", "d"}, {"d=soon", "d"},
		{"b=yes", "b"}, {"b=", "b"}, {"b=2", "b"},
		{"ip=banana", "ip"}, {"ip=10.0.0.256", "ip"}, {"ip=", "ip"},
		{"e=blue", "e"}, {"e=", "e"},
		{"even=3", "even"},
		{"nope=1", "nope"}, {"i=1&nope=1&other=2", "nope"},
		{"i=x&u=-1", "i"}, // the first malformed value
		{"str=%zz", "str"},
	} {
		_, p, err := Split("h?" + c.query)
		if err == nil {
			readAll(p)
			err = p.Err()
		}
		var e *Error
		if !errors.Is(err, fabric.ErrInvalid) || !errors.As(err, &e) || e.Key != c.key ||
			!strings.Contains(err.Error(), c.key) {
			t.Errorf("%q: %v, want ErrInvalid naming %q", c.query, err, c.key)
		}
	}
	for _, q := range []string{"%zz=1", "a=1;b=2"} {
		if _, _, err := Split("h?" + q); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", q, err)
		}
	}
}

func TestParseList(t *testing.T) {
	p, err := ParseList("peer=02:00:00:00:00:02,i=3")
	if err != nil || p.String("peer", "") != "02:00:00:00:00:02" || p.Int("i", 0, 0, 9) != 3 || p.Err() != nil {
		t.Fatalf("ParseList: %v %v", err, p.Err())
	}
	for _, bad := range []string{"i", "i=1,", "=1", "i=1,j"} {
		if _, err := ParseList(bad); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("ParseList(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if p, err := ParseList(""); err != nil || len(p.Keys()) != 0 {
		t.Fatalf("ParseList(\"\") = %v, %v", p.Keys(), err)
	}
}

func TestCutListen(t *testing.T) {
	if r, ok := CutListen("listen:h:1"); !ok || r != "h:1" {
		t.Fatal(r, ok)
	}
	if r, ok := CutListen("h:1"); ok || r != "h:1" {
		t.Fatal(r, ok)
	}
}

func TestValues(t *testing.T) {
	_, p, _ := Split("h?b=2&a=1&b=3")
	if v := p.Values(); v.Encode() != "a=1&b=3" || strings.Join(p.Keys(), ",") != "b,a" {
		t.Fatalf("Values = %v, Keys = %v", v, p.Keys())
	}
}

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{{"0", 0, true}, {"64K", 64 << 10, true}, {"16m", 16 << 20, true}, {"1G", 1 << 30, true},
		{"", 0, false}, {"K", 0, false}, {"-1", 0, false}, {"3G", 0, false}, {"12x", 0, false}} {
		got, err := ParseSize(c.in, 2<<30)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseSize(%q) = %d, %v", c.in, got, err)
		}
	}
}

// FuzzParams checks that no address panics the parser or its getters,
// and that every error names a key of the address (or is the query's)
// and matches fabric.ErrInvalid.
func FuzzParams(f *testing.F) {
	for _, s := range []string{"h", "h?i=1&u=2", "listen:h:1?s=1K&d=1s&b=t&ip=::1&e=red", "h?%zz", "h?i=x&nope",
		"h?a=1;b", "h?even=2&str=%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		rest, _ := CutListen(addr)
		_, p, err := Split(rest)
		if err == nil {
			readAll(p)
			err = p.Err()
		}
		if err == nil {
			return
		}
		var e *Error
		if !errors.Is(err, fabric.ErrInvalid) || !errors.As(err, &e) {
			t.Fatalf("%q: %v is not an *Error matching ErrInvalid", addr, err)
		}
		if e.Key != "" && !strings.Contains(err.Error(), e.Key) && !strings.Contains(err.Error(), strconv.Quote(e.Key)) {
			t.Fatalf("%q: %v does not name %q", addr, err, e.Key)
		}
		if e.Key != "" && !e.Unknown && !strings.ContainsAny(addr, "%+") && !strings.Contains(addr, e.Key) {
			t.Fatalf("%q: %v names a key not in the address", addr, err)
		}
	})
}

// TestPatience: dialretry's grammar, a duration or -1 for "until the
// context ends"; anything else negative, or not a duration, is malformed.
func TestPatience(t *testing.T) {
	for _, c := range []struct {
		q    string
		want time.Duration
		bad  bool
	}{{"", 5 * time.Second, false}, {"r=-1", -1, false}, {"r=0", 0, false}, {"r=250ms", 250 * time.Millisecond, false},
		{"r=-2s", 0, true}, {"r=-1s", 0, true}, {"r=soon", 0, true}} {
		p, err := ParseQuery(c.q)
		if err != nil {
			t.Fatal(err)
		}
		got := p.Patience("r", 5*time.Second)
		if err := p.Err(); (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("%q: %v, %v; want %v (malformed %v)", c.q, got, err, c.want, c.bad)
		}
	}
}

// TestBounds: every getter's bound is inclusive, tested at, one below and
// one above each end.
func TestBounds(t *testing.T) {
	for _, c := range []struct {
		q   string
		get func(p *Params) any
		ok  bool
	}{
		{"i=-3", func(p *Params) any { return p.Int("i", 7, -3, 100) }, true},
		{"i=-4", func(p *Params) any { return p.Int("i", 7, -3, 100) }, false},
		{"i=100", func(p *Params) any { return p.Int("i", 7, -3, 100) }, true},
		{"i=101", func(p *Params) any { return p.Int("i", 7, -3, 100) }, false},
		{"u=0xffff", func(p *Params) any { return p.Uint("u", 9, 0xffff) }, true},
		{"u=0x10000", func(p *Params) any { return p.Uint("u", 9, 0xffff) }, false},
		{"d=1m", func(p *Params) any { return p.Duration("d", time.Second, 0, time.Minute) }, true},
		{"d=1m0.000000001s", func(p *Params) any { return p.Duration("d", time.Second, 0, time.Minute) }, false},
		{"d=1ms", func(p *Params) any { return p.Duration("d", time.Second, time.Millisecond, time.Minute) }, true},
		{"d=999us", func(p *Params) any { return p.Duration("d", time.Second, time.Millisecond, time.Minute) }, false},
		{"s=1M", func(p *Params) any { return p.Size("s", 5, 1<<20) }, true},
		{"s=1048576", func(p *Params) any { return p.Size("s", 5, 1<<20) }, true},
		{"s=1048577", func(p *Params) any { return p.Size("s", 5, 1<<20) }, false},
		{"s=1025K", func(p *Params) any { return p.Size("s", 5, 1<<20) }, false},
	} {
		p, err := ParseQuery(c.q)
		if err != nil {
			t.Fatal(err)
		}
		got := c.get(p)
		if (p.Err() == nil) != c.ok {
			t.Errorf("%q: %v, err %v; want accepted %v", c.q, got, p.Err(), c.ok)
		}
	}
}

// TestQueryKeys: a key that does not unescape, or is empty, is refused,
// and the error says which.
func TestQueryKeys(t *testing.T) {
	_, err := ParseQuery("%zz=1")
	var esc url.EscapeError
	if !errors.As(err, &esc) {
		t.Errorf("%%zz=1: %v, want the unescape error", err)
	}
	for _, q := range []string{"=1", "=", "a=1&=2"} {
		if _, err := ParseQuery(q); !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), "no parameter name") {
			t.Errorf("%q: %v, want ErrInvalid for no parameter name", q, err)
		}
	}
}

// TestSplitHost: the host grammar of roce, verbs and rdma_cm addresses.
func TestSplitHost(t *testing.T) {
	for _, c := range []struct {
		addr, hostport string
		listen         bool
	}{
		{"10.0.0.1", "10.0.0.1:4791", false},
		{"10.0.0.1:7", "10.0.0.1:7", false},
		{"listen:10.0.0.1:0", "10.0.0.1:0", true},
		{"listen::65535", ":65535", true},
		{"[fd00::1]", "[fd00::1]:4791", false},
		{"[fd00::1]:9", "[fd00::1]:9", false},
		{"host-a.example_1:12?x=1", "host-a.example_1:12", false},
		{"example.com.", "example.com.:4791", false},
	} {
		listen, hp, p, err := SplitHost(c.addr, 4791)
		if err != nil || hp != c.hostport || listen != c.listen || p == nil {
			t.Errorf("SplitHost(%q) = %v, %q, %v, %v; want %v, %q", c.addr, listen, hp, p, err, c.listen, c.hostport)
		}
	}
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	if len(long) != 253 {
		t.Fatal(len(long))
	}
	if _, _, _, err := SplitHost(long, 1); err != nil {
		t.Errorf("a 253-byte name: %v", err)
	}
	if _, _, _, err := SplitHost(long+".", 1); err != nil {
		t.Errorf("a 253-byte name with its root dot: %v", err)
	}
	for _, c := range []struct{ addr, why string }{
		{"", "empty"},
		{"listen:", "empty"},
		{"?x=1", "empty"},
		{"h?%zz=1", "invalid URL escape"},
		{"[fd00::1", "no closing"},
		{"h:65536", "port"},
		{"h:-1", "port"},
		{"h:x", "port"},
		{"a..b", "empty label"},
		{".a", "empty label"},
		{"a b", "not an IP address"},
		{"a/b:1", "not an IP address"},
		{"a@b", "not an IP address"},
		{"a:b:c", "not an IP address"},
		{long + "e", "longer"},
		{"é", "not an IP address"},
	} {
		_, _, p, err := SplitHost(c.addr, 4791)
		if !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), c.why) || p != nil {
			t.Errorf("SplitHost(%q) = %v, %v; want ErrInvalid saying %q", c.addr, p, err, c.why)
		}
	}
}

// TestCheckHost: each byte class at its edges; IP addresses with zones.
func TestCheckHost(t *testing.T) {
	for _, h := range []string{"", "a", "z", "A", "Z", "0", "9", "-", "_", "a.b", "fe80::1%eth0", "10.0.0.1", "az-AZ_09"} {
		if err := CheckHost(h); err != nil {
			t.Errorf("CheckHost(%q) = %v", h, err)
		}
	}
	// The bytes just outside each range of letters and digits.
	for _, c := range []byte{'a' - 1, 'z' + 1, 'A' - 1, 'Z' + 1, '0' - 1, '9' + 1, '-' - 1, '_' + 1, '_' - 1, ' ', 0, 0xff} {
		h := "x" + string([]byte{c}) + "y"
		if err := CheckHost(h); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("CheckHost(%q) = %v, want ErrInvalid", h, err)
		}
	}
}
