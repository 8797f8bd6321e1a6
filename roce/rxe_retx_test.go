//go:build rxe

package roce

// Retransmission accounting from a capture of the rxe harness (run.sh -c):
// how many request bytes each requester sent again for every byte it
// delivered, and the NAKs that made it go back.
//
//	WEFT_RXE_ANALYZE=/tmp/rxe.pcap go test -tags rxe -run TestRxeCaptureRetx -v ./roce/

import (
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/roce/wire"
)

// reqFlow identifies the requests of one QP: the requester's address and
// the responder's address and QPN.
type reqFlow struct {
	src, dst netip.Addr
	qpn      uint32
}

func (f reqFlow) String() string { return fmt.Sprintf("%v->%v QP %#x", f.src, f.dst, f.qpn) }

// nakEvent is a NAK or RNR NAK in a capture, with the requester's state
// the capture shows at that moment.
type nakEvent struct {
	at       time.Duration
	syn      wire.Syndrome
	psn      wire.PSN // the PSN the responder expects
	sentPSN  int      // times that PSN was on the wire before the NAK
	inflight int      // PSNs sent beyond the NAK's PSN (the window overrun)
	lastAck  wire.PSN // last PSN positively acknowledged before
}

// goBack is a request packet sent with a PSN below the highest one sent
// before it, that is, a retransmission that starts a go-back-N.
type goBack struct {
	at        time.Duration
	psn       wire.PSN
	inflight  int           // PSNs sent from psn on before this packet
	sinceAck  time.Duration // since the responder's last ACK or NAK
	sinceSent time.Duration // since psn was first sent
	afterNAK  bool          // a NAK for psn came since the last go-back
}

// retxStats sums one requester's traffic.
type retxStats struct {
	packets, retxPackets int // request packets, and those with a PSN already sent
	bytes, retxBytes     int // their payload bytes
	naks, rnrNaks        int
	events               []nakEvent
	goBacks              []goBack
	credits              map[uint8]int // ACK credit codes seen, by code
	lastRetx             wire.PSN      // the last PSN sent again
}

// ratio returns retransmitted payload bytes per delivered (unique) byte,
// or per packet when the requests carry no payload.
func (s *retxStats) ratio() float64 {
	if u := s.bytes - s.retxBytes; u > 0 {
		return float64(s.retxBytes) / float64(u)
	}
	if u := s.packets - s.retxPackets; u > 0 {
		return float64(s.retxPackets) / float64(u)
	}
	return 0
}

func (s *retxStats) String() string {
	return fmt.Sprintf("%d request packets (%d again), %d payload bytes (%d again): %.2f%% retransmitted; %d NAKs, %d RNR NAKs; ACK credit codes %v",
		s.packets, s.retxPackets, s.bytes, s.retxBytes, 100*s.ratio(), s.naks, s.rnrNaks, s.credits)
}

