// Command perf measures bandwidth and message rate over Weft backends, in
// the style of perftest's ib_send_bw: one side streams bursts of messages,
// the other receives and counts them.
//
// It lives in the tools module (github.com/weft-io/weft/tools, which
// uses the SDK in .. through a replace directive), so that its plotting
// library stays out of the SDK's go.mod. From the repository root:
//
//	go -C tools run ./perf stream
//	go -C tools run ./perf sweep
//
// It has two subcommands, each with its own flags (perf stream -h, perf
// sweep -h). With no flags, stream runs both ends itself over an emulated NTB bridge
// (a second process of itself is the receiver) and prints, per message
// size, the message rate (Mmsg/s) and bandwidth (MB/s), beside a reference
// measured in the same run: Go copy() bandwidth for the same size, the
// ceiling for a transport that moves bytes through memory.
//
//	go run ./perf stream            # in tools
//	go run ./perf stream -json
//
// With flags it runs one side on any registered backend:
//
//	perf stream -server -backend ntb -addr /dev/shm/weft0
//	perf stream -backend ntb -addr /dev/shm/weft0
//
// The sweep subcommand measures small-packet forwarding with and without
// the batch package (SGE coalescing), side by side in one run: for packet
// sizes 64 to 1500 B and the modes unbatched (one message and one Send
// per packet), burst (one message per packet, one Send per group) and
// batched (batch.Coalescer and batch.Splitter), the packet rate and
// bandwidth at saturation, and the end-to-end latency per packet (median,
// p99) at a paced rate, from CLOCK_MONOTONIC timestamps in the packets.
// It prints a table (or -json) and can draw a PNG (-plot):
//
//	go run ./perf sweep -plot sweep.png
//	go run ./perf sweep -json
//
// Figures are medians of -runs runs in which the modes are measured back to
// back; ratios and latency differences are taken run by run. Both ends
// spin, so each phase records its CPU share (CPU time over wall time) on
// both ends: a share below -clean means the host's other load took the
// CPU. The sweep reports medians over all runs and over the clean ones, and
// -min-clean K adds runs until K were clean (the choice depends on the CPU
// shares only).
//
// Each backend in -backend (a list) is measured; an empty address with the
// ntb or roce backend runs both ends itself (roce: two engines on
// 127.0.0.1 and 127.0.0.2), any other backend runs its receiver on the
// peer with perf sweep -server -backend NAME -addr ADDR:
//
//	perf sweep -backend ntb,roce -addr ,10.0.0.2:4791
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/batch"
	_ "github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"
	_ "github.com/weft-io/weft/roce"
	_ "github.com/weft-io/weft/roce/verbs"
	"github.com/weft-io/weft/tools/measure"
)

// Control messages carry FlagImm with one of these immediates.
const (
	immStart = 0x57a7 // payload: size
	immStop  = 0x5703 // ends a size: the server replies with its counts
	immQuit  = 0x5707
)

// Result is one measured point.
type Result struct {
	Backend  string  `json:"backend"`
	Size     int     `json:"size"`
	Burst    int     `json:"burst"`
	Messages uint64  `json:"messages"`
	Seconds  float64 `json:"seconds"`
	MmsgPerS float64 `json:"mmsg_per_s"`
	MBPerS   float64 `json:"mb_per_s"`
	// CopyMBPerS is Go copy() bandwidth at the same size in the same run.
	CopyMBPerS float64 `json:"copy_mb_per_s,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "stream":
		streamMain(os.Args[2:])
	case "sweep":
		sweepMain(os.Args[2:])
	case "help", "-h", "-help", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "perf: unknown subcommand %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: perf stream [flags]   message bandwidth and rate
       perf sweep [flags]    small packets batched and unbatched
Run "perf stream -h" or "perf sweep -h" for a subcommand's flags.
`)
}

// common are the flags both subcommands have.
type common struct {
	backend, addr, sizes *string
	server, asJSON, pin  *bool
	dur                  *time.Duration
	runs                 *int
}

