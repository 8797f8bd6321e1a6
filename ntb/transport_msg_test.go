package ntb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// msgRegs are the message registers of a two-sided test bridge, with
// Messenger's semantics: a register written by one side holds its word
// until the other side clears its status bit; a write into a held
// register is refused with ErrMsgBusy and delivers nothing. They outlive
// the devices, as a switch's registers outlive the processes that
// drive it.
type msgRegs struct {
	n   int
	mu  sync.Mutex
	val [2][]uint32 // inbound registers of each side
	sts [2]uint64
}

func newMsgRegs(n int) *msgRegs {
	return &msgRegs{n: n, val: [2][]uint32{make([]uint32, n), make([]uint32, n)}}
}

// msgDev is one side of a bridge that has message registers and no
// scratchpads, as IDT's switches: an emulated shm bridge side with its
// scratchpads hidden (any use of them is counted, and a test fails on
// it), and message registers from a msgRegs both sides share.
type msgDev struct {
	*ShmDevice
	regs      *msgRegs
	spadCalls atomic.Int64
}

func (d *msgDev) SpadCount() int { return 0 }
func (d *msgDev) SpadRead(int) (uint32, error) {
	d.spadCalls.Add(1)
	return 0, fabric.ErrNotSupported
}
func (d *msgDev) SpadWrite(int, uint32) error { d.spadCalls.Add(1); return fabric.ErrNotSupported }
func (d *msgDev) PeerSpadRead(int) (uint32, error) {
	d.spadCalls.Add(1)
	return 0, fabric.ErrNotSupported
}
func (d *msgDev) PeerSpadWrite(int, uint32) error { d.spadCalls.Add(1); return fabric.ErrNotSupported }

func (d *msgDev) MsgCount() int { return d.regs.n }

func (d *msgDev) MsgStatus() uint64 {
	d.regs.mu.Lock()
	defer d.regs.mu.Unlock()
	return d.regs.sts[d.Side()]
}

func (d *msgDev) MsgClear(bits uint64) error {
	d.regs.mu.Lock()
	defer d.regs.mu.Unlock()
	d.regs.sts[d.Side()] &^= bits
	return nil
}

func (d *msgDev) MsgRead(idx int) (uint32, error) {
	if idx < 0 || idx >= d.regs.n {
		return 0, fmt.Errorf("message register %d of %d: %w", idx, d.regs.n, fabric.ErrBounds)
	}
	d.regs.mu.Lock()
	defer d.regs.mu.Unlock()
	return d.regs.val[d.Side()][idx], nil
}

func (d *msgDev) PeerMsgWrite(idx int, v uint32) error {
	if idx < 0 || idx >= d.regs.n {
		return fmt.Errorf("message register %d of %d: %w", idx, d.regs.n, fabric.ErrBounds)
	}
	p := 1 - d.Side()
	d.regs.mu.Lock()
	defer d.regs.mu.Unlock()
	if d.regs.sts[p]&(1<<idx) != 0 {
		return fmt.Errorf("message register %d: %w", idx, ErrMsgBusy)
	}
	d.regs.val[p][idx] = v
	d.regs.sts[p] |= 1 << idx
	return nil
}

var _ Messenger = (*msgDev)(nil)

// msgBridge is the file and the registers of one test bridge.
type msgBridge struct {
	path string
	regs *msgRegs
	sc   ShmConfig
}

func newMsgBridge(t testing.TB, nregs int) *msgBridge {
	return &msgBridge{path: filepath.Join(t.TempDir(), "bridge"), regs: newMsgRegs(nregs), sc: ShmConfig{MemSize: 4 << 20}}
}

// open attaches a side of the bridge.
func (br *msgBridge) open() (*msgDev, error) {
	d, err := OpenShm(br.path, br.sc)
	if err != nil {
		return nil, err
	}
	return &msgDev{ShmDevice: d, regs: br.regs}, nil
}

// dial attaches a side and brings a transport up over it: its endpoint
// 0, whose Close closes the transport and the device.
func (br *msgBridge) dial(ctx context.Context, tc Config) (*Endpoint, error) {
	d, err := br.open()
	if err != nil {
		return nil, err
	}
	tr, err := Dial(ctx, d, tc)
	if err != nil {
		d.Close()
		return nil, err
	}
	if _, ok := tr.ctl.(*msgCtrl); !ok {
		tr.Close()
		return nil, fmt.Errorf("the transport runs over %T, not message registers", tr.ctl)
	}
	ep := tr.endpoints()[0]
	ep.owner, ep.addr = true, br.path
	return ep, nil
}

