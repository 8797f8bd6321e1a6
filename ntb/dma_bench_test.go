package ntb

import (
	"context"
	"runtime"
	"testing"

	"github.com/weft-io/weft/fabric"
)

var dmaSizes = []struct {
	name string
	n    int
}{{"4K", 4 << 10}, {"64K", 64 << 10}, {"256K", 256 << 10}, {"1M", 1 << 20}, {"4M", 4 << 20}}

// BenchmarkDMACopy compares a CPU copy into the peer's window with the
// emulated engine doing it (1 and 2 channels, the copy split in 64 KiB or
// larger chunks as the transport does), per size: the crossover, if any,
// is where DMAThreshold belongs.
func BenchmarkDMACopy(b *testing.B) {
	for _, s := range dmaSizes {
		for _, mode := range []struct {
			name  string
			chans int
		}{{"cpu", 0}, {"dma1", 1}, {"dma2", 2}} {
			b.Run(s.name+"/"+mode.name, func(b *testing.B) {
				path := b.TempDir() + "/dev"
				x, err := OpenShm(path, ShmConfig{MemSize: 8 << 20})
				if err != nil {
					b.Fatal(err)
				}
				defer x.Close()
				y, err := OpenShm(path, ShmConfig{})
				if err != nil {
					b.Fatal(err)
				}
				defer y.Close()
				y.MWSetTrans(0, 0, 8<<20)
				win, err := x.PeerMW(0)
				if err != nil {
					b.Fatal(err)
				}
				src := make([]byte, s.n)
				var st dmaState
				if mode.chans > 0 {
					x.ConfigureDMA(EmuDMAConfig{Channels: mode.chans})
					st.init(x, 1, 0)
				}
				sges := []fabric.SGE{{Region: fabric.NewRegion(fabric.RegionConfig{Buf: src}), Length: s.n}}
				b.SetBytes(int64(s.n))
				b.ReportAllocs()
				for b.Loop() {
					if mode.chans == 0 {
						copy(win[:s.n], src)
					} else if !st.copy(true, sges, 0, s.n) {
						b.Fatal("engine refused the copy")
					}
				}
			})
		}
	}
}

// BenchmarkRMAWriteDMA is an RMA write through the transport with the
// engine off and on (2 channels), per size.
func BenchmarkRMAWriteDMA(b *testing.B) {
	for _, s := range dmaSizes[1:] {
		for _, th := range []struct {
			name string
			v    int
		}{{"cpu", -1}, {"dma", 1}} {
			b.Run(s.name+"/"+th.name, func(b *testing.B) {
				x, y := pair(b, ShmConfig{MemSize: 16 << 20}, Config{DMAThreshold: th.v})
				src, _ := x.Alloc(s.n, 0)
				dst, _ := y.Alloc(s.n, fabric.AccessRemoteWrite)
				w := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Remote: dst.Remote(), Flags: fabric.FlagSignal}}
				out := make([]fabric.Completion, 4)
				ctx := context.Background()
				b.SetBytes(int64(s.n))
				b.ReportAllocs()
				for b.Loop() {
					if n, err := x.Write(w); n != 1 || err != nil {
						b.Fatal(n, err)
					}
					x.CQ().Wait(ctx, out)
				}
			})
		}
	}
}

// BenchmarkRingSize streams 16 KiB messages through receive rings
// (windows) of growing size: how much the window bounds throughput.
func BenchmarkRingSize(b *testing.B) {
	for _, r := range []struct {
		name string
		n    int
	}{{"64K", 64 << 10}, {"256K", 256 << 10}, {"1M", 1 << 20}, {"4M", 4 << 20}} {
		b.Run(r.name, func(b *testing.B) {
			const size = 16 << 10
			x, y := pair(b, ShmConfig{MemSize: 16 << 20}, Config{RingSize: r.n, MaxMsgSize: size})
			src, _ := x.Alloc(size, 0)
			dst, _ := y.Alloc(size*16, fabric.AccessLocalWrite)
			sm := make([]fabric.Message, 16)
			rm := make([]fabric.Message, 16)
			for i := range sm {
				sm[i] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(src)}}
				rm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: size * i, Length: size}}}
			}
			ctx := context.Background()
			done := make(chan int)
			b.SetBytes(size)
			b.ReportAllocs()
			go func() {
				got := 0
				for got < b.N {
					k, err := y.RecvWait(ctx, rm[:min(16, b.N-got)])
					if err != nil {
						break
					}
					got += k
				}
				done <- got
			}()
			for sent := 0; sent < b.N; {
				n, err := x.SendWait(ctx, sm[:min(16, b.N-sent)])
				if err != nil {
					b.Fatal(err)
				}
				sent += n
			}
			<-done
		})
	}
}

// BenchmarkBridges is one process driving 1 or 4 bridges, each its own
// device and transport: a sender goroutine round-robins bursts of 32
// 64-byte messages over them and a receiver goroutine drains them, as a
// host with a four-port switch would forward. Mmsg/s is the total.
func BenchmarkBridges(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(map[int]string{1: "1", 4: "4"}[n], func(b *testing.B) {
			xs, ys := make([]*Endpoint, n), make([]*Endpoint, n)
			for i := range xs {
				xs[i], ys[i] = pair(b, ShmConfig{MemSize: 4 << 20}, Config{RingSize: 256 << 10})
			}
			sm := make([][]fabric.Message, n)
			rm := make([][]fabric.Message, n)
			for i := range xs {
				src, _ := xs[i].Alloc(64, 0)
				dst, _ := ys[i].Alloc(64*32, fabric.AccessLocalWrite)
				sm[i], rm[i] = make([]fabric.Message, 32), make([]fabric.Message, 32)
				for j := range sm[i] {
					sm[i][j] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(src)}}
					rm[i][j] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: 64 * j, Length: 64}}}
				}
			}
			total := b.N * 32
			done := make(chan struct{})
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				defer close(done)
				got := 0
				for got < total {
					sweep := 0
					for i := range ys {
						k, err := ys[i].Recv(rm[i])
						if err != nil {
							return
						}
						sweep += k
					}
					if sweep == 0 {
						runtime.Gosched() // nothing on any bridge
					}
					got += sweep
				}
			}()
			sent := 0
			for sent < total {
				sweep := 0
				for i := range xs {
					k, err := xs[i].Send(sm[i][:min(32, total-sent)])
					if err != nil {
						b.Fatal(err)
					}
					sweep += k
					if sent+sweep >= total {
						break
					}
				}
				if sweep == 0 {
					runtime.Gosched() // every bridge full
				}
				sent += sweep
			}
			<-done
			b.ReportMetric(float64(total)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
		})
	}
}
