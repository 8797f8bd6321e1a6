//go:build rxe

package roce

// rdma_cm interop with Linux Soft-RoCE: librdmacm's programs in a guest of
// ../shared/rxe-vm, the engine's CM on the host side of the bridge.
//
//	go test -tags rxe -run TestRxeInteropCM -v ./roce/
//
// Like TestRxeInterop, the test starts the harness with this binary as
// the host command (TestRxeCMHost); guest and host walk the same steps
// (perftest's -R steps are in rxe_perftest_cm_test.go). WEFT_RXE_CM_STEPS,
// a regular expression, runs only the steps whose names match.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

type rxeCMStep struct {
	Name  string
	Guest string
	Host  func(t *testing.T, ctx context.Context, e *Engine) error
}

// rxeCMSteps lists the steps; WEFT_RXE_CM_STEPS, a regular expression,
// keeps only the steps whose names it matches (for a quicker VM run while
// working on some of them).
func rxeCMSteps() []rxeCMStep {
	all := append(allRxeCMSteps(), perftestCMSteps()...)
	re := os.Getenv("WEFT_RXE_CM_STEPS")
	if re == "" {
		return all
	}
	keep := regexp.MustCompile(re)
	var steps []rxeCMStep
	for _, s := range all {
		if keep.MatchString(s.Name) {
			steps = append(steps, s)
		}
	}
	return steps
}

func allRxeCMSteps() []rxeCMStep {
	return []rxeCMStep{
		{
			// rdma_server listens on 7471: Weft dials, sends 16 bytes,
			// gets 16 back; the server disconnects (its DREQ).
			Name:  "rdma_server",
			Guest: "rdma_server",
			Host:  weftRdmaClient,
		},
		{
			// rdma_client dials Weft's listener on 10.77.0.1:7471.
			Name:  "rdma_client",
			Guest: "retry rdma_client -s 10.77.0.1",
			Host:  weftRdmaServer,
		},
		{
			// rping's server: Weft plays rping's client for 100 pings
			// (SEND of the source buffer, the server READs it; SEND of
			// the sink, the server WRITEs it back), validating each.
			Name:  "rping-server",
			Guest: "rping -s -a 10.77.0.2 -C 100",
			Host:  weftRpingClient,
		},
		{
			// rping's client validates (-V) what Weft's server wrote back.
			Name:  "rping-client",
			Guest: "retry rping -c -a 10.77.0.1 -C 100 -V",
			Host:  weftRpingServer,
		},
		{
			// ucmatose's server takes 32 connections from Weft, sends
			// 10 messages of 100 bytes on each, takes 10 back, and
			// disconnects them all (on a port of its own, so that the
			// capture's count of retransmissions finds its connections).
			Name:  "ucmatose-server",
			Guest: fmt.Sprintf("ucmatose -p %d -c %d", cmatoseServerPort, cmatoseConns),
			Host:  weftCmatoseClient,
		},
		{
			// ucmatose's client opens 32 connections to Weft's listener.
			Name:  "ucmatose-client",
			Guest: fmt.Sprintf("retry ucmatose -s 10.77.0.1 -p %d -c %d", cmatoseClientPort, cmatoseConns),
			Host:  weftCmatoseServer,
		},
		{
			// udaddy's server (UD through SIDR): Weft resolves port 7174,
			// sends 10 datagrams carrying its QPN as immediate data, and
			// takes the 10 replies.
			Name:  "udaddy-server",
			Guest: "udaddy",
			Host:  weftUdaddyClient,
		},
		{
			// udaddy's client resolves Weft's UD service and exchanges
			// 10 datagrams each way.
			Name:  "udaddy-client",
			Guest: "retry udaddy -s 10.77.0.1",
			Host:  weftUdaddyServer,
		},
		{
			// Nobody listens on port 9999 of the engine: rping must be
			// rejected (RDMA_CM_EVENT_REJECTED, status 8), not time out.
			Name:  "rping-refused",
			Guest: `out=$(rping -c -a 10.77.0.1 -p 9999 -C 1 -v 2>&1); echo "$out"; case "$out" in *"RDMA_CM_EVENT_REJECTED, error 8"*) true;; *) false;; esac`,
			Host: func(t *testing.T, ctx context.Context, e *Engine) error {
				before := e.CM().Stats().TxMADs
				for e.CM().Stats().TxMADs == before {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(50 * time.Millisecond):
					}
				}
				return nil
			},
		},
	}
}

