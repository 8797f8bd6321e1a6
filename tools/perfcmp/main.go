// Command perfcmp measures Weft's AF_XDP packet path beside two
// references on the same veth pair, side by side in one run:
//
//   - a plain C AF_XDP program written against libxdp's xsk API
//     (testdata/xskbench.c, built here with gcc -lxdp -lbpf; Debian's
//     libxdp-dev and libbpf-dev), and
//   - a Go UDP socket using golang.org/x/net/ipv4 ReadBatch/WriteBatch
//     (recvmmsg/sendmmsg through the kernel stack).
//
// It creates two network namespaces joined by a veth pair, A (sender)
// and B (receiver), and measures, with 60-byte frames (64 with the FCS):
//
//   - RX: the C program (else Weft) in TX mode in A offers frames; the
//     receiver in B is the C program, Weft's Port/Queue API ("weft"),
//     Weft's low-level ring API ethernet/xsk ("weft-xsk") or the UDP
//     socket. Weft's XDP program steers the frames for the AF_XDP
//     receivers.
//   - TX: the sender in A is the C program, Weft or the UDP socket; B
//     drops every frame in native XDP.
//
// Senders (and the veth NAPI work they trigger) are pinned to CPU 0,
// receivers to CPU 1.
//
// Each configuration runs -rounds times (interleaved, so drift affects
// all alike) for -duration; the table shows medians in Mpps and ratios.
// It needs root, and gcc with libxdp for the C column (without them that
// column is left out).
//
//	go -C tools run ./perfcmp
//	go -C tools run ./perfcmp -duration 2s -rounds 5 -json
package main

import (
	"bufio"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/stats"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

//go:embed testdata/xskbench.c
var xskbenchC []byte

// FrameLen is the frame length on the wire without FCS.
const FrameLen = 60

// Result is one configuration's measurements.
type Result struct {
	Test   string    `json:"test"` // "rx" or "tx"
	Impl   string    `json:"impl"` // "c-libxdp", "weft", "go-udp"
	Mpps   []float64 `json:"mpps"`
	Median float64   `json:"median_mpps"`
	// Offered is the sender's rate during RX runs (median), in Mpps.
	Offered float64 `json:"offered_mpps,omitempty"`
}

// Config sets the measurement parameters.
type Config struct {
	Duration time.Duration
	Rounds   int
	// TXBudget sets Weft's XDP_MAX_TX_SKB_BUDGET (0: Weft's default,
	// 256; negative: the kernel's default, 32).
	TXBudget int
	// Only restricts the run to "rx" or "tx" ("": both).
	Only string
	// Log receives progress lines (nil: none).
	Log func(format string, args ...any)
}

type bench struct {
	cfg   Config
	pair  *netns.Pair
	frame []byte
	cbin  string
	port  int
	raw   bool
	live  *ebpf.Program // XDP_TX program for live-frame sending, if the kernel has it
	// txBudget is Weft's copy-mode frames per kick (0: kernel default).
	txBudget int
}

// xdpMD is struct xdp_md, the context of a live-frame run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// liveSender loads the XDP_TX program that BPF_PROG_RUN runs in live
// frame mode (Linux 5.18): the kernel's own traffic generator technique
// (xdp-trafficgen), far faster than any socket on veth.
func liveSender() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 3), asm.Return()}}) // XDP_TX
}

func main() {
	d := flag.Duration("duration", 2*time.Second, "length of each run")
	rounds := flag.Int("rounds", 3, "runs per configuration (the median is reported)")
	js := flag.Bool("json", false, "print JSON")
	only := flag.String("only", "", "run only this test (rx or tx)")
	budget := flag.Int("txbudget", 0, "Weft's copy-mode frames per sendto (XDP_MAX_TX_SKB_BUDGET; 0: kernel default 32)")
	flag.Parse()
	res, err := Run(Config{Duration: *d, Rounds: *rounds, TXBudget: *budget, Only: *only, Log: func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, f+"\n", a...)
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "perfcmp:", err)
		os.Exit(1)
	}
	if *js {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Print(Table(res))
}