func commonFlags(fs *flag.FlagSet, sizes string, dur time.Duration) common {
	return common{
		backend: fs.String("backend", "ntb", "backend: "+strings.Join(fabric.Backends(), ", ")),
		addr:    fs.String("addr", "", "address; empty: run both ends here (ntb: an emulated bridge; roce: 127.0.0.1 and 127.0.0.2)"),
		server:  fs.Bool("server", false, "run the receiving side"),
		sizes:   fs.String("sizes", sizes, "message sizes in bytes"),
		dur:     fs.Duration("t", dur, "duration per size"),
		runs:    fs.Int("runs", 3, "runs per size; the median is reported"),
		asJSON:  fs.Bool("json", false, "print JSON"),
		pin:     fs.Bool("pin", false, "pin the sender and the receiver threads to CPUs 0 and 1"),
	}
}

// sweepMain is the sweep subcommand.
func sweepMain(args []string) {
	fs := flag.NewFlagSet("perf sweep", flag.ExitOnError)
	c := commonFlags(fs, "64,128,256,512,1024,1500", 500*time.Millisecond)
	modes := fs.String("modes", strings.Join(allModes, ","), "modes to measure")
	group := fs.Int("group", 32, "packets generated per group (a router's receive burst)")
	latRate := fs.Float64("lat-rate", 500e3, "packets/s offered in the latency phase")
	deadline := fs.Duration("deadline", batch.DefaultDeadline, "batch deadline")
	maxPackets := fs.Int("max-packets", 0, "packets per batch (0: Caps.MaxSGEs-1)")
	maxBytes := fs.Int("max-bytes", 0, "bytes per batch (0: the batch default)")
	plotPath := fs.String("plot", "", "write a PNG plot to this file")
	maxMsg := fs.Int("maxmsg", 64<<10, "endpoint max message size")
	splitCopy := fs.Bool("split-copy", false, "the batch splitter copies batches into slots of its own even where the endpoint offers zero-copy views")
	cleanShare := fs.Float64("clean", 0.9, "CPU share both ends must keep for a run to count as clean")
	minClean := fs.Int("min-clean", 0, "add runs until this many were clean in every mode (at most -max-runs)")
	maxRuns := fs.Int("max-runs", 0, "cap on runs per size with -min-clean (0: 4 x -runs)")
	plotAll := fs.Bool("plot-all", false, "plot the medians of all runs (default: of the clean runs)")
	fromJSON := fs.String("from-json", "", "print and plot a saved -json report instead of measuring")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the sender (and FILE.server of the receiver)")
	fs.Parse(args)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := measure.InitClock(); err != nil {
		fatal(err)
	}
	cfg := sweepConfig{backends: strings.Split(*c.backend, ","), runs: *c.runs, group: *group,
		latRate: *latRate, asJSON: *c.asJSON, plotPath: *plotPath, maxMsg: *maxMsg, dur: *c.dur,
		opts: batch.Options{Deadline: *deadline, MaxPackets: *maxPackets, MaxBytes: *maxBytes}}
	if *c.addr != "" {
		cfg.addrs = strings.Split(*c.addr, ",")
	}
	cfg.latDur = cfg.dur / 2
	var err error
	if cfg.sizes, err = parseSizes(*c.sizes); err != nil {
		fatal(err)
	}
	if cfg.modes, err = parseModes(*modes); err != nil {
		fatal(err)
	}
	if *c.server {
		if *c.addr == "" {
			fatal(errors.New("-server needs -addr"))
		}
		ctx := context.Background()
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ep, err := fabric.Open(octx, *c.backend, *c.addr, &fabric.Options{MaxMsgSize: *maxMsg})
		cancel()
		if err != nil {
			fatal(err)
		}
		defer ep.Close()
		if *c.pin {
			pin(1)
		}
		if err := serveSweep(ctx, ep, *splitCopy); err != nil {
			pprof.StopCPUProfile()
			fatal(err)
		}
		return
	}
	if *c.pin {
		cfg.pinned = pin(0) >= 0
	}
	cfg.cpuProfile = *cpuProfile
	cfg.splitCopy = *splitCopy
	cfg.clean = *cleanShare
	cfg.minClean, cfg.maxRuns, cfg.plotAll = *minClean, *maxRuns, *plotAll
	if *fromJSON != "" {
		b, err := os.ReadFile(*fromJSON)
		if err != nil {
			fatal(err)
		}
		var rep SweepReport
		if err := json.Unmarshal(b, &rep); err != nil {
			fatal(err)
		}
		if err := report(cfg, rep); err != nil {
			fatal(err)
		}
		return
	}
	if cfg.maxRuns == 0 {
		cfg.maxRuns = 4 * cfg.runs
	}
	if err := runSweep(cfg); err != nil {
		pprof.StopCPUProfile()
		fatal(err)
	}
}

