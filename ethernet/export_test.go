package ethernet

import "github.com/cilium/ebpf"

// SetDropEvery makes the endpoint discard every n-th data packet it
// receives (0: none), to exercise loss recovery.
func SetDropEvery(e *Endpoint, n int) {
	e.mu.Lock()
	e.dropEvery = n
	e.mu.Unlock()
}

// FilterMatches runs f's program on frame with BPF_PROG_TEST_RUN, with
// matches returning XDP_TX instead of redirecting, and reports whether
// the frame matched.
func FilterMatches(f Filter, frame []byte) (bool, error) {
	ins, err := f.instructions(0, 3)
	if err != nil {
		return false, err
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, Instructions: ins, License: "Dual MIT/GPL"})
	if err != nil {
		return false, err
	}
	defer p.Close()
	buf := make([]byte, max(len(frame), 14))
	copy(buf, frame)
	ret, err := p.Run(&ebpf.RunOptions{Data: buf[:len(frame)]})
	if err != nil {
		return false, err
	}
	return ret == 3, nil
}
