//go:build linux && cgo && rdma

package verbs

/*
#include "weft_cm.h"
#include <fcntl.h>

static inline struct ibv_mr *weft_reg_mr(struct ibv_pd *pd, uint64_t addr, size_t len, int access) {
	return ibv_reg_mr(pd, (void *)(uintptr_t)addr, len, access);
}

static inline int weft_set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) return -1;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static inline void weft_q_set_ud(struct weft_q *q, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey) {
	q->ah = ah; q->remote_qpn = qpn; q->remote_qkey = qkey;
}
*/
import "C"

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
	"github.com/weft-io/weft/roce/exchange"
	"github.com/weft-io/weft/roce/wire"
)

var debug = os.Getenv("WEFT_VERBS_DEBUG") == "1"

// Defaults of Options.
const (
	DefaultMaxMsg = 64 << 10
	DefaultDepth  = 256
	DefaultInline = 4096
	maxSGEs       = 16
	udGRH         = 40 // a UD receive buffer starts with the GRH
	lingerTime    = 2 * time.Second
	waitSlice     = 50 * time.Millisecond
)

// opcodes of ibv_wr_opcode, and internal marks of a send slot.
const (
	wrWrite    = C.IBV_WR_RDMA_WRITE
	wrWriteImm = C.IBV_WR_RDMA_WRITE_WITH_IMM
	wrSend     = C.IBV_WR_SEND
	wrSendImm  = C.IBV_WR_SEND_WITH_IMM
	wrRead     = C.IBV_WR_RDMA_READ
	wrCmpSwap  = C.IBV_WR_ATOMIC_CMP_AND_SWP
	wrFetchAdd = C.IBV_WR_ATOMIC_FETCH_AND_ADD
)

// sendSlot is what the endpoint remembers of a posted work request, at
// index seq % depth.
type sendSlot struct {
	ctx      uint64
	op       fabric.Op
	len      int
	user     bool // the caller asked for a completion
	internal bool // keep-alive or linger marker: never reported
}

// waiter sleeps on a completion channel through Go's poller.
type waiter struct {
	ch   *C.struct_ibv_comp_channel
	cq   *C.struct_ibv_cq
	file *os.File
	rc   syscall.RawConn
}

// Endpoint is a verbs queue pair as a fabric.Endpoint.
type Endpoint struct {
	o        Options
	dev      DeviceInfo
	ctx      *C.struct_ibv_context
	pd       *C.struct_ibv_pd
	sch, rch *C.struct_ibv_comp_channel
	scq, rcq *C.struct_ibv_cq
	qp       *C.struct_ibv_qp
	ah       *C.struct_ibv_ah
	q        *C.struct_weft_q
	dom      *fabric.Domain
	caps     fabric.Caps
	port     uint8
	sgid     int
	local    Dest
	peer     Dest
	ud       bool
	depth    int
	maxSGE   int
	inlineHW int // device inline limit
	signal   int
	spin     time.Duration
	laddr    string // LocalAddr
	raddr    string // RemoteAddr

	// life is held shared by every call that touches the device and
	// exclusively by Close, which destroys it.
	life   sync.RWMutex
	closed atomic.Bool
	once   sync.Once
	stop   chan struct{}
	wg     sync.WaitGroup

	sendMu   sync.Mutex
	swr      []C.struct_weft_swr
	sge      []C.struct_ibv_sge
	sout     []C.struct_weft_wc
	slots    []sendSlot
	head     uint64 // sequence number of the next work request
	tail     uint64 // every work request before tail has completed
	sinceSig int
	bounce   []byte
	bounceMR *C.struct_ibv_mr
	swait    waiter

	recvMu  sync.Mutex
	rout    []C.struct_weft_wc
	rbuf    []byte
	rmr     *C.struct_ibv_mr
	rslot   int
	rposted uint32 // receive work requests posted so far; the next repost starts at slot rposted%depth
	rfree   []bool // slot completed and given back, waiting to be reposted in order
	vq      []int  // slots of views not yet released, a queue
	vHead   int    // oldest outstanding view (index into vq, mod depth)
	vTail   int
	rwait   waiter

	failed  atomic.Bool
	failErr error // set once, before failed

	comp  *cq.Queue
	cqi   compQueue
	evs   chan fabric.Event
	stats fabric.Counters

	regMu sync.Mutex
	regs  map[*C.struct_ibv_mr]*mrec

	// rdma_cm endpoints (cm_rdma.go): the id owns the queue pair and the
	// device context; the channel carries the id's events.
	cmid     *C.struct_rdma_cm_id
	cmch     *cmChannel
	peerData []byte        // the peer's private data
	cmGone   chan struct{} // closed when the connection is disconnected
	cmDone   chan struct{} // closed when watchCM returns; nil if it never ran
}

// Dest is the out-of-band address of a queue pair.
type Dest = exchange.Dest

type mrec struct {
	mr  *C.struct_ibv_mr
	pin runtime.Pinner
}

var (
	_ fabric.Endpoint     = (*Endpoint)(nil)
	_ fabric.ViewReceiver = (*Endpoint)(nil)
)

// Connect opens the device, creates the queue pair, runs the out-of-band
// exchange (dialing or listening, as o says) and connects the queue pair
// to the peer's. With o.CM the rdma_cm does all of it through librdmacm
// (cm_rdma.go).
func Connect(ctx context.Context, o Options) (*Endpoint, error) {
	if o.CM {
		return connectCM(ctx, o)
	}
	conn, err := exchange.Dial(ctx, o.Listen, o.Bootstrap, o.Local, o.DialRetry)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if !o.Local.IsValid() {
		o.Local = conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}
	ep, err := newEndpoint(o, nil, nil)
	if err != nil {
		return nil, err
	}
	ep.laddr, ep.raddr = conn.LocalAddr().String(), o.Bootstrap
	if o.Listen {
		ep.raddr = conn.RemoteAddr().String()
	}
	if o.Listen {
		ep.peer, err = exchange.Server(ctx, conn, ep.local, ep.connect)
	} else {
		ep.peer, err = exchange.Client(ctx, conn, ep.local, ep.connect)
	}
	if err != nil {
		ep.Close()
		return nil, err
	}
	ep.caps.Foreign = !ep.peer.IsWeft()
	if !ep.ud && o.KeepAlive > 0 {
		ep.wg.Add(1)
		go ep.keepAlive(o.KeepAlive)
	}
	return ep, nil
}

func opErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: "verbs", Err: err}
}

func errnoErr(op string, err error, rc C.int) error {
	if err == nil && rc != 0 {
		err = syscall.Errno(rc)
	}
	if err == nil {
		err = syscall.EINVAL
	}
	return opErr(op, err)
}

