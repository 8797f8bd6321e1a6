package ethernet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/weft-io/weft/fabric"
	"golang.org/x/sys/unix"
)

// Filter selects the frames that the XDP program steers to the AF_XDP
// sockets. A frame matches if All is set, or its EtherType is in
// EtherTypes, or it is an unfragmented (or first-fragment) UDP datagram
// over IPv4 (any IHL) or IPv6 (no extension headers) whose destination
// port is in UDPPorts. Every other frame goes on to the kernel stack
// (XDP_PASS), so the host keeps its ARP, ICMP and sockets. The zero
// Filter matches nothing.
type Filter struct {
	// All steers every frame (the host stack sees none on this
	// interface's bound queues).
	All bool
	// EtherTypes are EtherType values in host order, such as
	// EtherTypeWeft (0x88B5).
	EtherTypes []uint16
	// UDPPorts are UDP destination ports in host order.
	UDPPorts []uint16
	// UDPDst, if valid (an IPv4 address), narrows UDPPorts to IPv4
	// datagrams to that address: those to the interface's other
	// addresses, and every IPv6 one, go on to the kernel, whose sockets
	// there (another process's, Linux rxe's) keep them.
	UDPDst netip.Addr
}

// maxFilterValues bounds each filter list; the program compares values
// one by one.
const maxFilterValues = 64

// String describes the filter, such as "ethertype=0x88b5,udp=4789".
func (f Filter) String() string {
	if f.All {
		return "all"
	}
	s := ""
	for _, e := range f.EtherTypes {
		s += fmt.Sprintf("ethertype=%#04x,", e)
	}
	for _, p := range f.UDPPorts {
		s += fmt.Sprintf("udp=%d,", p)
	}
	if f.UDPDst.IsValid() {
		s += fmt.Sprintf("dst=%v,", f.UDPDst)
	}
	if s == "" {
		return "none"
	}
	return s[:len(s)-1]
}

// AttachMode selects how the XDP program is attached.
type AttachMode uint8

// Attach modes.
const (
	// AttachAuto tries native (driver) mode, then generic (skb) mode.
	AttachAuto AttachMode = iota
	// AttachNative attaches in the driver (XDP_FLAGS_DRV_MODE).
	AttachNative
	// AttachGeneric attaches in the generic skb path
	// (XDP_FLAGS_SKB_MODE); works on every device, slower, copy mode
	// only.
	AttachGeneric
)

// String returns "auto", "native" or "generic".
func (m AttachMode) String() string {
	switch m {
	case AttachNative:
		return "native"
	case AttachGeneric:
		return "generic"
	}
	return "auto"
}

// ErrXDPInUse reports an interface that already has an XDP program
// Weft did not attach (Weft never replaces or detaches such a program),
// or, for Weft's own program shared by the Ports of this process, a
// different filter or a queue that already has a socket.
var ErrXDPInUse = errors.New("interface already has an XDP program")

// htons16 returns v as the little-endian 16-bit load of its big-endian
// wire form (what a 16-bit load from the packet yields on little-endian
// hosts).
func wire16(v uint16) int32 {
	if nativeLittle {
		return int32(bits.ReverseBytes16(v))
	}
	return int32(v)
}

// Instructions returns the XDP program for f, redirecting matches to
// the XSKMAP at index rx_queue_index, written in cilium/ebpf's asm so it
// builds without clang. xsks is the map's file descriptor.
func (f Filter) Instructions(xsks int) (asm.Instructions, error) {
	return f.instructions(xsks, -1)
}

