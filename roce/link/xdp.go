package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/roce/wire"
	"golang.org/x/sys/unix"
)

// XDPMaxPacket is the largest RoCEv2 UDP payload an XDPLink carries: a
// frame of the link's 4096-byte UMEM chunks holds the kernel's 256-byte
// XDP headroom, the Ethernet, IPv4 and UDP headers and the payload, so a
// path MTU of 2048 fits (with the longest RoCE headers and the ICRC) and
// one of 4096 does not.
const XDPMaxPacket = 4096 - 256 - ethernet.UDP4HdrLen

// XDPMaxMTU is the largest path MTU whose packets an XDPLink carries:
// 2048 (a 4096-byte MTU's packets exceed XDPMaxPacket). It is the
// link's MaxMTU (see MTUCapper): the engine refuses a larger one when a
// queue pair is connected, and the address parameter mtu a larger one
// with link=xdp.
const XDPMaxMTU = 2048

// xdpFrameSize is the UMEM chunk size; xdpFrames the number of chunks,
// half for reception (all in the fill ring) and half for transmission.
const (
	xdpFrameSize = 4096
	xdpFrames    = 4096
	xdpRingSize  = 2048
)

// XDPConfig configures an XDPLink. The zero value is the default.
type XDPConfig struct {
	// Attach is how the XDP program is attached (default
	// ethernet.AttachAuto: native, else generic).
	Attach ethernet.AttachMode
	// Bind is the socket's mode (default xsk.ModeAuto: zero-copy where
	// the driver has it, else copy).
	Bind xsk.BindMode
	// ResolveTimeout bounds the resolution of a peer's MAC address
	// (0: 1 s). The link looks a peer it has not sent to up in the
	// kernel's neighbour table, where the engine's exchange with the peer
	// over TCP has normally put it; if it is not there, the link has the
	// kernel resolve it (ARP) in the background, for up to
	// ResolveTimeout, and WriteBatch fails the peer's packets at once
	// meanwhile (see WriteBatch): no write waits for a neighbour. A
	// resolved address is used for 10 s, then looked up again in the
	// background while it is still used; a failed resolution fails the
	// peer's packets for a second before the link tries again.
	ResolveTimeout time.Duration
}

// XDPStats counts an XDPLink's frames.
type XDPStats struct {
	// RX and TX count RoCEv2 datagrams received and sent.
	RX, TX uint64
	// Dropped counts received frames that were not RoCEv2 datagrams to
	// the link's address and port (other protocols, bad IPv4 headers or
	// lengths, fragments, other destinations) or did not fit the
	// reader's buffer. The engine drops and counts those whose ICRC
	// fails, as over UDP.
	Dropped uint64
	// NoRoute counts datagrams not sent because the peer's MAC address
	// was not resolved (yet, or at all), or because they were too large
	// (for XDPMaxPacket or the interface's MTU).
	NoRoute uint64
}

