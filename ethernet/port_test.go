package ethernet_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

// TestKernelInterop: a kernel UDP socket in the peer namespace receives
// what AF_XDP sent, AF_XDP receives what the socket sent, and traffic
// outside the filter still reaches the host stack.
func TestKernelInterop(t *testing.T) {
	for _, mode := range []ethernet.AttachMode{ethernet.AttachNative, ethernet.AttachGeneric} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, netns.PairConfig{})
			port := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: ethernet.Filter{UDPPorts: []uint16{9000}}, Attach: mode})
			require.Equal(t, mode, port.Program().Mode())
			q := port.Queue(0)
			t.Logf("attach %s, zero-copy %v", port.Program().Mode(), q.ZeroCopy())

			// Peer socket -> AF_XDP (port 9000 is steered).
			peer := listenUDP(t, p.B, p.IPB, 9001)
			dst := &net.UDPAddr{IP: p.IPA, Port: 9000}
			for i := 0; i < 10; i++ {
				_, err := peer.WriteToUDP([]byte("to-xdp"), dst)
				require.NoError(t, err)
			}
			var h ethernet.UDP4
			got := recvFrames(t, q, 10, 2*time.Second, func(b []byte) {
				pl, ok := ethernet.ParseUDP4(b, &h)
				require.True(t, ok)
				require.Equal(t, "to-xdp", string(pl))
				require.Equal(t, uint16(9000), h.DstPort)
				require.Equal(t, uint16(9001), h.SrcPort)
			})
			require.Equal(t, 10, got)

			// AF_XDP -> peer socket.
			frames := make([]ethernet.Frame, 8)
			n := q.Alloc(frames)
			require.Equal(t, 8, n)
			hdr := ethernet.UDP4{SrcMAC: p.MACA, DstMAC: p.MACB, SrcIP: addr4(p.IPA), DstIP: addr4(p.IPB), SrcPort: 9000, DstPort: 9001}
			for i := range frames {
				b := q.Buffer(frames[i])
				off := ethernet.PutUDP4(b, &hdr, 5)
				frames[i].Len = off + copy(b[off:], "hello")
			}
			sent, err := q.Send(frames)
			require.NoError(t, err)
			require.Equal(t, 8, sent)
			buf := make([]byte, 100)
			for i := 0; i < 8; i++ {
				peer.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, from, err := peer.ReadFromUDP(buf)
				require.NoError(t, err)
				require.Equal(t, "hello", string(buf[:n]))
				require.True(t, from.IP.Equal(p.IPA))
				require.Equal(t, 9000, from.Port)
			}
			require.True(t, testenv.Eventually(time.Second, func() bool { n, _ := q.Flush(); return n == 0 }))

			// Port 9002 is not steered: the host's socket gets it.
			host := listenUDP(t, p.A, p.IPA, 9002)
			_, err = peer.WriteToUDP([]byte("to-host"), &net.UDPAddr{IP: p.IPA, Port: 9002})
			require.NoError(t, err)
			host.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, _, err = host.ReadFromUDP(buf)
			require.NoError(t, err)
			require.Equal(t, "to-host", string(buf[:n]))
		})
	}
}

