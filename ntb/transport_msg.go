package ntb

import (
	"fmt"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
)

// The handshake over message registers, for bridges that have no
// scratchpads (IDT's switches). This is where Weft goes past Linux's
// ntb_transport, which needs scratchpads and so does not run on IDT.
//
// The eight handshake words (spadVersion..spadState) travel as
// messages, each complete in itself: half a word with its place and the
// number of the snapshot it belongs to, so that no message is read
// against another one and any register may carry any message:
//
//	bits 31..26  kind: msgKindHalf, or msgKindClose (bits 25..0 zero)
//	     25..20  seq, the snapshot's number, modulo 64
//	     19..17  word, 0..7
//	         16  half: 0 the low 16 bits, 1 the high
//	     15..0   the 16 bits
//
// A snapshot is the sixteen halves of our eight words. The sender
// writes each into the first free register, and when every register
// is full (ErrMsgBusy) goes on at its next poll; a message a register
// took is delivered once, so nothing is sent twice. The receiver reads
// every register whose status bit is set, then clears them all in one
// MsgClear. It keeps the last half it got for each place with its seq,
// and takes a snapshot into its shadow of the peer's words, all eight
// at once, when all sixteen places hold the same seq: a snapshot is
// never mixed with another, and one whose messages were lost (the
// receiver cleared its registers when it started a handshake) is
// replaced by the next. The handshake reads the shadow as it reads
// scratchpads on the other path.
//
// Messages are delivered once, so where the scratchpad path rewrites
// every word each round, post here sends a new snapshot each time the
// previous one has gone out and post was called again: while a
// handshake runs, snapshots follow each other as fast as the peer takes
// them; once the session is up nothing is sent. A side that starts a
// handshake forgets the shadow and clears its registers (what they hold
// is from an earlier session, or part of a snapshot the peer, which
// posts throughout its handshake, sends again). Close sends one message
// of kind msgKindClose (the peer's shadow then says state hsClosed,
// nonce 0, once the rest of the batch it came in is applied, since
// registers are read in their order and not the sender's) and waits at
// most msgCloseWait for a register to take it;
// the peer reads it when its session ends and reports
// fabric.ErrPeerClosed, as over scratchpads. Presence is the device's,
// as on the scratchpad path (LinkIsUp, PeerIncarnation); the session
// watch polls the registers with the same backing-off period.
//
// A first design sent frames, a header register naming the words in
// the value registers beside it, as Linux's ntb_perf sends its commands
// over IDT's message registers (data registers first, the command
// register last, one clear of the inbound status: perf_msg_cmd_send and
// perf_msg_cmd_recv in drivers/ntb/test/ntb_perf.c). It broke when a
// receiver cleared a frame's values without their header (a handshake
// starting between the two writes, a register with garbage in it): the
// header then arrived over the next frame's values, and the two sides
// stayed out of step. Messages that each carry their place cannot be
// paired wrongly.
const (
	msgKindHalf   = 0x2d
	msgKindClose  = 0x2e
	msgMinRegs    = 1
	msgMaxRegs    = 64 // status bits
	msgPollBudget = 64 // batches of messages taken per poll
	msgCloseWait  = 100 * time.Millisecond
	msgHalves     = 2 * numSpads
	msgNoSeq      = 0xff
)

// msgHalf returns the message that carries half h of word w of
// snapshot seq.
func msgHalf(seq uint8, w, h int, v uint32) uint32 {
	return msgKindHalf<<26 | uint32(seq&63)<<20 | uint32(w)<<17 | uint32(h)<<16 | v>>(16*h)&0xffff
}

// msgClose is the message that says the sender closed.
const msgClose = msgKindClose << 26

// decodeMsg decodes a message from the peer: close, or a half of a
// snapshot (place 2*word+half, 0..15).
func decodeMsg(m uint32) (close bool, seq uint8, place int, v uint16, err error) {
	switch m >> 26 {
	case msgKindHalf:
		return false, uint8(m >> 20 & 63), int(m >> 16 & 15), uint16(m), nil
	case msgKindClose:
		if m != msgClose {
			return false, 0, 0, 0, msgErr("message %#08x: a close with other bits set", m)
		}
		return true, 0, 0, 0, nil
	}
	return false, 0, 0, 0, msgErr("message %#08x is not a control message", m)
}

// msgErr is a control message that does not decode.
func msgErr(format string, a ...any) error {
	return fmt.Errorf("%w: control message: %s: %w", errProtocol, fmt.Sprintf(format, a...), fabric.ErrMalformed)
}

// msgCtrl is the handshake over message registers (see above).
type msgCtrl struct {
	dev  Device
	m    Messenger
	mask uint64 // the status bits of the registers used

	mu     sync.Mutex
	shadow [numSpads]uint32 // the words of the peer's last whole snapshot
	got    [msgHalves]uint16
	gotSeq [msgHalves]uint8 // msgNoSeq: nothing yet
	closed bool             // closing was called: post no more

	want    [numSpads]uint32 // our words, as last posted
	pending bool             // posted since the last snapshot was planned
	seq     uint8
	out     [msgHalves]uint32 // the messages being sent
	nout    int
	iout    int // next of out to send
}

