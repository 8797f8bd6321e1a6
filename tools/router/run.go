package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weft-io/weft/tools/measure"
)

// RunConfig is one comparison.
type RunConfig struct {
	Backplanes []string
	Nodes      int
	Sizes      []int
	Duration   time.Duration
	Rate       float64 // offered load of the throughput phase (0: as fast as the generator can)
	LatRate    float64 // fixed offered load of the latency phase
	Routes     int
	Bad        int // every Bad-th generated packet is malformed in some way (0: none)
	Tuned      Tuned
	Defaults   Settings
	Kill       int // kill and restart this node mid-run (-1: none)
	// GenNice is the generator's nice value (0: as the rest). Where the
	// run's processes share too few cores (the emulated VMs: one vCPU
	// for a node, its generator and its sink), a niced generator offers
	// less (Skipped) instead of starving the node and the kernel's
	// softirq until the links between them overflow.
	GenNice int
	// Machine makes the run this machine's part of a cluster with one
	// node per machine (the verbs back-plane); nil: every node on this
	// host.
	Machine *Machine
	Log     func(string, ...any)
}

// Row is one back-plane and size.
type Row struct {
	Backplane string      `json:"backplane"`
	Nodes     int         `json:"nodes"`
	Size      int         `json:"size"`
	Settings  Settings    `json:"settings"`
	Offered   float64     `json:"offered_mpps"`
	Mpps      float64     `json:"mpps"`
	Gbps      float64     `json:"gbps"`
	Loss      float64     `json:"loss"` // fraction of the throughput phase
	LatRate   float64     `json:"lat_rate_pps"`
	LatLoss   float64     `json:"lat_loss"`
	MedianUs  float64     `json:"median_us"`
	P99Us     float64     `json:"p99_us"`
	Gen       GenResult   `json:"gen"`
	Sink      SinkResult  `json:"sink"`
	LatSink   SinkResult  `json:"lat_sink"`
	NodeStats []NodeStats `json:"node_stats"`
	// CPU is the CPU use of each process in the throughput phase, and
	// LatCPU in the latency phase, in cores (see measure.CPUMeter).
	CPU    map[string]float64 `json:"cpu"`
	LatCPU map[string]float64 `json:"lat_cpu,omitempty"`
	Err    string             `json:"error,omitempty"`
}

// child is a process of the run (node, generator or sink) whose stdout
// lines are read as they come.
type child struct {
	name  string // its namespace and role, for messages
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

var children struct {
	sync.Mutex
	m map[*child]bool
}

func startChild(t *Topology, ns string, args ...string) (*child, error) {
	cmd, err := t.Command(ns, args...)
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: strings.TrimSpace(ns + " " + strings.Join(args[:min(len(args), 2)], " ")), cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
	children.Lock()
	if children.m == nil {
		children.m = map[*child]bool{}
	}
	children.m[c] = true
	children.Unlock()
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		cmd.Wait()
		children.Lock()
		delete(children.m, c)
		children.Unlock()
		close(c.lines)
		close(c.done)
	}()
	return c, nil
}

