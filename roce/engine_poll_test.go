package roce

import (
	"bytes"
	"math"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
)

// TestEngineUnspinWakesPoller checks that when the last caller that
// spins gives up (and blocks), the background poller leaves the nap it
// takes while callers spin at once, to read the blocked caller's packets:
// with a nap of an hour, it must still reach its wait on the link.
func TestEngineUnspinWakesPoller(t *testing.T) {
	e := nappingEngine(t)
	// Two callers spin; the poller naps (for spinNap: no acknowledgement
	// is due).
	e.ackDue.Store(math.MaxInt64)
	e.spinner.Add(2)
	if !testenv.Eventually(testenv.Timeout, func() bool { return pollerNaps(e) }) {
		t.Fatal("the poller never napped while callers spun")
	}
	e.unspin()
	// One still spins: the nap goes on (the token is for the last).
	if len(e.unspun) != 0 {
		t.Fatal("a spinner that was not the last woke the poller")
	}
	e.unspin()
	if !testenv.Eventually(testenv.Timeout, func() bool { return !pollerNaps(e) }) {
		t.Fatal("the poller still naps after the last spinner gave up")
	}
}

// TestEngineSpunWakesForBlocked checks that a caller that gives up
// spinning while another still spins is not left to the poller's nap
// when the other then stops spinning because what it waited for came
// (the last to leave, but not one that blocks): the poller must leave
// the nap for the blocked caller's packets.
func TestEngineSpunWakesForBlocked(t *testing.T) {
	e := nappingEngine(t)
	e.ackDue.Store(math.MaxInt64)
	e.spinner.Add(2)
	if !testenv.Eventually(testenv.Timeout, func() bool { return pollerNaps(e) }) {
		t.Fatal("the poller never napped while callers spun")
	}
	e.unspin() // one gives up and blocks
	e.spun()   // the other, the last, found what it waited for
	if !testenv.Eventually(testenv.Timeout, func() bool { return !pollerNaps(e) }) {
		t.Fatal("the poller still naps, with a caller blocked, after the last spinner left")
	}
}

// nappingEngine starts an engine on a UDP link whose background poller
// naps an hour while callers spin: only a wake-up ends the nap.
func nappingEngine(t *testing.T) *Engine {
	l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	old := spinNap
	spinNap = time.Hour
	e, err := NewEngine(EngineConfig{Link: l}) // copies spinNap
	spinNap = old
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// pollerNaps reports whether the background poller is parked in the nap
// it takes while callers spin (its only select: [select] or [select, N
// minutes]).
func pollerNaps(*Engine) bool {
	return goroutineIn("(*Engine).background", " [select")
}

// goroutineIn reports whether a goroutine whose stack holds fn is in
// state (as runtime.Stack prints it after the goroutine's number).
func goroutineIn(fn, state string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
		if bytes.Contains(g, []byte(fn)) && bytes.Contains(g, []byte(state)) {
			return true
		}
	}
	return false
}

// closeCheckLink is a link whose Close records whether it was called
// while held was set (a poller in the middle of a batch).
type closeCheckLink struct {
	link.Link
	held   atomic.Bool
	closed atomic.Bool
	during atomic.Bool // closed while held
}

func (l *closeCheckLink) Close() error {
	l.during.Store(l.held.Load())
	l.closed.Store(true)
	return l.Link.Close()
}

// TestEngineClosesLinkOutsidePoll checks that Engine.Close closes the
// link under the poll lock, so never while a poller processes a batch:
// an XDPLink lends the batch's frames, in the memory its Close unmaps.
// The test is the poller: it holds the poll lock while Close runs, until
// Close has either closed the link (wrong) or blocked on the lock.
func TestEngineClosesLinkOutsidePoll(t *testing.T) {
	l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	cl := &closeCheckLink{Link: l}
	e, err := NewEngine(EngineConfig{Link: cl})
	if err != nil {
		t.Fatal(err)
	}
	e.pollMu.Lock()
	cl.held.Store(true)
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	if !testenv.Eventually(testenv.Timeout, func() bool { return cl.closed.Load() || closeBlocked() }) {
		t.Fatal("Engine.Close neither closed its link nor waited for the poll lock")
	}
	cl.held.Store(false)
	e.pollMu.Unlock()
	if err := testenv.Recv(t, done, "Engine.Close"); err != nil {
		t.Fatal(err)
	}
	if cl.during.Load() {
		t.Fatal("the engine closed its link while a poller held the poll lock")
	}
}

// closeBlocked reports whether a goroutine is blocked on a mutex inside
// Engine.Close.
func closeBlocked() bool {
	return goroutineIn("roce.(*Engine).Close(", "[sync.Mutex.Lock")
}

// stuckLink takes nothing it is given to write (a ring that never
// drains: a dead peer's, a device queue that no longer empties) until it
// is closed; wrote is closed at the first write.
type stuckLink struct {
	discardLink
	wrote  chan struct{}
	once   sync.Once
	closed atomic.Bool
}

func (l *stuckLink) WriteBatch(pkts []link.Packet) (int, error) {
	l.once.Do(func() { close(l.wrote) })
	if l.closed.Load() {
		return 0, os.ErrClosed
	}
	return 0, nil
}

func (l *stuckLink) Close() error {
	l.closed.Store(true)
	return nil
}

// TestEngineCloseLossyStuck checks that Engine.Close returns while a
// poller writes through a LossyLink whose link takes nothing: Close
// takes the poll lock before it closes the link, so a LossyLink that
// retried its write until the link failed held the lock, and Close
// waited, for ever.
func TestEngineCloseLossyStuck(t *testing.T) {
	sl := &stuckLink{discardLink: discardLink{netip.MustParseAddrPort("127.0.0.1:4791")}, wrote: make(chan struct{})}
	e, err := NewEngine(EngineConfig{Link: link.NewLossyLink(sl, link.LossConfig{Seed: 1})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.Close() })
	e.CM()
	// A DREQ for a connection the engine does not know: its poller
	// answers with a DREP, under the poll lock.
	mad := cm.MAD(make([]byte, cm.MADSize))
	mad.Init(cm.AttrDREQ, 7)
	d := cm.DREQ(mad.Data())
	d.SetLocalCommID(0x1234)
	d.SetRemoteCommID(0x5678)
	injected := make(chan struct{})
	go func() {
		defer close(injected)
		inject(e, netip.MustParseAddr("127.0.0.2"), mad)
	}()
	testenv.Recv(t, sl.wrote, "the DREP's write")
	testenv.Await(t, "Engine.Close", func() { e.Close() })
	testenv.Recv(t, injected, "the poller's return")
}
