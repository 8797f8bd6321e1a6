package batch_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/ntb"
)

// fillPacket writes packet i's content: its index, then a pattern.
func fillPacket(b []byte, i int) {
	for j := range b {
		b[j] = byte(i*131 + j*7 + len(b))
	}
	if len(b) >= 4 {
		binary.LittleEndian.PutUint32(b, uint32(i))
	}
}

func checkPacket(t testing.TB, got []byte, i, size int) {
	t.Helper()
	want := make([]byte, size)
	fillPacket(want, i)
	if !bytes.Equal(got, want) {
		t.Fatalf("packet %d: got %d bytes %x..., want %d bytes %x...", i, len(got), got[:min(8, len(got))], size, want[:min(8, size)])
	}
}

// sender streams total packets of sizes from sizeOf through c, reusing
// packet buffers only after Reclaim hands them back.
func sender(ctx context.Context, t testing.TB, ep fabric.Endpoint, c *batch.Coalescer, total int, sizeOf func(int) int) error {
	const nbuf, bufSize = 512, 1500
	reg, err := ep.Alloc(nbuf*bufSize, 0)
	if err != nil {
		return err
	}
	free := make([]uint64, 0, nbuf)
	for i := nbuf - 1; i >= 0; i-- {
		free = append(free, uint64(i))
	}
	owned := make([]bool, nbuf) // buffers the coalescer holds
	got := make([]uint64, 256)
	reclaim := func() error {
		n := c.Reclaim(got)
		for _, b := range got[:n] {
			if !owned[b] {
				return errors.New("Reclaim returned a buffer twice")
			}
			owned[b] = false
			free = append(free, b)
		}
		return nil
	}
	for i := 0; i < total; {
		if err := reclaim(); err != nil {
			return err
		}
		if len(free) == 0 {
			if _, err := c.Poll(); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		b := free[len(free)-1]
		size := sizeOf(i)
		off := int(b) * bufSize
		fillPacket(reg.Bytes()[off:off+size], i)
		err := c.Add(fabric.SGE{Region: reg, Offset: off, Length: size}, b)
		if errors.Is(err, batch.ErrFull) {
			if _, err := c.Poll(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		free = free[:len(free)-1]
		owned[b] = true
		i++
		if i%7 == 0 {
			if _, err := c.Poll(); err != nil {
				return err
			}
		}
	}
	if err := c.FlushWait(ctx); err != nil {
		return err
	}
	// Every buffer comes back.
	deadline := time.Now().Add(10 * time.Second)
	for len(free) < nbuf {
		if err := reclaim(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("buffers not reclaimed")
		}
	}
	return nil
}

// TestIntegrity streams packets of random sizes 1..1500 through batches
// and checks every byte and the order at the receiver.
func TestIntegrity(t *testing.T) { bothModes(t, testIntegrity) }

func testIntegrity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inline int // 0: the backend's (NTB copies: batches complete at Send)
	}{{"inline", 0}, {"signaled", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, ntb.Config{})
			var ep fabric.Endpoint = a
			if tc.inline > 0 {
				ep = lowInline{a, tc.inline}
			}
			c := newCoalescer(t, ep, &batch.Options{Deadline: 200 * time.Microsecond})
			s := newSplitter(t, b, nil)
			const total = 20000
			sizes := make([]int, total)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range sizes {
				sizes[i] = 1 + rng.IntN(1500)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- sender(ctx, t, ep, c, total, func(i int) int { return sizes[i] }) }()
			pkts := make([]batch.Packet, 64)
			for got := 0; got < total; {
				n, err := s.RecvWait(ctx, pkts)
				if err != nil {
					t.Fatalf("RecvWait after %d packets: %v", got, err)
				}
				for _, p := range pkts[:n] {
					if p.Raw {
						t.Fatalf("packet %d delivered raw", got)
					}
					checkPacket(t, p.Data, got, sizes[got])
					got++
				}
				s.Release(pkts[:n])
			}
			if err := testenv.Recv(t, errc, "the sender"); err != nil {
				t.Fatal(err)
			}
			cs, ss := c.Stats(), s.Stats()
			t.Logf("coalescer: %d batches, %.1f packets/batch, flushes %v, backpressure %d; splitter: %d batches",
				cs.Batches, cs.PacketsPerBatch(), cs.Flushes, cs.Backpressure, ss.Batches)
			if cs.Packets != total || ss.Packets != total || cs.Batches != ss.Batches {
				t.Fatalf("sent %d packets in %d batches, received %d in %d", cs.Packets, cs.Batches, ss.Packets, ss.Batches)
			}
			if cs.TotalDrops() != 0 || ss.TotalDrops() != 0 || ss.SeqGaps != 0 || ss.Raw != 0 {
				t.Fatalf("drops: coalescer %v, splitter %v, seq gaps %d, raw %d", cs.Drops, ss.Drops, ss.SeqGaps, ss.Raw)
			}
			if cs.PacketsPerBatch() < 2 {
				t.Fatalf("%.2f packets per batch: nothing was coalesced", cs.PacketsPerBatch())
			}
			var hist uint64
			for _, h := range cs.BatchSizes {
				hist += h
			}
			if hist != cs.Batches || cs.Flushes[batch.FlushBytes] == 0 {
				t.Fatalf("histogram sums to %d of %d batches; flushes %v", hist, cs.Batches, cs.Flushes)
			}
			if s.Held() != 0 {
				t.Fatalf("%d slots held after every packet was released", s.Held())
			}
			// On NTB a batch is one ring record, rung with at most one
			// doorbell.
			if es := a.Stats(); es.TxMessages != cs.Batches || es.Doorbells > cs.Batches {
				t.Fatalf("endpoint sent %d messages and rang %d doorbells for %d batches", es.TxMessages, es.Doorbells, cs.Batches)
			}
		})
	}
}

