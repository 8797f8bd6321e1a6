//go:build linux && cgo && rdma

package verbs

// The endpoint, in parts as its concerns: set-up (setup_rdma.go),
// memory (memory_rdma.go), the post path (post_rdma.go), receives and
// views (recv_rdma.go), teardown and failure (close_rdma.go) and the
// rdma_cm (cm_rdma.go). Each part is a struct embedded in Endpoint that
// holds the state its code owns.

/*
#include "weft_cm.h"
*/
import "C"

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"time"

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

// Endpoint is a verbs queue pair as a fabric.Endpoint.
type Endpoint struct {
	// What every part reads: the options, the domain, capabilities and
	// addresses, the completions and the counters.
	o     Options
	dom   *fabric.Domain
	caps  fabric.Caps
	local Dest
	peer  Dest
	spin  time.Duration
	laddr string // LocalAddr
	raddr string // RemoteAddr
	comp  *cq.Queue
	cqi   compQueue
	stats fabric.Counters

	setup     // set-up: device objects and sizes (setup_rdma.go)
	memory    // registered regions (memory_rdma.go)
	sender    // the post path (post_rdma.go)
	receiver  // receives and views (recv_rdma.go)
	lifecycle // teardown and failure (close_rdma.go)
	cmConn    // the rdma_cm id, if the endpoint has one (cm_rdma.go)
}

// Dest is the out-of-band address of a queue pair.
type Dest = exchange.Dest

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

// opErr is the error of op, from the verbs backend.
func opErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: "verbs", Err: err}
}

// errnoErr is opErr with err, or the errno rc, or EINVAL.
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
	ep := &Endpoint{o: o, memory: memory{regs: map[*C.struct_ibv_mr]*mrec{}},
		lifecycle: lifecycle{stop: make(chan struct{}), evs: make(chan fabric.Event, 16)},
		setup:     setup{ud: o.Type == wire.UD}, cmConn: cmConn{cmid: id, cmch: ch}}
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
	pinfo, sgid, err := ep.portGID(id != nil)
	if err != nil {
		return nil, err
	}
	mtu, maxMsg, inline := ep.size(pinfo)
	if err := ep.openQueues(id); err != nil {
		return nil, err
	}
	if err := ep.createQP(id); err != nil {
		return nil, err
	}
	// Receive ring and bounce buffers: mmapped, registered once.
	if err := ep.mapRings(maxMsg, inline); err != nil {
		return nil, err
	}
	if err := ep.startQP(id); err != nil {
		return nil, err
	}

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

// LocalDest returns this endpoint's out-of-band address.
func (ep *Endpoint) LocalDest() Dest { return ep.local }

// PeerDest returns the peer's out-of-band address.
func (ep *Endpoint) PeerDest() Dest { return ep.peer }

// Device returns the device the endpoint uses, its port and GID index.
func (ep *Endpoint) Device() (DeviceInfo, uint8, int) { return ep.dev, ep.port, ep.sgid }

// DeviceInline returns the device's inline limit for this queue pair:
// sends up to this size are copied by ibv_post_send itself.
func (ep *Endpoint) DeviceInline() int { return ep.inlineHW }

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
