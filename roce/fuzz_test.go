package roce

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// discardLink is a Link that drops what is written and never receives:
// the fuzz target feeds packets to the engine directly.
type discardLink struct{ addr netip.AddrPort }

func (l discardLink) ReadBatch([]link.Packet) (int, error)    { return 0, nil }
func (l discardLink) WriteBatch(p []link.Packet) (int, error) { return len(p), nil }
func (l discardLink) WaitRead(context.Context, time.Time) error {
	time.Sleep(time.Millisecond)
	return nil
}
func (l discardLink) LocalAddr() netip.AddrPort { return l.addr }
func (l discardLink) Close() error              { return nil }

// FuzzEngineInput feeds arbitrary datagrams from the connected peer's
// address to an engine with an RC and a UD queue pair and a region with
// every remote permission between two guard areas. Whatever arrives, the
// engine must not panic, and bytes outside the region must not change.
// The harness can point the packet at a QP and fix its ICRC, so the
// fuzzer gets past the parser and the checksum.
func FuzzEngineInput(f *testing.F) {
	e, err := NewEngine(EngineConfig{Link: discardLink{netip.MustParseAddrPort("127.0.0.1:4791")}})
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	pd := e.AllocPD()
	peer := netip.MustParseAddr("127.0.0.2")
	rc, _ := pd.CreateQP(QPConfig{RecvBuffer: 1 << 16, MaxMsgSize: 4096})
	rc.Connect(&QPAttr{PathMTU: 256, Dest: peer, DestQPN: 7, RQPSN: 100, SQPSN: 5, Timeout: 10, RetryCnt: 3})
	ud, _ := pd.CreateQP(QPConfig{Type: UD})
	ud.Connect(&QPAttr{PathMTU: 1024, Dest: peer, DestQPN: 8, QKey: 0x11111111})
	backing := make([]byte, 3*4096)
	region, _ := pd.RegMR(backing[4096:8192], fabric.AccessLocalWrite|fabric.AccessRemote)
	guard := bytes.Clone(backing)

	seed := func(op wire.OpCode, psn wire.PSN, reth bool, payload []byte) []byte {
		f := wire.Fields{BTH: wire.BTHFields{OpCode: op, PKey: 0xffff, DestQP: rc.QPN(), PSN: psn}}
		if reth {
			f.RETH = wire.RETHFields{VA: region.Addr() + 100, RKey: uint32(region.RemoteKey()), DMALength: uint32(len(payload))}
		}
		f.Atomic = wire.AtomicETHFields{VA: region.Addr() + 8, RKey: uint32(region.RemoteKey()), SwapAdd: 1}
		b := make([]byte, 512)
		n, _ := wire.Build(b, &f, payload)
		return b[:n]
	}
	f.Add(byte(3), seed(wire.OpRCSendOnly, 100, false, []byte("hello")))
	f.Add(byte(3), seed(wire.OpRCWriteOnly, 100, true, []byte("data")))
	f.Add(byte(3), seed(wire.OpRCReadRequest, 100, true, nil))
	f.Add(byte(3), seed(wire.OpRCFetchAdd, 100, false, nil))
	f.Add(byte(3), seed(wire.OpRCAcknowledge, 5, false, nil))
	f.Add(byte(3), seed(wire.OpRCSendFirst, 101, false, make([]byte, 256)))
	f.Add(byte(0), []byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, mode byte, data []byte) {
		if len(data) > 4500 {
			return
		}
		pkt := make([]byte, len(data))
		copy(pkt, data)
		if mode&1 != 0 && len(pkt) >= wire.BTHSize {
			qpn := rc.QPN()
			if mode&4 != 0 {
				qpn = ud.QPN()
			}
			wire.BTH(pkt).SetDestQP(qpn)
		}
		if mode&2 != 0 && len(pkt) >= wire.BTHSize+wire.ICRCSize {
			e.sealICRCFrom(pkt, peer, 0xc000)
		}
		p := link.Packet{Buf: pkt, N: len(pkt), Addr: netip.AddrPortFrom(peer, 0xc000), SrcPort: 0xc000}
		func() {
			e.pollMu.Lock()         // the poller's, as the input path's state is
			defer e.pollMu.Unlock() // a panic must not leave it to Engine.Close
			e.input(&p)
		}()
		if !bytes.Equal(backing[:4096], guard[:4096]) || !bytes.Equal(backing[8192:], guard[8192:]) {
			t.Fatal("a packet changed memory outside the registered region")
		}
		// Keep the QPs usable for the next input.
		for _, qp := range []*QP{rc, ud} {
			qp.mu.Lock()
			if qp.state == StateErr {
				qp.resetLocked()
				qp.mu.Unlock()
				if qp == rc {
					qp.Connect(&QPAttr{PathMTU: 256, Dest: peer, DestQPN: 7, RQPSN: 100, SQPSN: 5, Timeout: 10, RetryCnt: 3})
				} else {
					qp.Connect(&QPAttr{PathMTU: 1024, Dest: peer, DestQPN: 8, QKey: 0x11111111})
				}
				continue
			}
			qp.mu.Unlock()
		}
	})
}
