package ethernet_test

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// progIDs lists the ids of every loaded BPF program (cilium/ebpf, no
// bpftool).
func progIDs(t testing.TB) []ebpf.ProgramID {
	t.Helper()
	var ids []ebpf.ProgramID
	id := ebpf.ProgramID(0)
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return ids
		}
		if err != nil {
			t.Fatalf("enumerate programs: %v", err)
		}
		ids = append(ids, next)
		id = next
	}
}