// XDPLink is a Link over an AF_XDP socket on the interface that holds
// its IPv4 address: no system call per packet where the driver needs no
// wake-up, and no kernel UDP path at all. Weft's XDP program (package
// ethernet's Program, attached with a bpf_link, so that the kernel
// detaches it when the process dies) steers the IPv4 UDP datagrams to
// port 4791 of the link's address on the interface's queue 0 to the
// link's socket (every
// RoCEv2 packet is sent to that port, whatever source port the peer's
// queue pair uses) and passes every other frame to the kernel, which so
// keeps its ARP, ICMP and sockets. An interface that already has an XDP
// program Weft did not attach is refused with an error that matches
// ethernet.ErrXDPInUse and names the program; it is never replaced.
//
// The link builds the Ethernet, IPv4 and UDP headers the kernel's UDP
// path would: IPv4 identification 0 with don't-fragment, TTL 64, the
// header checksum, and UDP checksum 0 (allowed for RoCEv2 over IPv4),
// so the RoCEv2 packet (BTH to ICRC) is byte for byte what a UDPLink
// sends and Linux rxe and NICs read it. It hands the engine the real
// IPv4 and UDP headers of received packets (Packet.Off), as a UDPLink's
// raw socket does, so the ICRC is checked over what came off the wire.
// Frames that are not RoCEv2 datagrams to the link are dropped and
// counted (Stats).
//
// Limits: IPv4 only; not on loopback; an interface of one receive queue
// (veth and most virtual devices have one; a NIC needs ethtool -L IFACE
// combined 1), which the link binds; peers on the
// link's subnet (the destination's MAC address comes from the kernel's
// neighbour table, see XDPConfig.ResolveTimeout); a path MTU of
// at most 2048 (XDPMaxPacket). The link holds UDP port 4791 of its
// address with a kernel socket, so that no UDPLink binds it too, and
// shares it with no other process (no QPN steering).
//
// On a Linux bridge that holds the address (the rxe VM harness's br0) the
// program runs in generic mode on the bridge's receive path, which the
// frames of its ports reach when they are for the bridge's own address;
// the link's frames leave through the bridge's transmit path. A packet
// capture on that interface then sees none of the link's RoCEv2 frames
// (capture on a port). The link reads the interface's MAC address once,
// when it opens: a bridge whose address the kernel picks from its ports
// (none set with ip link set ... address) changes it when a port joins or
// leaves, after which the link drops what it receives, so open it once
// the bridge's ports are in place, or set the bridge's address.
type XDPLink struct {
	local netip.AddrPort
	li    ethernet.LinkInfo
	mac   [6]byte
	ns    *netns.NS
	prog  *ethernet.Program
	umem  *xsk.UMEM
	sock  *xsk.Socket
	hold  *net.UDPConn
	cfg   XDPConfig

	// rmu serialises ReadBatch (and the fill ring) with Close.
	rmu    sync.Mutex
	inFill int
	rxFree []uint64
	// lent holds the frames of the last batch read, which the caller
	// reads in place until its next ReadBatch (see ReadBatch).
	lent []uint64

	// wmu serialises WriteBatch (TX and completion rings) with Close.
	wmu sync.Mutex
	// sealHdr is WriteBatch's scratch for a datagram sent unsealed
	// (Packet.Unsealed), which the wire never carries so (wmu).
	sealHdr sealHdr
	txFree  []uint64
	comp    [64]uint64
	hdr     ethernet.UDP4
	// maxN is the largest UDP payload sent: XDPMaxPacket, less where
	// the interface's MTU is smaller; tooLarge is the error for more.
	maxN     int
	tooLarge error

	// nmu guards macs, which the background resolutions (resolve) fill
	// in; rctx is cancelled, and rwg waited for, at Close.
	nmu     sync.Mutex
	macs    map[netip.Addr]macEntry
	rctx    context.Context
	rcancel context.CancelFunc
	rwg     sync.WaitGroup

	closed                   atomic.Bool
	closeOnce                sync.Once
	closeErr                 error // set in closeOnce
	rx, tx, dropped, noRoute atomic.Uint64
}

var (
	_ Link      = (*XDPLink)(nil)
	_ MTUCapper = (*XDPLink)(nil)
)

