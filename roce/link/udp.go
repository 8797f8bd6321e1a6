package link

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/internal/mmsg"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/roce/wire"
)

// Port is the RoCEv2 UDP destination port.
const Port = 4791

// MaxPacket is the largest RoCEv2 UDP payload a link carries: a
// 4096-byte MTU plus the longest headers (BTH, RETH, ImmDt) and the ICRC,
// rounded up.
const MaxPacket = 4096 + 128

// Packet is one datagram on a Link: the UDP payload, starting at the BTH.
type Packet struct {
	// Buf holds the datagram: on read it is the space to fill (its length
	// is the capacity), on write Buf[:N] is sent.
	Buf []byte
	// Off is, on read, where the UDP payload starts in Buf. When it is not
	// zero, Buf[:Off] holds the IP and UDP headers exactly as they came
	// off the wire (the ICRC covers them). Writes ignore it.
	Off int
	// N is the UDP payload length (set by ReadBatch; -1 if it was
	// truncated).
	N int
	// Addr is the peer's address: the source on read, the destination on
	// write (whose port is normally Port).
	Addr netip.AddrPort
	// SrcPort is, on write, the UDP source port to send from (0: the
	// link's own port); on read, the source port the peer used.
	SrcPort uint16
	// Shm asks an AutoLink to write the datagram through the shared-memory
	// ring of its destination, an engine of this host, rather than UDP.
	// Other links ignore it; reads leave it false.
	Shm bool
	// Unsealed says, on write, that the datagram's ICRC is not filled
	// in: its sender (an engine) left it out because the datagram goes
	// into the shared-memory ring of a Weft engine of this host, which
	// nothing between the two ends can alter (see ShmLink, "The ICRC on
	// a ring"). A ShmLink carries it so only to a ring whose owner reads
	// such datagrams and none of whose slots a stalled producer may
	// still write; to any other ring, and on every other carrier (an
	// AutoLink's UDP side), the link fills the ICRC in itself, so that
	// nothing unsealed ever leaves the host or reaches an older reader.
	// On read, a ShmLink sets it for a datagram that came so: its ICRC is
	// not to be checked. Every other link leaves it false.
	Unsealed bool
}

// Link carries RoCEv2 datagrams. It is the engine's only contact with the
// network, so the engine runs over UDP sockets (any host, loopback,
// namespaces) or over AF_XDP (ethernet package) alike. ReadBatch and
// WriteBatch never block; WaitRead does.
type Link interface {
	// ReadBatch reads up to len(pkts) datagrams into pkts[:n] and leaves
	// pkts[n:] as they were (the engine resets only the packets a read
	// returned); 0 means none queued.
	ReadBatch(pkts []Packet) (int, error)
	// WriteBatch writes pkts[i].Buf[:pkts[i].N] to pkts[i].Addr and
	// returns how many were taken; fewer than len(pkts) is backpressure.
	WriteBatch(pkts []Packet) (int, error)
	// WaitRead blocks until a datagram may be readable, the deadline
	// passes (zero: none), ctx is done or the link is closed.
	WaitRead(ctx context.Context, deadline time.Time) error
	// LocalAddr returns the local address (IP and port) datagrams arrive
	// at.
	LocalAddr() netip.AddrPort
	// Close closes the link; blocked WaitReads return os.ErrClosed.
	Close() error
}

// Lender is implemented by a Link whose ReadBatch lends its own memory
// (a ShmLink's ring slots, through AutoLink too): ReturnLent gives what
// the last ReadBatch lent back at once, rather than at the next
// ReadBatch. The engine calls it once it is done with a batch, before it
// acknowledges the batch's packets: a sender whose window that
// acknowledgement opens then finds their slots free. With a window as
// large as the ring (the lossless window) a batch still lent would meet
// it with a full ring, and the sender, after its tries, would drop
// packets and resend a window. The packets' Bufs must not be used after
// it.
type Lender interface {
	ReturnLent()
}

