package fabric

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestMalformedError: the error says where and what, matches ErrMalformed
// and nothing else, is found by errors.As through wrapping and compares by
// value.
func TestMalformedError(t *testing.T) {
	e := &MalformedError{Where: "roce/wire packet", What: "ICRC mismatch", Code: 10}
	if got, want := e.Error(), "malformed roce/wire packet: ICRC mismatch"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	wrapped := &OpError{Op: "recv", Backend: "roce", Err: fmt.Errorf("frame: %w", e)}
	var me *MalformedError
	if !errors.Is(wrapped, ErrMalformed) || !errors.As(wrapped, &me) || me != e {
		t.Fatalf("%v: errors.Is ErrMalformed / errors.As *MalformedError fail", wrapped)
	}
	for _, other := range []error{ErrRefused, ErrInvalid, ErrPeerGone, ErrClosed} {
		if errors.Is(e, other) {
			t.Errorf("a MalformedError matches %v", other)
		}
	}
	if *me != (MalformedError{"roce/wire packet", "ICRC mismatch", 10}) || *me == (MalformedError{"roce/wire packet", "ICRC mismatch", 9}) {
		t.Error("MalformedError does not compare by value")
	}
}

// TestRefusedError: the error says who refused and why where it knows,
// matches ErrRefused and not ErrMalformed, and is found by errors.As.
func TestRefusedError(t *testing.T) {
	for _, c := range []struct {
		e    RefusedError
		want string
	}{
		{RefusedError{}, "connection refused"},
		{RefusedError{Addr: "02:00:00:00:00:01"}, "connection refused by 02:00:00:00:00:01"},
		{RefusedError{Reason: "backlog full"}, "connection refused: backlog full"},
		{RefusedError{Addr: "queue 3", Reason: "backlog full"}, "connection refused by queue 3: backlog full"},
	} {
		e := c.e
		if got := e.Error(); got != c.want {
			t.Errorf("%+v: Error() = %q, want %q", c.e, got, c.want)
		}
		wrapped := &OpError{Op: "dial", Backend: "ethernet", Err: &e}
		var re *RefusedError
		if !errors.Is(wrapped, ErrRefused) || errors.Is(wrapped, ErrMalformed) || !errors.As(wrapped, &re) || *re != c.e {
			t.Errorf("%+v: errors.Is ErrRefused / errors.As *RefusedError fail", c.e)
		}
		if !strings.HasSuffix(wrapped.Error(), c.want) {
			t.Errorf("wrapped: %q does not end with %q", wrapped.Error(), c.want)
		}
	}
}

// FuzzMalformedError: whatever the layer and the reason, the message
// names both and the error matches ErrMalformed.
func FuzzMalformedError(f *testing.F) {
	f.Add("batch", "bad magic", 0)
	f.Add("", "", -1)
	f.Add("roce/cm MAD", "MAD not 256 bytes\x00", 1)
	f.Fuzz(func(t *testing.T, where, what string, code int) {
		e := &MalformedError{Where: where, What: what, Code: code}
		s := e.Error()
		if !strings.HasPrefix(s, "malformed "+where) || !strings.HasSuffix(s, ": "+what) {
			t.Fatalf("%q does not name %q and %q", s, where, what)
		}
		var me *MalformedError
		if !errors.Is(fmt.Errorf("x: %w", e), ErrMalformed) || !errors.As(fmt.Errorf("x: %w", e), &me) || *me != *e {
			t.Fatal("errors.Is / errors.As fail")
		}
		r := &RefusedError{Addr: where, Reason: what}
		if !errors.Is(r, ErrRefused) || !strings.HasPrefix(r.Error(), "connection refused") || !strings.Contains(r.Error(), what) {
			t.Fatalf("%q: RefusedError does not match or name the reason", r.Error())
		}
	})
}

// TestMalformedSet: a set holds one error per named check, with its Code;
// What names each check; Code recognises the set's own errors only, and
// neither allocates.
func TestMalformedSet(t *testing.T) {
	s := NewMalformedSet("roce/cm MAD", "", "too short", "bad class")
	other := NewMalformedSet("roce/wire packet", "", "too short", "bad class")
	if len(s) != 3 || s[0] != nil || *s[1] != (MalformedError{"roce/cm MAD", "too short", 1}) || s[2].Code != 2 {
		t.Fatalf("set %v", s)
	}
	for code, want := range map[int]string{-1: "unknown reason", 0: "unknown reason", 1: "too short", 2: "bad class", 3: "unknown reason"} {
		if got := s.What(code); got != want {
			t.Errorf("What(%d) = %q, want %q", code, got, want)
		}
	}
	if c, ok := s.Code(s[2]); !ok || c != 2 {
		t.Errorf("Code(s[2]) = %d, %v", c, ok)
	}
	cp := *s[2]
	for _, err := range []error{nil, ErrMalformed, &cp, other[2], fmt.Errorf("x: %w", s[2]),
		&MalformedError{Where: "roce/cm MAD", What: "x", Code: 7}, &MalformedError{Code: -1}} {
		if c, ok := s.Code(err); ok || c != 0 {
			t.Errorf("Code(%v) = %d, %v; want 0, false", err, c, ok)
		}
	}
	var err error = s[1]
	if n := testing.AllocsPerRun(100, func() { _, _ = s.Code(err); _ = s.What(1) }); n != 0 {
		t.Errorf("Code and What: %v allocations", n)
	}
}
