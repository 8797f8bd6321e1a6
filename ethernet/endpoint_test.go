package ethernet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/netns"
)

// dialPair opens a connected pair of endpoints over a fresh veth pair,
// with addresses built from the format (given the interface name).
func dialPair(t testing.TB, c netns.PairConfig, addrA, addrB string) (a, b fabric.Endpoint) {
	t.Helper()
	p := newPair(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		ep  fabric.Endpoint
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var ep fabric.Endpoint
		err := p.B.Do(func() error {
			var err error
			ep, err = fabric.Open(ctx, "ethernet", fmt.Sprintf(addrB, p.NameB), nil)
			return err
		})
		ch <- res{ep, err}
	}()
	err := p.A.Do(func() error {
		var err error
		a, err = fabric.Open(ctx, "ethernet", fmt.Sprintf(addrA, p.NameA), nil)
		return err
	})
	r := <-ch
	if err != nil || r.err != nil {
		if a != nil {
			a.Close()
		}
		if r.ep != nil {
			r.ep.Close()
		}
		t.Fatalf("dial pair: %v / %v", err, r.err)
	}
	t.Cleanup(func() { a.Close(); r.ep.Close() })
	return a, r.ep
}

func TestConformance(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) {
		return dialPair(t, netns.PairConfig{}, "%s", "%s")
	})
}

func TestConformanceUDP(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) {
		return dialPair(t, netns.PairConfig{}, "%s:udp=10.11.0.2", "%s:udp=10.11.0.1")
	})
}

func TestEndpointBasics(t *testing.T) {
	a, b := dialPair(t, netns.PairConfig{}, "%s:peer=02:00:00:00:00:02", "%s")
	caps := a.Caps()
	require.True(t, caps.Reliable)
	require.False(t, caps.RMA)
	require.Equal(t, "ethernet", caps.Backend)
	_, err := a.Write(nil)
	require.ErrorIs(t, err, fabric.ErrNotSupported)
	_, err = a.Register(make([]byte, 8), fabric.AccessRemoteWrite)
	require.ErrorIs(t, err, fabric.ErrNotSupported)
	_ = b
	ee := a.(*ethernet.Endpoint)
	require.NotNil(t, ee.Port().Program())
}
