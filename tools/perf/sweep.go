package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/stats"
	"github.com/weft-io/weft/tools/measure"
)

// The sweep (perf sweep) measures small-packet forwarding with and
// without the batch package, side by side in one run, for each backend:
//
//   - unbatched: one fabric message per packet, one Send per packet, as a
//     router that forwards packet by packet posts them;
//   - burst: one message per packet, one Send per group of packets (the
//     fabric burst API without coalescing);
//   - batched: packets go through a batch.Coalescer, the receiver splits
//     batches with a batch.Splitter.
//
// For each packet size, mode and run it measures two phases:
//
//   - throughput: the sender offers packets as fast as it can, in groups
//     of -group (as a router's receive burst); the receiver counts packets
//     from the first to the stop message: packets/s and Gb/s of packet
//     bytes. Latency here is mostly queueing in a full ring ("sat").
//   - latency: the sender offers one packet every 1/-lat-rate seconds;
//     each packet carries its CLOCK_MONOTONIC send time, and the receiver
//     records arrival minus send time per packet: the end-to-end latency
//     including the time a packet waits in its batch.
//
// Modes are interleaved within each run, and the median of the runs is
// reported for every figure.

// Control messages of the sweep are raw messages with these immediates.
const (
	immSweepStart  = 0x57b0 // payload: mode, size; the server answers immSweepReady
	immSweepReady  = 0x57b1
	immSweepStop   = 0x57b2 // the server answers immSweepResult with its counts
	immSweepResult = 0x57b3
)

var allModes = []string{"unbatched", "burst", "batched"}

type sweepConfig struct {
	backends, addrs []string
	sizes           []int
	modes           []string
	dur, latDur     time.Duration
	runs            int
	group           int
	latRate         float64
	opts            batch.Options
	asJSON          bool
	plotPath        string
	maxMsg          int
	splitCopy       bool // the splitter copies even where views are offered
	pinned          bool
	cpuProfile      string
	clean           float64
	minClean        int
	maxRuns         int
	plotAll         bool
}

// Point is one measured (backend, mode, size): a single run, or the
// median of the runs figure by figure.
type Point struct {
	Backend string `json:"backend"`
	Mode    string `json:"mode"`
	Size    int    `json:"size"`
	// Throughput phase.
	Packets   uint64  `json:"packets"`
	PktPerSec float64 `json:"pkt_per_s"`
	Gbps      float64 `json:"gbps"`
	SatP50us  float64 `json:"sat_p50_us"`
	SatP99us  float64 `json:"sat_p99_us"`
	// Latency phase, at LatRate packets/s.
	LatRate   float64 `json:"lat_rate_pkt_per_s"`
	LatP50us  float64 `json:"lat_p50_us"`
	LatP90us  float64 `json:"lat_p90_us"`
	LatP99us  float64 `json:"lat_p99_us"`
	LatP999us float64 `json:"lat_p999_us"`
	LatMaxus  float64 `json:"lat_max_us"`
	// LatP99Winus is the median over windows of 4096 packets of each
	// window's p99: robust to a stall of the (shared) machine that hits a
	// few windows, which the pooled p99 is not.
	LatP99Winus float64 `json:"lat_p99_window_us"`
	// Batching (batched mode), throughput phase.
	PktPerBatch float64           `json:"pkt_per_batch,omitempty"`
	Flushes     map[string]uint64 `json:"flushes,omitempty"`
	// Allocations per packet in the measured loops (heap objects / packets).
	TxAllocsPerPkt float64 `json:"tx_allocs_per_pkt"`
	RxAllocsPerPkt float64 `json:"rx_allocs_per_pkt"`
	// Lost or reordered packets seen by the receiver (must be 0).
	Gaps uint64 `json:"gaps"`
	// CPU share (CPU time over wall time) of the sender and the receiver
	// process in the throughput and the latency phase: both spin, so a
	// share well below 1 means the host's other load took the CPU.
	TxCPU    float64 `json:"tx_cpu_share"`
	RxCPU    float64 `json:"rx_cpu_share"`
	LatTxCPU float64 `json:"lat_tx_cpu_share"`
	LatRxCPU float64 `json:"lat_rx_cpu_share"`
	// Runs is the number of runs a median was taken over.
	Runs int `json:"runs,omitempty"`
}

