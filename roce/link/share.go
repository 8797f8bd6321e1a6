package link

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
)

// Several processes on one host share one IP address and UDP port 4791,
// as they would share one RDMA NIC (MPI ranks on a node). Every received
// packet must reach the process that owns its destination QP:
//
//   - QP numbers are unique across the host's processes: each engine that
//     opens its own UDP link claims a block of QPNBlockSize numbers,
//     [block<<QPNBlockBits, (block+1)<<QPNBlockBits), by holding an OFD
//     lock on byte block of qpnLockPath. The kernel drops the lock when
//     the process dies, so a dead process's block is reclaimed.
//   - The engines' UDP sockets on one address form a SO_REUSEPORT group,
//     and an SK_REUSEPORT eBPF program (built with cilium/ebpf's asm)
//     reads the BTH's destination QP and picks the socket of the block's
//     owner from a REUSEPORT_SOCKARRAY indexed by block: one map for the
//     host, shared through its ID, recorded in a file beside the lock
//     file.
//   - A raw receive socket (see UDPLink) sees every packet to the port,
//     so its BPF filter also keeps only its own block.
//
// Loading the program needs CAP_BPF, and opening the map another process made
// needs CAP_SYS_ADMIN (root has both). Without them, an engine binds
// its port alone; if another process holds it, NewEngine fails with a
// *SharedPortError (matching fabric.ErrNotSupported): give each process
// its own address ("local=IP" in the fabric address).

// QPNBlockBits is the log2 of the number of QPNs in an engine's block.
const QPNBlockBits = 14

// QPNBlockSize is the number of QPNs an engine owns: the most queue pairs
// it can have at once.
const QPNBlockSize = 1 << QPNBlockBits

// qpnBlocks is the number of blocks in the 24-bit QPN space; block 0 (QP0,
// QP1 and the small numbers) is never handed out.
const qpnBlocks = 1 << (24 - QPNBlockBits)

// qpnLockPath is the file whose bytes the engines of a host lock to claim
// their QPN blocks. Byte 0 serialises changes to the steering groups.
var qpnLockPath = "/dev/shm/weft-roce-qpn"

// QPNBlock is a claimed block of QPNs: an engine numbers its QPs in it,
// and the steering program sends it the packets for them.
type QPNBlock struct {
	f *os.File // holds the OFD lock on byte n
	n uint32
}

func (b *QPNBlock) base() uint32 { return b.n << QPNBlockBits }

// N is the block's number: its QPNs are [N<<QPNBlockBits, (N+1)<<QPNBlockBits).
func (b *QPNBlock) N() uint32 { return b.n }

// Release gives the block back (closing its lock file); it is safe on nil.
func (b *QPNBlock) Release() {
	if b != nil && b.f != nil {
		b.f.Close() // drops the lock
		b.f = nil
	}
}

func openLockFile() (*os.File, error) {
	f, err := os.OpenFile(qpnLockPath, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("roce: QPN lock file: %w", err)
	}
	// Whatever the creator's umask, every user's engines must be able to
	// lock it (a no-op, or refused, for those who do not own it).
	f.Chmod(0o666)
	return f, nil
}

// lockByte takes a write OFD lock on byte n of f; wait blocks for it.
func lockByte(f *os.File, n int64, wait bool) error {
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: n, Len: 1}
	return unix.FcntlFlock(f.Fd(), cmd, &lk)
}

func unlockByte(f *os.File, n int64) {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: n, Len: 1}
	unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// ClaimQPNBlock claims a free block of QPNs for this process: its OFD
// lock on qpnLockPath lasts until Release or the process's death.
func ClaimQPNBlock() (*QPNBlock, error) {
	f, err := openLockFile()
	if err != nil {
		return nil, err
	}
	n := qpnBlocks - 1
	start := rand.IntN(n)
	for i := range n {
		b := 1 + (start+i)%n
		err := lockByte(f, int64(b), false)
		if err == nil {
			return &QPNBlock{f: f, n: uint32(b)}, nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			f.Close()
			return nil, fmt.Errorf("roce: claiming a QPN block: %w", err)
		}
	}
	f.Close()
	return nil, fmt.Errorf("roce: all %d QPN blocks of the host are taken: %w", n, fabric.ErrNotSupported)
}

