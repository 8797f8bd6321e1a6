package roce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/addrparam"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/exchange"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

func init() {
	fabric.RegisterBackend("roce", driver{})
}

// Endpoint is a queue pair of the user-space engine as a fabric.Endpoint.
type Endpoint struct {
	qp      *QP
	pd      *PD
	laddr   string // LocalAddr
	raddr   string // RemoteAddr
	release func()
	goodbye bool // connected by the exchange to a Weft peer: Close says goodbye (gsi.go)
	foreign bool // connected by the exchange to a peer that is not Weft (Caps.Foreign)
	once    sync.Once
	closed  bool
	err     error
}

var (
	_ fabric.Endpoint     = (*Endpoint)(nil)
	_ fabric.ViewReceiver = (*Endpoint)(nil)
)

// QP returns the endpoint's queue pair, for verbs-level operations such
// as atomics.
func (ep *Endpoint) QP() *QP { return ep.qp }

// Send implements fabric.Endpoint.
func (ep *Endpoint) Send(msgs []fabric.Message) (int, error) { return ep.qp.Send(msgs) }

// Recv implements fabric.Endpoint.
func (ep *Endpoint) Recv(msgs []fabric.Message) (int, error) { return ep.qp.Recv(msgs) }

// RecvViews implements fabric.ViewReceiver.
func (ep *Endpoint) RecvViews(views []fabric.View) (int, error) { return ep.qp.RecvViews(views) }

// RecvViewsWait implements fabric.ViewReceiver.
func (ep *Endpoint) RecvViewsWait(ctx context.Context, views []fabric.View) (int, error) {
	return ep.qp.RecvViewsWait(ctx, views)
}

// ReleaseViews implements fabric.ViewReceiver.
func (ep *Endpoint) ReleaseViews(n int) error { return ep.qp.ReleaseViews(n) }

// OutstandingViews implements fabric.ViewReceiver.
func (ep *Endpoint) OutstandingViews() int { return ep.qp.OutstandingViews() }

// ViewRoom implements fabric.ViewRoom.
func (ep *Endpoint) ViewRoom() (views, bytes int) { return ep.qp.ViewRoom() }

// ViewEpoch implements fabric.ViewRoom.
func (ep *Endpoint) ViewEpoch() uint64 { return ep.qp.ViewEpoch() }

var _ fabric.ViewRoom = (*Endpoint)(nil)

// SendWait implements fabric.Endpoint.
func (ep *Endpoint) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return ep.qp.SendWait(ctx, msgs)
}

// RecvWait implements fabric.Endpoint.
func (ep *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	return ep.qp.RecvWait(ctx, msgs)
}

// Write implements fabric.Endpoint.
func (ep *Endpoint) Write(msgs []fabric.Message) (int, error) { return ep.qp.Write(msgs) }

// Read implements fabric.Endpoint.
func (ep *Endpoint) Read(msgs []fabric.Message) (int, error) { return ep.qp.Read(msgs) }

// Register implements fabric.Endpoint: any memory can be registered, with
// any permissions (the engine reaches it directly).
func (ep *Endpoint) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	if ep.qp.closed.Load() {
		return nil, opErr("register", fabric.ErrClosed)
	}
	return ep.pd.RegMR(buf, access)
}

// Alloc implements fabric.Endpoint.
func (ep *Endpoint) Alloc(size int, access fabric.Access) (*fabric.Region, error) {
	if size <= 0 {
		return nil, opErr("alloc", fabric.ErrInvalid)
	}
	// 64-byte alignment keeps 8-byte atomics and cache lines aligned.
	raw := make([]byte, size+64)
	off := int(-uintptrOf(raw) & 63)
	return ep.Register(raw[off:off+size:off+size], access)
}

// CQ implements fabric.Endpoint.
func (ep *Endpoint) CQ() fabric.CompletionQueue { return ep.qp.cq }

// Caps implements fabric.Endpoint.
func (ep *Endpoint) Caps() fabric.Caps {
	qp := ep.qp
	c := fabric.Caps{Backend: "roce", MaxMsgSize: qp.cfg.MaxMsgSize, MaxSGEs: maxSGE, MTU: qp.mtu,
		InlineSize: qp.cfg.InlineSize, MaxRMASize: 1 << 31, Foreign: ep.foreign, Path: qp.e.linkName()}
	if qp.viaShm {
		c.Path = "shm"
	}
	if qp.cfg.Type == RC {
		c.RMA, c.Atomics, c.Reliable = true, true, true
	} else {
		c.MaxMsgSize = min(qp.mtu, qp.cfg.MaxMsgSize)
	}
	return c
}

