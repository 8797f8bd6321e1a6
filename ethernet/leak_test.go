package ethernet_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// held returns the ids of the BPF programs and maps that this process
// holds through a file descriptor: a program or map, or a bpf_link (which
// holds its program; Weft attaches through links only). Whatever this
// process leaked, it still holds.
func held(t testing.TB) (progs, maps map[uint64]bool) {
	t.Helper()
	progs, maps = map[uint64]bool{}, map[uint64]bool{}
	fds, err := filepath.Glob("/proc/self/fdinfo/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fds {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			switch {
			case err != nil:
			case k == "prog_id":
				progs[id] = true
			case k == "map_id":
				maps[id] = true
			}
		}
	}
	return progs, maps
}

// newWeftProgs returns Weft's programs (named weft_*) loaded now that
// were not in before and that this process holds. The machine may be
// shared, and other processes' tests load Weft's programs too (other
// packages' tests run at the same time): only this process's are
// compared.
func newWeftProgs(t testing.TB, before []ebpf.ProgramID) []ebpf.ProgramID {
	t.Helper()
	var out []ebpf.ProgramID
	mine, _ := held(t)
	for _, id := range progIDs(t) {
		if slices.Contains(before, id) || !mine[uint64(id)] {
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
	_, mine := held(t)
	for _, id := range mapIDs(t) {
		if slices.Contains(before, id) || !mine[uint64(id)] {
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
