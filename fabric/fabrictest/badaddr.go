package fabrictest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// BadAddr is an address that cannot be valid, and what its error must
// name: the key at fault, or the part of the head where no key is.
type BadAddr struct {
	Addr string
	Name string
}

// BadAddrs returns the malformed addresses every backend must refuse,
// made from head, a valid address without parameters, and keys, the
// parameters the backend knows whose values are numbers, sizes,
// durations or flags: an unknown key, an empty key, a bad escape, a
// semicolon, and for each key huge, garbage, NUL and badly escaped
// values. A backend adds its own cases (negative numbers where they are
// wrong, malformed heads).
func BadAddrs(head string, keys ...string) []BadAddr {
	cs := []BadAddr{
		{head + "?weftnosuchkey=1", "weftnosuchkey"},
		{head + "?=1", "=1"},
		{head + "?%zz=1", "%zz"},
		{head + "?a=1;b=2", "semicolon"},
	}
	for _, k := range keys {
		for _, v := range []string{"99999999999999999999999", "garbage", "%00", "%zz", "1%00", "0x", "-"} {
			cs = append(cs, BadAddr{head + "?" + k + "=" + v, k})
		}
	}
	return cs
}

// BadHostPorts returns the malformed HOST:PORT heads that backends
// addressed by host and port (roce, verbs) must refuse, each after
// prefix (a scheme such as "rdmacm://", or ""): ports out of range or
// not numbers, an unclosed IPv6 bracket, NULs and spaces in the host, an
// empty label.
func BadHostPorts(prefix string) []BadAddr {
	return []BadAddr{
		{prefix + "127.0.0.1:99999999999999999999999", "port"},
		{prefix + "127.0.0.1:65536", "port"},
		{prefix + "127.0.0.1:-1", "port"},
		{prefix + "127.0.0.1:", "port"},
		{prefix + "garbage:garbage", "port"},
		{prefix + "[::1", "]"},
		{prefix + "127.0.0.1\x00:4791", "host"},
		{prefix + "\x00", "host"},
		{prefix + "a b:1", "host"},
		{prefix + "a..b:1", "empty label"},
	}
}

// TestBadAddrs opens and listens at each address through the registry,
// and requires each call to fail at once with a nil interface and an
// error that matches fabric.ErrInvalid and whose cause (below the
// *fabric.OpError that repeats the address) names c.Name. "At once" is
// shown by the error itself: the context allows a minute, and a call
// that waited would fail with the context's error, not ErrInvalid.
// Backends that cannot listen are only opened.
func TestBadAddrs(t *testing.T, backend string, cases []BadAddr) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range cases {
		ep, err := fabric.Open(ctx, backend, c.Addr, nil)
		if err == nil {
			ep.Close()
		}
		checkBad(t, "Open", c, ep, err)
		l, err := fabric.Listen(ctx, backend, c.Addr, nil)
		if errors.Is(err, fabric.ErrNotSupported) && !errors.Is(err, fabric.ErrInvalid) {
			continue // no listener for this backend (or this kind of address)
		}
		if err == nil {
			l.Close()
		}
		checkBad(t, "Listen", c, l, err)
	}
}

func checkBad(t *testing.T, op string, c BadAddr, v any, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s(%q) succeeded", op, c.Addr)
	case v != nil:
		t.Errorf("%s(%q) = non-nil %T, %v", op, c.Addr, v, err)
	case !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(cause(err).Error(), c.Name):
		t.Errorf("%s(%q) = %v; want an error matching fabric.ErrInvalid whose cause names %q", op, c.Addr, err, c.Name)
	}
}

// cause strips err of its *fabric.OpError layers, whose messages repeat
// the whole address: the name must be in what the backend said of it.
func cause(err error) error {
	for {
		var oe *fabric.OpError
		if !errors.As(err, &oe) || oe.Err == nil {
			return err
		}
		err = oe.Err
	}
}
