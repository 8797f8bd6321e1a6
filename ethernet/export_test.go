package ethernet

import (
	"net"

	"github.com/cilium/ebpf"
)

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

// HelloFrame returns a raw-Ethernet hello frame from src to dst, as a
// dialer's first packet: connection id session, nonce, no destination
// id.
func HelloFrame(dst, src net.HardwareAddr, session uint32, nonce uint64) []byte {
	b := make([]byte, EthHdrLen+hdrLen+helloLen)
	PutEthernet(b, dst, src, EtherTypeWeft)
	putHdr(b[EthHdrLen:], &hdr{typ: ptHello, session: session, wnd: 16})
	putHello(b[EthHdrLen+hdrLen:], nonce, 0)
	return b
}

// StallRX holds the RX ring of e's queue undrained, as a descheduled
// drainer would, until release is called.
func StallRX(e *Endpoint) (release func()) {
	e.m.rxMu.Lock()
	return e.m.rxMu.Unlock
}

// HoldTicks keeps e's timer goroutine, and every caller of e, from
// running, as goroutines the scheduler has not yet run would be, until
// release is called. Frames for e still queue in its inbox.
func HoldTicks(e *Endpoint) (release func()) {
	e.mu.Lock()
	return e.mu.Unlock
}
