//go:build linux

package vnet

import (
	"fmt"

	"github.com/weft-io/weft/observe"
)

// Observe registers the bridge in r under name (kind "vnet": carrier,
// frame counters and drops) and its endpoints as name/q0, name/q1, ...,
// and from then on records the bridge's events in r's log: carrier
// changes under name, link events under the queue's name. The bridge
// keeps reading the endpoints' events itself.
func (b *Bridge) Observe(r *observe.Registry, name string) error {
	if err := r.Add(name, observe.SourceFunc(b.status)); err != nil {
		return err
	}
	for i, q := range b.qs {
		ep := q.ep
		qi := i
		qname := fmt.Sprintf("%s/q%d", name, i)
		err := r.Add(qname, observe.SourceFunc(func() observe.Status {
			c := ep.Caps()
			b.mu.Lock()
			st := "up"
			switch {
			case b.gone[qi]:
				st = "gone"
			case !b.up[qi]:
				st = "down"
			}
			b.mu.Unlock()
			return observe.Status{Kind: "endpoint", Backend: c.Backend, Local: ep.LocalAddr(),
				Remote: ep.RemoteAddr(), State: st, Counters: observe.EndpointCounters(ep.Stats())}
		}))
		if err != nil {
			return err
		}
	}
	b.obs.Store(&observer{r: r, name: name})
	r.Record(observe.Event{Source: name, Kind: "added", Detail: fmt.Sprintf("%s %s, %d queues, mtu %d", b.cfg.Kind, b.name, len(b.qs), b.cfg.mtu())})
	return nil
}

type observer struct {
	r    *observe.Registry
	name string
}

func (o *observer) record(ev Event) {
	e := observe.Event{Time: ev.Time, Source: o.name, Kind: ev.Kind.String()}
	if ev.Kind == Link {
		e.Source = fmt.Sprintf("%s/q%d", o.name, ev.Queue)
		e.Kind = ev.Link.Kind.String()
		if ev.Link.Err != nil {
			e.Detail = ev.Link.Err.Error()
		}
	}
	o.r.Record(e)
}

func (b *Bridge) status() observe.Status {
	s := b.Stats()
	st := "down"
	if s.Carrier {
		st = "up"
	}
	ep := b.qs[0].ep
	b.mu.Lock()
	since := b.since
	b.mu.Unlock()
	cnt := func(name string, v uint64, help string) observe.Counter {
		return observe.Counter{Name: name, Value: v, Help: help}
	}
	carrier := uint64(0)
	if s.Carrier {
		carrier = 1
	}
	return observe.Status{Kind: "vnet", Backend: ep.Caps().Backend, Local: b.name, Remote: ep.RemoteAddr(),
		State: st, Since: since, Counters: []observe.Counter{
			cnt("tx_frames", s.TxFrames, "frames from the device to the fabric"),
			cnt("tx_bytes", s.TxBytes, "bytes from the device to the fabric"),
			cnt("rx_frames", s.RxFrames, "frames from the fabric to the device"),
			cnt("rx_bytes", s.RxBytes, "bytes from the fabric to the device"),
			cnt("tx_dropped", s.TxDropped, "device frames the fabric refused"),
			cnt("rx_dropped", s.RxDropped, "fabric frames the device refused"),
			cnt("drops_truncated", s.Truncated, "fabric frames dropped: truncated"),
			cnt("drops_oversized", s.Oversized, "fabric frames dropped: oversized"),
			cnt("drops_bad_header", s.BadHeader, "fabric frames dropped: bad header"),
			cnt("drops_bad_vnet_hdr", s.BadVnetHdr, "fabric frames dropped: bad virtio-net header"),
			cnt("drops_bad_frame", s.BadFrame, "fabric frames dropped: malformed frame"),
			cnt("carrier_changes", s.CarrierChanges, "carrier transitions"),
			{Name: "carrier", Value: carrier, Gauge: true, Help: "1 while the device has carrier"},
			{Name: "queues", Value: uint64(len(b.qs)), Gauge: true, Help: "device queues (fabric endpoints)"},
		}}
}
