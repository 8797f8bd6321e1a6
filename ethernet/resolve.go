package ethernet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// ResolveMAC returns the MAC address of ip on the interface with index
// idx from the kernel's neighbour table (in the calling thread's network
// namespace). If there is no entry it makes the kernel resolve one, by
// sending an empty UDP datagram to ip's discard port, and waits up to
// timeout.
func ResolveMAC(idx int, ip netip.Addr, timeout time.Duration) (net.HardwareAddr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return ResolveMACContext(ctx, idx, ip)
}

// ResolveMACContext is ResolveMAC waiting until ctx is done rather than
// for a timeout: an error matching fabric.ErrPeerGone when its deadline
// passes first, ctx's error when it is cancelled. The calling thread
// stays in its namespace for the whole call (see LookupMAC).
func ResolveMACContext(ctx context.Context, idx int, ip netip.Addr) (net.HardwareAddr, error) {
	c, err := rtnetlink.Dial(nil)
	if err != nil {
		return nil, linkErr("resolve", err)
	}
	defer c.Close()
	poked := false
	var tick *time.Timer
	for {
		hw, err := lookupNeigh(c, idx, ip)
		if hw != nil || err != nil {
			return hw, err
		}
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, linkErr("resolve", fmt.Errorf("no neighbour entry for %v: %w", ip, fabric.ErrPeerGone))
			}
			return nil, linkErr("resolve", fmt.Errorf("no neighbour entry for %v: %w", ip, ctx.Err()))
		}
		if !poked {
			poked = true
			if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
				unix.Sendto(fd, nil, unix.MSG_DONTWAIT, &unix.SockaddrInet4{Port: 9, Addr: ip.As4()})
				unix.Close(fd)
			}
		}
		// Poll the table again in 10 ms, or at once when ctx is done.
		if tick == nil {
			tick = time.NewTimer(10 * time.Millisecond)
			defer tick.Stop()
		} else {
			tick.Reset(10 * time.Millisecond)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
}

// LookupMAC returns the MAC address of ip on the interface with index
// idx if the kernel's neighbour table (in the calling thread's network
// namespace) has a usable entry for it, and nil otherwise, without
// waiting and without making the kernel resolve one (see ResolveMAC).
func LookupMAC(idx int, ip netip.Addr) (net.HardwareAddr, error) {
	c, err := rtnetlink.Dial(nil)
	if err != nil {
		return nil, linkErr("resolve", err)
	}
	defer c.Close()
	return lookupNeigh(c, idx, ip)
}

// lookupNeigh returns ip's MAC address on interface idx from the
// neighbour table, or nil if it has no usable entry.
func lookupNeigh(c *rtnetlink.Conn, idx int, ip netip.Addr) (net.HardwareAddr, error) {
	msgs, err := c.Neigh.List()
	if err != nil {
		return nil, linkErr("resolve", err)
	}
	for _, m := range msgs {
		if int(m.Index) != idx || m.Attributes == nil || len(m.Attributes.LLAddress) != 6 {
			continue
		}
		a, ok := netip.AddrFromSlice(m.Attributes.Address)
		if !ok || a.Unmap() != ip {
			continue
		}
		if m.State&(unix.NUD_REACHABLE|unix.NUD_PERMANENT|unix.NUD_STALE|unix.NUD_DELAY|unix.NUD_PROBE|unix.NUD_NOARP) != 0 {
			return m.Attributes.LLAddress, nil
		}
	}
	return nil, nil
}
