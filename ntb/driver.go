package ntb

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/units"
)

func init() {
	fabric.RegisterBackend("ntb", driver{})
}

type driver struct{}

// Usage implements fabric.Driver.
func (driver) Usage() string {
	return "PATH[?mem=16M&queues=1&ring=1M&maxmsg=64K]: emulated NTB in shared-memory file PATH (both sides name the same file)"
}

// Open implements fabric.Driver: addr names the emulated bridge's file,
// with optional geometry and transport parameters as a query string.
func (driver) Open(ctx context.Context, addr string, o fabric.Options) (fabric.Endpoint, error) {
	path, sc, tc, err := ParseAddr(addr)
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: err}
	}
	if o.MaxMsgSize > 0 && tc.MaxMsgSize == 0 {
		tc.MaxMsgSize = o.MaxMsgSize
		if tc.RingSize == 0 && 4*(o.MaxMsgSize+64) > 1<<20 {
			tc.RingSize = (4*(o.MaxMsgSize+64) + 4095) &^ 4095
		}
	}
	tc.Spin, tc.CQSize = o.Spin, o.CQSize
	return DialShm(ctx, path, sc, tc)
}

// DialShm opens (or creates) the emulated bridge at path and brings up a
// transport with one queue over it. The endpoint owns the device and the
// transport: closing it closes both.
func DialShm(ctx context.Context, path string, sc ShmConfig, tc Config) (*Endpoint, error) {
	if tc.Queues > 1 {
		return nil, fmt.Errorf("ntb: DialShm opens one queue; use OpenShm and Dial for %d", tc.Queues)
	}
	if sc.MemSize == 0 && tc.RingSize > 1<<20 {
		sc.MemSize = max(16<<20, 4*tc.RingSize)
	}
	dev, err := OpenShm(path, sc)
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: path, Err: err}
	}
	t, err := Dial(ctx, dev, tc)
	if err != nil {
		dev.Close()
		return nil, err
	}
	ep := t.eps[0]
	ep.owner, ep.addr = true, path
	return ep, nil
}

// ParseAddr parses an ntb address: a file path with an optional query of
// mem, mws, spads, dbbits (device geometry, used when the file is
// created) and queues, ring, maxmsg, window (transport). Sizes take K, M
// and G suffixes.
func ParseAddr(addr string) (path string, sc ShmConfig, tc Config, err error) {
	path, query, _ := strings.Cut(addr, "?")
	if path == "" {
		return "", sc, tc, fmt.Errorf("empty path")
	}
	vals, err := url.ParseQuery(query)
	if err != nil {
		return "", sc, tc, err
	}
	for k, vs := range vals {
		v := vs[len(vs)-1]
		n, perr := units.ParseSize(v, 1<<40)
		if perr != nil {
			return "", sc, tc, fmt.Errorf("%s=%q: %w", k, v, perr)
		}
		switch k {
		case "mem":
			sc.MemSize = n
		case "mws":
			sc.MWs = n
		case "spads":
			sc.Spads = n
		case "dbbits":
			sc.DoorbellBits = n
		case "queues":
			tc.Queues = n
		case "ring":
			tc.RingSize = n
		case "maxmsg":
			tc.MaxMsgSize = n
		case "window":
			tc.WindowSize = n
		default:
			return "", sc, tc, fmt.Errorf("unknown parameter %q", k)
		}
	}
	return path, sc, tc, nil
}