// newEndpoint opens the device and creates everything but the
// connection. With an rdma_cm id (bound to a device by address or route
// resolution, or by a connection request) it uses the id's device
// context and port and creates the queue pair on the id, which librdmacm
// then moves through its states; the endpoint owns id and ch from the
// call on, and releases them on failure too.
func newEndpoint(o Options, id *C.struct_rdma_cm_id, ch *cmChannel) (_ *Endpoint, err error) {
	ep := &Endpoint{o: o, stop: make(chan struct{}), regs: map[*C.struct_ibv_mr]*mrec{},
		evs: make(chan fabric.Event, 16), ud: o.Type == wire.UD, cmid: id, cmch: ch}
	defer func() {
		if err != nil {
			ep.destroy()
		}
	}()
	if id != nil {
		err = ep.cmDevice()
	} else {
		err = ep.pickDevice()
	}
	if err != nil {
		return nil, err
	}
	var pinfo *PortInfo
	for i := range ep.dev.Ports {
		if ep.dev.Ports[i].Num == ep.port {
			pinfo = &ep.dev.Ports[i]
		}
	}
	if pinfo == nil {
		return nil, fmt.Errorf("verbs: %s has no port %d: %w", ep.dev.Name, ep.port, fabric.ErrInvalid)
	}
	var sgid [16]byte
	for _, g := range pinfo.GIDs {
		if g.Index == ep.sgid {
			sgid = g.GID
		}
	}
	if sgid == ([16]byte{}) && id != nil {
		sgid = ep.local.GID // the id's address, as a GID (cmDevice)
	}
	if sgid == ([16]byte{}) {
		return nil, fmt.Errorf("verbs: %s port %d has no GID %d: %w", ep.dev.Name, ep.port, ep.sgid, fabric.ErrInvalid)
	}
	mtu := o.MTU
	if mtu == 0 {
		mtu = min(pinfo.ActiveMTU, 4096)
	}
	if mtuEnum(mtu) == 0 {
		mtu = 1024
	}
	ep.o.MTU = mtu

	// Sizes.
	ep.depth = o.Depth
	if ep.depth <= 0 {
		ep.depth = DefaultDepth
	}
	if ep.dev.MaxQPWR > 0 {
		ep.depth = min(ep.depth, ep.dev.MaxQPWR)
	}
	ep.maxSGE = min(maxSGEs, max(ep.dev.MaxSGE, 1))
	maxMsg := o.MaxMsg
	if maxMsg <= 0 {
		maxMsg = DefaultMaxMsg
	}
	if ep.ud {
		maxMsg = min(maxMsg, mtu)
	}
	inline := o.Inline
	if inline <= 0 {
		inline = DefaultInline
	}
	inline = max(min(inline, maxMsg), 512)
	ep.signal = o.Signal
	if ep.signal <= 0 || ep.signal > ep.depth/2 {
		ep.signal = max(ep.depth/4, 1)
	}
	ep.spin = (&fabric.Options{Spin: o.Spin}).SpinBudget()

	// Device objects.
	if id == nil {
		if err := ep.openDevice(); err != nil {
			return nil, err
		}
	}
	ep.dom = &fabric.Domain{Name: "verbs:" + ep.dev.Name}
	ep.pd, err = C.ibv_alloc_pd(ep.ctx)
	if ep.pd == nil {
		return nil, errnoErr("ibv_alloc_pd", err, 0)
	}
	if ep.sch, err = C.ibv_create_comp_channel(ep.ctx); ep.sch == nil {
		return nil, errnoErr("ibv_create_comp_channel", err, 0)
	}
	if ep.rch, err = C.ibv_create_comp_channel(ep.ctx); ep.rch == nil {
		return nil, errnoErr("ibv_create_comp_channel", err, 0)
	}
	if ep.scq, err = C.ibv_create_cq(ep.ctx, C.int(ep.depth+1), nil, ep.sch, 0); ep.scq == nil {
		return nil, errnoErr("ibv_create_cq", err, 0)
	}
	if ep.rcq, err = C.ibv_create_cq(ep.ctx, C.int(ep.depth+1), nil, ep.rch, 0); ep.rcq == nil {
		return nil, errnoErr("ibv_create_cq", err, 0)
	}
	if err := ep.swait.init(ep.sch, ep.scq); err != nil {
		return nil, err
	}
	if err := ep.rwait.init(ep.rch, ep.rcq); err != nil {
		return nil, err
	}
	ud := C.int(0)
	if ep.ud {
		ud = 1
	}
	// Ask for some device inline room; providers differ in what they
	// grant, and some refuse large requests.
	var gotInline, gotWR C.uint32_t
	for _, want := range []int{256, 64, 0} {
		if id != nil {
			ep.qp, err = C.weft_cm_create_qp(id, ep.pd, ep.scq, ep.rcq, C.uint32_t(ep.depth), C.uint32_t(ep.depth),
				C.uint32_t(ep.maxSGE), C.uint32_t(want), &gotInline, &gotWR)
		} else {
			ep.qp, err = C.weft_create_qp(ep.pd, ep.scq, ep.rcq, ud, C.uint32_t(ep.depth), C.uint32_t(ep.depth),
				C.uint32_t(ep.maxSGE), C.uint32_t(want), &gotInline, &gotWR)
		}
		if ep.qp != nil {
			break
		}
	}
	if ep.qp == nil {
		return nil, errnoErr("ibv_create_qp", err, 0)
	}
	ep.inlineHW = int(gotInline)
	if ep.q = C.weft_q_new(C.int(ep.depth), C.int(ep.maxSGE), C.int(ep.depth), 64); ep.q == nil {
		return nil, opErr("alloc", syscall.ENOMEM)
	}
	ep.q.qp, ep.q.scq, ep.q.rcq = ep.qp, ep.scq, ep.rcq
	ep.swr = unsafe.Slice(ep.q.swr, ep.depth)
	ep.sge = unsafe.Slice(ep.q.sge, ep.depth*ep.maxSGE)
	ep.sout = unsafe.Slice(ep.q.sout, 64)
	ep.rout = unsafe.Slice(ep.q.rout, 64)
	ep.slots = make([]sendSlot, ep.depth)
	ep.comp = cq.New(0, ep.spin)
	ep.cqi = compQueue{ep}

	// Receive ring and bounce buffers: mmapped, registered once.
	ep.rslot = maxMsg
	if ep.ud {
		ep.rslot += udGRH
	}
	if ep.rbuf, ep.rmr, err = ep.mapRegister(ep.depth*ep.rslot, C.IBV_ACCESS_LOCAL_WRITE); err != nil {
		return nil, err
	}
	if ep.bounce, ep.bounceMR, err = ep.mapRegister(ep.depth*inline, 0); err != nil {
		return nil, err
	}
	ep.q.rbase = C.uint64_t(uintptr(unsafe.Pointer(&ep.rbuf[0])))
	ep.q.rslot = C.uint32_t(ep.rslot)
	ep.q.rlkey = ep.rmr.lkey

	if id == nil { // rdma_create_qp left it in INIT
		if rc := C.weft_qp_init(ep.qp, C.uint8_t(ep.port), C.uint32_t(o.QKey), ud); rc != 0 {
			return nil, errnoErr("ibv_modify_qp(INIT)", nil, rc)
		}
	}
	// Receives go up before the peer learns our QPN, so its first send
	// finds a buffer.
	if rc := C.weft_post_recv(ep.q, 0, C.int(ep.depth)); rc != 0 {
		return nil, errnoErr("ibv_post_recv", nil, rc)
	}
	ep.rposted = uint32(ep.depth)
	ep.rfree = make([]bool, ep.depth)
	ep.vq = make([]int, ep.depth)

	var b [4]byte
	rand.Read(b[:])
	lid := pinfo.LID
	if pinfo.Ethernet {
		lid = exchange.WeftLID // a RoCE port's LID is 0, and means nothing: mark Weft
	}
	ep.local = Dest{LID: lid, QPN: uint32(ep.qp.qp_num), PSN: wire.PSN(binary.LittleEndian.Uint32(b[:]) & wire.PSNMask),
		GID: wire.GID(sgid)}
	ep.caps = fabric.Caps{Backend: "verbs", MaxMsgSize: maxMsg, MaxSGEs: ep.maxSGE, MTU: mtu, InlineSize: inline,
		MaxRMASize: 1 << 30}
	if !ep.ud {
		ep.caps.RMA, ep.caps.Reliable, ep.caps.Atomics = true, true, ep.dev.Atomics
	}
	return ep, nil
}