func addPackets(t testing.TB, c *batch.Coalescer, reg *fabric.Region, from, n, size int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		off := (i * size) % (reg.Len() - size + 1)
		fillPacket(reg.Bytes()[off:off+size], i)
		if err := c.Add(fabric.SGE{Region: reg, Offset: off, Length: size}, uint64(i)); err != nil {
			t.Fatalf("Add %d: %v", i, err)
		}
	}
}

func TestFlushCauses(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(64<<10, 0)

	t.Run("count", func(t *testing.T) {
		c := newCoalescer(t, a, &batch.Options{MaxPackets: 8, Deadline: -1})
		addPackets(t, c, src, 0, 7, 10)
		expectNothing(t, s, 20*time.Millisecond)
		addPackets(t, c, src, 7, 1, 10)
		for i, p := range recvN(t, s, 8) {
			checkPacket(t, p, i, 10)
		}
		st := c.Stats()
		if st.Flushes != [batch.NumFlushCauses]uint64{batch.FlushCount: 1} || st.BatchSizes[3] != 1 {
			t.Fatalf("flushes %v, sizes %v", st.Flushes, st.BatchSizes)
		}
		if got, want := st.String(), "batches=1 packets=8 bytes=80 pkts/batch=8.0 sizes=8-15:1 flushes=count:1"; got != want {
			t.Fatalf("Stats.String:\n got %s\nwant %s", got, want)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		// 12+2*3+3*100 = 318 fits, a fourth packet would not.
		c := newCoalescer(t, a, &batch.Options{MaxBytes: 400, Deadline: -1})
		addPackets(t, c, src, 0, 3, 100)
		expectNothing(t, s, 20*time.Millisecond)
		addPackets(t, c, src, 3, 1, 100) // closes the first three
		for i, p := range recvN(t, s, 3) {
			checkPacket(t, p, i, 100)
		}
		if st := c.Stats(); st.Flushes != [batch.NumFlushCauses]uint64{batch.FlushBytes: 1} || c.Open() != 1 {
			t.Fatalf("flushes %v, open %d", st.Flushes, c.Open())
		}
		// A batch that cannot take even one more byte closes at once.
		c2 := newCoalescer(t, a, &batch.Options{MaxBytes: batch.HeaderSize(1) + 50, Deadline: -1})
		addPackets(t, c2, src, 0, 1, 50)
		checkPacket(t, recvN(t, s, 1)[0], 0, 50)
		if st := c2.Stats(); st.Flushes[batch.FlushBytes] != 1 {
			t.Fatalf("flushes %v", st.Flushes)
		}
		c.Flush()
		recvN(t, s, 1)
	})
	t.Run("explicit", func(t *testing.T) {
		c := newCoalescer(t, a, &batch.Options{Deadline: -1})
		addPackets(t, c, src, 0, 5, 33)
		if pending, err := c.Flush(); pending != 0 || err != nil {
			t.Fatalf("Flush: %d pending, %v", pending, err)
		}
		for i, p := range recvN(t, s, 5) {
			checkPacket(t, p, i, 33)
		}
		if n, _ := c.Flush(); n != 0 { // nothing open: no empty batch
			t.Fatal(n)
		}
		expectNothing(t, s, 10*time.Millisecond)
		if st := c.Stats(); st.Flushes != [batch.NumFlushCauses]uint64{batch.FlushExplicit: 1} || st.Batches != 1 {
			t.Fatalf("flushes %v, batches %d", st.Flushes, st.Batches)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		const d = 30 * time.Millisecond
		c := newCoalescer(t, a, &batch.Options{Deadline: d})
		t0 := time.Now()
		addPackets(t, c, src, 0, 3, 20)
		due, ok := c.Due()
		if !ok || due.Before(t0.Add(d)) || due.After(time.Now().Add(d)) {
			t.Fatalf("Due %v %v, added at %v", due, ok, t0)
		}
		c.Tick(t0.Add(d / 2)) // before the deadline: nothing
		expectNothing(t, s, 5*time.Millisecond)
		c.Tick(due)
		for i, p := range recvN(t, s, 3) {
			checkPacket(t, p, i, 20)
		}
		if st := c.Stats(); st.Flushes != [batch.NumFlushCauses]uint64{batch.FlushDeadline: 1} {
			t.Fatalf("flushes %v", st.Flushes)
		}
		if _, ok := c.Due(); ok {
			t.Fatal("Due with no open batch")
		}
	})
}

// TestDeadlineRun checks that Run keeps the deadline by itself: the batch
// arrives after the deadline (not before: nothing else closes it) and
// well within a generous bound.
func TestDeadlineRun(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(4096, 0)
	const d = 20 * time.Millisecond
	c := newCoalescer(t, a, &batch.Options{Deadline: d})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- batch.Run(ctx, c) }()
	for round := 0; round < 3; round++ {
		t0 := time.Now()
		addPackets(t, c, src, round*2, 2, 64)
		got := recvN(t, s, 2)
		el := time.Since(t0)
		if el < d || el > d+5*time.Second {
			t.Fatalf("round %d: batch arrived after %v, deadline %v", round, el, d)
		}
		checkPacket(t, got[1], round*2+1, 64)
	}
	cancel()
	if err := testenv.Recv(t, done, "the Run a cancel ends"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Flushes[batch.FlushDeadline] != 3 {
		t.Fatalf("flushes %v", st.Flushes)
	}
	// Run returns when the coalescer closes.
	bg := testenv.Context(t)
	go func() { done <- batch.Run(bg, c) }()
	c.Close()
	if err := testenv.Recv(t, done, "the Run a Close ends"); !errors.Is(err, os.ErrClosed) {
		t.Fatal(err)
	}
}

// TestBackpressure fills a small ring while the receiver sleeps: batches
// stay queued (Pending, Stats.Backpressure), Add refuses packets with
// ErrFull once every descriptor is busy, and when the receiver drains,
// every packet arrives exactly once, in order.
func TestBackpressure(t *testing.T) { bothModes(t, testBackpressure) }

func testBackpressure(t *testing.T) {
	a, b := pair(t, ntb.Config{RingSize: 8192, MaxMsgSize: 2048})
	c := newCoalescer(t, a, &batch.Options{Depth: 8, Deadline: -1})
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(1<<20, 0)
	const size = 200
	sent := 0
	add := func() error {
		off := (sent * size) % (src.Len() - size)
		fillPacket(src.Bytes()[off:off+size], sent)
		err := c.Add(fabric.SGE{Region: src, Offset: off, Length: size}, uint64(sent))
		if err == nil {
			sent++
		}
		return err
	}
	var err error
	for err == nil {
		err = add()
	}
	if !errors.Is(err, batch.ErrFull) {
		t.Fatalf("Add: %v, want ErrFull", err)
	}
	st := c.Stats()
	t.Logf("%d packets taken; pending %d, stats %+v", sent, c.Pending(), st)
	if c.Pending() == 0 || st.Backpressure == 0 || st.Full != 1 {
		t.Fatalf("pending %d, backpressure %d, full %d", c.Pending(), st.Backpressure, st.Full)
	}
	if n, err := c.Flush(); n == 0 || err != nil {
		t.Fatalf("Flush under backpressure: %d pending, %v", n, err)
	}
	// Reclaim gives back only what was sent (NTB copied it).
	cookies := make([]uint64, 4096)
	n := c.Reclaim(cookies)
	if n == 0 || n >= sent {
		t.Fatalf("reclaimed %d of %d while batches are queued", n, sent)
	}
	for i, ck := range cookies[:n] {
		if ck != uint64(i) {
			t.Fatalf("reclaim %d: cookie %d", i, ck)
		}
	}
	// Drain at the receiver while the sender keeps adding.
	const total = 3000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		for sent < total {
			c.Reclaim(cookies)
			if err := add(); err != nil && !errors.Is(err, batch.ErrFull) {
				errc <- err
				return
			}
			c.Poll()
		}
		errc <- c.FlushWait(ctx)
	}()
	pkts := make([]batch.Packet, 16)
	for got := 0; got < total; {
		k, err := s.RecvWait(ctx, pkts)
		if err != nil {
			t.Fatalf("after %d: %v", got, err)
		}
		for _, p := range pkts[:k] {
			checkPacket(t, p.Data, got, size)
			got++
		}
		s.Release(pkts[:k])
	}
	if err := testenv.Recv(t, errc, "the sender"); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, s, 10*time.Millisecond)
	if cs, ss := c.Stats(), s.Stats(); cs.Packets != total || ss.Packets != total || cs.TotalDrops() != 0 {
		t.Fatalf("coalescer %+v\nsplitter %+v", cs, ss)
	}
}

