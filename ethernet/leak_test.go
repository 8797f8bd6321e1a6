package ethernet_test

import (
	"errors"
	"os"
	"slices"
	"strings"
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

// mapIDs lists the ids of every BPF map.
func mapIDs(t testing.TB) []ebpf.MapID {
	t.Helper()
	var ids []ebpf.MapID
	id := ebpf.MapID(0)
	for {
		next, err := ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return ids
		}
		if err != nil {
			t.Fatalf("enumerate maps: %v", err)
		}
		ids = append(ids, next)
		id = next
	}
}

// newWeftProgs returns Weft's programs (named weft_*) loaded now that
// were not in before. The machine may be shared, so other programs come
// and go: only Weft's are compared.
func newWeftProgs(t testing.TB, before []ebpf.ProgramID) []ebpf.ProgramID {
	t.Helper()
	var out []ebpf.ProgramID
	for _, id := range progIDs(t) {
		if slices.Contains(before, id) {
			continue
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err == nil && strings.HasPrefix(info.Name, "weft_") {
			out = append(out, id)
		}
	}
	return out
}

// newWeftMaps is newWeftProgs for maps.
func newWeftMaps(t testing.TB, before []ebpf.MapID) []ebpf.MapID {
	t.Helper()
	var out []ebpf.MapID
	for _, id := range mapIDs(t) {
		if slices.Contains(before, id) {
			continue
		}
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		info, err := m.Info()
		m.Close()
		if err == nil && strings.HasPrefix(info.Name, "weft_") {
			out = append(out, id)
		}
	}
	return out
}