// SweepReport is the -json output of the sweep.
type SweepReport struct {
	GOMAXPROCS int     `json:"gomaxprocs"`
	Pinned     bool    `json:"pinned"`
	Runs       int     `json:"runs"`
	MinClean   int     `json:"min_clean_runs,omitempty"`
	Group      int     `json:"group"`
	Seconds    float64 `json:"seconds_per_phase"`
	DeadlineUs float64 `json:"deadline_us"`
	MaxPackets int     `json:"max_packets"`
	ClockErrUs float64 `json:"clock_offset_error_us"`
	// CleanShare is the CPU share both ends must have kept for a run to
	// count as clean.
	CleanShare float64 `json:"clean_cpu_share"`
	// Points are the medians of the runs.
	Points []Point `json:"points"`
	// CleanPoints are the medians of the clean runs.
	CleanPoints []Point `json:"clean_points"`
	// Summary compares batched with unbatched per backend and size.
	Summary []Compare `json:"summary"`
	// AllRuns are the single runs.
	AllRuns []Point `json:"all_runs"`
}

// Compare is batched against unbatched (and burst) at one size.
type Compare struct {
	Backend string `json:"backend"`
	Size    int    `json:"size"`
	// Speedup is the median over runs of batched over unbatched packet
	// rate, each run's modes being measured back to back.
	Speedup float64 `json:"batched_vs_unbatched"`
	VsBurst float64 `json:"batched_vs_burst,omitempty"`
	// AddedP99us is batched p99 latency minus unbatched p99 latency in the
	// latency phase (the median over runs of that difference within each
	// run); BoundUs is the deadline plus the transmission time of one full
	// batch at the batched rate.
	AddedP99us float64 `json:"added_p99_us"`
	// AddedP90us is the same for the p90, which the host's short stalls
	// (a few percent of the time on a shared machine) leave alone.
	AddedP90us float64 `json:"added_p90_us"`
	// AddedP99Winus is the same for the windowed p99 (Point.LatP99Winus).
	AddedP99Winus float64 `json:"added_p99_window_us"`
	// SpeedupClean and AddedP99Cleanus are the same over the runs in which
	// both modes were clean (CleanRuns, LatCleanRuns of them).
	SpeedupClean    float64 `json:"batched_vs_unbatched_clean"`
	CleanRuns       int     `json:"clean_runs"`
	AddedP99Cleanus float64 `json:"added_p99_clean_us"`
	LatCleanRuns    int     `json:"lat_clean_runs"`
	BoundUs         float64 `json:"bound_us"`
}

func runSweep(cfg sweepConfig) error {
	ctx := context.Background()
	var all []Point
	for i, backend := range cfg.backends {
		addr := ""
		if i < len(cfg.addrs) {
			addr = cfg.addrs[i]
		}
		pts, err := sweepBackend(ctx, cfg, backend, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", backend, err)
		}
		all = append(all, pts...)
	}
	rep := summarize(cfg, all)
	return report(cfg, rep)
}

// report prints rep (or its JSON) and draws its plot.
func report(cfg sweepConfig, rep SweepReport) error {
	if cfg.plotPath != "" {
		if err := writePlot(cfg.plotPath, rep, !cfg.plotAll); err != nil {
			return err
		}
	}
	if cfg.asJSON {
		return writeJSON(rep)
	}
	printSummary(rep)
	if cfg.plotPath != "" {
		fmt.Printf("plot: %s\n", cfg.plotPath)
	}
	return nil
}