// instructions builds the program; a verdict >= 0 replaces the redirect
// with that return value (for tests, which run the program with
// BPF_PROG_TEST_RUN and no socket).
func (f Filter) instructions(xsks int, verdict int32) (asm.Instructions, error) {
	if len(f.EtherTypes) > maxFilterValues || len(f.UDPPorts) > maxFilterValues {
		return nil, fmt.Errorf("filter with more than %d values: %w", maxFilterValues, fabric.ErrInvalid)
	}
	if f.UDPDst.IsValid() && !f.UDPDst.Unmap().Is4() {
		return nil, fmt.Errorf("filter destination %v: need an IPv4 address: %w", f.UDPDst, fabric.ErrInvalid)
	}
	const (
		lblPass     = "pass"
		lblRedirect = "redirect"
		lblIPv6     = "ipv6"
		lblPorts    = "ports"
	)
	if !f.All && len(f.EtherTypes) == 0 && len(f.UDPPorts) == 0 {
		// Matches nothing: pass everything.
		return asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}, nil
	}
	// R6 = ctx, R2 = data, R3 = data_end.
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
	}
	if !f.All {
		ins = append(ins,
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 14),
			asm.JGT.Reg(asm.R4, asm.R3, lblPass),
			asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		)
		for _, e := range f.EtherTypes {
			ins = append(ins, asm.JEq.Imm(asm.R5, wire16(e), lblRedirect))
		}
		if len(f.UDPPorts) > 0 {
			fragMask := int32(0xff1f)
			if !nativeLittle {
				fragMask = 0x1fff
			}
			v6 := lblIPv6
			if f.UDPDst.IsValid() {
				v6 = lblPass // IPv4 to one address only
			}
			ins = append(ins,
				asm.JEq.Imm(asm.R5, wire16(unix.ETH_P_IPV6), v6),
				asm.JNE.Imm(asm.R5, wire16(unix.ETH_P_IP), lblPass),
				// IPv4: fixed header in bounds, protocol UDP, no
				// fragment offset, then the UDP header after IHL words.
				asm.Mov.Reg(asm.R4, asm.R2),
				asm.Add.Imm(asm.R4, 34),
				asm.JGT.Reg(asm.R4, asm.R3, lblPass),
				asm.LoadMem(asm.R7, asm.R2, 23, asm.Byte),
				asm.JNE.Imm(asm.R7, unix.IPPROTO_UDP, lblPass),
			)
			if f.UDPDst.IsValid() {
				// The destination address (bytes 30-33, in bounds), as
				// the 32-bit load reads it on this host.
				a := f.UDPDst.Unmap().As4()
				ins = append(ins,
					asm.LoadMem(asm.R7, asm.R2, 30, asm.Word),
					asm.JNE.Imm32(asm.R7, int32(binary.NativeEndian.Uint32(a[:])), lblPass),
				)
			}
			ins = append(ins,
				asm.LoadMem(asm.R7, asm.R2, 20, asm.Half),
				asm.And.Imm(asm.R7, fragMask),
				asm.JNE.Imm(asm.R7, 0, lblPass),
				asm.LoadMem(asm.R0, asm.R2, 14, asm.Byte),
				asm.And.Imm(asm.R0, 0x0f),
				asm.JLT.Imm(asm.R0, 5, lblPass),
				asm.LSh.Imm(asm.R0, 2),
				asm.Mov.Reg(asm.R4, asm.R2),
				asm.Add.Imm(asm.R4, 14),
				asm.Add.Reg(asm.R4, asm.R0),
				asm.Mov.Reg(asm.R7, asm.R4),
				asm.Add.Imm(asm.R7, 8),
				asm.JGT.Reg(asm.R7, asm.R3, lblPass),
				asm.LoadMem(asm.R5, asm.R4, 2, asm.Half),
				asm.Ja.Label(lblPorts),
			)
			if v6 == lblIPv6 {
				// (The verifier refuses unreachable instructions: no
				// IPv6 branch with UDPDst.)
				ins = append(ins,
					// IPv6: next header UDP right after the fixed header.
					asm.Mov.Reg(asm.R4, asm.R2).WithSymbol(lblIPv6),
					asm.Add.Imm(asm.R4, 62),
					asm.JGT.Reg(asm.R4, asm.R3, lblPass),
					asm.LoadMem(asm.R7, asm.R2, 20, asm.Byte),
					asm.JNE.Imm(asm.R7, unix.IPPROTO_UDP, lblPass),
					asm.LoadMem(asm.R5, asm.R2, 56, asm.Half),
				)
			}
			for i, p := range f.UDPPorts {
				in := asm.JEq.Imm(asm.R5, wire16(p), lblRedirect)
				if i == 0 {
					in = in.WithSymbol(lblPorts)
				}
				ins = append(ins, in)
			}
		}
		ins = append(ins,
			asm.Ja.Label(lblPass),
			asm.Mov.Imm(asm.R0, 2).WithSymbol(lblPass), // XDP_PASS
			asm.Return(),
		)
	}
	if verdict >= 0 {
		return append(ins, asm.Mov.Imm(asm.R0, verdict).WithSymbol(lblRedirect), asm.Return()), nil
	}
	ins = append(ins,
		// bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS): frames
		// of queues without a socket go to the stack.
		asm.LoadMem(asm.R2, asm.R6, 16, asm.Word).WithSymbol(lblRedirect),
		asm.LoadMapPtr(asm.R1, xsks),
		asm.Mov.Imm(asm.R3, 2),
		asm.FnRedirectMap.Call(),
		asm.Return(),
	)
	return ins, nil
}

