package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"
)

// Tune is the seed's method: for each back-plane and size it searches the
// packet-I/O parameters one at a time (coordinate descent from the
// defaults: burst size, batch packets, bytes and deadline, spin budget
// against sleeping, queue depth, and UDP GSO on the roce back-plane),
// keeps a value only if it beats the best so far by more than the noise
// margin, reports the best settings and their gain over the defaults, and
// saves them to path for -settings.
//
// Each setting is measured reps times (the median counts), and the winner
// is measured again beside the defaults for the reported gain.
func Tune(ctx context.Context, rc RunConfig, path string, reps int) error {
	reps = max(reps, 1)
	rc.LatRate = 0 // the search maximises throughput
	type knob struct {
		name    string
		batched bool   // only matters on a batched back-plane
		backend string // only matters on this backend ("": any)
		vals    []func(*Settings)
	}
	us := func(d int) Duration { return Duration(time.Duration(d) * time.Microsecond) }
	knobs := []knob{
		{"burst", false, "", []func(*Settings){
			func(s *Settings) { s.Burst = 8 }, func(s *Settings) { s.Burst = 64 }, func(s *Settings) { s.Burst = 128 }}},
		{"batch packets", true, "", []func(*Settings){
			func(s *Settings) { s.BatchPackets = 8 }, func(s *Settings) { s.BatchPackets = 64 }, func(s *Settings) { s.BatchPackets = 128 }}},
		{"batch bytes", true, "", []func(*Settings){
			func(s *Settings) { s.BatchBytes = 4 << 10 }, func(s *Settings) { s.BatchBytes = 32 << 10 }}},
		{"batch deadline", true, "", []func(*Settings){
			func(s *Settings) { s.BatchDeadline = us(2) }, func(s *Settings) { s.BatchDeadline = us(50) }}},
		{"spin", false, "", []func(*Settings){
			func(s *Settings) { s.Spin = -1 }, func(s *Settings) { s.Spin = us(20) }, func(s *Settings) { s.Spin = us(2000) }}},
		{"queue depth", false, "", []func(*Settings){
			func(s *Settings) { s.QueueDepth = 128 }, func(s *Settings) { s.QueueDepth = 1024 }}},
		{"roce gso", false, "roce", []func(*Settings){func(s *Settings) { s.GSO = true }}},
		{"roce xdp", false, "roce", []func(*Settings){func(s *Settings) { s.XDP = true }}},
	}
	const margin = 1.03 // a gain under 3% is noise on a shared host
	tuned, err := loadTuned(path)
	if err != nil {
		tuned = Tuned{}
	}
	var lines []string
	for _, bp := range rc.Backplanes {
		n := rc.Nodes
		if bp == "none" {
			n = 1
		}
		backend, batched := splitBackplane(bp)
		topo, err := BuildTopology(n)
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp("/dev/shm", shmPrefix())
		if err != nil {
			topo.Remove()
			return err
		}
		measure1 := func(size int, s Settings) float64 {
			row := Row{Backplane: bp, Nodes: n, Size: size, Settings: s}
			err := runOne(ctx, rc, topo, dir, &row)
			killChildren()
			if err != nil {
				rc.Log("  %s/%d %+v: %v", bp, size, s, err)
				return 0
			}
			rc.Log("  %s/%d %v: %.3f Mpps", bp, size, s, row.Mpps)
			return row.Mpps
		}
		// measure is the median of reps runs: one run on a shared host is
		// noise.
		measure := func(size int, s Settings) float64 {
			v := make([]float64, reps)
			for i := range v {
				v[i] = measure1(size, s)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		for _, size := range rc.Sizes {
			if ctx.Err() != nil {
				break
			}
			best := rc.Defaults
			base := measure(size, best)
			bestV := base
			for _, k := range knobs {
				if k.batched && !batched || k.backend != "" && k.backend != backend {
					continue
				}
				cur := best
				for _, set := range k.vals {
					if ctx.Err() != nil {
						break
					}
					try := cur
					set(&try)
					if try == cur {
						continue
					}
					if v := measure(size, try); v > bestV*margin {
						best, bestV = try, v
					}
				}
			}
			tuned[tunedKey(bp, size)] = best
			if best != rc.Defaults { // confirm: both again, side by side
				base, bestV = measure(size, rc.Defaults), measure(size, best)
			}
			gain := 0.0
			if base > 0 {
				gain = bestV / base
			}
			l := fmt.Sprintf("%-12s %5d  default %.3f Mpps  tuned %.3f Mpps (%.2fx)  %v", bp, size, base, bestV, gain, best)
			rc.Log("%s", l)
			lines = append(lines, l)
		}
		os.RemoveAll(dir)
		if err := topo.Remove(); err != nil {
			return err
		}
		if err := tuned.save(path); err != nil {
			return err
		}
	}
	fmt.Println("\nbest settings (saved to " + path + "; load with -settings " + path + "):")
	for _, l := range lines {
		fmt.Println(l)
	}
	return ctx.Err()
}