// Table formats results with the ratios of Weft to each reference.
func Table(res []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-4s %-10s %10s  %s\n", "test", "impl", "Mpps(med)", "runs")
	get := func(test, impl string) float64 {
		for _, r := range res {
			if r.Test == test && r.Impl == impl {
				return r.Median
			}
		}
		return 0
	}
	for _, r := range res {
		runs := make([]string, len(r.Mpps))
		for i, v := range r.Mpps {
			runs[i] = fmt.Sprintf("%.3f", v)
		}
		extra := ""
		if r.Offered > 0 {
			extra = fmt.Sprintf("  (offered %.3f)", r.Offered)
		}
		fmt.Fprintf(&b, "%-4s %-10s %10.3f  %s%s\n", r.Test, r.Impl, r.Median, strings.Join(runs, " "), extra)
	}
	runs := func(test, impl string) []float64 {
		for _, r := range res {
			if r.Test == test && r.Impl == impl {
				return r.Mpps
			}
		}
		return nil
	}
	// Paired ratios: the runs of one round ran back to back, so their
	// ratio cancels most of the drift of a shared machine.
	paired := func(test, a, ref string) float64 {
		x, y := runs(test, a), runs(test, ref)
		var q []float64
		for i := range min(len(x), len(y)) {
			if y[i] > 0 {
				q = append(q, x[i]/y[i])
			}
		}
		return stats.Median(q)
	}
	for _, t := range []string{"rx", "tx"} {
		for _, impl := range []string{"weft", "weft-xsk"} {
			w := get(t, impl)
			if w == 0 {
				continue
			}
			if c := get(t, "c-libxdp"); c > 0 {
				fmt.Fprintf(&b, "%s: %s / C libxdp = %.2fx of medians, %.2fx median of paired rounds (goal >= 0.95)\n",
					t, impl, w/c, paired(t, impl, "c-libxdp"))
			}
			if u := get(t, "go-udp"); u > 0 {
				fmt.Fprintf(&b, "%s: %s / Go UDP batch = %.2fx of medians, %.2fx median of paired rounds (goal >= 2.2)\n",
					t, impl, w/u, paired(t, impl, "go-udp"))
			}
		}
	}
	return b.String()
}

// Run sets up the namespaces, runs every configuration and returns the
// results.
func Run(cfg Config) ([]Result, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = 2 * time.Second
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	p, err := netns.NewPair(netns.PairConfig{StaticNeigh: true})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	b := &bench{cfg: cfg, pair: p, port: 9999, txBudget: cfg.TXBudget}
	b.frame = make([]byte, FrameLen)
	ethernet.PutUDP4(b.frame, &ethernet.UDP4{SrcMAC: p.MACA, DstMAC: p.MACB,
		SrcIP: netip.AddrFrom4([4]byte(p.IPA)), DstIP: netip.AddrFrom4([4]byte(p.IPB)),
		SrcPort: 9999, DstPort: uint16(b.port)}, FrameLen-ethernet.UDP4HdrLen)
	dir, err := os.MkdirTemp("", "perfcmp")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if bin, err := buildC(dir); err != nil {
		cfg.Log("C reference unavailable (%v); install gcc libxdp-dev libbpf-dev", err)
	} else {
		b.cbin = bin
	}

	if os.Getenv("PERFCMP_SENDER") != "c" {
		if p, err := liveSender(); err == nil {
			b.live = p
			defer p.Close()
		} else {
			cfg.Log("live-frame sender unavailable (%v)", err)
		}
	}

	type conf struct {
		test, impl string
		run        func() (float64, float64, error)
	}
	var confs []conf
	if b.cbin != "" {
		confs = append(confs, conf{"rx", "c-libxdp", b.rxC})
	}
	confs = append(confs, conf{"rx", "weft", b.rxWeft}, conf{"rx", "weft-xsk", b.rxWeftXSK}, conf{"rx", "go-udp", b.rxUDP})
	if b.cbin != "" {
		confs = append(confs, conf{"tx", "c-libxdp", b.txC})
	}
	confs = append(confs, conf{"tx", "weft", b.txWeft}, conf{"tx", "go-udp", b.txUDP})

	if cfg.Only != "" {
		var keep []conf
		for _, c := range confs {
			if c.test == cfg.Only {
				keep = append(keep, c)
			}
		}
		confs = keep
	}
	res := make([]Result, len(confs))
	offered := make([][]float64, len(confs))
	for i, c := range confs {
		res[i] = Result{Test: c.test, Impl: c.impl}
	}
	for r := 0; r < cfg.Rounds; r++ {
		for i, c := range confs {
			v, off, err := c.run()
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", c.test, c.impl, err)
			}
			cfg.Log("round %d %s %-9s %.3f Mpps", r+1, c.test, c.impl, v)
			res[i].Mpps = append(res[i].Mpps, v)
			if off > 0 {
				offered[i] = append(offered[i], off)
			}
		}
	}
	for i := range res {
		res[i].Median = stats.Median(res[i].Mpps)
		res[i].Offered = stats.Median(offered[i])
	}
	return res, nil
}

