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
	b := make([]byte, EthHdrLen, EthHdrLen+hdrLen+helloLen)
	PutEthernet(b, dst, src, EtherTypeWeft)
	p := Packet{Type: PtHello, Session: session, Wnd: 16, Nonce: nonce}
	return p.Append(b)
}

// Weft's packet types and flags, and its header and handshake body
// lengths, for tests that speak the wire format by hand.
const (
	PtData, PtAck, PtHello, PtHelloAck, PtFin, PtRefuse = ptData, ptAck, ptHello, ptHelloAck, ptFin, ptRefuse
	PfFirst, PfLast, PfImm, PfNak, PfListener           = pfFirst, pfLast, pfImm, pfNak, pfListener
	HdrLen, HelloLen                                    = hdrLen, helloLen
)

// Packet is one Weft packet (header, handshake body, payload) as a test
// peer writes or reads it.
type Packet struct {
	Type, Flags                      uint8
	Session, PSN, Ack, Wnd, Imm, Dst uint32
	Nonce, Echo                      uint64 // handshake packets only
	Payload                          []byte
	Magic, Version                   uint8 // 0: Weft's
}

// Handshake reports whether p is a hello, hello-ack or refusal (it
// carries a nonce body).
func (p *Packet) Handshake() bool {
	return p.Type == ptHello || p.Type == ptHelloAck || p.Type == ptRefuse
}

// Append appends p's encoding (header, then the body of a handshake
// packet, then the payload) to b.
func (p *Packet) Append(b []byte) []byte {
	n := len(b)
	b = append(b, make([]byte, hdrLen)...)
	putHdr(b[n:], &hdr{typ: p.Type, flags: p.Flags, session: p.Session, psn: p.PSN, ack: p.Ack, wnd: p.Wnd, imm: p.Imm, dst: p.Dst})
	if p.Magic != 0 {
		b[n] = p.Magic
	}
	if p.Version != 0 {
		b[n+1] = p.Version
	}
	if p.Handshake() {
		b = append(b, make([]byte, helloLen)...)
		putHello(b[n+hdrLen:], p.Nonce, p.Echo)
	}
	return append(b, p.Payload...)
}

// ParsePacket decodes the Weft packet b (after the link headers).
func ParsePacket(b []byte) (Packet, bool) {
	var h hdr
	if !getHdr(b, &h) {
		return Packet{}, false
	}
	p := Packet{Type: h.typ, Flags: h.flags, Session: h.session, PSN: h.psn, Ack: h.ack, Wnd: h.wnd, Imm: h.imm, Dst: h.dst}
	b = b[hdrLen:]
	if p.Handshake() {
		if len(b) < helloLen {
			return Packet{}, false
		}
		body := helloBody(b)
		p.Nonce, p.Echo = body.nonce(), body.echo()
		b = b[helloLen:]
	}
	p.Payload = b
	return p, true
}

// QueueDrops returns the frames e's shared queue dropped before they
// reached any endpoint: for no connection, malformed, no buffer.
func QueueDrops(e *Endpoint) (unknown, malformed, noBuffer uint64) { return e.m.drops() }

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
