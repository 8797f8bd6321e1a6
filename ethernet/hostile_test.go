package ethernet_test

// Hostile peers (issue 29): a raw peer (helpers_test.go) speaks Weft's
// wire format by hand and breaks each rule a peer can break, one at a
// time: forged, stale and misaddressed acknowledgements and handshakes,
// lengths at, one below and one above each bound. Each test checks that
// the endpoint or listener refuses what it must, counts it where it
// says it does, and keeps working for the honest peer.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// strangerMAC is an address on the segment that is no endpoint's peer.
var strangerMAC = net.HardwareAddr{2, 0, 0, 0, 0, 0x66}

// sendMsg sends msg on ep as one message.
func sendMsg(t *testing.T, ep fabric.Endpoint, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := ep.Register([]byte(msg), 0)
	require.NoError(t, err)
	n, err := ep.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}})
	require.NoError(t, err)
	require.Equal(t, 1, n, "sending %q", msg)
}

// recvMsgs receives n messages on ep (5s at most) and returns them.
func recvMsgs(t *testing.T, ep fabric.Endpoint, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	for len(out) < n {
		r, err := ep.Alloc(2048, fabric.AccessLocalWrite)
		require.NoError(t, err)
		m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
		_, err = ep.RecvWait(ctx, m)
		require.NoError(t, err, "waiting for message %d of %d (have %q)", len(out)+1, n, out)
		out = append(out, string(r.Bytes()[:m[0].Len]))
	}
	return out
}

// dataPkt returns the raw peer's data packet psn, a whole message.
func (rp *rawPeer) dataPkt(psn uint32, payload string) ethernet.Packet {
	pk := rp.pkt(ethernet.PtData)
	pk.PSN, pk.Flags, pk.Payload = psn, ethernet.PfFirst|ethernet.PfLast, []byte(payload)
	return pk
}

// ackPkt returns the raw peer's acknowledgement of everything before
// ack, with window wnd.
func (rp *rawPeer) ackPkt(ack, wnd uint32) ethernet.Packet {
	pk := rp.pkt(ethernet.PtAck)
	pk.Ack, pk.Wnd = ack, wnd
	return pk
}

