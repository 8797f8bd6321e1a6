package roce

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// TestGoBackNOnNAK streams messages over RC through links that drop 3% of
// the datagrams each way, and checks who recovered the losses: the
// requester must go back on the responder's PSN-sequence NAKs, and those
// rewinds must carry the recovery, with the retransmission timer left for
// what no NAK can report (a lost NAK, a loss at the end of a burst).
// Timeouts alone also deliver every message, only several times slower:
// without this test a requester that ignored sequence NAKs passed
// everything else.
func TestGoBackNOnNAK(t *testing.T) {
	const n, burst, size = 20_000, 64, 32
	ea, eb, lossy := enginePair(t, 4791, LossConfig{Drop: 0.03, Seed: 11})
	// The timeout (16.8 ms) is far above the loopback round trip, so the
	// timer only fires for losses that nothing else reports.
	a, b, pa, pb := connect(t, ea, eb, QPConfig{SQDepth: 1024}, QPAttr{Timeout: 12, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
	src, _ := pa.RegMR(make([]byte, burst*size), 0)
	dst, _ := pb.RegMR(make([]byte, burst*size), fabric.AccessLocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		msgs := make([]fabric.Message, burst)
		for i := range msgs {
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: i * size, Length: size}}}
		}
		for next := 0; next < n; {
			k, err := b.RecvWait(ctx, msgs)
			if err != nil {
				errc <- err
				return
			}
			for i := 0; i < k; i++ {
				if got := binary.LittleEndian.Uint64(dst.Bytes()[i*size:]); got != uint64(next) {
					errc <- fmt.Errorf("message %d arrived where %d was due", got, next)
					return
				}
				next++
			}
		}
		errc <- nil
	}()
	msgs := make([]fabric.Message, burst)
	for sent := 0; sent < n; {
		k := min(burst, n-sent)
		for i := 0; i < k; i++ {
			binary.LittleEndian.PutUint64(src.Bytes()[i*size:], uint64(sent+i))
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * size, Length: size}}}
		}
		m, err := a.SendWait(ctx, msgs[:k])
		if err != nil {
			t.Fatalf("send at %d: %v (retransmissions %+v)", sent, err, a.retransmissions())
		}
		sent += m
		// The same rule as at the end, checked on the way once the
		// timer has fired often enough to judge: a requester that leaves
		// the recovery to the timer fails here in a fraction of a second
		// rather than after a slow stream.
		if r := a.retransmissions(); r[retxTimeout].rewinds >= 20 && r[retxNAK].rewinds <= 2*r[retxTimeout].rewinds {
			t.Fatalf("after %d messages: %d rewinds on sequence NAKs, %d on timeouts", sent, r[retxNAK].rewinds, r[retxTimeout].rewinds)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var dropped uint64
	for _, l := range lossy {
		dropped += l.Faults().Dropped
	}
	r := a.retransmissions()
	nak, tmo := r[retxNAK], r[retxTimeout]
	t.Logf("%d drops injected; NAK: %d rewinds, %d packets; timeout: %d rewinds, %d packets; stats %+v",
		dropped, nak.rewinds, nak.packets, tmo.rewinds, tmo.packets, a.Stats())
	if dropped == 0 {
		t.Fatal("no datagram was dropped: the test proves nothing")
	}
	if nak.rewinds == 0 || nak.packets == 0 {
		t.Fatalf("no retransmission on a sequence NAK (timeouts: %d rewinds, %d packets)", tmo.rewinds, tmo.packets)
	}
	if nak.packets <= 2*tmo.packets || nak.rewinds <= 2*tmo.rewinds {
		t.Fatalf("sequence NAKs did not carry the recovery: %d rewinds and %d packets on NAKs, %d and %d on timeouts",
			nak.rewinds, nak.packets, tmo.rewinds, tmo.packets)
	}
}
