//go:build linux && cgo && rdma

package verbs

import (
	"fmt"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// BenchmarkCgoCall is the bare cost of one cgo call (no device needed).
func BenchmarkCgoCall(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		cgoNop()
	}
}

// BenchmarkPost posts 8-byte inline RDMA WRITEs to the peer in post lists
// of 1, 4, 16 and 64 work requests: one ibv_post_send (one doorbell) per
// list, one signaled completion per 64 requests. The ratio between list=1
// and the longer lists is what post lists save per operation.
func BenchmarkPost(b *testing.B) {
	for _, list := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("list=%d", list), func(b *testing.B) {
			a, z := loopPair(b, "depth=1024&signal=64")
			defer a.Close()
			defer z.Close()
			src, err := a.Alloc(8*list, 0)
			if err != nil {
				b.Fatal(err)
			}
			dst, err := z.Alloc(8*list, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			if err != nil {
				b.Fatal(err)
			}
			msgs := make([]fabric.Message, list)
			for i := range msgs {
				msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: 8 * i, Length: 8}},
					Remote: dst.Remote().Slice(uint64(8*i), 8)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			posted := 0
			for posted < b.N {
				n, err := a.Write(msgs[:min(list, b.N-posted)])
				if err != nil {
					b.Fatal(err)
				}
				posted += n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mposts/s")
			st := a.Stats()
			b.ReportMetric(float64(st.TxMessages)/float64(max(st.Doorbells, 1)), "WRs/doorbell")
		})
	}
}

// BenchmarkBindingPost measures the binding's own cost per work request,
// with no device: validating the SGEs, filling the C descriptors and one
// cgo call that links the chain (everything ibv_post_send is handed),
// for sends gathered from the caller's region (zero-copy) and copied
// into bounce slots, in lists of 1 and 32.
func BenchmarkBindingPost(b *testing.B) {
	for _, mode := range []string{"zerocopy", "bounce"} {
		for _, list := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/list=%d", mode, list), func(b *testing.B) {
				// bounce: 64-byte messages, copied into bounce slots;
				// zerocopy: 1 KiB messages, above InlineSize (512), whose
				// SGEs point straight into the caller's region.
				inline, size := 4096, 64
				if mode == "zerocopy" {
					inline, size = 512, 1024
				}
				ep := newDryEndpoint(256, 16, inline)
				defer ep.freeDry()
				reg := ep.dryRegion(make([]byte, size*list))
				msgs := make([]fabric.Message, list)
				for i := range msgs {
					msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: reg, Offset: size * i, Length: size}}}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for posted := 0; posted < b.N; {
					n, err := ep.post(msgs[:min(list, b.N-posted)], fabric.OpSend, 0, 0)
					if err != nil {
						b.Fatal(err)
					}
					posted += n
					ep.dryComplete()
				}
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mposts/s")
			})
		}
	}
}