// pickDevice chooses the device, port and GID index that the options
// ask for.
func (ep *Endpoint) pickDevice() error {
	o := ep.o
	devs, err := Devices()
	if err != nil {
		return err
	}
	if o.GIDIndex >= 0 {
		ep.dev, ep.port, ep.sgid = devs[0], o.Port, o.GIDIndex
		if o.Device != "" {
			found := false
			for _, d := range devs {
				if d.Name == o.Device {
					ep.dev, found = d, true
				}
			}
			if !found {
				return fmt.Errorf("%w: no device %q", ErrNoDevice, o.Device)
			}
		}
		if ep.port == 0 {
			ep.port = 1
		}
	} else {
		name, port, idx, err := FindGID(devs, o.Device, o.Local)
		if err != nil {
			return err
		}
		for _, d := range devs {
			if d.Name == name {
				ep.dev = d
			}
		}
		ep.port, ep.sgid = port, idx
	}
	return nil
}

func (ep *Endpoint) openDevice() error {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	defer C.ibv_free_device_list(list)
	for _, d := range unsafe.Slice(list, int(n)) {
		if C.GoString(C.ibv_get_device_name(d)) == ep.dev.Name {
			ep.ctx, err = C.ibv_open_device(d)
			if ep.ctx == nil {
				return errnoErr("ibv_open_device "+ep.dev.Name, err, 0)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %s went away", ErrNoDevice, ep.dev.Name)
}

func (w *waiter) init(ch *C.struct_ibv_comp_channel, cq *C.struct_ibv_cq) error {
	w.ch, w.cq = ch, cq
	if C.weft_set_nonblock(ch.fd) != 0 {
		return opErr("fcntl", syscall.EINVAL)
	}
	fd, err := unix.Dup(int(ch.fd))
	if err != nil {
		return opErr("dup", err)
	}
	unix.CloseOnExec(fd)
	w.file = os.NewFile(uintptr(fd), "ibv_comp_channel")
	w.rc, err = w.file.SyscallConn()
	if err != nil {
		w.file.Close()
		w.file = nil
		return opErr("comp channel", err)
	}
	return nil
}

// mapRegister maps size bytes (rounded up to pages) and registers them.
func (ep *Endpoint) mapRegister(size int, access C.int) ([]byte, *C.struct_ibv_mr, error) {
	pg := os.Getpagesize()
	size = (size + pg - 1) &^ (pg - 1)
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, opErr("mmap", err)
	}
	mr, err := C.weft_reg_mr(ep.pd, C.uint64_t(uintptr(unsafe.Pointer(&buf[0]))), C.size_t(size), access)
	if mr == nil {
		unix.Munmap(buf)
		return nil, nil, errnoErr("ibv_reg_mr", err, 0)
	}
	return buf, mr, nil
}

// connect moves the queue pair to RTR and RTS towards peer (RC), or
// creates the address handle (UD).
func (ep *Endpoint) connect(peer Dest) error {
	ud := C.int(0)
	if ep.ud {
		ud = 1
	}
	dgid := [16]byte(peer.GID)
	dg := (*C.uint8_t)(unsafe.Pointer(&dgid[0]))
	maxRd := C.uint8_t(min(16, max(ep.dev.MaxQPInitRdAtom, 1)))
	maxDest := C.uint8_t(min(16, max(ep.dev.MaxQPRdAtom, 1)))
	if rc := C.weft_qp_rtr(ep.qp, ud, C.uint8_t(ep.port), C.int(ep.sgid), dg, C.uint16_t(peer.LID),
		C.int(mtuEnum(ep.o.MTU)), C.uint32_t(peer.QPN), C.uint32_t(peer.PSN), maxDest, 12); rc != 0 {
		return errnoErr("ibv_modify_qp(RTR)", nil, rc)
	}
	if rc := C.weft_qp_rts(ep.qp, ud, C.uint32_t(ep.local.PSN), C.uint8_t(ep.o.Timeout), C.uint8_t(ep.o.Retry),
		C.uint8_t(ep.o.RNRRetry), maxRd); rc != 0 {
		return errnoErr("ibv_modify_qp(RTS)", nil, rc)
	}
	if ep.ud {
		ah, err := C.weft_create_ah(ep.pd, C.uint8_t(ep.port), C.int(ep.sgid), dg, C.uint16_t(peer.LID))
		if ah == nil {
			return errnoErr("ibv_create_ah", err, 0)
		}
		ep.ah = ah
		C.weft_q_set_ud(ep.q, ah, C.uint32_t(peer.QPN), C.uint32_t(ep.o.QKey))
	}
	return nil
}

// LocalDest returns this endpoint's out-of-band address.
func (ep *Endpoint) LocalDest() Dest { return ep.local }

// PeerDest returns the peer's out-of-band address.
func (ep *Endpoint) PeerDest() Dest { return ep.peer }

// Device returns the device the endpoint uses, its port and GID index.
func (ep *Endpoint) Device() (DeviceInfo, uint8, int) { return ep.dev, ep.port, ep.sgid }

// DeviceInline returns the device's inline limit for this queue pair:
// sends up to this size are copied by ibv_post_send itself.
func (ep *Endpoint) DeviceInline() int { return ep.inlineHW }

// ---- registration ----

func accessFlags(a fabric.Access) C.int {
	var f C.int
	if a&(fabric.AccessLocalWrite|fabric.AccessRemoteWrite|fabric.AccessRemoteAtomic) != 0 {
		f |= C.IBV_ACCESS_LOCAL_WRITE // verbs requires it with remote write and atomics
	}
	if a.Has(fabric.AccessRemoteWrite) {
		f |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if a.Has(fabric.AccessRemoteRead) {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a.Has(fabric.AccessRemoteAtomic) {
		f |= C.IBV_ACCESS_REMOTE_ATOMIC
	}
	return f
}

// Register implements fabric.Endpoint: buf (Go or C memory) is pinned
// and registered with ibv_reg_mr. The region's address for RMA is buf's
// virtual address, as verbs has it.
func (ep *Endpoint) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	return ep.register(buf, access, false)
}

// Alloc implements fabric.Endpoint: page-aligned memory from mmap,
// registered. Close deregisters it; the mapping itself is released when
// the Region is no longer reachable, so keep the Region while you use its
// Bytes.
func (ep *Endpoint) Alloc(size int, access fabric.Access) (*fabric.Region, error) {
	if size <= 0 {
		return nil, opErr("alloc", fabric.ErrInvalid)
	}
	if ep.closed.Load() {
		return nil, opErr("alloc", fabric.ErrClosed)
	}
	pg := os.Getpagesize()
	buf, err := unix.Mmap(-1, 0, (size+pg-1)&^(pg-1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, opErr("mmap", err)
	}
	r, err := ep.register(buf[:size:size], access, true)
	if err != nil {
		unix.Munmap(buf)
		return nil, err
	}
	// Close deregisters the region, but its memory stays mapped while the
	// Region is reachable, so Bytes never dangles.
	runtime.AddCleanup(r, func(b []byte) { unix.Munmap(b) }, buf)
	return r, nil
}

func (ep *Endpoint) register(buf []byte, access fabric.Access, mapped bool) (*fabric.Region, error) {
	if len(buf) == 0 {
		return nil, opErr("register", fabric.ErrInvalid)
	}
	ep.life.RLock()
	defer ep.life.RUnlock()
	if ep.closed.Load() {
		return nil, opErr("register", fabric.ErrClosed)
	}
	rec := &mrec{}
	if !mapped {
		rec.pin.Pin(&buf[0])
	}
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	mr, err := C.weft_reg_mr(ep.pd, C.uint64_t(addr), C.size_t(len(buf)), accessFlags(access))
	if mr == nil {
		rec.pin.Unpin()
		return nil, errnoErr("ibv_reg_mr", err, 0)
	}
	rec.mr = mr
	ep.regMu.Lock()
	ep.regs[mr] = rec
	ep.regMu.Unlock()
	var rkey fabric.Key
	if access&fabric.AccessRemote != 0 {
		rkey = fabric.Key(mr.rkey)
	}
	return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: access, LocalKey: fabric.Key(mr.lkey),
		RemoteKey: rkey, Addr: addr, Domain: ep.dom, Deregister: func() error { return ep.deregister(mr) }}), nil
}

// deregister releases a region; after Close did it already, it is a
// no-op.
func (ep *Endpoint) deregister(mr *C.struct_ibv_mr) error {
	ep.regMu.Lock()
	rec := ep.regs[mr]
	delete(ep.regs, mr)
	ep.regMu.Unlock()
	if rec == nil {
		return nil
	}
	return rec.release()
}

func (rec *mrec) release() error {
	var err error
	if rc := C.ibv_dereg_mr(rec.mr); rc != 0 {
		err = errnoErr("ibv_dereg_mr", nil, rc)
	}
	rec.pin.Unpin()
	return err
}

// ---- send side ----

// Send implements fabric.Endpoint.
func (ep *Endpoint) Send(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.post(msgs, fabric.OpSend, 0, 0)
}

// Write implements fabric.Endpoint.
func (ep *Endpoint) Write(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.post(msgs, fabric.OpWrite, 0, 0)
}

// Read implements fabric.Endpoint.
func (ep *Endpoint) Read(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.post(msgs, fabric.OpRead, 0, 0)
}

// FetchAdd posts an atomic fetch-and-add of add to the 8 bytes at remote;
// the old value lands in sge (8 bytes, local write). ctx and flags work as
// in fabric.Message.
func (ep *Endpoint) FetchAdd(sge fabric.SGE, remote fabric.RemoteIOV, add uint64, ctx uint64, flags fabric.MsgFlags) error {
	return ep.atomic(fabric.OpFetchAdd, sge, remote, add, 0, ctx, flags)
}

// CompareSwap posts an atomic compare-and-swap of the 8 bytes at remote:
// if they equal compare they become swap; the old value lands in sge.
func (ep *Endpoint) CompareSwap(sge fabric.SGE, remote fabric.RemoteIOV, compare, swap uint64, ctx uint64, flags fabric.MsgFlags) error {
	return ep.atomic(fabric.OpCompareSwap, sge, remote, compare, swap, ctx, flags)
}

func (ep *Endpoint) atomic(op fabric.Op, sge fabric.SGE, remote fabric.RemoteIOV, a, b uint64, ctx uint64, flags fabric.MsgFlags) error {
	if !ep.caps.Atomics {
		return opErr(op.String(), fabric.ErrNotSupported)
	}
	if sge.Length != 8 || remote.Addr%8 != 0 {
		return opErr(op.String(), fabric.ErrInvalid)
	}
	ep.life.RLock()
	defer ep.life.RUnlock()
	var m [1]fabric.Message
	var s [1]fabric.SGE
	s[0] = sge
	m[0] = fabric.Message{SGEs: s[:], Remote: remote, Context: ctx, Flags: flags}
	n, err := ep.post(m[:], op, a, b)
	if err == nil && n == 0 {
		err = opErr(op.String(), syscall.EAGAIN)
	}
	return err
}

// SendWait implements fabric.Endpoint.
func (ep *Endpoint) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(msgs) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.swait, func() (int, error) { return ep.post(msgs, fabric.OpSend, 0, 0) })
}

