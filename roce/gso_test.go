package roce

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/link"
)

// TestGSO streams messages of several sizes (one packet, several equal
// ones, a short last one) between engines with gso=1 over loopback, where
// the kernel hands the GSO super-packets over whole: every message must
// arrive intact and in order, no ICRC may fail (the segments' ICRCs are
// fixed up for the identifications 0, 1, 2, ... and the receiver finds
// them), and the super-packets must really have been used.
func TestGSO(t *testing.T) {
	a, b := rcPair(t, "gso=1&mtu=1024&keepalive=0")
	const n = 3000
	sizes := []int{64, 1024, 4096, 5000, 8, 3 * 1024}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, _ := a.Alloc(16*8192, 0)
	dst, _ := b.Alloc(16*8192, fabric.AccessLocalWrite)
	errc := make(chan error, 1)
	go func() {
		msgs := make([]fabric.Message, 16)
		for i := range msgs {
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: i * 8192, Length: 8192}}}
		}
		for next := 0; next < n; {
			k, err := b.RecvWait(ctx, msgs)
			if err != nil {
				errc <- err
				return
			}
			for i := 0; i < k; i++ {
				m := dst.Bytes()[i*8192:]
				if want := sizes[next%len(sizes)]; msgs[i].Len != want || binary.LittleEndian.Uint32(m) != uint32(next) || m[want-1] != byte(next) {
					errc <- fmt.Errorf("message %d: %d bytes, number %d, last byte %d", next, msgs[i].Len, binary.LittleEndian.Uint32(m), m[msgs[i].Len-1])
					return
				}
				next++
			}
		}
		errc <- nil
	}()
	msgs := make([]fabric.Message, 16)
	for sent := 0; sent < n; {
		k := min(16, n-sent)
		for i := 0; i < k; i++ {
			size := sizes[(sent+i)%len(sizes)]
			buf := src.Bytes()[i*8192 : i*8192+size]
			binary.LittleEndian.PutUint32(buf, uint32(sent+i))
			buf[size-1] = byte(sent + i)
			msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * 8192, Length: size}}}
		}
		m, err := a.SendWait(ctx, msgs[:k])
		if err != nil {
			t.Fatal(err)
		}
		// The sender's buffers are copied (inline) or must wait for the
		// completion: wait for the queue to drain before reusing them.
		sent += m
		a.qp.drain(10 * time.Second)
	}
	if err := testenv.Recv(t, errc, "the receiver"); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []*Endpoint{a, b} {
		st := ep.qp.e.Stats()
		gso, gro := ep.qp.e.link.(*link.UDPLink).Segments()
		t.Logf("%s: checksum drops %d, datagrams sent in GSO messages %d, received in GRO messages %d, retransmits %d",
			ep.qp.e.LocalAddr(), st.Drops[fabric.DropChecksum], gso, gro, ep.Stats().Retransmits)
		if st.Drops[fabric.DropChecksum] != 0 {
			t.Errorf("%s: %d ICRC failures", ep.qp.e.LocalAddr(), st.Drops[fabric.DropChecksum])
		}
	}
	gso, _ := a.qp.e.link.(*link.UDPLink).Segments()
	_, gro := b.qp.e.link.(*link.UDPLink).Segments()
	if gso == 0 || gro == 0 {
		t.Errorf("no GSO message sent (%d) or no GRO message received (%d)", gso, gro)
	}
}