// streamMain is the stream subcommand.
func streamMain(args []string) {
	fs := flag.NewFlagSet("perf stream", flag.ExitOnError)
	c := commonFlags(fs, "64,256,1024,4096,16384,65536", time.Second)
	burst := fs.Int("burst", 32, "messages per Send burst")
	spin := fs.Duration("spin", time.Millisecond, "how long blocking calls busy-poll before they sleep (0: the backend default)")
	views := fs.Bool("views", false, "the receiver takes zero-copy views of the messages (fabric.ViewReceiver) instead of copying them into its buffers")
	fs.Parse(args)
	backend, addr, server, sizesFlag, dur, runs, asJSON, doPin := c.backend, c.addr, c.server, c.sizes, c.dur, c.runs, c.asJSON, c.pin
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		fatal(err)
	}
	maxSize := 0
	for _, s := range sizes {
		maxSize = max(maxSize, s)
	}
	opts := &fabric.Options{MaxMsgSize: max(64<<10, maxSize), Spin: *spin}
	ctx := context.Background()
	var cmd *exec.Cmd
	if *addr == "" {
		if *server || (*backend != "ntb" && *backend != "roce") {
			fatal(errors.New("running both ends needs -backend ntb or roce, and no -server"))
		}
		self, err := os.Executable()
		if err != nil {
			fatal(err)
		}
		serverAddr, clientAddr, cleanup := localPair(*backend, "perf")
		defer cleanup()
		*addr = clientAddr
		cmd = exec.Command(self, "stream", "-server", "-backend", *backend, "-addr", serverAddr, "-burst", strconv.Itoa(*burst),
			"-sizes", *sizesFlag, "-spin", spin.String(), "-pin="+strconv.FormatBool(*doPin), "-views="+strconv.FormatBool(*views))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			fatal(err)
		}
		defer cmd.Wait()
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ep, err := fabric.Open(octx, *backend, *addr, opts)
	cancel()
	if err != nil {
		if cmd != nil {
			cmd.Process.Kill()
		}
		fatal(err)
	}
	defer ep.Close()
	if *server {
		if *doPin {
			pin(1)
		}
		if *views {
			err = serveViews(ctx, ep, *burst)
		} else {
			err = serve(ctx, ep, *burst)
		}
		if err != nil {
			fatal(err)
		}
		return
	}
	if *doPin {
		pin(0)
	}
	var results []Result
	if !*asJSON {
		recv := "copies into its buffers (Recv)"
		if *views {
			recv = "takes zero-copy views (RecvViews)"
		}
		fmt.Printf("Weft perf: backend %s, burst %d, %v per run, median of %d runs, GOMAXPROCS %d; the receiver %s\n",
			*backend, *burst, *dur, *runs, runtime.GOMAXPROCS(0), recv)
		fmt.Printf("%-9s %-12s %-10s %-11s %-13s %s\n", "#bytes", "#messages", "Mmsg/s", "MB/s", "copy() MB/s", "vs copy()")
	}
	for _, size := range sizes {
		if size > ep.Caps().MaxMsgSize {
			continue
		}
		var rs []Result
		for r := 0; r < *runs; r++ {
			res, err := stream(ctx, ep, size, *burst, *dur)
			if err != nil {
				fatal(err)
			}
			res.Backend = *backend
			res.CopyMBPerS = copyBandwidth(size, *dur/4)
			rs = append(rs, res)
		}
		res := medianResult(rs)
		results = append(results, res)
		if !*asJSON {
			fmt.Printf("%-9d %-12d %-10.3f %-11.1f %-13.1f %.2fx\n", res.Size, res.Messages, res.MmsgPerS, res.MBPerS,
				res.CopyMBPerS, res.MBPerS/res.CopyMBPerS)
		}
	}
	quit(ctx, ep)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(results)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "perf:", err)
	os.Exit(1)
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad size %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// medianResult picks the run with the median rate.
func medianResult(rs []Result) Result {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].MmsgPerS < rs[j-1].MmsgPerS; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
	copies := make([]float64, len(rs))
	for i := range rs {
		copies[i] = rs[i].CopyMBPerS
	}
	for i := 1; i < len(copies); i++ {
		for j := i; j > 0 && copies[j] < copies[j-1]; j-- {
			copies[j], copies[j-1] = copies[j-1], copies[j]
		}
	}
	m := rs[len(rs)/2]
	m.CopyMBPerS = copies[len(copies)/2]
	return m
}

