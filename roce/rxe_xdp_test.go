//go:build rxe

package roce

// The rxe interop suite on link=xdp (issue 26): a subset of TestRxeInterop's
// and TestRxeInteropCM's steps again, in the same VM boot as
// TestRxeInterop's, with the host's engine on an AF_XDP socket on br0, the
// harness's bridge (the engine's address, 10.77.0.1, is on it). XDP runs in
// generic mode there: the frames of the guest's tap reach the program on
// the bridge's receive path, the link's frames leave through the bridge's
// transmit path to the tap. Run only these steps with
//
//	WEFT_RXE_STEPS='^xdp-' go test -tags rxe -run '^TestRxeInterop$' -v ./roce/
//
// The harness's capture (run.sh -c on br0) holds none of these steps'
// RoCEv2 packets, only their TCP exchanges: the program takes the received
// frames before the kernel's packet taps, and AF_XDP's transmission in
// copy mode (dev_direct_xmit) passes none. TestRxeHost instead checks the
// link's own counters around each step.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/weft-io/weft/roce/link"
)

// xdpHostAddr is the engine's address on the harness's bridge.
var xdpHostAddr = netip.MustParseAddrPort("10.77.0.1:4791")

// xdpRxeSteps returns the steps run with the engine on link=xdp, named
// "xdp-" and the name of the step they repeat: RC SEND/RECV both ways
// with ibv_rc_pingpong (one packet, four, and 64 per message at rxe's
// MTU of 1024), UD both ways with ibv_ud_pingpong, RDMA WRITE
// (ib_write_bw) and READ (ib_read_lat) both ways, and rdma_cm: connect,
// SEND both ways and disconnect in both roles (rdma_server,
// rdma_client), rping in both roles (its server READs the client's
// buffer and WRITEs the sink, 100 times over one connection), and UD
// through SIDR (udaddy).
func xdpRxeSteps() []rxeStep {
	var steps []rxeStep
	steps = append(steps, pingpongSteps("rc", "keepalive=0&link=xdp", []int{64, 4096, 65536})...)
	steps = append(steps, pingpongSteps("ud", "type=ud&link=xdp", []int{1024})...)
	steps = append(steps, perftestStepsOf([]perftestCase{
		{"write_bw", "ib_write_bw", 65536, 20},
		{"read_lat", "ib_read_lat", 4096, 20},
	}, engineOpts{XDP: true})...)
	for i := range steps {
		steps[i].Name = "xdp-" + steps[i].Name
		steps[i].XDP = true
	}
	cm := map[string]rxeCMStep{}
	for _, s := range allRxeCMSteps() {
		cm[s.Name] = s
	}
	for _, name := range []string{"rdma_server", "rdma_client", "rping-server", "rping-client", "udaddy-server", "udaddy-client"} {
		s, ok := cm[name]
		if !ok {
			panic("rxe_xdp_test.go: no rdma_cm step " + name)
		}
		steps = append(steps, rxeStep{Name: "xdp-" + name, Guest: s.Guest, XDP: true,
			Host: func(t *testing.T, ctx context.Context) error {
				e, release, err := acquireEngine(xdpHostAddr, engineOpts{XDP: true})
				if err != nil {
					return err
				}
				defer release()
				return s.Host(t, ctx, e)
			}})
	}
	return steps
}

// xdpHold is the engine on link=xdp that TestRxeHost holds across the
// XDP steps. Their endpoints share it (acquireEngine), so its link's
// counters tell whether a step's packets went through the AF_XDP socket.
type xdpHold struct {
	e    *Engine
	l    *link.XDPLink
	free func()
	err  error // why the engine could not be held
}

// set holds the engine for an XDP step and lets it go for another.
func (h *xdpHold) set(t *testing.T, s rxeStep) {
	if !s.XDP {
		h.release()
		h.err = nil
		return
	}
	if h.e != nil || h.err != nil {
		return
	}
	e, free, err := acquireEngine(xdpHostAddr, engineOpts{XDP: true})
	if err != nil {
		h.err = fmt.Errorf("no engine on link=xdp at %v: %w", xdpHostAddr, err)
		return
	}
	l, ok := e.link.(*link.XDPLink)
	if !ok {
		free()
		h.err = fmt.Errorf("the engine at %v with link=xdp runs on a %T", xdpHostAddr, e.link)
		return
	}
	name, _ := l.Interface()
	id, _ := l.Program().ID()
	t.Logf("link=xdp on %s: program %d attached in %v mode, zero-copy %v", name, id, l.Program().Mode(), l.ZeroCopy())
	h.e, h.l, h.free = e, l, free
}

// stats returns the held link's counters (zero when none is held).
func (h *xdpHold) stats() link.XDPStats {
	if h.l == nil {
		return link.XDPStats{}
	}
	return h.l.Stats()
}

// check logs what the held link carried during a step that began with
// the counters before, and returns the step's error err with the link's
// state added, or an error if the step passed without both receiving
// and sending through the AF_XDP socket.
func (h *xdpHold) check(t *testing.T, step string, before link.XDPStats, err error) error {
	if h.l == nil {
		return errors.Join(err, h.err)
	}
	a := h.l.Stats()
	d := link.XDPStats{RX: a.RX - before.RX, TX: a.TX - before.TX, Dropped: a.Dropped - before.Dropped, NoRoute: a.NoRoute - before.NoRoute}
	t.Logf("step %s: link=xdp carried %+v; engine drops %v", step, d, h.e.Stats().Drops)
	if err != nil {
		return fmt.Errorf("%w (link=xdp during the step: %+v; engine drops %v)", err, d, h.e.Stats().Drops)
	}
	if d.RX == 0 || d.TX == 0 {
		return fmt.Errorf("the step's packets did not all go through the AF_XDP socket: link=xdp carried %+v", d)
	}
	return nil
}

// release lets the held engine go (closing it if no endpoint uses it).
func (h *xdpHold) release() {
	if h.free != nil {
		h.free()
	}
	h.e, h.l, h.free = nil, nil, nil
}
