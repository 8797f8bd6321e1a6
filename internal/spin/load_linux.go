package spin

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// loadavg is /proc/loadavg, open for the life of the process and read
// with pread at offset 0 (which makes the kernel write it anew); -1 if it
// did not open. It is opened at init, not on first use: a descriptor that
// appeared in the middle of a program's run would read as a leak to the
// leak checks of Weft's tests.
var loadavg = -1

// loadBuf holds one reading of loadavg.
var loadBuf [128]byte

// cpus is the number of CPUs online, which /proc/loadavg's count is
// compared with; runtime.NumCPU if the list does not read (and never
// less).
var cpus = runtime.NumCPU()

func init() {
	if fd, err := unix.Open("/proc/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		loadavg = fd
	}
	if b, err := os.ReadFile("/sys/devices/system/cpu/online"); err == nil {
		cpus = max(cpus, countCPUs(string(b)))
	}
}

// readLoadavg reads /proc/loadavg into loadBuf.
func readLoadavg() ([]byte, bool) {
	if loadavg < 0 {
		return nil, false
	}
	n, err := unix.Pread(loadavg, loadBuf[:], 0)
	if err != nil || n <= 0 {
		return nil, false
	}
	return loadBuf[:n], true
}

// osReading returns the threads running or runnable on the machine, the
// reader included.
func osReading() (int, bool) {
	b, ok := readLoadavg()
	if !ok {
		return 0, false
	}
	return parseRunning(b)
}
