package ethernet_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
)

// A router's receive loop: frames for UDP port 4789 go to the AF_XDP
// socket of queue 0, everything else to the kernel.
func ExampleOpen() {
	port, err := ethernet.Open("eth0", &ethernet.Config{
		Filter: ethernet.Filter{UDPPorts: []uint16{4789}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer port.Close()
	q := port.Queue(0)
	frames := make([]ethernet.Frame, 64)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, err := q.RecvWait(ctx, frames)
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range frames[:n] {
		if payload, ok := ethernet.ParseUDP4(q.Data(f), nil); ok {
			fmt.Println(len(payload))
		}
	}
	q.Release(frames[:n])
}

// Forwarding without a copy: rewrite the Ethernet header in place and
// send the received frames back out of the same queue.
func ExampleQueue_Send() {
	port, err := ethernet.Open("eth0", &ethernet.Config{Filter: ethernet.Filter{All: true}})
	if err != nil {
		log.Fatal(err)
	}
	defer port.Close()
	q := port.Queue(0)
	frames := make([]ethernet.Frame, 64)
	for {
		n, err := q.Recv(frames)
		if err != nil {
			log.Fatal(err)
		}
		for _, f := range frames[:n] {
			d := q.Data(f)
			var mac [6]byte
			copy(mac[:], d[0:6])
			copy(d[0:6], d[6:12])
			copy(d[6:12], mac[:])
		}
		sent, err := q.Send(frames[:n])
		if err != nil {
			log.Fatal(err)
		}
		q.Release(frames[sent:n]) // TX ring full: drop the rest
	}
}

// A fabric endpoint over an interface; the peer runs the same on its
// side of the link.
func ExampleDial() {
	ep, err := fabric.Open(context.Background(), "ethernet", "eth0?peer=02:00:00:00:00:02", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ep.Close()
	buf, _ := ep.Alloc(4096, 0)
	copy(buf.Bytes(), "hello")
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 5}}}}
	if _, err := ep.SendWait(context.Background(), msgs); err != nil {
		log.Fatal(err)
	}
	fmt.Println(ep.Caps().Reliable)
}

func ExampleParseAddr() {
	c, err := ethernet.ParseAddr("eth0?queue=1&peer=02:00:00:00:00:02&xdp=native")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Interface, c.Queue, c.PeerMAC, c.Attach)
	// Output: eth0 1 02:00:00:00:00:02 native
}