// msgPair opens both sides of a fresh message-register bridge.
func msgPair(t testing.TB, nregs int, tc Config) (a, b *Endpoint, br *msgBridge) {
	t.Helper()
	br = newMsgBridge(t, nregs)
	a, b = fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, _ fabrictest.Side) (*Endpoint, error) {
		return br.dial(ctx, tc)
	})
	t.Cleanup(func() {
		for _, ep := range []*Endpoint{a, b} {
			if n := ep.t.dev.(*msgDev).spadCalls.Load(); n != 0 {
				t.Errorf("the transport used scratchpads %d times on a bridge without them", n)
			}
		}
	})
	return a, b, br
}

// TestMsgRegs checks the test bridge's registers against Messenger's
// contract, which the transport's tests rely on.
func TestMsgRegs(t *testing.T) {
	br := newMsgBridge(t, 4)
	a, err := br.open()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := br.open()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.PeerMsgWrite(2, 7); err != nil {
		t.Fatal(err)
	}
	if err := a.PeerMsgWrite(2, 8); !errors.Is(err, ErrMsgBusy) {
		t.Fatalf("a write into a full register: %v, want ErrMsgBusy", err)
	}
	if st := b.MsgStatus(); st != 1<<2 {
		t.Fatalf("status %#x, want %#x", st, 1<<2)
	}
	if v, _ := b.MsgRead(2); v != 7 {
		t.Fatalf("read %d, want 7 (the refused write must not overwrite)", v)
	}
	if a.MsgStatus() != 0 {
		t.Fatal("a message to B set A's status")
	}
	b.MsgClear(1 << 2)
	if err := a.PeerMsgWrite(2, 8); err != nil {
		t.Fatalf("a write after the clear: %v", err)
	}
	if v, _ := b.MsgRead(2); v != 8 {
		t.Fatalf("read %d, want 8", v)
	}
	if _, err := b.MsgRead(4); !errors.Is(err, fabric.ErrBounds) {
		t.Fatalf("MsgRead(4) of 4: %v", err)
	}
}

// TestCtrlChoice: the channel is chosen at attach: scratchpads when the
// device has enough (the wire behaviour of every existing peer), even if
// it also has message registers; message registers otherwise; and a
// typed refusal for a device with neither.
func TestCtrlChoice(t *testing.T) {
	a, b := openPair(t, ShmConfig{MemSize: 1 << 20})
	_ = b
	regs := newMsgRegs(4)
	withBoth := spadsAndMsgs{a, &msgDev{ShmDevice: a, regs: regs}}
	if c, err := newCtrl(withBoth); err != nil || fmt.Sprintf("%T", c) != "ntb.spadCtrl" {
		t.Fatalf("scratchpads and message registers: %T, %v; want the scratchpads", c, err)
	}
	if c, err := newCtrl(&msgDev{ShmDevice: a, regs: regs}); err != nil || fmt.Sprintf("%T", c) != "*ntb.msgCtrl" {
		t.Fatalf("message registers only: %T, %v; want the message registers", c, err)
	}
	if _, err := newCtrl(&msgDev{ShmDevice: a, regs: newMsgRegs(0)}); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("no message register: %v, want ErrNotSupported", err)
	}
	if _, err := newCtrl(noSpads{a}); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("neither: %v, want ErrNotSupported", err)
	}
	if _, err := newTransport(noSpads{a}, Config{}); !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("Dial over neither: %v, want ErrNotSupported", err)
	}
}

// spadsAndMsgs is a device with scratchpads and message registers.
type spadsAndMsgs struct {
	*ShmDevice
	m *msgDev
}

func (d spadsAndMsgs) MsgCount() int                        { return d.m.MsgCount() }
func (d spadsAndMsgs) MsgStatus() uint64                    { return d.m.MsgStatus() }
func (d spadsAndMsgs) MsgClear(bits uint64) error           { return d.m.MsgClear(bits) }
func (d spadsAndMsgs) MsgRead(idx int) (uint32, error)      { return d.m.MsgRead(idx) }
func (d spadsAndMsgs) PeerMsgWrite(idx int, v uint32) error { return d.m.PeerMsgWrite(idx, v) }