// SharedPortError reports that a link could not bind its address and
// port because another process holds them, and that the port cannot be
// shared (no privileges for the steering program). It matches
// fabric.ErrNotSupported.
type SharedPortError struct {
	// Addr is the address and port.
	Addr netip.AddrPort
	// Err is why sharing was not possible.
	Err error
}

// Error implements error.
func (e *SharedPortError) Error() string {
	return fmt.Sprintf("roce: UDP %v is held by another process and cannot be shared (%v; sharing needs CAP_BPF and CAP_SYS_ADMIN): give each process its own address (local=IP)", e.Addr, e.Err)
}

// Unwrap returns fabric.ErrNotSupported and the cause.
func (e *SharedPortError) Unwrap() []error { return []error{fabric.ErrNotSupported, e.Err} }

// steerMapName names the steering map, so that an ID recorded in a file
// is checked to still be ours.
const steerMapName = "weft_roce_qpn"

// steerIDPath is where the ID of the host's steering map is recorded.
// One map serves every address and port (and network namespace): blocks
// are unique on the host, and the kernel refuses to select a socket of
// another SO_REUSEPORT group, so a packet for a block whose owner is not
// in the packet's group is dropped, as it should be.
func steerIDPath() string { return qpnLockPath + "-steer" }

// steering is a link's part in the steering of its port.
type steering struct {
	m    *ebpf.Map
	prog *ebpf.Program
}

func (s *steering) close() {
	if s == nil {
		return
	}
	s.prog.Close()
	s.m.Close()
}

// steerMap returns the host's steering map: the one recorded, if it is
// still alive, or a new one.
func steerMap() (*ebpf.Map, error) {
	path := steerIDPath()
	if b, err := os.ReadFile(path); err == nil {
		if id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil {
			if m, err := ebpf.NewMapFromID(ebpf.MapID(id)); err == nil {
				info, ierr := m.Info()
				if ierr == nil && info.Type == ebpf.ReusePortSockArray && info.Name == steerMapName &&
					info.MaxEntries == qpnBlocks {
					return m, nil
				}
				m.Close()
			}
		}
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: steerMapName, Type: ebpf.ReusePortSockArray,
		KeySize: 4, ValueSize: 8, MaxEntries: qpnBlocks})
	if err != nil {
		return nil, err
	}
	info, err := m.Info()
	if err != nil {
		m.Close()
		return nil, err
	}
	id, _ := info.ID()
	tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(uint64(id), 10)), 0o644); err == nil {
		err = os.Rename(tmp, path)
	}
	return m, err
}

// Offsets in a datagram to QP 1 (from the UDP header, where an
// SK_REUSEPORT program's loads start) of the fields that make a goodbye
// (gsi.go): the MAD's management class and attribute, and the DREQ's
// remote communication id and remote QPN.
const (
	madAt           = 8 + 12 + 8 // UDP header, BTH, DETH
	goodbyeClassAt  = madAt      // word: base version, class, class version, method
	goodbyeAttrAt   = madAt + 16 // word: attribute id, reserved
	goodbyeCommIDAt = madAt + 24 + 4
	goodbyeQPNAt    = madAt + 24 + 8 // word: remote QPN (24 bits), reserved
)