// TestOwnership checks when packets come back: at Send for batches the
// backend copies (inline), only after the completion for signaled ones,
// and that Complete and the internal poll tell the coalescer's
// completions from the program's.
func TestOwnership(t *testing.T) { bothModes(t, testOwnership) }

func testOwnership(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(64<<10, 0)
	cookies := make([]uint64, 64)
	wantCookies := func(n int, from int) {
		t.Helper()
		if n != 3 || cookies[0] != uint64(from) || cookies[2] != uint64(from+2) {
			t.Fatalf("reclaimed %d: %v", n, cookies[:n])
		}
	}

	t.Run("inline", func(t *testing.T) {
		c := newCoalescer(t, a, nil)
		addPackets(t, c, src, 0, 3, 100)
		if n := c.Reclaim(cookies); n != 0 {
			t.Fatalf("reclaimed %d packets of an open batch", n)
		}
		c.Flush()
		wantCookies(c.Reclaim(cookies), 0)
		// The buffers are the caller's again: overwrite them; the receiver
		// still gets the original contents.
		clear(src.Bytes()[:300])
		for i, p := range recvN(t, s, 3) {
			checkPacket(t, p, i, 100)
		}
	})

	t.Run("external", func(t *testing.T) {
		ep := lowInline{a, 64}
		c := newCoalescer(t, ep, &batch.Options{ExternalCompletions: true})
		addPackets(t, c, src, 10, 3, 100)
		c.Flush()
		if n := c.Reclaim(cookies); n != 0 || c.InFlight() != 1 {
			t.Fatalf("reclaimed %d packets of a signaled batch before its completion (in flight %d)", n, c.InFlight())
		}
		// The program's own signaled operation shares the queue.
		tgt, _ := b.Alloc(64, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
		w := []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 8}}, Remote: tgt.Remote().Slice(0, 8),
			Flags: fabric.FlagSignal, Context: 77}}
		if _, err := a.Write(w); err != nil {
			t.Fatal(err)
		}
		comps := make([]fabric.Completion, 8)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var all []fabric.Completion
		for len(all) < 2 {
			n, err := a.CQ().Wait(ctx, comps)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, comps[:n]...)
		}
		if n := c.Complete(all); n != 1 {
			t.Fatalf("Complete took %d of %v", n, all)
		}
		if n := c.Complete(all); n != 0 { // a completion counts once
			t.Fatalf("Complete took %d again", n)
		}
		wantCookies(c.Reclaim(cookies), 10)
		if c.InFlight() != 0 || c.Stats().Foreign != 0 {
			t.Fatalf("in flight %d, foreign %d", c.InFlight(), c.Stats().Foreign)
		}
		recvN(t, s, 3)
	})

	t.Run("internal", func(t *testing.T) {
		ep := lowInline{a, 64}
		c := newCoalescer(t, ep, nil)
		addPackets(t, c, src, 20, 3, 100)
		c.Flush()
		// The completion is on the queue (NTB completes at once); a signaled
		// operation of someone else's lands there too and is discarded.
		tgt, _ := b.Alloc(64, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
		a.Write([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 8}}, Remote: tgt.Remote().Slice(0, 8),
			Flags: fabric.FlagSignal, Context: 78}})
		wantCookies(c.Reclaim(cookies), 20)
		addPackets(t, c, src, 23, 3, 100)
		c.Flush()
		wantCookies(c.Reclaim(cookies), 23)
		if st := c.Stats(); st.Foreign != 1 || c.InFlight() != 0 {
			t.Fatalf("foreign %d, in flight %d", st.Foreign, c.InFlight())
		}
		recvN(t, s, 6)
	})

	t.Run("reclaim-partial", func(t *testing.T) {
		c := newCoalescer(t, a, nil)
		addPackets(t, c, src, 0, 10, 10)
		c.Flush()
		addPackets(t, c, src, 10, 5, 10)
		c.Flush()
		var got []uint64
		small := make([]uint64, 3)
		for {
			n := c.Reclaim(small)
			if n == 0 {
				break
			}
			got = append(got, small[:n]...)
		}
		if len(got) != 15 {
			t.Fatalf("reclaimed %v", got)
		}
		for i, ck := range got {
			if ck != uint64(i) {
				t.Fatalf("reclaimed %v", got)
			}
		}
		recvN(t, s, 15)
	})
}