var sink []byte

// copyBandwidth measures copy() between two buffers of size bytes.
func copyBandwidth(size int, d time.Duration) float64 {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	n := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		for i := 0; i < 64; i++ {
			copy(dst, src)
		}
		n += 64
	}
	sink = dst
	return float64(n) * float64(size) / time.Since(t0).Seconds() / 1e6
}

func control(ctx context.Context, ep fabric.Endpoint, buf *fabric.Region, imm uint32, payload uint64) error {
	binary.LittleEndian.PutUint64(buf.Bytes(), payload)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 8}}, Flags: fabric.FlagImm, Imm: imm}}
	_, err := ep.SendWait(ctx, msgs)
	return err
}

// stream sends size-byte messages in bursts for d, then asks the server
// how many it received and in what time.
func stream(ctx context.Context, ep fabric.Endpoint, size, burst int, d time.Duration) (Result, error) {
	ctl, err := ep.Alloc(64, fabric.AccessLocalWrite)
	if err != nil {
		return Result{}, err
	}
	defer ctl.Close()
	src, err := ep.Alloc(size, 0)
	if err != nil {
		return Result{}, err
	}
	defer src.Close()
	if err := control(ctx, ep, ctl, immStart, uint64(size)); err != nil {
		return Result{}, err
	}
	msgs := make([]fabric.Message, burst)
	sge := []fabric.SGE{{Region: src, Length: size}}
	for i := range msgs {
		msgs[i] = fabric.Message{SGEs: sge}
	}
	t0 := time.Now()
	for i := 0; ; i++ {
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			return Result{}, err
		}
		if i&63 == 0 && time.Since(t0) >= d {
			break
		}
	}
	if err := control(ctx, ep, ctl, immStop, 0); err != nil {
		return Result{}, err
	}
	rm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(ctl)}}}
	if _, err := ep.RecvWait(ctx, rm); err != nil {
		return Result{}, err
	}
	count := binary.LittleEndian.Uint64(ctl.Bytes())
	ns := binary.LittleEndian.Uint64(ctl.Bytes()[8:])
	secs := float64(ns) / 1e9
	return Result{Size: size, Burst: burst, Messages: count, Seconds: secs,
		MmsgPerS: float64(count) / secs / 1e6, MBPerS: float64(count) * float64(size) / secs / 1e6}, nil
}

// counter is the server side of a stream: it counts data messages
// between a start and a stop control message and times them from the first
// one to the stop.
type counter struct {
	ep    fabric.Endpoint
	ctl   *fabric.Region
	count uint64
	t0    time.Time
}

func newCounter(ep fabric.Endpoint) (*counter, error) {
	ctl, err := ep.Alloc(64, 0)
	if err != nil {
		return nil, err
	}
	return &counter{ep: ep, ctl: ctl}, nil
}

// data counts one data message.
func (c *counter) data() {
	if c.count == 0 {
		c.t0 = time.Now()
	}
	c.count++
}