// MTUCapper is implemented by a Link that carries the packets of a
// limited path MTU only: XDPLink (XDPMaxMTU, its UMEM chunks hold no
// larger). An engine reads the cap once, when it starts (MaxMTU), and
// refuses to connect a queue pair to a larger path MTU with an error
// matching fabric.ErrInvalid. A Link that wraps another forwards its cap
// (LossyLink does).
type MTUCapper interface {
	// MaxMTU returns the largest path MTU (256, 512, 1024, 2048 or 4096)
	// whose packets the link carries; 0 means no cap (4096, the largest
	// RoCE path MTU, fits, as over UDP).
	MaxMTU() int
}

// MaxMTU returns the path MTU cap of l (see MTUCapper): 0, no cap, for a
// link that has none.
func MaxMTU(l Link) int {
	if c, ok := l.(MTUCapper); ok {
		return c.MaxMTU()
	}
	return 0
}

// UDPLink is a Link over kernel UDP sockets, batched with recvmmsg and
// sendmmsg. It binds the local address and port 4791, and sends each
// datagram from the UDP source port the engine chose for its queue pair
// (the Linux convention), through one small send-only socket per source
// port. The sockets set don't-fragment, so the kernel sends IPv4
// identification 0, which the ICRC covers.
//
// The ICRC also covers the IPv4 identification of received packets,
// which a UDP socket does not show and Linux rxe randomises. So, for
// IPv4 and where the process may (CAP_NET_RAW), the link receives through
// a raw socket with a BPF filter for its address and port, and hands the
// engine the real headers; the UDP socket then only holds the port.
// Without the privilege it receives on the UDP socket and the engine
// rebuilds the headers assuming identification 0 (Raw reports which);
// UDPConfig.NoRaw (the address parameter raw=0) chooses that too, for
// Weft-only fabrics, where it saves the kernel a second delivery per
// packet. No environment variable overrides the configuration.
type UDPLink struct {
	conn  *net.UDPConn
	rc    syscall.RawConn
	fd    int
	raw   *os.File // raw IPv4 receive socket, or nil
	rawFD int
	local netip.AddrPort
	rb    *mmsg.Batch
	wb    *mmsg.Batch
	rmsgs []mmsg.Message
	wmsgs []mmsg.Message
	wmu   sync.Mutex // WriteBatch
	rawRC syscall.RawConn

	// WaitRead's callback, made once so waiting does not allocate.
	waitFirst bool
	waitFn    func(uintptr) bool

	mu      sync.Mutex // send sockets
	senders map[uint16]*sender
	// ns is the network namespace the link was made in, where its send
	// sockets are made too, whichever thread sends first (nil if it
	// could not be opened: then in the sending thread's).
	ns *netns.NS

	// UDP GSO and GRO (UDPConfig.GSO).
	gso    bool
	groups []mmsg.Group
	segs   [][]byte
	ids    wire.IPv4IDs // the ICRC changes of GSO segment numbers (wmu)
	// sealHdr is WriteBatch's scratch for a datagram sent unsealed
	// (Packet.Unsealed), which UDP never carries so (wmu).
	sealHdr sealHdr
	gro     groState
	// Datagrams sent in, and received in, messages of several.
	gsoSegs, groSegs atomic.Uint64

	steer *steering // the port's steering, if the link shares it
	block uint32    // the QPN block the link receives (0: all)
	own   *QPNBlock // the block the link claimed itself, released with it
}

type sender struct {
	conn *net.UDPConn
	fd   int
}

