package sock

import (
	"sync/atomic"
)

// Small Writes that find another Write in progress are combined, as a
// flat-combining lock does and as TCP's autocorking does: a Write of at
// most corkMax bytes that finds wmu held queues itself in a waiter slot
// of the Conn (its slice; no allocation), and the goroutine that holds
// wmu, once its own Write is done, takes every queued Write that fits
// corkBuf, sends them as one DATA frame and wakes their writers with
// their results. A Write that finds wmu free goes out at once, as a lone
// Write always did: nothing waits for company (no timer, no Nagle).
//
// Each Write stays atomic: its bytes are copied whole, in the order the
// writers queued, into corkBuf. A queued Write whose deadline passes (or
// whose Conn closes) before a holder took it leaves the queue with 0
// bytes written and is never sent; once taken, its bytes go out with
// the others, and the error of the combined write, if any, reaches each
// writer whose bytes it did not send.
//
// No queued Write is stranded: a writer queues itself and then tries
// wmu again (it combines itself if the holder has just let go), and
// every holder, after letting go of wmu, appoints the first queued
// writer, if any, to take wmu and combine the queue (lead); a holder
// combines one batch only, so that its own Write returns.
const (
	// corkMax is the largest Write that is combined.
	corkMax = 2 << 10
	// corkBuf is the most bytes combined into one write: below zcMin,
	// so that it is copied into the send slots and never registered.
	corkBuf = 8 << 10
	// corkRounds bounds the combined writes a holder sends after its
	// own Write.
	corkRounds = 4
	// corkSlots is the most Writes queued at once; more wait on wmu.
	corkSlots = 64
)

// Waiter states, under cmu.
const (
	corkFree   uint8 = iota
	corkQueued       // in cq, its bytes not taken
	corkTaken        // taken by a holder: its result comes with wake
	corkLead         // appointed to take wmu and combine (wake)
	corkOwn          // combining its own bytes, holding wmu
)

// corkWaiter is one queued Write.
type corkWaiter struct {
	p     []byte
	state uint8
	// n and err are the result, written by the holder that took p
	// before it signals wake.
	n    int
	err  error
	wake chan struct{} // capacity 1: one signal per use of the slot
}

// corker is the combining state of a Conn.
type corker struct {
	// cqn is len(cq), read without cmu on the fast paths.
	cqn     atomic.Int32
	cleader bool // a writer was appointed to lead and has not taken wmu
	cw      [corkSlots]corkWaiter
	cq      [corkSlots]uint8 // queued slots, oldest first
	cqlen   int
	cfree   [corkSlots]uint8 // free slots
	cnfree  int
	ctaken  [corkSlots]uint8 // the slots of the batch being sent (wmu)
	cbuf    []byte           // the batch (wmu), allocated on first use
}

func (k *corker) init() {
	for i := range k.cw {
		k.cw[i].wake = make(chan struct{}, 1)
		k.cfree[i] = uint8(corkSlots - 1 - i)
	}
	k.cnfree = corkSlots
}

// unqueueLocked removes the waiter at position j of cq. The caller
// holds cmu.
func (k *corker) unqueueLocked(j int) {
	copy(k.cq[j:k.cqlen], k.cq[j+1:k.cqlen])
	k.cqlen--
	k.cqn.Add(-1)
}

// releaseLocked frees slot i. The caller holds cmu.
func (k *corker) releaseLocked(i uint8) {
	w := &k.cw[i]
	w.p, w.err, w.n, w.state = nil, nil, 0, corkFree
	k.cfree[k.cnfree] = i
	k.cnfree++
}

// Write implements net.Conn. It returns once all of p has been handed to
// the endpoint, waiting for credit from the peer as needed, or when the
// write deadline passes (with the count of bytes sent before it).
// Concurrent Writes are never interleaved; small ones that find another
// in progress are combined into one frame (see corkMax).
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 || len(p) > corkMax {
		c.wmu.Lock()
		n, err := c.writeLocked(p)
		c.combineLocked(nil)
		c.wunlock()
		return n, err
	}
	if c.wmu.TryLock() {
		n, err := c.combineLocked(p)
		c.wunlock()
		return n, err
	}
	return c.writeQueued(p)
}