// Program is Weft's XDP program with its XSKMAP, loaded into the kernel
// and optionally attached to one interface through a bpf_link. A bpf_link
// attachment cannot replace a program someone else attached (the kernel
// refuses with EBUSY, reported as ErrXDPInUse), and closing it detaches
// exactly this program; a process that dies detaches it too.
type Program struct {
	filter Filter
	prog   *ebpf.Program
	xsks   *ebpf.Map

	mu      sync.Mutex
	lnk     link.Link
	ifindex int
	mode    AttachMode
	closed  bool
}

// NewProgram loads the program for f with an XSKMAP of the given number
// of entries (one per queue id; 0: 64).
func NewProgram(f Filter, entries int) (*Program, error) {
	if entries <= 0 {
		entries = 64
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "weft_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(entries)})
	if err != nil {
		return nil, progErr("load", ebpfErr(err))
	}
	ins, err := f.Instructions(m.FD())
	if err != nil {
		m.Close()
		return nil, progErr("load", err)
	}
	p, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name: "weft_xdp", Type: ebpf.XDP, Instructions: ins, License: "Dual MIT/GPL",
	}, ebpf.ProgramOptions{})
	if err != nil {
		m.Close()
		return nil, progErr("load", ebpfErr(err))
	}
	return &Program{filter: f, prog: p, xsks: m}, nil
}

func progErr(op string, err error) error {
	return &fabric.OpError{Op: "xdp " + op, Backend: "ethernet", Err: err}
}

func ebpfErr(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, fabric.ErrNotSupported) {
		return fmt.Errorf("%w: %w", fabric.ErrNotSupported, err)
	}
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w (needs CAP_BPF and CAP_NET_ADMIN)", err)
	}
	return err
}

// Filter returns the program's filter.
func (p *Program) Filter() Filter { return p.filter }

// ID returns the kernel's id of the program.
func (p *Program) ID() (ebpf.ProgramID, error) {
	info, err := p.prog.Info()
	if err != nil {
		return 0, err
	}
	id, _ := info.ID()
	return id, nil
}

// MapID returns the kernel's id of the XSKMAP.
func (p *Program) MapID() (ebpf.MapID, error) {
	info, err := p.xsks.Info()
	if err != nil {
		return 0, err
	}
	id, _ := info.ID()
	return id, nil
}

// XSKMap returns the XSKMAP; its file descriptor can be handed to
// another process (as libxdp's xsk_socket__update_xskmap takes it).
func (p *Program) XSKMap() *ebpf.Map { return p.xsks }

