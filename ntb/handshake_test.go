package ntb

import (
	"errors"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
)

// The handshake through the scratchpads is input from the peer: what it
// announces (protocol version, message size, queues, ring size, window)
// is checked before a ring is laid over its window. These tests put a
// peer that speaks the handshake by hand on the far side of a bridge and
// announce values at, one below and one above every bound (issue 29).

// handPeer is side B of a bridge driven by the test: it writes side A's
// scratchpads as a Transport would, with whatever values the test sets.
type handPeer struct {
	t     *testing.T
	d     *ShmDevice
	spads [numSpads]uint32
}

// handBridge opens both sides of a bridge: a Transport with cfg on side
// A, the hand peer on side B, whose inbound window 0 has win bytes
// translated (the window A's rings go to).
func handBridge(t *testing.T, cfg Config, win int) (*Transport, *handPeer) {
	t.Helper()
	a, b := openPair(t, ShmConfig{MemSize: 1 << 20})
	if err := b.MWSetTrans(0, 0, uint64(win)); err != nil {
		t.Fatal(err)
	}
	tr, err := newTransport(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	p := &handPeer{t: t, d: b}
	p.spads[spadVersion] = protoVersion
	p.spads[spadNonce] = 0x5a5a5a5b
	p.spads[spadState] = hsPosted
	return tr, p
}

// announce sets what the peer posts: queues, ring bytes, max message
// bytes and window pages.
func (p *handPeer) announce(queues, ring, maxMsg, winPages uint32) {
	p.spads[spadQueues], p.spads[spadRing], p.spads[spadMaxMsg], p.spads[spadWinPages] = queues, ring, maxMsg, winPages
}

// post writes the peer's scratchpads on side A, the state last.
func (p *handPeer) post() {
	for i, v := range p.spads {
		if i != spadState {
			p.d.PeerSpadWrite(i, v)
		}
	}
	p.d.PeerSpadWrite(spadState, p.spads[spadState])
}

// outcome posts until side A answers: true when A acknowledged the
// peer's parameters (it posted hsReady with the peer's nonce), false when
// it refused them (an EventError naming an incompatible peer). A clears
// its scratchpads when a handshake starts, so the peer posts again and
// again, as a Transport does.
func (p *handPeer) outcome(tr *Transport) (bool, error) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p.post()
		if st, _ := p.d.SpadRead(spadState); st == hsReady {
			if ack, _ := p.d.SpadRead(spadAck); ack == p.spads[spadNonce] {
				return true, nil
			}
		}
		select {
		case ev := <-tr.endpoints()[0].Events():
			if ev.Kind == fabric.EventError && errors.Is(ev.Err, errProtocol) {
				return false, ev.Err
			}
		case <-time.After(200 * time.Microsecond):
		}
	}
	p.t.Fatalf("side A neither acknowledged nor refused the parameters %v within 10 s", p.spads)
	return false, nil
}

// ring8K is side A's configuration in these tests: one 8 KiB ring, and
// the largest message such a ring takes.
var ring8K = Config{RingSize: 8192, MaxMsgSize: 8192/2 - 4*recHdr}

func TestHandshakeBounds(t *testing.T) {
	const mm = 8192/2 - 4*recHdr
	pages := func(queues, ring int) uint32 { return uint32((ringsOff + queues*ring) / 4096) }
	for _, c := range []struct {
		name                 string
		queues, ring, maxMsg uint32
		winPages             uint32
		version              uint32
		ok                   bool
	}{
		{"AsOurs", 1, 8192, mm, pages(1, 8192), protoVersion, true},
		{"VersionAbove", 1, 8192, mm, pages(1, 8192), protoVersion + 1, false},
		{"VersionBelow", 1, 8192, mm, pages(1, 8192), protoVersion - 1, false},
		{"MaxMsgBelow", 1, 8192, mm - 1, pages(1, 8192), protoVersion, false},
		{"MaxMsgAbove", 1, 8192, mm + 1, pages(1, 8192), protoVersion, false},
		{"NoQueues", 0, 8192, mm, pages(1, 8192), protoVersion, false},
		{"MaxQueues", maxQueues, 8192, mm, pages(maxQueues, 8192), protoVersion, true},
		{"QueuesAboveMax", maxQueues + 1, 8192, mm, pages(maxQueues+1, 8192), protoVersion, false},
		{"RingBelowMin", 1, 4096, mm, pages(1, 8192), protoVersion, false},
		{"RingNotPages", 1, 8192 + 2048, mm, pages(1, 12288), protoVersion, false},
		{"RingAboveMin", 1, 12288, mm, pages(1, 12288), protoVersion, true},
		{"WindowOnePageShort", 1, 8192, mm, pages(1, 8192) - 1, protoVersion, false},
		{"WindowOnePageOver", 1, 8192, mm, pages(1, 8192) + 1, protoVersion, true},
		{"WindowShortOfQueues", 2, 8192, mm, pages(2, 8192) - 1, protoVersion, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, p := handBridge(t, ring8K, 1<<20)
			p.announce(c.queues, c.ring, c.maxMsg, c.winPages)
			p.spads[spadVersion] = c.version
			ok, err := p.outcome(tr)
			if ok != c.ok {
				t.Fatalf("%+v: acknowledged %v (%v), want %v", c, ok, err, c.ok)
			}
			if tr.Up() {
				t.Fatal("up before the peer acknowledged our nonce")
			}
		})
	}
}

