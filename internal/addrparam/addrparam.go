// Package addrparam parses the parameters of backend addresses, the one
// grammar of every backend:
//
//	HEAD[?KEY=VALUE&KEY=VALUE...]
//
// HEAD is the backend's own part (a host and port, a file path, an
// interface name); the query after the first "?" is URL-encoded as in
// [url.ParseQuery], and where a key is repeated the last value counts.
// Some backends prefix HEAD with "listen:" to accept rather than dial
// ([CutListen]).
//
// A backend reads each parameter it knows with a typed getter (Int,
// Uint, Size, Duration, Bool, IP, Enum, Value), which returns the default
// when the key is absent. The first malformed value is kept, and Err
// returns it, or else the first key that no getter asked for: every
// error of this package is an *Error, which names the key and matches
// fabric.ErrInvalid with errors.Is.
package addrparam

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Error is a malformed or unknown parameter. It matches fabric.ErrInvalid
// with errors.Is and unwraps to the reason, if any.
type Error struct {
	Key     string // the parameter's key ("" for a query that does not parse)
	Value   string // its value as written
	Unknown bool   // no such parameter
	Err     error  // why the value is malformed (nil for an unknown key)
}

// Error implements error.
func (e *Error) Error() string {
	var s string
	switch {
	case e.Key == "" && e.Value != "":
		s = fmt.Sprintf("parameter %q", e.Value)
	case e.Key == "":
		s = "parameters"
	case e.Unknown:
		s = fmt.Sprintf("unknown parameter %q", e.Key)
	default:
		s = fmt.Sprintf("%s=%q", e.Key, e.Value)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s + ": " + fabric.ErrInvalid.Error()
}

// Is reports whether target is fabric.ErrInvalid.
func (e *Error) Is(target error) bool { return target == fabric.ErrInvalid }

// Unwrap returns the reason.
func (e *Error) Unwrap() error { return e.Err }

// Params are the parameters of one address, with the state of their
// parsing: which keys were read and the first error. The zero value has
// no parameters.
type Params struct {
	keys []string          // in the order of the address, each once
	vals map[string]string // the last value of each key
	used map[string]bool
	err  error
}

// Split cuts addr at the first "?" into its head and parameters. The
// error (an *Error) reports a query that does not parse.
func Split(addr string) (head string, p *Params, err error) {
	head, query, _ := strings.Cut(addr, "?")
	p, err = ParseQuery(query)
	return head, p, err
}

// SplitHost splits [listen:]HOST[:PORT][?PARAMS], the address of the
// backends that name a host (roce and verbs), into the listen flag,
// HOST:PORT (port defPort when HOST has none; IPv6 in brackets) and the
// parameters. Its errors match fabric.ErrInvalid.
func SplitHost(addr string, defPort int) (listen bool, hostport string, p *Params, err error) {
	rest, p, err := Split(addr)
	rest, listen = CutListen(rest)
	if err != nil {
		return listen, rest, nil, err
	}
	if rest == "" {
		return listen, "", nil, fmt.Errorf("empty address: %w", fabric.ErrInvalid)
	}
	host, port, serr := net.SplitHostPort(rest)
	if serr != nil { // no port: all of it is the host, maybe an IPv6 one in brackets
		host, port = rest, strconv.Itoa(defPort)
		if h, ok := strings.CutPrefix(host, "["); ok {
			host, ok = strings.CutSuffix(h, "]")
			if !ok {
				return listen, rest, nil, fmt.Errorf("host %q: no closing ']': %w", rest, fabric.ErrInvalid)
			}
		}
	}
	if err := CheckHost(host); err != nil {
		return listen, rest, nil, err
	}
	n, perr := strconv.ParseUint(port, 10, 16)
	if perr != nil {
		return listen, rest, nil, fmt.Errorf("port %q: want a number from 0 to 65535: %w", port, fabric.ErrInvalid)
	}
	return listen, net.JoinHostPort(host, strconv.FormatUint(n, 10)), p, nil
}

// CheckHost refuses a host that can be neither an IP address (with an
// optional zone) nor a DNS name: bytes outside letters, digits, '-',
// '_' and '.', an empty label, a name over 253 bytes. The empty host
// (any address) passes. The error matches fabric.ErrInvalid.
func CheckHost(host string) error {
	if host == "" {
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	bad := func(why string) error { return fmt.Errorf("host %q: %s: %w", host, why, fabric.ErrInvalid) }
	name := strings.TrimSuffix(host, ".")
	if len(name) > 253 {
		return bad("longer than a DNS name")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return bad("an empty label")
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad(fmt.Sprintf("%q is not an IP address or a host name", c))
			}
		}
	}
	return nil
}

