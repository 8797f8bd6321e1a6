package sock

import (
	"context"
	"testing"
	"time"

	_ "github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

func init() {
	backends = append(backends, backend{name: "ethernet", pair: ethernetPair})
}

// ethernetPair connects two AF_XDP endpoints over a veth pair between
// two namespaces made for the test (root; skipped, or failed under CI,
// without it).
func ethernetPair(t testing.TB, o *fabric.Options) (fabric.Endpoint, fabric.Endpoint) {
	t.Helper()
	testenv.RequireAFXDP(t)
	p, err := netns.NewPair(netns.PairConfig{StaticNeigh: true})
	if err != nil {
		testenv.Skip(t, "cannot create namespaces and veth pair: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var a, b fabric.Endpoint
	ch := make(chan error, 1)
	go func() {
		ch <- p.B.Do(func() (err error) { b, err = fabric.Open(ctx, "ethernet", p.NameB, o); return })
	}()
	aerr := p.A.Do(func() (err error) { a, err = fabric.Open(ctx, "ethernet", p.NameA, o); return })
	berr := testenv.Recv(t, ch, "the Open of side B")
	if aerr != nil || berr != nil {
		for _, ep := range []fabric.Endpoint{a, b} {
			if ep != nil {
				ep.Close()
			}
		}
		t.Fatalf("ethernet pair: %v / %v", aerr, berr)
	}
	return a, b
}