func (ep *Endpoint) fail(s fabric.Status) {
	if ep.failed.Load() {
		return
	}
	ep.sendMu.Lock() // failErr is written under sendMu
	if !ep.failed.Load() {
		ep.failLocked(s)
	}
	ep.sendMu.Unlock()
}

func (ep *Endpoint) failure(op string) error {
	if ep.failed.Load() {
		return opErr(op, ep.failErr)
	}
	return nil
}

// post posts a burst of operations of one kind as one chain. Callers hold
// life shared.
func (ep *Endpoint) post(msgs []fabric.Message, op fabric.Op, a, b uint64) (int, error) {
	if ep.closed.Load() {
		return 0, opErr(op.String(), fabric.ErrClosed)
	}
	if err := ep.failure(op.String()); err != nil {
		return 0, err
	}
	if op != fabric.OpSend && ep.ud {
		return 0, opErr(op.String(), fabric.ErrNotSupported)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	ep.sendMu.Lock()
	defer ep.sendMu.Unlock()
	free := ep.depth - int(ep.head-ep.tail)
	if free < len(msgs) {
		ep.reap()
		free = ep.depth - int(ep.head-ep.tail)
	}
	need := fabric.Access(0)
	if op == fabric.OpRead || op == fabric.OpFetchAdd || op == fabric.OpCompareSwap {
		need = fabric.AccessLocalWrite
	}
	var err error
	n, nsge, bytes := 0, 0, 0
	for n < len(msgs) && n < free {
		m := &msgs[n]
		if len(m.SGEs) > ep.maxSGE {
			err = opErr(op.String(), fabric.ErrMessageSize)
			break
		}
		total, cerr := fabric.CheckSGEs(m.SGEs, ep.dom, need)
		if cerr != nil {
			err = opErr(op.String(), cerr)
			break
		}
		switch op {
		case fabric.OpSend:
			if total > ep.caps.MaxMsgSize {
				err = opErr("send", fabric.ErrMessageSize)
			}
		case fabric.OpWrite, fabric.OpRead:
			if total > ep.caps.MaxRMASize {
				err = opErr(op.String(), fabric.ErrMessageSize)
			} else if m.Remote.Len != 0 && uint64(total) > m.Remote.Len {
				// The same sentinel as the other backends: the message
				// contradicts itself, nothing is out of a region yet.
				err = opErr(op.String(), fmt.Errorf("%d bytes for a remote buffer of %d: %w", total, m.Remote.Len, fabric.ErrInvalid))
			}
		}
		if err != nil {
			break
		}
		seq := ep.head + uint64(n)
		slot := int(seq % uint64(ep.depth))
		w := &ep.swr[n]
		w.wr_id = C.uint64_t(seq)
		w.raddr, w.rkey = C.uint64_t(m.Remote.Addr), C.uint32_t(m.Remote.Key)
		w.compare_add, w.swap = C.uint64_t(a), C.uint64_t(b)
		w.imm = C.uint32_t(m.Imm)
		var flags C.uint32_t
		switch op {
		case fabric.OpSend:
			w.opcode = wrSend
			if m.Flags&fabric.FlagImm != 0 {
				w.opcode = wrSendImm
			}
		case fabric.OpWrite:
			w.opcode = wrWrite
			if m.Flags&fabric.FlagImm != 0 {
				w.opcode = wrWriteImm
			}
		case fabric.OpRead:
			w.opcode = wrRead
		case fabric.OpFetchAdd:
			w.opcode = wrFetchAdd
		case fabric.OpCompareSwap:
			w.opcode = wrCmpSwap
		}
		if m.Flags&fabric.FlagFence != 0 {
			flags |= C.IBV_SEND_FENCE
		}
		user := m.Flags&fabric.FlagSignal != 0
		ep.sinceSig++
		if user || ep.sinceSig >= ep.signal {
			flags |= C.IBV_SEND_SIGNALED
			ep.sinceSig = 0
		}
		// The payload: inline by the device, copied into this slot's
		// bounce buffer, or gathered from the caller's regions.
		w.sge = C.uint32_t(nsge)
		gather := op == fabric.OpSend || op == fabric.OpWrite
		switch {
		case total == 0:
			w.nsge = 0
		case gather && total <= ep.inlineHW:
			flags |= C.IBV_SEND_INLINE
			nsge += ep.fillSGEs(nsge, m.SGEs)
			w.nsge = C.uint32_t(len(m.SGEs))
		case gather && total <= ep.caps.InlineSize:
			off := slot * ep.caps.InlineSize
			fabric.Gather(ep.bounce[off:off+total], m.SGEs)
			s := &ep.sge[nsge]
			s.addr = C.uint64_t(uintptr(unsafe.Pointer(&ep.bounce[off])))
			s.length = C.uint32_t(total)
			s.lkey = ep.bounceMR.lkey
			nsge++
			w.nsge = 1
		default:
			nsge += ep.fillSGEs(nsge, m.SGEs)
			w.nsge = C.uint32_t(len(m.SGEs))
		}
		w.flags = flags
		ep.slots[slot] = sendSlot{ctx: m.Context, op: op, len: total, user: user}
		bytes += total
		n++
	}
	if n == 0 {
		return 0, err
	}
	rc := C.weft_post_send(ep.q, C.int(n))
	posted := int(ep.q.bad)
	if debug {
		fmt.Fprintf(os.Stderr, "verbs %p post %v n=%d rc=%d posted=%d head=%d tail=%d op0=%d flags0=%#x nsge0=%d\n", ep, op, n, rc, posted, ep.head, ep.tail, ep.swr[0].opcode, ep.swr[0].flags, ep.swr[0].nsge)
	}
	ep.head += uint64(posted)
	ep.stats.Doorbells.Add(1)
	ep.stats.TxMessages.Add(uint64(posted))
	ep.stats.TxPackets.Add(uint64(posted))
	ep.stats.TxBytes.Add(uint64(bytes))
	if rc != 0 {
		return posted, errnoErr("ibv_post_send", nil, rc)
	}
	return n, err
}

// fillSGEs copies an SGE list into the C array at index at.
func (ep *Endpoint) fillSGEs(at int, sges []fabric.SGE) int {
	for i := range sges {
		s := &sges[i]
		c := &ep.sge[at+i]
		c.addr = C.uint64_t(s.Region.Addr() + uint64(s.Offset))
		c.length = C.uint32_t(s.Length)
		c.lkey = C.uint32_t(s.Region.LocalKey())
	}
	return len(sges)
}

// reap polls the send completion queue and turns what the caller asked
// for (and every failure) into fabric completions. Callers hold sendMu.
func (ep *Endpoint) reap() int {
	total := 0
	for {
		k := int(C.weft_poll_send(ep.q, 64))
		if k <= 0 {
			return total
		}
		total += k
		for i := 0; i < k; i++ {
			wc := &ep.sout[i]
			seq := uint64(wc.wr_id)
			s := &ep.slots[seq%uint64(ep.depth)]
			if seq+1 > ep.tail {
				ep.tail = seq + 1
			}
			st := mapStatus(uint32(wc.status))
			if debug {
				fmt.Fprintf(os.Stderr, "verbs %p reaped seq=%d status=%d %v\n", ep, seq, wc.status, st)
			}
			if st != fabric.StatusOK && !ep.failed.Load() && st != fabric.StatusFlushed {
				ep.failLocked(st)
			}
			if s.internal || (!s.user && st == fabric.StatusOK) {
				continue
			}
			ep.comp.Push(fabric.Completion{Context: s.ctx, Op: s.op, Status: st, Len: s.len})
		}
		if k < 64 {
			return total
		}
	}
}

// failLocked is fail for callers that hold sendMu.
func (ep *Endpoint) failLocked(s fabric.Status) {
	if debug {
		fmt.Fprintf(os.Stderr, "verbs %p fail %v\n", ep, s)
	}
	ep.failErr = s.Err()
	kind := fabric.EventError
	if errors.Is(ep.failErr, fabric.ErrPeerGone) {
		kind = fabric.EventPeerGone
	}
	// The event is queued before failed is set: a call that sees the
	// endpoint failed finds the event already there.
	select {
	case ep.evs <- fabric.Event{Kind: kind, Time: time.Now(), Err: ep.failErr}:
	default:
		ep.stats.Drops[fabric.DropEvent].Add(1)
	}
	ep.failed.Store(true)
}

func mapStatus(s uint32) fabric.Status {
	switch s {
	case C.IBV_WC_SUCCESS:
		return fabric.StatusOK
	case C.IBV_WC_LOC_LEN_ERR:
		return fabric.StatusLocalLength
	case C.IBV_WC_LOC_PROT_ERR, C.IBV_WC_LOC_ACCESS_ERR, C.IBV_WC_MW_BIND_ERR:
		return fabric.StatusLocalAccess
	case C.IBV_WC_WR_FLUSH_ERR:
		return fabric.StatusFlushed
	case C.IBV_WC_REM_ACCESS_ERR:
		return fabric.StatusRemoteAccess
	case C.IBV_WC_REM_INV_REQ_ERR:
		return fabric.StatusRemoteInvalid
	case C.IBV_WC_RETRY_EXC_ERR:
		return fabric.StatusRetryExceeded
	case C.IBV_WC_RNR_RETRY_EXC_ERR:
		return fabric.StatusRNRRetryExceeded
	case C.IBV_WC_REM_ABORT_ERR:
		return fabric.StatusPeerGone
	}
	return fabric.StatusRemoteOp
}

// keepAlive posts a zero-length RDMA WRITE whenever nothing was posted for
// a period, so that a vanished peer is noticed (retries run out) even by
// an endpoint that only receives.
func (ep *Endpoint) keepAlive(every time.Duration) {
	defer ep.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var last uint64
	probe, probing := uint64(0), false
	for {
		select {
		case <-ep.stop:
			return
		case <-t.C:
		}
		ep.life.RLock()
		if ep.closed.Load() {
			ep.life.RUnlock()
			return
		}
		ep.sendMu.Lock()
		ep.reap()
		if probing && ep.tail > probe {
			probing = false
		}
		// One probe at a time: a second one would only reset the
		// retransmission timer of the first.
		if !probing && !ep.failed.Load() && ep.head == last && int(ep.head-ep.tail) < ep.depth {
			probe, probing = ep.postInternal(), true
			if debug {
				fmt.Fprintf(os.Stderr, "verbs %p keepalive head=%d tail=%d\n", ep, ep.head, ep.tail)
			}
		}
		last = ep.head
		ep.sendMu.Unlock()
		ep.life.RUnlock()
	}
}

// postInternal posts a signaled zero-length RDMA WRITE that is never
// reported. Callers hold sendMu and have checked there is room.
func (ep *Endpoint) postInternal() uint64 {
	seq := ep.head
	w := &ep.swr[0]
	*w = C.struct_weft_swr{wr_id: C.uint64_t(seq), opcode: wrWrite, flags: C.IBV_SEND_SIGNALED}
	ep.slots[seq%uint64(ep.depth)] = sendSlot{internal: true}
	ep.sinceSig = 0
	if C.weft_post_send(ep.q, 1) == 0 {
		ep.head++
		ep.stats.Doorbells.Add(1)
	}
	return seq
}

// ---- receive side ----

// Recv implements fabric.Endpoint.
func (ep *Endpoint) Recv(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.recv(msgs)
}

// RecvWait implements fabric.Endpoint.
func (ep *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(msgs) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.rwait, func() (int, error) { return ep.recv(msgs) })
}