// weftRdmaClient plays rdma_client against the guest's rdma_server.
func weftRdmaClient(t *testing.T, ctx context.Context, e *Engine) error {
	pd := e.AllocPD()
	var c *Conn
	var err error
	for {
		// Refused until rdma_server listens; unanswered until the guest
		// is up. Each attempt waits 4 × 2.1 s for the REP: rdma_server
		// answers only once it has made its QP and called rdma_accept,
		// which a loaded emulated guest took longer than the 4 × 268 ms
		// this once waited (CI: the attempt gave up, its REJ(timeout)
		// reached rdma_server after it accepted, "rdma_accept:
		// Connection timed out", and the next steps cascaded).
		c, err = e.CM().Dial(ctx, pd, netip.MustParseAddrPort(guestIP+":7471"),
			&ConnConfig{PrivateData: []byte("weft"), ResponseTimeout: 19, MaxRetries: 3})
		if err == nil || ctx.Err() != nil || !(errors.Is(err, fabric.ErrRefused) || errors.Is(err, context.DeadlineExceeded)) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.QP().Destroy()
	if err := cmExchange(ctx, c, pd, true); err != nil {
		return err
	}
	// rdma_server disconnects after its send completes.
	select {
	case <-c.Done():
	case <-ctx.Done():
		return fmt.Errorf("no DREQ from rdma_server: %w", ctx.Err())
	}
	return c.Disconnect(ctx)
}

// weftRdmaServer plays rdma_server for the guest's rdma_client.
func weftRdmaServer(t *testing.T, ctx context.Context, e *Engine) error {
	l, err := e.CM().Listen(7471, 0, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	r, err := l.Next(ctx)
	if err != nil {
		return err
	}
	t.Logf("request from %v", r.RemoteAddr())
	pd := e.AllocPD()
	c, err := r.Accept(ctx, pd, nil)
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	defer c.QP().Destroy()
	if err := cmExchange(ctx, c, pd, false); err != nil {
		return err
	}
	select {
	case <-c.Done(): // rdma_client disconnects
	case <-ctx.Done():
		return fmt.Errorf("no DREQ from rdma_client: %w", ctx.Err())
	}
	return nil
}

// rpingSize is rping's default ping size.
const rpingSize = 64

// rpingInfo encodes rping's buffer advertisement: address, rkey and size,
// big-endian.
func rpingInfo(b []byte, mr *fabric.Region, size int) {
	binary.BigEndian.PutUint64(b[0:], mr.Addr())
	binary.BigEndian.PutUint32(b[8:], uint32(mr.RemoteKey()))
	binary.BigEndian.PutUint32(b[12:], uint32(size))
}

// rpingConn holds the buffers of one side of rping.
type rpingConn struct {
	c         *Conn
	info, in  []byte
	infoMR    *fabric.Region
	inMR      *fabric.Region
	completed []fabric.Completion
}

func newRpingConn(c *Conn, pd *PD) *rpingConn {
	r := &rpingConn{c: c, info: make([]byte, 16), in: make([]byte, 64), completed: make([]fabric.Completion, 1)}
	r.infoMR, _ = pd.RegMR(r.info, fabric.AccessLocalWrite)
	r.inMR, _ = pd.RegMR(r.in, fabric.AccessLocalWrite)
	return r
}

// send sends the 16-byte advertisement (or go-ahead) in r.info.
func (r *rpingConn) send(ctx context.Context) error {
	_, err := r.c.QP().SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: r.infoMR, Length: 16}}}})
	return err
}