// TestHostileDialHandshake: a dialer's handshake takes only the hello-ack
// that echoes its nonce, from its peer's address; forged, truncated and
// misaddressed handshake packets are dropped and counted, before and
// after the connection is up, and the connection still works.
func TestHostileDialHandshake(t *testing.T) {
	_, rp := newRawTopo(t, false)
	d := rp.startDial("")
	hello := d.hello(rp)
	require.Zero(t, hello.Dst, "a dialer's first hello names no connection")
	require.Zero(t, hello.Echo, "a dialer's first hello echoes no nonce")
	require.NotZero(t, hello.Nonce)
	require.Zero(t, hello.Flags&ethernet.PfListener, "a dial without listener=1 is not flagged for a listener")
	rp.learn(hello)

	// Before the connection is up. Each of these is refused by the
	// endpoint and counted as malformed.
	malformed := 0
	refuse := func(what string, pk ethernet.Packet) {
		t.Logf("malformed: %s", what)
		rp.send(pk)
		malformed++
	}
	pk := rp.pkt(ethernet.PtHelloAck)
	pk.Echo ^= 1
	refuse("hello-ack echoing a nonce the dialer never sent", pk)
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Echo = 0
	refuse("hello-ack echoing no nonce", pk)
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Nonce = 0
	refuse("hello-ack with nonce 0", pk)
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Session = 0
	refuse("hello-ack from connection id 0", pk)
	pk = rp.pkt(ethernet.PtRefuse)
	pk.Echo ^= 1
	refuse("refusal echoing a nonce the dialer never sent", pk)
	pk = rp.pkt(ethernet.PtHello)
	pk.Echo ^= 1
	refuse("hello echoing a nonce the dialer never sent", pk)
	f := rp.frame(rp.pkt(ethernet.PtHelloAck))
	t.Logf("malformed: hello-ack one byte short")
	rp.sendFrame(f[:len(f)-1])
	malformed++
	// From another address: not the peer's, dropped before the
	// handshake sees it.
	rp.sendFrame(rp.frameFrom(strangerMAC, netip.Addr{}, 0, rp.pkt(ethernet.PtHelloAck)))
	// Hellos to connection id 0 that are not for this dialer: from
	// another address, or flagged for a listener. The queue has no
	// listener and counts them as for no connection.
	stranger := ethernet.Packet{Type: ethernet.PtHello, Session: 0x7777, Nonce: 0x8888, Wnd: 64}
	rp.sendFrame(rp.frameFrom(strangerMAC, netip.Addr{}, 0, stranger))
	flagged := ethernet.Packet{Type: ethernet.PtHello, Flags: ethernet.PfListener, Session: 0x7778, Nonce: 0x8889, Wnd: 64}
	rp.send(flagged)
	// A bad version, magic or type: the queue counts them as malformed.
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Version = 3
	rp.send(pk)
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Magic = 'X'
	rp.send(pk)
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Type = ethernet.PtRefuse + 1
	rp.send(pk)
	// A frame to another MAC address: for no connection of this queue.
	f = rp.frame(rp.pkt(ethernet.PtHelloAck))
	copy(f[0:6], strangerMAC)
	rp.sendFrame(f)
	require.False(t, d.done(), "the dial completed on a forged handshake")

	// The honest hello-ack, exactly a header and a body long.
	rp.send(rp.pkt(ethernet.PtHelloAck))
	ep := d.wait(t)
	// Frames are handled in order: everything above was handled before
	// the hello-ack that completed the dial.
	s := ep.Stats()
	require.EqualValues(t, malformed, s.Drops[fabric.DropMalformed], "forged handshake packets counted as malformed")
	require.EqualValues(t, 1, s.Drops[fabric.DropOther], "the hello-ack from another address")
	unknown, qmal, _ := ethernet.QueueDrops(ep.(*ethernet.Endpoint))
	require.EqualValues(t, 3, unknown, "hellos to id 0 not for the dialer (another address, flagged for a listener), a frame to another MAC")
	require.EqualValues(t, 3, qmal, "packets of an unknown version, magic or type")

	// Up: a hello or hello-ack of another incarnation of the peer, or
	// echoing a wrong nonce, and a late refusal, are refused too.
	base := s.Drops[fabric.DropMalformed]
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Session ^= 1
	rp.send(pk) // another connection id
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Nonce ^= 1
	rp.send(pk) // another nonce
	pk = rp.pkt(ethernet.PtHello)
	pk.Echo ^= 1
	rp.send(pk) // echoing a wrong nonce
	rp.send(rp.pkt(ethernet.PtRefuse))
	rp.drain()
	// The four are counted as malformed, as the barrier below is: wait
	// for them first, or the barrier may take the count of one of them,
	// still queued, for its own (see barrier).
	require.Eventually(t, func() bool { return ep.Stats().Drops[fabric.DropMalformed] >= base+4 }, 5*time.Second, time.Millisecond,
		"forged handshake packets after the connection is up: not all 4 counted as malformed")
	// The peer's own hello again (it lost our hello-ack): answered.
	rp.send(rp.pkt(ethernet.PtHello))
	s = rp.barrier(ep)
	require.EqualValues(t, base+4, s.Drops[fabric.DropMalformed], "forged handshake packets after the connection is up")
	ha := rp.recv("hello-ack answering the peer's repeated hello", 2*time.Second, isType(ethernet.PtHelloAck))
	require.Equal(t, rp.nonce, ha.Echo)
	require.Equal(t, rp.session, ha.Dst)

	// The connection works, both ways.
	sendMsg(t, ep, "after the forgeries")
	got := rp.recv("data after the forgeries", 2*time.Second, isData(0))
	require.Equal(t, "after the forgeries", string(got.Payload))
	rp.send(rp.dataPkt(0, "from the peer"))
	require.Equal(t, []string{"from the peer"}, recvMsgs(t, ep, 1))
}