// TestSendFailures: a batch the endpoint refuses is dropped and its
// packets handed back; a closed endpoint keeps batches queued until Close
// drops them; nothing is lost silently.
func TestSendFailures(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	a2, _ := pair(t, ntb.Config{})
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(4096, 0)
	other, _ := a2.Alloc(4096, 0) // another endpoint's domain
	c := newCoalescer(t, a, nil)
	cookies := make([]uint64, 64)

	addPackets(t, c, src, 0, 2, 10)
	if err := c.Add(fabric.SGE{Region: other, Length: 10}, 99); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Flush(); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("Flush of a batch with a foreign region: %v", err)
	}
	st := c.Stats()
	if st.Drops[batch.DropRejected] != 1 || st.DroppedPackets != 3 || c.Pending() != 0 {
		t.Fatalf("drops %v / %d, pending %d", st.Drops, st.DroppedPackets, c.Pending())
	}
	if n := c.Reclaim(cookies); n != 3 || cookies[2] != 99 {
		t.Fatalf("reclaimed %v", cookies[:n])
	}
	expectNothing(t, s, 10*time.Millisecond)

	// Bad packets are refused by Add itself.
	for _, p := range []fabric.SGE{{}, {Region: src, Offset: 4090, Length: 10}, {Region: src, Length: 0},
		{Region: src, Offset: -1, Length: 1}, {Region: src, Length: 70000}} {
		if err := c.Add(p, 0); err == nil {
			t.Fatalf("Add(%+v) accepted", p)
		}
	}
	if err := c.Add(fabric.SGE{Region: src, Offset: 4090, Length: 10}, 0); !errors.Is(err, fabric.ErrBounds) {
		t.Fatal(err)
	}
	if err := c.Add(fabric.SGE{Region: src, Length: 70000}, 0); !errors.Is(err, fabric.ErrMessageSize) {
		t.Fatal(err)
	}

	// The endpoint closes under queued batches.
	addPackets(t, c, src, 0, 4, 10)
	a.Close()
	if n, err := c.Flush(); n != 1 || !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Flush on a closed endpoint: %d pending, %v", n, err)
	}
	if n := c.Reclaim(cookies); n != 0 {
		t.Fatalf("reclaimed %d unsent packets", n)
	}
	c.Close()
	if n := c.Reclaim(cookies); n != 4 {
		t.Fatalf("reclaimed %d after Close", n)
	}
	if st := c.Stats(); st.Drops[batch.DropClosed] != 1 || st.DroppedPackets != 7 {
		t.Fatalf("drops %v / %d", st.Drops, st.DroppedPackets)
	}
}

func TestClose(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	c, err := batch.NewCoalescer(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := batch.NewSplitter(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := a.Alloc(4096, 0)
	addPackets(t, c, src, 0, 3, 10)
	for i := 0; i < 2; i++ {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Add(fabric.SGE{Region: src, Length: 1}, 0); !errors.Is(err, os.ErrClosed) {
		t.Fatal(err)
	}
	for _, f := range []func() (int, error){c.Poll, c.Flush, func() (int, error) { return c.Tick(time.Now()) },
		func() (int, error) { return s.Recv(make([]batch.Packet, 1)) },
		func() (int, error) { return s.RecvWait(testenv.Context(t), make([]batch.Packet, 1)) }} {
		if _, err := f(); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
	}
	if err := c.FlushWait(testenv.Context(t)); !errors.Is(err, os.ErrClosed) {
		t.Fatal(err)
	}
	if n := c.Reclaim(make([]uint64, 8)); n != 3 {
		t.Fatalf("Reclaim after Close: %d", n)
	}
	// The endpoints are still usable: Close closed neither.
	if _, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 4}}}}); err != nil {
		t.Fatal(err)
	}
}

