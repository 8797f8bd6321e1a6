package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// What saturates is measured, not guessed: each phase records how much CPU
// every process of the run used (in cores: 1.0 is one core busy all the
// time) and how busy the whole host was, from /proc. The host's two cores
// are shared with other work, which shows up as host load beyond the
// run's own.

// procCPU returns the CPU time pid has used (utime+stime), or 0.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	k, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(u+k) * 10 * time.Millisecond // USER_HZ = 100
}

// hostCPU returns the busy and total jiffies of all cores.
func hostCPU() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// cpuMeter measures the CPU use of processes over an interval.
type cpuMeter struct {
	start   time.Time
	pids    map[string]int
	base    map[string]time.Duration
	hb, htt uint64
}

func newCPUMeter(pids map[string]int) *cpuMeter {
	m := &cpuMeter{start: time.Now(), pids: pids, base: map[string]time.Duration{}}
	for k, p := range pids {
		m.base[k] = procCPU(p)
	}
	m.hb, m.htt = hostCPU()
	return m
}

// done returns each process's CPU use in cores, plus "host": the busy
// cores of the whole machine (everything, not only this run).
func (m *cpuMeter) done(extra map[string]time.Duration) map[string]float64 {
	el := time.Since(m.start)
	out := map[string]float64{}
	for k, p := range m.pids {
		out[k] = round2(float64(procCPU(p)-m.base[k]) / float64(el))
	}
	for k, d := range extra {
		out[k] = round2(float64(d) / float64(el))
	}
	b, t := hostCPU()
	if t > m.htt {
		cores := float64(max(countCPUs(), 1))
		out["host"] = round2(float64(b-m.hb) / float64(t-m.htt) * cores)
	}
	return out
}

func countCPUs() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "cpu") && len(l) > 3 && l[3] >= '0' && l[3] <= '9' {
			n++
		}
	}
	return n
}

func round2(x float64) float64 { return float64(int(x*100+0.5)) / 100 }