// recv receives one 16-byte message into r.in.
func (r *rpingConn) recv(ctx context.Context) error {
	m := []fabric.Message{{SGEs: []fabric.SGE{{Region: r.inMR, Length: len(r.in)}}}}
	if _, err := r.c.QP().RecvWait(ctx, m); err != nil {
		return err
	}
	if m[0].Len != 16 {
		return fmt.Errorf("rping message of %d bytes", m[0].Len)
	}
	return nil
}

// rma runs one signaled RDMA READ or WRITE and waits for it.
func (r *rpingConn) rma(ctx context.Context, read bool, local *fabric.Region, n int, remote fabric.RemoteIOV) error {
	qp := r.c.QP()
	post := qp.Write
	if read {
		post = qp.Read
	}
	m := []fabric.Message{{SGEs: []fabric.SGE{{Region: local, Length: n}}, Remote: remote.Slice(0, uint64(n)), Flags: fabric.FlagSignal}}
	if _, err := qp.postWait(ctx, m, post); err != nil {
		return err
	}
	if _, err := qp.CQ().Wait(ctx, r.completed); err != nil {
		return err
	}
	return r.completed[0].Err()
}

// weftRpingClient plays rping -c against the guest's rping -s.
func weftRpingClient(t *testing.T, ctx context.Context, e *Engine) error {
	pd := e.AllocPD()
	var c *Conn
	var err error
	for {
		c, err = e.CM().Dial(ctx, pd, netip.MustParseAddrPort(guestIP+":7174"),
			&ConnConfig{ResponderResources: 1, InitiatorDepth: 1, ResponseTimeout: 16, MaxRetries: 3})
		if err == nil || ctx.Err() != nil || !(errors.Is(err, fabric.ErrRefused) || errors.Is(err, context.DeadlineExceeded)) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.QP().Destroy()
	r := newRpingConn(c, pd)
	start, sink := make([]byte, rpingSize), make([]byte, rpingSize)
	rw := fabric.AccessLocalWrite | fabric.AccessRemoteRead | fabric.AccessRemoteWrite
	startMR, _ := pd.RegMR(start, rw)
	sinkMR, _ := pd.RegMR(sink, rw)
	first := byte(65)
	for ping := 0; ping < 100; ping++ {
		n := copy(start, fmt.Sprintf("rdma-ping-%d: ", ping))
		for i, ch := n, first; i < rpingSize; i++ {
			start[i] = ch
			if ch++; ch > 122 {
				ch = 65
			}
		}
		if first++; first > 122 {
			first = 65
		}
		start[rpingSize-1] = 0
		clear(sink)
		rpingInfo(r.info, startMR, rpingSize)
		if err := r.send(ctx); err != nil {
			return fmt.Errorf("ping %d: %w", ping, err)
		}
		if err := r.recv(ctx); err != nil { // the server has READ the source
			return fmt.Errorf("ping %d: %w", ping, err)
		}
		rpingInfo(r.info, sinkMR, rpingSize)
		if err := r.send(ctx); err != nil {
			return fmt.Errorf("ping %d: %w", ping, err)
		}
		if err := r.recv(ctx); err != nil { // the server has WRITTEN the sink
			return fmt.Errorf("ping %d: %w", ping, err)
		}
		if !bytes.Equal(start, sink) {
			return fmt.Errorf("ping %d: wrote back %q, want %q", ping, sink, start)
		}
	}
	return c.Disconnect(ctx)
}

// weftRpingServer plays rping -s for the guest's rping -c -V.
func weftRpingServer(t *testing.T, ctx context.Context, e *Engine) error {
	l, err := e.CM().Listen(7174, 0, &ConnConfig{ResponderResources: 1, InitiatorDepth: 1})
	if err != nil {
		return err
	}
	defer l.Close()
	req, err := l.Next(ctx)
	if err != nil {
		return err
	}
	pd := e.AllocPD()
	c, err := req.Accept(ctx, pd, nil)
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	defer c.QP().Destroy()
	r := newRpingConn(c, pd)
	buf := make([]byte, rpingSize)
	bufMR, _ := pd.RegMR(buf, fabric.AccessLocalWrite)
	remote := func() (fabric.RemoteIOV, error) {
		n := binary.BigEndian.Uint32(r.in[12:])
		if n == 0 || n > rpingSize {
			return fabric.RemoteIOV{}, fmt.Errorf("advertised %d bytes", n)
		}
		return fabric.RemoteIOV{Addr: binary.BigEndian.Uint64(r.in), Len: uint64(n), Key: fabric.Key(binary.BigEndian.Uint32(r.in[8:]))}, nil
	}
	pings := 0
	for ; ; pings++ {
		if err := r.recv(ctx); err != nil {
			select {
			case <-c.Done(): // the client disconnected after its last ping
				if pings == 100 {
					return nil
				}
				return fmt.Errorf("client left after %d pings", pings)
			default:
				return err
			}
		}
		src, err := remote()
		if err != nil {
			return err
		}
		if err := r.rma(ctx, true, bufMR, int(src.Len), src); err != nil {
			return fmt.Errorf("ping %d: read: %w", pings, err)
		}
		if err := r.send(ctx); err != nil {
			return err
		}
		if err := r.recv(ctx); err != nil {
			return err
		}
		sink, err := remote()
		if err != nil {
			return err
		}
		n := bytes.IndexByte(buf, 0) + 1
		if n == 0 {
			n = len(buf)
		}
		if err := r.rma(ctx, false, bufMR, min(n, int(sink.Len)), sink); err != nil {
			return fmt.Errorf("ping %d: write: %w", pings, err)
		}
		if err := r.send(ctx); err != nil {
			return err
		}
	}
}

// udaddy's defaults: 10 messages of 100 bytes.
const (
	udaddyCount = 10
	udaddySize  = 100
)

// udaddyTraffic sends udaddyCount datagrams with imm as immediate data
// (send) or receives as many and returns the immediate of the first.
func udaddyTraffic(ctx context.Context, qp *QP, pd *PD, send bool, imm uint32) (uint32, error) {
	buf := make([]byte, 512)
	mr, _ := pd.RegMR(buf, fabric.AccessLocalWrite)
	var first uint32
	for i := 0; i < udaddyCount; i++ {
		if send {
			if _, err := qp.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: mr, Length: udaddySize}}, Imm: imm, Flags: fabric.FlagImm}}); err != nil {
				return 0, err
			}
			continue
		}
		m := []fabric.Message{{SGEs: []fabric.SGE{{Region: mr, Length: len(buf)}}}}
		if _, err := qp.RecvWait(ctx, m); err != nil {
			return 0, fmt.Errorf("datagram %d: %w", i, err)
		}
		if m[0].Len != udaddySize {
			return 0, fmt.Errorf("datagram of %d bytes", m[0].Len)
		}
		if i == 0 {
			first = m[0].Imm
		}
	}
	return first, nil
}