// ListenXDP opens an XDPLink on addr, an IPv4 address of an interface in
// the calling thread's network namespace (port 0 means Port). It needs
// CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (or root).
func ListenXDP(addr netip.AddrPort, c XDPConfig) (*XDPLink, error) {
	if c.ResolveTimeout <= 0 {
		c.ResolveTimeout = time.Second
	}
	ip := addr.Addr().Unmap()
	if !ip.Is4() || ip.IsUnspecified() {
		return nil, xdpErr(addr, fmt.Errorf("link=xdp needs the IPv4 address of an interface: %w", fabric.ErrInvalid))
	}
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(ip, Port)
	}
	addr = netip.AddrPortFrom(ip, addr.Port())
	ifi, err := interfaceOf(ip)
	if err != nil {
		return nil, xdpErr(addr, err)
	}
	li, err := ethernet.LinkByIndex(ifi)
	if err != nil {
		return nil, xdpErr(addr, err)
	}
	if ip.IsLoopback() || li.Kind == "" && li.Name == "lo" {
		return nil, xdpErr(addr, fmt.Errorf("link=xdp does not run on loopback (engines of one host: link=shm): %w", fabric.ErrNotSupported))
	}
	if q := rxQueues(li); q > 1 {
		// Frames of the other queues would reach the kernel's socket that
		// holds the port, never the engine.
		return nil, xdpErr(addr, fmt.Errorf("interface %s has %d receive queues and link=xdp binds queue 0 only (ethtool -L %s combined 1): %w",
			li.Name, q, li.Name, fabric.ErrNotSupported))
	}
	if len(li.MAC) != 6 {
		return nil, xdpErr(addr, fmt.Errorf("interface %s has no Ethernet address: %w", li.Name, fabric.ErrNotSupported))
	}
	l := &XDPLink{local: addr, li: li, mac: [6]byte(li.MAC), cfg: c, macs: map[netip.Addr]macEntry{},
		lent: make([]uint64, 0, xdpFrames/2)}
	l.rctx, l.rcancel = context.WithCancel(context.Background())
	l.hdr = ethernet.UDP4{SrcMAC: li.MAC, SrcIP: ip, DstPort: Port}
	l.maxN, l.tooLarge = XDPMaxPacket, errXDPTooLarge
	if m := li.MTU - ethernet.IPv4HdrLen - ethernet.UDPHdrLen; m < l.maxN {
		// The kernel's UDP path refuses these (EMSGSIZE, don't-fragment);
		// the device would drop them uncounted.
		l.maxN = m
		l.tooLarge = fmt.Errorf("RoCEv2 packet larger than the MTU of %s (%d) carries: %w", li.Name, li.MTU, fabric.ErrInvalid)
	}
	ok := false
	defer func() {
		if !ok {
			l.Close()
		}
	}()
	// Hold the port in the kernel.
	if l.hold, err = listenUDP(addr, bindExclusive); err != nil {
		return nil, xdpErr(addr, err)
	}
	l.ns, _ = netns.Host()
	if l.prog, err = ethernet.NewProgram(ethernet.Filter{UDPPorts: []uint16{addr.Port()}, UDPDst: ip}, 1); err != nil {
		return nil, xdpErr(addr, err)
	}
	if err = l.prog.Attach(li.Index, c.Attach); err != nil {
		return nil, xdpErr(addr, err)
	}
	if l.umem, err = xsk.NewUMEM(xsk.UMEMConfig{FrameSize: xdpFrameSize, Frames: xdpFrames,
		FillSize: xdpRingSize, CompletionSize: xdpRingSize}); err != nil {
		return nil, xdpErr(addr, err)
	}
	bind := c.Bind
	if l.prog.Mode() == ethernet.AttachGeneric && bind == xsk.ModeAuto {
		bind = xsk.ModeCopy
	}
	if l.sock, err = xsk.NewSocket(l.umem, li.Index, 0, &xsk.Config{RXSize: xdpRingSize, TXSize: xdpRingSize, Mode: bind}); err != nil {
		return nil, xdpErr(addr, err)
	}
	for i := 0; i < xdpFrames; i++ {
		if i < xdpFrames/2 {
			l.rxFree = append(l.rxFree, l.umem.FrameAddr(i))
		} else {
			l.txFree = append(l.txFree, l.umem.FrameAddr(i))
		}
	}
	l.refill()
	if err = l.prog.Register(0, l.sock.FD()); err != nil {
		return nil, xdpErr(addr, err)
	}
	ok = true
	return l, nil
}

// rxQueues returns how many receive queues li's device uses: its ethtool
// channels (real_num_rx_queues: a veth made without a queue count
// allocates one per CPU and uses one), or, where the device reports
// none, the number netlink reports (allocated).
func rxQueues(li ethernet.LinkInfo) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return li.RXQueues
	}
	defer unix.Close(fd)
	// struct ethtool_channels: cmd, max_rx, max_tx, max_other,
	// max_combined, rx_count, tx_count, other_count, combined_count.
	var ch [9]uint32
	ch[0] = unix.ETHTOOL_GCHANNELS
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], li.Name)
	ifr.data = unsafe.Pointer(&ch[0])
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return li.RXQueues
	}
	if n := int(ch[5] + ch[8]); n > 0 {
		return n
	}
	return li.RXQueues
}

