// Package netns creates Linux network namespaces and veth pairs for
// tests, and runs code inside a namespace on a locked OS thread.
//
// A namespace is held by a file descriptor; anonymous namespaces vanish
// when the last descriptor (and the last socket or process in them) goes
// away. Named namespaces are also bind-mounted at /run/netns/NAME, as
// `ip netns add` does, so tools such as `ip netns exec` can enter them;
// Close unmounts them.
//
// Everything here needs CAP_SYS_ADMIN and CAP_NET_ADMIN. Nothing here
// touches the namespace the process started in, except that a veth pair
// may be created with one end there when the caller asks for it with
// Host().
package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/jsimonetti/rtnetlink/v2/driver"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NS is a network namespace.
type NS struct {
	fd    int
	name  string // bind-mounted at /run/netns/name, if set
	host  bool   // the namespace the process started in: Close keeps it
	mu    sync.Mutex
	close bool
}

// RunDir is where named namespaces are bind-mounted.
const RunDir = "/run/netns"

// New creates an anonymous network namespace. It has only a loopback
// device, which is down.
func New() (*NS, error) { return create("") }

// NewNamed creates a network namespace bind-mounted at /run/netns/NAME.
// It fails if the name is taken.
func NewNamed(name string) (*NS, error) {
	if name == "" || filepath.Base(name) != name {
		return nil, fmt.Errorf("netns: bad name %q", name)
	}
	return create(name)
}

// Host returns the network namespace the calling thread is in (normally
// the one the process started in). Closing it only closes the handle.
func Host() (*NS, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("open", err)
	}
	return &NS{fd: fd, host: true}, nil
}

func create(name string) (*NS, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	// A fresh goroutine on a locked thread: if the thread cannot be put
	// back into its namespace, it is left locked and the runtime ends it
	// with the goroutine, so no other goroutine ever runs in the wrong
	// namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, os.NewSyscallError("open", err)}
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, os.NewSyscallError("unshare", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			err = os.NewSyscallError("open", err)
		} else if name != "" {
			if err = bindMount(name); err != nil {
				unix.Close(fd)
				fd = -1
			}
		}
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil {
			// Leave the thread locked: it dies with this goroutine.
			ch <- result{fd, errors.Join(err, os.NewSyscallError("setns", serr))}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		if r.fd >= 0 {
			unix.Close(r.fd)
		}
		return nil, fmt.Errorf("netns: create: %w", r.err)
	}
	ns := &NS{fd: r.fd, name: name}
	return ns, nil
}

func bindMount(name string) error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	p := filepath.Join(RunDir, name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(p)
		return os.NewSyscallError("mount", err)
	}
	return nil
}

// FD returns the namespace's file descriptor (valid until Close).
func (ns *NS) FD() int { return ns.fd }

// Name returns the name of a named namespace, "" for an anonymous one.
func (ns *NS) Name() string { return ns.name }

// Path returns a path that names the namespace: /run/netns/NAME for a
// named one, /proc/PID/fd/FD otherwise.
func (ns *NS) Path() string {
	if ns.name != "" {
		return filepath.Join(RunDir, ns.name)
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), ns.fd)
}

// Close releases the handle and, for a named namespace, removes its
// mount. The namespace lives on while sockets or processes are in it.
// Close is idempotent.
func (ns *NS) Close() error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.close {
		return nil
	}
	ns.close = true
	var errs []error
	if ns.name != "" && !ns.host {
		p := filepath.Join(RunDir, ns.name)
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			errs = append(errs, os.NewSyscallError("umount", err))
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unix.Close(ns.fd); err != nil {
		errs = append(errs, os.NewSyscallError("close", err))
	}
	return errors.Join(errs...)
}

// Do runs fn on a locked OS thread that is inside the namespace, and
// returns its error. Sockets created inside fn belong to the namespace
// and may be used from any goroutine afterwards. fn must not start
// goroutines that expect to run in the namespace: they do not.
func (ns *NS) Do(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		// Every descriptor Do opens is closed before the result is sent,
		// so the caller never sees one still open after Do returns.
		ch <- ns.do(fn)
	}()
	return <-ch
}

