// Package verbs is Weft's RoCE hardware path: the fabric backend "verbs"
// over rdma-core's libibverbs, for RDMA NICs (NVIDIA/Mellanox ConnectX,
// Broadcom, ...) and the kernel's Soft-RoCE (rxe). A program switches
// between it and the user-space engine of package roce with the backend
// name alone: both take the same address syntax and the same out-of-band
// exchange (rdma-core's ibv_rc_pingpong format), so either end may be
// either implementation, or an rdma-core program.
//
// # rdma_cm
//
// An address rdmacm://HOST[:PORT] (see ParseAddr) connects through
// librdmacm instead, as the "roce" backend's rdma_cm addresses do through
// the engine's own CM, so either end may be either backend or a librdmacm
// program (rping, ucmatose, rdma_server, ...): address and route
// resolution, rdma_connect with private data and the RDMA READ depths
// (responder resources, initiator depth), and rdma_disconnect on Close.
// fabric.Listen on rdmacm://HOST:PORT listens like rdma_listen and accepts
// any number of peers, each an independent Endpoint with an rdma_cm id and
// event channel of its own; requests past the backlog are rejected. The
// event channels wait in Go's poller, like the completion channels. A
// peer's disconnect (its DREQ) is the peer's loss: EventPeerGone, and
// fabric.ErrPeerGone from then on. A REJ is a *cm.RejectError (matching
// fabric.ErrRefused, or context.DeadlineExceeded for a timeout), any other
// failed event a *CMError matching its errno and fabric sentinel.
//
// The binding uses cgo and needs libibverbs and librdmacm (Debian:
// libibverbs-dev, librdmacm-dev) at build time, so it sits behind a build
// tag:
//
//	go build -tags rdma ./...
//
// Without the tag (or without cgo) the package still builds: Devices,
// Connect and ListenCM return an error matching fabric.ErrNotSupported, and the
// "verbs" backend is registered so that fabric.Open says why.
//
// # Data path
//
// Send, Write and Read post their whole burst as one chain of work
// requests with a single ibv_post_send (one doorbell: perftest's post
// list, -l). Messages up to the device's inline limit go inline; messages
// up to Caps.InlineSize are copied into a registered bounce slot, so the
// caller's buffers are free when Send returns; larger ones are gathered by
// the NIC straight from the caller's registered regions. Only one work
// request in every SignalEvery (and those the caller flags with
// fabric.FlagSignal) asks for a completion: selective signaling. Receives
// land in a ring of pre-posted buffers that Recv copies out of and reposts
// in bursts. Completion queues are polled in bursts; blocking calls
// busy-poll for Options.Spin and then sleep on a completion channel.
//
// Work requests, SGE arrays and completion entries live in C memory
// allocated once per queue pair: Go fills them in place and makes one cgo
// call per burst with scalar arguments, so the data path allocates
// nothing and passes no Go pointer to C. Memory given to Register may be
// Go memory (it is pinned with runtime.Pinner while registered); Alloc
// returns page-aligned memory from mmap.
//
// # Peer loss
//
// Verbs has no connection close. A connected RC endpoint sends a
// zero-length RDMA WRITE when it has been idle for the keep-alive period
// (any RC responder acknowledges one without a remote key); when the peer
// is gone its retries run out, the queue pair enters the error state and
// Recv, Send and the event channel report fabric.ErrPeerGone.
package verbs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/addrparam"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/exchange"
	"github.com/weft-io/weft/roce/wire"
)

// ErrNoDevice reports that there is no RDMA device to use: the kernel has
// no RDMA support, no device is configured, or the one asked for is
// missing. It matches fabric.ErrNotSupported.
var ErrNoDevice = fmt.Errorf("verbs: no RDMA device: %w", fabric.ErrNotSupported)

// GIDType is the type of a GID table entry.
type GIDType uint8

// GID types (enum ibv_gid_type).
const (
	GIDIB GIDType = iota
	GIDRoCEv1
	GIDRoCEv2
)