// TestRaw checks that messages sent without the coalescer come through
// whole, in order with batches.
func TestRaw(t *testing.T) { bothModes(t, testRaw) }

func testRaw(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	c := newCoalescer(t, a, nil)
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(4096, 0)
	copy(src.Bytes()[1000:], "plain message")
	addPackets(t, c, src, 0, 2, 10)
	c.Flush()
	a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Offset: 1000, Length: 13}}, Flags: fabric.FlagImm, Imm: 5}})
	a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Offset: 1000, Length: 5}}}})
	addPackets(t, c, src, 2, 1, 10)
	c.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []batch.Packet
	pkts := make([]batch.Packet, 8)
	for len(got) < 5 {
		n, err := s.RecvWait(ctx, pkts)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, pkts[:n]...)
	}
	checkPacket(t, got[1].Data, 1, 10)
	if !got[2].Raw || string(got[2].Data) != "plain message" || got[2].Flags != fabric.FlagImm || got[2].Imm != 5 {
		t.Fatalf("raw packet %+v", got[2])
	}
	if !got[3].Raw || string(got[3].Data) != "plain" || got[3].Flags != 0 || got[0].Raw || got[4].Raw {
		t.Fatalf("packets %+v", got)
	}
	checkPacket(t, got[4].Data, 2, 10)
	s.Release(got)
	if st := s.Stats(); st.Raw != 2 || st.Batches != 2 || st.Packets != 3 || s.Held() != 0 {
		t.Fatalf("stats %+v, held %d", st, s.Held())
	}
}

// TestSlots checks slot reuse and release rules: packets hold their slot,
// a full splitter receives nothing until a release, and releasing twice
// panics instead of corrupting a slot.
func TestSlots(t *testing.T) { bothModes(t, testSlots) }

func testSlots(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	c := newCoalescer(t, a, &batch.Options{MaxPackets: 4, Deadline: -1})
	s := newSplitter(t, b, &batch.SplitterOptions{Slots: 2, SlotSize: 1024})
	src, _ := a.Alloc(4096, 0)
	addPackets(t, c, src, 0, 12, 50) // three batches of four
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pkts := make([]batch.Packet, 16)
	n := 0
	for n < 8 { // two slots: two batches
		k, err := s.RecvWait(ctx, pkts[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	if k, err := s.Recv(pkts[n:]); k != 0 || err != nil {
		t.Fatalf("Recv with every slot held: %d, %v", k, err)
	}
	if s.Held() != 2 || s.Stats().Full == 0 {
		t.Fatalf("held %d, stats %+v", s.Held(), s.Stats())
	}
	// Releasing part of a batch frees nothing; all of it frees its slot.
	for i := 0; i < 8; i++ {
		checkPacket(t, pkts[i].Data, i, 50)
	}
	s.Release(pkts[0:3])
	if k, _ := s.Recv(pkts[8:]); k != 0 {
		t.Fatal("received into a slot that still has a packet")
	}
	s.Release(pkts[3:4])
	k, err := s.RecvWait(ctx, pkts[8:])
	if k != 4 || err != nil {
		t.Fatalf("after release: %d, %v", k, err)
	}
	for i := 8; i < 12; i++ {
		checkPacket(t, pkts[i].Data, i, 50)
	}
	// Releases from another goroutine, while RecvWait waits for a slot.
	done := make(chan struct{})
	go func() {
		// Until RecvWait sleeps for a slot (its goroutine parked in the
		// select that a Release must wake), so the wake-up, not a poll,
		// is what the test checks.
		for !parkedForSlot() {
			time.Sleep(time.Millisecond)
		}
		s.Release(pkts[4:8])
		close(done)
	}()
	addPackets(t, c, src, 12, 4, 50)
	if k, err := s.RecvWait(ctx, pkts[:4]); k != 4 || err != nil {
		t.Fatalf("RecvWait for a slot: %d, %v", k, err)
	}
	testenv.Recv(t, done, "the Release of the goroutine that waits for RecvWait to park")
	checkPacket(t, pkts[0].Data, 12, 50)
	s.Release(pkts[:4])
	s.Release(pkts[8:12])
	if s.Held() != 0 {
		t.Fatalf("held %d", s.Held())
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("double Release did not panic")
			}
		}()
		s.Release(pkts[:1])
	}()
	s.Release(make([]batch.Packet, 3)) // zero packets: ignored
}

// parkedForSlot reports whether a goroutine is parked in a Splitter's
// RecvWait waiting for a free slot.
func parkedForSlot() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "batch.(*Splitter).RecvWait(") {
			return true
		}
	}
	return false
}