// TestHostileRefusal: a refusal that echoes the dialer's nonce ends the
// dial with ErrRefused; one that echoes another does not.
func TestHostileRefusal(t *testing.T) {
	_, rp := newRawTopo(t, false)
	d := rp.startDial("")
	rp.learn(d.hello(rp))
	pk := rp.pkt(ethernet.PtRefuse)
	pk.Echo++
	rp.send(pk)
	// Another hello from the dialer shows the forged refusal was handled
	// (frames are handled in order, and the dialer resends every 10ms).
	rp.drain()
	rp.recv("hello after a forged refusal", 2*time.Second, isType(ethernet.PtHello))
	require.False(t, d.done(), "a refusal echoing another nonce ended the dial")
	rp.send(rp.pkt(ethernet.PtRefuse))
	r := d.result(t)
	require.ErrorIs(t, r.err, fabric.ErrRefused)
}

// TestForgedAcks: acknowledgements for data never sent, stale ones, and
// ones from another connection id or address move nothing: the packets
// they would acknowledge stay in the window and are retransmitted.
func TestForgedAcks(t *testing.T) {
	// Registered first, the guard outlives the endpoint's cleanup: a
	// sender that took the stale ACK below walks 2^32 packets back to it
	// under its lock, and Close waits for that lock.
	guardHeap(t, 256<<20, "a stale ACK")
	_, rp := newRawTopo(t, false)
	ep := rp.dialRaw("&window=16&maxmsg=4096")
	retransmitted := func(what string, psn uint32, payload string) {
		t.Helper()
		rp.barrier(ep)
		rp.drain()
		got := rp.recv(fmt.Sprintf("retransmission of psn %d after %s", psn, what), 3*time.Second, isData(psn))
		require.Equal(t, payload, string(got.Payload), "psn %d retransmitted after %s", psn, what)
	}

	sendMsg(t, ep, "m0")
	got := rp.recv("psn 0", 2*time.Second, isData(0))
	require.Equal(t, "m0", string(got.Payload))
	require.EqualValues(t, ethernet.PfFirst|ethernet.PfLast, got.Flags)

	// Acknowledging psn 1, which was never sent (one past the last).
	rp.send(rp.ackPkt(2, 64))
	retransmitted("an ACK for data never sent", 0, "m0")
	// From another connection id, and from another address.
	pk := rp.ackPkt(1, 64)
	pk.Session ^= 1
	rp.send(pk)
	retransmitted("an ACK from another connection id", 0, "m0")
	rp.sendFrame(rp.frameFrom(strangerMAC, netip.Addr{}, 0, rp.ackPkt(1, 64)))
	retransmitted("an ACK from another address", 0, "m0")
	s := ep.Stats()
	require.EqualValues(t, 2, s.Drops[fabric.DropOther], "ACKs from another connection id or address")
	require.NotZero(t, s.Retransmits, "retransmissions counted")

	// The honest ACK, exactly up to the last packet sent.
	rp.send(rp.ackPkt(1, 64))
	rp.barrier(ep)
	for i := 1; i <= 3; i++ {
		sendMsg(t, ep, fmt.Sprintf("m%d", i))
	}
	for i := uint32(1); i <= 3; i++ {
		rp.recv(fmt.Sprintf("psn %d", i), 2*time.Second, isData(i))
	}
	rp.send(rp.ackPkt(4, 64))
	// A stale ACK (behind the one before) changes nothing; nor does a
	// stale NAK: nothing is outstanding, and acknowledged packets are
	// never resent (their frames went back to the pool).
	rp.send(rp.ackPkt(2, 64))
	rp.barrier(ep)
	rp.drain()
	stale := rp.ackPkt(2, 64)
	stale.Flags, stale.Imm = ethernet.PfNak, 2
	rp.send(stale)
	rp.barrier(ep)
	if pk, ok := rp.next(100*time.Millisecond, isType(ethernet.PtData)); ok {
		t.Fatalf("psn %d sent after a stale NAK, with nothing outstanding", pk.PSN)
	}

	// A NAK naming more packets than were sent resends only those sent.
	for i := 4; i <= 6; i++ {
		sendMsg(t, ep, fmt.Sprintf("m%d", i))
	}
	for i := uint32(4); i <= 6; i++ {
		rp.recv(fmt.Sprintf("psn %d", i), 2*time.Second, isData(i))
	}
	rp.drain()
	retx := ep.Stats().Retransmits
	nak := rp.ackPkt(4, 64)
	nak.Flags, nak.Imm = ethernet.PfNak, 1000
	rp.send(nak)
	// The NAK is handled, its packets resent, before the barrier is;
	// the retransmission timer may add a few more.
	if n := rp.barrier(ep).Retransmits - retx; n < 3 || n > 64 {
		t.Fatalf("%d packets resent for a NAK of 1000 with 3 outstanding", n)
	}
	seen := map[uint32]bool{}
	end := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(end) {
		pk, ok := rp.next(time.Until(end), isType(ethernet.PtData))
		if !ok {
			break
		}
		require.Less(t, pk.PSN, uint32(7), "resent psn %d, never sent", pk.PSN)
		require.GreaterOrEqual(t, pk.PSN, uint32(4), "resent psn %d, acknowledged", pk.PSN)
		require.Equal(t, fmt.Sprintf("m%d", pk.PSN), string(pk.Payload))
		seen[pk.PSN] = true
	}
	require.Len(t, seen, 3, "the NAK's packets 4 to 6 resent")
	rp.send(rp.ackPkt(7, 64))
	rp.barrier(ep)
	sendMsg(t, ep, "m7")
	got = rp.recv("psn 7", 2*time.Second, isData(7))
	require.Equal(t, "m7", string(got.Payload))
}

