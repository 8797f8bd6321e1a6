//go:build linux

package vnet

import (
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/netns"
)

var (
	flagMeasure = flag.Bool("vnet.measure", false, "run TestMeasure: TCP throughput and round trip over TAP-over-ntb per MTU, beside veth")
	flagRuns    = flag.Int("vnet.runs", 3, "runs per configuration in TestMeasure (the table shows medians)")
	flagMBytes  = flag.Int64("vnet.mbytes", 256, "MiB per throughput run in TestMeasure")
	flagOnly    = flag.String("vnet.only", "", "TestMeasure: only the configurations whose names match this regexp (the first veth is always kept as the reference)")
)

// TestMeasure prints, for each configuration, the median of -vnet.runs
// runs of a TCP stream's throughput and of a 1-byte TCP round trip
// between two namespaces: over TAP devices bridged by an emulated ntb
// bridge at several MTUs, with and without offloads, and over a plain
// veth pair, measured round-robin in the same run so that the shared
// machine's load falls on all alike. Run it with:
//
//	go test -run TestMeasure -v ./vnet/ -args -vnet.measure
func TestMeasure(t *testing.T) {
	if !*flagMeasure {
		t.Skip("a measurement, not a test: run with -args -vnet.measure")
	}
	type config struct {
		name string
		tp   *topo
	}
	var cfgs []config
	for _, mtu := range []int{1500, MaxMTU} {
		a, b := newNamespaces(t)
		if err := a.AddVeth(netns.VethConfig{Name: "weft0", Peer: "weft0", PeerNS: b, MTU: mtu}); err != nil {
			t.Fatal(err)
		}
		tp := &topo{A: a, B: b}
		for _, s := range []struct {
			ns   *netns.NS
			cidr string
		}{{a, "10.77.0.1/24"}, {b, "10.77.0.2/24"}} {
			if err := s.ns.AddAddr("weft0", s.cidr); err != nil {
				t.Fatal(err)
			}
			if err := s.ns.Up("weft0"); err != nil {
				t.Fatal(err)
			}
		}
		tp.ipB = []byte{10, 77, 0, 2}
		cfgs = append(cfgs, config{fmt.Sprintf("veth mtu %d", mtu), tp})
	}
	for _, c := range []struct {
		cfg    Config
		queues int
	}{
		{Config{MTU: 1500}, 1}, {Config{MTU: 9000}, 1}, {Config{MTU: 16000}, 1},
		{Config{MTU: 32000}, 1}, {Config{MTU: 65000}, 1}, {Config{MTU: MaxMTU}, 1},
		{Config{MTU: 1500, Offload: true}, 1}, {Config{MTU: 9000, Offload: true}, 1},
		{Config{MTU: 65000, Offload: true}, 1},
		{Config{MTU: 65000}, 2}, {Config{MTU: 9000, Offload: true}, 2},
	} {
		name := fmt.Sprintf("tap/ntb mtu %d", c.cfg.MTU)
		if c.cfg.Offload {
			name += " +tso/csum"
		}
		if c.queues > 1 {
			name += fmt.Sprintf(" %d queues", c.queues)
		}
		if *flagOnly != "" && !regexp.MustCompile(*flagOnly).MatchString(name) {
			continue
		}
		cfgs = append(cfgs, config{name, newNTBTopo(t, c.cfg, c.queues)})
	}
	n := *flagMBytes << 20
	gbps := make([][]float64, len(cfgs))
	rtts := make([][]time.Duration, len(cfgs))
	port := 6000
	for run := 0; run < *flagRuns; run++ {
		for i, c := range cfgs {
			port++
			d := c.tp.transfer(t, port, n)
			gbps[i] = append(gbps[i], float64(n)*8/d.Seconds()/1e9)
			port++
			rtts[i] = append(rtts[i], c.tp.rtt(t, port, 2000))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nTCP between two namespaces, medians of %d runs (%d MiB streams, 2000 1-byte round trips)\n", *flagRuns, n>>20)
	fmt.Fprintf(&sb, "%-34s %12s %12s %14s %s\n", "path", "Gbit/s", "rtt µs", "vs veth 1500", "runs (Gbit/s)")
	ref := median(gbps[0])
	for i, c := range cfgs {
		g := median(gbps[i])
		fmt.Fprintf(&sb, "%-34s %12.2f %12.1f %13.0f%% %s\n", c.name, g, float64(medianD(rtts[i]).Nanoseconds())/1000, 100*g/ref, fmtRuns(gbps[i]))
	}
	t.Log(sb.String())
	for _, c := range cfgs {
		if c.tp.bA != nil {
			c.tp.checkClean(t)
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianD(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func fmtRuns(v []float64) string {
	var p []string
	for _, x := range v {
		p = append(p, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(p, " ")
}
