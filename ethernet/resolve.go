package ethernet

import (
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
	c, err := rtnetlink.Dial(nil)
	if err != nil {
		return nil, linkErr("resolve", err)
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	poked := false
	for {
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
		if time.Now().After(deadline) {
			return nil, linkErr("resolve", fmt.Errorf("no neighbour entry for %v: %w", ip, fabric.ErrPeerGone))
		}
		if !poked {
			poked = true
			if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
				unix.Sendto(fd, nil, unix.MSG_DONTWAIT, &unix.SockaddrInet4{Port: 9, Addr: ip.As4()})
				unix.Close(fd)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}
