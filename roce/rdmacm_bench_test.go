package roce

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/roce/link"
)

// benchCM dials b.N connections to a listener that accepts them all, with
// par dials at a time, and reports connections per second. Each
// connection is a full REQ/REP/RTU handshake with QP creation and
// RESET→RTS on both sides, then a DREQ/DREP.
func benchCM(b *testing.B, par int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ea, eb, _ := enginePair(b, link.Port, link.LossConfig{})
	qcfg := QPConfig{RecvBuffer: 1 << 14, MaxMsgSize: 1024, SQDepth: 8, InlineSize: 64}
	l, err := eb.CM().Listen(7471, 1024, &ConnConfig{QP: qcfg})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	pa, pb := ea.AllocPD(), eb.AllocPD()
	go func() {
		for {
			r, err := l.Next(ctx)
			if err != nil {
				return
			}
			go func() {
				if c, err := r.Accept(ctx, pb, nil); err == nil {
					<-c.Done()
					c.QP().Destroy()
				}
			}()
		}
	}()
	raddr := netip.MustParseAddrPort("127.0.0.2:7471")
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := ea.CM().Dial(ctx, pa, raddr, &ConnConfig{QP: qcfg})
			if err != nil {
				b.Error(err)
				return
			}
			c.Disconnect(ctx)
			c.QP().Destroy()
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
}

// BenchmarkCMConnect is the connect latency: one dial at a time.
func BenchmarkCMConnect(b *testing.B) { benchCM(b, 1) }

// BenchmarkCMConnect64 is the connection rate with 64 concurrent dials.
func BenchmarkCMConnect64(b *testing.B) { benchCM(b, 64) }

// BenchmarkTCPConnect64 is Go TCP on loopback with 64 concurrent dials,
// connect and close, for comparison in the same run.
func BenchmarkTCPConnect64(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				var x [1]byte
				c.Read(x[:])
				c.Close()
			}()
		}
	}()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := d.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Error(err)
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
}
