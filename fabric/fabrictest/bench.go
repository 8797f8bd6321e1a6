package fabrictest

import (
	"context"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// MakeBenchPair returns a fresh connected pair for a benchmark.
type MakeBenchPair func(b *testing.B) (a, z fabric.Endpoint)

// Benchmark runs the message-path benchmarks on fresh pairs: one-way
// streams of bursts and a ping-pong, at several sizes. Every benchmark
// reports allocations, which must be zero: the message paths allocate
// nothing, on either side.
func Benchmark(b *testing.B, mk MakeBenchPair) {
	for _, size := range []int{64, 1024, 4096, 65536} {
		b.Run("Stream/"+sizeName(size), func(b *testing.B) { benchStream(b, mk, size, 32, false) })
	}
	for _, size := range []int{64, 65536} {
		b.Run("StreamViews/"+sizeName(size), func(b *testing.B) { benchStream(b, mk, size, 32, true) })
	}
	for _, size := range []int{64, 4096} {
		b.Run("PingPong/"+sizeName(size), func(b *testing.B) { PingPong(b, mk, size) })
	}
	b.Run("PollEmpty", func(b *testing.B) {
		a, _ := mk(b)
		reg, _ := a.Alloc(64, fabric.AccessLocalWrite)
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
		out := make([]fabric.Completion, 16)
		b.ReportAllocs()
		for b.Loop() {
			a.Recv(msgs)
			a.CQ().Poll(out)
		}
	})
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return itoa(n>>20) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// benchStream streams size-byte messages in bursts from a to z. With
// views the receiver takes them as views (fabric.ViewReceiver) and
// releases each burst after reading the first and last byte of every
// message; otherwise it copies them out with RecvWait.
func benchStream(b *testing.B, mk MakeBenchPair, size, burst int, views bool) {
	a, z := mk(b)
	vr, ok := z.(fabric.ViewReceiver)
	if views && !ok {
		b.Skip("no fabric.ViewReceiver")
	}
	size = min(size, a.Caps().MaxMsgSize)
	src, err := a.Alloc(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	smsgs := make([]fabric.Message, burst)
	sge := []fabric.SGE{{Region: src, Length: size}}
	for i := range smsgs {
		smsgs[i] = fabric.Message{SGEs: sge}
	}
	ctx := context.Background()
	var recv func() (int, error)
	if views {
		vs := make([]fabric.View, burst)
		recv = func() (int, error) {
			n, err := vr.RecvViewsWait(ctx, vs)
			for i := 0; i < n; i++ {
				if d := vs[i].Data; len(d) > 0 {
					benchSink += d[0] + d[len(d)-1]
				}
			}
			if err == nil {
				err = vr.ReleaseViews(n)
			}
			return n, err
		}
	} else {
		dst, err := z.Alloc(size*burst, fabric.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		rmsgs := make([]fabric.Message, burst)
		rsges := make([]fabric.SGE, burst)
		for i := range rmsgs {
			rsges[i] = fabric.SGE{Region: dst, Offset: i * size, Length: size}
			rmsgs[i] = fabric.Message{SGEs: rsges[i : i+1]}
		}
		recv = func() (int, error) { return z.RecvWait(ctx, rmsgs) }
	}
	done := make(chan error, 1)
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	total := b.N
	go func() {
		for got := 0; got < total; {
			n, err := recv()
			if err != nil {
				done <- err
				return
			}
			got += n
		}
		done <- nil
	}()
	for sent := 0; sent < total; {
		k := min(burst, total-sent)
		n, err := a.SendWait(ctx, smsgs[:k])
		if err != nil {
			b.Fatal(err)
		}
		sent += n
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(total)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
}

// benchSink keeps the bytes the views benchmark reads alive.
var benchSink byte

// PingPong measures round trips of size-byte messages (at most the
// endpoint's largest) on a fresh pair from mk: one goroutine sends on a
// and waits for the answer, another receives each message on z and
// sends it back, both with SendWait and RecvWait. An operation is one
// round trip; allocations are reported, on both sides.
func PingPong(b *testing.B, mk MakeBenchPair, size int) {
	a, z := mk(b)
	size = min(size, a.Caps().MaxMsgSize)
	abuf, _ := a.Alloc(size, fabric.AccessLocalWrite)
	zbuf, _ := z.Alloc(size, fabric.AccessLocalWrite)
	am := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(abuf)}}}
	zm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(zbuf)}}}
	ctx := context.Background()
	total := b.N
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for i := 0; i < total; i++ {
			if _, err := z.RecvWait(ctx, zm); err != nil {
				done <- err
				return
			}
			zm[0].SGEs[0].Length = zm[0].Len
			if _, err := z.SendWait(ctx, zm); err != nil {
				done <- err
				return
			}
			zm[0].SGEs[0].Length = size
		}
		done <- nil
	}()
	for i := 0; i < total; i++ {
		if _, err := a.SendWait(ctx, am); err != nil {
			b.Fatal(err)
		}
		if _, err := a.RecvWait(ctx, am); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
