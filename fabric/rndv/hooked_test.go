package rndv

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// hooked is an endpoint whose blocking calls run a hook first, so that a
// test can hold a Conn at a chosen point of its protocol.
type hooked struct {
	fabric.Endpoint
	// recvWait runs before the n-th RecvWait (from 1).
	recvWait func(n int)
	// sendWait runs before the n-th SendWait (from 1); an error it
	// returns is SendWait's, and nothing is posted.
	sendWait func(ctx context.Context, n int) error
	// caps, if set, edits the endpoint's Caps.
	caps func(fabric.Caps) fabric.Caps
	// write runs after the n-th Write (from 1) has returned.
	write      func(n int)
	nr, ns, nw atomic.Int32
}

func (h *hooked) Write(msgs []fabric.Message) (int, error) {
	k, err := h.Endpoint.Write(msgs)
	if n := h.nw.Add(1); h.write != nil {
		h.write(int(n))
	}
	return k, err
}

func (h *hooked) Caps() fabric.Caps {
	c := h.Endpoint.Caps()
	if h.caps != nil {
		c = h.caps(c)
	}
	return c
}

func (h *hooked) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	if n := h.nr.Add(1); h.recvWait != nil {
		h.recvWait(int(n))
	}
	return h.Endpoint.RecvWait(ctx, msgs)
}

func (h *hooked) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	if n := h.ns.Add(1); h.sendWait != nil {
		if err := h.sendWait(ctx, int(n)); err != nil {
			return 0, err
		}
	}
	return h.Endpoint.SendWait(ctx, msgs)
}

// hookedVictim is victim over ntb with the victim's endpoint hooked; set
// the hooks before the Conn's first call.
func hookedVictim(t *testing.T, o *Options) (*Conn, *hooked, *hostile) {
	t.Helper()
	return hookedVictimCaps(t, o, nil)
}

// hookedVictimCaps is hookedVictim with the endpoint's Caps edited by
// caps (nil: as they are).
func hookedVictimCaps(t *testing.T, o *Options, caps func(fabric.Caps) fabric.Caps) (*Conn, *hooked, *hostile) {
	t.Helper()
	return hookedVictimOn(t, backends[0], o, caps)
}

// hookedVictimOn is hookedVictimCaps over be.
func hookedVictimOn(t *testing.T, be backend, o *Options, caps func(fabric.Caps) fabric.Caps) (*Conn, *hooked, *hostile) {
	t.Helper()
	var he *hooked
	c, h := victimWrapped(t, be, o, func(ep fabric.Endpoint) fabric.Endpoint {
		he = &hooked{Endpoint: ep, caps: caps}
		return he
	})
	return c, he, h
}

// TestPollSlotsReleasedMeanwhile: while one role polls (the sender,
// waiting for its ADV), the other releases a slot (the receiver, done with
// a DATA frame). The frame that then arrives is read from the slot it
// landed in, not from the one released: the sender gets its ADV and the
// write completes.
func TestPollSlotsReleasedMeanwhile(t *testing.T) {
	c, he, h := hookedVictim(t, &Options{Threshold: 1024})
	entered, goahead := make(chan struct{}), make(chan struct{})
	he.recvWait = func(n int) {
		if n == 2 {
			close(entered)
			<-goahead
		}
	}
	ctx := testenv.Context(t)
	h.send(frame(kindData, 0, 1, 0x42))
	src := alloc(t, c, 8192, 0)
	fill(src.Bytes(), 5)
	target, err := h.ep.Alloc(8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Send(ctx, fabric.SGEOf(src)) }()
	// The sender's first poll took the DATA; its second waits in the
	// endpoint with the other slots posted.
	testenv.Recv(t, entered, "the sender's second poll")
	one := alloc(t, c, 1, fabric.AccessLocalWrite)
	if n, err := c.Recv(ctx, fabric.SGEOf(one)); n != 1 || err != nil || one.Bytes()[0] != 0x42 {
		t.Fatalf("Recv = %d, %v, % x", n, err, one.Bytes())
	}
	close(goahead)
	if f := h.recv(); f.Kind() != kindRTS || f.Seq() != 0 {
		t.Fatalf("the victim sent %s %d, want RTS 0", kindNames[f.Kind()], f.Seq())
	}
	h.send(adv(0, target.Remote()))
	if err := testenv.Recv(t, errc, "the victim's Send"); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if !bytes.Equal(target.Bytes(), src.Bytes()) {
		t.Fatal("the write's bytes differ")
	}
}