// TestSlotWaitClose: Close wakes a RecvWait that waits for a free slot,
// with os.ErrClosed.
func TestSlotWaitClose(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	c := newCoalescer(t, a, &batch.Options{MaxPackets: 4, Deadline: -1})
	s := newSplitter(t, b, &batch.SplitterOptions{Slots: 1, SlotSize: 1024})
	src, _ := a.Alloc(4096, 0)
	addPackets(t, c, src, 0, 8, 50)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pkts := make([]batch.Packet, 4)
	for n := 0; n < 4; {
		k, err := s.RecvWait(ctx, pkts[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	full := s.Stats().Full
	done := make(chan error, 1)
	go func() { _, err := s.RecvWait(ctx, pkts); done <- err }()
	if !testenv.Eventually(testenv.Timeout, func() bool { return s.Stats().Full != full }) { // until RecvWait has found the slot held
		t.Fatal("timed out waiting for RecvWait to find the slot held")
	}
	s.Close()
	if err := testenv.Recv(t, done, "the RecvWait a Close ends"); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("RecvWait after Close: %v, want os.ErrClosed", err)
	}
}

// TestMalformed sends batches with broken headers (and the batch
// immediate) straight through the endpoint: each is dropped and counted,
// Recv reports a batch's *fabric.MalformedError matching fabric.ErrMalformed, nothing
// panics, and the slot comes back.
func TestMalformed(t *testing.T) { bothModes(t, testMalformed) }

func testMalformed(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	s := newSplitter(t, b, &batch.SplitterOptions{Slots: 4, SlotSize: 2048})
	src, _ := a.Alloc(8192, 0)
	good := func(lens ...int) []byte {
		h := []byte{'W', 'B', 1, 0, 0, 0, 0, 0, 1, 0, 0, 0}
		binary.LittleEndian.PutUint16(h[4:], uint16(len(lens)))
		binary.LittleEndian.PutUint16(h[6:], uint16(batch.HeaderSize(len(lens))))
		for _, l := range lens {
			h = binary.LittleEndian.AppendUint16(h, uint16(l))
		}
		for _, l := range lens {
			h = append(h, bytes.Repeat([]byte{0xaa}, l)...)
		}
		return h
	}
	mut := func(b []byte, f func([]byte)) []byte { f(b); return b }
	cases := map[string][]byte{
		"empty":         {},
		"short":         good(1)[:11],
		"magic":         mut(good(3), func(b []byte) { b[0] = 'X' }),
		"version":       mut(good(3), func(b []byte) { b[2] = 2 }),
		"flags":         mut(good(3), func(b []byte) { b[3] = 0x80 }),
		"zero count":    mut(good(3), func(b []byte) { b[4] = 0 }),
		"count too big": mut(good(3), func(b []byte) { binary.LittleEndian.PutUint16(b[4:], 60000) }),
		"hdr too short": mut(good(3, 4), func(b []byte) { b[6] = 14 }),
		"hdr past end":  mut(good(3), func(b []byte) { binary.LittleEndian.PutUint16(b[6:], 5000) }),
		"zero length":   mut(good(3, 4), func(b []byte) { b[14], b[15] = 0, 0 }),
		"lengths long":  mut(good(3, 4), func(b []byte) { b[14] = 5 }),
		"lengths short": good(3, 4)[:20],
		"length wraps":  mut(good(3, 4), func(b []byte) { b[14], b[15] = 0xff, 0xff }),
		"extra bytes":   append(good(3, 4), 1),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pkts := make([]batch.Packet, 8)
	sent := 0
	for name, msg := range cases {
		copy(src.Bytes(), msg)
		if _, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(msg)}},
			Flags: fabric.FlagImm, Imm: batch.Imm}}); err != nil {
			t.Fatal(err)
		}
		sent++
		n, err := s.RecvWait(ctx, pkts)
		var he *fabric.MalformedError
		if n != 0 || !errors.Is(err, fabric.ErrMalformed) || !errors.As(err, &he) || he.Where != "batch" {
			t.Fatalf("%s: %d packets, %v", name, n, err)
		}
		if s.Held() != 0 {
			t.Fatalf("%s: slot not returned", name)
		}
	}
	if st := s.Stats(); st.Drops[batch.DropMalformed] != uint64(sent) || st.Packets != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A header with extra room past its length table is fine (later
	// versions may put fields there).
	msg := good(3, 4)
	msg = append(msg[:16:16], append([]byte{9, 9}, msg[16:]...)...)
	binary.LittleEndian.PutUint16(msg[6:], 18)
	copy(src.Bytes(), msg)
	a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(msg)}}, Flags: fabric.FlagImm, Imm: batch.Imm}})
	n, err := s.RecvWait(ctx, pkts)
	if n != 2 || err != nil || len(pkts[0].Data) != 3 || len(pkts[1].Data) != 4 || pkts[1].Data[0] != 0xaa {
		t.Fatalf("extended header: %d, %v", n, err)
	}
	s.Release(pkts[:n])
	// A message longer than a slot.
	a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 4000}}, Flags: fabric.FlagImm, Imm: batch.Imm}})
	if n, err := s.RecvWait(ctx, pkts); n != 0 || !errors.Is(err, fabric.ErrMessageSize) {
		t.Fatalf("truncated: %d, %v", n, err)
	}
	if st := s.Stats(); st.Drops[batch.DropTruncated] != 1 || s.Held() != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Bad and good batches back to back, received in one burst: the good
	// ones come through in order, the bad ones are dropped in between.
	before := s.Stats().Drops[batch.DropMalformed]
	seq := [][]byte{cases["magic"], good(5), cases["zero length"], cases["short"], good(6, 7), cases["flags"]}
	for _, m := range seq {
		copy(src.Bytes(), m)
		if _, err := a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(m)}},
			Flags: fabric.FlagImm, Imm: batch.Imm}}); err != nil {
			t.Fatal(err)
		}
	}
	var lens []int
	for len(lens) < 3 {
		n, err := s.RecvWait(ctx, pkts)
		if err != nil && !errors.Is(err, fabric.ErrMalformed) {
			t.Fatal(err)
		}
		for _, p := range pkts[:n] {
			lens = append(lens, len(p.Data))
		}
		s.Release(pkts[:n])
	}
	if fmt.Sprint(lens) != "[5 6 7]" {
		t.Fatalf("packets of %v bytes", lens)
	}
	for s.Stats().Drops[batch.DropMalformed] != before+4 { // the last one may still be on its way
		if _, err := s.Recv(pkts); err != nil && !errors.Is(err, fabric.ErrMalformed) {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatalf("drops %v", s.Stats().Drops)
		}
	}
	if s.Held() != 0 {
		t.Fatalf("held %d", s.Held())
	}
	// A malformed batch ends a RecvWait for one packet at once with its
	// error: the wait does not go on blocking for a good one.
	copy(src.Bytes(), cases["magic"])
	a.Send([]fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(cases["magic"])}}, Flags: fabric.FlagImm, Imm: batch.Imm}})
	if n, err := s.RecvWait(ctx, pkts[:1]); n != 0 || !errors.Is(err, fabric.ErrMalformed) {
		t.Fatalf("RecvWait for one packet after a malformed batch: %d, %v; want ErrMalformed at once", n, err)
	}
}