// ready posts the peer's side of step 3 (ready, acknowledging side A's
// current nonce, or another one with stale) until cond holds or d
// passes, and reports whether cond held.
func (p *handPeer) ready(stale bool, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		nonce, _ := p.d.SpadRead(spadNonce)
		p.spads[spadState], p.spads[spadAck] = hsReady, nonce
		if stale {
			p.spads[spadAck] = nonce + 2 // an acknowledgement of another session
		}
		p.post()
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// TestHandshakeWindow: the window the peer announces must be what it
// translated: exactly that goes up, one page more is refused; and the
// session is up only once the peer acknowledged this session's nonce.
func TestHandshakeWindow(t *testing.T) {
	const win = ringsOff + 2*8192
	t.Run("Exact", func(t *testing.T) {
		tr, p := handBridge(t, ring8K, win)
		p.announce(1, 8192, uint32(ring8K.MaxMsgSize), win/4096)
		if ok, err := p.outcome(tr); !ok {
			t.Fatalf("parameters refused: %v", err)
		}
		if !p.ready(false, 10*time.Second, tr.Up) {
			t.Fatal("the transport did not come up within 10 s with a peer that did everything right")
		}
		if len(tr.peerWin) != win {
			t.Fatalf("the peer's window is %d bytes, it translated %d", len(tr.peerWin), win)
		}
	})
	t.Run("OnePageOver", func(t *testing.T) {
		tr, p := handBridge(t, ring8K, win)
		p.announce(1, 8192, uint32(ring8K.MaxMsgSize), win/4096+1)
		if ok, err := p.outcome(tr); !ok {
			t.Fatalf("parameters refused before the window was looked at: %v", err)
		}
		var refused error
		p.ready(false, 10*time.Second, func() bool {
			select {
			case ev := <-tr.endpoints()[0].Events():
				if ev.Kind == fabric.EventError && errors.Is(ev.Err, errProtocol) {
					refused = ev.Err
				}
			default:
			}
			return refused != nil || tr.Up()
		})
		if tr.Up() || refused == nil {
			t.Fatalf("a peer that announced a page more than it translated: up %v, error %v; want a protocol error", tr.Up(), refused)
		}
	})
	t.Run("StaleAck", func(t *testing.T) {
		tr, p := handBridge(t, ring8K, win)
		p.announce(1, 8192, uint32(ring8K.MaxMsgSize), win/4096)
		if ok, err := p.outcome(tr); !ok {
			t.Fatalf("parameters refused: %v", err)
		}
		// 200 ms is a thousand rounds of side A's handshake.
		if p.ready(true, 200*time.Millisecond, tr.Up) {
			t.Fatal("up with a peer that acknowledged another session's nonce")
		}
		if !p.ready(false, 10*time.Second, tr.Up) {
			t.Fatal("the transport did not come up within 10 s once the peer acknowledged its nonce")
		}
	})
}

// TestPeerIncarnationEndsSession: a peer that restarts between two link
// polls (its incarnation changes, its scratchpads still say ready) ends
// the session.
func TestPeerIncarnationEndsSession(t *testing.T) {
	const win = ringsOff + 8192
	tr, p := handBridge(t, ring8K, win)
	p.announce(1, 8192, uint32(ring8K.MaxMsgSize), win/4096)
	if ok, err := p.outcome(tr); !ok {
		t.Fatalf("parameters refused: %v", err)
	}
	if !p.ready(false, 10*time.Second, tr.Up) {
		t.Fatal("the transport did not come up within 10 s")
	}
	ep := tr.endpoints()[0]
	for len(ep.Events()) > 0 {
		<-ep.Events()
	}
	inc := shm.U32(p.d.my, sideIncarn)
	inc.Store(inc.Load() + 2)
	ev := waitEvent(t, ep, fabric.EventLinkDown)
	if !errors.Is(ev.Err, fabric.ErrPeerGone) {
		t.Fatalf("link down after the peer restarted: %v, want ErrPeerGone", ev.Err)
	}
}