// ParseQuery parses a URL query (k=v&k=v). A repeated key takes its last
// value.
func ParseQuery(query string) (*Params, error) {
	p := &Params{}
	for kv := range strings.SplitSeq(query, "&") {
		if kv == "" {
			continue
		}
		if strings.Contains(kv, ";") {
			return p, &Error{Value: kv, Err: errors.New("semicolon in query")}
		}
		k, v, _ := strings.Cut(kv, "=")
		uk, err := url.QueryUnescape(k)
		if err != nil {
			return p, &Error{Value: kv, Err: err}
		}
		if uk == "" {
			return p, &Error{Value: kv, Err: errors.New("no parameter name")}
		}
		uv, err := url.QueryUnescape(v)
		if err != nil {
			return p, &Error{Key: uk, Value: v, Err: err}
		}
		p.Set(uk, uv)
	}
	return p, nil
}

// ParseList parses the older form of parameters, k=v,k=v (no escaping;
// every item must have "=").
func ParseList(list string) (*Params, error) {
	p := &Params{}
	if list == "" {
		return p, nil
	}
	for kv := range strings.SplitSeq(list, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return p, &Error{Key: k, Value: kv, Err: errors.New("not key=value")}
		}
		p.Set(k, v)
	}
	return p, nil
}

// CutListen removes the prefix "listen:" from s and reports whether it
// was there.
func CutListen(s string) (rest string, listen bool) { return strings.CutPrefix(s, "listen:") }

// Set sets key to value (replacing an earlier value).
func (p *Params) Set(key, value string) {
	if p.vals == nil {
		p.vals = map[string]string{}
	}
	if _, ok := p.vals[key]; !ok {
		p.keys = append(p.keys, key)
	}
	p.vals[key] = value
}

// Keys returns the keys in the order of the address.
func (p *Params) Keys() []string { return slices.Clone(p.keys) }

// Values returns the parameters as url.Values, one value a key.
func (p *Params) Values() url.Values {
	v := url.Values{}
	for _, k := range p.keys {
		v.Set(k, p.vals[k])
	}
	return v
}

// Lookup returns the value of key and whether it is present, and marks
// the key as known.
func (p *Params) Lookup(key string) (string, bool) {
	if p.used == nil {
		p.used = map[string]bool{}
	}
	p.used[key] = true
	v, ok := p.vals[key]
	return v, ok
}

// Fail records a malformed value of key (the first error is kept).
func (p *Params) Fail(key, value string, why error) {
	if p.err == nil {
		p.err = &Error{Key: key, Value: value, Err: why}
	}
}

// Err returns the first malformed value, or else the first key (in the
// order of the address) that no getter asked for, or nil.
func (p *Params) Err() error {
	if p.err != nil {
		return p.err
	}
	for _, k := range p.keys {
		if !p.used[k] {
			return &Error{Key: k, Value: p.vals[k], Unknown: true}
		}
	}
	return nil
}

// Value parses key with parse, if present: parse's error is recorded as a
// malformed value of key.
func (p *Params) Value(key string, parse func(string) error) {
	if v, ok := p.Lookup(key); ok {
		if err := parse(v); err != nil {
			p.Fail(key, v, err)
		}
	}
}