// steeringInstructions returns the SK_REUSEPORT program that steers a
// packet to the socket at index BTH.DestQP >> QPNBlockBits of the map
// (a REUSEPORT_SOCKARRAY, given by its file descriptor), and drops it if
// the block has no socket or the datagram is too short for a BTH. Block 0
// (QP 1, connection management) is left to the kernel's choice, except a
// goodbye (a DREQ whose remote communication id is 0), which goes to the
// owner of the QP it names as any packet for that QP would.
func steeringInstructions(mapFD int) asm.Instructions {
	const drop, pass = 0, 1 // SK_DROP, SK_PASS
	// load loads the big-endian word at off (from the UDP header) into
	// R2 by bpf_skb_load_bytes(ctx, off, fp-8, 4), or jumps to short if
	// the datagram is too short. R6 holds ctx.
	load := func(off int32, short string) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, off),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 4),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, short),
			asm.LoadMem(asm.R2, asm.RFP, -8, asm.Word),
			asm.HostTo(asm.BE, asm.R2, asm.Word),
		}
	}
	// A goodbye (block 0) is passed to the kernel's choice unless each
	// field says it is one.
	var gsi asm.Instructions
	gsi = append(gsi, load(goodbyeClassAt, "pass")...)
	gsi[0] = gsi[0].WithSymbol("gsi")
	gsi = append(gsi, asm.RSh.Imm(asm.R2, 16), asm.And.Imm(asm.R2, 0xff),
		asm.JNE.Imm(asm.R2, cm.ClassCM, "pass"))
	gsi = append(gsi, load(goodbyeAttrAt, "pass")...)
	gsi = append(gsi, asm.RSh.Imm(asm.R2, 16), asm.JNE.Imm(asm.R2, int32(cm.AttrDREQ), "pass"))
	gsi = append(gsi, load(goodbyeCommIDAt, "pass")...)
	gsi = append(gsi, asm.JNE.Imm(asm.R2, 0, "pass"))
	gsi = append(gsi, load(goodbyeQPNAt, "pass")...)
	gsi = append(gsi, asm.RSh.Imm(asm.R2, 8+QPNBlockBits),
		asm.JEq.Imm(asm.R2, 0, "pass"),
		asm.Ja.Label("select"))
	prog := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	// The BTH's reserved byte and destination QP, after the UDP header;
	// a datagram too short for them is dropped.
	prog = append(prog, load(8+4, "drop")...)
	prog = append(prog,
		asm.And.Imm(asm.R2, 0xffffff),
		asm.RSh.Imm(asm.R2, QPNBlockBits),
		// Block 0 holds QP 1, the GSI that carries connection
		// management: no engine owns it, so the kernel's own choice
		// stands (rdma_cm needs one engine per address; see Engine.CM),
		// but for goodbyes (gsi, below).
		asm.JEq.Imm(asm.R2, 0, "gsi"),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word).WithSymbol("select"),
		// bpf_sk_select_reuseport(ctx, map, &block, 0)
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, mapFD),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -4),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkSelectReuseport.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop"),
		asm.Mov.Imm(asm.R0, pass).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, drop).WithSymbol("drop"),
		asm.Return(),
	)
	return append(prog, gsi...)
}

// joinSteering binds a socket to addr in the port's SO_REUSEPORT group,
// registers it as the owner of block and attaches the steering program.
// It returns the bound socket and the objects to close with it.
func joinSteering(addr netip.AddrPort, block uint32) (*net.UDPConn, *steering, error) {
	if noSteering != nil {
		return nil, nil, noSteering
	}
	f, err := openLockFile()
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if err := lockByte(f, 0, true); err != nil {
		return nil, nil, fmt.Errorf("roce: steering lock: %w", err)
	}
	defer unlockByte(f, 0)
	m, err := steerMap()
	if err != nil {
		return nil, nil, err
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "weft_roce_steer", Type: ebpf.SkReuseport,
		Instructions: steeringInstructions(m.FD()), License: "Dual MIT/GPL"})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	s := &steering{m: m, prog: prog}
	conn, err := listenUDP(addr, bindShared)
	if err != nil {
		s.close()
		return nil, nil, err
	}
	var fd int
	rc, _ := conn.SyscallConn()
	rc.Control(func(x uintptr) { fd = int(x) })
	if err := m.Update(block, uint64(fd), ebpf.UpdateAny); err != nil {
		conn.Close()
		s.close()
		return nil, nil, fmt.Errorf("roce: steering map: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, prog.FD()); err != nil {
		conn.Close()
		s.close()
		return nil, nil, fmt.Errorf("roce: attaching the steering program: %w", err)
	}
	return conn, s, nil
}

// noSteering, if set, is the error of every attempt to set up steering:
// tests use it to act as a process without CAP_BPF.
var noSteering error

// privilegeError reports whether err says the process may not use BPF.
func privilegeError(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, ebpf.ErrNotSupported)
}
