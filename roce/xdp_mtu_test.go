package roce

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/fabric"
)

// TestXDPPathMTU checks that a path MTU link=xdp cannot carry (4096: a
// packet over link.XDPMaxPacket) is refused when it is configured, with
// an error matching fabric.ErrInvalid, rather than accepted and every
// full-size packet then failed and dropped until the QP's retries run out.
func TestXDPPathMTU(t *testing.T) {
	t.Run("address", func(t *testing.T) {
		_, err := ParseAddr("10.0.0.1:7?link=xdp&mtu=4096")
		if !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), "mtu") {
			t.Fatalf("ParseAddr(link=xdp&mtu=4096) = %v, want ErrInvalid naming mtu", err)
		}
		if _, err := ParseAddr("10.0.0.1:7?link=xdp&mtu=2048"); err != nil {
			t.Fatalf("link=xdp&mtu=2048: %v", err)
		}
		if _, err := ParseAddr("10.0.0.1:7?mtu=4096"); err != nil {
			t.Fatalf("mtu=4096 over UDP: %v", err)
		}
	})
	t.Run("RTR", func(t *testing.T) {
		p := xdpNS(t, "")
		addr := netip.AddrPortFrom(netip.MustParseAddr(p.IPA.String()), 0)
		var e *Engine
		require.NoError(t, p.A.Do(func() (err error) {
			e, err = NewEngine(EngineConfig{Addr: addr, XDP: true})
			return err
		}))
		defer e.Close()
		pd := e.AllocPD()
		for _, typ := range []QPType{RC, UD} {
			qp, err := pd.CreateQP(QPConfig{Type: typ})
			require.NoError(t, err)
			err = qp.Connect(&QPAttr{PathMTU: 4096, Dest: netip.MustParseAddr(p.IPB.String()), DestQPN: 5, QKey: 1})
			require.ErrorIs(t, err, fabric.ErrInvalid, "%v QP: path MTU 4096 on link=xdp", typ)
			qp.Destroy()
			qp, err = pd.CreateQP(QPConfig{Type: typ})
			require.NoError(t, err)
			require.NoError(t, qp.Connect(&QPAttr{PathMTU: 2048, Dest: netip.MustParseAddr(p.IPB.String()), DestQPN: 5, QKey: 1}))
			qp.Destroy()
		}
	})
}
