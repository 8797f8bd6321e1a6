package roce

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
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

// cappedLink is a discardLink whose path MTU is capped (link.MTUCapper).
type cappedLink struct {
	discardLink
	max int
}

func (l cappedLink) MaxMTU() int { return l.max }

// TestLinkMaxMTU checks that the engine takes its path MTU cap from the
// link's MaxMTU (link.MTUCapper), whatever the link's type: RTR refuses
// a larger path MTU with ErrInvalid and takes one at the cap; a link
// without the method, or with a cap of 0, caps nothing; a LossyLink
// keeps the cap of the link it wraps.
func TestLinkMaxMTU(t *testing.T) {
	addr := netip.MustParseAddrPort("127.0.0.1:4791")
	for _, c := range []struct {
		name string
		lk   link.Link
		max  int // 0: 4096 is taken
	}{
		{"none", discardLink{addr}, 0},
		{"zero", cappedLink{discardLink{addr}, 0}, 0},
		{"1024", cappedLink{discardLink{addr}, 1024}, 1024},
		{"2048", cappedLink{discardLink{addr}, 2048}, 2048},
		{"lossy", link.NewLossyLink(cappedLink{discardLink{addr}, 512}, link.LossConfig{Seed: 1}), 512},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := NewEngine(EngineConfig{Link: c.lk})
			require.NoError(t, err)
			defer e.Close()
			pd := e.AllocPD()
			for _, typ := range []QPType{RC, UD} {
				for _, mtu := range []int{256, 512, 1024, 2048, 4096} {
					qp, err := pd.CreateQP(QPConfig{Type: typ})
					require.NoError(t, err)
					err = qp.Connect(&QPAttr{PathMTU: mtu, Dest: netip.MustParseAddr("127.0.0.2"), DestQPN: 5, QKey: 1})
					if c.max == 0 || mtu <= c.max {
						require.NoError(t, err, "%v QP: path MTU %d under a cap of %d", typ, mtu, c.max)
					} else {
						require.ErrorIs(t, err, fabric.ErrInvalid, "%v QP: path MTU %d over a cap of %d", typ, mtu, c.max)
					}
					qp.Destroy()
				}
			}
		})
	}
}
