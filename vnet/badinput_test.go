//go:build linux

package vnet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// rxPackets is the kernel's count of packets the device delivered (what
// the bridge wrote into it).
func rxPackets(t *testing.T, tp *topo) uint64 {
	t.Helper()
	lm, err := tp.A.Link("weft0")
	if err != nil {
		t.Fatal(err)
	}
	if lm.Attributes.Stats64 != nil {
		return lm.Attributes.Stats64.RXPackets
	}
	return uint64(lm.Attributes.Stats.RXPackets)
}

// TestBadInput: a peer that writes malformed messages straight onto the
// fabric gets every one dropped and counted under its reason; none
// reaches the kernel, and a good frame after them does.
func TestBadInput(t *testing.T) {
	a, b := newNamespaces(t)
	tp := &topo{A: a, B: b}
	tp.tA, tp.tB = ntbTransports(t, 1)
	epA, epB := transportEndpoints(t, tp.tA)[0], transportEndpoints(t, tp.tB)[0]
	if err := a.Do(func() error {
		var err error
		tp.bA, err = New(Config{Name: "weft0", MTU: 1500}, epA)
		return err
	}); err != nil {
		testenv.SkipOn(t, err, fabric.ErrNotSupported)
	}
	defer tp.bA.Close()
	before := rxPackets(t, tp)

	buf, err := epB.Alloc(64<<10, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	sendRaw := func(m []byte) {
		t.Helper()
		copy(buf.Bytes(), m)
		msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: len(m)}}}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := epB.SendWait(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	badMagic := msg(0, nil, 60)
	badMagic[1] = 'X'
	truncated := msg(0, nil, 60)
	binary.BigEndian.PutUint32(truncated[4:], 1000)
	sendRaw(badMagic)                                                                      // BadHeader
	sendRaw(truncated)                                                                     // Truncated
	sendRaw(msg(0, nil, 10))                                                               // Truncated: a runt
	sendRaw(msg(0, nil, 20000))                                                            // Oversized for MTU 1500
	sendRaw(msg(FlagTUN, nil, 60))                                                         // BadFrame: an IP packet for a TAP
	sendRaw([]byte{'W', 'V'})                                                              // Truncated: half a header
	sendRaw(msg(FlagVnetHdr, vnetHdr(vnetFlagNeedsCsum, gsoTCPv4, 54, 1448, 34, 16), 200)) // BadVnetHdr: no offloads here
	ethHdr := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 9, 0x88, 0xb5}
	over := msg(0, nil, 1500+18+1) // one byte past the MTU, an Ethernet header and a VLAN tag
	copy(over[HeaderLen:], ethHdr)
	sendRaw(over)                 // Oversized
	atMax := msg(0, nil, 1500+18) // exactly the largest frame
	copy(atMax[HeaderLen:], ethHdr)
	sendRaw(atMax)
	good := msg(0, nil, 60)
	copy(good[HeaderLen:], ethHdr)
	sendRaw(good)

	if !testenv.Eventually(10*time.Second, func() bool { return tp.bA.Stats().RxFrames == 2 }) {
		t.Fatalf("the good frames did not arrive: %+v", tp.bA.Stats())
	}
	st := tp.bA.Stats()
	want := Stats{RxFrames: 2, BadHeader: 1, Truncated: 3, Oversized: 2, BadFrame: 1, BadVnetHdr: 1}
	if st.RxFrames != want.RxFrames || st.BadHeader != want.BadHeader || st.Truncated != want.Truncated ||
		st.Oversized != want.Oversized || st.BadFrame != want.BadFrame || st.BadVnetHdr != want.BadVnetHdr {
		t.Fatalf("stats %+v, want the drops of %+v", st, want)
	}
	if !testenv.Eventually(5*time.Second, func() bool { return rxPackets(t, tp) == before+2 }) {
		t.Fatalf("kernel received %d packets, want exactly the two good ones", rxPackets(t, tp)-before)
	}

	// Delivering a frame to the device allocates nothing.
	q := tp.bA.qs[0]
	if n := testing.AllocsPerRun(200, func() { q.deliver(good) }); n != 0 {
		t.Errorf("deliver allocates %.1f times per frame", n)
	}
}

