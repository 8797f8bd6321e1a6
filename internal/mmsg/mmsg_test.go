package mmsg

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

func fdOf(t testing.TB, c *net.UDPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

func TestSendRecvBatch(t *testing.T) {
	for _, network := range []string{"127.0.0.1:0", "[::1]:0"} {
		a, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(network)))
		if err != nil {
			testenv.SkipOrFail(t, fmt.Sprintf("no loopback UDP on %s: %v", network, err))
		}
		defer a.Close()
		b, _ := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(network)))
		defer b.Close()
		dst := b.LocalAddr().(*net.UDPAddr).AddrPort()
		batch := NewBatch(8)
		out := make([]Message, 5)
		for i := range out {
			out[i] = Message{Buf: []byte{byte(i), 1, 2, 3}, N: 1 + i%4, Addr: dst}
		}
		if n, err := batch.Send(fdOf(t, a), out); n != 5 || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
		in := make([]Message, 8)
		for i := range in {
			in[i].Buf = make([]byte, 64)
		}
		got := 0
		deadline := time.Now().Add(5 * time.Second)
		for got < 5 && time.Now().Before(deadline) {
			n, err := batch.Recv(fdOf(t, b), in[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		if got != 5 {
			t.Fatalf("received %d of 5", got)
		}
		src := a.LocalAddr().(*net.UDPAddr).AddrPort()
		for i := 0; i < 5; i++ {
			if in[i].N != 1+i%4 || in[i].Buf[0] != byte(i) || in[i].Addr != src {
				t.Fatalf("message %d: n=%d first=%d from %v, want n=%d from %v", i, in[i].N, in[i].Buf[0], in[i].Addr, 1+i%4, src)
			}
		}
		if n, err := batch.Recv(fdOf(t, b), in); n != 0 || err != nil {
			t.Fatalf("Recv on an empty socket = %d, %v", n, err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			batch.Send(fdOf(t, a), out[:1])
			for {
				if n, _ := batch.Recv(fdOf(t, b), in); n > 0 {
					break
				}
			}
		})
		if allocs > 1 { // fdOf's Control closure
			t.Errorf("%.1f allocations per send+receive", allocs)
		}
	}
}
