package spin

import "runtime/metrics"

// The readings behind the oversubscription verdict (see the package
// documentation). Only the goroutine that holds verdict.mu takes them,
// so their buffers are shared.

// goSamples is the reading of this process's scheduler.
var goSamples = [...]metrics.Sample{
	{Name: "/sched/gomaxprocs:threads"},
	{Name: "/sched/goroutines/running:goroutines"},
	{Name: "/sched/goroutines/runnable:goroutines"},
}

// goReading reads the Ps and the goroutines running and waiting for one;
// ok is false if the runtime lacks the metrics.
func goReading() (procs, running, runnable uint64, ok bool) {
	metrics.Read(goSamples[:])
	for _, s := range goSamples {
		if s.Value.Kind() != metrics.KindUint64 {
			return 0, 0, 0, false
		}
	}
	return goSamples[0].Value.Uint64(), goSamples[1].Value.Uint64(), goSamples[2].Value.Uint64(), true
}

// goOversubscribed is the process's verdict: more goroutines want a P
// than there are Ps.
func goOversubscribed(procs, running, runnable uint64) bool {
	return running+runnable > procs
}

func goOver() bool {
	procs, running, runnable, ok := goReading()
	return ok && goOversubscribed(procs, running, runnable)
}

// osOversubscribed is the machine's verdict: more threads running or
// runnable than CPUs online.
func osOversubscribed(running, cpus int) bool { return running > cpus }

func osOver() bool {
	running, ok := osReading()
	return ok && osOversubscribed(running, cpus)
}

// parseRunning returns the running count of a /proc/loadavg line, the
// number before the slash of its fourth field ("0.61 0.48 0.52 3/215
// 9164").
func parseRunning(b []byte) (int, bool) {
	i, field := 0, 0
	for ; i < len(b) && field < 3; i++ {
		if b[i] == ' ' {
			field++
		}
	}
	n, digits := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9' && digits < 9; i++ {
		n = 10*n + int(b[i]-'0')
		digits++
	}
	if digits == 0 || i >= len(b) || b[i] != '/' {
		return 0, false
	}
	return n, true
}

// countCPUs counts the CPUs of a kernel CPU list ("0-3,8,10-11\n", as in
// /sys/devices/system/cpu/online); 0 if it does not parse.
func countCPUs(list string) int {
	n := 0
	for len(list) > 0 && list[0] != '\n' {
		lo, rest, ok := cpuNumber(list)
		if !ok {
			return 0
		}
		hi := lo
		if len(rest) > 0 && rest[0] == '-' {
			if hi, rest, ok = cpuNumber(rest[1:]); !ok || hi < lo {
				return 0
			}
		}
		n += hi - lo + 1
		if len(rest) > 0 && rest[0] == ',' {
			rest = rest[1:]
		}
		list = rest
	}
	return n
}

// cpuNumber parses the CPU number at the start of s.
func cpuNumber(s string) (int, string, bool) {
	n, i := 0, 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9' && i < 7; i++ {
		n = 10*n + int(s[i]-'0')
	}
	return n, s[i:], i > 0
}
