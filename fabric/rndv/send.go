package rndv

import (
	"context"
	"fmt"

	"github.com/weft-io/weft/fabric"
)

// Send sends the message in src and returns once src may be reused: the
// eager copy is taken, or the rendezvous write has completed. A message
// above the threshold waits for the receiver's buffer: for the peer's
// matching Recv, or ctx.
//
// A Send that ctx ends before any of the message went out (its first
// fragment, its first write) returns ctx's error and the connection goes
// on: the next Send takes the message's number. (An RTS may have gone
// out: the peer then holds its Recv for the next Send, within its
// Options.Timeout once it advertised a buffer.) Once part of the message
// went out, it cannot be taken back or resumed, and a rendezvous write
// may still read src: ctx's end, or any error, then fails the
// connection, which closes the endpoint, and later calls return that
// error.
func (c *Conn) Send(ctx context.Context, src fabric.SGE) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.closedErr("send"); err != nil {
		return err
	}
	if err := c.check("send", src, 0); err != nil {
		return err
	}
	c.mu.Lock()
	seq := c.sseq
	c.mu.Unlock()
	var err error
	rdv := false
	c.sbegun = false
	if c.thresh < 0 || src.Length <= c.thresh {
		err = c.sendData(ctx, seq, src)
	} else {
		var a advert
		if a, err = c.advert(ctx, seq, uint64(src.Length)); err == nil {
			if a.eager || a.iov.Len == 0 {
				err = c.sendData(ctx, seq, src)
			} else {
				err = c.write(ctx, seq, src, a.iov)
				rdv = true
			}
		}
	}
	if err != nil {
		if c.sbegun {
			err = c.fail(fmt.Errorf("rndv: a send cut short in its message: %w", err))
		} else {
			// The message's one write was not posted.
			c.mu.Lock()
			c.slast, c.nadv = false, advert{}
			c.mu.Unlock()
		}
		return c.opErr("send", err)
	}
	c.mu.Lock()
	// The ADV of the next message may have come already.
	c.adv, c.nadv, c.slast = c.nadv, advert{}, false
	c.sseq++
	if rdv {
		c.stats.RndvSent++
	} else {
		c.stats.EagerSent++
	}
	c.mu.Unlock()
	return nil
}

// advert returns the receiver's ADV for message seq, asking with RTS if
// none is waiting.
func (c *Conn) advert(ctx context.Context, seq uint32, total uint64) (advert, error) {
	c.mu.Lock()
	a := c.adv
	if !a.ok {
		c.stats.RTS++
	}
	c.mu.Unlock()
	if !a.ok {
		h := Header(c.tx.Bytes()[:HeaderLen])
		h.encode(kindRTS, 0, seq, total)
		if err := c.post(ctx, HeaderLen, fabric.SGE{}); err != nil {
			return advert{}, err
		}
		if err := c.wait(ctx, roleSend); err != nil {
			return advert{}, err
		}
		c.mu.Lock()
		a = c.adv
		c.mu.Unlock()
	}
	return a, nil
}

// sendData sends src as DATA frames of message seq.
func (c *Conn) sendData(ctx context.Context, seq uint32, src fabric.SGE) error {
	h := Header(c.tx.Bytes()[:HeaderLen])
	room := c.slotSize - HeaderLen
	off := 0
	for {
		n := min(room, src.Length-off)
		h.encode(kindData, 0, seq, uint64(src.Length))
		if err := c.post(ctx, HeaderLen, fabric.SGE{Region: src.Region, Offset: src.Offset + off, Length: n}); err != nil {
			return err
		}
		c.sbegun = true
		off += n
		if off == src.Length {
			return nil
		}
	}
}