// Stats implements fabric.Endpoint.
func (ep *Endpoint) Stats() fabric.Stats {
	s := ep.qp.Stats()
	s.Drops[fabric.DropNoBuffer] += ep.qp.cq.q.Overruns.Load()
	return s
}

// Events implements fabric.Endpoint.
func (ep *Endpoint) Events() <-chan fabric.Event { return ep.qp.evs }

// LocalAddr implements fabric.Endpoint: the local end of the exchange
// that set the endpoint up.
func (ep *Endpoint) LocalAddr() string { return ep.laddr }

// RemoteAddr implements fabric.Endpoint: the exchange address dialled, or
// the peer's end of an accepted exchange.
func (ep *Endpoint) RemoteAddr() string { return ep.raddr }

// Close implements fabric.Endpoint: it waits (at most two seconds) until
// the messages already sent are acknowledged, then destroys the QP and
// releases the engine (closed when its last endpoint goes).
func (ep *Endpoint) Close() error {
	ep.once.Do(func() {
		// Like a TCP close, deliver what was sent before letting go: a
		// Send returns once the message is queued, not acknowledged.
		ep.qp.drain(lingerTime)
		if ep.goodbye {
			ep.qp.sendGoodbye() // the peer fails its QP now, not at its retries' end
		}
		ep.err = ep.qp.Destroy()
		if ep.release != nil {
			ep.release()
		}
	})
	return ep.err
}

// lingerTime bounds how long Close waits for sent messages to be
// acknowledged.
const lingerTime = 2 * time.Second

// Engines are shared by the endpoints of a process, one per local address.
var engines struct {
	sync.Mutex
	m map[netip.AddrPort]*sharedEngine
}

type sharedEngine struct {
	e    *Engine
	refs int
	cfg  engineOpts // the engine's configuration, which every sharer must ask for
}

// engineOpts are the address parameters that configure the engine of a
// local address (noicrc, raw, link, gso), which all its endpoints share.
type engineOpts struct {
	NoICRC, NoRaw, Shm, XDP, GSO, Auto bool
}

// engineOpts returns the parameters of o that configure its engine.
func (o Options) engineOpts() engineOpts {
	return engineOpts{NoICRC: o.NoICRC, NoRaw: o.NoRaw, Shm: o.Shm, XDP: o.XDP, GSO: o.GSO, Auto: o.Auto}
}

// String formats the configuration as address parameters.
func (c engineOpts) String() string {
	lk := "udp"
	if c.Auto {
		lk = "auto"
	}
	if c.Shm {
		lk = "shm"
	}
	if c.XDP {
		lk = "xdp"
	}
	return fmt.Sprintf("noicrc=%d&raw=%d&link=%s&gso=%d", b2i(c.NoICRC), b2i(!c.NoRaw), lk, b2i(c.GSO))
}

// acquireEngine returns the engine for addr, starting it if needed, and a
// function that releases it. An engine already running at addr with
// another configuration is not shared: the call fails with an error
// matching fabric.ErrInvalid (an address's noicrc, raw, link and gso
// parameters configure its engine, so all endpoints of one local address
// must agree on them), except that an endpoint with the default link
// (link=auto, no gso) joins the engine whatever link it runs. Port 0 is the engine's default port, link.Port:
// endpoints that name it and endpoints that leave it out share one
// engine.
func acquireEngine(addr netip.AddrPort, c engineOpts) (*Engine, func(), error) {
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), link.Port)
	}
	engines.Lock()
	defer engines.Unlock()
	if engines.m == nil {
		engines.m = map[netip.AddrPort]*sharedEngine{}
	}
	s := engines.m[addr]
	// An endpoint that names no link (link=auto) takes the engine running
	// at its address whatever its link: it has no preference of its own.
	if s != nil && s.cfg != c && !(c.Auto && s.cfg.NoICRC == c.NoICRC && s.cfg.NoRaw == c.NoRaw) {
		return nil, nil, fmt.Errorf("the engine at %s runs with %s; this endpoint asks for %s: %w",
			addr, s.cfg, c, fabric.ErrInvalid)
	}
	if s == nil {
		e, err := NewEngine(EngineConfig{Addr: addr, NoICRC: c.NoICRC, NoRaw: c.NoRaw, Shm: c.Shm, XDP: c.XDP, GSO: c.GSO, Auto: c.Auto})
		if err != nil {
			return nil, nil, err
		}
		s = &sharedEngine{e: e, cfg: c}
		engines.m[addr] = s
	}
	s.refs++
	var once sync.Once
	return s.e, func() {
		once.Do(func() {
			engines.Lock()
			defer engines.Unlock()
			s.refs--
			if s.refs == 0 {
				delete(engines.m, addr)
				s.e.Close()
			}
		})
	}, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Options are the parameters of a fabric address (see ParseAddr).