func xdpErr(addr netip.AddrPort, err error) error {
	return &fabric.OpError{Op: "listen xdp", Backend: "roce", Addr: addr.String(), Err: err}
}

// interfaceOf returns the index of the interface that holds ip.
func interfaceOf(ip netip.Addr) (int, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, err
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip {
					return ifi.Index, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no interface holds %v: %w", ip, fabric.ErrInvalid)
}

// refill gives the free reception frames to the fill ring. Callers hold
// rmu (or own the link alone).
func (l *XDPLink) refill() {
	if len(l.rxFree) == 0 {
		return
	}
	fr := l.sock.Fill()
	idx, n := fr.Reserve(len(l.rxFree))
	top := len(l.rxFree)
	for i := 0; i < n; i++ {
		fr.Set(idx+uint32(i), l.rxFree[top-1-i])
	}
	if n > 0 {
		fr.Submit(n)
		l.rxFree = l.rxFree[:top-n]
		l.inFill += n
	}
}

// LocalAddr implements Link.
func (l *XDPLink) LocalAddr() netip.AddrPort { return l.local }

// Interface returns the name and index of the link's interface.
func (l *XDPLink) Interface() (name string, index int) { return l.li.Name, l.li.Index }

// MaxMTU implements MTUCapper: XDPMaxMTU.
func (l *XDPLink) MaxMTU() int { return XDPMaxMTU }

// Program returns the XDP program the link attached.
func (l *XDPLink) Program() *ethernet.Program { return l.prog }

// ZeroCopy reports whether the socket is bound in zero-copy mode.
func (l *XDPLink) ZeroCopy() bool { return l.sock.ZeroCopy() }

// Stats returns the link's counters.
func (l *XDPLink) Stats() XDPStats {
	return XDPStats{RX: l.rx.Load(), TX: l.tx.Load(), Dropped: l.dropped.Load(), NoRoute: l.noRoute.Load()}
}

// ReadBatch implements Link. It copies nothing: each packet's Buf is
// pointed at the frame in the link's memory, from its IPv4 header to
// the end of the UDP payload (Off is where the payload starts), as it
// came off the wire, and the caller's Buf is not used. Those frames are
// lent until the next ReadBatch, which returns them to the kernel, or
// Close: the caller must be done with a batch before it reads again or
// closes the link (the engine processes each batch under its poll lock,
// which Close takes). A frame the program steered to the link that is
// not a RoCEv2 datagram to it (see ParseXDPFrame) is counted in
// Stats().Dropped and returned with N -1, as a truncated datagram is,
// for the engine to count. Calls must not overlap; WriteBatch may run
// concurrently.
func (l *XDPLink) ReadBatch(pkts []Packet) (int, error) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.closed.Load() {
		return 0, os.ErrClosed
	}
	// The previous batch is done with: its frames go back to the fill
	// ring (below, with this batch's rejects).
	l.rxFree = append(l.rxFree, l.lent...)
	l.lent = l.lent[:0]
	rx := l.sock.RX()
	got := 0
	mask := ^uint64(xdpFrameSize - 1)
	for got < len(pkts) {
		idx, n := rx.Peek(len(pkts) - got)
		if n == 0 {
			break
		}
		for i := 0; i < n; i++ {
			d := rx.Desc(idx + uint32(i))
			f := l.umem.Frame(d.Addr)[:d.Len]
			p := &pkts[got]
			off, m, src, ok := parseXDPFrame(f, l.mac, l.local)
			if ok {
				end := ethernet.EthHdrLen + off + m
				p.Buf = f[ethernet.EthHdrLen:end:end]
				l.lent = append(l.lent, d.Addr&mask)
				l.rx.Add(1)
			} else {
				// Handed on with N -1, so that the engine counts it
				// (fabric.DropMalformed) as it counts what a UDP socket
				// delivers and it cannot parse.
				l.rxFree = append(l.rxFree, d.Addr&mask)
				l.dropped.Add(1)
				off, m, src = 0, -1, netip.AddrPort{}
			}
			p.Off, p.N, p.Addr, p.SrcPort = off, m, src, src.Port()
			got++
		}
		rx.Release(n)
		l.inFill -= n
	}
	l.refill()

	if got == 0 && (l.sock.Fill().NeedsWakeup() || l.sock.BusyPolling()) {
		if err := l.sock.WakeRX(); err != nil && !l.closed.Load() {
			return 0, err
		}
	}
	return got, nil
}