// Sender work (and the veth NAPI it triggers) runs on CPU senderCPU,
// receivers on recvCPU, so that every configuration gets the same split
// of a 2-core machine.
const senderCPU, recvCPU = 0, 1

// pin locks the calling goroutine to its thread and the thread to cpu;
// the returned function undoes both.
func pin(cpu int) func() {
	runtime.LockOSThread()
	var set, old unix.CPUSet
	unix.SchedGetaffinity(0, &old)
	set.Set(cpu % runtime.NumCPU())
	unix.SchedSetaffinity(0, &set)
	return func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// tasksetCmd runs a command pinned to cpu.
func tasksetCmd(cpu int, name string, args ...string) *exec.Cmd {
	if _, err := exec.LookPath("taskset"); err != nil {
		return exec.Command(name, args...)
	}
	return exec.Command("taskset", append([]string{"-c", fmt.Sprint(cpu % runtime.NumCPU()), name}, args...)...)
}

func buildC(dir string) (string, error) {
	src := filepath.Join(dir, "xskbench.c")
	if err := os.WriteFile(src, xskbenchC, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "xskbench")
	out, err := exec.Command("gcc", "-O2", "-o", bin, src, "-lxdp", "-lbpf").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("gcc: %v: %s", err, out)
	}
	return bin, nil
}

// sender offers frames from namespace A for the RX runs: the C program
// in TX mode when it is available (the fastest sender, in a process of
// its own, the same for every receiver), else Weft's TX loop.
type sender struct {
	stop chan struct{}
	done chan struct{}
	mpps float64
	err  error
}

func (b *bench) startSender() *sender {
	s := &sender{stop: make(chan struct{}), done: make(chan struct{})}
	if b.live != nil {
		go func() {
			defer close(s.done)
			idx, err := b.pair.A.Index(b.pair.NameA)
			if err != nil {
				s.err = err
				return
			}
			var n uint64
			start := time.Now()
			// One locked thread in namespace A runs the program in live
			// frame mode: every run transmits the frame with XDP_TX.
			s.err = b.pair.A.Do(func() error {
				defer pin(senderCPU)()
				ctx := xdpMD{DataEnd: uint32(len(b.frame)), IngressIfindex: uint32(idx)}
				for {
					select {
					case <-s.stop:
						return nil
					default:
					}
					if _, err := b.live.Run(&ebpf.RunOptions{Data: b.frame, Context: ctx, Repeat: 1 << 16,
						Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES}); err != nil {
						return err
					}
					n += 1 << 16
				}
			})
			s.mpps = float64(n) / time.Since(start).Seconds() / 1e6
		}()
		return s
	}
	if b.cbin != "" {
		// Runs past the measurement; finish ends it.
		cmd := tasksetCmd(senderCPU, b.cbin, "tx", b.pair.NameA, "0", fmt.Sprint((b.cfg.Duration + 3*time.Second).Seconds()), hex.EncodeToString(b.frame))
		go func() {
			defer close(s.done)
			started := make(chan error, 1)
			go func() {
				<-started
				<-s.stop
				cmd.Process.Signal(os.Interrupt)
			}()
			pkts, ns, err := b.runC(b.pair.A, cmd, started)
			s.err = err
			if ns > 0 {
				s.mpps = float64(pkts) / (float64(ns) / 1e9) / 1e6
			}
		}()
		return s
	}
	var port *ethernet.Port
	err := b.pair.A.Do(func() error {
		var err error
		port, err = ethernet.Open(b.pair.NameA, &ethernet.Config{})
		return err
	})
	if err != nil {
		s.err = err
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		defer port.Close()
		defer pin(senderCPU)()
		s.mpps, s.err = txLoop(port.Queue(0), b.frame, s.stop, 0)
	}()
	return s
}