// TestWaitAfterPollerLeft: a role that found nothing, and then takes the
// poll over from a poller that has meanwhile queued its frame and left,
// returns the frame instead of blocking in the endpoint for another.
func TestWaitAfterPollerLeft(t *testing.T) {
	c, h := victim(t, backends[0], &Options{Threshold: 1024})
	checked, goahead := make(chan struct{}), make(chan struct{})
	var once sync.Once
	waitHook = func(role, stage int) {
		if role == roleRecv && stage == hookLooked {
			once.Do(func() {
				close(checked)
				<-goahead
			})
		}
	}
	t.Cleanup(func() { waitHook = nil })
	ctx := testenv.Context(t)
	one := alloc(t, c, 1, fabric.AccessLocalWrite)
	type result struct {
		n   int
		err error
	}
	rc := make(chan result, 1)
	go func() {
		n, err := c.Recv(ctx, fabric.SGEOf(one))
		rc <- result{n, err}
	}()
	testenv.Recv(t, checked, "the receiver's look at its frames")
	src := alloc(t, c, 8192, 0)
	target, err := h.ep.Alloc(8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Send(ctx, fabric.SGEOf(src)) }()
	if f := h.recv(); f.Kind() != kindRTS {
		t.Fatalf("the victim sent %s, want RTS", kindNames[f.Kind()])
	}
	h.send(frame(kindData, 0, 1, 0x42))
	h.send(adv(0, target.Remote()))
	// The sender polled, queued the DATA for the receiver and left.
	if err := testenv.Recv(t, errc, "the victim's Send"); err != nil {
		t.Fatalf("Send: %v", err)
	}
	close(goahead)
	if r := testenv.Recv(t, rc, "the victim's Recv of the queued DATA"); r.n != 1 || r.err != nil {
		t.Fatalf("Recv = %d, %v", r.n, r.err)
	}
}

// TestRecvCancelledAfterAdvert: a Recv that advertised its buffer at
// once (after a rendezvous) and is then cancelled fails the connection:
// the peer may write into that buffer, and the next Recv, into another
// buffer, must not report the write as its message.
func TestRecvCancelledAfterAdvert(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			c, h := victim(t, be, &Options{Threshold: 1024})
			dstA := alloc(t, c, 8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			dstB := alloc(t, c, 8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			type result struct {
				n   int
				err error
			}
			rc := make(chan result, 1)
			recv := func(ctx context.Context, dst *fabric.Region) {
				n, err := c.Recv(ctx, fabric.SGEOf(dst))
				rc <- result{n, err}
			}
			// Message 0 by rendezvous.
			h.send(frame(kindRTS, 0, 16))
			go recv(testenv.Context(t), dstA)
			a := h.recv()
			if a.Kind() != kindADV || a.Eager() {
				t.Fatalf("the victim answered %s eager %v", kindNames[a.Kind()], a.Eager())
			}
			h.write(a.Remote(), 0|immLast)
			if r := testenv.Recv(t, rc, "Recv 0"); r.n != 16 || r.err != nil {
				t.Fatalf("Recv 0 = %d, %v", r.n, r.err)
			}
			// Message 1: the victim advertises dstA at once, then gives up.
			ctx, cancel := context.WithCancel(testenv.Context(t))
			go recv(ctx, dstA)
			a = h.recv()
			if a.Kind() != kindADV || a.Eager() || a.Seq() != 1 {
				t.Fatalf("the victim sent %s %d eager %v, want ADV 1", kindNames[a.Kind()], a.Seq(), a.Eager())
			}
			cancel()
			if r := testenv.Recv(t, rc, "the cancelled Recv"); !errors.Is(r.err, context.Canceled) {
				t.Fatalf("cancelled Recv = %d, %v", r.n, r.err)
			}
			// The peer writes message 1 where it was told (the victim may have
			// closed the endpoint: errors are fine).
			h.ep.Write([]fabric.Message{{SGEs: []fabric.SGE{{Region: h.buf, Length: 16}}, Remote: a.Remote().Slice(0, 16), Flags: fabric.FlagImm, Imm: 1 | immLast}})
			if n, err := c.Recv(testenv.Context(t), fabric.SGEOf(dstB)); err == nil {
				t.Fatalf("after the cancelled Recv, Recv into another buffer = %d, nil: the write into the first", n)
			}
		})
	}
}