func (ep *Endpoint) recv(msgs []fabric.Message) (int, error) {
	if ep.closed.Load() {
		return 0, opErr("recv", fabric.ErrClosed)
	}
	limit := len(msgs)
	var verr error
	for i := range msgs {
		if _, err := fabric.CheckSGEs(msgs[i].SGEs, ep.dom, fabric.AccessLocalWrite); err != nil {
			limit, verr = i, opErr("recv", err)
			break
		}
	}
	if limit == 0 {
		return 0, verr
	}
	ep.recvMu.Lock()
	out, bytes, flushed := ep.pollRecvLocked(limit, func(i, slot int, data []byte, flags fabric.MsgFlags, imm uint32) {
		m := &msgs[i]
		m.Flags, m.Imm = flags, imm
		if flags&fabric.FlagRemoteWrite != 0 {
			m.Len = len(data)
		} else {
			m.Len = fabric.Scatter(m.SGEs, data)
			if m.Len < len(data) {
				m.Flags |= fabric.FlagTruncated
				ep.stats.Drops[fabric.DropTruncated].Add(1)
			}
		}
		ep.rfree[slot] = true
	})
	ep.recvMu.Unlock()
	return ep.endRecv(out, bytes, flushed, verr)
}

// RecvViews implements fabric.ViewReceiver: each view is a receive slot,
// held (not reposted) until it is released. Held slots are missing from
// the receive queue, so a peer that outruns the releases meets RNR.
func (ep *Endpoint) RecvViews(views []fabric.View) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.recvViews(views)
}