// TestRawBurst: bursts of raw EtherType frames from one AF_XDP port to
// another, with payload checks.
func TestRawBurst(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	a := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: f})
	b := openPort(t, p.B, p.NameB, &ethernet.Config{Filter: f})
	qa, qb := a.Queue(0), b.Queue(0)
	const total = 20000
	frames := make([]ethernet.Frame, 64)
	sent, got := 0, 0
	seen := make([]bool, total)
	rx := make([]ethernet.Frame, 64)
	deadline := time.Now().Add(10 * time.Second)
	for got < total && time.Now().Before(deadline) {
		// Keep at most 256 frames in flight: veth drops what overflows
		// its 256-entry XDP ring, and this test is about exact delivery.
		if sent < total && sent-got <= 256-len(frames) {
			n := qa.Alloc(frames[:min(len(frames), total-sent)])
			for i := 0; i < n; i++ {
				buf := qa.Buffer(frames[i])
				ethernet.PutEthernet(buf, p.MACB, p.MACA, ethernet.EtherTypeWeft)
				seq := sent + i
				buf[14], buf[15], buf[16], buf[17] = byte(seq), byte(seq>>8), byte(seq>>16), byte(seq>>24)
				frames[i].Len = 60
			}
			m, err := qa.Send(frames[:n])
			require.NoError(t, err)
			qa.Release(frames[m:n])
			sent += m
		}
		n, err := qb.Recv(rx)
		require.NoError(t, err)
		for i := 0; i < n; i++ {
			d := qb.Data(rx[i])
			require.Equal(t, 60, len(d))
			seq := int(d[14]) | int(d[15])<<8 | int(d[16])<<16 | int(d[17])<<24
			require.Less(t, seq, total)
			require.False(t, seen[seq], "duplicate %d", seq)
			seen[seq] = true
		}
		qb.Release(rx[:n])
		got += n
	}
	st := qb.Stats()
	t.Logf("sent %d got %d; rx kernel stats %+v", sent, got, st.Kernel)
	require.Equal(t, total, got)
	require.Equal(t, uint64(got), st.RXPackets)
}

