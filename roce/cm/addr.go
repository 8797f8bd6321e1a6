package cm

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/addrparam"
)

// DefaultPort is the rdma_cm port of an rdma_cm address without one, as
// rdma_server and rdma_client use.
const DefaultPort = 7471

// Scheme prefixes an rdma_cm address of Weft's "roce" and "verbs"
// backends.
const Scheme = "rdmacm://"

// IsAddr reports whether addr is an rdma_cm address of the "roce" or
// "verbs" backend: it starts with Scheme or has the parameter cm=1.
func IsAddr(addr string) bool {
	if strings.HasPrefix(addr, Scheme) {
		return true
	}
	_, p, err := addrparam.Split(addr)
	return err == nil && p.Bool("cm", false)
}

// ResolveAddr resolves the HOST:PORT of an rdma_cm address (a name is
// looked up) to an IP address and port.
func ResolveAddr(ctx context.Context, hostport string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("roce: %q: %w", hostport, fabric.ErrInvalid)
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("roce: port %q: %w", port, fabric.ErrInvalid)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		ips, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if lerr != nil || len(ips) == 0 {
			return netip.AddrPort{}, fmt.Errorf("roce: host %q: %w", host, lerr)
		}
		ip = ips[0]
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(pn)), nil
}
