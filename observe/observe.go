// Package observe lets a program that uses Weft expose what its
// endpoints, devices and links are doing: their state and counters, and
// a log of link and peer events with timestamps. It is opt-in: nothing
// in Weft registers anything unless the program asks.
//
// A Registry holds sources (anything with a Status: an endpoint through
// AddEndpoint, a vnet bridge, a program's own) and an event log. Its
// Handler serves, over HTTP:
//
//	GET /snapshot           JSON: every source's status and counters, and the recent events
//	GET /events?after=N     JSON: the events after sequence number N; with wait=DURATION
//	                        it long-polls until there is one, so a watcher sees a
//	                        link flap as soon as it is recorded
//
// The weft command (cmd/weft) reads them: `weft status` and `weft watch`.
// Prometheus metrics of the same sources are in the module
// github.com/weft-io/weft/observe/prometheus, a module of its own so
// that the SDK's go.mod does not carry client_golang and its
// dependencies for programs that do not want them.
package observe

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Counter is one named counter or gauge of a source.
type Counter struct {
	// Name is a metric-style name: lower case, words joined by '_'
	// ("tx_bytes", "drops_malformed").
	Name string `json:"name"`
	// Value is the counter's value.
	Value uint64 `json:"value"`
	// Gauge marks a value that can go down (a queue length, a state).
	Gauge bool `json:"gauge,omitempty"`
	// Help describes the counter.
	Help string `json:"help,omitempty"`
}

// Status is what a source reports about itself.
type Status struct {
	// Kind is what the source is: "endpoint", "vnet", "listener", ...
	Kind string `json:"kind"`
	// Backend is the fabric backend, if any.
	Backend string `json:"backend,omitempty"`
	// Path is the carrier an endpoint's connection uses, where its
	// backend has several (fabric.Caps.Path: roce's "udp" or "shm").
	Path string `json:"path,omitempty"`
	// Local and Remote are addresses, in the backend's syntax.
	Local  string `json:"local,omitempty"`
	Remote string `json:"remote,omitempty"`
	// State is "up", "down", "gone" or a source's own word.
	State string `json:"state"`
	// Since is when State last changed (zero if unknown).
	Since time.Time `json:"since,omitzero"`
	// Counters are the source's counters.
	Counters []Counter `json:"counters"`
}

// Source is anything a Registry can report on.
type Source interface {
	// Status returns the source's status now. It must be safe for
	// concurrent use.
	Status() Status
}

// SourceFunc adapts a function to a Source.
type SourceFunc func() Status

// Status calls f.
func (f SourceFunc) Status() Status { return f() }

// Event is one entry of the event log.
type Event struct {
	// Seq numbers the registry's events from 1, without gaps.
	Seq uint64 `json:"seq"`
	// Time is when the event happened.
	Time time.Time `json:"time"`
	// Source is the name of the source it concerns.
	Source string `json:"source"`
	// Kind is "link-up", "link-down", "peer-gone", "error",
	// "carrier-on", "carrier-off", "added", "removed", ...
	Kind string `json:"kind"`
	// Detail is free text (an error message).
	Detail string `json:"detail,omitempty"`
}

// Snapshot is the state of a registry at one moment.
type Snapshot struct {
	// Time is when it was taken.
	Time time.Time `json:"time"`
	// Program names the program (its Registry's name).
	Program string `json:"program,omitempty"`
	// Sources are the registered sources, by name.
	Sources []NamedStatus `json:"sources"`
	// Events are the most recent events, oldest first.
	Events []Event `json:"events"`
}

// NamedStatus is a source's status with its name.
type NamedStatus struct {
	Name string `json:"name"`
	Status
}

// DefaultLogSize is how many events a registry keeps.
const DefaultLogSize = 1024

// Registry holds sources and an event log. The zero value is not usable;
// call NewRegistry.
type Registry struct {
	name string

	mu      sync.Mutex
	sources map[string]Source
	log     []Event // ring of the last len(log) events
	seq     uint64
	notify  chan struct{} // closed and replaced on each event
	stops   map[string]func()
}

// NewRegistry returns an empty registry; name identifies the program in
// snapshots.
func NewRegistry(name string) *Registry {
	return &Registry{name: name, sources: map[string]Source{}, log: make([]Event, DefaultLogSize),
		notify: make(chan struct{}), stops: map[string]func(){}}
}

// ErrExists is returned by Add for a name that is taken.
var ErrExists = errors.New("observe: name already registered")

// Add registers src under name. Its error wraps fabric.ErrInvalid (an
// empty name) or ErrExists.
func (r *Registry) Add(name string, src Source) error {
	if name == "" {
		return &fabric.OpError{Op: "observe add", Err: fabric.ErrInvalid}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.sources[name]; ok {
		return &fabric.OpError{Op: "observe add", Addr: name, Err: ErrExists}
	}
	r.sources[name] = src
	return nil
}

// Remove unregisters name, stopping its event watcher if it has one.
func (r *Registry) Remove(name string) {
	r.mu.Lock()
	stop := r.stops[name]
	delete(r.stops, name)
	delete(r.sources, name)
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Record appends an event to the log and wakes the watchers. A zero
// ev.Time is set to now; ev.Seq is assigned.
func (r *Registry) Record(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	r.mu.Lock()
	r.seq++
	ev.Seq = r.seq
	r.log[int((r.seq-1)%uint64(len(r.log)))] = ev
	close(r.notify)
	r.notify = make(chan struct{})
	r.mu.Unlock()
}

// Events returns the logged events after sequence number after (at most
// the log's size, oldest first), and the channel that is closed at the
// next event.
func (r *Registry) Events(after uint64) ([]Event, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := uint64(1)
	if r.seq > uint64(len(r.log)) {
		first = r.seq - uint64(len(r.log)) + 1
	}
	if after+1 > first {
		first = after + 1
	}
	var out []Event
	for s := first; s <= r.seq; s++ {
		out = append(out, r.log[int((s-1)%uint64(len(r.log)))])
	}
	return out, r.notify
}

// WaitEvents is Events that waits until there is at least one event
// after after, or ctx is done (then it returns what there is: nothing).
func (r *Registry) WaitEvents(ctx context.Context, after uint64) []Event {
	for {
		evs, ch := r.Events(after)
		if len(evs) > 0 {
			return evs
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
}

// Snapshot returns every source's status and the logged events.
func (r *Registry) Snapshot() Snapshot {
	r.mu.Lock()
	names := make([]string, 0, len(r.sources))
	for n := range r.sources {
		names = append(names, n)
	}
	srcs := make([]Source, len(names))
	slices.Sort(names)
	for i, n := range names {
		srcs[i] = r.sources[n]
	}
	r.mu.Unlock()
	s := Snapshot{Time: time.Now(), Program: r.name}
	for i, n := range names {
		s.Sources = append(s.Sources, NamedStatus{Name: n, Status: srcs[i].Status()})
	}
	s.Events, _ = r.Events(0)
	return s
}

// Name returns the registry's program name.
func (r *Registry) Name() string { return r.name }
