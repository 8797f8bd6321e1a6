package rdm

import (
	"errors"
	"strings"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func TestHello(t *testing.T) {
	for _, name := range []string{"", "rank0", strings.Repeat("x", maxName)} {
		got, err := parseHello(appendHello(nil, name))
		if err != nil || got != name {
			t.Fatalf("round trip of %q: %q, %v", name, got, err)
		}
	}
	good := appendHello(nil, "abc")
	bad := map[string][]byte{
		"truncated":     good[:len(good)-1],
		"trailing":      append(append([]byte{}, good...), 0),
		"short":         good[:5],
		"magic":         append([]byte("WEFTRDX"), good[7:]...),
		"version":       append(append([]byte{}, good[:7]...), append([]byte{9}, good[8:]...)...),
		"name too long": appendHello(nil, strings.Repeat("x", maxName+1)),
	}
	for what, b := range bad {
		if _, err := parseHello(b); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", what, err)
		}
	}
}

func FuzzHello(f *testing.F) {
	f.Add(appendHello(nil, "rank0"))
	f.Add([]byte("WEFTRDM\x01\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := parseHello(b)
		if err == nil && string(appendHello(nil, name)) != string(b) {
			t.Fatalf("accepted %q, which does not re-encode to itself", b)
		}
	})
}