// RecvViewsWait implements fabric.ViewReceiver.
func (ep *Endpoint) RecvViewsWait(ctx context.Context, views []fabric.View) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(views) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.rwait, func() (int, error) { return ep.recvViews(views) })
}

func (ep *Endpoint) recvViews(views []fabric.View) (int, error) {
	if ep.closed.Load() {
		return 0, opErr("recv", fabric.ErrClosed)
	}
	ep.recvMu.Lock()
	want := min(len(views), ep.depth-(ep.vTail-ep.vHead))
	if want == 0 && len(views) > 0 {
		ep.recvMu.Unlock()
		return 0, opErr("recv", fmt.Errorf("all %d receive slots are held by views, release some first: %w", ep.depth, fabric.ErrInvalid))
	}
	out, bytes, flushed := ep.pollRecvLocked(want, func(i, slot int, data []byte, flags fabric.MsgFlags, imm uint32) {
		views[i] = fabric.View{Data: data, Len: len(data), Flags: flags, Imm: imm}
		if flags&fabric.FlagRemoteWrite != 0 {
			views[i].Data = nil
		}
		ep.vq[ep.vTail%ep.depth] = slot
		ep.vTail++
	})
	ep.recvMu.Unlock()
	return ep.endRecv(out, bytes, flushed, nil)
}

// ReleaseViews implements fabric.ViewReceiver: the slots go back to the
// receive queue, in order.
func (ep *Endpoint) ReleaseViews(n int) error {
	if ep.closed.Load() {
		return opErr("release", fabric.ErrClosed)
	}
	ep.recvMu.Lock()
	defer ep.recvMu.Unlock()
	if held := ep.vTail - ep.vHead; n < 0 || n > held {
		return opErr("release", fmt.Errorf("%d views, %d outstanding: %w", n, held, fabric.ErrInvalid))
	}
	for ; n > 0; n-- {
		ep.rfree[ep.vq[ep.vHead%ep.depth]] = true
		ep.vHead++
	}
	ep.repostLocked()
	return nil
}

// OutstandingViews implements fabric.ViewReceiver.
func (ep *Endpoint) OutstandingViews() int {
	ep.recvMu.Lock()
	defer ep.recvMu.Unlock()
	return ep.vTail - ep.vHead
}