// Run runs fn inside ns: on the calling goroutine's own thread, with no
// setns and so no privilege, when that thread is already in ns (the
// common case of a handle from Host), otherwise as Do does. A process
// whose threads may be in different namespaces uses it to create a
// socket in the namespace of an earlier one.
func (ns *NS) Run(fn func() error) error {
	runtime.LockOSThread()
	var here, want unix.Stat_t
	if unix.Stat("/proc/thread-self/ns/net", &here) == nil && unix.Fstat(ns.fd, &want) == nil &&
		here.Dev == want.Dev && here.Ino == want.Ino {
		defer runtime.UnlockOSThread()
		return fn()
	}
	runtime.UnlockOSThread()
	return ns.Do(fn)
}

// do runs fn on the calling goroutine's locked thread inside ns. It
// leaves the thread locked (to be destroyed with its goroutine) if the
// thread cannot return to its original namespace.
func (ns *NS) do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return os.NewSyscallError("open", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: enter: %w", os.NewSyscallError("setns", err))
	}
	var ferr error
	func() {
		defer func() {
			if p := recover(); p != nil {
				ferr = fmt.Errorf("netns: panic in Do: %v", p)
			}
		}()
		ferr = fn()
	}()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, os.NewSyscallError("setns", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Dial opens an rtnetlink connection inside the namespace.
func (ns *NS) Dial() (*rtnetlink.Conn, error) {
	c, err := rtnetlink.Dial(&netlink.Config{NetNS: ns.fd})
	if err != nil {
		return nil, fmt.Errorf("netns: rtnetlink: %w", err)
	}
	return c, nil
}

func (ns *NS) withConn(fn func(c *rtnetlink.Conn) error) error {
	c, err := ns.Dial()
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

// Index returns the index of the named link in the namespace.
func (ns *NS) Index(name string) (int, error) {
	var idx int
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		idx = ifi.Index
		return nil
	})
	return idx, err
}

// Link returns the link message of the named link.
func (ns *NS) Link(name string) (rtnetlink.LinkMessage, error) {
	var lm rtnetlink.LinkMessage
	idx, err := ns.Index(name)
	if err != nil {
		return lm, err
	}
	err = ns.withConn(func(c *rtnetlink.Conn) error {
		lm, err = c.Link.Get(uint32(idx))
		return err
	})
	return lm, err
}

// VethConfig describes a veth pair for AddVeth.
type VethConfig struct {
	// Name and Peer name the two ends.
	Name, Peer string
	// PeerNS is the namespace of the peer end (nil: the same as the
	// first end).
	PeerNS *NS
	// MTU of both ends (0: the kernel's default, 1500).
	MTU int
	// Addr and PeerAddr are MAC addresses (nil: random).
	Addr, PeerAddr net.HardwareAddr
	// Queues is the number of RX and TX queues of each end (0: 1).
	Queues int
}

// AddVeth creates a veth pair with one end in ns and the other in
// c.PeerNS. Both ends are left down; use Up.
func (ns *NS) AddVeth(c VethConfig) error {
	peerAttrs := &rtnetlink.LinkAttributes{Name: c.Peer, MTU: uint32(c.MTU), Address: c.PeerAddr}
	if c.PeerNS != nil && c.PeerNS != ns {
		peerAttrs.NetNS = rtnetlink.NetNSForFD(uint32(c.PeerNS.fd))
	}
	peer := &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Attributes: peerAttrs}
	req := &rtnetlink.LinkMessage{
		Family: unix.AF_UNSPEC,
		Attributes: &rtnetlink.LinkAttributes{
			Name:    c.Name,
			MTU:     uint32(c.MTU),
			Address: c.Addr,
			Info:    &rtnetlink.LinkInfo{Kind: "veth", Data: &driver.Veth{PeerInfo: peer}},
		},
	}
	if c.Queues > 1 {
		return ns.addVethQueues(req, c)
	}
	err := ns.withConn(func(conn *rtnetlink.Conn) error { return conn.Link.New(req) })
	if err != nil {
		return fmt.Errorf("netns: add veth %s/%s: %w", c.Name, c.Peer, err)
	}
	return nil
}

