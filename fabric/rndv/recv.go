package rndv

import (
	"context"

	"github.com/weft-io/weft/fabric"
)

// Recv receives the next message into dst and returns its length. A
// message longer than dst fills it and returns ErrTruncated. dst must be
// in a region with fabric.AccessLocalWrite; with AccessRemoteWrite as
// well, a message above the threshold is written into it by the sender,
// with no copy here.
func (c *Conn) Recv(ctx context.Context, dst fabric.SGE) (int, error) {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if err := c.closedErr("recv"); err != nil {
		return 0, err
	}
	if err := c.check("recv", dst, fabric.AccessLocalWrite); err != nil {
		return 0, err
	}
	n, err := c.recv(ctx, dst)
	return n, c.opErr("recv", err)
}

// recv is Recv with recvMu held.
func (c *Conn) recv(ctx context.Context, dst fabric.SGE) (int, error) {
	c.mu.Lock()
	seq, pre := c.rseq, c.lastRdv
	c.mu.Unlock()
	writable := c.thresh >= 0 && dst.Length > c.thresh && dst.Region.Access().Has(fabric.AccessRemoteWrite)
	advertised := false
	if writable && pre {
		// The last message came by rendezvous: advertise now and save
		// the sender's RTS round trip.
		if err := c.sendADV(ctx, seq, dst, false); err != nil {
			return 0, err
		}
		advertised = true
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
		if r.notify {
			c.release(r.slot)
			switch {
			case !advertised || data:
				return got, c.violation("an RMA write for message %d, which has no advertised buffer", seq)
			case r.imm&immReserved != 0 || r.imm&immSeqMask != seq&immSeqMask:
				return got, c.violation("an RMA write for message %#x while receiving %d", r.imm, seq)
			case int(r.n) > dst.Length-got:
				return got, c.violation("RMA writes of more than the %d bytes advertised", dst.Length)
			}
			got += int(r.n)
			written = true
			if r.imm&immLast == 0 {
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
				continue // the ADV sent at once answers it
			}
			if err := c.sendADV(ctx, seq, dst, !writable); err != nil {
				return got, err
			}
			advertised = true
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
	c.mu.Unlock()
	c.stallTimer.Reset(c.timeout)
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

// stalled fails the connection if the bound armed is still pending: the
// timer's function.
func (c *Conn) stalled() {
	c.mu.Lock()
	armed := c.stallArmed
	c.mu.Unlock()
	if armed {
		c.fail(ErrStalled)
	}
}