type Options struct {
	Listen    bool           // accept a connection rather than dial one
	Bootstrap string         // host:port of the TCP exchange
	Local     netip.Addr     // local RoCE address (default: the TCP connection's)
	Port      uint16         // UDP port of the local engine (default 4791)
	Type      QPType         // RC (default) or UD
	MTU       int            // path MTU (default 1024)
	Timeout   uint8          // local ACK timeout exponent (default 12: 16.8 ms; an rdma_cm address's is DefaultCMACKTimeout, 19: 2.1 s)
	Retry     uint8          // retry count (default 7)
	RNRRetry  uint8          // RNR retry count (default 7: infinite)
	QKey      uint32         // UD Q_Key (default 0x11111111, as ibv_ud_pingpong)
	KeepAlive time.Duration  // idle keep-alive (default 100 ms; 0 via "keepalive=0")
	NoICRC    bool           // do not verify received ICRCs
	NoRaw     bool           // receive on the UDP socket (see UDPConfig.NoRaw)
	Shm       bool           // link=shm: carry packets through shared memory to engines of this host (ShmLink)
	XDP       bool           // link=xdp: carry packets through an AF_XDP socket on the address's interface (XDPLink)
	GSO       bool           // UDP GSO and GRO between Weft engines (see UDPConfig.GSO)
	Auto      bool           // link=auto, the default: UDP, and shared memory to the Weft peers of this host that offer it (EngineConfig.Auto)
	DialRetry time.Duration  // how long a dial retries a refused exchange (default 5s; "dialretry=0": never, -1: until ctx is done)
	QP        QPConfig       // queue pair sizes
	peerPort  netip.AddrPort // resolved bootstrap address
}

// ParseAddr parses a roce address:
//
//	[listen:]HOST:PORT[?mtu=1024&type=rc|ud&local=IP&port=4791&timeout=12&retry=7&rnr=7&qkey=0x11111111&keepalive=100ms&dialretry=5s&noicrc=1&raw=0&link=shm|xdp&gso=1]
//
// HOST:PORT is the TCP address of the out-of-band exchange (the pingpong
// programs' format, port 18515 by default): "listen:" accepts one
// connection there, otherwise the endpoint dials it (fabric.Listen
// accepts any number, see Listener). The RoCE traffic
// itself goes to UDP port 4791 of the address the exchange names.
// noicrc, raw, link and gso configure the engine of the local address,
// which all endpoints there share: they must agree on them (see Open).
// link=shm carries the RoCEv2 packets through shared memory to engines of
// this host that use it too (see ShmLink), instead of UDP. link=xdp
// carries them through an AF_XDP socket on the interface of the local
// address, bypassing the kernel's UDP path with the same bytes on the
// wire (see XDPLink; IPv4, path MTU 2048 at most, needs CAP_NET_ADMIN
// and CAP_BPF). gso=1 sends
// runs of equal-size packets as one UDP GSO message and receives GRO
// messages whole (see UDPConfig.GSO): for Weft peers that set it too, or
// peers reached through a path that cuts the packets apart. A malformed
// value or an unknown parameter is an error that names the key and
// matches fabric.ErrInvalid.
func ParseAddr(addr string) (Options, error) {
	listen, boot, p, err := splitAddr(addr, exchange.DefaultBootstrapPort)
	if err != nil {
		return defaultOptions(), err
	}
	if p.Bool("cm", false) {
		p.Fail("cm", "1", errors.New("an rdma_cm address (see cm.IsAddr), which Open and Listen take"))
	}
	return parseOptions(listen, boot, p)
}

func defaultOptions() Options {
	return Options{Type: RC, MTU: 1024, Timeout: 12, Retry: 7, RNRRetry: 7, QKey: 0x11111111,
		KeepAlive: 100 * time.Millisecond, DialRetry: exchange.DefaultDialRetry}
}

