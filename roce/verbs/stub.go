//go:build !(linux && cgo && rdma)

package verbs

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/weft-io/weft/fabric"
)

// Supported reports whether this build has the libibverbs binding: it
// needs Linux, cgo and the build tag rdma.
const Supported = false

var errNoBinding = fmt.Errorf("verbs: this build has no libibverbs binding (build with cgo and -tags rdma): %w", fabric.ErrNotSupported)

// Endpoint is a verbs queue pair as a fabric.Endpoint. This build has no
// binding, so none can be opened.
type Endpoint struct{ fabric.Endpoint }

// Devices lists the RDMA devices. Without the binding it returns an error
// matching fabric.ErrNotSupported.
func Devices() ([]DeviceInfo, error) { return nil, errNoBinding }

// FindGID returns the device, port and GID index of the RoCEv2 GID for ip.
func FindGID(devs []DeviceInfo, dev string, ip netip.Addr) (string, uint8, int, error) {
	return "", 0, 0, errNoBinding
}

// Connect sets up an endpoint. Without the binding it returns an error
// matching fabric.ErrNotSupported.
func Connect(ctx context.Context, o Options) (*Endpoint, error) { return nil, errNoBinding }

// ListenCM starts an rdma_cm listener. Without the binding it returns an
// error matching fabric.ErrNotSupported.
func ListenCM(ctx context.Context, o Options, fo fabric.Options) (fabric.Listener, error) {
	return nil, errNoBinding
}