// sweepBackend runs the sweep on one backend. An empty addr with the ntb
// or roce backend runs the receiver as a child process (over a fresh
// bridge, or a second engine on loopback).
func sweepBackend(ctx context.Context, cfg sweepConfig, backend, addr string) ([]Point, error) {
	var cmd *exec.Cmd
	if addr == "" {
		if backend != "ntb" && backend != "roce" {
			return nil, errors.New("needs -addr (run the receiver with perf sweep -server on the peer)")
		}
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		serverAddr, clientAddr, cleanup := localPair(backend, "perf-sweep")
		defer cleanup()
		addr = clientAddr
		args := []string{"sweep", "-server", "-backend", backend, "-addr", serverAddr,
			"-maxmsg", strconv.Itoa(cfg.maxMsg), "-pin=" + strconv.FormatBool(cfg.pinned),
			"-split-copy=" + strconv.FormatBool(cfg.splitCopy)}
		if cfg.cpuProfile != "" {
			args = append(args, "-cpuprofile", cfg.cpuProfile+".server")
		}
		cmd = exec.Command(self, args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		defer cmd.Wait()
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ep, err := fabric.Open(octx, backend, addr, &fabric.Options{MaxMsgSize: cfg.maxMsg})
	cancel()
	if err != nil {
		if cmd != nil {
			cmd.Process.Kill()
		}
		return nil, err
	}
	defer ep.Close()
	if !cfg.asJSON {
		caps := ep.Caps()
		fmt.Printf("backend %s at %s: max message %d B, %d SGEs, inline %d B\n", backend, addr, caps.MaxMsgSize, caps.MaxSGEs, caps.InlineSize)
	}
	cl := &client{ep: ep, cfg: cfg}
	if err := cl.init(); err != nil {
		return nil, err
	}
	var pts []Point
	for _, size := range cfg.sizes {
		// -runs runs, then more (up to -max-runs) until -min-clean of
		// them were clean in every mode: whether a run is clean depends
		// only on the CPU shares, never on the figures measured.
		clean := 0
		for run := 0; run < cfg.runs || (clean < cfg.minClean && run < cfg.maxRuns); run++ {
			allClean := true
			for _, mode := range cfg.modes {
				p, err := cl.measure(ctx, mode, size)
				if err != nil {
					return nil, fmt.Errorf("%s %d B: %w", mode, size, err)
				}
				p.Backend = backend
				pts = append(pts, p)
				allClean = allClean && p.clean(cfg.clean, false)
				if !cfg.asJSON {
					fmt.Fprintf(os.Stderr, "  run %d %-9s %5d B: %7.3f Mpkt/s %7.2f Gb/s  lat p50 %6.2f p99 %6.2f µs  cpu %.2f/%.2f\n",
						run+1, mode, size, p.PktPerSec/1e6, p.Gbps, p.LatP50us, p.LatP99us, p.TxCPU, p.RxCPU)
				}
			}
			if allClean {
				clean++
			}
		}
	}
	control(ctx, ep, cl.ctl, immQuit, 0)
	return pts, nil
}

type client struct {
	ep   fabric.Endpoint
	cfg  sweepConfig
	ctl  *fabric.Region // control messages out
	in   *fabric.Region // replies in
	rmsg []fabric.Message
}

func (cl *client) init() error {
	var err error
	if cl.ctl, err = cl.ep.Alloc(64, 0); err != nil {
		return err
	}
	if cl.in, err = cl.ep.Alloc(256, fabric.AccessLocalWrite); err != nil {
		return err
	}
	cl.rmsg = []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(cl.in)}}}
	return nil
}

// ask sends a control message and waits for the reply with immediate want.
func (cl *client) ask(ctx context.Context, imm uint32, payload uint64, want uint32) ([]byte, error) {
	if err := control(ctx, cl.ep, cl.ctl, imm, payload); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := cl.ep.RecvWait(ctx, cl.rmsg); err != nil {
			return nil, err
		}
		if m := cl.rmsg[0]; m.Flags&fabric.FlagImm != 0 && m.Imm == want {
			return cl.in.Bytes()[:m.Len], nil
		}
	}
}

// result is what the receiver reports at the end of a phase.
type result struct {
	count, bytes, ns, gaps, mallocs uint64
	p50, p99, p999, max, p99w       float64 // ns
	cpu                             float64 // CPU share of the receiver
	p90                             float64 // ns
}