// TestBackpressure: with a tiny TX ring and no kick, Send reports only
// what fit on the ring, and the counters agree.
func TestBackpressure(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	a := openPort(t, p.A, p.NameA, &ethernet.Config{RingSize: 64, Frames: 512})
	q := a.Queue(0)
	frames := make([]ethernet.Frame, 200)
	n := q.Alloc(frames)
	require.Equal(t, 200, n)
	for i := range frames {
		ethernet.PutEthernet(q.Buffer(frames[i]), p.MACB, p.MACA, ethernet.EtherTypeWeft)
		frames[i].Len = 60
	}
	// Fill the ring without letting the kernel drain it: reserve on the
	// raw ring, as a second producer would see it.
	tx := q.Socket().TX()
	require.Equal(t, 64, tx.Free())
	sent, err := q.Send(frames)
	require.NoError(t, err)
	require.LessOrEqual(t, sent, 64, "more sent than the ring holds")
	require.Equal(t, uint64(sent), q.Stats().TXPackets)
	total := sent
	// The rest go out as the kernel drains the ring.
	rest := frames[sent:]
	deadline := time.Now().Add(5 * time.Second)
	for len(rest) > 0 && time.Now().Before(deadline) {
		m, err := q.Send(rest)
		require.NoError(t, err)
		total += m
		rest = rest[m:]
		if m == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	require.Equal(t, 200, total)
	require.Equal(t, uint64(200), q.Stats().TXPackets)
	require.True(t, testenv.Eventually(2*time.Second, func() bool { n, _ := q.Flush(); return n == 0 }))
	require.Equal(t, uint64(200), q.Stats().TXCompleted)
}

// TestAttachSafety: Weft refuses to replace a program it did not attach,
// and Close detaches only its own.
func TestAttachSafety(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	// Someone else's program, attached through its own bpf_link.
	other, err := ethernet.NewProgram(ethernet.Filter{All: true}, 4)
	require.NoError(t, err)
	defer other.Close()
	idx, err := p.A.Index(p.NameA)
	require.NoError(t, err)
	require.NoError(t, p.A.Do(func() error { return other.Attach(idx, ethernet.AttachNative) }))
	otherID, err := other.ID()
	require.NoError(t, err)

	err = p.A.Do(func() error {
		_, err := ethernet.Open(p.NameA, &ethernet.Config{Filter: ethernet.Filter{All: true}})
		return err
	})
	require.Error(t, err)
	require.True(t, errors.Is(err, ethernet.ErrXDPInUse), "%v", err)
	t.Log(err)
	// Also when going straight to Attach (the pre-check bypassed).
	mine, err := ethernet.NewProgram(ethernet.Filter{All: true}, 4)
	require.NoError(t, err)
	err = p.A.Do(func() error { return mine.Attach(idx, ethernet.AttachAuto) })
	require.True(t, errors.Is(err, ethernet.ErrXDPInUse), "%v", err)
	require.NoError(t, mine.Close())

	var li ethernet.LinkInfo
	require.NoError(t, p.A.Do(func() error { li, err = ethernet.LinkByName(p.NameA); return err }))
	require.Equal(t, uint32(otherID), li.XDPProgID, "the other program must stay attached")

	// After the other detaches, Weft attaches, and its Close leaves the
	// interface clean.
	require.NoError(t, other.Detach())
	port := openPort(t, p.B, p.NameB, &ethernet.Config{Filter: ethernet.Filter{All: true}})
	_ = port
	var li2 ethernet.LinkInfo
	require.NoError(t, p.B.Do(func() error { li2, err = ethernet.LinkByName(p.NameB); return err }))
	require.NotZero(t, li2.XDPProgID)
	require.NoError(t, port.Close())
	require.NoError(t, port.Close())
	require.NoError(t, p.B.Do(func() error { li2, err = ethernet.LinkByName(p.NameB); return err }))
	require.Zero(t, li2.XDPProgID)
}

// TestOpenStaleLink: a LinkInfo read while Weft's own program was
// attached, used after that program's last port closed, opens the
// interface: the program it names is gone. (Concurrent dials read the
// link before the interface's last endpoint closed and failed with
// ErrXDPInUse.) A foreign program attached since is still refused.
func TestOpenStaleLink(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	cfg := &ethernet.Config{Filter: ethernet.Filter{All: true}}
	first := openPort(t, p.A, p.NameA, cfg)
	var li ethernet.LinkInfo
	var err error
	require.NoError(t, p.A.Do(func() error { li, err = ethernet.LinkByName(p.NameA); return err }))
	require.NotZero(t, li.XDPProgID)
	require.NoError(t, first.Close())

	require.NoError(t, p.A.Do(func() error {
		port, err := ethernet.OpenLink(li, cfg)
		if err == nil {
			err = port.Close()
		}
		return err
	}))

	other, err := ethernet.NewProgram(ethernet.Filter{All: true}, 4)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, p.A.Do(func() error { return other.Attach(li.Index, ethernet.AttachNative) }))
	err = p.A.Do(func() error {
		_, err := ethernet.OpenLink(li, cfg)
		return err
	})
	require.True(t, errors.Is(err, ethernet.ErrXDPInUse), "%v", err)
}

// TestCloseLeaks: opening and closing ports leaks no fds, programs,
// maps or goroutines, and calls after Close fail with os.ErrClosed.
func TestCloseLeaks(t *testing.T) {
	p := newPair(t, netns.PairConfig{Queues: 2})
	open := func() *ethernet.Port {
		var port *ethernet.Port
		require.NoError(t, p.A.Do(func() error {
			var err error
			port, err = ethernet.Open(p.NameA, &ethernet.Config{AllQueues: true, Filter: ethernet.Filter{UDPPorts: []uint16{7}}})
			return err
		}))
		return port
	}
	// Warm up (first use loads lazily initialised state).
	require.NoError(t, open().Close())
	runtime.GC()
	fds := testenv.FDCount(t)
	g := runtime.NumGoroutine()
	progs := progIDs(t)
	maps := mapIDs(t)
	for i := 0; i < 5; i++ {
		port := open()
		require.Len(t, port.Queues(), 2)
		require.NoError(t, port.Close())
		_, err := port.Queue(0).Recv(make([]ethernet.Frame, 1))
		require.ErrorIs(t, err, fabric.ErrClosed)
		_, err = port.Queue(1).Send(make([]ethernet.Frame, 1))
		require.ErrorIs(t, err, fabric.ErrClosed)
	}
	require.Equal(t, fds, testenv.FDCount(t), "fd leak")
	require.LessOrEqual(t, testenv.Goroutines(g, time.Second), g, "goroutine leak")
	require.Empty(t, newWeftProgs(t, progs), "program leak")
	// Maps are freed in a deferred work item after their last reference.
	require.True(t, testenv.Eventually(2*time.Second, func() bool { return len(newWeftMaps(t, maps)) == 0 }),
		"map leak: %v", newWeftMaps(t, maps))
}