// TestPeerWindow: the sender keeps within the window the peer
// advertises: it takes a window that opens while it is blocked, and
// honours one that shrinks for packets it has not sent.
func TestPeerWindow(t *testing.T) {
	_, rp := newRawTopo(t, false)
	d := rp.startDial("&window=16&maxmsg=4096")
	rp.learn(d.hello(rp))
	ha := rp.pkt(ethernet.PtHelloAck)
	ha.Wnd = 1
	rp.send(ha)
	ep := d.wait(t)
	for i := 0; i < 3; i++ {
		sendMsg(t, ep, fmt.Sprintf("w%d", i))
	}
	rp.recv("psn 0", 2*time.Second, isData(0))
	// Blocked at psn 1; the window opens to psn 2 with no new data
	// acknowledged beyond psn 0.
	rp.send(rp.ackPkt(1, 2))
	rp.recv("psn 1 once the window opened", 2*time.Second, isData(1))
	rp.recv("psn 2 once the window opened", 2*time.Second, isData(2))

	// Everything acknowledged and the window wide; then it shrinks to
	// one packet before any is sent.
	rp.send(rp.ackPkt(3, 8))
	rp.send(rp.ackPkt(3, 1))
	rp.barrier(ep)
	for i := 3; i < 6; i++ {
		sendMsg(t, ep, fmt.Sprintf("w%d", i))
	}
	rp.recv("psn 3", 2*time.Second, isData(3))
	if pk, ok := rp.next(300*time.Millisecond, func(pk ethernet.Packet) bool { return pk.Type == ethernet.PtData && pk.PSN > 3 }); ok {
		t.Fatalf("psn %d sent past a window of one packet", pk.PSN)
	}
	rp.send(rp.ackPkt(4, 8))
	rp.recv("psn 4 once the window opened", 2*time.Second, isData(4))
	rp.recv("psn 5 once the window opened", 2*time.Second, isData(5))

	// A closed window, with nothing in flight, holds the next packet
	// until the peer's window update (with nothing in flight there is no
	// retransmission timer to probe with: the peer's keepalive carries
	// the update).
	rp.send(rp.ackPkt(6, 0))
	rp.barrier(ep)
	sendMsg(t, ep, "held")
	rp.send(rp.ackPkt(6, 1))
	got := rp.recv("psn 6 once a closed window opened", 3*time.Second, isData(6))
	require.Equal(t, "held", string(got.Payload))
}

