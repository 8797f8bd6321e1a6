//go:build rxe

package roce

// Reading the harness's captures (run.sh -c): the CM REQs and REPs on the
// wire, and how many RC request packets each side sent again.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// capPacket is one RoCEv2 packet of a capture: its IPv4 addresses and
// its UDP payload (BTH onward).
type capPacket struct {
	At       time.Duration // since the capture's first packet
	Src, Dst netip.Addr
	B        []byte
}

// readCapture reads the RoCEv2 packets (UDP port 4791 over IPv4 on
// Ethernet) of a classic pcap file, as tcpdump writes it.
func readCapture(path string) ([]capPacket, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 24 {
		return nil, errors.New("capture: short file")
	}
	var bo binary.ByteOrder
	nano := false
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4:
		bo = binary.LittleEndian
	case 0xa1b23c4d:
		bo, nano = binary.LittleEndian, true
	default:
		switch binary.BigEndian.Uint32(b) {
		case 0xa1b2c3d4:
			bo = binary.BigEndian
		case 0xa1b23c4d:
			bo, nano = binary.BigEndian, true
		default:
			return nil, errors.New("capture: not a pcap file")
		}
	}
	if lt := bo.Uint32(b[20:]); lt != 1 {
		return nil, fmt.Errorf("capture: link type %d, want Ethernet", lt)
	}
	var out []capPacket
	var first time.Duration
	for off := 24; off+16 <= len(b); {
		sec, frac := bo.Uint32(b[off:]), bo.Uint32(b[off+4:])
		incl := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+incl > len(b) {
			break
		}
		f := b[off : off+incl]
		off += incl
		at := time.Duration(sec) * time.Second
		if nano {
			at += time.Duration(frac)
		} else {
			at += time.Duration(frac) * time.Microsecond
		}
		if first == 0 {
			first = at
		}
		if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			continue
		}
		ip := f[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 17 || len(ip) < ihl+8 {
			continue
		}
		udp := ip[ihl:]
		if binary.BigEndian.Uint16(udp[2:]) != link.Port {
			continue
		}
		out = append(out, capPacket{At: at - first, Src: netip.AddrFrom4([4]byte(ip[12:16])), Dst: netip.AddrFrom4([4]byte(ip[16:20])),
			B: udp[8:]})
	}
	return out, nil
}

// isRCRequest reports whether op is an RC request (a SEND, RDMA WRITE,
// RDMA READ request or atomic), not a response or acknowledgement.
func isRCRequest(op wire.OpCode) bool {
	switch {
	case op <= wire.OpRCReadRequest, op == wire.OpRCCompareSwap, op == wire.OpRCFetchAdd,
		op == wire.OpRCSendLastWithInvalidate, op == wire.OpRCSendOnlyWithInvalidate:
		return true
	}
	return false
}

// capMAD returns the CM MAD a packet carries (to QP 1), if it does.
func capMAD(p capPacket) (cm.MAD, bool) {
	bth := wire.BTH(p.B)
	if !bth.IsValid() || bth.DestQP() != 1 || len(p.B) < wire.BTHSize+8+cm.MADSize {
		return nil, false
	}
	m, err := cm.ParseMAD(p.B[wire.BTHSize+8 : wire.BTHSize+8+cm.MADSize])
	if err != nil {
		return nil, false
	}
	return m, true
}

// capRetx is a count of one sender's RC request packets.
type capRetx struct {
	Requests, Retransmitted int
}

func (c capRetx) String() string {
	if c.Requests == 0 {
		return "no request packets"
	}
	return fmt.Sprintf("%d of %d request packets retransmitted (%.2f%%)", c.Retransmitted, c.Requests, c.percent())
}

func (c capRetx) percent() float64 {
	return 100 * float64(c.Retransmitted) / float64(max(1, c.Requests))
}

// cmWindow selects the packets of the connections made to one rdma_cm
// port: the QPs their REQs and REPs name, from the first such REQ to the
// last CM message naming one of their communication ids.
type cmWindow struct {
	From, To time.Duration
	QPs      map[netip.Addr]map[uint32]bool // by address: the QPNs of its connections
}