func (s *sender) finish() (float64, error) {
	close(s.stop)
	<-s.done
	return max(s.mpps, 0), s.err
}

// txLoop sends the frame in bursts of 64 until stop is closed (or d has
// passed, if d > 0) and returns the completion rate in Mpps.
func txLoop(q *ethernet.Queue, frame []byte, stop <-chan struct{}, d time.Duration) (float64, error) {
	mem := q.Socket().UMEM().Bytes()
	fs := q.Socket().UMEM().FrameSize()
	for off := 0; off+fs <= len(mem); off += fs {
		copy(mem[off:], frame)
	}
	frames := make([]ethernet.Frame, 64)
	start := time.Now()
	c0 := q.Stats().TXCompleted
	for i := 0; ; i++ {
		if i&63 == 0 {
			if d > 0 && time.Since(start) >= d {
				break
			}
			if stop != nil {
				select {
				case <-stop:
					goto out
				default:
				}
			}
		}
		n := q.Alloc(frames)
		for j := 0; j < n; j++ {
			frames[j].Len = len(frame)
		}
		m, err := q.Send(frames[:n])
		if err != nil {
			return 0, err
		}
		if m < n {
			q.Release(frames[m:n])
		}
	}
out:
	q.Flush()
	el := time.Since(start)
	return float64(q.Stats().TXCompleted-c0) / el.Seconds() / 1e6, nil
}

func (b *bench) rxWeftXSK() (float64, float64, error) {
	b.raw = true
	defer func() { b.raw = false }()
	return b.rxWeft()
}

func (b *bench) rxWeft() (float64, float64, error) {
	var port *ethernet.Port
	if err := b.pair.B.Do(func() error {
		var err error
		port, err = ethernet.Open(b.pair.NameB, &ethernet.Config{Filter: ethernet.Filter{All: true}, Attach: ethernet.AttachNative})
		return err
	}); err != nil {
		return 0, 0, err
	}
	defer port.Close()
	s := b.startSender()
	time.Sleep(200 * time.Millisecond)
	q := port.Queue(0)
	unpin := pin(recvCPU)
	defer unpin()
	frames := make([]ethernet.Frame, 64)
	var count uint64
	start := time.Now()
	if b.raw {
		// The low-level xsk ring API, used exactly as the C program uses
		// libxdp's.
		sk := q.Socket()
		rx, fq := sk.RX(), sk.Fill()
		for i := 0; ; i++ {
			if i&63 == 0 && time.Since(start) >= b.cfg.Duration {
				break
			}
			idx, n := rx.Peek(64)
			if n == 0 {
				if fq.NeedsWakeup() {
					sk.WakeRX()
				}
				continue
			}
			fi, got := fq.Reserve(n)
			for got != n {
				fq.Cancel(got)
				fi, got = fq.Reserve(n)
			}
			for j := 0; j < n; j++ {
				fq.Set(fi+uint32(j), rx.Desc(idx+uint32(j)).Addr)
			}
			fq.Submit(n)
			rx.Release(n)
			count += uint64(n)
		}
		el := time.Since(start)
		off, err := s.finish()
		return float64(count) / el.Seconds() / 1e6, off, err
	}
	for i := 0; ; i++ {
		if i&63 == 0 && time.Since(start) >= b.cfg.Duration {
			break
		}
		n, err := q.Recv(frames)
		if err != nil {
			s.finish()
			return 0, 0, err
		}
		if n > 0 {
			q.Release(frames[:n])
			count += uint64(n)
		}
	}
	el := time.Since(start)
	off, err := s.finish()
	if os.Getenv("PERFCMP_DEBUG") != "" {
		st := q.Stats()
		b.cfg.Log("weft rx: %d packets, %d kicks, kernel %+v", count, st.Kicks, st.Kernel)
	}
	return float64(count) / el.Seconds() / 1e6, off, err
}