// TestHostileData: the receiver buffers data up to the last slot of its
// window and drops past it, drops duplicates and data from another
// connection id or address, counts each, and delivers what it kept in
// order.
func TestHostileData(t *testing.T) {
	_, rp := newRawTopo(t, false)
	ep := rp.dialRaw("&window=16&maxmsg=4096")
	// psn 15: the last slot of the 16-packet window, ahead of a gap of
	// 15. The endpoint asks for the gap with a NAK.
	rp.drain()
	rp.send(rp.dataPkt(15, "p15"))
	nak := rp.recv("NAK for the gap before psn 15", 2*time.Second, func(pk ethernet.Packet) bool {
		return pk.Type == ethernet.PtAck && pk.Flags&ethernet.PfNak != 0
	})
	require.EqualValues(t, 0, nak.Ack)
	require.EqualValues(t, 15, nak.Imm, "the gap")
	rp.send(rp.dataPkt(16, "p16")) // one past the window
	rp.send(rp.dataPkt(15, "again"))
	pk := rp.dataPkt(0, "other")
	pk.Session ^= 1
	rp.send(pk)
	rp.sendFrame(rp.frameFrom(strangerMAC, netip.Addr{}, 0, rp.dataPkt(0, "stranger")))
	s := rp.barrier(ep)
	require.EqualValues(t, 1, s.Drops[fabric.DropNoBuffer], "data past the window")
	require.EqualValues(t, 1, s.Drops[fabric.DropDuplicate], "data for a slot already filled")
	require.EqualValues(t, 2, s.Drops[fabric.DropOther], "data from another connection id or address")

	want := make([]string, 16)
	for i := uint32(0); i < 15; i++ {
		want[i] = fmt.Sprintf("p%d", i)
		rp.send(rp.dataPkt(i, want[i]))
	}
	want[15] = "p15"
	require.Equal(t, want, recvMsgs(t, ep, 16))
	rp.send(rp.dataPkt(3, "old"))
	s = rp.barrier(ep)
	require.EqualValues(t, 2, s.Drops[fabric.DropDuplicate], "data already delivered")
	require.EqualValues(t, 16, s.RxMessages)
	// A message in two fragments, the second one full.
	mtu := ep.Caps().MTU
	big := bytes.Repeat([]byte{0xa5}, mtu)
	first := rp.dataPkt(16, "head")
	first.Flags = ethernet.PfFirst
	second := rp.dataPkt(17, "")
	second.Flags, second.Payload = ethernet.PfLast, big
	rp.send(first)
	rp.send(second)
	require.Equal(t, []string{"head" + string(big)}, recvMsgs(t, ep, 1))

	// A RecvWait with nothing to receive sleeps, and counts each
	// wake-up, until the peer sends.
	r, err := ep.Alloc(64, fabric.AccessLocalWrite)
	require.NoError(t, err)
	got := make(chan error, 1)
	m := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
	w0 := ep.Stats().Wakeups
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _, err := ep.RecvWait(ctx, m); got <- err }()
	require.Eventually(t, func() bool { return ep.Stats().Wakeups > w0 }, 5*time.Second, time.Millisecond,
		"a RecvWait with nothing to receive never counted a wake-up")
	rp.send(rp.dataPkt(18, "late"))
	select {
	case err := <-got:
		require.NoError(t, err)
		require.Equal(t, "late", string(r.Bytes()[:m[0].Len]))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting RecvWait never received the late message")
	}
}

