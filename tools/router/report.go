package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/weft-io/weft/tools/measure"
)

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

func parseMAC(s string) (net.HardwareAddr, error) { return net.ParseMAC(s) }

func printJSON(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

// Report is what router.json holds.
type Report struct {
	Nodes    int      `json:"nodes"`
	Duration string   `json:"duration"`
	LatRate  float64  `json:"lat_rate_pps"`
	Rows     []Row    `json:"rows"`
	Claims   []Claim  `json:"claims"`
	Host     []string `json:"host_notes"`
}

// Claim is one of the seed's claims as measured in this run.
type Claim struct {
	Name   string   `json:"name"`
	Holds  bool     `json:"holds"`
	Ratios []string `json:"ratios"`
	Have   bool     `json:"measured"`
}

func find(rows []Row, bp string, size int) *Row {
	for i := range rows {
		if rows[i].Backplane == bp && rows[i].Size == size && rows[i].Err == "" {
			return &rows[i]
		}
	}
	return nil
}

// claims states the seed's three claims as ratios of this run's rows.
func claims(rows []Row, sizes []int) []Claim {
	a := Claim{Name: "a) RoCE back-plane median latency <= Ethernet's at every size", Holds: true}
	b := Claim{Name: "b) batched RoCE Mpps >= Ethernet's at every size, and >= 3.7x unbatched RoCE at <= 256 B", Holds: true}
	c := Claim{Name: "c) batching adds <= 14 µs to the median latency", Holds: true}
	for _, s := range sizes {
		eth, roce, rb := find(rows, "ethernet", s), find(rows, "roce", s), find(rows, "roce+batch", s)
		if eth != nil && roce != nil && roce.MedianUs > 0 {
			a.Have = true
			a.Ratios = append(a.Ratios, fmt.Sprintf("%d B: ethernet/roce latency %.2fx", s, eth.MedianUs/roce.MedianUs))
			a.Holds = a.Holds && roce.MedianUs <= eth.MedianUs
		}
		if rb != nil && eth != nil && eth.Mpps > 0 {
			b.Have = true
			b.Ratios = append(b.Ratios, fmt.Sprintf("%d B: roce+batch/ethernet %.2fx", s, rb.Mpps/eth.Mpps))
			b.Holds = b.Holds && rb.Mpps >= eth.Mpps
		}
		if rb != nil && roce != nil && roce.Mpps > 0 && s <= 256 {
			b.Ratios = append(b.Ratios, fmt.Sprintf("%d B: roce+batch/roce %.2fx", s, rb.Mpps/roce.Mpps))
			b.Holds = b.Holds && rb.Mpps >= 3.7*roce.Mpps
		}
		if rb != nil && roce != nil && rb.MedianUs > 0 {
			c.Have = true
			d := rb.MedianUs - roce.MedianUs
			c.Ratios = append(c.Ratios, fmt.Sprintf("%d B: +%.1f µs", s, d))
			c.Holds = c.Holds && d <= 14
		}
	}
	for _, cl := range []*Claim{&a, &b, &c} {
		cl.Holds = cl.Holds && cl.Have
	}
	return []Claim{a, b, c}
}

// report prints the table and the claims and writes <out>.json and
// <out>.png.
func report(w io.Writer, rc RunConfig, rows []Row, out string) {
	fmt.Fprintf(w, "\n%d nodes, %v per point; latency at a fixed %.0f packets/s\n", rc.Nodes, rc.Duration, rc.LatRate)
	if rc.Machine != nil {
		fmt.Fprintln(w, "one node per machine: latency and CPU not measured (each machine has its own clock and /proc)")
	}
	fmt.Fprintf(w, "%-12s %5s %9s %8s %7s %10s %9s %s\n", "back-plane", "size", "Mpps", "Gb/s", "loss", "median µs", "p99 µs", "drops (ttl/bad/unroutable/bp/peer-down/tx)")
	for _, r := range rows {
		if r.Err != "" {
			fmt.Fprintf(w, "%-12s %5d  error: %s\n", r.Backplane, r.Size, r.Err)
			continue
		}
		var d [6]uint64
		for _, s := range r.NodeStats {
			d[0] += s.Verdicts[TTLExpired.String()]
			d[1] += s.Verdicts[Malformed.String()] + s.Verdicts[BadSum.String()]
			d[2] += s.Verdicts[Unroutable.String()]
			d[3] += s.BPDrop
			d[4] += s.PeerDown
			d[5] += s.TXDrop
		}
		fmt.Fprintf(w, "%-12s %5d %9.3f %8.3f %6.1f%% %10.1f %9.1f %v\n", r.Backplane, r.Size, r.Mpps, r.Gbps, 100*r.Loss, r.MedianUs, r.P99Us, d)
	}
	var mallocs, pkts uint64
	for _, r := range rows {
		for _, s := range r.NodeStats {
			mallocs += s.Mallocs
			pkts += s.RX + s.FromPeer
		}
	}
	if pkts > 0 {
		fmt.Fprintf(w, "\nheap allocations per packet handled, whole node processes: %.5f (%d in %d)\n", float64(mallocs)/float64(pkts), mallocs, pkts)
	}
	fmt.Fprintf(w, "\nCPU in cores (throughput phase | latency phase); host = all work on the machine, %d cores\n", measure.CountCPUs())
	for _, r := range rows {
		if r.Err == "" {
			fmt.Fprintf(w, "%-12s %5d  %s | %s\n", r.Backplane, r.Size, cpuString(r.CPU), cpuString(r.LatCPU))
		}
	}
	fmt.Fprintln(w, saturation(rows))
	cls := claims(rows, rc.Sizes)
	fmt.Fprintln(w)
	for _, c := range cls {
		verdict := "not reproduced"
		if !c.Have {
			verdict = "not measured (back-plane missing)"
		} else if c.Holds {
			verdict = "reproduced"
		}
		fmt.Fprintf(w, "%s: %s\n    %s\n", c.Name, verdict, strings.Join(c.Ratios, "; "))
	}
	load, _ := os.ReadFile("/proc/loadavg")
	note := fmt.Sprintf("%d cores; load average at the end %s", measure.CountCPUs(), strings.TrimSpace(string(load)))
	fmt.Fprintf(w, "\nhost: %s (the run itself is 3 to 6 processes)\n", note)
	rep := Report{Nodes: rc.Nodes, Duration: rc.Duration.String(), LatRate: rc.LatRate, Rows: rows, Claims: cls, Host: []string{note}}
	if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
		if err := os.WriteFile(out+".json", append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if err := plotRows(out+".png", rows); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
	} else {
		fmt.Fprintf(w, "\nwrote %s.json and %s.png\n", out, out)
	}
}

func cpuString(m map[string]float64) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "%s %.2f ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// saturation says what limited the run, from the CPU measurements: a
// process near a full core is the bottleneck; a host whose cores were all
// busy while the run's processes used less than that was starving them.
func saturation(rows []Row) string {
	var runSum, host, maxProc float64
	maxName, n := "", 0
	for _, r := range rows {
		if r.CPU == nil {
			continue
		}
		n++
		for k, v := range r.CPU {
			if k == "host" {
				host += v
				continue
			}
			runSum += v
			if v > maxProc {
				maxProc, maxName = v, r.Backplane+"/"+strconv.Itoa(r.Size)+" "+k
			}
		}
	}
	if n == 0 {
		return ""
	}
	runSum, host = runSum/float64(n), host/float64(n)
	s := fmt.Sprintf("saturation (throughput phases, mean): the run's processes used %.2f cores together, the host %.2f of %d; busiest process %s at %.2f cores",
		runSum, host, measure.CountCPUs(), maxName, maxProc)
	switch {
	case maxProc > 0.9:
		s += ": that process saturates its core"
	case host > 0.95*float64(measure.CountCPUs()) && runSum < 0.8*host:
		s += fmt.Sprintf(": no process of the run reaches a core; the cores were saturated, %.2f of them by other work, so every process ran on a fraction of a core and queued for it (latency in scheduler time slices)", host-runSum)
	}
	return s
}
