//go:build linux

package ntb

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	hwmap "github.com/weft-io/weft/ntb/hw"
	"github.com/weft-io/weft/ntb/internal/chipmodel"
)

// idtTransportPair: two HWDevices over an IDT switch model (ports 0 and
// 2), each side's link enabled and a transport dialled over it: the
// handshake goes over the message registers (IDT has no scratchpads),
// the data through each side's direct window into the other's memory.
func idtTransportPair(t testing.TB, tc Config) (a, b *Endpoint) {
	t.Helper()
	sw, err := chipmodel.NewIDTSwitch(chipmodel.IDTConfig{MemSize: 8 << 20, BAR2Size: 4 << 20, BAR4Trans: 1,
		Ports: []chipmodel.IDTPortConfig{{Port: 0, Partition: 0, ReqID: 0x100}, {Port: 2, Partition: 1, ReqID: 0x200}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() }) // after the endpoints' cleanups, registered later
	m, _ := hwmap.Lookup(0x111d, idt24NT6)
	ports := map[fabrictest.Side]int{fabrictest.SideA: 0, fabrictest.SideB: 2}
	a, b = fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, s fabrictest.Side) (*Endpoint, error) {
		port := ports[s]
		d, err := newHWDevice(fmt.Sprintf("idt port %d", port), m, idtParts(t, sw, port),
			HWConfig{Memory: sw.Port(port).Memory(), Link: time.Millisecond})
		if err != nil {
			return nil, err
		}
		tr, err := Dial(ctx, d, tc) // Dial enables the link
		if err != nil {
			d.Close()
			return nil, err
		}
		ep := tr.endpoints()[0]
		ep.owner, ep.addr = true, fmt.Sprintf("idt-port-%d", port)
		return ep, nil
	})
	return a, b
}

func TestIDTModelConformance(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := idtTransportPair(t, Config{})
		return a, b
	})
}

// TestIDTModelDial: the handshake over IDT goes over the message
// registers.
func TestIDTModelDial(t *testing.T) {
	a, b := idtTransportPair(t, Config{})
	for _, ep := range []*Endpoint{a, b} {
		if _, ok := ep.t.ctl.(*msgCtrl); !ok {
			t.Errorf("the transport runs over %T, not the message registers", ep.t.ctl)
		}
	}
}

// BenchmarkIDTModel runs the message-path benchmarks over the transport
// on two HWDevices over the IDT model (run beside BenchmarkEndpoint, the
// emulated bridge). Functional figures: a model is not a switch.
func BenchmarkIDTModel(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := idtTransportPair(b, Config{})
		return x, y
	})
}
