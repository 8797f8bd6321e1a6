package roce

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
)

// TestSendFailureDropsOne: a datagram the link fails to write (its QP's
// source port is taken by another program) is dropped and counted, and
// the datagrams after it in the same batch, another QP's to another
// peer, still go out. The engine dropped the whole rest of the batch.
func TestSendFailureDropsOne(t *testing.T) {
	udp := func(addr string) *net.UDPConn {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A port the link cannot bind: Go binds it without SO_REUSEADDR.
	taken := udp("127.0.0.1:0").LocalAddr().(*net.UDPAddr).AddrPort().Port()
	peer := udp("127.0.0.1:0")
	to := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	port := uint16(freePort(t))
	l, err := link.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(EngineConfig{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	pkts := []link.Packet{
		{Buf: []byte("lost"), N: 4, Addr: to, SrcPort: taken},
		{Buf: []byte("sent"), N: 4, Addr: to},
		{Buf: []byte("also"), N: 4, Addr: to},
	}
	before := e.Stats()
	e.send(pkts)
	after := e.Stats()
	if d := after.Drops[fabric.DropNoBuffer] - before.Drops[fabric.DropNoBuffer]; d != 1 {
		t.Errorf("dropped %d, want 1 (the datagram from the taken port)", d)
	}
	if n := after.TxPackets - before.TxPackets; n != 2 {
		t.Errorf("sent %d, want 2", n)
	}
	buf := make([]byte, 64)
	for _, want := range []string{"sent", "also"} {
		peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
		if string(buf[:n]) != want || from.Port() != port {
			t.Fatalf("got %q from port %d, want %q from the link's port %d", buf[:n], from.Port(), want, port)
		}
	}
}