// writeQueued queues p, a small Write that found wmu held, and returns
// its result once a holder has sent it, or once the write deadline
// passes or the Conn closes before any took it.
func (c *Conn) writeQueued(p []byte) (int, error) {
	k := &c.cork
	c.cmu.Lock()
	if k.cnfree == 0 {
		c.cmu.Unlock()
		c.wmu.Lock()
		n, err := c.combineLocked(p)
		c.wunlock()
		return n, err
	}
	k.cnfree--
	i := k.cfree[k.cnfree]
	w := &k.cw[i]
	w.p, w.state = p, corkQueued
	k.cq[k.cqlen] = i
	k.cqlen++
	k.cqn.Add(1)
	c.cmu.Unlock()
	// The holder may have let go before it could see p queued.
	if c.wmu.TryLock() {
		c.cmu.Lock()
		st := w.state
		switch st {
		case corkQueued:
			c.unqueueLocked(w)
			w.state = corkOwn
		case corkLead:
			k.cleader = false
		}
		c.cmu.Unlock()
		if st != corkQueued {
			<-w.wake // the appointment, or the result of whoever took p
		}
		n, err := w.n, w.err
		if st == corkTaken {
			c.combineLocked(nil)
		} else {
			n, err = c.combineLocked(p)
		}
		c.wunlock()
		return c.release(i, n, err)
	}
	for {
		e := c.wdl.ctx()
		select {
		case <-w.wake:
		case <-e.Done():
			err := e.Err()
			if err == nil {
				continue
			}
			c.cmu.Lock()
			if w.state == corkQueued {
				c.unqueueLocked(w)
				c.cmu.Unlock()
				return c.release(i, 0, c.opErr("write", err))
			}
			c.cmu.Unlock()
			<-w.wake
		}
		break
	}
	c.cmu.Lock()
	st := w.state
	c.cmu.Unlock()
	if st != corkLead {
		return c.release(i, w.n, w.err)
	}
	c.wmu.Lock()
	c.cmu.Lock()
	k.cleader = false
	w.state = corkOwn
	c.cmu.Unlock()
	n, err := c.combineLocked(p)
	c.wunlock()
	return c.release(i, n, err)
}

// unqueueLocked removes w, queued, from cq. The caller holds cmu.
func (c *Conn) unqueueLocked(w *corkWaiter) {
	k := &c.cork
	for j := range k.cqlen {
		if &k.cw[k.cq[j]] == w {
			k.unqueueLocked(j)
			return
		}
	}
}

// release frees waiter slot i and returns n, err.
func (c *Conn) release(i uint8, n int, err error) (int, error) {
	c.cmu.Lock()
	c.cork.releaseLocked(i)
	c.cmu.Unlock()
	return n, err
}

// combineLocked sends own (a small Write, or nil) and the queued Writes
// that fit corkBuf with it as one write, and returns own's result; each
// queued writer taken gets its own with its wake. Without queued Writes
// it sends own as is. It then sends what was queued meanwhile, up to
// corkRounds writes in all: a writer woken to lead costs a wake-up on
// the path of every Write queued behind it. The caller holds wmu.
func (c *Conn) combineLocked(own []byte) (int, error) {
	n, err := c.combineOnce(own)
	for r := 1; r < corkRounds && c.cork.cqn.Load() > 0; r++ {
		c.combineOnce(nil)
	}
	return n, err
}

// combineOnce is one write of combineLocked.
func (c *Conn) combineOnce(own []byte) (int, error) {
	k := &c.cork
	if k.cqn.Load() == 0 {
		if own == nil {
			return 0, nil
		}
		return c.writeLocked(own)
	}
	c.cmu.Lock()
	total, t := len(own), 0
	for t < k.cqlen {
		w := &k.cw[k.cq[t]]
		if total+len(w.p) > corkBuf {
			break
		}
		w.state = corkTaken
		k.ctaken[t] = k.cq[t]
		total += len(w.p)
		t++
	}
	copy(k.cq[:], k.cq[t:k.cqlen])
	k.cqlen -= t
	k.cqn.Add(-int32(t))
	c.cmu.Unlock()
	if t == 0 {
		if own == nil {
			return 0, nil
		}
		return c.writeLocked(own)
	}
	if k.cbuf == nil {
		k.cbuf = make([]byte, corkBuf) // once per Conn
	}
	b := k.cbuf[:0]
	b = append(b, own...)
	for _, i := range k.ctaken[:t] {
		b = append(b, k.cw[i].p...)
	}
	n, err := c.writeLocked(b)
	off := len(own)
	for _, i := range k.ctaken[:t] {
		w := &k.cw[i]
		w.n, w.err = sentOf(n, off, len(w.p), err)
		off += len(w.p)
		signal(w.wake)
	}
	return sentOf(n, 0, len(own), err)
}

// sentOf is the result of the Write whose l bytes were at offset off of a
// combined write that sent n bytes and failed with err: its bytes sent,
// and err if some were not.
func sentOf(n, off, l int, err error) (int, error) {
	s := min(max(n-off, 0), l)
	if s < l {
		return s, err
	}
	return s, nil
}

// wunlock lets go of wmu and, if Writes are queued and no writer has
// been appointed to send them, appoints the oldest.
func (c *Conn) wunlock() {
	c.wmu.Unlock()
	k := &c.cork
	if k.cqn.Load() == 0 {
		return
	}
	c.cmu.Lock()
	if k.cqlen == 0 || k.cleader {
		c.cmu.Unlock()
		return
	}
	i := k.cq[0]
	k.unqueueLocked(0)
	k.cw[i].state = corkLead
	k.cleader = true
	c.cmu.Unlock()
	signal(k.cw[i].wake)
}