func newMsgCtrl(dev Device, m Messenger) *msgCtrl {
	n := min(m.MsgCount(), msgMaxRegs)
	// A random first number: a restarted sender does not pick up
	// where halves of its last life left off.
	c := &msgCtrl{dev: dev, m: m, mask: 1<<n - 1, seq: uint8(randUint32() & 63)}
	c.forget()
	return c
}

// forget empties the shadow and the halves received.
func (c *msgCtrl) forget() {
	c.shadow = [numSpads]uint32{}
	for i := range c.gotSeq {
		c.gotSeq[i] = msgNoSeq
	}
}

func (c *msgCtrl) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget()
	if st := c.m.MsgStatus() & c.mask; st != 0 {
		c.m.MsgClear(st)
	}
	// A snapshot not yet sent is from the session that ended (but a
	// close stays).
	if !c.closed {
		c.iout, c.nout, c.pending = 0, 0, false
	}
}

func (c *msgCtrl) post(w *[numSpads]uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.want, c.pending = *w, true
	c.push()
}

func (c *msgCtrl) get(i int) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shadow[i]
}

func (c *msgCtrl) poll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.push()
	err := c.recv()
	c.push() // the peer may have taken messages meanwhile
	return err
}

func (c *msgCtrl) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.iout == c.nout && !c.pending
}

func (c *msgCtrl) closing() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.out[0], c.iout, c.nout, c.pending = msgClose, 0, 1, false
	deadline := time.Now().Add(msgCloseWait)
	for {
		c.push()
		if c.iout == c.nout || !c.dev.LinkIsUp() || time.Now().After(deadline) {
			return
		}
		c.mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		c.mu.Lock()
	}
}

// planSnapshot plans the messages of a new snapshot of our words.
func (c *msgCtrl) planSnapshot() {
	c.seq = (c.seq + 1) & 63
	for w, v := range c.want {
		c.out[2*w] = msgHalf(c.seq, w, 0, v)
		c.out[2*w+1] = msgHalf(c.seq, w, 1, v)
	}
	c.iout, c.nout, c.pending = 0, msgHalves, false
}

// push writes what it can of the messages planned, each into the first
// register that takes it; when none does, it ends until the next call.
func (c *msgCtrl) push() {
	for {
		if c.iout == c.nout {
			if !c.pending {
				return
			}
			c.planSnapshot()
		}
		sent := false
		for r := 0; r < 64 && c.mask>>r&1 != 0; r++ {
			if c.m.PeerMsgWrite(r, c.out[c.iout]) == nil {
				sent = true
				break
			}
		}
		if !sent {
			return // all full (ErrMsgBusy), or the link is down: again on the next call
		}
		c.iout++
	}
}

// recv takes in the messages in our registers, at most msgPollBudget
// batches of them, so that a peer that floods them cannot hold the
// caller.
func (c *msgCtrl) recv() error {
	var first error
	for range msgPollBudget {
		st := c.m.MsgStatus() & c.mask
		if st == 0 {
			break
		}
		// Registers are read in their order, not in the order the peer
		// wrote them: a close can sit below the last halves of a
		// snapshot sent before it. Everything the peer sent before
		// its close is in this batch or an earlier one (a message
		// stays until cleared, and the peer sends nothing after its
		// close), so the close is applied after the rest of its batch.
		closed := false
		for r := 0; r < 64; r++ {
			if st>>r&1 == 0 {
				continue
			}
			m, err := c.m.MsgRead(r)
			if err == nil {
				var cl bool
				cl, err = c.take(m)
				closed = closed || cl
			} else {
				err = fmt.Errorf("%w: reading message register %d: %w", errProtocol, r, err)
			}
			if first == nil {
				first = err
			}
		}
		if closed {
			// The peer closed: its state says so, and halves of a
			// snapshot it never finished are dropped, so that none of
			// them is mixed into its next life's.
			c.shadow[spadState], c.shadow[spadNonce] = hsClosed, 0
			for i := range c.gotSeq {
				c.gotSeq[i] = msgNoSeq
			}
		}
		c.m.MsgClear(st)
	}
	return first
}

// take applies one message from the peer, or reports a close, which
// recv applies after the rest of the batch.
func (c *msgCtrl) take(m uint32) (closed bool, err error) {
	closed, seq, place, v, err := decodeMsg(m)
	if err != nil || closed {
		return closed, err
	}
	c.got[place], c.gotSeq[place] = v, seq
	for _, s := range c.gotSeq {
		if s != seq {
			return false, nil
		}
	}
	// A whole snapshot: take it, and wait for the next.
	for w := range c.shadow {
		c.shadow[w] = uint32(c.got[2*w]) | uint32(c.got[2*w+1])<<16
	}
	for i := range c.gotSeq {
		c.gotSeq[i] = msgNoSeq
	}
	return false, nil
}