// weftUdaddyClient plays udaddy -s against the guest's udaddy server.
func weftUdaddyClient(t *testing.T, ctx context.Context, e *Engine) error {
	pd := e.AllocPD()
	var s *UDService
	var err error
	for {
		s, err = e.CM().ResolveUD(ctx, pd, netip.MustParseAddrPort(guestIP+":7174"), &ConnConfig{ResponseTimeout: 16, MaxRetries: 3})
		if err == nil || ctx.Err() != nil || !(errors.Is(err, fabric.ErrRefused) || errors.Is(err, context.DeadlineExceeded)) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("resolve: %w", err)
	}
	defer s.QP().Destroy()
	t.Logf("udaddy service: QPN %#x Q_Key %#x", s.RemoteQPN(), s.QKey())
	if _, err := udaddyTraffic(ctx, s.QP(), pd, true, s.QP().QPN()); err != nil {
		return err
	}
	_, err = udaddyTraffic(ctx, s.QP(), pd, false, 0)
	return err
}

// weftUdaddyServer plays udaddy's server for the guest's udaddy -s.
func weftUdaddyServer(t *testing.T, ctx context.Context, e *Engine) error {
	l, err := e.CM().ListenUD(7174, 0, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	pd := e.AllocPD()
	r, err := l.Next(ctx)
	if err != nil {
		return err
	}
	peer := r.RemoteAddr().Addr()
	srv, err := pd.CreateQP(QPConfig{Type: UD})
	if err != nil {
		return err
	}
	defer srv.Destroy()
	if err := srv.Connect(&QPAttr{PathMTU: 1024, Dest: peer, QKey: RDMACMUDPQKey}); err != nil {
		return err
	}
	if err := r.AcceptUD(srv, RDMACMUDPQKey, nil); err != nil {
		return err
	}
	qpn, err := udaddyTraffic(ctx, srv, pd, false, 0)
	if err != nil {
		return err
	}
	// Reply, as udaddy does, to the QPN the client sent as immediate data.
	reply, err := pd.CreateQP(QPConfig{Type: UD})
	if err != nil {
		return err
	}
	defer reply.Destroy()
	if err := reply.Connect(&QPAttr{PathMTU: 1024, Dest: peer, DestQPN: qpn, QKey: RDMACMUDPQKey}); err != nil {
		return err
	}
	_, err = udaddyTraffic(ctx, reply, pd, true, srv.QPN())
	return err
}

const (
	cmatoseConns = 32
	cmatoseCount = 10
	cmatoseSize  = 100
	// The rdma_cm ports of the ucmatose steps: ucmatose's server in the
	// guest, Weft's for ucmatose's client.
	cmatoseServerPort = 7472
	cmatoseClientPort = 7473
)

// weftCmatoseClient plays ucmatose's client: cmatoseConns connections, then on
// each 10 messages in and 10 replies out, then the server's DREQs.
func weftCmatoseClient(t *testing.T, ctx context.Context, e *Engine) error {
	pd := e.AllocPD()
	conns := make([]*Conn, cmatoseConns)
	for i := range conns {
		for {
			c, err := e.CM().Dial(ctx, pd, netip.AddrPortFrom(netip.MustParseAddr(guestIP), cmatoseServerPort),
				&ConnConfig{ResponderResources: 1, InitiatorDepth: 1, ResponseTimeout: 16, MaxRetries: 3})
			if err == nil {
				conns[i] = c
				defer c.QP().Destroy()
				break
			}
			if ctx.Err() != nil || !(errors.Is(err, fabric.ErrRefused) || errors.Is(err, context.DeadlineExceeded)) {
				return fmt.Errorf("dial %d: %w", i, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, phase := range []bool{false, true} {
		for i, c := range conns {
			if err := cmatoseTraffic(ctx, c, pd, phase); err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
		}
	}
	for i, c := range conns {
		select {
		case <-c.Done():
		case <-ctx.Done():
			return fmt.Errorf("connection %d: no DREQ: %w", i, ctx.Err())
		}
	}
	return nil
}

// weftCmatoseServer plays ucmatose's server for cmatoseConns connections.
func weftCmatoseServer(t *testing.T, ctx context.Context, e *Engine) error {
	l, err := e.CM().Listen(cmatoseClientPort, 0, &ConnConfig{ResponderResources: 1, InitiatorDepth: 1})
	if err != nil {
		return err
	}
	defer l.Close()
	pd := e.AllocPD()
	conns := make([]*Conn, cmatoseConns)
	for i := range conns {
		r, err := l.Next(ctx)
		if err != nil {
			return err
		}
		if conns[i], err = r.Accept(ctx, pd, nil); err != nil {
			return fmt.Errorf("accept %d: %w", i, err)
		}
		defer conns[i].QP().Destroy()
	}
	// ucmatose's client answers only once every connection has all its
	// messages: send on all, then receive on all.
	for _, phase := range []bool{true, false} {
		for i, c := range conns {
			if err := cmatoseTraffic(ctx, c, pd, phase); err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
		}
	}
	for i, c := range conns {
		if err := c.Disconnect(ctx); err != nil {
			return fmt.Errorf("disconnect %d: %w", i, err)
		}
	}
	return nil
}

// cmatoseTraffic sends (send) or receives cmatoseCount messages of
// cmatoseSize bytes.
func cmatoseTraffic(ctx context.Context, c *Conn, pd *PD, send bool) error {
	buf := make([]byte, cmatoseSize)
	mr, _ := pd.RegMR(buf, fabric.AccessLocalWrite)
	if send {
		for i := 0; i < cmatoseCount; i++ {
			if _, err := c.QP().SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: mr, Length: cmatoseSize}}}}); err != nil {
				return err
			}
		}
		return nil
	}
	for i := 0; i < cmatoseCount; i++ {
		m := []fabric.Message{{SGEs: []fabric.SGE{{Region: mr, Length: cmatoseSize}}}}
		if _, err := c.QP().RecvWait(ctx, m); err != nil {
			return err
		}
		if m[0].Len != cmatoseSize {
			return fmt.Errorf("message of %d bytes", m[0].Len)
		}
	}
	return nil
}

