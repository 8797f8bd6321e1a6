// Vnet joins two TAP devices over an emulated NTB bridge, each in a
// network namespace of its own, and sends a TCP stream from one to the
// other through the kernel: virtual Ethernet over the fabric. It needs
// root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/fabric"
	_ "github.com/weft-io/weft/ntb"
	"github.com/weft-io/weft/vnet"
)

// netNS is a new network namespace, held by a goroutine locked to the
// thread that entered it; run executes functions on that thread.
type netNS struct{ do chan func() }

func newNS() (*netNS, error) {
	ns := &netNS{do: make(chan func())}
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare (needs root): %w", err)
			return
		}
		errc <- nil
		for fn := range ns.do {
			fn()
		}
	}()
	return ns, <-errc
}

func (ns *netNS) run(fn func() error) error {
	errc := make(chan error)
	ns.do <- func() { errc <- fn() }
	return <-errc
}

// side is one host: a namespace with a bridge device weft0 at ip/24.
func side(ep fabric.Endpoint, ip net.IP) (*netNS, *vnet.Bridge, error) {
	ns, err := newNS()
	if err != nil {
		return nil, nil, err
	}
	var b *vnet.Bridge
	err = ns.run(func() error {
		if b, err = vnet.New(vnet.Config{Name: "weft0"}, ep); err != nil {
			return err
		}
		c, err := rtnetlink.Dial(nil)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Address.New(&rtnetlink.AddressMessage{Family: unix.AF_INET, PrefixLength: 24,
			Index: uint32(b.Index()), Attributes: &rtnetlink.AddressAttributes{Address: ip, Local: ip}})
	})
	return ns, b, err
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(os.TempDir(), fmt.Sprintf("weft-vnet-example-%d", os.Getpid()))
	defer os.Remove(path)
	addr := path + "?maxmsg=72K" // room for a 64 KiB frame and its headers

	peer := make(chan fabric.Endpoint)
	go func() {
		ep, err := fabric.Open(ctx, "ntb", addr, nil)
		if err != nil {
			log.Fatal(err)
		}
		peer <- ep // both ends of the bridge in this process
	}()
	epA, err := fabric.Open(ctx, "ntb", addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	epB := <-peer
	defer epA.Close()
	defer epB.Close() // the devices go with their bridges, the namespaces with the process

	ipA, ipB := net.IPv4(10, 99, 0, 1).To4(), net.IPv4(10, 99, 0, 2).To4()
	nsA, bA, err := side(epA, ipA)
	if err != nil {
		log.Fatal(err)
	}
	defer bA.Close()
	nsB, bB, err := side(epB, ipB)
	if err != nil {
		log.Fatal(err)
	}
	defer bB.Close()

	var ln net.Listener
	if err := nsB.run(func() (err error) { ln, err = net.Listen("tcp4", "10.99.0.2:7000"); return }); err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	const size = 256 << 20
	got := make(chan [32]byte)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, c); err != nil {
			log.Fatal(err)
		}
		got <- [32]byte(h.Sum(nil))
	}()
	var c net.Conn
	if err := nsA.run(func() (err error) { c, err = net.Dial("tcp4", "10.99.0.2:7000"); return }); err != nil {
		log.Fatal(err)
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	start := time.Now()
	if _, err := c.Write(data); err != nil {
		log.Fatal(err)
	}
	c.Close()
	if <-got != sha256.Sum256(data) {
		log.Fatal("the stream arrived corrupted")
	}
	el := time.Since(start)
	fmt.Printf("%d MiB from %s to %s over TAP over ntb (mtu %d) in %v: %.2f Gbit/s, intact\n",
		size>>20, ipA, ipB, bA.Config().MTU, el.Round(time.Millisecond), size*8/el.Seconds()/1e9)
	st := bA.Stats()
	fmt.Printf("%s: %d frames out, %d in, carrier %v, %d malformed\n", bA.Name(), st.TxFrames, st.RxFrames, st.Carrier, st.Malformed())
}
