package ntb

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/addrparam"
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
	var ep *Endpoint
	switch {
	case a.kind != "" && a.listener:
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr,
			Err: fmt.Errorf("listener=1 over a %s: bridge: %w", a.kind, fabric.ErrNotSupported)}
	case a.kind != "":
		ep, err = dialMapped(ctx, addr, a)
	case a.listener:
		ep, err = dialListener(ctx, addr, a.path, a.sc, a.tc, a.queue)
	default:
		ep, err = DialShm(ctx, a.path, a.sc, a.tc)
	}
	if err != nil {
		return nil, err // never a nil *Endpoint in a non-nil fabric.Endpoint
	}
	return ep, nil
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
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: path, Err: errOneQueue(tc.Queues)}
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
	ep := t.endpoints()[0]
	ep.owner, ep.addr = true, path
	return ep, nil
}

// errOneQueue refuses queues=n on an endpoint that carries one queue.
func errOneQueue(n int) error {
	return fmt.Errorf("queues=%d: an endpoint opened on its own carries one queue; "+
		"Listen with queues=%d and dial it with listener=1 (or use OpenShm and Dial): %w", n, n, fabric.ErrInvalid)
}

// ParseAddr parses an ntb address: a file path with an optional query of
// mem, mws, spads, dbbits (device geometry, used when the file is
// created) and queues, ring, maxmsg, window, dma, dmachan (transport),
// in the query grammar of every backend (PATH?k=v&k=v). Sizes take K, M
// and G suffixes. The parameters listener and queue, which select how
// fabric.Open connects, are accepted and not returned. A malformed value
// or an unknown parameter is an error that names the key and matches
// fabric.ErrInvalid.
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
	path, p, err := addrparam.Split(addr)
	for _, k := range []string{"pci", "mem"} {
		if r, ok := strings.CutPrefix(path, k+":"); ok {
			a.kind, path = k, r
		}
	}
	if path == "" {
		return a, fmt.Errorf("empty path: %w", fabric.ErrInvalid)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return a, fmt.Errorf("path %q holds a NUL byte: %w", path, fabric.ErrInvalid)
	}
	a.path = path
	if err != nil {
		return a, err
	}
	const limit = 1 << 40
	a.sc.MemSize = p.Size("mem", 0, limit)
	a.sc.MWs = p.Size("mws", 0, limit)
	a.sc.Spads = p.Size("spads", 0, limit)
	a.sc.DoorbellBits = p.Size("dbbits", 0, limit)
	a.tc.Queues = p.Size("queues", 0, limit)
	a.tc.RingSize = p.Size("ring", 0, limit)
	a.tc.MaxMsgSize = p.Size("maxmsg", 0, limit)
	a.tc.WindowSize = p.Size("window", 0, limit)
	a.tc.DMAThreshold = p.Size("dma", 0, limit)
	a.tc.DMAChannels = p.Size("dmachan", 0, limit)
	a.listener = p.Bool("listener", false)
	if q := p.Int("queue", -1, 0, maxQueues-1); q >= 0 {
		a.queue, a.listener = q, true
	}
	if a.kind != "" {
		a.mappingParams(p)
	}
	return a, p.Err()
}

// mappingParams reads the parameters of pci: and mem: addresses (other
// addresses do not know them).
func (a *ntbAddr) mappingParams(p *addrparam.Params) {
	a.mc.Poll = p.Duration("poll", 0, 1, math.MaxInt64)
	a.mc.Link = p.Duration("link", 0, 1, math.MaxInt64)
	a.mc.Dead = p.Duration("dead", 0, 1, math.MaxInt64)
	a.mc.Side = addrparam.Enum(p, "side", -1, map[string]int{"0": 0, "1": 1, "any": -1, "-1": -1})
	a.wc = p.Bool("wc", false)
	a.bar = p.Size("bar", a.bar, 1<<40)
	a.off = int64(p.Size("off", 0, 1<<40))
	a.size = int64(p.Size("size", 0, 1<<40))
}

// dialMapped opens a bridge laid out in a PCI BAR (pci:) or a mapped file
// (mem:) and brings up a one-queue transport over it.
func dialMapped(ctx context.Context, addr string, a ntbAddr) (*Endpoint, error) {
	if a.tc.Queues > 1 {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: errOneQueue(a.tc.Queues)}
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
	dev, err := openMapping(ctx, a.kind+":"+a.path, m, a.mc)
	if err != nil {
		m.Close()
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: err}
	}
	t, err := Dial(ctx, dev, a.tc)
	if err != nil {
		dev.Close()
		return nil, err
	}
	ep := t.endpoints()[0]
	ep.owner, ep.addr = true, addr
	return ep, nil
}