// TestRecvWaitClose: Close wakes a blocked RecvWait with os.ErrClosed,
// and a context ends it.
func TestRecvWaitClose(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	port := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: ethernet.Filter{UDPPorts: []uint16{7}}})
	q := port.Queue(0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := q.RecvWait(ctx, make([]ethernet.Frame, 4))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	done := make(chan error, 1)
	go func() {
		_, err := q.RecvWait(context.Background(), make([]ethernet.Frame, 4))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, port.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, fabric.ErrClosed)
	case <-time.After(2 * time.Second):
		t.Fatal("RecvWait not woken by Close")
	}
}

// TestZeroCopyProbe: veth has native XDP but no AF_XDP zero-copy; auto
// mode falls back to copy, forced zero-copy fails with ErrNotSupported.
func TestZeroCopyProbe(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	port := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: ethernet.Filter{All: true}})
	require.False(t, port.Queue(0).ZeroCopy(), "veth in auto mode bound zero-copy; this test's premise (veth has no AF_XDP zero-copy) is out of date")
	require.NoError(t, port.Close())
	err := p.A.Do(func() error {
		port, err := ethernet.Open(p.NameA, &ethernet.Config{Filter: ethernet.Filter{All: true}, Bind: xsk.ModeZeroCopy})
		if err == nil {
			port.Close()
		}
		return err
	})
	t.Logf("forced zero-copy: %v", err)
	require.ErrorIs(t, err, fabric.ErrNotSupported, "forced zero-copy on veth must fail")
}

var _ = bytes.Equal

// TestCloseRacesBursts: Close from another goroutine while bursts run on
// the queue ends them with os.ErrClosed, without a fault.
func TestCloseRacesBursts(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	for i := 0; i < 5; i++ {
		a := openPort(t, p.A, p.NameA, &ethernet.Config{Filter: f})
		b := openPort(t, p.B, p.NameB, &ethernet.Config{Filter: f})
		errs := make(chan error, 2)
		go func() {
			q := a.Queue(0)
			fr := make([]ethernet.Frame, 64)
			for {
				n := q.Alloc(fr)
				for j := 0; j < n; j++ {
					ethernet.PutEthernet(q.Buffer(fr[j]), p.MACB, p.MACA, ethernet.EtherTypeWeft)
					fr[j].Len = 60
				}
				m, err := q.Send(fr[:n])
				q.Release(fr[m:n])
				if err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			q := b.Queue(0)
			fr := make([]ethernet.Frame, 64)
			for {
				n, err := q.Recv(fr)
				if err != nil {
					errs <- err
					return
				}
				for j := 0; j < n; j++ {
					_ = q.Data(fr[j])[12]
				}
				q.Release(fr[:n])
			}
		}()
		// Until both bursts run: frames sent on A and received on B.
		require.True(t, testenv.Eventually(5*time.Second, func() bool {
			return a.Queue(0).Stats().TXPackets > 0 && b.Queue(0).Stats().RXPackets > 0
		}), "the burst loops did not start")
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		for j := 0; j < 2; j++ {
			select {
			case err := <-errs:
				require.ErrorIs(t, err, fabric.ErrClosed)
			case <-time.After(5 * time.Second):
				t.Fatal("burst loop did not end at Close")
			}
		}
	}
}
