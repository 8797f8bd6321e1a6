//go:build !linux

package spin

import "runtime"

// cpus is the number of CPUs; only Linux has a machine-wide reading.
var cpus = runtime.NumCPU()

// osReading has no source outside Linux: the process's reading decides
// alone.
func osReading() (int, bool) { return 0, false }
