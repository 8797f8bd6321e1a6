package rdm_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/fabric/rdm"
)

// star opens a receiver and senders rdm endpoints that each reach it over
// an emulated bridge of their own, connected; all take the options o.
func star(tb testing.TB, senders int, o fabric.Options) (*rdm.Endpoint, []*rdm.Endpoint, []rdm.Peer) {
	tb.Helper()
	dir := tb.TempDir()
	rcfg := &rdm.Config{Name: "rx", Options: o}
	for i := range senders {
		rcfg.Listen = append(rcfg.Listen, filepath.Join(dir, "b"+strconv.Itoa(i)))
	}
	rx, err := rdm.Open(context.Background(), "ntb", "", rcfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rx.Close() })
	var txs []*rdm.Endpoint
	var peers []rdm.Peer
	for i := range senders {
		cfg := &rdm.Config{Name: "tx" + strconv.Itoa(i), Options: o, Resolve: func(string) (string, error) {
			return filepath.Join(dir, "b"+strconv.Itoa(i)+"?listener=1"), nil
		}}
		tx, err := rdm.Open(context.Background(), "ntb", "", cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tx.Close() })
		p, _ := tx.Insert("rx")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := tx.Connect(ctx, p); err != nil {
			tb.Fatal(err)
		}
		cancel()
		txs, peers = append(txs, tx), append(peers, p)
	}
	return rx, txs, peers
}

// TestZeroAllocs: Send and Recv of the multi-peer endpoint allocate
// nothing per message, one at a time or in bursts.
func TestZeroAllocs(t *testing.T) {
	rx, txs, peers := star(t, 2, fabric.Options{})
	sreg, _ := txs[0].Alloc(64)
	rreg, _ := rx.Alloc(64 * 8)
	for _, burst := range []int{1, 8} {
		smsgs := make([]fabric.Message, burst)
		rmsgs := make([]fabric.Message, burst)
		from := make([]rdm.Peer, burst)
		ssges := make([]fabric.SGE, burst)
		rsges := make([]fabric.SGE, burst)
		ctx := context.Background()
		allocs := testing.AllocsPerRun(200, func() {
			for i := range smsgs {
				ssges[i] = fabric.SGE{Region: sreg, Length: 64}
				smsgs[i] = fabric.Message{SGEs: ssges[i : i+1]}
			}
			for sent := 0; sent < burst; {
				n, err := txs[0].SendWait(ctx, peers[0], smsgs[sent:])
				if err != nil {
					t.Fatal(err)
				}
				sent += n
			}
			for got := 0; got < burst; {
				for i := range rmsgs {
					rsges[i] = fabric.SGE{Region: rreg, Offset: 64 * i, Length: 64}
					rmsgs[i] = fabric.Message{SGEs: rsges[i : i+1]}
				}
				n, err := rx.RecvWait(ctx, rmsgs[:burst-got], from)
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		})
		if allocs != 0 {
			t.Errorf("burst of %d: %v allocations per send and receive", burst, allocs)
		}
	}
}

// BenchmarkRecv measures the message rate of one multi-peer endpoint
// receiving 64-byte messages from 1 and 4 senders, beside one
// point-to-point ntb endpoint in the same run.
func BenchmarkRecv(b *testing.B) {
	b.Run("p2p", func(b *testing.B) {
		a, z := fabrictest.ListenPair(b, "ntb", filepath.Join(b.TempDir(), "p2p"), nil)
		defer a.Close()
		defer z.Close()
		sreg, _ := z.Alloc(64, 0)
		rreg, _ := a.Alloc(64*32, fabric.AccessLocalWrite)
		stop := atomic.Bool{}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]fabric.Message, 16)
			sges := make([]fabric.SGE, 16)
			for !stop.Load() {
				for i := range msgs {
					sges[i] = fabric.SGE{Region: sreg, Length: 64}
					msgs[i] = fabric.Message{SGEs: sges[i : i+1]}
				}
				z.Send(msgs)
			}
		}()
		msgs := make([]fabric.Message, 32)
		sges := make([]fabric.SGE, 32)
		b.ReportAllocs()
		b.ResetTimer()
		for got := 0; got < b.N; {
			for i := range msgs {
				sges[i] = fabric.SGE{Region: rreg, Offset: 64 * i, Length: 64}
				msgs[i] = fabric.Message{SGEs: sges[i : i+1]}
			}
			n, _ := a.RecvWait(context.Background(), msgs)
			got += n
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
		stop.Store(true)
		wg.Wait()
	})
	for _, senders := range []int{1, 4} {
		b.Run(fmt.Sprintf("rdm-%dsenders", senders), func(b *testing.B) {
			rx, txs, peers := star(b, senders, fabric.Options{})
			stop := atomic.Bool{}
			var wg sync.WaitGroup
			for i, tx := range txs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sreg, _ := tx.Alloc(64)
					msgs := make([]fabric.Message, 16)
					sges := make([]fabric.SGE, 16)
					for !stop.Load() {
						for i := range msgs {
							sges[i] = fabric.SGE{Region: sreg, Length: 64}
							msgs[i] = fabric.Message{SGEs: sges[i : i+1]}
						}
						tx.Send(peers[i], msgs)
					}
				}()
			}
			rreg, _ := rx.Alloc(64 * 32)
			msgs := make([]fabric.Message, 32)
			sges := make([]fabric.SGE, 32)
			from := make([]rdm.Peer, 32)
			b.ReportAllocs()
			b.ResetTimer()
			for got := 0; got < b.N; {
				for i := range msgs {
					sges[i] = fabric.SGE{Region: rreg, Offset: 64 * i, Length: 64}
					msgs[i] = fabric.Message{SGEs: sges[i : i+1]}
				}
				n, _ := rx.RecvWait(context.Background(), msgs, from)
				got += n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
			stop.Store(true)
			wg.Wait()
		})
	}
}