// UDPConfig configures a UDPLink. The zero value is the default.
type UDPConfig struct {
	// NoRaw receives on the UDP socket even where a raw socket could be
	// opened. The engine then rebuilds the IPv4 headers for the ICRC with
	// identification 0, which is what Weft and NICs that follow the
	// don't-fragment convention send; Linux rxe randomises it, so keep
	// the raw socket for rxe peers. It saves the kernel a second delivery
	// of every packet (about 30% of the receive cost on loopback).
	NoRaw bool
	// QPNBlock, if not zero, is the block of QPNs the link's engine owns
	// (see QPNBlockBits). The link then shares its address and port with
	// the links of other processes, each packet steered to the owner of
	// its destination QP; without the privileges for that it binds the
	// port alone, and fails with a *SharedPortError if another process
	// holds it. Zero: the link claims a block of its own, which an
	// engine built on it (or on a link that wraps it, such as LossyLink)
	// numbers its QPs from, so that links made for tests share the port
	// with the engines of other processes too.
	QPNBlock uint32
	// GSO sends runs of equal-size datagrams to one peer in one message
	// each (UDP_SEGMENT), and receives such runs whole (UDP_GRO); it
	// implies NoRaw. On loopback and between namespaces the kernel then
	// moves one packet where it moved up to 64: the kernel path of a
	// packet, not the system call, is what a datagram costs there.
	//
	// The kernel numbers the IPv4 identifications of a GSO send's
	// datagrams 0, 1, 2, ... (a single unconnected don't-fragment
	// datagram carries 0), and the ICRC covers the identification: the
	// link fixes each datagram's ICRC up for its number
	// (wire.ICRCWithIPv4ID), so that the packets are exact wherever the
	// kernel or a NIC cuts them apart. A receiver that gets them whole
	// must know the numbering, and one that gets them cut apart without
	// their IP headers must find it: a Weft engine without the raw
	// socket (GSO or NoRaw) accepts the identifications 0 to 63, one
	// with the raw socket (the default) gets the super-packet whole on
	// loopback and veth and cannot split it, and neither can a GRO
	// receiver of another stack. So a peer reached without a cut on the
	// way (loopback, veth) must run with GSO (or NoRaw) too; a Linux rxe
	// peer, which receives through its kernel's UDP tunnel socket, gets
	// the datagrams cut apart with those numbers, as on a wire.
	GSO bool
}

// groBatch is the number of messages a GSO link reads per system call,
// and groBuf the size of each: a GRO message holds up to 64 datagrams.
const (
	groBatch = 8
	groBuf   = 65536 + 512
)

// groState holds the messages of the last receive of a GSO link until
// ReadBatch has handed out all their datagrams.
type groState struct {
	bufs [][]byte
	msgs []mmsg.Message
	n, i int // messages read, the next one
	off  int // where its next datagram starts
}

// ListenUDP opens a UDPLink on addr (port 0 means Port) with the default
// configuration.
func ListenUDP(addr netip.AddrPort) (*UDPLink, error) {
	return ListenUDPConfig(addr, UDPConfig{})
}

// ListenUDPConfig opens a UDPLink on addr (port 0 means Port).
func ListenUDPConfig(addr netip.AddrPort, c UDPConfig) (*UDPLink, error) {
	if addr.Port() == 0 {
		addr = netip.AddrPortFrom(addr.Addr(), Port)
	}
	var conn *net.UDPConn
	var st *steering
	var err error
	var own *QPNBlock
	if c.QPNBlock == 0 {
		if own, err = ClaimQPNBlock(); err != nil {
			return nil, err
		}
		c.QPNBlock = own.n
	}
	if c.QPNBlock != 0 {
		conn, st, err = joinSteering(addr, c.QPNBlock)
		if err != nil && privilegeError(err) {
			why := err
			conn, err = listenUDP(addr, bindExclusive)
			if errors.Is(err, unix.EADDRINUSE) {
				own.Release()
				return nil, &SharedPortError{Addr: addr, Err: why}
			}
		} else if errors.Is(err, unix.EADDRINUSE) {
			own.Release()
			return nil, &SharedPortError{Addr: addr, Err: err}
		}
	} else {
		conn, err = listen(addr)
	}
	if err != nil {
		own.Release()
		return nil, err
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		st.close()
		own.Release()
		return nil, err
	}
	l := &UDPLink{conn: conn, rc: rc, local: addr, steer: st, block: c.QPNBlock, own: own, rb: mmsg.NewBatch(64), wb: mmsg.NewBatch(64),
		rmsgs: make([]mmsg.Message, 64), wmsgs: make([]mmsg.Message, 64), senders: map[uint16]*sender{}}
	rc.Control(func(fd uintptr) { l.fd = int(fd) })
	l.ns, _ = netns.Host()
	l.waitFn = func(uintptr) bool {
		if l.waitFirst {
			l.waitFirst = false
			return false // wait for readiness
		}
		return true
	}
	// Big socket buffers: the engine moves bursts (a 256 KiB RDMA READ is
	// 256 response packets at once). Root may exceed net.core.rmem_max.
	setBuffers(l.fd, 16<<20)
	if c.GSO {
		if err := unix.SetsockoptInt(l.fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1); err != nil {
			l.Close()
			return nil, fmt.Errorf("UDP GRO: %w", err)
		}
		l.gso, c.NoRaw = true, true
		l.groups, l.segs = make([]mmsg.Group, 64), make([][]byte, 64)
		l.gro.bufs, l.gro.msgs = make([][]byte, groBatch), make([]mmsg.Message, groBatch)
		for i := range l.gro.bufs {
			l.gro.bufs[i] = make([]byte, groBuf)
		}
	}
	if addr.Addr().Is4() && !addr.Addr().IsUnspecified() && !c.NoRaw {
		l.openRaw()
	}
	return l, nil
}

