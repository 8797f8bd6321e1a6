//go:build linux && cgo && rdma

package verbs

// rdma_cm through librdmacm: rdmacm:// addresses (Connect with o.CM) and
// the backend's fabric.Listener. Every rdma_cm id has an event channel
// of its own, whose descriptor waits in Go's poller like the completion
// channels; a listener moves each connection request's new id onto a
// fresh channel (rdma_migrate_id), so that accepted endpoints are
// independent of the listener and of each other.

/*
#include "weft_cm.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/acceptq"
	"github.com/weft-io/weft/roce/cm"
)

const (
	// cmResolveTime bounds address and route resolution (as rping's
	// 2000 ms), within the caller's context.
	cmResolveTime = 2 * time.Second
	// cmDisconnectTime bounds how long Close waits for the peer's DREP,
	// as the engine's rdma_cm endpoints do.
	cmDisconnectTime = 2 * time.Second
	// cmMaxRd caps the RDMA READ and atomic depths offered and asked for
	// by default (the device's maxima above it).
	cmMaxRd = 16
)

// cmChannel is an rdma_cm event channel, non-blocking, its descriptor
// registered with Go's poller through a duplicate.
type cmChannel struct {
	ch   *C.struct_rdma_event_channel
	file *os.File
	rc   syscall.RawConn
}

// cmEvent is a copy of an rdma_cm event (acknowledged already).
type cmEvent struct {
	kind     C.int
	status   int
	id       *C.struct_rdma_cm_id
	qpn      uint32
	rr       uint8 // responder resources the peer asks of us (its initiator depth)
	depth    uint8 // initiator depth the peer allows us (its responder resources)
	rnr      uint8
	data     []byte // private data
	listenID *C.struct_rdma_cm_id
}

func newCMChannel() (*cmChannel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, cmCallErr("rdma_create_event_channel", err)
	}
	c := &cmChannel{ch: ch}
	if err := unix.SetNonblock(int(ch.fd), true); err != nil {
		c.close()
		return nil, opErr("fcntl", err)
	}
	fd, err := unix.Dup(int(ch.fd))
	if err != nil {
		c.close()
		return nil, opErr("dup", err)
	}
	unix.CloseOnExec(fd)
	c.file = os.NewFile(uintptr(fd), "rdma_cm")
	if c.rc, err = c.file.SyscallConn(); err != nil {
		c.close()
		return nil, opErr("rdma_cm channel", err)
	}
	return c, nil
}

// next waits for the channel's next event. It returns ctx's error when
// ctx ends first, and an error matching os.ErrClosed once stop closed the
// channel's descriptor. One goroutine at a time calls it.
func (c *cmChannel) next(ctx context.Context) (cmEvent, error) {
	var ev C.struct_weft_cm_ev
	c.file.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { c.file.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var got C.int
	var gerr error
	err := c.rc.Read(func(uintptr) bool {
		got, gerr = C.weft_cm_get_event(c.ch, &ev)
		return got != 0
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cmEvent{}, cerr
		}
		return cmEvent{}, err
	}
	if got < 0 {
		return cmEvent{}, opErr("rdma_get_cm_event", gerr)
	}
	e := cmEvent{kind: C.int(ev.event), status: int(ev.status), id: ev.id, listenID: ev.listen_id, qpn: uint32(ev.qp_num),
		rr: uint8(ev.resp_res), depth: uint8(ev.init_depth), rnr: uint8(ev.rnr)}
	if n := int(ev.pdata_len); n > 0 {
		e.data = C.GoBytes(unsafe.Pointer(&ev.pdata[0]), C.int(n))
	}
	return e, nil
}

// stop wakes and ends next for good.
func (c *cmChannel) stop() {
	if c.file != nil {
		c.file.Close()
	}
}

// close releases the channel; every id on it must be destroyed first.
func (c *cmChannel) close() {
	c.stop()
	if c.ch != nil {
		C.rdma_destroy_event_channel(c.ch)
		c.ch = nil
	}
}

func eventName(kind C.int) string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(kind)))
}

// cmCallErr wraps the failure of a librdmacm call.
func cmCallErr(op string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return opErr(op, err)
	}
	if s := errnoSentinel(errno); s != nil {
		return opErr(op, fmt.Errorf("%w (%w)", s, errno))
	}
	return opErr(op, errno)
}

// eventErr is the error of an event that ended a handshake.
func eventErr(ev cmEvent) error {
	if ev.kind == C.RDMA_CM_EVENT_REJECTED {
		// Under InfiniBand and RoCE the status is the REJ's reason.
		return &cm.RejectError{Reason: cm.RejectReason(ev.status), PrivateData: ev.data}
	}
	if ev.kind == C.RDMA_CM_EVENT_DISCONNECTED {
		return fmt.Errorf("verbs: %s during the handshake: %w", eventName(ev.kind), fabric.ErrPeerGone)
	}
	return &CMError{Event: eventName(ev.kind), Status: ev.status}
}

// await waits for the event want on c; any other event but those of
// ignore ends the wait with its error.
func (c *cmChannel) await(ctx context.Context, want C.int) (cmEvent, error) {
	for {
		ev, err := c.next(ctx)
		if err != nil {
			return ev, err
		}
		switch ev.kind {
		case want:
			return ev, nil
		case C.RDMA_CM_EVENT_ADDR_CHANGE, C.RDMA_CM_EVENT_TIMEWAIT_EXIT:
			continue
		}
		if ev.status == 0 && ev.kind != C.RDMA_CM_EVENT_REJECTED && ev.kind != C.RDMA_CM_EVENT_DISCONNECTED {
			ev.status = -int(syscall.EPROTO)
		}
		return ev, eventErr(ev)
	}
}

// cmAddr turns an address and port of an id into an rdmacm:// string.
func cmAddr(id *C.struct_rdma_cm_id, peer bool) (netip.AddrPort, string) {
	var ip [16]byte
	var port C.uint16_t
	p := C.int(0)
	if peer {
		p = 1
	}
	if C.weft_cm_addr(id, p, (*C.uint8_t)(unsafe.Pointer(&ip[0])), &port) == 0 {
		return netip.AddrPort{}, ""
	}
	ap := netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), uint16(port))
	return ap, cm.Scheme + ap.String()
}

func resolveTimeout(ctx context.Context) C.int {
	d := cmResolveTime
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	return C.int(max(d, 10*time.Millisecond) / time.Millisecond)
}

// cmConn owns an endpoint's rdma_cm state: the id owns the queue pair
// and the device context; the channel carries the id's events.
type cmConn struct {
	cmid     *C.struct_rdma_cm_id
	cmch     *cmChannel
	peerData []byte        // the peer's private data
	cmGone   chan struct{} // closed when the connection is disconnected
	cmDone   chan struct{} // closed when watchCM returns; nil if it never ran
}

// cmDevice takes the device, port and local address of the endpoint's
// rdma_cm id.
func (ep *Endpoint) cmDevice() error {
	id := ep.cmid
	if id.verbs == nil {
		return fmt.Errorf("%w: the rdma_cm id is bound to no device", ErrNoDevice)
	}
	d := id.verbs.device
	info, err := queryContext(DeviceInfo{Name: C.GoString(C.ibv_get_device_name(d)), GUID: uint64(C.ibv_get_device_guid(d))}, id.verbs)
	if err != nil {
		return err
	}
	ep.dev, ep.ctx, ep.port, ep.sgid = info, id.verbs, uint8(id.port_num), -1
	local, _ := cmAddr(id, false)
	if local.IsValid() {
		ep.local.GID = [16]byte(local.Addr().As16())
		if _, _, idx, err := FindGID([]DeviceInfo{info}, "", local.Addr()); err == nil {
			ep.sgid = idx
		}
	}
	return nil
}

// rdDepths returns the responder resources and initiator depth to offer:
// the options', or the device's maxima (at most cmMaxRd). Accepting
// (accepting true), the initiator depth is bounded by the responder
// resources the peer offers (peerDepth).
func (ep *Endpoint) rdDepths(accepting bool, peerDepth uint8) (rr, depth uint8) {
	rr, depth = ep.o.RespRes, ep.o.InitDepth
	if rr == 0 {
		rr = uint8(min(cmMaxRd, max(ep.dev.MaxQPRdAtom, 1)))
	}
	if depth == 0 {
		depth = uint8(min(cmMaxRd, max(ep.dev.MaxQPInitRdAtom, 1)))
	}
	rr = uint8(min(int(rr), max(ep.dev.MaxQPRdAtom, 1)))
	depth = uint8(min(int(depth), max(ep.dev.MaxQPInitRdAtom, 1)))
	if accepting {
		depth = min(depth, peerDepth)
	}
	return rr, depth
}

// established finishes an endpoint whose connection is up: addresses,
// path MTU, the peer's private data and QPN, the watcher of its events
// and the keep-alive.
func (ep *Endpoint) established(ev cmEvent) {
	_, ep.laddr = cmAddr(ep.cmid, false)
	pa, raddr := cmAddr(ep.cmid, true)
	ep.raddr = raddr
	ep.peerData = ev.data
	ep.peer = Dest{QPN: ev.qpn}
	if pa.IsValid() {
		ep.peer.GID = [16]byte(pa.Addr().As16())
	}
	if m := int(C.weft_qp_path_mtu(ep.qp)); m > 0 {
		ep.caps.MTU = 128 << m
		ep.o.MTU = ep.caps.MTU
	}
	ep.cmGone = make(chan struct{})
	ep.cmDone = make(chan struct{})
	go ep.watchCM()
	if ep.o.KeepAlive > 0 {
		ep.wg.Add(1)
		go ep.keepAlive(ep.o.KeepAlive)
	}
}

// watchCM follows the events of an established connection: a
// disconnection (the peer's DREQ, or ours) or the device's removal is
// the peer's loss, reported as fabric.ErrPeerGone and EventPeerGone
// unless the endpoint is closing.
func (ep *Endpoint) watchCM() {
	defer close(ep.cmDone)
	gone := false
	for {
		ev, err := ep.cmch.next(context.Background())
		if err != nil {
			return // Close stopped the channel
		}
		if debug {
			fmt.Fprintf(os.Stderr, "verbs %p cm event %s status %d\n", ep, eventName(ev.kind), ev.status)
		}
		switch ev.kind {
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			if gone {
				continue
			}
			gone = true
			close(ep.cmGone)
			if ep.closed.Load() {
				continue
			}
			if ev.kind == C.RDMA_CM_EVENT_DISCONNECTED {
				ep.fail(fabric.StatusPeerClosed) // the peer's DREQ: it disconnected
			} else {
				ep.fail(fabric.StatusPeerGone)
			}
			// Flush what is posted, so that waiters wake with it.
			if ep.life.TryRLock() {
				if !ep.closed.Load() && ep.qp != nil {
					C.weft_qp_err(ep.qp)
				}
				ep.life.RUnlock()
			}
		}
	}
}

// disconnectCM sends the DREQ (rdma_disconnect, which also moves the
// queue pair to the error state) and waits a while for the answer, then
// stops the watcher. Close calls it with life held.
func (ep *Endpoint) disconnectCM() {
	if ep.cmid == nil || ep.cmDone == nil {
		return
	}
	select {
	case <-ep.cmGone:
	default:
		if C.rdma_disconnect(ep.cmid) == 0 {
			select {
			case <-ep.cmGone:
			case <-time.After(cmDisconnectTime):
			}
		}
	}
	ep.cmch.stop()
	<-ep.cmDone
}

// destroyCM releases the rdma_cm id (after its queue pair) and channel.
func (ep *Endpoint) destroyCM() {
	if ep.cmid != nil {
		C.rdma_destroy_id(ep.cmid)
		ep.cmid = nil
	}
	if ep.cmch != nil {
		ep.cmch.close()
		ep.cmch = nil
	}
}

// PeerPrivateData returns the private data the peer sent with its
// connect (to an accepted endpoint) or accept (to a dialled one), as
// librdmacm delivers it: the transport may pad it with zeros (a REP's
// private data is 196 bytes). It is nil for other endpoints.
func (ep *Endpoint) PeerPrivateData() []byte { return ep.peerData }

func privateData(o *Options) (unsafe.Pointer, C.uint8_t) {
	if o.PrivateData == "" {
		return nil, 0
	}
	b := C.CBytes([]byte(o.PrivateData))
	return b, C.uint8_t(len(o.PrivateData))
}

// connectCM opens an endpoint at an rdma_cm address: dialled like
// rdma_connect or, with "listen:", the one connection accepted by a
// listener that closes behind it.
func connectCM(ctx context.Context, o Options) (*Endpoint, error) {
	if o.Listen {
		l, err := ListenCM(ctx, o, fabric.Options{Backlog: 1, HandshakeTimeout: time.Hour})
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ep, err := l.Accept(ctx)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
			return nil, err
		}
		return ep.(*Endpoint), nil
	}
	dst, err := cm.ResolveAddr(ctx, o.Bootstrap)
	if err != nil {
		return nil, err
	}
	ch, err := newCMChannel()
	if err != nil {
		return nil, err
	}
	var id *C.struct_rdma_cm_id
	if rc, err := C.rdma_create_id(ch.ch, &id, nil, C.RDMA_PS_TCP); rc != 0 {
		ch.close()
		return nil, cmCallErr("rdma_create_id", err)
	}
	owned := false
	defer func() {
		if !owned {
			C.rdma_destroy_id(id)
			ch.close()
		}
	}()
	src := o.Local.As16()
	dip := dst.Addr().As16()
	hasSrc := C.int(0)
	if o.Local.IsValid() {
		hasSrc = 1
	}
	if rc, err := C.weft_cm_resolve_addr(id, hasSrc, (*C.uint8_t)(unsafe.Pointer(&src[0])), (*C.uint8_t)(unsafe.Pointer(&dip[0])),
		C.uint16_t(dst.Port()), resolveTimeout(ctx)); rc != 0 {
		return nil, cmCallErr("rdma_resolve_addr", err)
	}
	if _, err := ch.await(ctx, C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return nil, err
	}
	if rc, err := C.rdma_resolve_route(id, resolveTimeout(ctx)); rc != 0 {
		return nil, cmCallErr("rdma_resolve_route", err)
	}
	if _, err := ch.await(ctx, C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return nil, err
	}
	if o.Timeout != 0 {
		if rc, err := C.weft_cm_ack_timeout(id, C.uint8_t(o.Timeout)); rc != 0 {
			return nil, cmCallErr("rdma_set_option(ACK_TIMEOUT)", err)
		}
	}
	owned = true
	ep, err := newEndpoint(o, id, ch)
	if err != nil {
		return nil, err
	}
	rr, depth := ep.rdDepths(false, 0)
	pd, n := privateData(&o)
	rc, cerr := C.weft_cm_connect(id, pd, n, C.uint8_t(rr), C.uint8_t(depth), C.uint8_t(o.Retry), C.uint8_t(o.RNRRetry))
	C.free(pd)
	if rc != 0 {
		ep.Close()
		return nil, cmCallErr("rdma_connect", cerr)
	}
	ev, err := ch.await(ctx, C.RDMA_CM_EVENT_ESTABLISHED)
	if err != nil {
		ep.Close()
		return nil, err
	}
	ep.established(ev)
	return ep, nil
}

// cmListener is the verbs backend's fabric.Listener (see driver.Listen).
type cmListener struct {
	o     Options
	ch    *cmChannel
	id    *C.struct_rdma_cm_id
	q     *acceptq.Queue
	addr  string
	limit time.Duration
	wg    sync.WaitGroup
	once  sync.Once
}

// ListenCM starts a fabric.Listener on o.Bootstrap, the local rdma_cm
// HOST:PORT (port 0: one the rdma_cm picks, which Addr reports), like
// rdma_bind_addr + rdma_listen. Each connection request is accepted in
// the background (rdma_accept, with o's private data and the RDMA READ
// depths negotiated down to the request's) and queued in an
// internal/acceptq until Accept takes it; a request past fo's backlog is
// rejected (rdma_reject), which the dialer sees as fabric.ErrRefused.
func ListenCM(ctx context.Context, o Options, fo fabric.Options) (fabric.Listener, error) {
	ap, err := cm.ResolveAddr(ctx, o.Bootstrap)
	if err != nil {
		return nil, err
	}
	if len(o.PrivateData) > cm.UserREPPrivateDataSize {
		return nil, fmt.Errorf("verbs: data: %d bytes, at most %d fit an accept: %w", len(o.PrivateData), cm.UserREPPrivateDataSize, fabric.ErrInvalid)
	}
	ch, err := newCMChannel()
	if err != nil {
		return nil, err
	}
	l := &cmListener{o: o, ch: ch, limit: fo.HandshakeLimit()}
	if rc, err := C.rdma_create_id(ch.ch, &l.id, nil, C.RDMA_PS_TCP); rc != 0 {
		ch.close()
		return nil, cmCallErr("rdma_create_id", err)
	}
	ip := ap.Addr().As16()
	if rc, err := C.weft_cm_bind(l.id, (*C.uint8_t)(unsafe.Pointer(&ip[0])), C.uint16_t(ap.Port())); rc != 0 {
		l.destroy()
		return nil, cmCallErr("rdma_bind_addr", err)
	}
	if rc, err := C.rdma_listen(l.id, C.int(fo.BacklogSize())); rc != 0 {
		l.destroy()
		return nil, cmCallErr("rdma_listen", err)
	}
	local, _ := cmAddr(l.id, false)
	l.addr = cm.Scheme + netip.AddrPortFrom(ap.Addr(), local.Port()).String()
	l.q = acceptq.New("verbs", l.addr, fo.BacklogSize())
	l.wg.Add(1)
	go l.loop()
	return l, nil
}

func (l *cmListener) destroy() {
	if l.id != nil {
		C.rdma_destroy_id(l.id)
		l.id = nil
	}
	l.ch.close()
}

// loop takes the listening id's connection requests until Close.
func (l *cmListener) loop() {
	defer l.wg.Done()
	for {
		ev, err := l.ch.next(context.Background())
		if err != nil {
			if l.q.Closed() || errors.Is(err, os.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // a failing channel: let it pass
			continue
		}
		if ev.kind != C.RDMA_CM_EVENT_CONNECT_REQUEST {
			continue
		}
		id := ev.id
		if !l.q.Reserve() {
			C.rdma_reject(id, nil, 0)
			C.rdma_destroy_id(id)
			continue
		}
		ch, err := newCMChannel()
		if err == nil {
			if rc, merr := C.rdma_migrate_id(id, ch.ch); rc != 0 {
				ch.close()
				err = cmCallErr("rdma_migrate_id", merr)
			}
		}
		if err != nil {
			C.rdma_reject(id, nil, 0)
			C.rdma_destroy_id(id)
			l.q.Fail()
			continue
		}
		l.wg.Add(1)
		go l.handshake(id, ch, ev)
	}
}

// handshake accepts one connection request and queues its endpoint; it
// holds a backlog slot throughout.
func (l *cmListener) handshake(id *C.struct_rdma_cm_id, ch *cmChannel, req cmEvent) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), l.limit)
	defer cancel()
	go func() {
		select {
		case <-l.q.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if l.o.Timeout != 0 {
		C.weft_cm_ack_timeout(id, C.uint8_t(l.o.Timeout)) // without it the REQ's applies
	}
	ep, err := newEndpoint(l.o, id, ch)
	if err != nil {
		// newEndpoint destroyed the id, which rejects the request.
		l.q.Fail()
		return
	}
	if err := ep.accept(ctx, req); err != nil {
		if debug {
			fmt.Fprintf(os.Stderr, "verbs: accept: %v\n", err)
		}
		ep.Close()
		l.q.Fail()
		return
	}
	l.q.Offer(ep) // closes ep if the listener closed meanwhile
}

// accept answers the connection request req (rdma_accept) and waits for
// the RTU (RDMA_CM_EVENT_ESTABLISHED).
func (ep *Endpoint) accept(ctx context.Context, req cmEvent) error {
	rr, depth := ep.rdDepths(true, req.depth)
	pd, n := privateData(&ep.o)
	rc, err := C.weft_cm_accept(ep.cmid, pd, n, C.uint8_t(rr), C.uint8_t(depth), C.uint8_t(ep.o.RNRRetry))
	C.free(pd)
	if rc != 0 {
		return cmCallErr("rdma_accept", err)
	}
	ev, err := ep.cmch.await(ctx, C.RDMA_CM_EVENT_ESTABLISHED)
	if err != nil {
		return err
	}
	ev.data, ev.qpn = req.data, req.qpn // the REQ's, not the RTU's (which has none)
	ep.established(ev)
	return nil
}

// Accept implements fabric.Listener.
func (l *cmListener) Accept(ctx context.Context) (fabric.Endpoint, error) { return l.q.Accept(ctx) }

// Addr implements fabric.Listener: rdmacm://HOST:PORT with the port
// resolved.
func (l *cmListener) Addr() string { return l.addr }

// Stats implements fabric.Listener.
func (l *cmListener) Stats() fabric.ListenerStats { return l.q.Stats() }

// Close implements fabric.Listener: it stops listening (connection
// requests from then on are rejected by the kernel: nobody listens),
// cancels the handshakes in progress, closes the endpoints nobody
// accepted and waits for all of it. Accepted endpoints stay open.
func (l *cmListener) Close() error {
	l.once.Do(func() {
		l.q.Close()
		l.ch.stop()
		l.wg.Wait()
		l.destroy()
	})
	return nil
}