// cmExchange is rdma_client's (send first) or rdma_server's (receive
// first) exchange of one 16-byte message each way.
func cmExchange(ctx context.Context, c *Conn, pd *PD, sendFirst bool) error {
	out := []byte("weft-rdmacm-0016")
	src, _ := pd.RegMR(out, fabric.AccessLocalWrite)
	in := make([]byte, 64)
	dst, _ := pd.RegMR(in, fabric.AccessLocalWrite)
	send := func() error {
		_, err := c.QP().SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 16}}, Flags: fabric.FlagSignal}})
		return err
	}
	recv := func() error {
		m := []fabric.Message{{SGEs: []fabric.SGE{{Region: dst, Length: len(in)}}}}
		if _, err := c.QP().RecvWait(ctx, m); err != nil {
			return err
		}
		if m[0].Len != 16 {
			return fmt.Errorf("received %d bytes, want 16", m[0].Len)
		}
		return nil
	}
	steps := []func() error{recv, send}
	if sendFirst {
		steps = []func() error{send, recv}
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// TestRxeInteropCM runs librdmacm's programs in a Soft-RoCE guest against the
// engine's CM.
func TestRxeInteropCM(t *testing.T) {
	testenv.RequireRoot(t)
	harness := testenv.RxeHarness(t)
	dir := t.TempDir()
	var gs strings.Builder
	gs.WriteString("#!/bin/sh\n# Generated by roce/rxe_cm_test.go.\nfail=0\n")
	gs.WriteString("retry() { i=0; until \"$@\"; do i=$((i+1)); [ $i -ge 60 ] && return 1; sleep 1; done; }\n")
	// perf PATTERN CMD...: runs a perftest program, prints its output,
	// and wants exit status 0 and a result line matching PATTERN.
	gs.WriteString("perf() { pat=$1; shift; \"$@\" >/tmp/perf.out 2>&1; rc=$?; cat /tmp/perf.out; echo \"exit status $rc\"; " +
		"[ $rc = 0 ] && grep -Eq \"$pat\" /tmp/perf.out; }\n")
	// perfc is perf for a client: it tries again while the server is not
	// listening (the control connection rejected, which perftest reports
	// as CM event 8), and only then, so that a client failing later does
	// not run again into the next step's server on the same port.
	gs.WriteString("perfc() { i=0; while :; do perf \"$@\" && return 0; grep -q 'Unexpected CM event bl blka 8' /tmp/perf.out || return 1; " +
		"i=$((i+1)); [ $i -ge 60 ] && return 1; sleep 1; done; }\n")
	for _, s := range rxeCMSteps() {
		fmt.Fprintf(&gs, "echo '>>> %s'\nif ! ( %s ); then echo 'STEP FAILED: %s'; fail=1; fi\nsleep 2\n", s.Name, s.Guest, s.Name)
	}
	gs.WriteString("sleep 3\nexit $fail\n")
	script := filepath.Join(dir, "guest.sh")
	if err := os.WriteFile(script, []byte(gs.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(dir, "rxe-cm.pcap")
	if p := os.Getenv("WEFT_RXE_PCAP"); p != "" {
		pcap = p
	}
	cmd := exec.Command(filepath.Join(harness, "run.sh"), "-n", "1", "-t", "400", "-c", pcap, script,
		os.Args[0], "-test.run=^TestRxeCMHost$", "-test.v", "-test.timeout=6m")
	cmd.Env = append(os.Environ(), "WEFT_RXE_HOST=1")
	out, err := cmd.CombinedOutput()
	t.Logf("harness output:\n%s", out)
	if err != nil {
		t.Fatalf("interop failed: %v (capture in %s)", err, pcap)
	}
	if bytes.Contains(out, []byte("STEP FAILED")) || !bytes.Contains(out, []byte("--- PASS: TestRxeCMHost")) {
		t.Fatalf("interop failed (capture in %s)", pcap)
	}
	cmatoseRetransmissions(t, pcap)
}

// cmatoseRetransmissions counts, from the capture, the request packets
// each side of the ucmatose steps sent again, and wants under 2% of them
// (issue 28: with a local ACK timeout of 16.8 ms rxe resent 6–38% of its
// request packets and the engine up to 65%; with Linux rdma_cm's 19,
// 2.1 s, none in five runs, two of them with the host's CPUs
// oversubscribed).
func cmatoseRetransmissions(t *testing.T, pcap string) {
	pkts, err := readCapture(pcap)
	if err != nil {
		t.Fatalf("capture %s: %v", pcap, err)
	}
	for _, s := range []struct {
		step string
		port uint16
	}{{"ucmatose-server", cmatoseServerPort}, {"ucmatose-client", cmatoseClientPort}} {
		w := connWindow(pkts, s.port)
		if w.From < 0 {
			continue // the step did not run (WEFT_RXE_CM_STEPS)
		}
		for _, a := range []netip.Addr{netip.MustParseAddr(guestIP), netip.MustParseAddr("10.77.0.1")} {
			c := retransmissions(pkts, w)[a]
			t.Logf("step %s: %v sent %v", s.step, a, c)
			if c.Requests < cmatoseConns*cmatoseCount {
				t.Errorf("step %s: the capture shows %d request packets from %v, want at least %d (capture in %s)",
					s.step, c.Requests, a, cmatoseConns*cmatoseCount, pcap)
			} else if c.percent() >= 2 {
				t.Errorf("step %s: %v sent %v, want under 2%% (capture in %s)", s.step, a, c, pcap)
			}
		}
	}
}

// TestRxeCMHost is the host side, run by the harness in its namespace.
func TestRxeCMHost(t *testing.T) {
	if os.Getenv("WEFT_RXE_HOST") != "1" {
		t.Skip("run by TestRxeInteropCM inside the harness")
	}
	e, err := NewEngine(EngineConfig{Addr: netip.MustParseAddrPort("10.77.0.1:4791")})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, s := range rxeCMSteps() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		start := time.Now()
		err := s.Host(t, ctx, e)
		cancel()
		if err != nil {
			t.Errorf("step %s: %v", s.Name, err)
		} else {
			t.Logf("step %s: ok in %v", s.Name, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("CM stats: %+v", e.CM().Stats())
}
