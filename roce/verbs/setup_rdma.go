//go:build linux && cgo && rdma

package verbs

// Set-up: the device, port and GID, the protection domain, completion
// channels and queues, the queue pair and its C work queue, and the
// transitions that connect the queue pair to its peer.

/*
#include "weft_cm.h"
#include <fcntl.h>

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
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/cq"
)

// setup owns the device objects set-up creates: the device context,
// protection domain, completion channels and queues, queue pair, address
// handle (UD) and the C work queue, with the sizes they were made with.
type setup struct {
	dev      DeviceInfo
	port     uint8
	sgid     int
	ctx      *C.struct_ibv_context
	pd       *C.struct_ibv_pd
	sch, rch *C.struct_ibv_comp_channel
	scq, rcq *C.struct_ibv_cq
	qp       *C.struct_ibv_qp
	ah       *C.struct_ibv_ah
	q        *C.struct_weft_q
	ud       bool
	depth    int
	maxSGE   int
	inlineHW int // device inline limit
}

// waiter sleeps on a completion channel through Go's poller.
type waiter struct {
	ch   *C.struct_ibv_comp_channel
	cq   *C.struct_ibv_cq
	file *os.File
	rc   syscall.RawConn
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

// openDevice opens the chosen device.
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

// portGID finds the endpoint's port and its GID. An rdma_cm id's
// address (cm true) stands in for a GID missing from the table.
func (ep *Endpoint) portGID(cm bool) (*PortInfo, [16]byte, error) {
	var sgid [16]byte
	var pinfo *PortInfo
	for i := range ep.dev.Ports {
		if ep.dev.Ports[i].Num == ep.port {
			pinfo = &ep.dev.Ports[i]
		}
	}
	if pinfo == nil {
		return nil, sgid, fmt.Errorf("verbs: %s has no port %d: %w", ep.dev.Name, ep.port, fabric.ErrInvalid)
	}
	for _, g := range pinfo.GIDs {
		if g.Index == ep.sgid {
			sgid = g.GID
		}
	}
	if sgid == ([16]byte{}) && cm {
		sgid = ep.local.GID // the id's address, as a GID (cmDevice)
	}
	if sgid == ([16]byte{}) {
		return nil, sgid, fmt.Errorf("verbs: %s port %d has no GID %d: %w", ep.dev.Name, ep.port, ep.sgid, fabric.ErrInvalid)
	}
	return pinfo, sgid, nil
}

// size settles the MTU (the options', or the port's active one up to
// 4096), the queue depth, SGE count, signalling interval and spin
// budget, and returns the MTU, the largest message and the inline size.
func (ep *Endpoint) size(pinfo *PortInfo) (mtu, maxMsg, inline int) {
	o := ep.o
	mtu = o.MTU
	if mtu == 0 {
		mtu = min(pinfo.ActiveMTU, 4096)
	}
	if mtuEnum(mtu) == 0 {
		mtu = 1024
	}
	ep.o.MTU = mtu

	ep.depth = o.Depth
	if ep.depth <= 0 {
		ep.depth = DefaultDepth
	}
	if ep.dev.MaxQPWR > 0 {
		ep.depth = min(ep.depth, ep.dev.MaxQPWR)
	}
	ep.maxSGE = min(maxSGEs, max(ep.dev.MaxSGE, 1))
	maxMsg = o.MaxMsg
	if maxMsg <= 0 {
		maxMsg = DefaultMaxMsg
	}
	if ep.ud {
		maxMsg = min(maxMsg, mtu)
	}
	inline = o.Inline
	if inline <= 0 {
		inline = DefaultInline
	}
	inline = max(min(inline, maxMsg), 512)
	ep.signal = o.Signal
	if ep.signal <= 0 || ep.signal > ep.depth/2 {
		ep.signal = max(ep.depth/4, 1)
	}
	ep.spin = (&fabric.Options{Spin: o.Spin}).SpinBudget()
	return mtu, maxMsg, inline
}

// openQueues opens the device (unless an rdma_cm id brought its context)
// and creates the protection domain and, for each direction, a
// completion channel, a completion queue and the waiter on them.
func (ep *Endpoint) openQueues(id *C.struct_rdma_cm_id) error {
	if id == nil {
		if err := ep.openDevice(); err != nil {
			return err
		}
	}
	var err error
	ep.dom = &fabric.Domain{Name: "verbs:" + ep.dev.Name}
	ep.pd, err = C.ibv_alloc_pd(ep.ctx)
	if ep.pd == nil {
		return errnoErr("ibv_alloc_pd", err, 0)
	}
	if ep.sch, err = C.ibv_create_comp_channel(ep.ctx); ep.sch == nil {
		return errnoErr("ibv_create_comp_channel", err, 0)
	}
	if ep.rch, err = C.ibv_create_comp_channel(ep.ctx); ep.rch == nil {
		return errnoErr("ibv_create_comp_channel", err, 0)
	}
	if ep.scq, err = C.ibv_create_cq(ep.ctx, C.int(ep.depth+1), nil, ep.sch, 0); ep.scq == nil {
		return errnoErr("ibv_create_cq", err, 0)
	}
	if ep.rcq, err = C.ibv_create_cq(ep.ctx, C.int(ep.depth+1), nil, ep.rch, 0); ep.rcq == nil {
		return errnoErr("ibv_create_cq", err, 0)
	}
	if err := ep.swait.init(ep.sch, ep.scq); err != nil {
		return err
	}
	return ep.rwait.init(ep.rch, ep.rcq)
}

// createQP creates the queue pair (on the rdma_cm id, if there is one)
// and the C work queue over it, and sizes the send and receive state.
func (ep *Endpoint) createQP(id *C.struct_rdma_cm_id) error {
	var err error
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
		return errnoErr("ibv_create_qp", err, 0)
	}
	ep.inlineHW = int(gotInline)
	if ep.q = C.weft_q_new(C.int(ep.depth), C.int(ep.maxSGE), C.int(ep.depth), 64); ep.q == nil {
		return opErr("alloc", syscall.ENOMEM)
	}
	ep.q.qp, ep.q.scq, ep.q.rcq = ep.qp, ep.scq, ep.rcq
	ep.swr = unsafe.Slice(ep.q.swr, ep.depth)
	ep.sge = unsafe.Slice(ep.q.sge, ep.depth*ep.maxSGE)
	ep.sout = unsafe.Slice(ep.q.sout, 64)
	ep.rout = unsafe.Slice(ep.q.rout, 64)
	ep.slots = make([]sendSlot, ep.depth)
	ep.comp = cq.New(0, ep.spin)
	ep.cqi = compQueue{ep}
	return nil
}

// startQP moves a queue pair of our own to INIT (rdma_create_qp left an
// rdma_cm one there) and posts the whole receive ring.
func (ep *Endpoint) startQP(id *C.struct_rdma_cm_id) error {
	ud := C.int(0)
	if ep.ud {
		ud = 1
	}
	if id == nil { // rdma_create_qp left it in INIT
		if rc := C.weft_qp_init(ep.qp, C.uint8_t(ep.port), C.uint32_t(ep.o.QKey), ud); rc != 0 {
			return errnoErr("ibv_modify_qp(INIT)", nil, rc)
		}
	}
	// Receives go up before the peer learns our QPN, so its first send
	// finds a buffer.
	if rc := C.weft_post_recv(ep.q, 0, C.int(ep.depth)); rc != 0 {
		return errnoErr("ibv_post_recv", nil, rc)
	}
	ep.rposted = uint32(ep.depth)
	ep.rfree = make([]bool, ep.depth)
	ep.vq = make([]int, ep.depth)
	return nil
}

// init makes the channel non-blocking and registers a duplicate of its
// descriptor with Go's poller.
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