// String returns the value of key, or def.
func (p *Params) String(key, def string) string {
	if v, ok := p.Lookup(key); ok {
		return v
	}
	return def
}

// Int returns the integer value of key (decimal, or with a 0x, 0o or 0b
// prefix), or def; a value outside [lo, hi] is malformed.
func (p *Params) Int(key string, def, lo, hi int) int {
	n := def
	p.Value(key, func(v string) error {
		i, err := strconv.ParseInt(v, 0, 64)
		if err != nil || i < int64(lo) || i > int64(hi) {
			return fmt.Errorf("want an integer from %d to %d", lo, hi)
		}
		n = int(i)
		return nil
	})
	return n
}

// Uint returns the unsigned integer value of key (decimal, or with a 0x,
// 0o or 0b prefix), or def; a value above hi is malformed.
func (p *Params) Uint(key string, def, hi uint64) uint64 {
	n := def
	p.Value(key, func(v string) error {
		u, err := strconv.ParseUint(v, 0, 64)
		if err != nil || u > hi {
			return fmt.Errorf("want an integer from 0 to %#x", hi)
		}
		n = u
		return nil
	})
	return n
}

// Size returns the byte count of key (see ParseSize), or def; a value
// above limit is malformed.
func (p *Params) Size(key string, def, limit int) int {
	n := def
	p.Value(key, func(v string) (err error) {
		s, err := ParseSize(v, limit)
		if err == nil {
			n = s
		}
		return err
	})
	return n
}

// Patience returns how long to keep trying, from key: a non-negative
// duration, or "-1" for as long as the caller's context allows (returned
// as -1); def if key is absent. The dial retries of roce and verbs
// (dialretry=) take it.
func (p *Params) Patience(key string, def time.Duration) time.Duration {
	if v, ok := p.Lookup(key); ok && v == "-1" {
		return -1
	}
	return p.Duration(key, def, 0, math.MaxInt64)
}

// Duration returns the duration of key (time.ParseDuration; a bare "0"
// is zero), or def; a value outside [lo, hi] is malformed.
func (p *Params) Duration(key string, def, lo, hi time.Duration) time.Duration {
	d := def
	p.Value(key, func(v string) error {
		x, err := time.ParseDuration(v)
		if err != nil || x < lo || x > hi {
			return fmt.Errorf("want a duration from %v to %v", lo, hi)
		}
		d = x
		return nil
	})
	return d
}

// Bool returns the truth value of key (1, t, true, 0, f, false in any
// case, as strconv.ParseBool), or def.
func (p *Params) Bool(key string, def bool) bool {
	b := def
	p.Value(key, func(v string) error {
		x, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want 1 or 0 (true or false)")
		}
		b = x
		return nil
	})
	return b
}

// IP returns the IP address of key, or def.
func (p *Params) IP(key string, def netip.Addr) netip.Addr {
	a := def
	p.Value(key, func(v string) error {
		x, err := netip.ParseAddr(v)
		if err != nil {
			return errors.New("want an IP address")
		}
		a = x
		return nil
	})
	return a
}

// Enum returns the value that names (lower case) maps key's value to,
// compared without regard to case, or def.
func Enum[T any](p *Params, key string, def T, names map[string]T) T {
	x := def
	p.Value(key, func(v string) error {
		if n, ok := names[strings.ToLower(v)]; ok {
			x = n
			return nil
		}
		want := make([]string, 0, len(names))
		for n := range names {
			want = append(want, n)
		}
		slices.Sort(want)
		return fmt.Errorf("want one of %s", strings.Join(want, ", "))
	})
	return x
}

// ErrSize is the reason of a malformed size.
var ErrSize = errors.New("want a size (bytes, or with K, M or G)")

// ParseSize parses a non-negative byte count with an optional K, M or G
// suffix (powers of 1024, either case), at most limit bytes. Its error is
// ErrSize.
func ParseSize(s string, limit int) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult = 1 << 10
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mult = 1 << 20
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > limit/mult {
		return 0, ErrSize
	}
	return n * mult, nil
}