// ParseXDPFrame parses f, an Ethernet frame, as a RoCEv2 datagram to
// local from the interface whose MAC address is mac, copies its IPv4
// header, UDP header and payload into buf and returns the offset of the
// payload in buf, its length and the sender's address and UDP source
// port. ok is false for anything else: another EtherType or destination
// MAC, a bad IPv4 header (version, length, checksum), a fragment, not
// UDP, another destination address or port, a payload shorter than a BTH
// and ICRC, or a buf too small for the headers and payload.
func ParseXDPFrame(f []byte, mac [6]byte, local netip.AddrPort, buf []byte) (off, n int, src netip.AddrPort, ok bool) {
	off, n, src, ok = parseXDPFrame(f, mac, local)
	if !ok || off+n > len(buf) {
		return 0, 0, netip.AddrPort{}, false
	}
	copy(buf, f[ethernet.EthHdrLen:ethernet.EthHdrLen+off+n])
	return off, n, src, true
}

// parseXDPFrame is ParseXDPFrame without the copy: off and n locate the
// payload in f[ethernet.EthHdrLen:].
func parseXDPFrame(f []byte, mac [6]byte, local netip.AddrPort) (off, n int, src netip.AddrPort, ok bool) {
	var h ethernet.UDP4
	payload, ok := ethernet.ParseUDP4(f, &h)
	if !ok || [6]byte(f[0:6]) != mac || h.DstIP != local.Addr() || h.DstPort != local.Port() {
		return 0, 0, netip.AddrPort{}, false
	}
	if len(payload) < wire.BTHSize+wire.ICRCSize {
		return 0, 0, netip.AddrPort{}, false
	}
	ihl := int(f[ethernet.EthHdrLen]&0x0f) * 4
	return ihl + ethernet.UDPHdrLen, len(payload), netip.AddrPortFrom(h.SrcIP, h.SrcPort), true
}

// errXDPTooLarge is WriteBatch's error for a packet over XDPMaxPacket.
var errXDPTooLarge = fmt.Errorf("RoCEv2 packet larger than link=xdp carries (%d bytes: path MTU 2048 at most): %w", XDPMaxPacket, fabric.ErrInvalid)

// WriteBatch implements Link: it frames each packet in Ethernet, IPv4
// and UDP headers (see XDPLink) and puts it on the TX ring, kicking the
// kernel when the socket asks for it. Fewer than len(pkts) without an
// error is backpressure (no free frame or ring slot). A packet whose
// peer's MAC address is not known fails at once with an error matching
// errNoMAC, counted in Stats().NoRoute (the packets after it are not
// sent): the link resolves the address in the background meanwhile (see
// XDPConfig.ResolveTimeout), so that a peer that does not answer ARP
// stalls no writer, and the engine drops the packet, which its
// retransmission recovers once the peer is resolved. A packet larger
// than the interface's MTU (at ListenXDP) or XDPMaxPacket fails too.
func (l *XDPLink) WriteBatch(pkts []Packet) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed.Load() {
		return 0, os.ErrClosed
	}
	for i := range pkts {
		seal(&pkts[i], l.local, &l.sealHdr)
	}
	l.reap()
	tx := l.sock.TX()
	done := 0
	var err error
	for done < len(pkts) {
		want := min(len(pkts)-done, len(l.txFree))
		if want == 0 {
			l.kick()
			l.reap()
			if want = min(len(pkts)-done, len(l.txFree)); want == 0 {
				break
			}
		}
		idx, n := tx.Reserve(want)
		if n == 0 {
			break
		}
		put := 0
		for put < n {
			p := &pkts[done+put]
			mac, e := l.peerMAC(p)
			if e != nil {
				err = e
				break
			}
			if p.N > l.maxN || p.N < 0 {
				l.noRoute.Add(1)
				err = l.tooLarge
				break
			}
			a := l.txFree[len(l.txFree)-1]
			l.txFree = l.txFree[:len(l.txFree)-1]
			b := l.umem.Frame(a)
			h := l.hdr
			h.DstMAC = mac[:]
			h.DstIP = p.Addr.Addr().Unmap()
			h.DstPort = p.Addr.Port()
			if h.DstPort == 0 {
				h.DstPort = Port
			}
			h.SrcPort = p.SrcPort
			if h.SrcPort == 0 {
				h.SrcPort = l.local.Port()
			}
			ethernet.PutUDP4(b, &h, p.N)
			copy(b[ethernet.UDP4HdrLen:], p.Buf[:p.N])
			d := tx.Desc(idx + uint32(put))
			d.Addr, d.Len, d.Options = a, uint32(ethernet.UDP4HdrLen+p.N), 0
			put++
		}
		if put < n {
			tx.Cancel(n - put)
		}
		if put > 0 {
			tx.Submit(put)
			done += put
		}
		if err != nil || put < n {
			break
		}
	}
	l.tx.Add(uint64(done))
	l.kick()
	return done, err
}