// openRaw switches reception to a raw IPv4 socket if the process may open
// one.
func (l *UDPLink) openRaw() {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return // EPERM without CAP_NET_RAW: stay on the UDP socket
	}
	ip := l.local.Addr().As4()
	dst := uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3])
	// Accept unfragmented UDP datagrams to our address and port.
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 6},               // fragment field
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 6, K: 0x3fff}, // MF or offset: drop
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16},              // destination address
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: 4, K: dst},     // not ours: drop
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0},              // X = IP header length
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},               // UDP destination port
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: 1, K: uint32(l.local.Port())},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0x40000},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if l.block != 0 {
		// Every raw socket sees every packet to the port: keep those
		// whose destination QP is in our block (UDP payload bytes 4-7),
		// and those to QP 1 (block 0), connection management, which
		// rdma_cm supports for one engine per address.
		accept := prog[len(prog)-2]
		prog = append(prog[:len(prog)-2:len(prog)-2],
			unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_IND, K: 8 + 4},
			unix.SockFilter{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xffffff},
			unix.SockFilter{Code: unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K, K: QPNBlockBits},
			unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, K: 0},
			unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: 1, K: l.block},
			accept,
			unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: 0})
		// The jumps to the drop at the end now land in the block test:
		// point them at the new drop, five instructions further.
		for i := range prog[:7] {
			if prog[i].Code&0x07 == unix.BPF_JMP && prog[i].Jf > 0 {
				prog[i].Jf += 5
			}
		}
		prog[1].Jt += 5 // the fragment test jumps to the drop on true
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp); err != nil {
		unix.Close(fd)
		return
	}
	// A raw socket queues every UDP datagram from its creation until the
	// filter is attached: with the port shared, some are for other
	// processes' QPs, which the engine would count as for no QP of its
	// own. Drop them (one of ours among them is resent as if lost).
	drainSocket(fd)
	setBuffers(fd, 16<<20)
	// The UDP socket now only holds the port: let it queue nothing.
	drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	dfp := unix.SockFprog{Len: 1, Filter: &drop[0]}
	if err := unix.SetsockoptSockFprog(l.fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &dfp); err != nil {
		unix.Close(fd)
		return
	}
	l.raw = os.NewFile(uintptr(fd), "roce-raw")
	l.rawFD = fd
	if rc, err := l.raw.SyscallConn(); err == nil {
		l.rawRC = rc
	}
	// Drain what the UDP socket queued before its filter.
	drainSocket(l.fd)
}

// drainSocket reads and drops every datagram queued on socket fd.
func drainSocket(fd int) {
	var buf [64]byte
	for {
		if _, _, err := unix.Recvfrom(fd, buf[:], unix.MSG_DONTWAIT|unix.MSG_TRUNC); err != nil {
			return
		}
	}
}

// setBuffers asks for n-byte socket buffers, beyond the sysctl limits if
// the process may (SO_RCVBUFFORCE needs CAP_NET_ADMIN).
func setBuffers(fd, n int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
	}
}

// Raw reports whether the link receives through a raw socket, with the
// real IP headers.
func (l *UDPLink) Raw() bool { return l.raw != nil }

// Shared reports whether the link shares its address and port with the
// links of other processes, steered by QPN.
func (l *UDPLink) Shared() bool { return l.steer != nil }