// noSpads is a device with neither scratchpads nor message registers.
type noSpads struct{ *ShmDevice }

func (noSpads) SpadCount() int { return 0 }

// TestMsgConformance runs the conformance suite over a transport whose
// handshake goes over message registers: four each way, as IDT's.
func TestMsgConformance(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b, _ := msgPair(t, 4, Config{})
		return a, b
	})
}

// TestMsgOneRegister: the least the channel takes, one register each
// way, carries the handshake one half-word at a time.
func TestMsgOneRegister(t *testing.T) {
	a, b, _ := msgPair(t, 1, Config{})
	go echoLoop(b)
	echo(t, a, "over one message register")
}

// TestMsgPeerClose: a peer's Close is seen as fabric.ErrPeerClosed, and
// a peer that attaches again renegotiates, several times; a peer that
// goes without Close (its device closed under it) is ErrPeerGone.
func TestMsgPeerClose(t *testing.T) {
	a, b, br := msgPair(t, 4, Config{})
	go echoLoop(b)
	echo(t, a, "first")
	for i := range 3 {
		for len(a.Events()) > 0 {
			<-a.Events()
		}
		b.Close()
		ev := waitEvent(t, a, fabric.EventLinkDown)
		if !errors.Is(ev.Err, fabric.ErrPeerClosed) {
			t.Fatalf("round %d: the peer's Close seen as %v, want ErrPeerClosed", i, ev.Err)
		}
		if _, err := a.Send([]fabric.Message{{}}); !errors.Is(err, fabric.ErrPeerClosed) {
			t.Fatalf("round %d: Send after the peer's Close: %v, want ErrPeerClosed", i, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		nb, err := br.dial(ctx, Config{})
		cancel()
		if err != nil {
			t.Fatalf("round %d: dial again: %v", i, err)
		}
		t.Logf("round %d: re-handshake over message registers took %v", i, time.Since(start))
		b = nb
		defer b.Close()
		go echoLoop(b)
		waitEvent(t, a, fabric.EventLinkUp)
		echo(t, a, "again")
	}
	// Without Close: the device goes, the transport never said why.
	for len(a.Events()) > 0 {
		<-a.Events()
	}
	b.t.dev.(*msgDev).ShmDevice.Close()
	ev := waitEvent(t, a, fabric.EventLinkDown)
	if !errors.Is(ev.Err, fabric.ErrPeerGone) || errors.Is(ev.Err, fabric.ErrPeerClosed) {
		t.Fatalf("a peer gone without Close seen as %v, want ErrPeerGone", ev.Err)
	}
}

// TestMsgStaleRegisters: registers left full by a session that died
// (halves of one of its snapshots, garbage) do not keep a new session
// from coming up.
func TestMsgStaleRegisters(t *testing.T) {
	br := newMsgBridge(t, 4)
	for side := range 2 {
		for r := range 3 {
			br.regs.val[side][r] = msgHalf(5, spadState, r&1, hsReady)
		}
		br.regs.val[side][3] = 0xffffffff
		br.regs.sts[side] = 0b1111
	}
	a, b := fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, _ fabrictest.Side) (*Endpoint, error) {
		return br.dial(ctx, Config{})
	})
	go echoLoop(b)
	echo(t, a, "over stale registers")
}

// handMsg is side B of a message-register bridge driven by the test,
// facing a Transport on side A.
type handMsg struct {
	t  *testing.T
	d  *msgDev
	tr *Transport
}

