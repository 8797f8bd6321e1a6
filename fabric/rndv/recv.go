package rndv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Recv receives the next message into dst and returns its length. A
// message longer than dst fills it and returns ErrTruncated. dst must be
// in a region with fabric.AccessLocalWrite; with AccessRemoteWrite as
// well, a message above the threshold is written into it by the sender,
// with no copy here.
//
// A Recv that ctx ends before any of the next message arrived, and
// before it advertised dst, returns ctx's error and the connection goes
// on: the next Recv takes that message. Once it has taken a frame of the
// message, or advertised dst (a rendezvous receive after a rendezvous
// message advertises at once), the message cannot be resumed, and the
// peer may still write into dst: ctx's end then fails the connection,
// which closes the endpoint, and later calls return that error.
func (c *Conn) Recv(ctx context.Context, dst fabric.SGE) (int, error) {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if err := c.closedErr("recv"); err != nil {
		return 0, err
	}
	if err := c.check("recv", dst, fabric.AccessLocalWrite); err != nil {
		return 0, err
	}
	c.rbegun = false
	n, err := c.recv(ctx, dst)
	if err != nil && !errors.Is(err, ErrTruncated) && c.rbegun {
		err = c.fail(fmt.Errorf("rndv: a receive cut short in its message: %w", err))
	}
	return n, c.opErr("recv", err)
}

// recv is Recv with recvMu held.
func (c *Conn) recv(ctx context.Context, dst fabric.SGE) (int, error) {
	c.mu.Lock()
	seq, pre := c.rseq, c.lastRdv
	c.mu.Unlock()
	writable := c.thresh >= 0 && dst.Length > c.thresh && dst.Region.Access().Has(fabric.AccessRemoteWrite)
	// advertised: an ADV answered the message (or went before it);
	// advWritable: it named dst, which the peer may write.
	advertised, advWritable := false, false
	if writable && pre {
		// The last message came by rendezvous: advertise now and save
		// the sender's RTS round trip.
		if err := c.sendADV(ctx, seq, dst, false); err != nil {
			return 0, err
		}
		advertised, advWritable, c.rbegun = true, true, true
		c.mu.Lock()
		c.stats.Adverts++
		c.mu.Unlock()
	}
	var (
		got     int    // bytes stored in dst
		total   uint64 // DATA: the message's length
		taken   uint64 // DATA: bytes of it seen
		data    bool   // DATA frames have started
		written bool   // rendezvous writes have landed
	)
	defer c.disarm()
	buf := dst.Region.Bytes()[dst.Offset : dst.Offset+dst.Length]
	for {
		r, err := c.next(ctx)
		if err != nil {
			return got, err
		}
		c.rbegun = true
		if r.notify {
			c.release(r.slot)
			switch {
			case !advWritable || data:
				return got, c.violation("an RMA write for message %d, which has no advertised buffer", seq)
			case r.imm&immReserved != 0 || r.imm&immSeqMask != seq&immSeqMask:
				return got, c.violation("an RMA write for message %#x while receiving %d", r.imm, seq)
			case r.n < 0 || r.n > dst.Length-got:
				return got, c.violation("RMA writes of more than the %d bytes advertised", dst.Length)
			}
			got += r.n
			written = true
			if r.imm&immLast == 0 {
				// The peer is committed (its writes have started,
				// into a buffer advertised before any RTS): bound
				// the wait for the rest, from the first write.
				if !c.armed() {
					c.arm()
				}
				continue
			}
			c.done(seq, true)
			if r.imm&immTruncated != 0 {
				return got, ErrTruncated
			}
			return got, nil
		}
		h := Header(c.rx.Bytes()[int(r.slot)*c.slotSize:][:r.n])
		if h.Seq() != seq {
			c.release(r.slot)
			return got, c.violation("%s for message %d while receiving %d", kindNames[h.Kind()], h.Seq(), seq)
		}
		switch h.Kind() {
		case kindRTS:
			c.release(r.slot)
			if data || written {
				return got, c.violation("RTS for message %d in its data", seq)
			}
			if advertised {
				// The ADV sent at once answers it, and the peer is
				// committed: bound the wait for its data.
				if advWritable && !c.armed() {
					c.arm()
				}
				continue
			}
			if err := c.sendADV(ctx, seq, dst, !writable); err != nil {
				return got, err
			}
			advertised, advWritable = true, writable
			if writable {
				// The peer is committed: bound the wait for its data.
				c.arm()
			}
		case kindData:
			if written || (data && h.Total() != total) {
				c.release(r.slot)
				return got, c.violation("DATA for message %d inconsistent with its start", seq)
			}
			if !data {
				data, total = true, h.Total()
			}
			p := h.Payload()
			if taken+uint64(len(p)) > total {
				c.release(r.slot)
				return got, c.violation("DATA beyond message %d's %d bytes", seq, total)
			}
			got += copy(buf[got:], p)
			taken += uint64(len(p))
			c.release(r.slot)
			if taken < total {
				continue
			}
			c.done(seq, false)
			if total > uint64(dst.Length) {
				return got, ErrTruncated
			}
			return got, nil
		}
	}
}

// done ends message seq.
func (c *Conn) done(seq uint32, rdv bool) {
	c.mu.Lock()
	c.rseq = seq + 1
	c.lastRdv = rdv
	if rdv {
		c.stats.RndvRecv++
	} else {
		c.stats.EagerRecv++
	}
	c.mu.Unlock()
}

// sendADV advertises dst for message seq, or (eager) asks for the message
// inline.
func (c *Conn) sendADV(ctx context.Context, seq uint32, dst fabric.SGE, eager bool) error {
	off := HeaderLen + c.advIdx*ADVLen
	c.advIdx = (c.advIdx + 1) % advRing
	h := Header(c.tx.Bytes()[off : off+ADVLen])
	if eager {
		h.encodeADV(seq, true, 0, uint64(dst.Length), 0)
	} else {
		iov := dst.Region.Remote().Slice(uint64(dst.Offset), uint64(dst.Length))
		h.encodeADV(seq, false, iov.Addr, iov.Len, uint64(iov.Key))
	}
	c.advSGE[0] = fabric.SGE{Region: c.tx, Offset: off, Length: ADVLen}
	c.advMsg[0] = fabric.Message{SGEs: c.advSGE[:]}
	_, err := c.ep.SendWait(ctx, c.advMsg[:])
	return err
}

// arm starts the bound on a rendezvous the peer committed to.
func (c *Conn) arm() {
	if c.timeout <= 0 {
		return
	}
	c.mu.Lock()
	c.stallArmed = true
	c.stallDeadline = time.Now().Add(c.timeout)
	c.mu.Unlock()
	c.stallTimer.Reset(c.timeout)
}

// armed reports whether the bound is armed.
func (c *Conn) armed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stallArmed
}

// disarm ends the bound, if armed.
func (c *Conn) disarm() {
	c.mu.Lock()
	armed := c.stallArmed
	c.stallArmed = false
	c.mu.Unlock()
	if armed {
		c.stallTimer.Stop()
	}
}

// stalled fails the connection if the bound armed is still pending and
// due: the timer's function. A run left over from an earlier bound (it
// fired as disarm stopped it, and ran after arm started the next) finds
// the deadline ahead and leaves it to the timer Reset by arm.
func (c *Conn) stalled() {
	c.mu.Lock()
	armed := c.stallArmed && !time.Now().Before(c.stallDeadline)
	c.mu.Unlock()
	if armed {
		c.fail(ErrStalled)
	}
}