func (r *result) encode(b []byte) int {
	for i, v := range []uint64{r.count, r.bytes, r.ns, r.gaps, r.mallocs,
		uint64(r.p50), uint64(r.p99), uint64(r.p999), uint64(r.max), uint64(r.p99w), uint64(r.cpu * 1e6), uint64(r.p90)} {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return 96
}

func decodeResult(b []byte) result {
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return result{count: u(0), bytes: u(1), ns: u(2), gaps: u(3), mallocs: u(4),
		p50: float64(u(5)), p99: float64(u(6)), p999: float64(u(7)), max: float64(u(8)), p99w: float64(u(9)),
		cpu: float64(u(10)) / 1e6, p90: float64(u(11))}
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// measure runs both phases of one mode and size.
func (cl *client) measure(ctx context.Context, mode string, size int) (Point, error) {
	p := Point{Mode: mode, Size: size, LatRate: cl.cfg.latRate}
	s, err := newSender(cl.ep, mode, size, cl.cfg)
	if err != nil {
		return p, err
	}
	defer s.close()
	modeByte := uint64(0)
	if mode == "batched" {
		modeByte = 1
	}
	start := func() error {
		_, err := cl.ask(ctx, immSweepStart, modeByte|uint64(size)<<8, immSweepReady)
		return err
	}
	stop := func() (result, error) {
		if err := s.finish(ctx); err != nil {
			return result{}, err
		}
		b, err := cl.ask(ctx, immSweepStop, 0, immSweepResult)
		if err != nil {
			return result{}, err
		}
		return decodeResult(b), nil
	}

	// Throughput.
	if err := start(); err != nil {
		return p, err
	}
	m0 := mallocs()
	sh := measure.StartShare()
	n, err := s.blast(cl.cfg.dur)
	p.TxCPU = sh.End()
	m1 := mallocs()
	if err != nil {
		return p, err
	}
	r, err := stop()
	if err != nil {
		return p, err
	}
	if r.count != n {
		return p, fmt.Errorf("sent %d packets, the receiver got %d", n, r.count)
	}
	secs := float64(r.ns) / 1e9
	p.Packets, p.PktPerSec = r.count, float64(r.count)/secs
	p.Gbps = float64(r.bytes) * 8 / secs / 1e9
	p.SatP50us, p.SatP99us = r.p50/1e3, r.p99/1e3
	p.TxAllocsPerPkt = float64(m1-m0) / float64(max(n, 1))
	p.RxAllocsPerPkt = float64(r.mallocs) / float64(max(r.count, 1))
	p.Gaps = r.gaps
	p.RxCPU = r.cpu
	if s.c != nil {
		st := s.c.Stats()
		p.PktPerBatch = st.PacketsPerBatch()
		p.Flushes = map[string]uint64{}
		for c := batch.FlushCause(0); c < batch.NumFlushCauses; c++ {
			p.Flushes[c.String()] = st.Flushes[c]
		}
	}

	// Latency at a paced rate.
	if err := start(); err != nil {
		return p, err
	}
	sh = measure.StartShare()
	n, err = s.paced(cl.cfg.latDur, cl.cfg.latRate)
	p.LatTxCPU = sh.End()
	if err != nil {
		return p, err
	}
	if r, err = stop(); err != nil {
		return p, err
	}
	if r.count != n {
		return p, fmt.Errorf("paced: sent %d packets, the receiver got %d", n, r.count)
	}
	p.LatP50us, p.LatP99us, p.LatP999us, p.LatMaxus = r.p50/1e3, r.p99/1e3, r.p999/1e3, r.max/1e3
	p.LatP99Winus = r.p99w / 1e3
	p.LatP90us = r.p90 / 1e3
	p.LatRxCPU = r.cpu
	p.Gaps += r.gaps
	return p, nil
}

// sender generates timestamped packets and pushes them in one of the
// modes. Packet buffers come from a pool in registered memory; a buffer
// is reused only when the endpoint (or the coalescer) has handed it back.
type sender struct {
	ep      fabric.Endpoint
	mode    string
	size    int
	reg     *fabric.Region
	free    []uint64
	c       *batch.Coalescer
	sges    []fabric.SGE
	msgs    []fabric.Message
	cookies []uint64
	got     []uint64
	comps   []fabric.Completion
	signal  bool // plain modes: packets above InlineSize complete later
	seq     uint64
	group   int
}

func newSender(ep fabric.Endpoint, mode string, size int, cfg sweepConfig) (*sender, error) {
	s := &sender{ep: ep, mode: mode, size: size, group: cfg.group}
	nbuf := 4 * cfg.group
	if mode == "batched" {
		c, err := batch.NewCoalescer(ep, &cfg.opts)
		if err != nil {
			return nil, err
		}
		s.c = c
		o := cfg.opts
		depth := o.Depth
		if depth == 0 {
			depth = batch.DefaultDepth
		}
		nbuf += depth * c.MaxPackets()
	} else {
		s.signal = size > ep.Caps().InlineSize
		if s.signal {
			nbuf = 1024
		}
	}
	reg, err := ep.Alloc(nbuf*size, 0)
	if err != nil {
		if s.c != nil {
			s.c.Close()
		}
		return nil, err
	}
	s.reg = reg
	for i := nbuf - 1; i >= 0; i-- {
		s.free = append(s.free, uint64(i))
	}
	s.sges = make([]fabric.SGE, cfg.group)
	s.msgs = make([]fabric.Message, cfg.group)
	s.cookies = make([]uint64, cfg.group)
	s.got = make([]uint64, 1024)
	s.comps = make([]fabric.Completion, 256)
	return s, nil
}

func (s *sender) close() {
	if s.c != nil {
		s.c.Close()
	}
	s.reg.Close()
}

// reclaim returns free buffers to the pool.
func (s *sender) reclaim() {
	if s.c != nil {
		n := s.c.Reclaim(s.got)
		s.free = append(s.free, s.got[:n]...)
		return
	}
	if s.signal {
		n := s.ep.CQ().Poll(s.comps)
		for _, c := range s.comps[:n] {
			s.free = append(s.free, c.Context)
		}
	}
}

// fill takes k buffers, stamps them with now and the next sequence numbers
// and prepares sges/msgs/cookies[:k].
func (s *sender) fill(k int, now time.Time) error {
	ts := measure.Mono(now)
	for i := 0; i < k; i++ {
		for len(s.free) == 0 {
			s.reclaim()
			if len(s.free) == 0 && s.c != nil {
				if _, err := s.c.Tick(time.Now()); err != nil {
					return err
				}
			}
		}
		b := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		off := int(b) * s.size
		buf := s.reg.Bytes()[off : off+s.size]
		binary.LittleEndian.PutUint64(buf, uint64(ts))
		binary.LittleEndian.PutUint64(buf[8:], s.seq)
		s.seq++
		s.sges[i] = fabric.SGE{Region: s.reg, Offset: off, Length: s.size}
		s.cookies[i] = b
		m := &s.msgs[i]
		m.SGEs = s.sges[i : i+1]
		m.Context = b
		if s.signal {
			m.Flags = fabric.FlagSignal
		}
	}
	return nil
}

// push hands k prepared packets to the endpoint or the coalescer, retrying
// under backpressure until all are taken.
func (s *sender) push(k int, now time.Time) error {
	switch s.mode {
	case "unbatched":
		for i := 0; i < k; i++ {
			for {
				n, err := s.ep.Send(s.msgs[i : i+1])
				if err != nil {
					return err
				}
				if n == 1 {
					break
				}
				s.reclaim()
			}
		}
	case "burst":
		for sent := 0; sent < k; {
			n, err := s.ep.Send(s.msgs[sent:k])
			if err != nil {
				return err
			}
			sent += n
			if sent < k {
				s.reclaim()
			}
		}
	case "batched":
		for sent := 0; sent < k; {
			n, err := s.c.AddBurst(s.sges[sent:k], s.cookies[sent:k])
			sent += n
			if err != nil && !errors.Is(err, batch.ErrFull) {
				return err
			}
			if sent < k {
				s.reclaim()
				if _, err := s.c.Tick(time.Now()); err != nil {
					return err
				}
			}
		}
		if _, err := s.c.Tick(now); err != nil {
			return err
		}
	}
	if !s.signal {
		// Inline sends (and the coalescer's completed batches) free their
		// buffers at once.
		if s.c == nil {
			for i := 0; i < k; i++ {
				s.free = append(s.free, s.cookies[i])
			}
		} else {
			s.reclaim()
		}
	}
	return nil
}

// blast offers packets in groups as fast as the endpoint takes them for d
// and returns how many it sent.
func (s *sender) blast(d time.Duration) (uint64, error) {
	t0 := time.Now()
	var n uint64
	for i := 0; ; i++ {
		now := time.Now()
		if i&15 == 0 && now.Sub(t0) >= d {
			return n, nil
		}
		if err := s.fill(s.group, now); err != nil {
			return n, err
		}
		if err := s.push(s.group, now); err != nil {
			return n, err
		}
		n += uint64(s.group)
	}
}

// paced offers one packet every 1/rate seconds for d.
func (s *sender) paced(d time.Duration, rate float64) (uint64, error) {
	interval := time.Duration(float64(time.Second) / rate)
	t0 := time.Now()
	next := time.Duration(0)
	var n uint64
	for {
		now := time.Now()
		el := now.Sub(t0)
		if el >= d {
			return n, nil
		}
		if el < next {
			if s.c != nil {
				if _, err := s.c.Tick(now); err != nil {
					return n, err
				}
				s.reclaim()
			}
			continue
		}
		if err := s.fill(1, now); err != nil {
			return n, err
		}
		if err := s.push(1, now); err != nil {
			return n, err
		}
		n++
		next += interval
	}
}

// finish makes sure every packet has been handed to the endpoint.
func (s *sender) finish(ctx context.Context) error {
	if s.c != nil {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := s.c.FlushWait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// serveSweep is the receiving side of the sweep: plain messages in the
// unbatched and burst modes, a batch.Splitter in the batched mode.
func serveSweep(ctx context.Context, ep fabric.Endpoint, splitCopy bool) error {
	split, err := batch.NewSplitter(ep, &batch.SplitterOptions{Copy: splitCopy})
	if err != nil {
		return err
	}
	defer split.Close()
	const burst = 32
	maxMsg := ep.Caps().MaxMsgSize
	buf, err := ep.Alloc(burst*maxMsg, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	msgs := make([]fabric.Message, burst)
	sges := make([]fabric.SGE, burst)
	for i := range msgs {
		sges[i] = fabric.SGE{Region: buf, Offset: i * maxMsg, Length: maxMsg}
		msgs[i].SGEs = sges[i : i+1]
	}
	pkts := make([]batch.Packet, 64)
	out, err := ep.Alloc(256, 0)
	if err != nil {
		return err
	}
	reply := func(imm uint32, n int) error {
		m := []fabric.Message{{SGEs: []fabric.SGE{{Region: out, Length: n}}, Flags: fabric.FlagImm, Imm: imm}}
		_, err := ep.SendWait(ctx, m)
		return err
	}

	var h, wh measure.Hist
	const window = 4096
	wp99 := make([]float64, 0, 1<<16)
	var count, bytes, gaps, expect, m0 uint64
	var first int64
	var sh measure.Share
	batched := false
	// control handles a control message; it returns true to quit.
	control := func(imm uint32, payload []byte, now int64) (bool, error) {
		switch imm {
		case immSweepStart:
			v := binary.LittleEndian.Uint64(payload)
			batched = v&0xff == 1
			h.Reset()
			wh.Reset()
			wp99 = wp99[:0]
			count, bytes, gaps, first = 0, 0, 0, 0
			expect = ^uint64(0)
			m0 = mallocs()
			sh = measure.StartShare()
			return false, reply(immSweepReady, 0)
		case immSweepStop:
			h.Merge(&wh)
			wh.Reset()
			r := result{count: count, bytes: bytes, gaps: gaps, mallocs: mallocs() - m0,
				p50: h.Quantile(0.5), p99: h.Quantile(0.99), p999: h.Quantile(0.999), max: float64(h.Max()),
				p99w: h.Quantile(0.99), cpu: sh.End(), p90: h.Quantile(0.9)}
			if len(wp99) > 0 {
				slices.Sort(wp99)
				r.p99w = wp99[len(wp99)/2]
			}
			if count > 0 {
				r.ns = uint64(now - first)
			}
			return false, reply(immSweepResult, r.encode(out.Bytes()))
		case immQuit:
			return true, nil
		}
		return false, nil
	}
	data := func(b []byte, now int64) {
		if len(b) < 16 {
			gaps++
			return
		}
		ts := int64(binary.LittleEndian.Uint64(b))
		seq := binary.LittleEndian.Uint64(b[8:])
		if count == 0 {
			first = now
		} else if seq != expect {
			gaps++
		}
		expect = seq + 1
		// One histogram update per packet: the window's, merged into the
		// total when the window closes (and at the stop).
		wh.Add(now - ts)
		if wh.N() == window {
			if len(wp99) < cap(wp99) {
				wp99 = append(wp99, wh.Quantile(0.99))
			}
			h.Merge(&wh)
			wh.Reset()
		}
		count++
		bytes += uint64(len(b))
	}
	for {
		var quit bool
		if batched {
			n, err := split.RecvWait(ctx, pkts)
			if err != nil {
				return sweepServeErr(err)
			}
			now := measure.Mono(time.Now())
			for _, p := range pkts[:n] {
				if p.Raw && p.Flags&fabric.FlagImm != 0 {
					q, err := control(p.Imm, p.Data, now)
					if err != nil {
						return err
					}
					quit = quit || q
					continue
				}
				data(p.Data, now)
			}
			split.Release(pkts[:n])
		} else {
			n, err := ep.RecvWait(ctx, msgs)
			if err != nil {
				return sweepServeErr(err)
			}
			now := measure.Mono(time.Now())
			for i := range msgs[:n] {
				m := &msgs[i]
				b := buf.Bytes()[i*maxMsg : i*maxMsg+m.Len]
				if m.Flags&fabric.FlagImm != 0 {
					q, err := control(m.Imm, b, now)
					if err != nil {
						return err
					}
					quit = quit || q
					continue
				}
				data(b, now)
			}
		}
		if quit {
			return nil
		}
	}
}

func sweepServeErr(err error) error {
	if errors.Is(err, fabric.ErrPeerGone) {
		return nil
	}
	return err
}

// clean reports whether a run's throughput (lat: latency) phase kept
// both ends on a CPU for at least frac of the time.
func (p *Point) clean(frac float64, lat bool) bool {
	if lat {
		return min(p.LatTxCPU, p.LatRxCPU) >= frac
	}
	return min(p.TxCPU, p.RxCPU) >= frac
}

// medianPoint takes the median of runs, figure by figure: the throughput
// figures over thr, the latency figures over lat.
func medianPoint(thr, lat []Point) Point {
	med := func(ps []Point, f func(Point) float64) float64 {
		xs := make([]float64, len(ps))
		for i, p := range ps {
			xs[i] = f(p)
		}
		return stats.Median(xs)
	}
	var m Point
	if len(thr) > 0 {
		m = Point{Backend: thr[0].Backend, Mode: thr[0].Mode, Size: thr[0].Size, Flushes: thr[len(thr)/2].Flushes}
		m.Packets = uint64(med(thr, func(p Point) float64 { return float64(p.Packets) }))
		m.PktPerSec = med(thr, func(p Point) float64 { return p.PktPerSec })
		m.Gbps = med(thr, func(p Point) float64 { return p.Gbps })
		m.SatP50us = med(thr, func(p Point) float64 { return p.SatP50us })
		m.SatP99us = med(thr, func(p Point) float64 { return p.SatP99us })
		m.PktPerBatch = med(thr, func(p Point) float64 { return p.PktPerBatch })
		m.TxAllocsPerPkt = med(thr, func(p Point) float64 { return p.TxAllocsPerPkt })
		m.RxAllocsPerPkt = med(thr, func(p Point) float64 { return p.RxAllocsPerPkt })
		m.TxCPU = med(thr, func(p Point) float64 { return p.TxCPU })
		m.RxCPU = med(thr, func(p Point) float64 { return p.RxCPU })
		m.Runs = len(thr)
	}
	if len(lat) > 0 {
		m.Backend, m.Mode, m.Size, m.LatRate = lat[0].Backend, lat[0].Mode, lat[0].Size, lat[0].LatRate
		m.LatP50us = med(lat, func(p Point) float64 { return p.LatP50us })
		m.LatP90us = med(lat, func(p Point) float64 { return p.LatP90us })
		m.LatP99us = med(lat, func(p Point) float64 { return p.LatP99us })
		m.LatP999us = med(lat, func(p Point) float64 { return p.LatP999us })
		m.LatMaxus = med(lat, func(p Point) float64 { return p.LatMaxus })
		m.LatP99Winus = med(lat, func(p Point) float64 { return p.LatP99Winus })
		m.LatTxCPU = med(lat, func(p Point) float64 { return p.LatTxCPU })
		m.LatRxCPU = med(lat, func(p Point) float64 { return p.LatRxCPU })
	}
	for _, p := range thr {
		m.Gaps += p.Gaps
	}
	return m
}

// summarize takes the median of the runs, figure by figure, over all runs
// and over the clean ones, and compares the modes run by run.
func summarize(cfg sweepConfig, runs []Point) SweepReport {
	rep := SweepReport{GOMAXPROCS: runtime.GOMAXPROCS(0), Pinned: cfg.pinned, Runs: cfg.runs, MinClean: cfg.minClean, Group: cfg.group,
		Seconds: cfg.dur.Seconds(), DeadlineUs: float64(cfg.opts.Deadline) / 1e3,
		ClockErrUs: float64(measure.ClockErr()) / 1e3, CleanShare: cfg.clean, AllRuns: runs}
	if cfg.opts.Deadline == 0 {
		rep.DeadlineUs = float64(batch.DefaultDeadline) / 1e3
	}
	type key struct {
		backend, mode string
		size          int
	}
	groups := map[key][]Point{}
	var order []key
	for _, p := range runs {
		k := key{p.Backend, p.Mode, p.Size}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], p)
	}
	filter := func(ps []Point, lat bool) []Point {
		var out []Point
		for _, p := range ps {
			if p.clean(cfg.clean, lat) {
				out = append(out, p)
			}
		}
		return out
	}
	byKey := map[key]Point{}
	for _, k := range order {
		ps := groups[k]
		m := medianPoint(ps, ps)
		byKey[k] = m
		rep.Points = append(rep.Points, m)
		thr, lat := filter(ps, false), filter(ps, true)
		c := medianPoint(thr, lat)
		c.Backend, c.Mode, c.Size, c.Runs = k.backend, k.mode, k.size, len(thr)
		rep.CleanPoints = append(rep.CleanPoints, c)
	}
	for _, k := range order {
		if k.mode != "batched" {
			continue
		}
		b := byKey[k]
		c := Compare{Backend: k.backend, Size: k.size}
		bs, us, ws := groups[k], groups[key{k.backend, "unbatched", k.size}], groups[key{k.backend, "burst", k.size}]
		// Pair the interleaved runs: run i of batched against run i of
		// unbatched, then the median.
		var sp, spc, vb, add, addc, addw, add90 []float64
		for i := 0; i < min(len(bs), len(us)); i++ {
			x, u := bs[i], us[i]
			if u.PktPerSec > 0 {
				sp = append(sp, x.PktPerSec/u.PktPerSec)
				if x.clean(cfg.clean, false) && u.clean(cfg.clean, false) {
					spc = append(spc, x.PktPerSec/u.PktPerSec)
				}
			}
			add = append(add, x.LatP99us-u.LatP99us)
			addw = append(addw, x.LatP99Winus-u.LatP99Winus)
			add90 = append(add90, x.LatP90us-u.LatP90us)
			if x.clean(cfg.clean, true) && u.clean(cfg.clean, true) {
				addc = append(addc, x.LatP99us-u.LatP99us)
			}
		}
		for i := 0; i < min(len(bs), len(ws)); i++ {
			if ws[i].PktPerSec > 0 {
				vb = append(vb, bs[i].PktPerSec/ws[i].PktPerSec)
			}
		}
		c.Speedup, c.VsBurst, c.AddedP99us, c.AddedP99Winus = stats.Median(sp), stats.Median(vb), stats.Median(add), stats.Median(addw)
		c.SpeedupClean, c.CleanRuns = stats.Median(spc), len(spc)
		c.AddedP90us = stats.Median(add90)
		c.AddedP99Cleanus, c.LatCleanRuns = stats.Median(addc), len(addc)
		// One full batch: as many packets as fit by count and by bytes.
		full := b.PktPerBatch
		if mp := cfg.opts.MaxPackets; mp > 0 {
			full = float64(mp)
		}
		if b.PktPerSec > 0 {
			c.BoundUs = rep.DeadlineUs + full/b.PktPerSec*1e6
		}
		rep.Summary = append(rep.Summary, c)
	}
	rep.MaxPackets = cfg.opts.MaxPackets
	return rep
}

func printSummary(rep SweepReport) {
	fmt.Printf("\nWeft perf sweep: %d runs (more until %d clean), %.2fs per phase, groups of %d, deadline %.1f µs, GOMAXPROCS %d, pinned %v, clock offset error <= %.2f µs\n",
		rep.Runs, rep.MinClean, rep.Seconds, rep.Group, rep.DeadlineUs, rep.GOMAXPROCS, rep.Pinned, rep.ClockErrUs)
	lr := 0.0
	if len(rep.Points) > 0 {
		lr = rep.Points[0].LatRate
	}
	fmt.Printf("throughput: packets offered as fast as taken; sat = latency in that phase (queueing)\n")
	fmt.Printf("latency: one packet every %.2f µs (%.0f kpkt/s), end to end per packet, including time in the batch\n", 1e6/lr, lr/1e3)
	fmt.Printf("cpu: the lower CPU share of the two ends (CPU time / wall time; both spin, so below 1 = taken by other load)\n")
	table := func(title string, pts []Point) {
		fmt.Printf("\n%s\n", title)
		fmt.Printf("%-7s %5s %-9s %4s %8s %7s %8s %8s %8s %8s %8s %8s %9s %6s %5s %7s\n", "backend", "bytes", "mode", "runs", "Mpkt/s", "Gb/s",
			"sat p50", "sat p99", "lat p50", "lat p90", "lat p99", "p99 win", "lat p999", "pkt/b", "cpu", "alloc/p")
		for _, p := range pts {
			fmt.Printf("%-7s %5d %-9s %4d %8.3f %7.2f %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f %9.2f %6.1f %5.2f %7.3f\n", p.Backend, p.Size, p.Mode, p.Runs,
				p.PktPerSec/1e6, p.Gbps, p.SatP50us, p.SatP99us, p.LatP50us, p.LatP90us, p.LatP99us, p.LatP99Winus, p.LatP999us, p.PktPerBatch,
				min(p.TxCPU, p.RxCPU), max(p.TxAllocsPerPkt, p.RxAllocsPerPkt))
		}
	}
	table("Median of all runs", rep.Points)
	table(fmt.Sprintf("Median of clean runs (both ends' CPU share >= %.2f; throughput and latency phases filtered separately)", rep.CleanShare), rep.CleanPoints)
	fmt.Printf("\n(latencies in µs; p99 win: median over windows of 4096 packets of the window p99; alloc/p: heap allocations per packet)\n")
	fmt.Printf("\nBatched against unbatched, run by run (median of the per-run ratios and differences):\n")
	fmt.Printf("%-7s %5s %11s %13s %9s %14s %16s %13s %13s %9s\n", "backend", "bytes", "batched/unb", "(clean runs)", "vs burst",
		"added p99 µs", "(clean runs)", "(p99 win)", "(p90)", "bound µs")
	for _, c := range rep.Summary {
		fmt.Printf("%-7s %5d %10.2fx %8.2fx (%d) %8.2fx %14.2f %11.2f (%d) %13.2f %13.2f %9.2f\n", c.Backend, c.Size, c.Speedup,
			c.SpeedupClean, c.CleanRuns, c.VsBurst, c.AddedP99us, c.AddedP99Cleanus, c.LatCleanRuns, c.AddedP99Winus, c.AddedP90us, c.BoundUs)
	}
	var gaps uint64
	for _, p := range rep.Points {
		gaps += p.Gaps
	}
	if gaps != 0 {
		fmt.Printf("\nWARNING: %d lost or reordered packets\n", gaps)
	}
}

func parseModes(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(allModes, f) {
			return nil, fmt.Errorf("unknown mode %q (want %s)", f, strings.Join(allModes, ","))
		}
		out = append(out, f)
	}
	return out, nil
}