func handMsgBridge(t *testing.T, cfg Config) *handMsg {
	t.Helper()
	br := newMsgBridge(t, 4)
	a, err := br.open()
	if err != nil {
		t.Fatal(err)
	}
	b, err := br.open()
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.MWSetTrans(0, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	tr, err := newTransport(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return &handMsg{t: t, d: b, tr: tr}
}

// started waits until side A has started its handshake: its first
// frame is in B's registers, so it cleared its own before.
func (p *handMsg) started() {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.d.MsgStatus()&1 == 0 {
		if time.Now().After(deadline) {
			p.t.Fatal("side A sent nothing within 10 s")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// send writes messages by hand, each into the first register free,
// waiting while all are full; false if side A did not take them within
// 10 s.
func (p *handMsg) send(msgs ...uint32) bool {
	deadline := time.Now().Add(10 * time.Second)
	for _, m := range msgs {
		for r := 0; ; r = (r + 1) % p.d.MsgCount() {
			err := p.d.PeerMsgWrite(r, m)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrMsgBusy) || time.Now().After(deadline) {
				return false
			}
			if r == p.d.MsgCount()-1 {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	return true
}

// snapshot returns the messages of a snapshot of w.
func snapshot(seq uint8, w [numSpads]uint32) []uint32 {
	var m []uint32
	for i, v := range w {
		m = append(m, msgHalf(seq, i, 0, v), msgHalf(seq, i, 1, v))
	}
	return m
}

// refused waits for side A to report a protocol error and returns it.
func (p *handMsg) refused(what string) error {
	p.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-p.tr.endpoints()[0].Events():
			if ev.Kind == fabric.EventError && errors.Is(ev.Err, errProtocol) {
				return ev.Err
			}
		case <-timeout:
			p.t.Fatalf("%s: no protocol error within 10 s", what)
		}
	}
}

// goodWords returns a well-formed snapshot that side A would take.
func goodWords(cfg Config) [numSpads]uint32 {
	var w [numSpads]uint32
	w[spadVersion], w[spadQueues], w[spadRing] = protoVersion, 1, 8192
	w[spadMaxMsg], w[spadWinPages] = uint32(cfg.MaxMsgSize), 256
	w[spadNonce], w[spadState] = 0x5a5a5a5b, hsPosted
	return w
}

// TestMsgHostilePeer: control messages that do not decode, and
// handshake words out of range, get a typed protocol error from side
// A, which neither panics nor stops: it still closes at once
// afterwards.
func TestMsgHostilePeer(t *testing.T) {
	for _, c := range []struct {
		name      string
		msgs      []uint32
		malformed bool // a decode error (ErrMalformed), not a refusal of the words
	}{
		{"NotAMessage", []uint32{0xffffffff}, true},
		{"Zero", []uint32{0}, true},
		{"UnknownKind", []uint32{0x2f << 26}, true},
		{"CloseWithOtherBits", []uint32{msgClose | 1}, true},
		{"WrongVersion", nil, false},
		{"QueuesOutOfRange", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := handMsgBridge(t, ring8K)
			p.started()
			msgs := c.msgs
			if msgs == nil {
				w := goodWords(ring8K)
				if c.name == "WrongVersion" {
					w[spadVersion] = protoVersion + 1
				} else {
					w[spadQueues] = maxQueues + 1
				}
				msgs = snapshot(1, w)
			}
			if !p.send(msgs...) {
				t.Fatal("side A did not take the messages")
			}
			err := p.refused(c.name)
			if c.malformed != errors.Is(err, fabric.ErrMalformed) {
				t.Fatalf("%v: malformed %v, want %v", err, !c.malformed, c.malformed)
			}
			closeBounded(t, p.tr)
		})
	}
}

// closeBounded closes tr and fails if that takes longer than 10 s.
func closeBounded(t *testing.T, tr *Transport) {
	t.Helper()
	done := make(chan struct{})
	go func() { tr.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s")
	}
}

// TestMsgFlood: a peer that writes garbage into every register as fast
// as it can gets a protocol error and does not hold side A: its Close
// still returns, with the flood going on.
func TestMsgFlood(t *testing.T) {
	p := handMsgBridge(t, ring8K)
	p.started()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint32(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Halves of snapshots that never end, and garbage.
			p.d.PeerMsgWrite(int(i%4), msgHalf(uint8(i), int(i%8), int(i/8%2), i))
			if i%3 == 0 {
				p.d.PeerMsgWrite(int(i/3%4), i*0x9e3779b9)
			}
		}
	}()
	p.refused("flood")
	closeBounded(t, p.tr)
	close(stop)
	wg.Wait()
}

// scriptMsg is a Messenger whose outbound registers the test reads:
// it refuses the writes that find a register full.
type scriptMsg struct {
	n    int
	full uint64
	val  []uint32
	busy int // ErrMsgBusy returned
	in   []uint32
	sts  uint64
}

func (s *scriptMsg) MsgCount() int                 { return s.n }
func (s *scriptMsg) MsgStatus() uint64             { return s.sts }
func (s *scriptMsg) MsgClear(bits uint64) error    { s.sts &^= bits; return nil }
func (s *scriptMsg) MsgRead(i int) (uint32, error) { return s.in[i], nil }
func (s *scriptMsg) PeerMsgWrite(i int, v uint32) error {
	if s.full&(1<<i) != 0 {
		s.busy++
		return ErrMsgBusy
	}
	s.full |= 1 << i
	s.val[i] = v
	return nil
}

// take is the peer taking every message there: the halves into got.
func (s *scriptMsg) take(t *testing.T, got *[msgHalves]uint16) (closed bool) {
	for i := range s.n {
		if s.full>>i&1 == 0 {
			continue
		}
		cl, _, place, v, err := decodeMsg(s.val[i])
		if err != nil {
			t.Fatal(err)
		}
		if cl {
			closed = true
		} else {
			got[place] = v
		}
	}
	s.full = 0
	return closed
}

// TestMsgSender: every half of the words a side posts reaches the peer,
// whatever number of writes the peer refuses while it holds its
// registers.
func TestMsgSender(t *testing.T) {
	for _, n := range []int{1, 3, 4, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := &scriptMsg{n: n, val: make([]uint32, n)}
			a, _ := openPair(t, ShmConfig{MemSize: 1 << 20})
			c := newMsgCtrl(a, s)
			var w [numSpads]uint32
			for i := range w {
				w[i] = uint32(0x10001 * (i + 1))
			}
			c.post(&w)
			var got [msgHalves]uint16
			for round := 0; !c.idle() || s.full != 0; round++ {
				if round > 100 {
					t.Fatal("the snapshot did not go out in 100 rounds")
				}
				c.poll() // refused: the peer still holds its registers
				s.take(t, &got)
			}
			for i, v := range w {
				if uint32(got[2*i])|uint32(got[2*i+1])<<16 != v {
					t.Fatalf("word %d: the peer got %#x %#x, want %#x", i, got[2*i+1], got[2*i], v)
				}
			}
			if s.busy == 0 {
				t.Fatal("no write was refused: the test does not test the retry")
			}
		})
	}
}

// TestMsgNoMixing: the peer's words change only by a whole snapshot:
// sixteen halves of one number; halves of two snapshots never make
// one, and a snapshot whose halves were lost gives way to the next.
func TestMsgNoMixing(t *testing.T) {
	s := &scriptMsg{n: 4, val: make([]uint32, 4), in: make([]uint32, 4)}
	a, _ := openPair(t, ShmConfig{MemSize: 1 << 20})
	c := newMsgCtrl(a, s)
	deliver := func(msgs []uint32) {
		for len(msgs) > 0 {
			k := copy(s.in, msgs)
			s.sts = 1<<k - 1
			if err := c.poll(); err != nil {
				t.Fatal(err)
			}
			msgs = msgs[k:]
		}
	}
	one, two := goodWords(ring8K), goodWords(ring8K)
	two[spadNonce], two[spadState] = 0x77, hsReady
	s1, s2 := snapshot(1, one), snapshot(2, two)
	// All of snapshot 1 but its last half, then snapshot 2's last half.
	deliver(append(append([]uint32{}, s1[:msgHalves-1]...), s2[msgHalves-1]))
	if c.get(spadState) != 0 || c.get(spadVersion) != 0 {
		t.Fatalf("halves of two snapshots made one: %x", c.shadow)
	}
	deliver(s2[:msgHalves-1])
	for i, v := range two {
		if c.get(i) != v {
			t.Fatalf("word %d is %#x after the whole of snapshot 2, want %#x", i, c.get(i), v)
		}
	}
	deliver([]uint32{msgClose})
	if c.get(spadState) != hsClosed || c.get(spadNonce) != 0 || c.get(spadVersion) != protoVersion {
		t.Fatalf("after a close: %x", c.shadow)
	}
}

// TestMsgClose: Close sends the close message; a post after it sends
// nothing.
func TestMsgClose(t *testing.T) {
	s := &scriptMsg{n: 4, val: make([]uint32, 4)}
	a, _ := openPair(t, ShmConfig{MemSize: 1 << 20})
	c := newMsgCtrl(a, s)
	c.closing()
	var got [msgHalves]uint16
	if !s.take(t, &got) {
		t.Fatal("closing sent no close message")
	}
	w := goodWords(Config{})
	c.post(&w)
	if s.full != 0 {
		t.Fatal("a post after closing went out")
	}
}

// BenchmarkHandshake is the time from both sides dialling to both being
// up, over scratchpads and over message registers (a functional figure:
// both are emulated in shared memory).
func BenchmarkHandshake(b *testing.B) {
	for _, mode := range []string{"spads", "msgs"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				var x, y *Endpoint
				if mode == "spads" {
					x, y = pair(b, ShmConfig{MemSize: 4 << 20}, Config{})
				} else {
					x, y, _ = msgPair(b, 4, Config{})
				}
				b.StopTimer()
				x.Close()
				y.Close()
				b.StartTimer()
			}
		})
	}
}