// pollRecvLocked polls up to max receive completions and hands each
// successful one to deliver (with its index among the delivered, its
// slot, payload and flags); deliver marks the slot free or holds it.
// Slots given back so far are then reposted.
func (ep *Endpoint) pollRecvLocked(max int, deliver func(i, slot int, data []byte, flags fabric.MsgFlags, imm uint32)) (out, bytes int, flushed bool) {
	k := int(C.weft_poll_recv(ep.q, C.int(min(max, 64))))
	if debug && k != 0 {
		fmt.Fprintf(os.Stderr, "verbs %p recv k=%d status0=%d len0=%d\n", ep, k, ep.rout[0].status, ep.rout[0].byte_len)
	}
	for i := 0; i < k; i++ {
		wc := &ep.rout[i]
		slot := int(wc.wr_id)
		if wc.status != C.IBV_WC_SUCCESS {
			flushed = true
			if st := mapStatus(uint32(wc.status)); st != fabric.StatusFlushed {
				ep.fail(st)
			}
			if slot < ep.depth {
				ep.rfree[slot] = true
			}
			continue
		}
		n := int(wc.byte_len)
		off := 0
		if ep.ud {
			off = udGRH
		}
		if slot >= ep.depth || n > ep.rslot || n < off {
			ep.stats.Drops[fabric.DropMalformed].Add(1)
			if slot < ep.depth {
				ep.rfree[slot] = true
			}
			continue
		}
		end := slot*ep.rslot + n
		data := ep.rbuf[slot*ep.rslot+off : end : end]
		var flags fabric.MsgFlags
		if wc.opcode == C.IBV_WC_RECV_RDMA_WITH_IMM {
			flags = fabric.FlagRemoteWrite
		}
		if wc.wc_flags&C.IBV_WC_WITH_IMM != 0 {
			flags |= fabric.FlagImm
		}
		deliver(out, slot, data, flags, uint32(wc.imm))
		bytes += len(data)
		out++
	}
	if k > 0 && !flushed {
		ep.repostLocked()
	}
	return out, bytes, flushed
}

// repostLocked reposts, as one chain, the run of given-back slots that
// starts at the oldest consumed one: the receive queue completes in
// order, so that is where the next post must start.
func (ep *Endpoint) repostLocked() {
	if ep.failed.Load() {
		return
	}
	d := uint32(ep.depth)
	first := ep.rposted % d
	n := 0
	for n < ep.depth && ep.rfree[(first+uint32(n))%d] {
		n++
	}
	if n == 0 {
		return
	}
	if rc := C.weft_post_recv(ep.q, C.uint32_t(first), C.int(n)); rc == 0 {
		for i := 0; i < n; i++ {
			ep.rfree[(first+uint32(i))%d] = false
		}
		ep.rposted += uint32(n)
	}
}

// endRecv counts a receive burst and turns a flushed queue into the
// endpoint's failure.
func (ep *Endpoint) endRecv(out, bytes int, flushed bool, verr error) (int, error) {
	if out > 0 {
		ep.stats.RxMessages.Add(uint64(out))
		ep.stats.RxPackets.Add(uint64(out))
		ep.stats.RxBytes.Add(uint64(bytes))
		return out, nil
	}
	if flushed && !ep.failed.Load() {
		// Receives are flushed when the queue pair is in the error
		// state: find out why from the send side.
		ep.sendMu.Lock()
		ep.reap()
		if !ep.failed.Load() {
			if ep.cmid != nil {
				// Only a disconnection moves an rdma_cm queue pair to
				// the error state without a failed work request: the
				// peer's DREQ (librdmacm flushes on it), seen here
				// before watchCM reports it.
				ep.failLocked(fabric.StatusPeerClosed)
			} else {
				ep.failLocked(fabric.StatusFlushed)
			}
		}
		ep.sendMu.Unlock()
	}
	if err := ep.failure("recv"); err != nil {
		return 0, err
	}
	return 0, verr
}

// block runs try until it makes progress: busy-polling for the spin
// budget, then sleeping on w's completion channel. Callers hold life
// shared.
func (ep *Endpoint) block(ctx context.Context, w *waiter, try func() (int, error)) (int, error) {
	if ep.spin > 0 {
		deadline := time.Now().Add(ep.spin)
		for i := 0; ; i++ {
			if n, err := try(); n > 0 || err != nil {
				return n, err
			}
			if i&63 == 63 {
				if ctx.Err() != nil || time.Now().After(deadline) {
					break
				}
			}
		}
	}
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		if ep.closed.Load() {
			return 0, opErr("wait", fabric.ErrClosed)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		C.weft_req_notify(w.cq)
		if n, err := try(); n > 0 || err != nil {
			return n, err
		}
		if stop == nil {
			stop = context.AfterFunc(ctx, func() { w.file.SetReadDeadline(time.Unix(1, 0)) })
		}
		w.file.SetReadDeadline(time.Now().Add(waitSlice))
		err := w.rc.Read(func(uintptr) bool { return C.weft_get_event(w.ch) != 0 })
		ep.stats.Wakeups.Add(1)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			if ep.closed.Load() || errors.Is(err, os.ErrClosed) {
				return 0, opErr("wait", fabric.ErrClosed)
			}
			return 0, opErr("wait", err)
		}
	}
}

// ---- completions, caps, stats, events ----

type compQueue struct{ ep *Endpoint }

// Poll implements fabric.CompletionQueue.
func (c compQueue) Poll(out []fabric.Completion) int {
	ep := c.ep
	ep.life.RLock()
	defer ep.life.RUnlock()
	if !ep.closed.Load() {
		ep.sendMu.Lock()
		ep.reap()
		ep.sendMu.Unlock()
	}
	return ep.comp.Poll(out)
}

// Wait implements fabric.CompletionQueue.
func (c compQueue) Wait(ctx context.Context, out []fabric.Completion) (int, error) {
	ep := c.ep
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(out) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.swait, func() (int, error) {
		if ep.closed.Load() {
			return 0, opErr("wait", fabric.ErrClosed)
		}
		if ep.comp.Len() == 0 {
			ep.sendMu.Lock()
			ep.reap()
			ep.sendMu.Unlock()
		}
		return ep.comp.Poll(out), nil
	})
}

// Len implements fabric.CompletionQueue.
func (c compQueue) Len() int { return c.ep.comp.Len() }

// CQ implements fabric.Endpoint.
func (ep *Endpoint) CQ() fabric.CompletionQueue { return ep.cqi }

// Caps implements fabric.Endpoint.
func (ep *Endpoint) Caps() fabric.Caps { return ep.caps }

// Stats implements fabric.Endpoint.
func (ep *Endpoint) Stats() fabric.Stats {
	s := ep.stats.Snapshot()
	s.Drops[fabric.DropNoBuffer] += ep.comp.Overruns.Load()
	return s
}

// Events implements fabric.Endpoint.
func (ep *Endpoint) Events() <-chan fabric.Event { return ep.evs }

