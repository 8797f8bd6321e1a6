package rndv

import (
	"bytes"
	"sync"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// TestSecondLookKicks: a role that takes the poll, finds its frame
// queued meanwhile (the second look) and leaves the poll without polling
// wakes the other role, which found the poll taken at that moment and
// waits to poll. Here the sender's second look finds its ADV, which the
// receiver's poll queued; the receiver, waiting for its own message,
// must then poll for it.
func TestSecondLookKicks(t *testing.T) {
	c, h := victim(t, backends[0], &Options{Threshold: 1024})
	var mu sync.Mutex
	count := map[[2]int]int{}
	sLooked, sGo := make(chan struct{}), make(chan struct{})
	sPolling, sGo2 := make(chan struct{}), make(chan struct{})
	rLooked, rGo := make(chan struct{}), make(chan struct{})
	rBlocking := make(chan struct{})
	waitHook = func(role, stage int) {
		mu.Lock()
		count[[2]int{role, stage}]++
		n := count[[2]int{role, stage}]
		mu.Unlock()
		switch {
		case role == roleSend && stage == hookLooked && n == 1:
			close(sLooked)
			<-sGo
		case role == roleSend && stage == hookPolling && n == 1:
			close(sPolling)
			<-sGo2
		case role == roleRecv && stage == hookLooked && n == 2:
			close(rLooked)
			<-rGo
		case role == roleRecv && stage == hookBlocking && n == 2:
			close(rBlocking)
		}
	}
	t.Cleanup(func() { waitHook = nil })
	ctx := testenv.Context(t)
	src := alloc(t, c, 8192, 0)
	fill(src.Bytes(), 4)
	target, err := h.ep.Alloc(8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Send(ctx, fabric.SGEOf(src)) }()
	// The sender asked, looked for the ADV and found none.
	testenv.Recv(t, sLooked, "the sender's first look")
	if f := h.recv(); f.Kind() != kindRTS || f.Seq() != 0 {
		t.Fatalf("the victim sent %s %d, want RTS 0", kindNames[f.Kind()], f.Seq())
	}
	h.send(adv(0, target.Remote()))
	// The receiver polls, queues the ADV for the sender and looks again
	// for its own frame.
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
	testenv.Recv(t, rLooked, "the receiver's look after its poll")
	// The sender takes the poll; the receiver finds it taken (once with
	// its own kick pending, once without) and waits.
	close(sGo)
	testenv.Recv(t, sPolling, "the sender holding the poll")
	close(rGo)
	testenv.Recv(t, rBlocking, "the receiver waiting for the poll")
	// The sender's second look finds the ADV; it leaves the poll.
	close(sGo2)
	if err := testenv.Recv(t, errc, "the victim's Send"); err != nil {
		t.Fatalf("Send: %v", err)
	}
	h.send(frame(kindData, 0, 1, 0x42))
	if r := testenv.Recv(t, rc, "the victim's Recv (no one polls for it)"); r.n != 1 || r.err != nil || one.Bytes()[0] != 0x42 {
		t.Fatalf("Recv = %d, %v", r.n, r.err)
	}
}

// TestAdvertNextBeforeCompletion: the receiver, done with a rendezvous
// message once its last write has landed, advertises its buffer for the
// next message at once; that ADV may reach the sender before the write's
// completion does, and be taken by the sender's concurrent Recv. It is
// the next message's ADV, not a violation: the connection goes on, and
// the next Send writes into that buffer without asking.
func TestAdvertNextBeforeCompletion(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			c, he, h := hookedVictimOn(t, be, &Options{Threshold: 1024}, nil)
			ctx := testenv.Context(t)
			type result struct {
				n   int
				err error
			}
			rc := make(chan result, 1)
			polling := make(chan int, 8)
			he.recvWait = func(n int) { polling <- n }
			one := alloc(t, c, 1, fabric.AccessLocalWrite)
			go func() {
				n, err := c.Recv(ctx, fabric.SGEOf(one))
				rc <- result{n, err}
			}()
			// The receiver polls with every slot: the sender waits for
			// it to dispatch its ADV.
			if n := testenv.Recv(t, polling, "the receiver's first poll"); n != 1 {
				t.Fatalf("RecvWait %d, want 1", n)
			}
			src := alloc(t, c, 8192, 0)
			fill(src.Bytes(), 6)
			targets := make([]*fabric.Region, 2)
			for i := range targets {
				r, err := h.ep.Alloc(8192, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
				if err != nil {
					t.Fatal(err)
				}
				targets[i] = r
			}
			// After message 0's write, before Send sees it complete,
			// the peer advertises message 1's buffer, and the
			// receiver's poll takes the ADV.
			dispatched := make(chan struct{})
			he.write = func(n int) {
				if n != 1 {
					return
				}
				defer close(dispatched)
				h.send(adv(1, targets[1].Remote()))
				for {
					select {
					case n := <-polling:
						if n >= 3 {
							return // the poll that took the ADV ended
						}
					case r := <-rc:
						rc <- r
						return
					}
				}
			}
			errc := make(chan error, 1)
			go func() { errc <- c.Send(ctx, fabric.SGEOf(src)) }()
			if f := h.recv(); f.Kind() != kindRTS || f.Seq() != 0 {
				t.Fatalf("the victim sent %s %d, want RTS 0", kindNames[f.Kind()], f.Seq())
			}
			h.send(adv(0, targets[0].Remote()))
			testenv.Recv(t, dispatched, "the ADV of message 1 dispatched")
			select {
			case r := <-rc:
				t.Fatalf("the victim's Recv ended: %d, %v", r.n, r.err)
			default:
			}
			if err := testenv.Recv(t, errc, "Send 0"); err != nil {
				t.Fatalf("Send 0: %v", err)
			}
			h.send(frame(kindData, 0, 1, 0x42))
			if r := testenv.Recv(t, rc, "the victim's Recv"); r.n != 1 || r.err != nil {
				t.Fatalf("Recv = %d, %v", r.n, r.err)
			}
			fill(src.Bytes(), 7)
			if err := c.Send(ctx, fabric.SGEOf(src)); err != nil {
				t.Fatalf("Send 1: %v", err)
			}
			// The write's notification orders its bytes before the
			// look at them (roce's engine stores them in a goroutine
			// of its own). Message 0's came first.
			for i := range 2 {
				m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(h.rx)}}}
				if _, err := h.ep.RecvWait(ctx, m); err != nil {
					t.Fatal(err)
				}
				if want := uint32(i) | immLast; m[0].Flags&fabric.FlagRemoteWrite == 0 || m[0].Imm != want {
					t.Fatalf("the peer got flags %v imm %#x, want the write of message %d", m[0].Flags, m[0].Imm, i)
				}
			}
			if !bytes.Equal(targets[1].Bytes(), src.Bytes()) {
				t.Fatal("message 1 is not in the buffer advertised for it")
			}
			if s := c.Stats(); s.RTS != 1 || s.RndvSent != 2 {
				t.Fatalf("stats %+v, want 1 RTS and 2 messages by rendezvous", s)
			}
		})
	}
}