// control handles a control message; it reports quit for immQuit.
func (c *counter) control(ctx context.Context, imm uint32) (quit bool, err error) {
	switch imm {
	case immStart:
		c.count = 0
	case immStop:
		el := time.Since(c.t0)
		binary.LittleEndian.PutUint64(c.ctl.Bytes(), c.count)
		binary.LittleEndian.PutUint64(c.ctl.Bytes()[8:], uint64(el.Nanoseconds()))
		out := []fabric.Message{{SGEs: []fabric.SGE{{Region: c.ctl, Length: 16}}}}
		_, err = c.ep.SendWait(ctx, out)
	case immQuit:
		quit = true
	}
	return quit, err
}

// serve receives bursts and counts them; between a start and a stop
// control message it times the stream from its first message to the stop.
func serve(ctx context.Context, ep fabric.Endpoint, burst int) error {
	max := ep.Caps().MaxMsgSize
	buf, err := ep.Alloc(max*burst, fabric.AccessLocalWrite)
	if err != nil {
		return err
	}
	msgs := make([]fabric.Message, burst)
	sges := make([]fabric.SGE, burst)
	for i := range msgs {
		sges[i] = fabric.SGE{Region: buf, Offset: i * max, Length: max}
		msgs[i] = fabric.Message{SGEs: sges[i : i+1]}
	}
	c, err := newCounter(ep)
	if err != nil {
		return err
	}
	for {
		n, err := ep.RecvWait(ctx, msgs)
		if err != nil {
			if errors.Is(err, fabric.ErrPeerGone) {
				return nil
			}
			return err
		}
		for i := 0; i < n; i++ {
			m := &msgs[i]
			if m.Flags&fabric.FlagImm == 0 {
				c.data()
				continue
			}
			if quit, err := c.control(ctx, m.Imm); quit || err != nil {
				return err
			}
		}
	}
}

// serveViews is serve with a receiver that takes views of the messages
// where they arrived (fabric.ViewReceiver) and releases each burst after
// reading the first and last byte of every message.
func serveViews(ctx context.Context, ep fabric.Endpoint, burst int) error {
	vr, ok := ep.(fabric.ViewReceiver)
	if !ok {
		return fmt.Errorf("backend %s has no zero-copy receive (fabric.ViewReceiver)", ep.Caps().Backend)
	}
	views := make([]fabric.View, burst)
	c, err := newCounter(ep)
	if err != nil {
		return err
	}
	var sum byte
	for {
		n, err := vr.RecvViewsWait(ctx, views)
		if err != nil {
			if errors.Is(err, fabric.ErrPeerGone) {
				return nil
			}
			return err
		}
		for i := 0; i < n; i++ {
			v := &views[i]
			if v.Flags&fabric.FlagImm == 0 {
				if len(v.Data) > 0 {
					sum += v.Data[0] + v.Data[len(v.Data)-1]
				}
				c.data()
				continue
			}
			if quit, err := c.control(ctx, v.Imm); quit || err != nil {
				sink = []byte{sum}
				return err
			}
		}
		if err := vr.ReleaseViews(n); err != nil {
			return err
		}
	}
}

func quit(ctx context.Context, ep fabric.Endpoint) {
	ctl, err := ep.Alloc(64, 0)
	if err != nil {
		return
	}
	control(ctx, ep, ctl, immQuit, 0)
}

// localPair returns the addresses of a receiver (child process) and a
// sender (this process) that run both ends on this host: for roce two
// user-space engines over loopback (127.0.0.1 and 127.0.0.2, MTU 4096,
// the TCP exchange on a port derived from the process ID and tag), for
// ntb an emulated bridge in /dev/shm, which cleanup removes.
func localPair(backend, tag string) (serverAddr, clientAddr string, cleanup func()) {
	if backend == "roce" {
		off := 0
		if tag != "perf" {
			off = 1000 // the sweep's receiver, distinct from the stream's
		}
		port := 18515 + off + os.Getpid()%1000
		return fmt.Sprintf("listen:127.0.0.1:%d?mtu=4096&raw=0", port),
			fmt.Sprintf("127.0.0.1:%d?local=127.0.0.2&mtu=4096&raw=0", port), func() {}
	}
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("weft-%s-%d", tag, os.Getpid()))
	os.Remove(path)
	return path, path, func() { os.Remove(path) }
}