// String returns "IB", "RoCEv1" or "RoCEv2".
func (t GIDType) String() string {
	switch t {
	case GIDIB:
		return "IB"
	case GIDRoCEv1:
		return "RoCEv1"
	case GIDRoCEv2:
		return "RoCEv2"
	}
	return "GIDType(" + strconv.Itoa(int(t)) + ")"
}

// GIDEntry is one entry of a port's GID table.
type GIDEntry struct {
	Index   int
	GID     [16]byte
	Type    GIDType
	Ifindex int // the network interface the GID belongs to (RoCE)
}

// Addr returns the GID as an address, unmapped if it is IPv4-mapped.
func (g GIDEntry) Addr() netip.Addr { return netip.AddrFrom16(g.GID).Unmap() }

// PortInfo describes a port of a device.
type PortInfo struct {
	Num       uint8
	Active    bool
	ActiveMTU int  // bytes
	Ethernet  bool // RoCE (link layer Ethernet) rather than InfiniBand
	LID       uint16
	GIDs      []GIDEntry
}

// DeviceInfo describes an RDMA device.
type DeviceInfo struct {
	Name            string
	GUID            uint64
	MaxQPWR         int
	MaxSGE          int
	MaxCQE          int
	MaxMRSize       uint64
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	Atomics         bool
	Ports           []PortInfo
}

// Options are the parameters of a verbs address (see ParseAddr).
type Options struct {
	Listen    bool          // accept the out-of-band connection rather than dial it
	Bootstrap string        // host:port of the TCP exchange
	Device    string        // device name (default: the one whose GID table has Local)
	Port      uint8         // device port (default: the one with the GID)
	GIDIndex  int           // GID index (-1, the default: the RoCEv2 GID of Local)
	Local     netip.Addr    // local RoCE address (default: the TCP connection's)
	Type      wire.QPType   // RC (default) or UD
	MTU       int           // path MTU (default: the port's active MTU)
	Timeout   uint8         // local ACK timeout exponent (default 14: 67 ms; rdma_cm: 0, the path's, as librdmacm's programs have it)
	Retry     uint8         // retry count (default 6: rxe and some NICs treat 7 as infinite)
	RNRRetry  uint8         // RNR retry count (default 7: infinite)
	QKey      uint32        // UD Q_Key (default 0x11111111, as ibv_ud_pingpong)
	KeepAlive time.Duration // idle keep-alive of RC endpoints (default 100 ms; "keepalive=0" disables)
	DialRetry time.Duration // how long a dial retries a refused exchange, as roce's (default 5s; "dialretry=0": never, -1: until ctx is done)
	MaxMsg    int           // largest message (default 64 KiB; UD: the MTU)
	Depth     int           // send and receive queue depth (default 256)
	Inline    int           // Caps.InlineSize: copy-before-return limit (default 4096)
	Signal    int           // SignalEvery: one signaled work request per this many (default Depth/4)
	Spin      time.Duration // busy-poll budget of blocking calls (fabric.Options.Spin)

	// rdma_cm addresses (rdmacm://) only:
	CM          bool   // connect through librdmacm: Bootstrap is the rdma_cm HOST:PORT
	PrivateData string // user private data sent with the connect (at most 56 bytes) or accept (at most 196)
	RespRes     uint8  // responder resources offered (0: the device's maximum, at most 16)
	InitDepth   uint8  // initiator depth asked for (0: the device's maximum, at most 16)
}

