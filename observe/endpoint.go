package observe

import (
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
)

// EndpointCounters returns the counters of a fabric.Stats, named for
// Status.Counters.
func EndpointCounters(s fabric.Stats) []Counter {
	c := []Counter{
		{Name: "tx_packets", Value: s.TxPackets, Help: "wire units sent"},
		{Name: "tx_bytes", Value: s.TxBytes, Help: "bytes sent"},
		{Name: "tx_messages", Value: s.TxMessages, Help: "messages sent"},
		{Name: "rx_packets", Value: s.RxPackets, Help: "wire units received"},
		{Name: "rx_bytes", Value: s.RxBytes, Help: "bytes received"},
		{Name: "rx_messages", Value: s.RxMessages, Help: "messages received"},
		{Name: "retransmits", Value: s.Retransmits, Help: "packets retransmitted"},
		{Name: "doorbells", Value: s.Doorbells, Help: "doorbells rung"},
		{Name: "wakeups", Value: s.Wakeups, Help: "sleeps ended by a wake-up"},
	}
	for r := fabric.DropReason(0); r < fabric.NumDropReasons; r++ {
		c = append(c, Counter{Name: "drops_" + underscore(r.String()), Value: s.Drops[r], Help: "input dropped: " + r.String()})
	}
	return c
}

func underscore(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '-' {
			b[i] = '_'
		}
	}
	return string(b)
}

// endpointSource is an endpoint's Source: its caps, addresses, counters,
// and the state its events say.
type endpointSource struct {
	ep    fabric.Endpoint
	mu    sync.Mutex
	state string
	since time.Time
}

func (s *endpointSource) Status() Status {
	c := s.ep.Caps()
	s.mu.Lock()
	st, since := s.state, s.since
	s.mu.Unlock()
	return Status{Kind: "endpoint", Backend: c.Backend, Path: c.Path, Local: s.ep.LocalAddr(), Remote: s.ep.RemoteAddr(),
		State: st, Since: since, Counters: EndpointCounters(s.ep.Stats())}
}

func (s *endpointSource) set(state string, t time.Time) {
	s.mu.Lock()
	s.state, s.since = state, t
	s.mu.Unlock()
}

// EventState returns the state a fabric event leaves a link in: "up",
// "down", "gone" or "error".
func EventState(k fabric.EventKind) string {
	switch k {
	case fabric.EventLinkUp:
		return "up"
	case fabric.EventLinkDown:
		return "down"
	case fabric.EventPeerGone:
		return "gone"
	}
	return "error"
}

// AddEndpoint registers an open endpoint under name. Its state starts
// "up" (an endpoint is connected when Open returns).
//
// With watch, the registry reads ep.Events() itself — the program must
// not, since an event goes to one reader only — records each event in
// the log under name and follows the state from them; the watcher stops
// at Remove or when the channel closes. Without watch the state stays
// "up" unless the program calls EndpointEvent with the events it reads.
func (r *Registry) AddEndpoint(name string, ep fabric.Endpoint, watch bool) error {
	src := &endpointSource{ep: ep, state: "up", since: time.Now()}
	if err := r.Add(name, src); err != nil {
		return err
	}
	r.Record(Event{Source: name, Kind: "added", Detail: ep.Caps().Backend + " " + ep.RemoteAddr()})
	if !watch {
		return nil
	}
	stop := make(chan struct{})
	var once sync.Once
	r.mu.Lock()
	r.stops[name] = func() { once.Do(func() { close(stop) }) }
	r.mu.Unlock()
	go func() {
		evs := ep.Events()
		for {
			select {
			case <-stop:
				return
			case ev, ok := <-evs:
				if !ok {
					return
				}
				r.endpointEvent(name, src, ev)
			}
		}
	}()
	return nil
}

// EndpointEvent records an event of the endpoint registered as name that
// the program read from its Events channel itself, and updates its state.
func (r *Registry) EndpointEvent(name string, ev fabric.Event) {
	r.mu.Lock()
	src, _ := r.sources[name].(*endpointSource)
	r.mu.Unlock()
	r.endpointEvent(name, src, ev)
}

func (r *Registry) endpointEvent(name string, src *endpointSource, ev fabric.Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if src != nil {
		src.set(EventState(ev.Kind), ev.Time)
	}
	e := Event{Time: ev.Time, Source: name, Kind: ev.Kind.String()}
	if ev.Err != nil {
		e.Detail = ev.Err.Error()
	}
	r.Record(e)
}