// TestGroup routes packets to two next hops over two bridges.
func TestGroup(t *testing.T) { bothModes(t, testGroup) }

func testGroup(t *testing.T) {
	a0, b0 := pair(t, ntb.Config{})
	a1, b1 := pair(t, ntb.Config{})
	g, err := batch.NewGroup([]fabric.Endpoint{a0, a1}, &batch.Options{MaxPackets: 5, Deadline: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	s0, s1 := newSplitter(t, b0, nil), newSplitter(t, b1, nil)
	srcs := []*fabric.Region{alloc(t, a0, 1<<16), alloc(t, a1, 1<<16)}
	const total = 200 // 133 to one, 67 to the other: both end with an open batch
	for i := 0; i < total; i++ {
		dst := i % 3 % 2 // 0, 1, 0, 0, 1, 0, ...
		off := i * 100
		fillPacket(srcs[dst].Bytes()[off:off+64], i)
		if err := g.Add(dst, fabric.SGE{Region: srcs[dst], Offset: off, Length: 64}, uint64(i)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			g.Reclaim(make([]uint64, 256))
		}
	}
	if err := g.Add(2, fabric.SGE{Region: srcs[0], Length: 1}, 0); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if _, err := g.Poll(); err != nil { // deadline flush of both open batches
		t.Fatal(err)
	}
	var want [2][]int
	for i := 0; i < total; i++ {
		want[i%3%2] = append(want[i%3%2], i)
	}
	for d, s := range []*batch.Splitter{s0, s1} {
		for j, p := range recvN(t, s, len(want[d])) {
			checkPacket(t, p, want[d][j], 64)
		}
	}
	st := g.Stats()
	if st.Packets != total || st.Flushes[batch.FlushDeadline] != 2 || g.Len() != 2 || g.Coalescer(1).Stats().Packets != uint64(len(want[1])) {
		t.Fatalf("stats %+v", st)
	}
	if n := g.Reclaim(make([]uint64, 256)); n == 0 {
		t.Fatal("nothing reclaimed")
	}
}

// TestConcurrent: several goroutines add to one coalescer while Run keeps
// the deadline, and worker goroutines release packets the receiver hands
// them. Each sender's packets arrive in its order.
func TestConcurrent(t *testing.T) { bothModes(t, testConcurrent) }

func testConcurrent(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	c := newCoalescer(t, a, &batch.Options{Deadline: 20 * time.Microsecond})
	s := newSplitter(t, b, &batch.SplitterOptions{Slots: 16})
	const senders, per, size = 4, 3000, 48
	src := alloc(t, a, senders*per*size)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rctx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- batch.Run(rctx, c) }()
	var wg sync.WaitGroup
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cookies := make([]uint64, 64)
			for i := 0; i < per; {
				off := (g*per + i) * size
				p := src.Bytes()[off : off+size]
				binary.LittleEndian.PutUint32(p, uint32(g))
				binary.LittleEndian.PutUint32(p[4:], uint32(i))
				err := c.Add(fabric.SGE{Region: src, Offset: off, Length: size}, uint64(off))
				c.Reclaim(cookies)
				if errors.Is(err, batch.ErrFull) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				i++
			}
		}()
	}
	work := make(chan []batch.Packet, 8)
	var workers sync.WaitGroup
	for w := 0; w < 2; w++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for ps := range work {
				s.Release(ps)
			}
		}()
	}
	next := make([]int, senders)
	for got := 0; got < senders*per; {
		pkts := make([]batch.Packet, 32)
		n, err := s.RecvWait(ctx, pkts)
		if err != nil {
			t.Fatalf("after %d: %v", got, err)
		}
		for _, p := range pkts[:n] {
			g, i := binary.LittleEndian.Uint32(p.Data), int(binary.LittleEndian.Uint32(p.Data[4:]))
			if i != next[g] {
				t.Fatalf("sender %d: packet %d, want %d", g, i, next[g])
			}
			next[g]++
		}
		got += n
		work <- pkts[:n]
	}
	close(work)
	testenv.Await(t, "the workers' Releases", workers.Wait)
	testenv.Await(t, "the senders", wg.Wait)
	stopRun()
	testenv.Recv(t, runDone, "the Run a cancel ends")
	if st := c.Stats(); st.Packets != senders*per {
		t.Fatalf("stats %+v", st)
	}
	if s.Held() != 0 {
		t.Fatalf("held %d", s.Held())
	}
}

