package ethernet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/units"
)

func init() {
	fabric.RegisterBackend("ethernet", driver{})
}

type driver struct{}

// Usage implements fabric.Driver.
func (driver) Usage() string {
	return "IFACE[:opt=val,...]: AF_XDP on interface IFACE; opts queue=N, peer=MAC, listener=1 (the peer is a listener), udp=PEERIP[:PORT], " +
		"local=IP[:PORT], netns=NAME, ethertype=0x88b5, xdp=auto|native|generic, bind=auto|copy|zerocopy, " +
		"busypoll=DURATION, budget=N, window=N, maxmsg=SIZE, timeout=DURATION " +
		"(e.g. veth0, eth0:queue=0,peer=02:00:00:00:00:02, eth0:udp=10.0.0.2:34997)"
}

// Open implements fabric.Driver. It opens the interface in the calling
// thread's network namespace (or the one netns= names) and blocks until
// the handshake with the peer completes or ctx is done.
func (driver) Open(ctx context.Context, addr string, o fabric.Options) (fabric.Endpoint, error) {
	c, err := ParseAddr(addr)
	if err == nil && c.UDP && !c.PeerIP.IsValid() {
		err = fmt.Errorf("UDP framing needs udp=PEERIP: %w", fabric.ErrInvalid)
	}
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "ethernet", Addr: addr, Err: err}
	}
	applyOptions(&c, &o)
	var ep fabric.Endpoint
	err = inNetns(c.Netns, func() error {
		e, err := Dial(ctx, c)
		if err == nil {
			ep = e
		}
		return err
	})
	return ep, err
}

// Listen implements fabric.ListenDriver: a Listener on the interface's
// shared queue, in the calling thread's network namespace or the one
// netns= names. The address takes no peer= or udp=; with UDP framing
// give local=IP[:PORT].
func (driver) Listen(ctx context.Context, addr string, o fabric.Options) (fabric.Listener, error) {
	c, err := ParseAddr(addr)
	if err != nil {
		return nil, &fabric.OpError{Op: "listen", Backend: "ethernet", Addr: addr, Err: err}
	}
	applyOptions(&c, &o)
	var l fabric.Listener
	err = inNetns(c.Netns, func() error {
		ll, err := Listen(c, o.BacklogSize(), o.HandshakeLimit())
		if err == nil {
			l = ll
		}
		return err
	})
	return l, err
}

// inNetns runs fn in the named network namespace (or, for "", in the
// calling thread's).
func inNetns(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	ns, err := netns.OpenNamed(name)
	if err != nil {
		return &fabric.OpError{Op: "open", Backend: "ethernet", Addr: "netns=" + name,
			Err: fmt.Errorf("%v: %w", err, fabric.ErrInvalid)}
	}
	defer ns.Close()
	return ns.Do(fn)
}

func applyOptions(c *EndpointConfig, o *fabric.Options) {
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = o.MaxMsgSize
	}
	if c.Window == 0 && o.QueueDepth > 0 {
		w := 16
		for w < o.QueueDepth && w < 1<<14 {
			w <<= 1
		}
		c.Window = w
	}
	c.CQSize, c.Spin = o.CQSize, o.Spin
}

// ParseAddr parses an ethernet address string (see the driver's Usage):
// an interface name, then optional comma-separated key=value options
// after the first colon. Values may contain colons (MAC addresses).
func ParseAddr(addr string) (EndpointConfig, error) {
	var c EndpointConfig
	name, opts, _ := strings.Cut(addr, ":")
	if name == "" {
		return c, fmt.Errorf("no interface name: %w", fabric.ErrInvalid)
	}
	c.Interface = name
	if opts == "" {
		return c, nil
	}
	for _, kv := range strings.Split(opts, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return c, fmt.Errorf("option %q is not key=value: %w", kv, fabric.ErrInvalid)
		}
		bad := func(err error) (EndpointConfig, error) {
			return c, fmt.Errorf("%s=%q: %v: %w", k, v, err, fabric.ErrInvalid)
		}
		switch k {
		case "queue":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return bad(fmt.Errorf("not a queue id"))
			}
			c.Queue = n
		case "peer":
			mac, err := net.ParseMAC(v)
			if err != nil || len(mac) != 6 {
				return bad(fmt.Errorf("not a MAC address"))
			}
			c.PeerMAC = mac
		case "listener":
			switch v {
			case "0":
				c.ToListener = false
			case "1":
				c.ToListener = true
			default:
				return bad(fmt.Errorf("want 0 or 1"))
			}
		case "udp", "local":
			ip, port, err := parseIPPort(v)
			if err != nil {
				return bad(err)
			}
			c.UDP = true
			if k == "udp" {
				c.PeerIP, c.PeerPort = ip, port
			} else {
				c.LocalIP, c.LocalPort = ip, port
			}
		case "netns":
			if v == "" || strings.ContainsAny(v, "/") {
				return bad(fmt.Errorf("not a namespace name"))
			}
			c.Netns = v
		case "ethertype":
			n, err := strconv.ParseUint(v, 0, 16)
			if err != nil || n < 0x600 {
				return bad(fmt.Errorf("not an EtherType"))
			}
			c.EtherType = uint16(n)
		case "xdp":
			switch v {
			case "auto":
				c.Attach = AttachAuto
			case "native", "drv", "driver":
				c.Attach = AttachNative
			case "generic", "skb":
				c.Attach = AttachGeneric
			default:
				return bad(fmt.Errorf("want auto, native or generic"))
			}
		case "bind":
			switch v {
			case "auto":
				c.Bind = xsk.ModeAuto
			case "copy":
				c.Bind = xsk.ModeCopy
			case "zerocopy", "zc":
				c.Bind = xsk.ModeZeroCopy
			default:
				return bad(fmt.Errorf("want auto, copy or zerocopy"))
			}
		case "busypoll", "timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return bad(fmt.Errorf("not a duration"))
			}
			if k == "busypoll" {
				c.BusyPoll.Timeout, c.BusyPoll.Prefer = d, true
			} else {
				c.PeerTimeout = d
			}
		case "budget", "window", "maxmsg":
			n, err := units.ParseSize(v, 1<<31)
			if err != nil {
				return bad(err)
			}
			switch k {
			case "budget":
				c.BusyPoll.Budget = n
			case "window":
				c.Window = n
			case "maxmsg":
				c.MaxMsgSize = n
			}
		default:
			return c, fmt.Errorf("unknown option %q: %w", k, fabric.ErrInvalid)
		}
	}
	return c, nil
}

func parseIPPort(v string) (netip.Addr, uint16, error) {
	if ap, err := netip.ParseAddrPort(v); err == nil {
		return ap.Addr(), ap.Port(), nil
	}
	ip, err := netip.ParseAddr(v)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, 0, fmt.Errorf("not an IPv4 address[:port]")
	}
	return ip, 0, nil
}