// Segments returns how many datagrams the link sent inside UDP GSO
// messages and received inside GRO messages (UDPConfig.GSO).
func (l *UDPLink) Segments() (gso, gro uint64) { return l.gsoSegs.Load(), l.groSegs.Load() }

// ReceiveFD is the descriptor packets arrive on (the raw socket's when
// the link has one), for diagnostics: a test that hangs peeks at it.
func (l *UDPLink) ReceiveFD() int {
	if l.raw != nil {
		return l.rawFD
	}
	return l.fd
}

func listen(addr netip.AddrPort) (*net.UDPConn, error) { return listenUDP(addr, bindReuseAddr) }

// How a UDP socket binds its address.
const (
	bindReuseAddr = iota // SO_REUSEADDR (send sockets, links that own no QPN block)
	bindShared           // SO_REUSEADDR and SO_REUSEPORT: a steered group
	bindExclusive        // alone
)

func listenUDP(addr netip.AddrPort, mode int) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) {
			if mode != bindExclusive {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}
			if mode == bindShared && serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
			if addr.Addr().Is4() {
				unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			} else {
				unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			}
		})
		return serr
	}}
	network := "udp4"
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		network = "udp6"
	}
	pc, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// LocalAddr implements Link.
func (l *UDPLink) LocalAddr() netip.AddrPort { return l.local }

// ReadBatch implements Link. Calls must not overlap (the engine reads from
// one poller at a time); WriteBatch may be called concurrently.
func (l *UDPLink) ReadBatch(pkts []Packet) (int, error) {
	if l.gso {
		return l.readGRO(pkts)
	}
	n := min(len(pkts), len(l.rmsgs))
	for i := 0; i < n; i++ {
		l.rmsgs[i].Buf = pkts[i].Buf
	}
	fd := l.fd
	if l.raw != nil {
		fd = l.rawFD
	}
	got, err := l.rb.Recv(fd, l.rmsgs[:n])
	for i := 0; i < got; i++ {
		p := &pkts[i]
		p.N, p.Off = l.rmsgs[i].N, 0
		p.Addr = l.rmsgs[i].Addr
		p.SrcPort = l.rmsgs[i].Addr.Port()
		l.rmsgs[i].Buf = nil
		if l.raw != nil && p.N >= 0 {
			// IP header, UDP header, payload: the filter vouched for
			// the first two; check the lengths.
			b := p.Buf[:p.N]
			if len(b) < 28 || b[0]>>4 != 4 {
				p.N = -1
				continue
			}
			hl := int(b[0]&0x0f) * 4
			if hl < 20 || len(b) < hl+8 {
				p.N = -1
				continue
			}
			ulen := int(b[hl+4])<<8 | int(b[hl+5])
			if ulen < 8 || hl+ulen > len(b) {
				p.N = -1
				continue
			}
			p.SrcPort = uint16(b[hl])<<8 | uint16(b[hl+1])
			p.Addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[12:16])), p.SrcPort)
			p.Off, p.N = hl+8, ulen-8
		}
	}
	if err != nil {
		return got, &os.SyscallError{Syscall: "recvmmsg", Err: err}
	}
	return got, nil
}

// readGRO is ReadBatch of a GSO link: each message may hold several
// datagrams, which it hands out one by one, pointing into the link's own
// buffers (valid until the next call).
func (l *UDPLink) readGRO(pkts []Packet) (int, error) {
	g := &l.gro
	out := 0
	for out < len(pkts) {
		if g.i >= g.n {
			if out > 0 {
				break
			}
			for i := range g.msgs {
				g.msgs[i].Buf = g.bufs[i]
			}
			got, err := l.rb.RecvSegments(l.fd, g.msgs)
			if err != nil {
				return 0, &os.SyscallError{Syscall: "recvmmsg", Err: err}
			}
			if got == 0 {
				return 0, nil
			}
			g.n, g.i, g.off = got, 0, 0
			for _, m := range g.msgs[:got] {
				if m.Seg > 0 && m.N > m.Seg {
					l.groSegs.Add(uint64((m.N + m.Seg - 1) / m.Seg))
				}
			}
		}
		m := &g.msgs[g.i]
		p := &pkts[out]
		out++
		if m.N <= 0 {
			p.N, p.Off = -1, 0
			g.i++
			continue
		}
		size := m.N - g.off
		if m.Seg > 0 {
			size = min(size, m.Seg)
		}
		*p = Packet{Buf: g.bufs[g.i][g.off : g.off+size], N: size, Addr: m.Addr, SrcPort: m.Addr.Port()}
		g.off += size
		if g.off >= m.N {
			g.i, g.off = g.i+1, 0
		}
	}
	return out, nil
}