// post sends the sender's header of hlen bytes followed by payload (if
// any). A frame the endpoint does not copy at once is copied into the
// next slot of the ring, so post returns without waiting for it.
func (c *Conn) post(ctx context.Context, hlen int, payload fabric.SGE) error {
	m := &c.sendMsg[0]
	if hlen+payload.Length <= c.caps.InlineSize || c.txRing == nil {
		sg := c.sendSGEs[:1]
		sg[0] = fabric.SGE{Region: c.tx, Length: hlen}
		if payload.Length > 0 {
			sg = c.sendSGEs[:2]
			sg[1] = payload
		}
		*m = fabric.Message{SGEs: sg}
		_, err := c.ep.SendWait(ctx, c.sendMsg[:])
		return err
	}
	// The slot is free once every operation but the ring's others has
	// completed.
	if err := c.complete(ctx, c.txSlots-1); err != nil {
		return err
	}
	off := c.txNext * c.slotSize
	slot := c.txRing.Bytes()[off : off+c.slotSize]
	copy(slot, c.tx.Bytes()[:hlen])
	copy(slot[hlen:], payload.Bytes())
	c.sendSGEs[0] = fabric.SGE{Region: c.txRing, Offset: off, Length: hlen + payload.Length}
	*m = fabric.Message{SGEs: c.sendSGEs[:1], Flags: fabric.FlagSignal, Context: ctxWrite}
	if _, err := c.ep.SendWait(ctx, c.sendMsg[:]); err != nil {
		return err
	}
	// The slot turns only with a frame posted: a slot skipped would be
	// reused while the frame posted from it txSlots-1 frames ago is
	// still in flight.
	c.txNext = (c.txNext + 1) % c.txSlots
	c.inflight++
	return nil
}

// write moves src into the receiver's buffer iov with RMA writes, the
// last carrying the message number as immediate data, and waits for
// their completions.
func (c *Conn) write(ctx context.Context, seq uint32, src fabric.SGE, iov fabric.RemoteIOV) error {
	w := min(uint64(src.Length), iov.Len)
	imm := seq & immSeqMask
	if w < uint64(src.Length) {
		imm |= immTruncated
	}
	for off := uint64(0); ; {
		n := min(w-off, uint64(c.maxWrite))
		last := off+n == w
		m := &c.sendMsg[0]
		c.sendSGEs[0] = fabric.SGE{Region: src.Region, Offset: src.Offset + int(off), Length: int(n)}
		*m = fabric.Message{SGEs: c.sendSGEs[:1], Remote: iov.Slice(off, n), Flags: fabric.FlagImm | fabric.FlagSignal, Imm: imm, Context: ctxWrite}
		if last {
			m.Imm |= immLast
			// Once the last write lands, the receiver may answer
			// with its buffer for the next message before the
			// write's completion comes here.
			c.mu.Lock()
			c.slast = true
			c.mu.Unlock()
		}
		k, err := c.ep.Write(c.sendMsg[:])
		if err != nil {
			return err
		}
		if k == 0 {
			// Backpressure: an operation of ours frees room when it
			// completes.
			if c.inflight == 0 {
				return fmt.Errorf("rndv: the endpoint took no write: %w", fabric.ErrMessageSize)
			}
			if err := c.complete(ctx, c.inflight-1); err != nil {
				return err
			}
			continue
		}
		c.inflight++
		c.sbegun = true
		off += n
		if last {
			break
		}
	}
	// src is the caller's again once the writes have completed.
	return c.complete(ctx, 0)
}

// complete waits until at most max of the sender's signaled operations
// are in flight. A failed completion of any operation fails the
// connection: the endpoint is in error. ctx's end returns its error:
// Send fails the connection if the operations may read the caller's
// buffer (only closing the endpoint ends them).
func (c *Conn) complete(ctx context.Context, max int) error {
	for c.inflight > max {
		k, err := c.ep.CQ().Wait(ctx, c.comps[:min(len(c.comps), c.inflight-max)])
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return c.fail(err)
		}
		for i := range k {
			cp := &c.comps[i]
			if err := cp.Err(); err != nil {
				return c.fail(fmt.Errorf("rndv: %v: %w", cp.Op, err))
			}
			if cp.Context == ctxWrite {
				c.inflight--
			}
		}
	}
	return nil
}
