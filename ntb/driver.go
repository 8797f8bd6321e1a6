package ntb

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/units"
)

func init() {
	fabric.RegisterBackend("ntb", driver{})
}

type driver struct{}

// Usage implements fabric.Driver.
func (driver) Usage() string {
	return "PATH[?mem=16M&queues=1&ring=1M&maxmsg=64K&dma=1M&dmachan=2&listener=1&queue=N]: emulated NTB in shared-memory file PATH (both sides name the same file); dma sends and RMA of at least that size through the emulated DMA engine (dmachan channels); listener=1 dials a fabric.Listen listener on a free queue (or queue N)\n" +
		"pci:DDDD:BB:DD.F[?bar=2&wc=1&off=0&size=0&side=0|1&poll=200us&dead=1s&...]: the bridge's registers and memory in a PCI BAR shared with the peer's machine (QEMU ivshmem, vendor 1af4 device 1110: BAR 2); off and size select part of the BAR, so one BAR holds several bridges\n" +
		"mem:PATH[?off=&size=&side=&...]: the same layout in a mapped file (the host's view of an ivshmem device)"
}

// Open implements fabric.Driver: addr names the emulated bridge's file,
// with optional geometry and transport parameters as a query string.
func (driver) Open(ctx context.Context, addr string, o fabric.Options) (fabric.Endpoint, error) {
	a, err := parseAddr(addr)
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: err}
	}
	applyOptions(&a.tc, o)
	if a.kind != "" {
		if a.listener {
			return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr,
				Err: fmt.Errorf("listener=1 over a %s: bridge: %w", a.kind, fabric.ErrNotSupported)}
		}
		return dialMapped(ctx, addr, a)
	}
	if a.listener {
		return dialListener(ctx, addr, a.path, a.sc, a.tc, a.queue)
	}
	return DialShm(ctx, a.path, a.sc, a.tc)
}

// applyOptions applies the fabric options to a transport configuration
// that the address left at its defaults.
func applyOptions(tc *Config, o fabric.Options) {
	if o.MaxMsgSize > 0 && tc.MaxMsgSize == 0 {
		tc.MaxMsgSize = o.MaxMsgSize
		if tc.RingSize == 0 && 4*(o.MaxMsgSize+64) > 1<<20 {
			tc.RingSize = (4*(o.MaxMsgSize+64) + 4095) &^ 4095
		}
	}
	tc.Spin, tc.CQSize = o.Spin, o.CQSize
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
// created) and queues, ring, maxmsg, window, dma, dmachan (transport). Sizes take K, M
// and G suffixes. The parameters listener and queue, which select how
// fabric.Open connects, are accepted and not returned.
func ParseAddr(addr string) (path string, sc ShmConfig, tc Config, err error) {
	a, err := parseAddr(addr)
	return a.path, a.sc, a.tc, err
}

// ntbAddr is a parsed ntb address.
type ntbAddr struct {
	kind     string // "" (a bridge file), "pci" or "mem" (a mapping)
	mc       MappingConfig
	bar      int
	wc       bool
	off      int64
	size     int64
	path     string
	sc       ShmConfig
	tc       Config
	listener bool // dial a listener
	queue    int  // the queue to dial it on (-1: any free one)
}

func parseAddr(addr string) (ntbAddr, error) {
	a := ntbAddr{queue: -1, bar: 2, mc: MappingConfig{Side: -1}}
	path, query, _ := strings.Cut(addr, "?")
	for _, k := range []string{"pci", "mem"} {
		if p, ok := strings.CutPrefix(path, k+":"); ok {
			a.kind, path = k, p
		}
	}
	if path == "" {
		return a, fmt.Errorf("empty path: %w", fabric.ErrInvalid)
	}
	a.path = path
	vals, err := url.ParseQuery(query)
	if err != nil {
		return a, fmt.Errorf("%w: %w", fabric.ErrInvalid, err)
	}
	for k, vs := range vals {
		v := vs[len(vs)-1]
		if a.kind != "" {
			ok, err := a.mappingParam(k, v)
			if err != nil {
				return a, err
			}
			if ok {
				continue
			}
		}
		n, perr := units.ParseSize(v, 1<<40)
		if perr != nil {
			return a, fmt.Errorf("%s=%q: %w: %w", k, v, fabric.ErrInvalid, perr)
		}
		switch k {
		case "mem":
			a.sc.MemSize = n
		case "mws":
			a.sc.MWs = n
		case "spads":
			a.sc.Spads = n
		case "dbbits":
			a.sc.DoorbellBits = n
		case "queues":
			a.tc.Queues = n
		case "ring":
			a.tc.RingSize = n
		case "maxmsg":
			a.tc.MaxMsgSize = n
		case "window":
			a.tc.WindowSize = n
		case "dma":
			a.tc.DMAThreshold = n
		case "dmachan":
			a.tc.DMAChannels = n
		case "listener":
			a.listener = n != 0
		case "queue":
			if n >= maxQueues {
				return a, fmt.Errorf("queue=%d: at most %d queues: %w", n, maxQueues, fabric.ErrInvalid)
			}
			a.queue, a.listener = n, true
		default:
			return a, fmt.Errorf("unknown parameter %q: %w", k, fabric.ErrInvalid)
		}
	}
	return a, nil
}

// mappingParam parses the parameters of pci: and mem: addresses; ok
// false leaves k to the common ones.
func (a *ntbAddr) mappingParam(k, v string) (ok bool, err error) {
	bad := func(err error) (bool, error) {
		return true, fmt.Errorf("%s=%q: %w: %w", k, v, fabric.ErrInvalid, err)
	}
	switch k {
	case "poll", "link", "dead":
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return bad(errors.Join(err, errors.New("want a positive duration")))
		}
		*map[string]*time.Duration{"poll": &a.mc.Poll, "link": &a.mc.Link, "dead": &a.mc.Dead}[k] = d
		return true, nil
	case "side":
		switch v {
		case "0", "1":
			a.mc.Side = int(v[0] - '0')
		case "any", "-1":
			a.mc.Side = -1
		default:
			return bad(errors.New("want 0, 1 or any"))
		}
		return true, nil
	case "wc":
		a.wc = v == "1" || v == "true"
		return true, nil
	case "bar", "off", "size":
		n, err := units.ParseSize(v, 1<<40)
		if err != nil {
			return bad(err)
		}
		switch k {
		case "bar":
			a.bar = n
		case "off":
			a.off = int64(n)
		case "size":
			a.size = int64(n)
		}
		return true, nil
	}
	return false, nil
}

// dialMapped opens a bridge laid out in a PCI BAR (pci:) or a mapped file
// (mem:) and brings up a one-queue transport over it.
func dialMapped(ctx context.Context, addr string, a ntbAddr) (*Endpoint, error) {
	if a.tc.Queues > 1 {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr,
			Err: fmt.Errorf("%d queues: a mapped bridge opens one: %w", a.tc.Queues, fabric.ErrInvalid)}
	}
	var m Mapping
	var err error
	switch a.kind {
	case "pci":
		m, err = mapPCI(a.path, a.bar, a.wc, uint64(a.off), uint64(a.size))
	default:
		m, err = MapFile(a.path, a.off, a.size)
	}
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: err}
	}
	a.mc.Geometry = a.sc
	dev, err := OpenMapping(a.kind+":"+a.path, m, a.mc)
	if err != nil {
		m.Close()
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: err}
	}
	t, err := Dial(ctx, dev, a.tc)
	if err != nil {
		dev.Close()
		return nil, err
	}
	ep := t.eps[0]
	ep.owner, ep.addr = true, addr
	return ep, nil
}