// TestRecvCancelledIdle: a Recv cancelled before anything of the message
// arrived, into a buffer it did not advertise, leaves the connection as
// it was: the next Recv gets the message.
func TestRecvCancelledIdle(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			c, h := victim(t, be, &Options{Threshold: 1024})
			dst := alloc(t, c, 64, fabric.AccessLocalWrite)
			ctx, cancel := context.WithCancel(testenv.Context(t))
			cancel()
			if _, err := c.Recv(ctx, fabric.SGEOf(dst)); !errors.Is(err, context.Canceled) {
				t.Fatalf("Recv = %v, want context.Canceled", err)
			}
			h.send(frame(kindData, 0, 2, 7, 8))
			if n, err := c.Recv(testenv.Context(t), fabric.SGEOf(dst)); n != 2 || err != nil || dst.Bytes()[1] != 8 {
				t.Fatalf("Recv = %d, %v", n, err)
			}
		})
	}
}

// TestSendCancelled: a Send cancelled before its first fragment went out
// leaves the connection going, and the next Send takes the message
// number; one cancelled after a fragment went out fails the connection,
// for the receiver has part of a message that will never be whole.
func TestSendCancelled(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block int // the SendWait that waits for ctx
		goOn  bool
	}{{"before", 1, true}, {"mid-message", 2, false}} {
		t.Run(tc.name, func(t *testing.T) {
			c, he, h := hookedVictim(t, &Options{Threshold: -1})
			entered := make(chan struct{})
			he.sendWait = func(ctx context.Context, n int) error {
				if n != tc.block {
					return nil
				}
				close(entered)
				<-ctx.Done()
				return ctx.Err()
			}
			src := alloc(t, c, 3*c.slotSize, 0)
			small := alloc(t, c, 3, 0)
			ctx, cancel := context.WithCancel(testenv.Context(t))
			errc := make(chan error, 1)
			go func() { errc <- c.Send(ctx, fabric.SGEOf(src)) }()
			testenv.Recv(t, entered, "the blocked SendWait")
			cancel()
			if err := testenv.Recv(t, errc, "the cancelled Send"); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Send = %v", err)
			}
			err := c.Send(testenv.Context(t), fabric.SGEOf(small))
			if !tc.goOn {
				if err == nil {
					t.Fatal("a Send after one cut short mid-message succeeded")
				}
				return
			}
			if err != nil {
				t.Fatalf("Send after the cancelled one: %v", err)
			}
			if f := h.recv(); f.Kind() != kindData || f.Seq() != 0 || f.Total() != 3 {
				t.Fatalf("the peer got %s %d of %d bytes, want DATA 0 of 3", kindNames[f.Kind()], f.Seq(), f.Total())
			}
		})
	}
}

// TestStallTimerLeftOver: a run of the stall timer left over from an
// earlier bound (it fired as the bound was lifted) does not fail a
// rendezvous armed since, whose bound has not passed.
func TestStallTimerLeftOver(t *testing.T) {
	c, _ := victim(t, backends[0], &Options{Timeout: time.Hour})
	c.arm()
	c.stalled() // the left-over run
	c.disarm()
	if err := c.closedErr("test"); err != nil {
		t.Fatalf("the connection failed: %v", err)
	}
}

// TestWriteIntoEagerAdvert: a write notification for a message the
// victim asked to get inline (its buffer cannot take a write) is a
// violation, not the message: the bytes are not in the caller's buffer.
func TestWriteIntoEagerAdvert(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			c, h := victim(t, be, &Options{Threshold: 1024})
			dst := alloc(t, c, 4096, fabric.AccessLocalWrite)
			// Some other region of the victim that the peer can write.
			other := alloc(t, c, 4096, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			h.send(frame(kindRTS, 0, 4096))
			type result struct {
				n   int
				err error
			}
			rc := make(chan result, 1)
			go func() {
				n, err := c.Recv(testenv.Context(t), fabric.SGEOf(dst))
				rc <- result{n, err}
			}()
			if a := h.recv(); a.Kind() != kindADV || !a.Eager() {
				t.Fatalf("the victim answered %s eager %v, want an eager ADV", kindNames[a.Kind()], a.Eager())
			}
			h.write(other.Remote(), 0|immLast)
			if r := testenv.Recv(t, rc, "the victim's Recv"); !errors.Is(r.err, fabric.ErrMalformed) {
				t.Fatalf("Recv = %d, %v; want ErrMalformed", r.n, r.err)
			}
		})
	}
}