// kick makes the kernel send what the TX ring holds, if it asks for it:
// in copy mode each kick sends at most the socket's TX budget, so Drain
// kicks until the kernel has taken the whole burst (or the device queue
// is full).
func (l *XDPLink) kick() {
	if l.sock.TX().Pending() > 0 && l.sock.NeedsTXKick() {
		l.sock.Drain(0)
	}
}

// reap returns completed transmission frames to the pool.
func (l *XDPLink) reap() {
	cr := l.sock.Completion()
	for {
		n := cr.Get(l.comp[:])
		l.txFree = append(l.txFree, l.comp[:n]...)
		if n < len(l.comp) {
			return
		}
	}
}

// macEntry is a neighbour: resolved (ok), being resolved in the
// background (pending; if ok too, the address is still used meanwhile),
// or failed. until is when it is looked up again.
type macEntry struct {
	mac     [6]byte
	ok      bool
	pending bool
	until   time.Time
}

// How long a resolved neighbour is used before it is looked up again
// (the kernel's table follows a peer whose address moves), and how long
// a failed resolution fails at once before the link tries again.
const (
	macTTL  = 10 * time.Second
	missTTL = time.Second
)

// peerMAC returns the MAC address of p's destination: from the cache,
// else from the kernel's neighbour table (in the link's namespace), and
// else it starts a resolution in the background and fails at once (see
// WriteBatch). Callers hold wmu.
func (l *XDPLink) peerMAC(p *Packet) ([6]byte, error) {
	ip := p.Addr.Addr().Unmap()
	now := time.Now()
	l.nmu.Lock()
	m, found := l.macs[ip]
	if found && (m.ok || m.pending || now.Before(m.until)) {
		// A resolved address past its time is used while it is looked
		// up again.
		refresh := m.ok && !m.pending && !now.Before(m.until)
		if refresh {
			l.pendingLocked(ip, m)
		}
		l.nmu.Unlock()
		if refresh {
			go l.resolve(ip)
		}
		switch {
		case m.ok:
			return m.mac, nil
		case m.pending:
			l.noRoute.Add(1)
			return [6]byte{}, fmt.Errorf("link=xdp: peer %v: %w (being resolved)", ip, errNoMAC)
		}
		l.noRoute.Add(1)
		return [6]byte{}, fmt.Errorf("link=xdp: peer %v: %w (resolution failed recently)", ip, errNoMAC)
	}
	l.nmu.Unlock()
	if !ip.Is4() || ip == l.local.Addr() {
		l.noRoute.Add(1)
		return [6]byte{}, fmt.Errorf("link=xdp reaches IPv4 peers of another address only, not %v: %w", ip, fabric.ErrInvalid)
	}
	// A first packet to the peer: the kernel's table has it, normally.
	var hw net.HardwareAddr
	err := l.inNS(func() (err error) {
		hw, err = ethernet.LookupMAC(l.li.Index, ip)
		return err
	})
	l.nmu.Lock()
	if err == nil && len(hw) == 6 {
		m := macEntry{mac: [6]byte(hw), ok: true, until: now.Add(macTTL)}
		l.macs[ip] = m
		l.nmu.Unlock()
		return m.mac, nil
	}
	l.pendingLocked(ip, macEntry{})
	l.nmu.Unlock()
	go l.resolve(ip)
	l.noRoute.Add(1)
	return [6]byte{}, fmt.Errorf("link=xdp: peer %v: %w (being resolved)", ip, errors.Join(err, errNoMAC))
}

