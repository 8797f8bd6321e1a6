package sock

import (
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
)

// Held views: one copy for buffered data too.
//
// Over an endpoint that lends its receive memory (fabric.ViewReceiver)
// and tells its size (fabric.ViewRoom), DATA that no Read takes straight
// into its slice (Conn.direct) is not copied into the ring: it stays in
// its view, queued in stream order, and the Read that comes for it copies
// it from there (one copy, as a pumping Read's). The view is released
// once wholly read.
//
// Order. Held views come before the ring's bytes: a view is held only
// while the ring is empty (rlen == hlen), so once anything is in the ring
// later DATA follows it there, and holding resumes once the reader has
// drained both. Read takes the held bytes first, then the ring's.
//
// Release. Views are released oldest first, so a view that is done with
// (a control frame, DATA copied into a Read's slice or the ring) behind
// a held one can only be released with it. holdViews counts them: each
// held view carries the done views received before it and after the
// previous held one (pre), and done counts those after the last one. A
// Read that empties the oldest held view releases it and its pre; one
// that empties the queue releases done too. The pumper counts the done
// views of its burst in Conn.vpend (it owns them, with pmu) and adds them
// at the end of the burst (Conn.endViews), releasing them at once if
// nothing is held. The counts are disjoint, each release is of views
// already received, and releasing n views means "the n oldest": so the
// pumper and Reads may release concurrently, in any order, each outside
// mu. ntb, roce and verbs lock ReleaseViews against RecvViews themselves.
//
// Bound. Held views pin the endpoint's receive memory (ntb's and roce's
// ring from the oldest outstanding view on, verbs' slots), which the
// peer also needs for the control frames (CREDIT, WINDOW, PING, FIN,
// CLOSE) that must flow while both sides Write and neither Reads, as
// TCP's window updates do with a full receive buffer. The views
// outstanding and their bytes (payload plus viewRec for the record's
// header and padding) are bounded by maxV and maxB, half the endpoint's
// room less a margin: a DATA view beyond the bound goes to the ring, and
// a burst that ends beyond it (control frames pile up behind a held view)
// copies the held views into the ring and releases everything
// (Conn.spillLocked). The held bytes never exceed the window, so the
// ring has room for them. An endpoint without fabric.ViewRoom holds
// nothing.
//
// Failure and close. Held bytes count in rlen, so credit, growth and the
// starved flag see them as buffered, as before. When the connection
// fails or closes its endpoint is closed and the views are void: Read
// reports the failure before it looks at buffered data, and endViews and
// shutdown drop the views without touching or releasing them. Read copies
// from a view under mu, and the endpoint is closed only after closed or
// err was set under mu, so no copy runs on a closed endpoint. A CLOSE
// from the peer spills the held views into the ring (endViews): nothing
// pumps after it, and the peer's endpoint, closing, may end the session.
//
// Link down. A backend may reset the views' memory without the
// connection's doing: ntb clears its rings when a new session begins
// after the link went down, and gives the queue to a new connection.
// An endpoint closed under the connection is void too (ntb's
// Transport.Close zeroes the window of every queue it carries). So
// every copy from views (Read's and spillLocked's from held views,
// the pumper's from its burst) is followed by a check of the endpoint's
// ViewEpoch (intact), which the backend changes before it clears the
// memory, against the epoch the pumper read before it received them
// (rebase, while nothing is held): if it moved, the copy is thrown away
// and the connection fails with an error matching fabric.ErrPeerGone.
type holdViews struct {
	q       []heldView // ring of held views, the oldest at head
	head, n int
	// live is n, for the pumper to read without mu: nonzero from the
	// first view held to the end of the burst that follows the last
	// one's release (endViews sets it to 0 then, having found none
	// held). Only the pumper holds views, so the pumper that reads 0
	// knows that none is held, nor done views counted behind one.
	live atomic.Int32
	// done and doneB count the views done with since the newest held
	// one, and their bytes.
	done, doneB int
	// pinV and pinB count every view the connection has not released
	// (held, pre, done) and their bytes; maxV and maxB bound them.
	pinV, pinB int
	maxV, maxB int
	// freed counts the views copyOut emptied, for Read to release.
	freed int
	// room is the endpoint's fabric.ViewRoom and epoch its ViewEpoch
	// before the oldest view held, or the burst being handled, was
	// received (rebase, intact).
	room  fabric.ViewRoom
	epoch uint64
}

// heldView is a view kept for its DATA.
type heldView struct {
	b    []byte // the bytes not yet read
	pre  int    // views done with before it (after the previous one)
	preB int    // their bytes
	recB int    // its own bytes, as counted in pinB
}

// viewRec is what a view is counted for beyond its payload: the
// backend's record header and alignment (ntb's and roce's records have a
// 16-byte header and are 16-byte aligned), with a margin.
const viewRec = 64

// maxHeld is the most views held at once (the queue's length).
const maxHeld = 256

// init sizes the bound from the endpoint's room; frame is the largest
// frame. The views outstanding after a burst are at most half the room
// less a burst (rxBurst views) and a frame's margin; a room too small
// for that holds nothing.
func (h *holdViews) init(room fabric.ViewRoom, frame int) {
	h.room, h.epoch = room, room.ViewEpoch()
	v, b := room.ViewRoom()
	h.maxV = v/2 - rxBurst
	h.maxB = b/2 - 2*(frame+viewRec)
	if h.maxV < 1 || h.maxB < frame+viewRec {
		return
	}
	h.q = make([]heldView, min(maxHeld, h.maxV))
}

// intact reports whether the views' memory still holds what was
// received: the endpoint's epoch has not changed since the pumper read
// it (rebase) before it received the oldest view held, or the burst
// being handled. A copy from views is checked after it is made: an
// epoch read after the copy that has not changed means the memory was
// not reset before or during it (the endpoint changes the epoch before
// it clears the memory).
func (h *holdViews) intact() bool {
	return h.room == nil || h.room.ViewEpoch() == h.epoch
}

// rebase reads the endpoint's epoch for the views to come; the pumper
// calls it, under mu, before it receives a burst while none is held (a
// held view's memory is checked against the epoch of its receipt).
func (h *holdViews) rebase() {
	if h.room != nil {
		h.epoch = h.room.ViewEpoch()
	}
}

// reset forgets every view (released, void or copied out).
func (h *holdViews) reset() {
	h.live.Store(0)
	for ; h.n > 0; h.n-- {
		h.q[h.head] = heldView{}
		h.head = (h.head + 1) % len(h.q)
	}
	h.head, h.done, h.doneB, h.pinV, h.pinB = 0, 0, 0, 0, 0
}

// copyOut copies held bytes into p, up to len(p), and returns how many.
// Each view it empties is freed with the views before it, and the done
// views behind the last one once none is held.
func (h *holdViews) copyOut(p []byte) int {
	k := 0
	for k < len(p) && h.n > 0 {
		v := &h.q[h.head]
		m := copy(p[k:], v.b)
		v.b = v.b[m:]
		k += m
		if len(v.b) > 0 {
			break
		}
		h.freed += v.pre + 1
		h.pinV -= v.pre + 1
		h.pinB -= v.preB + v.recB
		*v = heldView{}
		h.head = (h.head + 1) % len(h.q)
		h.n--
	}
	if h.n == 0 && h.done > 0 {
		h.freed += h.done
		h.pinV -= h.done
		h.pinB -= h.doneB
		h.done, h.doneB = 0, 0
	}
	return k
}