// TestStalledPartialWrite: a peer whose writes into a buffer advertised
// before any RTS have started, and that never sends the last, is stalled
// out after Options.Timeout like one that answered RTS and never wrote.
func TestStalledPartialWrite(t *testing.T) { stalledAfterAdvert(t, false) }

// TestStalledRTSAfterAdvert: a peer that sends RTS for a message whose
// buffer was advertised before it asked, and then never writes, is
// stalled out after Options.Timeout.
func TestStalledRTSAfterAdvert(t *testing.T) { stalledAfterAdvert(t, true) }

// stalledAfterAdvert has the victim advertise its buffer for message 1 at
// once; the peer then commits to it (rts: by RTS; else by a first write)
// and goes silent.
func stalledAfterAdvert(t *testing.T, rts bool) {
	c, h := victim(t, backends[0], &Options{Threshold: 1024, Timeout: 200 * time.Millisecond})
	dst := alloc(t, c, 8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	type result struct {
		n   int
		err error
	}
	rc := make(chan result, 1)
	recv := func() {
		n, err := c.Recv(testenv.Context(t), fabric.SGEOf(dst))
		rc <- result{n, err}
	}
	h.send(frame(kindRTS, 0, 16))
	go recv()
	h.write(h.recv().Remote(), 0|immLast)
	if r := testenv.Recv(t, rc, "Recv 0"); r.n != 16 || r.err != nil {
		t.Fatalf("Recv 0 = %d, %v", r.n, r.err)
	}
	go recv()
	a := h.recv()
	if a.Kind() != kindADV || a.Seq() != 1 {
		t.Fatalf("the victim sent %s %d, want ADV 1 at once", kindNames[a.Kind()], a.Seq())
	}
	if rts {
		h.send(frame(kindRTS, 1, 8192))
	} else {
		h.write(a.Remote(), 1) // not the last
	}
	if r := testenv.Recv(t, rc, "the victim's Recv"); !errors.Is(r.err, ErrStalled) {
		t.Fatalf("Recv = %d, %v; want ErrStalled", r.n, r.err)
	}
}

// TestTxRingSlotNotSkipped: where the endpoint does not copy frames at
// once (the eager ring), a frame that was not posted (its Send cancelled)
// does not turn the ring: the ring's next slot is the one whose frame
// completed longest ago, never one still in flight.
func TestTxRingSlotNotSkipped(t *testing.T) {
	c, he, h := hookedVictimCaps(t, &Options{Threshold: -1}, func(cp fabric.Caps) fabric.Caps {
		cp.InlineSize = 0
		return cp
	})
	if c.txRing == nil {
		t.Fatal("no eager ring with InlineSize 0")
	}
	he.sendWait = func(ctx context.Context, n int) error {
		if n == 1 {
			return context.Canceled
		}
		return nil
	}
	src := alloc(t, c, 100, 0)
	fill(src.Bytes(), 9)
	if err := c.Send(testenv.Context(t), fabric.SGEOf(src)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send = %v, want context.Canceled", err)
	}
	if c.txNext != 0 || c.inflight != 0 {
		t.Fatalf("after a frame not posted: ring slot %d, %d in flight; want 0, 0", c.txNext, c.inflight)
	}
	for i := range 2 * txSlots {
		if err := c.Send(testenv.Context(t), fabric.SGEOf(src)); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
		f := h.recv()
		if f.Kind() != kindData || f.Seq() != uint32(i) || !bytes.Equal(f.Payload(), src.Bytes()) {
			t.Fatalf("frame %d: %s %d of %d bytes", i, kindNames[f.Kind()], f.Seq(), len(f.Payload()))
		}
		if want := (i + 1) % txSlots; c.txNext != want {
			t.Fatalf("after %d frames the ring is at slot %d, want %d", i+1, c.txNext, want)
		}
	}
}
