package batch_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/ntb"
)

var benchSizes = []int{64, 256, 1500}

// BenchmarkLoop moves packets through a pair on one goroutine (send a
// burst of 32, then receive what arrived): the software cost per packet
// without cross-core traffic. One op is one packet; allocs/op must be 0.
// "unbatched" sends one message per packet with one Send each, "burst"
// one message per packet with one Send per 32, "batched" goes through a
// Coalescer (AddBurst of 32, Reclaim) and a Splitter (Recv, Release).
func BenchmarkLoop(b *testing.B) {
	const burst = 32
	for _, size := range benchSizes {
		for _, mode := range []string{"unbatched", "burst", "batched"} {
			b.Run(mode+"/"+strconv.Itoa(size)+"B", func(b *testing.B) {
				x, y := pair(b, ntb.Config{})
				src, _ := x.Alloc(burst*size, 0)
				var c *batch.Coalescer
				var s *batch.Splitter
				sges := make([]fabric.SGE, burst)
				sm := make([]fabric.Message, burst)
				for i := range sges {
					sges[i] = fabric.SGE{Region: src, Offset: i * size, Length: size}
					sm[i].SGEs = sges[i : i+1]
				}
				dst, _ := y.Alloc(burst*size, fabric.AccessLocalWrite)
				rm := make([]fabric.Message, burst)
				for i := range rm {
					rm[i].SGEs = []fabric.SGE{{Region: dst, Offset: i * size, Length: size}}
				}
				cookies := make([]uint64, 4*burst)
				pkts := make([]batch.Packet, 64)
				if mode == "batched" {
					c = newCoalescer(b, x, &batch.Options{Deadline: -1})
					s = newSplitter(b, y, nil)
				}
				recv := func() int {
					if s != nil {
						n, _ := s.Recv(pkts)
						s.Release(pkts[:n])
						return n
					}
					n, _ := y.Recv(rm)
					return n
				}
				b.ReportAllocs()
				b.SetBytes(int64(size))
				sent, got := 0, 0
				for b.Loop() {
					if sent%burst == 0 {
						switch mode {
						case "unbatched":
							for i := range sm {
								if _, err := x.Send(sm[i : i+1]); err != nil {
									b.Fatal(err)
								}
							}
						case "burst":
							if _, err := x.Send(sm); err != nil {
								b.Fatal(err)
							}
						case "batched":
							if _, err := c.AddBurst(sges, cookies); err != nil {
								b.Fatal(err)
							}
							c.Reclaim(cookies)
						}
						for {
							n := recv()
							if n == 0 {
								break
							}
							got += n
						}
					}
					sent++
				}
				if c != nil {
					c.Flush()
				}
				for got < sent-sent%burst {
					got += recv()
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mpkt/s")
				if c != nil {
					st := c.Stats()
					b.ReportMetric(st.PacketsPerBatch(), "pkt/batch")
				}
			})
		}
	}
}

// BenchmarkStream streams packets from one goroutine to another, as two
// router cores would: one op is one packet. The sender calls Poll after
// every packet, so the deadline is kept.
func BenchmarkStream(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("batched/"+strconv.Itoa(size)+"B", func(b *testing.B) {
			x, y := pair(b, ntb.Config{})
			c := newCoalescer(b, x, nil)
			s := newSplitter(b, y, nil)
			src, _ := x.Alloc(size, 0)
			sge := fabric.SGEOf(src)
			cookies := make([]uint64, 256)
			pkts := make([]batch.Packet, 64)
			ctx := context.Background()
			total := b.N
			done := make(chan error, 1)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			b.ResetTimer()
			go func() {
				for got := 0; got < total; {
					n, err := s.RecvWait(ctx, pkts)
					if err != nil {
						done <- err
						return
					}
					s.Release(pkts[:n])
					got += n
				}
				done <- nil
			}()
			for i := 0; i < total; {
				err := c.Add(sge, uint64(i))
				if err == nil {
					i++
				} else if !errors.Is(err, batch.ErrFull) {
					b.Fatal(err)
				}
				c.Reclaim(cookies)
				c.Poll()
			}
			if err := c.FlushWait(ctx); err != nil {
				b.Fatal(err)
			}
			if err := testenv.Recv(b, done, "the receiver of the packets"); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(total)/b.Elapsed().Seconds()/1e6, "Mpkt/s")
			st := c.Stats()
			b.ReportMetric(st.PacketsPerBatch(), "pkt/batch")
		})
	}
}

// BenchmarkIdle is the cost of the router's loop calls when no packet
// flows: Poll, Reclaim, Recv. 0 allocs.
func BenchmarkIdle(b *testing.B) {
	x, y := pair(b, ntb.Config{})
	c := newCoalescer(b, x, nil)
	s := newSplitter(b, y, nil)
	cookies := make([]uint64, 64)
	pkts := make([]batch.Packet, 64)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		c.Tick(now)
		c.Reclaim(cookies)
		s.Recv(pkts)
	}
}