func (b *bench) rxC() (float64, float64, error) {
	prog, err := ethernet.NewProgram(ethernet.Filter{All: true}, 64)
	if err != nil {
		return 0, 0, err
	}
	defer prog.Close()
	idx, err := b.pair.B.Index(b.pair.NameB)
	if err != nil {
		return 0, 0, err
	}
	if err := b.pair.B.Do(func() error { return prog.Attach(idx, ethernet.AttachNative) }); err != nil {
		return 0, 0, err
	}
	// The child gets a duplicate of the XSKMAP descriptor as fd 3.
	dup, err := unix.FcntlInt(uintptr(prog.XSKMap().FD()), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return 0, 0, err
	}
	mapFile := os.NewFile(uintptr(dup), "xskmap")
	defer mapFile.Close()
	cmd := tasksetCmd(recvCPU, b.cbin, "rx", b.pair.NameB, "0", fmt.Sprint(b.cfg.Duration.Seconds()))
	cmd.ExtraFiles = []*os.File{mapFile}
	s := b.startSender()
	time.Sleep(200 * time.Millisecond)
	pkts, ns, err := b.runC(b.pair.B, cmd, nil)
	off, serr := s.finish()
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, 0, err
	}
	return float64(pkts) / (float64(ns) / 1e9) / 1e6, off, nil
}

// runC starts cmd inside ns (forked from a thread in the namespace) and
// parses its "packets N ns T" line.
func (b *bench) runC(ns *netns.NS, cmd *exec.Cmd, started chan<- error) (uint64, uint64, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = ns.Do(cmd.Start)
	if started != nil {
		started <- err
	}
	if err != nil {
		return 0, 0, err
	}
	var pkts, nsec uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		fmt.Sscanf(sc.Text(), "packets %d ns %d", &pkts, &nsec)
	}
	if err := cmd.Wait(); err != nil {
		return 0, 0, fmt.Errorf("%v: %s", err, stderr.String())
	}
	if nsec == 0 {
		return 0, 0, errors.New("no result from xskbench: " + stderr.String())
	}
	return pkts, nsec, nil
}