// captureRetx accounts every request flow of a capture. A request packet
// whose PSN its flow already carried counts as retransmitted; NAKs are
// matched to the flow they answer.
func captureRetx(pkts []capPacket) map[reqFlow]*retxStats {
	stats := map[reqFlow]*retxStats{}
	seen := map[reqFlow]map[wire.PSN]int{}
	maxSent := map[reqFlow]wire.PSN{}
	lastAck := map[reqFlow]wire.PSN{}
	lastAckAt := map[reqFlow]time.Duration{}
	firstSent := map[reqFlow]map[wire.PSN]time.Duration{}
	nakPending := map[reqFlow]bool{}
	// qpOf maps a responder's address and the requester's QPN (the
	// destination of the responder's ACKs) to the request flow: the
	// responder's QPN is only in the requests.
	type peerKey struct {
		src, dst netip.Addr
	}
	flowOf := map[peerKey]reqFlow{}
	for i := range pkts {
		p := &pkts[i]
		pkt, err := wire.Parse(p.B)
		if err != nil {
			continue
		}
		c := struct {
			at       time.Duration
			src, dst netip.Addr
			pkt      wire.Packet
		}{p.At, p.Src, p.Dst, pkt}
		op := c.pkt.OpCode()
		psn := c.pkt.BTH.PSN()
		switch {
		case op.IsRequest():
			f := reqFlow{c.src, c.dst, c.pkt.BTH.DestQP()}
			if f.qpn == 1 {
				continue // MADs
			}
			flowOf[peerKey{c.dst, c.src}] = f
			s := stats[f]
			if s == nil {
				s = &retxStats{credits: map[uint8]int{}}
				stats[f] = s
				seen[f] = map[wire.PSN]int{}
				firstSent[f] = map[wire.PSN]time.Duration{}
				maxSent[f] = psn
			}
			if seen[f][psn] > 0 &&
				(len(s.goBacks) == 0 || s.lastRetx.Next() != psn) {
				s.goBacks = append(s.goBacks, goBack{at: c.at, psn: psn, inflight: int(maxSent[f].Sub(psn)) + 1,
					sinceAck: c.at - lastAckAt[f], sinceSent: c.at - firstSent[f][psn], afterNAK: nakPending[f]})
				nakPending[f] = false
			}
			if seen[f][psn] > 0 {
				s.lastRetx = psn
			} else {
				firstSent[f][psn] = c.at
			}
			s.packets++
			s.bytes += len(c.pkt.Payload)
			if seen[f][psn] > 0 {
				s.retxPackets++
				s.retxBytes += len(c.pkt.Payload)
			}
			seen[f][psn]++
			if maxSent[f].Less(psn) {
				maxSent[f] = psn
			}
		case op == wire.OpRCAcknowledge:
			f, ok := flowOf[peerKey{c.src, c.dst}]
			if !ok {
				continue
			}
			s := stats[f]
			syn := c.pkt.AETH.Syndrome()
			lastAckAt[f] = c.at
			switch syn.Type() {
			case wire.AckTypeACK:
				s.credits[syn.CreditCode()]++
				lastAck[f] = psn
			case wire.AckTypeNAK, wire.AckTypeRNRNAK:
				if syn.Type() == wire.AckTypeNAK {
					s.naks++
				} else {
					s.rnrNaks++
				}
				nakPending[f] = true
				s.events = append(s.events, nakEvent{at: c.at, syn: syn, psn: psn, sentPSN: seen[f][psn],
					inflight: int(maxSent[f].Sub(psn)) + 1, lastAck: lastAck[f]})
			}
		}
	}
	return stats
}

// TestRxeCaptureRetx reports the retransmissions of the captures named by
// WEFT_RXE_ANALYZE (comma-separated pcap files).
func TestRxeCaptureRetx(t *testing.T) {
	names := os.Getenv("WEFT_RXE_ANALYZE")
	if names == "" {
		t.Skip("WEFT_RXE_ANALYZE names no capture")
	}
	for _, name := range strings.Split(names, ",") {
		pkts, err := readCapture(name)
		if err != nil {
			t.Fatal(err)
		}
		stats := captureRetx(pkts)
		flows := make([]reqFlow, 0, len(stats))
		for f := range stats {
			flows = append(flows, f)
		}
		sort.Slice(flows, func(i, j int) bool { return flows[i].String() < flows[j].String() })
		t.Logf("%s: %d RoCE packets", name, len(pkts))
		for _, f := range flows {
			s := stats[f]
			t.Logf("  %v: %v", f, s)
			for i, e := range s.events {
				if i == 20 {
					t.Logf("    ... %d more", len(s.events)-i)
					break
				}
				t.Logf("    %v %v PSN %v (sent %d times before), %d PSNs in flight from it, last ACK %v",
					e.at.Round(time.Microsecond), e.syn, e.psn, e.sentPSN, e.inflight, e.lastAck)
			}
			afterNAK := 0
			for _, g := range s.goBacks {
				if g.afterNAK {
					afterNAK++
				}
			}
			t.Logf("    %d go-backs, %d of them after a NAK", len(s.goBacks), afterNAK)
			for i, g := range s.goBacks {
				if i == 40 {
					t.Logf("    ... %d more", len(s.goBacks)-i)
					break
				}
				t.Logf("    %v go back to PSN %v: %d PSNs were in flight from it, first sent %v before, last ACK/NAK %v before, after a NAK %v",
					g.at.Round(time.Microsecond), g.psn, g.inflight, g.sinceSent.Round(time.Microsecond), g.sinceAck.Round(time.Microsecond), g.afterNAK)
			}
		}
	}
}