// line waits for the child's next stdout line.
func (c *child) line(ctx context.Context, timeout time.Duration) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("%s exited: %v", c.name, c.cmd.ProcessState)
		}
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("%s: no answer in %v", c.name, timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (c *child) signal(s syscall.Signal) { c.cmd.Process.Signal(s) }

// stop asks the child to end (SIGTERM), then kills it after a grace period.
func (c *child) stop() {
	c.signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// killChildren kills every child still running (Ctrl-C, errors).
func killChildren() {
	children.Lock()
	cs := make([]*child, 0, len(children.m))
	for c := range children.m {
		cs = append(cs, c)
	}
	children.Unlock()
	for _, c := range cs {
		c.cmd.Process.Kill()
		<-c.done
	}
}

func decodeLine[T any](ctx context.Context, c *child, timeout time.Duration) (T, error) {
	var v T
	l, err := c.line(ctx, timeout)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal([]byte(l), &v); err != nil {
		return v, fmt.Errorf("%s: %q: %w", c.name, l, err)
	}
	return v, nil
}

// Run runs the comparison: for each back-plane it builds the topology,
// and for each size starts the nodes and measures the throughput phase
// and the latency phase. It always removes the topology.
//
// With rc.Machine, the run is this machine's part of a cluster with one
// node per machine (see Machine): at rank 0 the rows are the cluster's,
// elsewhere this machine's parts; the first failure on any machine ends
// the run on every machine.
func Run(ctx context.Context, rc RunConfig) ([]Row, error) {
	var rows []Row
	if m := rc.Machine; m != nil {
		if err := m.connect(ctx); err != nil {
			return nil, err
		}
		defer m.close()
	}
	for _, bp := range rc.Backplanes {
		n := rc.Nodes
		if bp == "none" {
			n = 1
		}
		var topo *Topology
		var err error
		if m := rc.Machine; m != nil {
			topo, err = BuildMachineTopology(m.Rank, n)
		} else {
			topo, err = BuildTopology(n)
		}
		if err != nil {
			_, err = rc.Machine.meet(ctx, "row", nil, err) // the others stop too
			return rows, err
		}
		dir := "" // where the NTB back-plane's emulated bridges live
		if rc.Machine == nil {
			if dir, err = os.MkdirTemp("/dev/shm", shmPrefix()); err != nil {
				topo.Remove()
				return rows, err
			}
		}
		var abort error
		for _, size := range rc.Sizes {
			if ctx.Err() != nil {
				break
			}
			row := Row{Backplane: bp, Nodes: n, Size: size, Settings: rc.Tuned.For(bp, size, rc.Defaults)}
			err := runOne(ctx, rc, topo, dir, &row)
			killChildren()
			if m := rc.Machine; m != nil {
				parts, merr := m.meet(ctx, "row", &row, err)
				if m.Rank == 0 && merr == nil {
					row = mergeRows(parts)
				}
				err, abort = merr, merr
			}
			if err != nil {
				row.Err = err.Error()
				rc.Log("%s/%d: %v", bp, size, err)
			} else if m := rc.Machine; m != nil && m.Rank > 0 {
				rc.progress("%s/%d: part sent to machine 0", bp, size)
			} else {
				rc.Log("%-12s %5d B: %.3f Mpps %.2f Gb/s loss %.1f%%, latency median %.1f µs p99 %.1f µs",
					bp, size, row.Mpps, row.Gbps, 100*row.Loss, row.MedianUs, row.P99Us)
			}
			rows = append(rows, row)
			if abort != nil {
				break
			}
		}
		if dir != "" {
			os.RemoveAll(dir)
		}
		if err := topo.Remove(); err != nil {
			return rows, err
		}
		if abort != nil {
			return rows, abort
		}
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

func settingsArg(s Settings) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func runOne(ctx context.Context, rc RunConfig, topo *Topology, dir string, row *Row) error {
	n := row.Nodes
	common := []string{"-nodes", strconv.Itoa(n), "-routes", strconv.Itoa(rc.Routes)}
	if m := rc.Machine; m != nil {
		common = append(common, "-addrs", joinAddrs(m.Addrs))
	}
	startNode := func(i int, rejoin bool) (*child, error) {
		args := append([]string{"-role", "node", "-rejoin=" + strconv.FormatBool(rejoin), "-rank", strconv.Itoa(i), "-backplane", row.Backplane,
			"-dir", dir, "-settings", settingsArg(row.Settings)}, common...)
		return startChild(topo, topo.nsNode(i), args...)
	}
	nodes := make([]*child, n) // by rank; nil: on another machine
	for _, i := range topo.Ranks {
		c, err := startNode(i, false)
		if err != nil {
			return err
		}
		nodes[i] = c
	}
	for _, i := range topo.Ranks {
		if l, err := nodes[i].line(ctx, 60*time.Second); err != nil || l != "ready" {
			return fmt.Errorf("node %d: %q %v", i, l, err)
		}
	}
	rc.progress("%s/%d: nodes %v ready", row.Backplane, row.Size, topo.Ranks)
	var ports, macs, ranks, sinkPorts []string
	for _, i := range topo.Ranks {
		ports = append(ports, "g"+strconv.Itoa(i))
		macs = append(macs, inMAC(i).String())
		ranks = append(ranks, strconv.Itoa(i))
		sinkPorts = append(sinkPorts, "s"+strconv.Itoa(i))
	}
	var cpu map[string]float64
	phase := func(rate float64, kill bool) (GenResult, SinkResult, error) {
		sink, err := startChild(topo, topo.nsSink(), "-role", "sink", "-ports", strings.Join(sinkPorts, ","),
			"-settings", settingsArg(row.Settings))
		if err != nil {
			return GenResult{}, SinkResult{}, err
		}
		defer sink.stop()
		if l, err := sink.line(ctx, 20*time.Second); err != nil || l != "ready" {
			return GenResult{}, SinkResult{}, fmt.Errorf("sink: %q %v", l, err)
		}
		if _, err := rc.Machine.meet(ctx, "ready", nil, nil); err != nil {
			return GenResult{}, SinkResult{}, err
		}
		rc.progress("%s/%d: every sink ready; generating", row.Backplane, row.Size)
		gen, err := startChild(topo, topo.nsGen(), append([]string{"-role", "gen", "-ports", strings.Join(ports, ","),
			"-ranks", strings.Join(ranks, ","), "-macs", strings.Join(macs, ","), "-size", strconv.Itoa(row.Size), "-rate", fmt.Sprint(rate),
			"-duration", rc.Duration.String(), "-bad", strconv.Itoa(rc.Bad)}, common...)...)
		if err != nil {
			return GenResult{}, SinkResult{}, err
		}
		if rc.GenNice != 0 {
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, gen.cmd.Process.Pid, rc.GenNice); err != nil {
				return GenResult{}, SinkResult{}, fmt.Errorf("generator's nice value: %w", err)
			}
		}
		pids := map[string]int{"sink": sink.cmd.Process.Pid}
		for _, i := range topo.Ranks {
			pids["node"+strconv.Itoa(i)] = nodes[i].cmd.Process.Pid
		}
		meter := measure.NewCPUMeter(pids)
		if kill && rc.Kill >= 0 && rc.Kill < n && nodes[rc.Kill] != nil {
			time.Sleep(rc.Duration / 3)
			rc.Log("killing node %d", rc.Kill)
			nodes[rc.Kill].cmd.Process.Kill()
			<-nodes[rc.Kill].done
			time.Sleep(rc.Duration / 6)
			rc.Log("restarting node %d", rc.Kill)
			if nodes[rc.Kill], err = startNode(rc.Kill, true); err != nil {
				return GenResult{}, SinkResult{}, err
			}
			if l, err := nodes[rc.Kill].line(ctx, 60*time.Second); err != nil || l != "ready" {
				return GenResult{}, SinkResult{}, fmt.Errorf("restarted node %d: %q %v", rc.Kill, l, err)
			}
			rc.Log("node %d is back", rc.Kill)
		}
		g, err := decodeLine[GenResult](ctx, gen, rc.Duration+30*time.Second)
		if err != nil {
			return g, SinkResult{}, err
		}
		<-gen.done
		var genCPU map[string]time.Duration
		if ps := gen.cmd.ProcessState; ps != nil {
			genCPU = map[string]time.Duration{"gen": ps.UserTime() + ps.SystemTime()}
		}
		cpu = meter.Done(genCPU)
		rc.progress("%s/%d: generator done: %d sent in %.2f s", row.Backplane, row.Size, g.Sent, g.Seconds)
		if err := rc.drain(ctx, nodes); err != nil {
			return g, SinkResult{}, err
		}
		sink.signal(syscall.SIGTERM)
		s, err := decodeLine[SinkResult](ctx, sink, 10*time.Second)
		return g, s, err
	}
	g, s, err := phase(rc.Rate, true)
	if err != nil {
		return err
	}
	row.Gen, row.Sink, row.CPU = g, s, cpu
	row.setRates()
	if rc.LatRate > 0 {
		row.LatRate = rc.LatRate
		g, s, err := phase(rc.LatRate, false)
		if err != nil {
			return err
		}
		row.LatSink, row.LatCPU = s, cpu
		row.MedianUs, row.P99Us = s.MedianUs, s.P99Us
		if sent := g.Sent - badTotal(g); sent > 0 {
			row.LatLoss = 1 - float64(s.Received)/float64(sent)
		}
	}
	for _, i := range topo.Ranks {
		nodes[i].signal(syscall.SIGTERM) // all at once: none sees another go first
	}
	for _, i := range topo.Ranks {
		st, err := decodeLine[NodeStats](ctx, nodes[i], 10*time.Second)
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		row.NodeStats = append(row.NodeStats, st)
		<-nodes[i].done
	}
	return nil
}

// setRates derives the throughput phase's rates and loss from its
// generator's and sink's results.
func (r *Row) setRates() {
	g, s := r.Gen, r.Sink
	if g.Seconds > 0 && g.Sent > 0 {
		r.Offered = float64(g.Sent) / g.Seconds / 1e6
		r.Mpps = float64(s.Received) / g.Seconds / 1e6
		r.Gbps = float64(s.Bytes) * 8 / g.Seconds / 1e9
		r.Loss = 1 - float64(s.Received)/float64(g.Sent-badTotal(g))
	}
}

// progress logs a step of a run with one node per machine, where the
// machines' logs are the way to follow it (with the time since the run
// started). A run on one host reports its rows only.
func (rc RunConfig) progress(f string, a ...any) {
	if rc.Machine != nil {
		rc.Log("%s %5.1fs: "+f, append([]any{machineName(rc.Machine.Rank), time.Since(rc.Machine.start).Seconds()}, a...)...)
	}
}

// drain lets what is still queued in the nodes and on the back-plane
// reach the sinks once the generators are done. On one host that is a
// pause. With one node per machine every machine waits for the others'
// generators ("sent"), then until its own nodes are quiet (quiet), then
// for the others' ("quiet"): emulated machines (the Soft-RoCE VMs) lag by
// seconds, which no fixed pause covers without wasting them.
func (rc RunConfig) drain(ctx context.Context, nodes []*child) error {
	if rc.Machine == nil {
		time.Sleep(200 * time.Millisecond)
		return nil
	}
	if _, err := rc.Machine.meet(ctx, "sent", nil, nil); err != nil {
		return err
	}
	if err := quiet(ctx, nodes); err != nil {
		return err
	}
	_, err := rc.Machine.meet(ctx, "quiet", nil, nil)
	return err
}

// quiet waits until the running nodes' counters (NodeStats on SIGUSR1)
// stay the same for quietFor, at most quietMax.
func quiet(ctx context.Context, nodes []*child) error {
	const quietFor, quietMax = 300 * time.Millisecond, 30 * time.Second
	var last [][7]uint64
	for end := time.Now().Add(quietMax); time.Now().Before(end); {
		var now [][7]uint64
		for _, c := range nodes {
			if c == nil {
				continue
			}
			c.signal(syscall.SIGUSR1)
			st, err := decodeLine[NodeStats](ctx, c, 10*time.Second)
			if err != nil {
				return err
			}
			now = append(now, [7]uint64{st.RX, st.Handoff, st.FromPeer, st.TX, st.TXDrop, st.BPDrop, st.PeerDown})
		}
		if slices.Equal(now, last) {
			return nil
		}
		last = now
		time.Sleep(quietFor)
	}
	return nil
}

// joinAddrs formats addresses as the -addrs flag takes them.
func joinAddrs(as []netip.Addr) string {
	var b strings.Builder
	for i, a := range as {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(a.String())
	}
	return b.String()
}

// parseAddrs reads the -addrs flag: IP addresses separated by commas.
func parseAddrs(s string) ([]netip.Addr, error) {
	var as []netip.Addr
	for _, f := range strings.Split(s, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("-addrs: %w", err)
		}
		as = append(as, a)
	}
	return as, nil
}

func badTotal(g GenResult) uint64 {
	var t uint64
	for _, n := range g.Bad {
		t += n
	}
	return t
}