// WriteBatch implements Link. Runs of datagrams with the same source port
// go out in one sendmmsg; with GSO, runs of equal size to one peer among
// them in one message each (which changes the ICRCs in their buffers
// while they are sent, see UDPConfig.GSO).
func (l *UDPLink) WriteBatch(pkts []Packet) (int, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for i := range pkts {
		seal(&pkts[i], l.local, &l.sealHdr)
	}
	done := 0
	for done < len(pkts) {
		port := pkts[done].SrcPort
		end := done + 1
		for end < len(pkts) && end-done < len(l.wmsgs) && pkts[end].SrcPort == port {
			end++
		}
		fd := l.fd
		if port != 0 && port != l.local.Port() {
			// Not from the link's own port instead: the ICRC covers the
			// source port, so the peer would drop every datagram.
			s, err := l.sender(port)
			if err != nil {
				return done, err
			}
			fd = s.fd
		}
		if l.gso {
			count := end - done
			n, err := l.writeGSO(fd, pkts[done:end])
			done += n
			if err != nil {
				return done, &os.SyscallError{Syscall: "sendmmsg", Err: err}
			}
			if n < count {
				return done, nil // socket buffer full
			}
			continue
		}
		for i := done; i < end; i++ {
			l.wmsgs[i-done] = mmsg.Message{Buf: pkts[i].Buf, N: pkts[i].N, Addr: pkts[i].Addr}
		}
		count := end - done
		n, err := l.wb.Send(fd, l.wmsgs[:count])
		for i := 0; i < count; i++ {
			l.wmsgs[i].Buf = nil
		}
		done += n
		if err != nil {
			return done, &os.SyscallError{Syscall: "sendmmsg", Err: err}
		}
		if n < count {
			return done, nil // socket buffer full
		}
	}
	return done, nil
}

// writeGSO sends pkts (at most 64, one source port) on fd in groups of
// equal size to one peer, and returns how many the kernel took.
func (l *UDPLink) writeGSO(fd int, pkts []Packet) (int, error) {
	ng := 0
	for k := 0; k < len(pkts); {
		start, size, total := k, pkts[k].N, pkts[k].N
		for k++; k < len(pkts) && k-start < mmsg.MaxSegments && pkts[k].Addr == pkts[start].Addr &&
			pkts[k].N <= size && total+pkts[k].N <= mmsg.MaxSegmented; k++ {
			total += pkts[k].N
			if pkts[k].N < size {
				k++ // a shorter datagram ends a group
				break
			}
		}
		for i := start; i < k; i++ {
			l.segs[i] = pkts[i].Buf[:pkts[i].N]
		}
		l.groups[ng] = mmsg.Group{Segs: l.segs[start:k], Addr: pkts[start].Addr}
		l.fixICRCs(&l.groups[ng])
		ng++
	}
	n, err := l.wb.SendSegments(fd, l.groups[:ng])
	taken := 0
	for i := range l.groups[:ng] {
		if i < n {
			taken += len(l.groups[i].Segs)
			if k := len(l.groups[i].Segs); k > 1 {
				l.gsoSegs.Add(uint64(k))
			}
		} else {
			l.fixICRCs(&l.groups[i]) // back to identification 0 for a retry
		}
		l.groups[i] = mmsg.Group{}
	}
	clear(l.segs)
	return taken, err
}

// fixICRCs toggles the ICRCs of an IPv4 group's datagrams between
// identification 0 and the numbers the kernel gives GSO segments (see
// UDPConfig.GSO).
func (l *UDPLink) fixICRCs(g *mmsg.Group) {
	if len(g.Segs) < 2 || !g.Addr.Addr().Unmap().Is4() {
		return
	}
	for i, s := range g.Segs[1:] {
		if len(s) < wire.BTHSize+wire.ICRCSize {
			continue
		}
		c := s[len(s)-wire.ICRCSize:]
		binary.LittleEndian.PutUint32(c, binary.LittleEndian.Uint32(c)^l.ids.Delta(8+len(s), uint16(i+1)))
	}
}