// addVethQueues creates a multi-queue veth pair. rtnetlink's LinkMessage
// has no IFLA_NUM_TX/RX_QUEUES, so the request is assembled by hand.
func (ns *NS) addVethQueues(req *rtnetlink.LinkMessage, c VethConfig) error {
	q := uint32(c.Queues)
	peerMsg, err := (&rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Attributes: req.Attributes.Info.Data.(*driver.Veth).PeerInfo.Attributes}).MarshalBinary()
	if err != nil {
		return err
	}
	peerMsg = appendU32Attr(appendU32Attr(peerMsg, unix.IFLA_NUM_TX_QUEUES, q), unix.IFLA_NUM_RX_QUEUES, q)
	info := netlink.NewAttributeEncoder()
	info.String(unix.IFLA_INFO_KIND, "veth")
	info.Nested(unix.IFLA_INFO_DATA, func(nae *netlink.AttributeEncoder) error {
		nae.Bytes(1 /* VETH_INFO_PEER */, peerMsg)
		return nil
	})
	infoB, err := info.Encode()
	if err != nil {
		return err
	}
	top := netlink.NewAttributeEncoder()
	top.String(unix.IFLA_IFNAME, c.Name)
	if c.MTU != 0 {
		top.Uint32(unix.IFLA_MTU, uint32(c.MTU))
	}
	if len(c.Addr) != 0 {
		top.Bytes(unix.IFLA_ADDRESS, c.Addr)
	}
	top.Uint32(unix.IFLA_NUM_TX_QUEUES, q)
	top.Uint32(unix.IFLA_NUM_RX_QUEUES, q)
	top.Bytes(unix.IFLA_LINKINFO, infoB)
	attrs, err := top.Encode()
	if err != nil {
		return err
	}
	body := make([]byte, unix.SizeofIfInfomsg, unix.SizeofIfInfomsg+len(attrs))
	body = append(body, attrs...)
	conn, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.fd})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_NEWLINK,
			Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Excl},
		Data: body,
	})
	if err != nil {
		return fmt.Errorf("netns: add veth %s/%s: %w", c.Name, c.Peer, err)
	}
	return nil
}

func appendU32Attr(b []byte, typ uint16, v uint32) []byte {
	var a [8]byte
	nativePut16(a[0:], 8)
	nativePut16(a[2:], typ)
	nativePut32(a[4:], v)
	return append(b, a[:]...)
}

func nativePut16(b []byte, v uint16) { *(*uint16)(unsafePointer(&b[0])) = v }
func nativePut32(b []byte, v uint32) { *(*uint32)(unsafePointer(&b[0])) = v }

// AddBridge creates a Linux bridge named name in ns, left down; enslave
// ports with SetMaster and bring it up with Up. A bridge forwards every
// EtherType, so raw frames (Weft's own 0x88B5) cross it as IP does.
func (ns *NS) AddBridge(name string) error {
	req := &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC,
		Attributes: &rtnetlink.LinkAttributes{Name: name, Info: &rtnetlink.LinkInfo{Kind: "bridge"}}}
	if err := ns.withConn(func(c *rtnetlink.Conn) error { return c.Link.New(req) }); err != nil {
		return fmt.Errorf("netns: add bridge %s: %w", name, err)
	}
	return nil
}

// SetMaster makes the link named port a port of the bridge named master
// (both in ns).
func (ns *NS) SetMaster(port, master string) error {
	pi, err := ns.Index(port)
	if err != nil {
		return err
	}
	mi, err := ns.Index(master)
	if err != nil {
		return err
	}
	if err := ns.withConn(func(c *rtnetlink.Conn) error { return c.Link.SetMaster(uint32(pi), uint32(mi), nil) }); err != nil {
		return fmt.Errorf("netns: %s master %s: %w", port, master, err)
	}
	return nil
}