// TestMsgGarbageInSession: a message that does not decode, arriving while
// the session is up, ends it with a protocol error; the two sides then
// renegotiate and carry messages again.
func TestMsgGarbageInSession(t *testing.T) {
	a, b, _ := msgPair(t, 4, Config{})
	go echoLoop(b)
	echo(t, a, "before")
	for len(a.Events()) > 0 {
		<-a.Events()
	}
	for len(b.Events()) > 0 {
		<-b.Events()
	}
	// Register 0 is free once A has taken the last of B's handshake.
	// (B's session, up, sends nothing more.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := b.t.dev.(*msgDev).PeerMsgWrite(0, 0xdeadbeef)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrMsgBusy) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	ev := waitEvent(t, a, fabric.EventError)
	if !errors.Is(ev.Err, errProtocol) || !errors.Is(ev.Err, fabric.ErrMalformed) {
		t.Fatalf("garbage in session: %v, want a malformed control message", ev.Err)
	}
	waitEvent(t, a, fabric.EventLinkDown)
	waitEvent(t, a, fabric.EventLinkUp)
	// B renegotiated too; its echo loop ended with its session.
	waitEvent(t, b, fabric.EventLinkUp)
	go echoLoop(b)
	echo(t, a, "after")
}

// TestMsgCloseReordered: a close that lands in a lower register than the
// last halves of a snapshot the peer sent before it (registers are read
// in their order, not the peer's) still says closed: the snapshot does
// not undo it (found by review).
func TestMsgCloseReordered(t *testing.T) {
	s := &scriptMsg{n: 4, val: make([]uint32, 4), in: make([]uint32, 4)}
	a, _ := openPair(t, ShmConfig{MemSize: 1 << 20})
	c := newMsgCtrl(a, s)
	w := goodWords(ring8K)
	w[spadState] = hsReady
	snap := snapshot(9, w)
	for _, m := range snap[:13] { // one register at a time
		s.in[0] = m
		s.sts = 1
		if err := c.poll(); err != nil {
			t.Fatal(err)
		}
	}
	// Register 0 freed; the peer wrote halves 13..15 into registers
	// 1..3, then its close into register 0.
	s.in = []uint32{msgClose, snap[13], snap[14], snap[15]}
	s.sts = 0b1111
	if err := c.poll(); err != nil {
		t.Fatal(err)
	}
	if got := c.get(spadState); got != hsClosed {
		t.Fatalf("state after the peer's close: %d, want hsClosed (%d); nonce %#x", got, hsClosed, c.get(spadNonce))
	}
	// Halves of a snapshot the peer never finished before its close are
	// dropped: the next life's halves, with the same number by chance,
	// do not complete it into a mix of the two.
	c = newMsgCtrl(a, s)
	for _, m := range snap[:13] {
		s.in[0] = m
		s.sts = 1
		if err := c.poll(); err != nil {
			t.Fatal(err)
		}
	}
	s.in[0], s.sts = msgClose, 1
	if err := c.poll(); err != nil {
		t.Fatal(err)
	}
	w2 := goodWords(ring8K)
	w2[spadState] = hsPosted
	for _, m := range snapshot(9, w2)[13:] {
		s.in[0] = m
		s.sts = 1
		if err := c.poll(); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.get(spadState); got != hsClosed {
		t.Fatalf("state %d after three halves of the next life: halves of the closed snapshot were kept and mixed in", got)
	}
}
