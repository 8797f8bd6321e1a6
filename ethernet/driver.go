package ethernet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"unicode"

	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/addrparam"
	"github.com/weft-io/weft/internal/netns"
	"golang.org/x/sys/unix"
)

func init() {
	fabric.RegisterBackend("ethernet", driver{})
}

type driver struct{}

// Usage implements fabric.Driver.
func (driver) Usage() string {
	return "IFACE[?key=val&...]: AF_XDP on interface IFACE; keys queue=N, peer=MAC, listener=1 (the peer is a listener), udp=PEERIP[:PORT], " +
		"local=IP[:PORT], netns=NAME, ethertype=0x88b5, xdp=auto|native|generic, bind=auto|copy|zerocopy, " +
		"busypoll=DURATION, budget=N, window=N, maxmsg=SIZE, timeout=DURATION " +
		"(e.g. veth0, eth0?queue=0&peer=02:00:00:00:00:02, eth0?udp=10.0.0.2:34997; the older IFACE:key=val,... is accepted too)"
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
// an interface name, then optional parameters in the query grammar of
// every backend, IFACE?k=v&k=v. The older form IFACE:k=v,k=v (options
// after the first colon, separated by commas) is still accepted. A
// malformed value or an unknown parameter is an error that names the key
// and matches fabric.ErrInvalid.
func ParseAddr(addr string) (EndpointConfig, error) {
	var c EndpointConfig
	name, query, isQuery := strings.Cut(addr, "?")
	var p *addrparam.Params
	var err error
	if isQuery {
		p, err = addrparam.ParseQuery(query)
	} else {
		var list string
		name, list, _ = strings.Cut(addr, ":")
		p, err = addrparam.ParseList(list)
	}
	if name == "" {
		return c, fmt.Errorf("no interface name: %w", fabric.ErrInvalid)
	}
	if strings.Contains(name, ":") {
		return c, fmt.Errorf("interface name %q: want IFACE?k=v&k=v or IFACE:k=v,k=v: %w", name, fabric.ErrInvalid)
	}
	// The kernel's rule for a name (dev_valid_name): at most IFNAMSIZ-1
	// bytes, not "." or "..", no '/' and no white space. A NUL would cut
	// it short in the kernel and name another interface.
	if len(name) > unix.IFNAMSIZ-1 || name == "." || name == ".." || strings.ContainsFunc(name, func(r rune) bool {
		return r == '/' || r == 0 || unicode.IsSpace(r)
	}) {
		return c, fmt.Errorf("interface name %q: not a Linux interface name: %w", name, fabric.ErrInvalid)
	}
	c.Interface = name
	if err != nil {
		return c, err
	}
	c.Queue = p.Int("queue", 0, 0, math.MaxInt32)
	p.Value("peer", func(v string) error {
		mac, err := net.ParseMAC(v)
		if err != nil || len(mac) != 6 {
			return errors.New("want a MAC address")
		}
		c.PeerMAC = mac
		return nil
	})
	c.ToListener = p.Bool("listener", false)
	p.Value("udp", func(v string) (err error) {
		c.PeerIP, c.PeerPort, err = parseIPPort(v)
		c.UDP = true
		return err
	})
	p.Value("local", func(v string) (err error) {
		c.LocalIP, c.LocalPort, err = parseIPPort(v)
		c.UDP = true
		return err
	})
	p.Value("netns", func(v string) error {
		if v == "" || strings.ContainsAny(v, "/") {
			return errors.New("want a namespace name")
		}
		c.Netns = v
		return nil
	})
	p.Value("ethertype", func(v string) error {
		n, err := strconv.ParseUint(v, 0, 16)
		if err != nil || n < 0x600 {
			return errors.New("want an EtherType (0x0600 to 0xffff)")
		}
		c.EtherType = uint16(n)
		return nil
	})
	c.Attach = addrparam.Enum(p, "xdp", AttachAuto, map[string]AttachMode{"auto": AttachAuto,
		"native": AttachNative, "drv": AttachNative, "driver": AttachNative, "generic": AttachGeneric, "skb": AttachGeneric})
	c.Bind = addrparam.Enum(p, "bind", xsk.ModeAuto, map[string]xsk.BindMode{"auto": xsk.ModeAuto,
		"copy": xsk.ModeCopy, "zerocopy": xsk.ModeZeroCopy, "zc": xsk.ModeZeroCopy})
	if _, ok := p.Lookup("busypoll"); ok {
		c.BusyPoll.Timeout, c.BusyPoll.Prefer = p.Duration("busypoll", 0, 0, math.MaxInt64), true
	}
	c.PeerTimeout = p.Duration("timeout", 0, 0, math.MaxInt64)
	c.BusyPoll.Budget = p.Size("budget", 0, 1<<31)
	c.Window = p.Size("window", 0, 1<<31)
	c.MaxMsgSize = p.Size("maxmsg", 0, 1<<31)
	return c, p.Err()
}

func parseIPPort(v string) (netip.Addr, uint16, error) {
	if ap, err := netip.ParseAddrPort(v); err == nil {
		return ap.Addr(), ap.Port(), nil
	}
	ip, err := netip.ParseAddr(v)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, 0, errors.New("want an IPv4 address[:port]")
	}
	return ip, 0, nil
}