func TestOptions(t *testing.T) {
	a, _ := pair(t, ntb.Config{})
	caps := a.Caps()
	c := newCoalescer(t, a, nil)
	if c.MaxPackets() != caps.MaxSGEs-1 || c.MaxBytes() != min(caps.MaxMsgSize, batch.DefaultMaxBytes) {
		t.Fatalf("defaults: %d packets, %d bytes; caps %+v", c.MaxPackets(), c.MaxBytes(), caps)
	}
	for _, o := range []batch.Options{{MaxPackets: caps.MaxSGEs}, {MaxPackets: -1}, {MaxBytes: caps.MaxMsgSize + 1},
		{MaxBytes: 10}, {Depth: -1}} {
		if _, err := batch.NewCoalescer(a, &o); !errors.Is(err, fabric.ErrInvalid) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
	if _, err := batch.NewSplitter(a, &batch.SplitterOptions{Slots: -1}); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := batch.NewCoalescer(oneSGE{a}, nil); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatal(err)
	}
}

type oneSGE struct{ fabric.Endpoint }

func (o oneSGE) Caps() fabric.Caps { c := o.Endpoint.Caps(); c.MaxSGEs = 1; return c }

// TestBounds: each Coalescer limit at, below and above its edge. A batch
// whose next 1-byte packet fits exactly stays open, and takes that
// packet; MaxPackets 1 and the backend's own limit are legal, MaxBytes at
// the message size and at the smallest batch; Reclaim with a short slice
// returns no more than it holds.
func TestBounds(t *testing.T) {
	a, b := pair(t, ntb.Config{})
	caps := a.Caps()
	for _, o := range []batch.Options{{MaxPackets: 1}, {MaxPackets: caps.MaxSGEs - 1}, {MaxBytes: caps.MaxMsgSize},
		{MaxBytes: batch.HeaderSize(1) + 1}, {Depth: 1}} {
		if _, err := batch.NewCoalescer(a, &o); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if _, err := batch.NewCoalescer(a, &batch.Options{MaxBytes: batch.HeaderSize(1)}); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("MaxBytes %d (no room for a byte): %v", batch.HeaderSize(1), err)
	}
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(64<<10, 0)

	// 12 (header) + 2+50: a 1-byte packet needs 3 more, exactly MaxBytes.
	c := newCoalescer(t, a, &batch.Options{MaxBytes: batch.HeaderSize(1) + 50 + 3, Deadline: -1})
	addPackets(t, c, src, 0, 1, 50)
	if c.Open() != 1 {
		t.Fatalf("a batch with room for exactly one more byte closed (open %d)", c.Open())
	}
	addPackets(t, c, src, 100, 1, 1) // at offset 100, clear of the first
	got := recvN(t, s, 2)
	checkPacket(t, got[0], 0, 50)
	checkPacket(t, got[1], 100, 1)
	if st := c.Stats(); st.Batches != 1 || st.Flushes[batch.FlushBytes] != 1 {
		t.Fatalf("%d batches, flushes %v; want the two packets in one batch closed by bytes", st.Batches, st.Flushes)
	}

	// Reclaim hands back at most len(out) cookies a call.
	c2 := newCoalescer(t, a, &batch.Options{Deadline: -1})
	addPackets(t, c2, src, 200, 3, 8)
	c2.Flush()
	recvN(t, s, 3)
	var cookies []uint64
	out := make([]uint64, 1)
	deadline := time.Now().Add(10 * time.Second)
	for len(cookies) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for 3 reclaimed packets: have %v", cookies)
		}
		n := c2.Reclaim(out)
		if n > len(out) {
			t.Fatalf("Reclaim returned %d into a slice of %d", n, len(out))
		}
		cookies = append(cookies, out[:n]...)
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if cookies[0] != 200 || cookies[1] != 201 || cookies[2] != 202 {
		t.Fatalf("reclaimed %v, want [200 201 202]", cookies)
	}
}

// TestSlotSizeExact: a batch of exactly SlotSize bytes is delivered, one
// byte longer is dropped as truncated and counted, in both receive modes.
func TestSlotSizeExact(t *testing.T) { bothModes(t, testSlotSizeExact) }

func testSlotSizeExact(t *testing.T) {
	const slot = 512
	a, b := pair(t, ntb.Config{})
	s := newSplitter(t, b, &batch.SplitterOptions{SlotSize: slot})
	src, _ := a.Alloc(64<<10, 0)
	exact := newCoalescer(t, a, &batch.Options{MaxBytes: slot, Deadline: -1})
	size := slot - batch.HeaderSize(1)
	addPackets(t, exact, src, 0, 1, size)
	exact.Flush()
	checkPacket(t, recvN(t, s, 1)[0], 0, size)
	over := newCoalescer(t, a, &batch.Options{MaxBytes: slot + 1, Deadline: -1})
	addPackets(t, over, src, 0, 1, size+1)
	over.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pkts := make([]batch.Packet, 4)
	n, err := s.RecvWait(ctx, pkts)
	s.Release(pkts[:n])
	if n != 0 || !errors.Is(err, fabric.ErrMessageSize) {
		t.Fatalf("a batch one byte over the slot: %d packets, %v; want ErrMessageSize", n, err)
	}
	if st := s.Stats(); st.Drops[batch.DropTruncated] != 1 {
		t.Fatalf("drops %v: want the message one byte over the slot dropped as truncated", st.Drops)
	}
}