// parseOptions reads the parameters of a roce address (exchange or
// rdma_cm) into Options.
func parseOptions(listen bool, bootstrap string, p *addrparam.Params) (Options, error) {
	d := defaultOptions()
	o := Options{Listen: listen, Bootstrap: bootstrap}
	o.MTU = p.Int("mtu", d.MTU, 0, 1<<16-1)
	if !validMTU(o.MTU) {
		p.Fail("mtu", strconv.Itoa(o.MTU), errors.New("want 256, 512, 1024, 2048 or 4096"))
	}
	o.Type = addrparam.Enum(p, "type", d.Type, map[string]QPType{"rc": RC, "ud": UD})
	o.Local = p.IP("local", netip.Addr{})
	o.Port = uint16(p.Int("port", 0, 0, 1<<16-1))
	o.Timeout = uint8(p.Int("timeout", int(d.Timeout), 0, 31))
	o.Retry = uint8(p.Int("retry", int(d.Retry), 0, 7))
	o.RNRRetry = uint8(p.Int("rnr", int(d.RNRRetry), 0, 7))
	o.QKey = uint32(p.Uint("qkey", uint64(d.QKey), 1<<32-1))
	o.KeepAlive = p.Duration("keepalive", d.KeepAlive, 0, math.MaxInt64)
	o.DialRetry = p.Patience("dialretry", d.DialRetry)
	o.NoICRC = p.Bool("noicrc", false)
	o.NoRaw = !p.Bool("raw", true)
	o.GSO = p.Bool("gso", false)
	switch addrparam.Enum(p, "link", "auto", map[string]string{"auto": "auto", "udp": "udp", "shm": "shm", "xdp": "xdp"}) {
	case "auto":
		// gso=1 asks for UDP's GSO: the automatic link is UDP's
		// without it.
		o.Auto = !o.GSO
	case "shm":
		o.Shm = true
	case "xdp":
		o.XDP = true
	}
	if o.XDP && o.MTU > link.XDPMaxMTU {
		p.Fail("mtu", strconv.Itoa(o.MTU), fmt.Errorf("link=xdp carries a path MTU of %d at most", link.XDPMaxMTU))
	}
	o.QP.MaxMsgSize = p.Int("maxmsg", 0, 0, 1<<31-1)
	o.QP.InlineSize = p.Int("inline", 0, 0, 1<<31-1)
	return o, p.Err()
}

// SplitAddr splits a roce exchange address, [listen:]HOST[:PORT][?PARAMS],
// into the listen flag, the host:port of the TCP exchange (port
// DefaultBootstrapPort if none) and the parameters (internal/addrparam's
// grammar, one value a key: the last). Its errors match fabric.ErrInvalid.
func SplitAddr(addr string) (listen bool, bootstrap string, params url.Values, err error) {
	listen, bootstrap, p, err := splitAddr(addr, exchange.DefaultBootstrapPort)
	if err != nil {
		return listen, bootstrap, nil, err
	}
	return listen, bootstrap, p.Values(), nil
}

// splitAddr splits [listen:]HOST[:PORT][?PARAMS], giving HOST port
// defPort if it has none.
func splitAddr(addr string, defPort int) (listen bool, hostport string, p *addrparam.Params, err error) {
	return addrparam.SplitHost(addr, defPort)
}

type driver struct{}

// Usage implements fabric.Driver.
func (driver) Usage() string {
	return "[listen:]HOST:PORT[?mtu=1024&type=rc|ud&local=IP&port=4791&timeout=12&retry=7&rnr=7&qkey=0x11111111&keepalive=100ms&dialretry=5s&maxmsg=N&inline=N&noicrc=0&raw=1&link=udp|shm|xdp&gso=0]: user-space RoCEv2 engine (noicrc, raw, link and gso configure the engine every endpoint of the local address shares; link=shm joins engines of one host through shared memory, link=xdp bypasses the kernel through AF_XDP); HOST:PORT is the TCP exchange (ibv_rc_pingpong format, default port 18515); fabric.Listen takes HOST:PORT (port 0: any); " +
		"rdmacm://[listen:]HOST[:PORT][?...] or HOST:PORT?cm=1 connects and listens through rdma_cm instead (IB CM on QP 1, rdma_cm port 7471 by default), like rdma_connect and rdma_listen (there timeout= defaults to 19, 2.1 s, as Linux's rdma_cm asks)"
}

// Open implements fabric.Driver. The endpoints of one local address and
// port share one engine, started by the first with its noicrc and raw
// parameters; an endpoint that asks for others fails with an error
// matching fabric.ErrInvalid rather than silently getting the running
// engine's.
func (driver) Open(ctx context.Context, addr string, o fabric.Options) (fabric.Endpoint, error) {
	if cm.IsAddr(addr) {
		return openCM(ctx, addr, o) // rdmacm.go, rdmacm_fabric.go
	}
	opts, err := ParseAddr(addr)
	if err != nil {
		return nil, opErrAddr("open", addr, err)
	}
	opts.apply(o)
	ep, err := Connect(ctx, opts)
	if err != nil {
		return nil, opErrAddr("open", addr, err)
	}
	return ep, nil
}

