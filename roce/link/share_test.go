package link

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
)

// engineLink opens a UDP link on addr as an engine does: with a QPN
// block of its own, in the steered group of the port.
func engineLink(addr netip.AddrPort) (*UDPLink, error) {
	return ListenUDPConfig(addr, UDPConfig{NoRaw: true})
}

// TestSharedPortUnprivileged: without the privileges for the steering
// program (simulated: the kernel's EPERM), a link binds its port alone,
// and the next link on that port gets a SharedPortError naming the
// cause; on another address it works.
func TestSharedPortUnprivileged(t *testing.T) {
	noSteering = fmt.Errorf("simulated: %w", unix.EPERM)
	defer func() { noSteering = nil }()
	a, b := 1+rand.IntN(250), 1+rand.IntN(250)
	host, other := fmt.Sprintf("127.%d.%d.1", a, b), fmt.Sprintf("127.%d.%d.2", a, b)
	addr := netip.MustParseAddrPort(host + ":4791")
	l1, err := engineLink(addr)
	if err != nil {
		t.Fatalf("first link without steering: %v", err)
	}
	defer l1.Close()
	if l1.Shared() {
		t.Fatal("a link without steering reports itself shared")
	}
	_, err = engineLink(addr)
	var se *SharedPortError
	if !errors.As(err, &se) || !errors.Is(err, fabric.ErrNotSupported) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("second link on the port without steering: %v, want a SharedPortError (EPERM)", err)
	}
	l2, err := engineLink(netip.MustParseAddrPort(other + ":4791"))
	if err != nil {
		t.Fatalf("link on its own address: %v", err)
	}
	l2.Close()
}