// pendingLocked records ip's entry m as being resolved, for resolve,
// which the caller then starts. Callers hold nmu, and wmu with the link
// open, so that Close, which takes wmu after closed is set, waits for
// every resolution started.
func (l *XDPLink) pendingLocked(ip netip.Addr, m macEntry) {
	m.pending = true
	l.macs[ip] = m
	l.rwg.Add(1)
}

// resolve resolves ip's MAC address in the background (for up to
// ResolveTimeout, or until Close) and records the outcome.
func (l *XDPLink) resolve(ip netip.Addr) {
	defer l.rwg.Done()
	ctx, cancel := context.WithTimeout(l.rctx, l.cfg.ResolveTimeout)
	defer cancel()
	var hw net.HardwareAddr
	err := l.inNS(func() (err error) {
		hw, err = ethernet.ResolveMACContext(ctx, l.li.Index, ip)
		return err
	})
	now := time.Now()
	m := macEntry{until: now.Add(missTTL)}
	if err == nil && len(hw) == 6 {
		m = macEntry{mac: [6]byte(hw), ok: true, until: now.Add(macTTL)}
	}
	l.nmu.Lock()
	l.macs[ip] = m
	l.nmu.Unlock()
}

// inNS runs f in the link's network namespace.
func (l *XDPLink) inNS(f func() error) error {
	if l.ns != nil {
		return l.ns.Run(f)
	}
	return f()
}

var errNoMAC = errors.New("no MAC address")

// WaitRead implements Link: it parks the goroutine in the Go runtime's
// network poller (xsk.Socket.Poll) until the RX ring has a frame, the
// deadline passes (returning nil), ctx is done or the link is closed
// (os.ErrClosed).
func (l *XDPLink) WaitRead(ctx context.Context, deadline time.Time) error {
	if l.closed.Load() {
		return os.ErrClosed
	}
	var err error
	if ctx.Done() == nil {
		timeout := time.Duration(-1)
		if !deadline.IsZero() {
			if timeout = time.Until(deadline); timeout < 0 {
				timeout = 0
			}
		}
		_, err = l.sock.PollFor(unix.POLLIN, timeout)
	} else {
		parent := ctx
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		_, err = l.sock.Poll(ctx, unix.POLLIN)
		if err != nil && errors.Is(err, context.DeadlineExceeded) && parent.Err() == nil {
			err = nil
		}
	}
	if err != nil {
		if l.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(err, fabric.ErrClosed) {
			return os.ErrClosed
		}
		return err
	}
	return nil
}

// Close implements Link: it detaches and unloads the XDP program and
// closes the socket, its UMEM and the port's kernel socket. Blocked
// WaitReads return os.ErrClosed. It is idempotent: every call, the
// concurrent ones too, returns once all is released, with the first's
// error.
func (l *XDPLink) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.release() })
	return l.closeErr
}

// release is Close's work, done once.
func (l *XDPLink) release() error {
	l.closed.Store(true)
	var errs []error
	if l.prog != nil {
		errs = append(errs, l.prog.Close())
	}
	if l.sock != nil {
		errs = append(errs, l.sock.Close())
	}
	l.rmu.Lock()
	l.wmu.Lock()
	if l.umem != nil {
		errs = append(errs, l.umem.Close())
	}
	l.wmu.Unlock()
	l.rmu.Unlock()
	if l.hold != nil {
		errs = append(errs, l.hold.Close())
	}
	// No WriteBatch starts a resolution any more (closed is set, and wmu
	// was taken since): stop those under way before their namespace goes.
	l.rcancel()
	l.rwg.Wait()
	if l.ns != nil {
		l.ns.Close()
	}
	return errors.Join(errs...)
}
