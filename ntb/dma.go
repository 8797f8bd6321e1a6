package ntb

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
)

// ntb.h has no DMA: Linux clients of an NTB (ntb_transport) take a channel
// from the dmaengine framework, submit memcpy descriptors between local
// memory and the peer's window and are called back on completion. The
// device model here gives a Device one optional engine, in that spirit.

// DMAOp is the direction of a DMA descriptor.
type DMAOp uint8

const (
	// DMAWrite copies Local into the peer's window (a DMA_MEM_TO_DEV
	// memcpy through the outbound window).
	DMAWrite DMAOp = iota
	// DMARead copies from the peer's window into Local.
	DMARead
)

// DMADesc is one copy between local memory and an outbound (peer) memory
// window.
type DMADesc struct {
	Op DMAOp
	// Local is the local side of the copy: the source of a write, the
	// destination of a read. It must stay untouched until the descriptor
	// completes.
	Local []byte
	// Window is the outbound window (PeerMW index) and Offset the byte
	// offset in it.
	Window int
	Offset uint64
	// Cookie is returned with the completion.
	Cookie uint64
}

// DMACompletion reports one finished descriptor.
type DMACompletion struct {
	Cookie uint64
	Len    int
	// Status is StatusOK, or StatusPeerGone when the window went away
	// before the copy ran (nothing was copied).
	Status fabric.Status
}

// DMAEngine is a device's copy engine: descriptors go in, completions come
// out in bursts, in no particular order across channels and in submission
// order within one. The methods are safe for concurrent use, but
// completions go to whoever polls them: callers that share an engine
// serialise their use of it.
type DMAEngine interface {
	// Submit queues descriptors and returns how many it took: fewer than
	// len(descs) when the engine's queue is full (backpressure, not an
	// error). A descriptor outside its window, of an unknown window or
	// op, or a window without translation is refused before anything is
	// copied, with an error matching fabric.ErrBounds or fabric.ErrInvalid;
	// those before it are queued and counted.
	Submit(descs []DMADesc) (int, error)
	// Poll returns finished descriptors without blocking.
	Poll(out []DMACompletion) int
	// Wait blocks until at least one descriptor finished or ctx is done.
	Wait(ctx context.Context, out []DMACompletion) (int, error)
	// Channels is the number of copies the engine runs at once.
	Channels() int
	// Depth is how many descriptors may be in flight.
	Depth() int
}

// DMADevice is a Device with a DMA engine.
type DMADevice interface {
	Device
	// DMA returns the device's engine; ErrNotSupported if it has none.
	DMA() (DMAEngine, error)
}

// EmuDMAConfig configures the emulated engine. The zero value is the
// default.
type EmuDMAConfig struct {
	// Channels is the number of engine workers (0: 1), each a goroutine
	// doing the copies of the descriptors given to it, in order.
	Channels int
	// Depth is the number of descriptors in flight (0: 256).
	Depth int
}

// emuDMA is the engine of the emulated devices: a worker goroutine per
// channel that copies with the CPU it runs on, as an engine on the bridge
// would copy with its own.
type emuDMA struct {
	dev      Device
	chans    []chan dmaJob
	done     chan DMACompletion
	inflight atomic.Int32
	depth    int32
	next     atomic.Uint32
	stop     chan struct{}
	wg       sync.WaitGroup
}

type dmaJob struct {
	dst, src []byte
	cookie   uint64
}

func newEmuDMA(dev Device, c EmuDMAConfig) *emuDMA {
	if c.Channels <= 0 {
		c.Channels = 1
	}
	if c.Depth <= 0 {
		c.Depth = 256
	}
	e := &emuDMA{dev: dev, done: make(chan DMACompletion, c.Depth), depth: int32(c.Depth), stop: make(chan struct{})}
	for i := 0; i < c.Channels; i++ {
		ch := make(chan dmaJob, c.Depth)
		e.chans = append(e.chans, ch)
		e.wg.Add(1)
		go e.worker(ch)
	}
	return e
}

func (e *emuDMA) worker(ch chan dmaJob) {
	defer e.wg.Done()
	for {
		select {
		case <-e.stop:
			return
		case j := <-ch:
			n := copy(j.dst, j.src)
			e.done <- DMACompletion{Cookie: j.cookie, Len: n}
		}
	}
}

// Channels implements DMAEngine.
func (e *emuDMA) Channels() int { return len(e.chans) }

// Depth implements DMAEngine.
func (e *emuDMA) Depth() int { return int(e.depth) }

// Submit implements DMAEngine.
func (e *emuDMA) Submit(descs []DMADesc) (int, error) {
	select {
	case <-e.stop:
		return 0, fmt.Errorf("ntb: dma: %w", os.ErrClosed)
	default:
	}
	for i := range descs {
		d := &descs[i]
		if d.Op != DMAWrite && d.Op != DMARead {
			return i, fmt.Errorf("ntb: dma descriptor %d: op %d: %w", i, d.Op, fabric.ErrInvalid)
		}
		w, err := e.dev.PeerMW(d.Window)
		if err != nil {
			return i, fmt.Errorf("ntb: dma descriptor %d: %w: %w", i, fabric.ErrInvalid, err)
		}
		if d.Offset > uint64(len(w)) || uint64(len(d.Local)) > uint64(len(w))-d.Offset {
			return i, fmt.Errorf("ntb: dma descriptor %d: %d bytes at %#x of a %d-byte window: %w",
				i, len(d.Local), d.Offset, len(w), fabric.ErrBounds)
		}
		if e.inflight.Add(1) > e.depth {
			e.inflight.Add(-1)
			return i, nil
		}
		j := dmaJob{dst: w[d.Offset : d.Offset+uint64(len(d.Local))], src: d.Local, cookie: d.Cookie}
		if d.Op == DMARead {
			j.dst, j.src = d.Local, j.dst
		}
		e.chans[int(e.next.Add(1))%len(e.chans)] <- j // never blocks: inflight <= depth
	}
	return len(descs), nil
}

// Poll implements DMAEngine.
func (e *emuDMA) Poll(out []DMACompletion) int {
	n := 0
	for n < len(out) {
		select {
		case c := <-e.done:
			out[n] = c
			n++
		default:
			e.inflight.Add(int32(-n))
			return n
		}
	}
	e.inflight.Add(int32(-n))
	return n
}

// Wait implements DMAEngine.
func (e *emuDMA) Wait(ctx context.Context, out []DMACompletion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	if n := e.Poll(out); n > 0 {
		return n, nil
	}
	select {
	case c := <-e.done:
		out[0] = c
		e.inflight.Add(-1)
		return 1 + e.Poll(out[1:]), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-e.stop:
		return 0, fmt.Errorf("ntb: dma: %w", os.ErrClosed)
	}
}

func (e *emuDMA) close() {
	close(e.stop)
	e.wg.Wait()
}