// connWindow finds the window of the connections to rdma_cm port port
// (TCP port space).
func connWindow(pkts []capPacket, port uint16) cmWindow {
	w := cmWindow{From: -1, QPs: map[netip.Addr]map[uint32]bool{}}
	ids := map[uint32]bool{}
	addQP := func(a netip.Addr, qpn uint32) {
		if w.QPs[a] == nil {
			w.QPs[a] = map[uint32]bool{}
		}
		w.QPs[a][qpn] = true
	}
	sid := cm.RDMACMServiceID(cm.PortSpaceTCP, port)
	for _, p := range pkts {
		m, ok := capMAD(p)
		if !ok {
			continue
		}
		d := m.Data()
		switch m.AttrID() {
		case cm.AttrREQ:
			req := cm.REQ(d)
			if req.ServiceID() != sid {
				continue
			}
			if w.From < 0 {
				w.From = p.At
			}
			ids[req.LocalCommID()] = true
			addQP(p.Src, req.LocalQPN())
		case cm.AttrREP:
			rep := cm.REP(d)
			if !ids[rep.RemoteCommID()] {
				continue
			}
			ids[rep.LocalCommID()] = true
			addQP(p.Src, rep.LocalQPN())
		}
		// Every CM message but the REQ and SIDR starts with the sender's
		// and the receiver's communication ids.
		if m.AttrID() != cm.AttrREQ && (ids[binary.BigEndian.Uint32(d)] || ids[binary.BigEndian.Uint32(d[4:])]) {
			w.To = p.At
		}
	}
	return w
}

// retransmissions counts, per sender, the RC request packets of the
// window's connections, and those whose (destination QPN, PSN) the sender
// had sent before: retransmissions.
func retransmissions(pkts []capPacket, w cmWindow) map[netip.Addr]capRetx {
	type key struct {
		dst netip.Addr
		qpn uint32
		psn wire.PSN
	}
	seen := map[key]bool{}
	out := map[netip.Addr]capRetx{}
	for _, p := range pkts {
		if w.From < 0 || p.At < w.From || p.At > w.To {
			continue
		}
		bth := wire.BTH(p.B)
		if !bth.IsValid() || !isRCRequest(bth.OpCode()) || !w.QPs[p.Dst][bth.DestQP()] {
			continue
		}
		c := out[p.Src]
		c.Requests++
		k := key{p.Dst, bth.DestQP(), bth.PSN()}
		if seen[k] {
			c.Retransmitted++
		}
		seen[k] = true
		out[p.Src] = c
	}
	return out
}

// describeCM lists the CM REQs and REPs of a capture with the fields
// that set timeouts and retries, one line each.
func describeCM(pkts []capPacket) []string {
	var out []string
	for _, p := range pkts {
		m, ok := capMAD(p)
		if !ok {
			continue
		}
		switch m.AttrID() {
		case cm.AttrREQ:
			r := cm.REQ(m.Data())
			out = append(out, fmt.Sprintf("%v %v->%v REQ sid %#x qpn %#x: remote CM response timeout %d, local CM response timeout %d, max CM retries %d, "+
				"retry count %d, RNR retry count %d, primary local ACK timeout %d, path MTU %d",
				p.At.Round(time.Millisecond), p.Src, p.Dst, uint64(r.ServiceID()), r.LocalQPN(), r.RemoteCMResponseTimeout(), r.LocalCMResponseTimeout(),
				r.MaxCMRetries(), r.RetryCount(), r.RNRRetryCount(), r.Primary().LocalACKTimeout(), r.PathMTU().Bytes()))
		case cm.AttrREP:
			r := cm.REP(m.Data())
			out = append(out, fmt.Sprintf("%v %v->%v REP qpn %#x: target ACK delay %d, RNR retry count %d",
				p.At.Round(time.Millisecond), p.Src, p.Dst, r.LocalQPN(), r.TargetACKDelay(), r.RNRRetryCount()))
		}
	}
	return out
}

// TestRxeCapture describes a capture named by WEFT_RXE_CAPTURE: its CM
// REQs and REPs, and for WEFT_RXE_CAPTURE_PORT (default 7471) the
// retransmitted request packets per sender.
func TestRxeCapture(t *testing.T) {
	path := os.Getenv("WEFT_RXE_CAPTURE")
	if path == "" {
		t.Skip("set WEFT_RXE_CAPTURE to a capture of run.sh -c")
	}
	pkts, err := readCapture(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range describeCM(pkts) {
		t.Log(l)
	}
	port := uint16(cm.DefaultPort)
	if s := os.Getenv("WEFT_RXE_CAPTURE_PORT"); s != "" {
		fmt.Sscan(s, &port)
	}
	w := connWindow(pkts, port)
	for a, c := range retransmissions(pkts, w) {
		t.Logf("port %d, %v sent %v", port, a, c)
	}
}