// sender returns the send socket for a source port, opening it on first
// use. A port it cannot bind (another program has it) stays unusable:
// WriteBatch fails the datagrams from it rather than sending them from
// another port, which the peer would drop for their ICRC.
func (l *UDPLink) sender(port uint16) (*sender, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.senders[port]; ok {
		if s == nil {
			return nil, errNoSender
		}
		return s, nil
	}
	// In the link's namespace: an engine made by a thread that had
	// entered a namespace (setns) is driven by any thread afterwards,
	// and a send socket made in another namespace would send from
	// the wrong address, or not at all.
	var conn *net.UDPConn
	mk := func() (err error) {
		conn, err = listen(netip.AddrPortFrom(l.local.Addr(), port))
		return err
	}
	var err error
	if l.ns != nil {
		err = l.ns.Run(mk)
	} else {
		err = mk()
	}
	if err != nil {
		l.senders[port] = nil
		return nil, fmt.Errorf("%w: %d: %w", errNoSender, port, err)
	}
	s := &sender{conn: conn}
	if rc, err := conn.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { s.fd = int(fd) })
	}
	setBuffers(s.fd, 4<<20)
	l.senders[port] = s
	return s, nil
}

var errNoSender = errors.New("UDP source port unavailable")

// WaitRead implements Link, through the Go runtime's network poller. One
// goroutine at a time may wait (the engine's background poller).
func (l *UDPLink) WaitRead(ctx context.Context, deadline time.Time) error {
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	l.conn.SetReadDeadline(deadline)
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			l.conn.SetReadDeadline(time.Unix(1, 0))
			if l.raw != nil {
				l.raw.SetReadDeadline(time.Unix(1, 0))
			}
		})
		defer stop()
	}
	rc := l.rc
	if l.raw != nil {
		rc = l.rawRC
		l.raw.SetReadDeadline(deadline)
	}
	l.waitFirst = true
	err := rc.Read(l.waitFn)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if e := ctx.Err(); e != nil {
				return e
			}
			return nil
		}
		if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
			return os.ErrClosed
		}
		return err
	}
	return nil
}

// Close implements Link.
func (l *UDPLink) Close() error {
	l.mu.Lock()
	for _, s := range l.senders {
		if s != nil {
			s.conn.Close()
		}
	}
	l.senders = map[uint16]*sender{}
	if l.ns != nil {
		l.ns.Close()
	}
	l.mu.Unlock()
	if l.raw != nil {
		l.raw.Close()
	}
	err := l.conn.Close()
	l.steer.close()
	l.own.Release()
	return err
}

// QPNBlock returns the block of QPNs whose packets the link receives.
func (l *UDPLink) QPNBlock() uint32 { return l.block }

// QPNBlock returns the block of the link it wraps, if that has one.
func (l *LossyLink) QPNBlock() uint32 {
	if b, ok := l.Link.(interface{ QPNBlock() uint32 }); ok {
		return b.QPNBlock()
	}
	return 0
}

// MaxMTU returns the path MTU cap of the link it wraps (see MTUCapper).
func (l *LossyLink) MaxMTU() int { return MaxMTU(l.Link) }

// LossConfig sets the fault rates of a LossyLink, each a probability per
// datagram in [0, 1].
type LossConfig struct {
	Drop, Reorder, Duplicate, Corrupt float64
	// Seed makes the faults reproducible (0: random).
	Seed uint64
}

// LossyLink wraps a Link and injects faults into the datagrams it writes:
// drops, reordering (a datagram is held back and sent after the next one
// of the same batch; the last of a batch goes out at the next write or
// after a millisecond), duplicates and corruption (one byte flipped,
// which the ICRC catches). This kernel has no netem; tests use this
// instead.
type LossyLink struct {
	Link
	cfg   LossConfig
	mu    sync.Mutex
	rng   *rand.Rand
	held  []byte
	hpkt  Packet
	has   bool
	out   []Packet
	bufs  [][]byte
	timer *time.Timer
	n     LossFaults // under mu
}

