package batch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Group is a set of Coalescers, one per destination endpoint: batching is
// per peer (a batch is one message on one queue pair, rung with one
// doorbell), so a router that forwards to several next-hop nodes batches
// each next hop separately. Add routes a packet by destination index;
// Tick, Flush and Reclaim cover every destination.
//
// Its methods are safe for concurrent use.
type Group struct {
	cs []*Coalescer
}

// NewGroup returns a Group with a Coalescer on each of eps, destination i
// being eps[i], each with opts (which may be nil).
func NewGroup(eps []fabric.Endpoint, opts *Options) (*Group, error) {
	g := &Group{cs: make([]*Coalescer, 0, len(eps))}
	for i, ep := range eps {
		c, err := NewCoalescer(ep, opts)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("destination %d: %w", i, err)
		}
		g.cs = append(g.cs, c)
	}
	return g, nil
}

var errDest = fmt.Errorf("batch: destination index out of range: %w", fabric.ErrInvalid)

// Len returns the number of destinations.
func (g *Group) Len() int { return len(g.cs) }

// Coalescer returns the coalescer of destination dst.
func (g *Group) Coalescer(dst int) *Coalescer { return g.cs[dst] }

// Add adds a packet for destination dst (see Coalescer.Add).
func (g *Group) Add(dst int, p fabric.SGE, cookie uint64) error {
	if uint(dst) >= uint(len(g.cs)) {
		return errDest
	}
	return g.cs[dst].Add(p, cookie)
}

// Tick ticks every destination (see Coalescer.Tick). It returns the total
// of batches still queued and the first error.
func (g *Group) Tick(now time.Time) (int, error) {
	return g.each(func(c *Coalescer) (int, error) { return c.Tick(now) })
}

// Poll is Tick(time.Now()).
func (g *Group) Poll() (int, error) { return g.Tick(time.Now()) }

// Flush flushes every destination (see Coalescer.Flush).
func (g *Group) Flush() (int, error) {
	return g.each((*Coalescer).Flush)
}

func (g *Group) each(f func(*Coalescer) (int, error)) (int, error) {
	total := 0
	var first error
	for _, c := range g.cs {
		n, err := f(c)
		total += n
		if err != nil && first == nil {
			first = err
		}
	}
	return total, first
}

// FlushWait flushes every destination and waits until each endpoint has
// taken every batch (see Coalescer.FlushWait).
func (g *Group) FlushWait(ctx context.Context) error {
	for _, c := range g.cs {
		if err := c.FlushWait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Reclaim stores the cookies of free packets of every destination into
// out (see Coalescer.Reclaim) and returns how many.
func (g *Group) Reclaim(out []uint64) int {
	n := 0
	for _, c := range g.cs {
		if n == len(out) {
			break
		}
		n += c.Reclaim(out[n:])
	}
	return n
}

// Stats returns the sum of every destination's counters.
func (g *Group) Stats() Stats {
	var s Stats
	for _, c := range g.cs {
		cs := c.Stats()
		s.Add(&cs)
	}
	return s
}

// Close closes every coalescer (see Coalescer.Close). It is idempotent.
func (g *Group) Close() error {
	for _, c := range g.cs {
		c.Close()
	}
	return nil
}

// Ticker is what Run drives: a Coalescer or a Group.
type Ticker interface {
	Tick(now time.Time) (int, error)
}

// Run calls t.Tick in a loop until ctx is done or t is closed, for
// programs without a polling loop of their own: it keeps a core busy (it
// yields to the scheduler now and then), as the deadline is a few
// microseconds, below what a timer can wake for. Send errors other than
// os.ErrClosed do not stop it (the endpoint may come back); they show in
// the coalescer's counters and in the next Tick of the program's own.
func Run(ctx context.Context, t Ticker) error {
	for i := 1; ; i++ {
		if _, err := t.Tick(time.Now()); errors.Is(err, os.ErrClosed) {
			return err
		}
		if i&63 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			runtime.Gosched()
		}
	}
}