// LocalAddr implements fabric.Endpoint: the local end of the exchange
// that set the endpoint up; for rdma_cm endpoints rdmacm://IP:PORT, the
// rdma_cm id's address.
func (ep *Endpoint) LocalAddr() string { return ep.laddr }

// RemoteAddr implements fabric.Endpoint: the exchange address dialled, or
// the peer's end of an accepted exchange; for rdma_cm endpoints
// rdmacm://IP:PORT, the peer's address (a dialled endpoint's dials the
// listener again).
func (ep *Endpoint) RemoteAddr() string { return ep.raddr }

// Close implements fabric.Endpoint. An RC endpoint first waits (at most
// two seconds) until what it sent is acknowledged, as a TCP close
// delivers what was written; then it destroys the queue pair and releases
// every region still registered.
func (ep *Endpoint) Close() error {
	ep.once.Do(func() {
		ep.closed.Store(true)
		close(ep.stop)
		for _, w := range []*waiter{&ep.swait, &ep.rwait} {
			if w.file != nil {
				w.file.Close() // wakes sleepers
			}
		}
		if ep.comp != nil {
			ep.comp.Close()
		}
		ep.wg.Wait()
		ep.life.Lock()
		defer ep.life.Unlock()
		ep.linger()
		ep.disconnectCM()
		ep.destroy()
	})
	return nil
}

// linger waits until the work requests posted so far have completed, by
// posting a signaled marker behind them (the send queue completes in
// order).
func (ep *Endpoint) linger() {
	if ep.ud || ep.qp == nil || ep.q == nil || ep.failed.Load() || ep.peer.QPN == 0 {
		return
	}
	ep.sendMu.Lock()
	defer ep.sendMu.Unlock()
	if ep.head == ep.tail {
		return
	}
	deadline := time.Now().Add(lingerTime)
	for int(ep.head-ep.tail) >= ep.depth {
		ep.reap()
		if ep.failed.Load() || time.Now().After(deadline) {
			return
		}
	}
	marker := ep.postInternal()
	for ep.tail <= marker && !ep.failed.Load() && time.Now().Before(deadline) {
		if ep.reap() == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// destroy releases every device object that exists, in dependency order.
func (ep *Endpoint) destroy() {
	if ep.qp != nil {
		if ep.cmid != nil {
			C.rdma_destroy_qp(ep.cmid)
		} else {
			C.weft_qp_err(ep.qp)
			C.ibv_destroy_qp(ep.qp)
		}
		ep.qp = nil
	}
	if ep.ah != nil {
		C.ibv_destroy_ah(ep.ah)
		ep.ah = nil
	}
	ep.regMu.Lock()
	for mr, rec := range ep.regs {
		rec.release()
		delete(ep.regs, mr)
	}
	ep.regMu.Unlock()
	if ep.rmr != nil {
		C.ibv_dereg_mr(ep.rmr)
		ep.rmr = nil
	}
	if ep.bounceMR != nil {
		C.ibv_dereg_mr(ep.bounceMR)
		ep.bounceMR = nil
	}
	if ep.rbuf != nil {
		if ep.vTail > 0 {
			// Views may still point here: leave the range mapped, as
			// private anonymous memory, so a stale one reads zeros
			// instead of faulting.
			retire(ep.rbuf)
		} else {
			unix.Munmap(ep.rbuf)
		}
		ep.rbuf = nil
	}
	if ep.bounce != nil {
		unix.Munmap(ep.bounce)
		ep.bounce = nil
	}
	for _, w := range []*waiter{&ep.swait, &ep.rwait} {
		if w.file != nil {
			w.file.Close()
		}
	}
	if ep.scq != nil {
		C.ibv_destroy_cq(ep.scq)
		ep.scq = nil
	}
	if ep.rcq != nil {
		C.ibv_destroy_cq(ep.rcq)
		ep.rcq = nil
	}
	if ep.sch != nil {
		C.ibv_destroy_comp_channel(ep.sch)
		ep.sch = nil
	}
	if ep.rch != nil {
		C.ibv_destroy_comp_channel(ep.rch)
		ep.rch = nil
	}
	if ep.pd != nil {
		C.ibv_dealloc_pd(ep.pd)
		ep.pd = nil
	}
	if ep.ctx != nil && ep.cmid == nil { // an rdma_cm id's context is librdmacm's
		C.ibv_close_device(ep.ctx)
	}
	ep.ctx = nil
	if ep.q != nil {
		C.weft_q_free(ep.q)
		ep.q = nil
	}
	ep.destroyCM()
}

// nop crosses into C and back, for the binding benchmark.
// retire replaces a mapping in place with private anonymous memory that
// reserves nothing; it unmaps b if that fails.
func retire(b []byte) {
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Munmap(b)
	}
}

func (ep *Endpoint) nop() int { return int(C.weft_nop(ep.q)) }

// cgoNop crosses into C and back with no endpoint: the bare cost of a cgo
// call.
func cgoNop() int { return int(C.weft_nop(nil)) }

// newDryEndpoint returns an endpoint with the send path's C memory but no
// device: post builds work request chains without posting them and
// nothing completes. It measures the binding's own cost per operation on
// hosts without RDMA (BenchmarkBindingPost).
func newDryEndpoint(depth, maxSGE, inline int) *Endpoint {
	ep := &Endpoint{depth: depth, maxSGE: maxSGE, signal: max(depth/4, 1), stop: make(chan struct{}),
		regs: map[*C.struct_ibv_mr]*mrec{}, evs: make(chan fabric.Event, 1)}
	ep.q = C.weft_q_new(C.int(depth), C.int(maxSGE), C.int(depth), 64)
	ep.swr = unsafe.Slice(ep.q.swr, depth)
	ep.sge = unsafe.Slice(ep.q.sge, depth*maxSGE)
	ep.sout = unsafe.Slice(ep.q.sout, 64)
	ep.slots = make([]sendSlot, depth)
	ep.comp = cq.New(0, 0)
	ep.dom = &fabric.Domain{Name: "verbs:dry"}
	ep.bounce = make([]byte, depth*inline)
	ep.bounceMR = (*C.struct_ibv_mr)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_ibv_mr{}))))
	ep.caps = fabric.Caps{MaxMsgSize: 1 << 20, MaxSGEs: maxSGE, InlineSize: inline, MaxRMASize: 1 << 30, RMA: true}
	return ep
}

// dryRegion is a region of the dry endpoint's domain (never registered).
func (ep *Endpoint) dryRegion(buf []byte) *fabric.Region {
	return fabric.NewRegion(fabric.RegionConfig{Buf: buf, Access: fabric.AccessLocalWrite, LocalKey: 1,
		Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), Domain: ep.dom})
}

// dryComplete marks everything posted as completed.
func (ep *Endpoint) dryComplete() { ep.tail = ep.head }

func (ep *Endpoint) freeDry() {
	C.free(unsafe.Pointer(ep.bounceMR))
	C.weft_q_free(ep.q)
}