// BenchmarkPeerMemory measures the heap that connections add to a
// multi-peer endpoint over the user-space RoCE engine: one endpoint
// listening, N dialling it. Both ends of a connection are in this process
// and alike (a queue pair each, its rings and completion queue, the
// peer's entry), so B/peer, the growth per connection over the N dialers
// already open, is about twice what each end holds; B/end is half of it.
// The goal is 64 KiB a peer past the shared pool. Run it alone:
// the engine's host-wide QPN blocks need root, as the tests do.
func BenchmarkPeerMemory(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var perPeer float64
			for b.Loop() {
				perPeer = peerMemory(b, n)
			}
			b.ReportMetric(perPeer, "B/peer")
			b.ReportMetric(perPeer/2, "B/end")
		})
	}
}

func peerMemory(b *testing.B, n int) float64 {
	hub, err := rdm.Open(context.Background(), "roce", "127.0.0.1:0?keepalive=0", &rdm.Config{Options: fabric.Options{Backlog: 512}})
	if err != nil {
		b.Fatal(err)
	}
	defer hub.Close()
	dialers := make([]*rdm.Endpoint, n)
	peers := make([]rdm.Peer, n)
	for i := range dialers {
		cfg := &rdm.Config{Name: "d" + strconv.Itoa(i), Resolve: func(name string) (string, error) { return name + "?keepalive=0", nil }}
		if dialers[i], err = rdm.Open(context.Background(), "roce", "", cfg); err != nil {
			b.Fatal(err)
		}
		defer dialers[i].Close()
		if peers[i], err = dialers[i].Insert(hub.Name()); err != nil {
			b.Fatal(err)
		}
	}
	before := heapInUse()
	ctx, cancel := context.WithTimeout(context.Background(), fabrictest.Timeout)
	defer cancel()
	for i, d := range dialers {
		if err := d.Connect(ctx, peers[i]); err != nil {
			b.Fatalf("dialer %d: %v", i, err)
		}
	}
	for hub.Stats().Peers < n {
		if ctx.Err() != nil {
			b.Fatalf("hub has %d peers of %d", hub.Stats().Peers, n)
		}
		time.Sleep(time.Millisecond)
	}
	return float64(heapInUse()-before) / float64(n)
}

func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