// Attach attaches the program to the interface with index ifindex (in
// the calling thread's network namespace) with a bpf_link. In AttachAuto
// it tries native mode first, then generic. It returns an error matching
// ErrXDPInUse if the interface has another XDP program: Weft never
// replaces one.
func (p *Program) Attach(ifindex int, mode AttachMode) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return progErr("attach", fabric.ErrClosed)
	}
	if p.lnk != nil {
		return progErr("attach", fmt.Errorf("already attached to ifindex %d: %w", p.ifindex, fabric.ErrInvalid))
	}
	try := []AttachMode{mode}
	if mode == AttachAuto {
		try = []AttachMode{AttachNative, AttachGeneric}
	}
	var errs []error
	for _, m := range try {
		fl := link.XDPDriverMode
		if m == AttachGeneric {
			fl = link.XDPGenericMode
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: p.prog, Interface: ifindex, Flags: fl})
		if err == nil {
			p.lnk, p.ifindex, p.mode = l, ifindex, m
			return nil
		}
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			who := "a program"
			if id, name, qerr := XDPProgramOn(ifindex); qerr == nil && id != 0 {
				who = fmt.Sprintf("program %q (id %d)", name, id)
			}
			return progErr("attach", fmt.Errorf("ifindex %d has %s: %w (Weft does not replace it): %w", ifindex, who, ErrXDPInUse, err))
		}
		errs = append(errs, fmt.Errorf("%s: %w", m, ebpfErr(err)))
	}
	err := errors.Join(errs...)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		err = fmt.Errorf("%w: %w", fabric.ErrNotSupported, err)
	}
	return progErr("attach", err)
}

// XDPProgramOn returns the id and name of the XDP program attached to
// the interface with index ifindex (in the calling thread's network
// namespace), or id 0 if it has none. The name is empty if the program
// cannot be opened (it needs CAP_SYS_ADMIN).
func XDPProgramOn(ifindex int) (id ebpf.ProgramID, name string, err error) {
	li, err := LinkByIndex(ifindex)
	if err != nil || li.XDPProgID == 0 {
		return 0, "", err
	}
	id = ebpf.ProgramID(li.XDPProgID)
	if p, err := ebpf.NewProgramFromID(id); err == nil {
		if info, err := p.Info(); err == nil {
			name = info.Name
		}
		p.Close()
	}
	return id, name, nil
}

// Mode returns the mode the program is attached in (AttachAuto if it is
// not attached).
func (p *Program) Mode() AttachMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Ifindex returns the interface index the program is attached to, 0 if
// none.
func (p *Program) Ifindex() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ifindex
}

// Register steers frames of queue to the AF_XDP socket fd.
func (p *Program) Register(queue, fd int) error {
	if err := p.xsks.Put(uint32(queue), uint32(fd)); err != nil {
		return progErr("register", err)
	}
	return nil
}

// Unregister stops steering frames of queue (they go to the stack).
func (p *Program) Unregister(queue int) error {
	if err := p.xsks.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return progErr("unregister", err)
	}
	return nil
}

// Detach detaches the program from its interface, if attached. Only the
// bpf_link Weft created is closed, so no other program is affected.
func (p *Program) Detach() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.detachLocked()
}

func (p *Program) detachLocked() error {
	if p.lnk == nil {
		return nil
	}
	err := p.lnk.Close()
	p.lnk, p.ifindex, p.mode = nil, 0, AttachAuto
	if err != nil {
		return progErr("detach", err)
	}
	return nil
}

// Close detaches the program and unloads it and its map. It is
// idempotent.
func (p *Program) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	errs := []error{p.detachLocked()}
	if err := p.prog.Close(); err != nil {
		errs = append(errs, progErr("close", err))
	}
	if err := p.xsks.Close(); err != nil {
		errs = append(errs, progErr("close", err))
	}
	return errors.Join(errs...)
}