// TestHostileListenerHandshake: a listener refuses and counts hellos
// one byte too long or too short, from connection id 0, and hello-acks
// to id 0; the connection it starts takes only the hello-ack that echoes
// its nonce, from its peer's address and connection id.
func TestHostileListenerHandshake(t *testing.T) {
	lt := newListenTopo(t, "")
	l := fabrictest.Listen(t, "ethernet", lt.listen, &fabric.Options{Backlog: 4, HandshakeTimeout: 10 * time.Second})
	rp := newRawPeer(t, lt.p, false)
	el := l.(*ethernet.Listener)
	before := l.Stats()

	hello := rp.pkt(ethernet.PtHello) // dst 0, echo 0: nothing learned yet
	const maxHello = ethernet.UDP4HdrLen + 64 + ethernet.HdrLen + ethernet.HelloLen
	long := append(rp.frame(hello), make([]byte, maxHello+1)...)[:maxHello+1]
	rp.sendFrame(long)
	short := rp.frame(hello)
	rp.sendFrame(short[:len(short)-1])
	zero := hello
	zero.Session = 0
	rp.send(zero)
	ack := hello
	ack.Type, ack.Echo = ethernet.PtHelloAck, 1
	rp.send(ack) // a hello-ack to id 0: for no connection
	require.Eventually(t, func() bool { return l.Stats().Failed == before.Failed+3 }, 5*time.Second, time.Millisecond,
		"the listener never counted three bad hellos (one byte long, one byte short, connection id 0): %+v", l.Stats())
	require.Eventually(t, func() bool { return el.DemuxStats().Unknown == 1 }, 5*time.Second, time.Millisecond,
		"the queue never counted the hello-ack to id 0: %+v", el.DemuxStats())
	require.Zero(t, l.Stats().Pending, "a bad hello took a slot")

	// A hello exactly as long as the listener takes starts a handshake.
	rp.sendFrame(append(rp.frame(hello), make([]byte, maxHello)...)[:maxHello])
	ha := rp.recv("the listener's hello-ack", 5*time.Second, isType(ethernet.PtHelloAck))
	require.Equal(t, rp.session, ha.Dst)
	require.Equal(t, rp.nonce, ha.Echo)
	rp.learn(ha)
	require.Equal(t, 1, l.Stats().Pending)

	// Forgeries at the connection in its handshake.
	pk := rp.pkt(ethernet.PtHelloAck)
	pk.Echo ^= 1
	rp.send(pk) // echoing a nonce the listener never sent
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Session ^= 1
	rp.send(pk) // from another connection id
	pk = rp.pkt(ethernet.PtHelloAck)
	pk.Nonce ^= 1
	rp.send(pk) // with another nonce
	rp.sendFrame(rp.frameFrom(strangerMAC, netip.Addr{}, 0, rp.pkt(ethernet.PtHelloAck)))
	// Frames are handled in order: the connection's answer to a hello
	// sent after them shows it has handled them, and is still in its
	// handshake.
	rp.drain()
	rp.send(rp.pkt(ethernet.PtHello))
	rp.recv("hello-ack answering a repeated hello", 5*time.Second, isType(ethernet.PtHelloAck))
	require.Equal(t, 1, l.Stats().Pending, "a forged hello-ack completed the handshake")

	rp.send(rp.pkt(ethernet.PtHelloAck))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, err := l.Accept(ctx)
	require.NoError(t, err, "the honest hello-ack never completed the handshake")
	defer ep.Close()
	s := ep.Stats()
	require.EqualValues(t, 3, s.Drops[fabric.DropMalformed], "forged hello-acks")
	require.EqualValues(t, 1, s.Drops[fabric.DropOther], "the hello-ack from another address")
	rp.send(rp.dataPkt(0, "accepted"))
	require.Equal(t, []string{"accepted"}, recvMsgs(t, ep, 1))
}