// TestConfigBounds: New refuses an MTU one below or one above its range
// and a device name the kernel cannot take, with ErrInvalid, and takes
// the MTUs at each end of the range, which the device then has.
func TestConfigBounds(t *testing.T) {
	a, _ := newNamespaces(t)
	tA, _ := ntbTransports(t, 1)
	ep := transportEndpoints(t, tA)[0]
	mac := net.HardwareAddr{2, 0x77, 0, 0, 0, 0x42}
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Name: "weft0", MTU: 67}, false},
		{Config{Name: "weft0", MTU: 68}, true},
		{Config{Name: "weft0", MTU: MaxMTU}, true},
		{Config{Name: "weft0", MTU: MaxMTU + 1}, false},
		{Config{Name: "weft0", Kind: TUN, MTU: 65535}, true},
		{Config{Name: "weft0", Kind: TUN, MTU: 65536}, false},
		{Config{Name: "weft0123456789abc", MTU: 1500}, false},
		{Config{Name: "weft0", MTU: 1500, MAC: mac}, true},
		{Config{Name: "weft0", Kind: TUN, MTU: 1500, MAC: mac}, true}, // a TUN device has no MAC: ignored
	} {
		var b *Bridge
		err := a.Do(func() error {
			var err error
			b, err = New(c.cfg, ep)
			return err
		})
		if !c.ok {
			if !errors.Is(err, fabric.ErrInvalid) {
				t.Fatalf("New(%+v): %v, want ErrInvalid", c.cfg, err)
			}
			continue
		}
		if err != nil {
			testenv.SkipOn(t, err, fabric.ErrNotSupported)
			t.Fatalf("New(%+v): %v", c.cfg, err)
		}
		lm, err := a.Link("weft0")
		if err != nil {
			t.Fatal(err)
		}
		if int(lm.Attributes.MTU) != c.cfg.MTU {
			t.Errorf("New(%+v): the device's MTU is %d", c.cfg, lm.Attributes.MTU)
		}
		if c.cfg.MAC != nil && c.cfg.Kind == TAP && !bytes.Equal(lm.Attributes.Address, c.cfg.MAC) {
			t.Errorf("New(%+v): the device's MAC is %v", c.cfg, lm.Attributes.Address)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAllocsPerFrame: over a TCP stream through two bridges, the whole
// process allocates far less than once per frame (the bridges nothing:
// what remains is the runtime's and the ntb transport's background).
func TestAllocsPerFrame(t *testing.T) {
	tp := newNTBTopo(t, Config{MTU: 1500}, 1)
	tp.transfer(t, 5010, 4<<20) // warm up: connection, buffers
	c, s := tp.dialTCP(t, 5011)
	const n = 32 << 20
	sbuf, rbuf := make([]byte, 64<<10), make([]byte, 64<<10)
	done := make(chan error, 1)
	go func() {
		for got := 0; got < n; {
			k, err := s.Read(rbuf)
			if err != nil {
				done <- err
				return
			}
			got += k
		}
		done <- nil
	}()
	f0 := tp.bA.Stats().TxFrames + tp.bA.Stats().RxFrames + tp.bB.Stats().TxFrames + tp.bB.Stats().RxFrames
	var m0, m1 runtime.MemStats
	c.SetWriteDeadline(testenv.Deadline()) // 32 MiB take seconds; a stall fails: i/o timeout
	runtime.ReadMemStats(&m0)
	for sent := 0; sent < n; sent += len(sbuf) {
		if _, err := c.Write(sbuf); err != nil {
			t.Fatal(err)
		}
	}
	if err := testenv.Recv(t, done, "the receiver of the stream"); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	frames := tp.bA.Stats().TxFrames + tp.bA.Stats().RxFrames + tp.bB.Stats().TxFrames + tp.bB.Stats().RxFrames - f0
	per := float64(m1.Mallocs-m0.Mallocs) / float64(frames)
	t.Logf("%d allocations for %d frame crossings: %.4f per frame", m1.Mallocs-m0.Mallocs, frames, per)
	if per > 0.5 { // one allocation per frame anywhere on the path would read ≥ 1
		t.Errorf("%.3f allocations per frame, want none on the data path", per)
	}
}

// TestTxOversized: a frame the device hands over that is larger than a
// message holds (its MTU raised behind the bridge's back) is dropped and
// counted, not sent cut short.
func TestTxOversized(t *testing.T) {
	a, _ := newNamespaces(t)
	tA, _ := ntbTransports(t, 1)
	ep := transportEndpoints(t, tA)[0]
	var b *Bridge
	if err := a.Do(func() error {
		var err error
		b, err = New(Config{Name: "weft0", MTU: 1500}, ep)
		return err
	}); err != nil {
		testenv.SkipOn(t, err, fabric.ErrNotSupported)
		t.Fatal(err)
	}
	defer b.Close()
	for _, err := range []error{a.SetMTU("weft0", 4000), a.AddAddr("weft0", "10.99.0.1/24"),
		a.AddNeigh("weft0", net.IPv4(10, 99, 0, 2), net.HardwareAddr{2, 0x77, 0, 0, 0, 2})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Do(func() error {
		c, err := net.Dial("udp4", "10.99.0.2:9")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, 3000))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !testenv.Eventually(10*time.Second, func() bool { return b.Stats().TxDropped == 1 }) {
		t.Fatalf("the 3042-byte frame was not dropped and counted: %+v", b.Stats())
	}
	if st := b.Stats(); st.TxFrames != 0 {
		t.Fatalf("a frame was sent: %+v", st)
	}
}