// ParseAddr parses a verbs address:
//
//	[listen:]HOST[:PORT][?dev=rxe0&ib_port=1&gid=1&local=IP&type=rc|ud&mtu=1024&timeout=14&retry=6&rnr=7&qkey=0x11111111&keepalive=100ms&dialretry=5s&maxmsg=65536&depth=256&inline=4096&signal=64]
//	rdmacm://[listen:]HOST[:PORT][?local=IP&timeout=14&retry=6&rnr=7&keepalive=100ms&maxmsg=65536&depth=256&inline=4096&signal=64&data=TEXT&resp_res=N&init_depth=N]
//
// In the first form HOST:PORT is the TCP address of the out-of-band
// exchange, in the format of rdma-core's pingpong programs (port 18515 by
// default), exactly as for the user-space engine of package roce:
// "listen:" accepts one connection there, otherwise the endpoint dials it
// (retrying until the peer listens).
//
// The second form (or the first with cm=1) connects through librdmacm,
// as the "roce" backend's rdma_cm addresses do: HOST:PORT is the peer's
// (with "listen:", the local) IP address and rdma_cm port in the TCP port
// space (7471 by default, as rdma_server and rdma_client use). Open
// resolves the address and route and connects like rdma_connect; with
// "listen:" it accepts one connection like rdma_listen + rdma_accept;
// fabric.Listen accepts any number. The rdma_cm chooses the device, port,
// GID and path MTU, so dev, ib_port, gid, mtu and qkey are refused; the
// local ACK timeout too unless timeout is given (Linux derives it from the
// path: exponent 19 on RoCE, about 2 s). data is the private data sent
// with the connect or accept, resp_res and init_depth the RDMA READ and
// atomic depths offered and asked for.
func ParseAddr(addr string) (Options, error) {
	o := Options{Type: wire.RC, GIDIndex: -1, Timeout: 14, Retry: 6, RNRRetry: 7, QKey: 0x11111111,
		KeepAlive: 100 * time.Millisecond, DialRetry: exchange.DefaultDialRetry}
	port := exchange.DefaultBootstrapPort
	if cm.IsAddr(addr) {
		o.CM, port = true, cm.DefaultPort
		addr = strings.TrimPrefix(addr, cm.Scheme)
	}
	listen, hostport, p, err := addrparam.SplitHost(addr, port)
	if err != nil {
		return o, err
	}
	o.Listen, o.Bootstrap = listen, hostport
	// Parameters of one kind of address only.
	only := []string{"dev", "ib_port", "gid", "mtu", "qkey"}
	why := errors.New("the rdma_cm chooses it, not an rdmacm:// parameter")
	if !o.CM {
		only, why = []string{"data", "resp_res", "init_depth"}, errors.New("an rdmacm:// parameter only")
	}
	for _, k := range only {
		if v, ok := p.Lookup(k); ok {
			p.Fail(k, v, why)
		}
	}
	p.Bool("cm", o.CM)
	o.PrivateData = p.String("data", "")
	o.RespRes = uint8(p.Int("resp_res", 0, 0, 255))
	o.InitDepth = uint8(p.Int("init_depth", 0, 0, 255))
	o.Device = p.String("dev", "")
	o.Port = uint8(p.Int("ib_port", 0, 0, 255))
	o.GIDIndex = p.Int("gid", o.GIDIndex, 0, 1<<16-1)
	o.Local = p.IP("local", netip.Addr{})
	o.Type = addrparam.Enum(p, "type", o.Type, map[string]wire.QPType{"rc": wire.RC, "ud": wire.UD})
	o.MTU = p.Int("mtu", 0, 0, 1<<16-1)
	if o.MTU != 0 && mtuEnum(o.MTU) == 0 {
		p.Fail("mtu", strconv.Itoa(o.MTU), errors.New("want 256, 512, 1024, 2048 or 4096"))
	}
	if o.CM {
		o.Timeout = 0 // the path's, as librdmacm's programs have it
	}
	o.Timeout = uint8(p.Int("timeout", int(o.Timeout), 0, 31))
	o.Retry = uint8(p.Int("retry", int(o.Retry), 0, 7))
	o.RNRRetry = uint8(p.Int("rnr", int(o.RNRRetry), 0, 7))
	o.QKey = uint32(p.Uint("qkey", uint64(o.QKey), 1<<32-1))
	o.KeepAlive = p.Duration("keepalive", o.KeepAlive, 0, math.MaxInt64)
	o.DialRetry = p.Patience("dialretry", o.DialRetry)
	o.MaxMsg = p.Int("maxmsg", 0, 0, 1<<31-1)
	o.Depth = p.Int("depth", 0, 0, 1<<16-1)
	o.Inline = p.Int("inline", 0, 0, 1<<31-1)
	o.Signal = p.Int("signal", 0, 0, 1<<16-1)
	if err := p.Err(); err != nil {
		return o, err
	}
	if o.CM && o.Type != wire.RC {
		return o, fmt.Errorf("rdma_cm connects RC queue pairs only: %w", fabric.ErrNotSupported)
	}
	if o.CM && len(o.PrivateData) > o.maxPrivateData() {
		return o, fmt.Errorf("data: %d bytes, at most %d fit: %w", len(o.PrivateData), o.maxPrivateData(), fabric.ErrInvalid)
	}
	return o, nil
}