// Up sets the named link up.
func (ns *NS) Up(name string) error { return ns.setFlags(name, unix.IFF_UP, unix.IFF_UP) }

// Down sets the named link down.
func (ns *NS) Down(name string) error { return ns.setFlags(name, 0, unix.IFF_UP) }

func (ns *NS) setFlags(name string, flags, change uint32) error {
	idx, err := ns.Index(name)
	if err != nil {
		return err
	}
	return ns.withConn(func(c *rtnetlink.Conn) error {
		return c.Link.Set(&rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Index: uint32(idx), Flags: flags, Change: change})
	})
}

// SetMTU sets the MTU of the named link.
func (ns *NS) SetMTU(name string, mtu int) error {
	idx, err := ns.Index(name)
	if err != nil {
		return err
	}
	return ns.withConn(func(c *rtnetlink.Conn) error {
		return c.Link.Set(&rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Index: uint32(idx),
			Attributes: &rtnetlink.LinkAttributes{MTU: uint32(mtu)}})
	})
}

// AddAddr adds an address in CIDR notation ("10.0.0.1/24") to the named
// link.
func (ns *NS) AddAddr(name, cidr string) error {
	ip, ipn, err := net.ParseCIDR(cidr)
	if err != nil {
		return err
	}
	idx, err := ns.Index(name)
	if err != nil {
		return err
	}
	fam, ones := uint8(unix.AF_INET), 0
	ones, _ = ipn.Mask.Size()
	if ip.To4() == nil {
		fam = unix.AF_INET6
	} else {
		ip = ip.To4()
	}
	req := &rtnetlink.AddressMessage{Family: fam, PrefixLength: uint8(ones), Index: uint32(idx),
		Attributes: &rtnetlink.AddressAttributes{Address: ip, Local: ip}}
	if fam == unix.AF_INET6 {
		// No duplicate address detection: the address is usable at
		// once, not tentative for a second or two (a bind to it would
		// fail with EADDRNOTAVAIL meanwhile, even with accept_dad 0
		// while the device is still coming up).
		req.Flags = unix.IFA_F_NODAD
	}
	if fam == unix.AF_INET {
		bc := make(net.IP, 4)
		for i := range bc {
			bc[i] = ip[i] | ^ipn.Mask[i]
		}
		req.Attributes.Broadcast = bc
	}
	return ns.withConn(func(c *rtnetlink.Conn) error { return c.Address.New(req) })
}

// AddNeigh adds a permanent neighbour entry (static ARP) on the named
// link, so traffic to ip needs no resolution.
func (ns *NS) AddNeigh(name string, ip net.IP, mac net.HardwareAddr) error {
	idx, err := ns.Index(name)
	if err != nil {
		return err
	}
	fam := uint8(unix.AF_INET)
	if ip.To4() == nil {
		fam = unix.AF_INET6
	} else {
		ip = ip.To4()
	}
	req := &rtnetlink.NeighMessage{Family: uint16(fam), Index: uint32(idx), State: unix.NUD_PERMANENT,
		Attributes: &rtnetlink.NeighAttributes{Address: ip, LLAddress: mac}}
	return ns.withConn(func(c *rtnetlink.Conn) error { return c.Neigh.New(req) })
}

// Sysctl writes value to /proc/sys/PATH inside the namespace (for the
// per-namespace net.* keys), e.g. Sysctl("net/ipv6/conf/all/disable_ipv6", "1").
func (ns *NS) Sysctl(path, value string) error {
	return ns.Do(func() error {
		return os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
	})
}

// OpenNamed returns a handle to the existing named namespace
// /run/netns/NAME. Closing the handle does not remove the namespace.
func OpenNamed(name string) (*NS, error) {
	fd, err := unix.Open(filepath.Join(RunDir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netns: open %s: %w", name, os.NewSyscallError("open", err))
	}
	return &NS{fd: fd, host: true}, nil
}