func (b *bench) rxUDP() (float64, float64, error) {
	var conn *net.UDPConn
	if err := b.pair.B.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: b.pair.IPB, Port: b.port})
		if err == nil {
			conn.SetReadBuffer(8 << 20)
		}
		return err
	}); err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	if b.live != nil {
		// Frames sent with XDP_TX reach a veth only if it has an XDP
		// program: give B one that passes everything to the stack.
		prog, err := ethernet.NewProgram(ethernet.Filter{}, 1)
		if err != nil {
			return 0, 0, err
		}
		defer prog.Close()
		idx, err := b.pair.B.Index(b.pair.NameB)
		if err != nil {
			return 0, 0, err
		}
		if err := b.pair.B.Do(func() error { return prog.Attach(idx, ethernet.AttachNative) }); err != nil {
			return 0, 0, err
		}
	}
	pc := ipv4.NewPacketConn(conn)
	msgs := make([]ipv4.Message, 64)
	for i := range msgs {
		msgs[i].Buffers = [][]byte{make([]byte, 2048)}
	}
	s := b.startSender()
	time.Sleep(200 * time.Millisecond)
	defer pin(recvCPU)()
	var count atomic.Uint64
	start := time.Now()
	conn.SetReadDeadline(start.Add(b.cfg.Duration))
	for i := 0; ; i++ {
		// The deadline only ends a blocked read; under load check the time.
		if i&15 == 0 && time.Since(start) >= b.cfg.Duration {
			break
		}
		n, err := pc.ReadBatch(msgs, 0)
		if err != nil {
			break // deadline
		}
		count.Add(uint64(n))
	}
	el := time.Since(start)
	off, err := s.finish()
	return float64(count.Load()) / el.Seconds() / 1e6, off, err
}

// withDrop attaches an XDP_DROP program to B's veth for the TX runs.
func (b *bench) withDrop(fn func() (float64, float64, error)) (float64, float64, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}}) // XDP_DROP
	if err != nil {
		return 0, 0, err
	}
	defer prog.Close()
	idx, err := b.pair.B.Index(b.pair.NameB)
	if err != nil {
		return 0, 0, err
	}
	var l link.Link
	if err := b.pair.B.Do(func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: link.XDPDriverMode})
		return err
	}); err != nil {
		return 0, 0, err
	}
	defer l.Close()
	return fn()
}

func (b *bench) txWeft() (float64, float64, error) {
	return b.withDrop(func() (float64, float64, error) {
		var port *ethernet.Port
		if err := b.pair.A.Do(func() error {
			var err error
			port, err = ethernet.Open(b.pair.NameA, &ethernet.Config{TXBudget: b.txBudget})
			return err
		}); err != nil {
			return 0, 0, err
		}
		defer port.Close()
		if b.txBudget > 0 && port.Queue(0).Socket().TXBudget() == 0 {
			b.cfg.Log("kernel lacks XDP_MAX_TX_SKB_BUDGET")
		}
		defer pin(senderCPU)()
		v, err := txLoop(port.Queue(0), b.frame, nil, b.cfg.Duration)
		return v, 0, err
	})
}

func (b *bench) txC() (float64, float64, error) {
	return b.withDrop(func() (float64, float64, error) {
		cmd := tasksetCmd(senderCPU, b.cbin, "tx", b.pair.NameA, "0", fmt.Sprint(b.cfg.Duration.Seconds()), hex.EncodeToString(b.frame))
		pkts, ns, err := b.runC(b.pair.A, cmd, nil)
		if err != nil {
			return 0, 0, err
		}
		return float64(pkts) / (float64(ns) / 1e9) / 1e6, 0, nil
	})
}

func (b *bench) txUDP() (float64, float64, error) {
	return b.withDrop(func() (float64, float64, error) {
		var conn *net.UDPConn
		if err := b.pair.A.Do(func() error {
			var err error
			conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: b.pair.IPB, Port: b.port})
			if err == nil {
				conn.SetWriteBuffer(8 << 20)
			}
			return err
		}); err != nil {
			return 0, 0, err
		}
		defer conn.Close()
		pc := ipv4.NewPacketConn(conn)
		payload := make([]byte, FrameLen-ethernet.UDP4HdrLen)
		msgs := make([]ipv4.Message, 64)
		for i := range msgs {
			msgs[i].Buffers = [][]byte{payload}
		}
		defer pin(senderCPU)()
		var count uint64
		start := time.Now()
		for i := 0; ; i++ {
			if i&15 == 0 && time.Since(start) >= b.cfg.Duration {
				break
			}
			n, err := pc.WriteBatch(msgs, 0)
			if err != nil {
				continue // ENOBUFS and the like: try again
			}
			count += uint64(n)
		}
		return float64(count) / time.Since(start).Seconds() / 1e6, 0, nil
	})
}