// TestHostileUDP: with UDP framing an endpoint takes packets only from
// its peer's IP address, port and MAC; and its queue drops frames that
// pass the XDP filter but are no Weft packet over plain IPv4 (a first
// fragment, IPv6), counting them.
func TestHostileUDP(t *testing.T) {
	p, rp := newRawTopo(t, true)
	ipB, ipX := addr4(p.IPB), netip.MustParseAddr("10.11.0.99")
	d := rp.startDial("")
	rp.learn(d.hello(rp))
	// Hellos to id 0 from another port or IP are not the peer's: a
	// dialer that took one as a symmetric open would refuse the peer's
	// hello-ack below.
	stranger := ethernet.Packet{Type: ethernet.PtHello, Session: 0x7777, Nonce: 0x8888, Wnd: 64}
	rp.sendFrame(rp.frameFrom(p.MACB, ipB, ethernet.DefaultUDPPort+1, stranger))
	rp.sendFrame(rp.frameFrom(p.MACB, ipX, ethernet.DefaultUDPPort, stranger))
	rp.send(rp.pkt(ethernet.PtHelloAck))
	ep := d.wait(t)
	// A hello from another connection id: refused as malformed if it
	// got past the address checks.
	pk := rp.pkt(ethernet.PtHello)
	pk.Session ^= 0x100
	rp.sendFrame(rp.frameFrom(p.MACB, ipB, ethernet.DefaultUDPPort+1, pk))
	rp.sendFrame(rp.frameFrom(p.MACB, ipX, ethernet.DefaultUDPPort, pk))
	rp.sendFrame(rp.frameFrom(strangerMAC, ipB, ethernet.DefaultUDPPort, pk))
	// A first fragment (MF set); the same packet with IPv4 options
	// (IHL 6) is taken.
	frag := rp.frame(rp.dataPkt(0, "fragment"))
	frag[ethernet.EthHdrLen+6] |= 0x20
	fixIPSum(frag[ethernet.EthHdrLen : ethernet.EthHdrLen+20])
	rp.sendFrame(frag)
	rp.sendFrame(withIPOption(rp.frame(rp.dataPkt(0, "options"))))
	s := rp.barrier(ep)
	require.EqualValues(t, 3, s.Drops[fabric.DropOther], "packets from another port, IP or MAC")
	require.Zero(t, s.Drops[fabric.DropMalformed], "a packet from another address reached the handshake")
	unknown, _, _ := ethernet.QueueDrops(ep.(*ethernet.Endpoint))
	require.EqualValues(t, 3, unknown, "the hellos to id 0 from another port and IP, the first fragment")
	require.Equal(t, []string{"options"}, recvMsgs(t, ep, 1))
	sendMsg(t, ep, "reply")
	got := rp.recv("data over UDP", 2*time.Second, isData(0))
	require.Equal(t, "reply", string(got.Payload))
}

// fixIPSum recomputes an IPv4 header's checksum.
func fixIPSum(ip []byte) {
	ip[10], ip[11] = 0, 0
	var s uint32
	for i := 0; i+1 < len(ip); i += 2 {
		s += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
}

// withIPOption returns a UDP/IPv4 frame with a 4-byte IPv4 option (a
// no-op and an end of list) inserted: IHL 6.
func withIPOption(f []byte) []byte {
	const ip = ethernet.EthHdrLen
	out := append([]byte(nil), f[:ip+20]...)
	out = append(out, 1, 0, 0, 0)
	out = append(out, f[ip+20:]...)
	out[ip] = 0x46
	binary.BigEndian.PutUint16(out[ip+2:], binary.BigEndian.Uint16(f[ip+2:])+4)
	fixIPSum(out[ip : ip+24])
	return out
}
