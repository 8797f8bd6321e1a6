package measure

import (
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// What saturates is measured, not guessed: a tool records how much CPU
// each of its processes used over a phase (in cores: 1.0 is one core busy
// all the time) and how busy the whole host was, from /proc. The hosts are
// shared with other work, which shows up as host load beyond the run's
// own, or as a CPU share well below 1 for a process that spins.

// ProcessCPU returns the CPU time the calling process has used (user and
// system).
func ProcessCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Share measures the CPU share of the calling process over a phase: CPU
// time over wall time. For a process that spins, a share well below 1
// means the host took the CPU away (other load).
type Share struct {
	cpu  time.Duration
	wall time.Time
}

// StartShare starts a phase.
func StartShare() Share { return Share{ProcessCPU(), time.Now()} }

// End returns the process's CPU share since StartShare.
func (s Share) End() float64 {
	w := time.Since(s.wall)
	if w <= 0 {
		return 0
	}
	return float64(ProcessCPU()-s.cpu) / float64(w)
}

// ProcCPU returns the CPU time process pid has used (utime+stime, from
// /proc/PID/stat), or 0.
func ProcCPU(pid int) time.Duration {
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

// HostCPU returns the busy and total jiffies of all cores, from
// /proc/stat (idle and iowait are not busy).
func HostCPU() (busy, total uint64) {
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

// CountCPUs returns the number of CPUs /proc/stat lists, or 0.
func CountCPUs() int {
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

// CPUMeter measures the CPU use of processes, by name, over an interval.
type CPUMeter struct {
	start   time.Time
	pids    map[string]int
	base    map[string]time.Duration
	hb, htt uint64
}

// NewCPUMeter starts measuring the processes pids names.
func NewCPUMeter(pids map[string]int) *CPUMeter {
	m := &CPUMeter{start: time.Now(), pids: pids, base: map[string]time.Duration{}}
	for k, p := range pids {
		m.base[k] = ProcCPU(p)
	}
	m.hb, m.htt = HostCPU()
	return m
}

// Done returns each process's CPU use since NewCPUMeter in cores (to two
// decimals), the CPU times in extra (measured elsewhere, such as a
// process's own ProcessCPU) over the same interval, plus "host": the busy
// cores of the whole machine (everything, not only these processes).
func (m *CPUMeter) Done(extra map[string]time.Duration) map[string]float64 {
	el := time.Since(m.start)
	out := map[string]float64{}
	for k, p := range m.pids {
		out[k] = round2(float64(ProcCPU(p)-m.base[k]) / float64(el))
	}
	for k, d := range extra {
		out[k] = round2(float64(d) / float64(el))
	}
	b, t := HostCPU()
	if t > m.htt {
		cores := float64(max(CountCPUs(), 1))
		out["host"] = round2(float64(b-m.hb) / float64(t-m.htt) * cores)
	}
	return out
}

func round2(x float64) float64 { return float64(int(x*100+0.5)) / 100 }