// LossFaults counts the faults a LossyLink injected.
type LossFaults struct {
	Dropped, Reordered, Duplicated, Corrupted uint64
}

// Faults returns the faults injected so far. It is safe to call while
// the link is in use (an engine's poller may still be sending).
func (l *LossyLink) Faults() LossFaults {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// NewLossyLink wraps l.
func NewLossyLink(l Link, cfg LossConfig) *LossyLink {
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &LossyLink{Link: l, cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// WriteBatch implements Link with faults. It reports every datagram as
// taken: a dropped one is lost on the wire, as on a real network. It
// retries a write the link it wraps pushes back on, but not for ever:
// what that link still takes none of after lossyMaxIdle tries is lost
// too.
func (l *LossyLink) WriteBatch(pkts []Packet) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.out = l.out[:0]
	nb := 0
	buf := func(src []byte) []byte {
		if nb == len(l.bufs) {
			l.bufs = append(l.bufs, make([]byte, 0, 9000))
		}
		b := append(l.bufs[nb][:0], src...)
		l.bufs[nb] = b
		nb++
		return b
	}
	for i := range pkts {
		p := pkts[i]
		data := p.Buf[:p.N]
		r := l.rng.Float64()
		switch {
		case r < l.cfg.Drop:
			l.n.Dropped++
			continue
		case r < l.cfg.Drop+l.cfg.Corrupt:
			l.n.Corrupted++
			data = buf(data)
			data[l.rng.IntN(len(data))] ^= byte(1 + l.rng.IntN(255))
		case r < l.cfg.Drop+l.cfg.Corrupt+l.cfg.Duplicate:
			l.n.Duplicated++
			l.out = append(l.out, Packet{Buf: buf(data), N: len(data), Addr: p.Addr, SrcPort: p.SrcPort})
		case r < l.cfg.Drop+l.cfg.Corrupt+l.cfg.Duplicate+l.cfg.Reorder && !l.has:
			l.n.Reordered++
			l.held = append(l.held[:0], data...)
			l.hpkt = Packet{N: len(data), Addr: p.Addr, SrcPort: p.SrcPort}
			l.has = true
			continue
		}
		l.out = append(l.out, Packet{Buf: data, N: len(data), Addr: p.Addr, SrcPort: p.SrcPort})
		if l.has {
			l.hpkt.Buf = l.held
			l.out = append(l.out, l.hpkt)
			l.has = false
		}
	}
	if l.has && l.timer == nil {
		l.timer = time.AfterFunc(time.Millisecond, l.release)
	} else if l.has {
		l.timer.Reset(time.Millisecond)
	}
	for sent, idle := 0, 0; sent < len(l.out); {
		n, err := l.Link.WriteBatch(l.out[sent:])
		if err != nil {
			return len(pkts), err
		}
		if n == 0 {
			// Backpressure: wait for room, but not for ever. A link that
			// takes nothing (a ring that no longer drains) loses the
			// rest, as the engine's send drops what it cannot place:
			// retrying until the link failed held the engine's poll lock,
			// which Engine.Close takes before it closes the link.
			if idle++; idle > lossyMaxIdle {
				break
			}
			time.Sleep(10 * time.Microsecond)
			continue
		}
		idle = 0
		sent += n
	}
	return len(pkts), nil
}

// lossyMaxIdle is how many writes in a row that take nothing a
// LossyLink's WriteBatch retries before it gives the rest up as lost.
const lossyMaxIdle = 100

// release sends a datagram that was held back for reordering and found
// no successor.
func (l *LossyLink) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.has {
		return
	}
	l.has = false
	l.hpkt.Buf = l.held
	l.Link.WriteBatch([]Packet{l.hpkt})
}

// String describes the configured faults.
func (c LossConfig) String() string {
	return fmt.Sprintf("drop %.1f%% reorder %.1f%% duplicate %.1f%% corrupt %.1f%%",
		100*c.Drop, 100*c.Reorder, 100*c.Duplicate, 100*c.Corrupt)
}
