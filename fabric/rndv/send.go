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
		return c.opErr("send", err)
	}
	c.mu.Lock()
	if c.adv.ok && c.adv.seq == seq {
		c.adv = advert{}
	}
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
		off += n
		if off == src.Length {
			return nil
		}
	}
}

// post sends the sender's header of hlen bytes followed by payload (if
// any), and waits for its completion where the endpoint does not copy it
// at once.
func (c *Conn) post(ctx context.Context, hlen int, payload fabric.SGE) error {
	sg := c.sendSGEs[:1]
	sg[0] = fabric.SGE{Region: c.tx, Length: hlen}
	if payload.Length > 0 {
		sg = c.sendSGEs[:2]
		sg[1] = payload
	}
	m := &c.sendMsg[0]
	*m = fabric.Message{SGEs: sg}
	signaled := hlen+payload.Length > c.caps.InlineSize
	if signaled {
		m.Flags, m.Context = fabric.FlagSignal, ctxWrite
	}
	if _, err := c.ep.SendWait(ctx, c.sendMsg[:]); err != nil {
		return err
	}
	if signaled {
		return c.complete(ctx, 1)
	}
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
	posted := 0
	for off := uint64(0); ; {
		n := min(w-off, uint64(c.maxWrite))
		last := off+n == w
		m := &c.sendMsg[0]
		c.sendSGEs[0] = fabric.SGE{Region: src.Region, Offset: src.Offset + int(off), Length: int(n)}
		*m = fabric.Message{SGEs: c.sendSGEs[:1], Remote: iov.Slice(off, n), Flags: fabric.FlagImm | fabric.FlagSignal, Imm: imm, Context: ctxWrite}
		if last {
			m.Imm |= immLast
		}
		k, err := c.ep.Write(c.sendMsg[:])
		if err != nil {
			return err
		}
		if k == 0 {
			// Backpressure: a write of ours frees room when it completes.
			if posted == 0 {
				return fmt.Errorf("rndv: the endpoint took no write: %w", fabric.ErrMessageSize)
			}
			if err := c.complete(ctx, 1); err != nil {
				return err
			}
			posted--
			continue
		}
		posted++
		off += n
		if last {
			break
		}
	}
	return c.complete(ctx, posted)
}

// complete waits for n completions of the sender's signaled operations.
// A failed completion of any operation fails the connection: the
// endpoint is in error.
func (c *Conn) complete(ctx context.Context, n int) error {
	for n > 0 {
		k, err := c.ep.CQ().Wait(ctx, c.comps[:])
		if err != nil {
			if ctx.Err() != nil {
				// The operation may still read the caller's buffer:
				// only closing the endpoint ends it.
				c.fail(ctx.Err())
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
				n--
			}
		}
	}
	return nil
}
