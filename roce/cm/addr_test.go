package cm

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func TestIsAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"h?cm=1": true, "rdmacm://h": true, "rdmacm://listen:h:1": true,
		"h?mtu=1024": false, "h?cm=0": false, "h": false, "h?cm=%zz": false,
	} {
		if got := IsAddr(addr); got != want {
			t.Errorf("IsAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestResolveAddr(t *testing.T) {
	ctx := context.Background()
	ap, err := ResolveAddr(ctx, "[fd00::1]:7471")
	if err != nil || ap != netip.MustParseAddrPort("[fd00::1]:7471") {
		t.Errorf("ResolveAddr IPv6 = %v, %v", ap, err)
	}
	ap, err = ResolveAddr(ctx, "[::ffff:10.0.0.1]:1")
	if err != nil || ap != netip.MustParseAddrPort("10.0.0.1:1") {
		t.Errorf("ResolveAddr v4-mapped = %v, %v; want it unmapped", ap, err)
	}
	for _, bad := range []string{"10.0.0.1", "10.0.0.1:x", "10.0.0.1:65536", "10.0.0.1:-1"} {
		if _, err := ResolveAddr(ctx, bad); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("ResolveAddr(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