// maxPrivateData is the most user private data an rdma_cm connect
// carries (a REQ's 92 bytes less the 36 of the CMA header) or, for a
// listening address, an accept (a REP's 196).
func (o *Options) maxPrivateData() int {
	if o.Listen {
		return cm.UserREPPrivateDataSize
	}
	return cm.UserREQPrivateDataSize
}

// mtuEnum maps an MTU in bytes to enum ibv_mtu (1 for 256 ... 5 for
// 4096), or 0.
func mtuEnum(mtu int) int {
	for e := 1; e <= 5; e++ {
		if 128<<e == mtu {
			return e
		}
	}
	return 0
}

type driver struct{}

func init() { fabric.RegisterBackend("verbs", driver{}) }

// Usage implements fabric.Driver.
func (driver) Usage() string {
	return "[listen:]HOST:PORT[?dev=rxe0&gid=1&type=rc|ud&mtu=1024]: libibverbs (RDMA NICs, Soft-RoCE; build with -tags rdma); HOST:PORT is the TCP exchange (ibv_rc_pingpong format, default port 18515); " +
		"rdmacm://[listen:]HOST[:PORT][?data=TEXT&resp_res=N&init_depth=N] connects through librdmacm instead (rdma_cm port 7471 by default), like rdma_connect and rdma_listen; fabric.Listen takes rdmacm://HOST:PORT (port 0: any)"
}

// apply takes the endpoint sizes of fo that the address left open.
func (o *Options) apply(fo fabric.Options) {
	if fo.MaxMsgSize > 0 && o.MaxMsg == 0 {
		o.MaxMsg = fo.MaxMsgSize
	}
	if fo.QueueDepth > 0 && o.Depth == 0 {
		o.Depth = fo.QueueDepth
	}
	o.Spin = fo.Spin
}

// Open implements fabric.Driver.
func (driver) Open(ctx context.Context, addr string, fo fabric.Options) (fabric.Endpoint, error) {
	o, err := ParseAddr(addr)
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "verbs", Addr: addr, Err: err}
	}
	o.apply(fo)
	ep, err := Connect(ctx, o)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		return nil, &fabric.OpError{Op: "open", Backend: "verbs", Addr: addr, Err: err}
	}
	return ep, nil
}

// Listen implements fabric.ListenDriver: addr is an rdma_cm address
// (rdmacm://HOST:PORT[?...], "listen:" implied), where the listener takes
// every connection request like rdma_listen, accepts it in the
// background and queues it until Accept. Requests beyond
// fabric.Options.Backlog are rejected (the dialer sees fabric.ErrRefused);
// a handshake that outlasts Options.HandshakeTimeout is dropped. The TCP
// exchange of the pingpong form connects one pair at a time and does not
// listen: it returns an error matching fabric.ErrNotSupported.
func (driver) Listen(ctx context.Context, addr string, fo fabric.Options) (fabric.Listener, error) {
	o, err := ParseAddr(addr)
	if err == nil && !o.CM {
		err = fmt.Errorf("listeners take rdmacm:// addresses: %w", fabric.ErrNotSupported)
	}
	if err != nil {
		return nil, &fabric.OpError{Op: "listen", Backend: "verbs", Addr: addr, Err: err}
	}
	o.apply(fo)
	l, err := ListenCM(ctx, o, fo)
	if err != nil {
		return nil, &fabric.OpError{Op: "listen", Backend: "verbs", Addr: addr, Err: err}
	}
	return l, nil
}
