package ntb

import (
	"context"
	"sync"

	"github.com/weft-io/weft/fabric"
)

// DefaultDMAThreshold is the copy size from which a transport hands
// copies to its device's DMA engine, when the device has one and
// Config.DMAThreshold is 0. It is off (-1) by default: on the emulated
// engine, whose channels are goroutines copying with the same CPUs, the
// measured crossover never came (BenchmarkDMACopy, BenchmarkRMAWriteDMA:
// the hand-off costs ~1.5 µs and a channel copies no faster than the
// caller). A hardware engine moves the crossover; set the threshold there.
const DefaultDMAThreshold = -1

// dmaState is a transport's use of its device's engine. Copies are
// serialised (one transport's queues share the engine, and completions
// go to whoever polls), chunked to keep every channel busy, and waited
// for before the call returns, so a later ring record never overtakes
// the data.
type dmaState struct {
	mu        sync.Mutex
	eng       DMAEngine
	threshold int
	descs     [256]DMADesc
	comps     [256]DMACompletion
}

func (s *dmaState) init(dev Device, threshold, channels int) {
	if threshold == 0 {
		threshold = DefaultDMAThreshold
	}
	if threshold < 0 {
		return
	}
	d, ok := dev.(DMADevice)
	if !ok {
		return
	}
	if sd, ok := dev.(*ShmDevice); ok && channels > 0 {
		sd.ConfigureDMA(EmuDMAConfig{Channels: channels}) // fails harmlessly once the engine runs
	}
	eng, err := d.DMA()
	if err != nil {
		return
	}
	s.eng, s.threshold = eng, threshold
}

// use reports whether a copy of size bytes goes through the engine.
func (s *dmaState) use(size int) bool { return s.eng != nil && size >= s.threshold }

// copy moves size bytes between sges and the peer's window 0 at off:
// into the window for a write, out of it for a read. It reports false if
// the engine refused or failed; the caller then copies with the CPU
// (which is idempotent for what the engine may have copied already).
func (s *dmaState) copy(write bool, sges []fabric.SGE, off uint64, size int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	op := DMARead
	if write {
		op = DMAWrite
	}
	chunk := max(64<<10, (size/s.eng.Channels()+4095)&^4095)
	n := 0
	for i := range sges {
		b := sges[i].Bytes()
		for len(b) > 0 {
			c := min(len(b), chunk)
			if n == len(s.descs) {
				if !s.run(n) {
					return false
				}
				n = 0
			}
			s.descs[n] = DMADesc{Op: op, Local: b[:c], Window: 0, Offset: off}
			off += uint64(c)
			b = b[c:]
			n++
		}
	}
	return s.run(n)
}

// run submits descs[:n] and waits for every descriptor it queued.
func (s *dmaState) run(n int) bool {
	sub, got, ok := 0, 0, true
	for got < sub || (ok && sub < n) {
		if ok && sub < n {
			k, err := s.eng.Submit(s.descs[sub:n])
			sub += k
			if err != nil || (k == 0 && got == sub) {
				ok = false // refused, or full with nothing of ours in flight
			}
		}
		if got < sub {
			k, err := s.eng.Wait(context.Background(), s.comps[:])
			if err != nil {
				return false
			}
			for _, c := range s.comps[:k] {
				if c.Status != fabric.StatusOK {
					ok = false
				}
			}
			got += k
		}
	}
	return ok
}