// apply takes the queue pair settings of fabric options.
func (opts *Options) apply(o fabric.Options) {
	if o.MaxMsgSize > 0 && opts.QP.MaxMsgSize == 0 {
		opts.QP.MaxMsgSize = o.MaxMsgSize
	}
	if o.CQSize > 0 {
		opts.QP.CQ = nil
	}
	opts.QP.Spin = o.Spin
	if o.QueueDepth > 0 {
		opts.QP.SQDepth = o.QueueDepth
	}
}

// Connect sets up an endpoint: the TCP exchange with the peer (dialing or
// listening), then a queue pair connected to the peer's. A dialer makes its
// queue pair before it connects, so that the peer's handshake timer does
// not run while this side allocates.
func Connect(ctx context.Context, o Options) (*Endpoint, error) {
	if o.Listen {
		conn, err := exchange.Dial(ctx, true, o.Bootstrap, o.Local, o.DialRetry)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		ep, mine, err := newEndpoint(o, localOf(conn, o.Local), conn.LocalAddr().String(), conn.RemoteAddr().String())
		if err != nil {
			return nil, err
		}
		if _, err := exchange.Server(ctx, conn, mine, func(peer exchange.Dest) error { return ep.connect(o, mine, peer) }); err != nil {
			ep.Close()
			return nil, err
		}
		return ep, nil
	}
	local := o.Local
	if !local.IsValid() {
		// The address the exchange will leave from: the engine's.
		c, err := net.Dial("udp", o.Bootstrap)
		if err != nil {
			return nil, fmt.Errorf("roce: no route to %s: %w", o.Bootstrap, err)
		}
		local = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}
	ep, mine, err := newEndpoint(o, local, "", o.Bootstrap)
	if err != nil {
		return nil, err
	}
	conn, err := exchange.Dial(ctx, false, o.Bootstrap, local, o.DialRetry)
	if err != nil {
		ep.Close()
		return nil, err
	}
	defer conn.Close()
	ep.laddr = conn.LocalAddr().String()
	_, err = exchange.Client(ctx, conn, mine, func(peer exchange.Dest) error { return ep.connect(o, mine, peer) })
	if err != nil {
		ep.Close()
		return nil, err
	}
	return ep, nil
}

// localOf is the engine address of an exchange connection: o.Local if
// set, else the connection's local address.
func localOf(conn net.Conn, local netip.Addr) netip.Addr {
	if local.IsValid() {
		return local
	}
	return conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
}

// newEndpoint creates a queue pair on the engine of local and returns it
// with the address to tell the peer.
func newEndpoint(o Options, local netip.Addr, laddr, raddr string) (*Endpoint, exchange.Dest, error) {
	eng, release, err := acquireEngine(netip.AddrPortFrom(local, o.Port), o.engineOpts())
	if err != nil {
		return nil, exchange.Dest{}, err
	}
	pd := eng.AllocPD()
	cfg := o.QP
	cfg.Type = o.Type
	qp, err := pd.CreateQP(cfg)
	if err != nil {
		release()
		return nil, exchange.Dest{}, err
	}
	ep := &Endpoint{qp: qp, pd: pd, release: release, laddr: laddr, raddr: raddr}
	var b [4]byte
	rand.Read(b[:])
	lid := uint16(exchange.WeftLID)
	if eng.shmRing() {
		lid = exchange.WeftShmLID
	}
	mine := exchange.Dest{LID: lid, QPN: qp.QPN(), PSN: wire.PSN(binary.LittleEndian.Uint32(b[:]) & wire.PSNMask), GID: eng.GID()}
	return ep, mine, nil
}

// connect moves the endpoint's queue pair to RTS towards peer. A Weft
// peer gets a goodbye when the endpoint closes; another is foreign.
func (ep *Endpoint) connect(o Options, mine, peer exchange.Dest) error {
	ep.goodbye, ep.foreign = peer.IsWeft(), !peer.IsWeft()
	// The automatic link: a Weft peer whose engine has a ring on this
	// host gets this RC QP's packets through it (Engine.viaShm).
	ep.qp.viaShm = ep.qp.e.viaShm(o.Type, peer.OffersShm(), peer.GID.Addr())
	attr := &QPAttr{PathMTU: o.MTU, Dest: peer.GID.Addr(), DestQPN: peer.QPN, RQPSN: peer.PSN,
		SQPSN: mine.PSN, Timeout: o.Timeout, RetryCnt: o.Retry, RNRRetry: o.RNRRetry,
		MinRNRTimer: 12, MaxRDAtomic: 16, QKey: o.QKey}
	if o.Type == RC {
		attr.KeepAlive = o.KeepAlive
	}
	return ep.qp.Connect(attr)
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
