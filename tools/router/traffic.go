package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/ethernet/xsk"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/tools/measure"
)

// Test packets are UDP/IPv4 to dataPort. The payload starts with
// probeMagic, the generator's sequence number and its CLOCK_MONOTONIC
// timestamp.
const (
	dataPort   = 9000
	probeMagic = 0x57525452 // "WRTR"
	probeLen   = 4 + 8 + 8 + 1
	minFrame   = ethernet.UDP4HdrLen + probeLen // 63: every size from 64 fits
	genTTL     = 64
)

// Bad kinds of frame the generator mixes in when asked (-bad), one of
// each in turn: the forwarders must drop and count every one.
var badKinds = []Verdict{Malformed, BadSum, TTLExpired, TTLExpired, Unroutable}

// GenConfig configures a generator.
type GenConfig struct {
	Ports    []string           // its veth ends, one per node
	Ranks    []int              // the node behind each port (nil: 0, 1, ...)
	DstMACs  []net.HardwareAddr // the node's ingress MAC behind each port
	Size     int                // frame size in bytes (without FCS)
	Rate     float64            // packets per second over all ports (0: as fast as it can)
	Duration time.Duration      //
	Nodes    int                // for the FIB
	Routes   int
	BadEvery int // every BadEvery-th packet is a bad one (0: none)
}

// GenResult is what a generator reports.
type GenResult struct {
	Sent    uint64            `json:"sent"`
	Bad     map[string]uint64 `json:"bad,omitempty"`
	Seconds float64           `json:"seconds"`
	// Unsent are frames still on a TX ring when the generator gave up
	// waiting for the kernel, LinkDrops those the kernel dropped on the
	// generator's links (its tx_dropped: the veth's ring to a node that
	// did not keep up). Both are counted in Sent, but no node saw them.
	Unsent    uint64 `json:"unsent,omitempty"`
	LinkDrops uint64 `json:"link_drops,omitempty"`
	// Skipped are packets a paced generator did not send because it
	// fell behind its schedule by more than two bursts: never offered.
	Skipped uint64 `json:"skipped,omitempty"`
}

// txDropped reads the kernel's tx_dropped counter of interface name.
func txDropped(name string) uint64 {
	b, _ := os.ReadFile("/sys/class/net/" + name + "/statistics/tx_dropped")
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// runGen offers fixed-size packets round robin over its ports until the
// duration is over. Frames are written in place in the UMEM from a
// template; nothing is allocated per packet.
func runGen(ctx context.Context, c GenConfig) (GenResult, error) {
	var res GenResult
	dsts := make([][4]byte, 4096)
	if _, err := GenFIB(c.Routes, c.Nodes, dsts); err != nil {
		return res, err
	}
	if c.Size < minFrame || c.Size > 1514 {
		return res, fmt.Errorf("size %d out of [%d, 1514]", c.Size, minFrame)
	}
	if (c.Ranks != nil && len(c.Ranks) != len(c.Ports)) || len(c.DstMACs) != len(c.Ports) {
		return res, fmt.Errorf("%d ports, %d ranks, %d MACs", len(c.Ports), len(c.Ranks), len(c.DstMACs))
	}
	type port struct {
		p      *ethernet.Port
		q      *ethernet.Queue
		rank   byte   // the node behind the port: the flow's number at the sink
		drops0 uint64 // its tx_dropped at the start
		tmpl   [ethernet.UDP4HdrLen]byte
		frms   []ethernet.Frame
	}
	ports := make([]*port, len(c.Ports))
	for i, name := range c.Ports {
		p, err := ethernet.Open(name, &ethernet.Config{Frames: 4096, FrameSize: 2048})
		if err != nil {
			return res, err
		}
		defer p.Close()
		rank := i
		if c.Ranks != nil {
			rank = c.Ranks[i]
		}
		pt := &port{p: p, q: p.Queue(0), rank: byte(rank), frms: make([]ethernet.Frame, 32), drops0: txDropped(name)}
		ethernet.PutUDP4(pt.tmpl[:], &ethernet.UDP4{
			SrcMAC: p.Link().MAC, DstMAC: c.DstMACs[i],
			SrcIP: netip.AddrFrom4([4]byte{10, 1, byte(rank), 1}), DstIP: netip.AddrFrom4([4]byte{1, 1, 1, 1}),
			SrcPort: dataPort, DstPort: dataPort, TTL: genTTL,
		}, c.Size-ethernet.UDP4HdrLen)
		ports[i] = pt
	}
	const burst = 32
	const maxLag = 2 * burst
	start := time.Now()
	end := start.Add(c.Duration)
	var seq uint64
	var bad [NumVerdicts]uint64
	for k := 0; ; k++ {
		now := time.Now()
		if now.After(end) || ctx.Err() != nil {
			break
		}
		want := burst
		if c.Rate > 0 { // pace: the packets sent so far are due by now
			due := start.Add(time.Duration(float64(seq+res.Skipped) / c.Rate * 1e9))
			if d := due.Sub(now); d > 0 {
				if d > 10*time.Microsecond {
					sleepFor(d) // a paced generator gives the core away
				}
				continue
			}
			// Behind: a stall (the scheduler, an emulated machine's
			// vCPU) is not made up in one burst, which the links could
			// not take (a veth holds 256 frames): beyond maxLag packets
			// the schedule moves on without them.
			lag := int(c.Rate*now.Sub(start).Seconds()) - int(seq+res.Skipped)
			if lag > maxLag {
				res.Skipped += uint64(lag - maxLag)
				lag = maxLag
			}
			want = 1 + min(burst-1, lag)
		}
		pt := ports[k%len(ports)]
		n := pt.q.Alloc(pt.frms[:want])
		ts := measure.MonoNow()
		for i := range n {
			b := pt.q.Buffer(pt.frms[i])[:c.Size]
			copy(b, pt.tmpl[:])
			copy(b[30:34], dsts[seq%uint64(len(dsts))][:])
			binary.BigEndian.PutUint32(b[42:], probeMagic)
			binary.BigEndian.PutUint64(b[46:], seq)
			binary.BigEndian.PutUint64(b[54:], uint64(ts))
			b[62] = pt.rank
			b[24], b[25] = 0, 0
			if c.BadEvery > 0 && seq%uint64(c.BadEvery) == uint64(c.BadEvery-1) {
				kind := int(seq/uint64(c.BadEvery)) % len(badKinds)
				bad[badKinds[kind]]++
				corrupt(b, kind)
			} else {
				binary.BigEndian.PutUint16(b[24:], checksum(b[14:34]))
			}
			pt.frms[i].Len = c.Size
			seq++
		}
		m, err := pt.q.Send(pt.frms[:n])
		if err != nil {
			return res, err
		}
		pt.q.Release(pt.frms[m:n])
		seq -= uint64(n - m) // not sent: their numbers are used again
	}
	for _, pt := range ports {
		for flushEnd := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
			left, _ := pt.q.Flush()
			if left == 0 || time.Now().After(flushEnd) {
				res.Unsent += uint64(left)
				break
			}
		}
		res.LinkDrops += txDropped(pt.p.Link().Name) - pt.drops0
	}
	res.Sent = seq
	res.Seconds = time.Since(start).Seconds()
	for v, n := range bad {
		if n > 0 {
			if res.Bad == nil {
				res.Bad = map[string]uint64{}
			}
			res.Bad[Verdict(v).String()] = n
		}
	}
	return res, nil
}

// corrupt turns the frame b (checksum field zero) into bad kind k.
func corrupt(b []byte, k int) {
	switch k {
	case 0: // header length below the minimum
		b[14] = 0x44
	case 1: // checksum off by one
		binary.BigEndian.PutUint16(b[24:], checksum(b[14:34])+1)
		return
	case 2:
		b[22] = 1
	case 3:
		b[22] = 0
	case 4:
		copy(b[30:34], unroutable[:])
	}
	binary.BigEndian.PutUint16(b[24:], checksum(b[14:34]))
}

// SinkResult is what a sink measured.
type SinkResult struct {
	Received  uint64   `json:"received"`
	Bytes     uint64   `json:"bytes"`
	Reordered uint64   `json:"reordered"`
	Bad       uint64   `json:"bad"`     // not a probe, wrong TTL or checksum
	Seconds   float64  `json:"seconds"` // first to last packet
	MedianUs  float64  `json:"median_us"`
	P99Us     float64  `json:"p99_us"`
	PerPort   []uint64 `json:"per_port"`
	// Kernel are the kernel's counters of the sink's sockets.
	Kernel []xsk.Statistics `json:"kernel"`
}

// runSink receives on its ports until ctx is done and its rings are
// empty, and measures. A packet
// that arrives with a lower sequence number than one seen before on the
// flow (generator port to sink port: one path) counts as reordered.
func runSink(ctx context.Context, ports []string, spin time.Duration, ready func()) (SinkResult, error) {
	if len(ports) > maxNodes {
		return SinkResult{}, fmt.Errorf("%d sink ports, at most %d", len(ports), maxNodes)
	}
	res := SinkResult{PerPort: make([]uint64, len(ports))}
	qs := make([]*ethernet.Queue, len(ports))
	for i, name := range ports {
		p, err := ethernet.Open(name, &ethernet.Config{
			Filter: ethernet.Filter{UDPPorts: []uint16{dataPort}}, Frames: 4096, FrameSize: 2048,
		})
		if err != nil {
			return res, err
		}
		defer p.Close()
		qs[i] = p.Queue(0)
	}
	// Idle, the sink parks on one wait set over its ports (it naps only
	// if the set cannot be made).
	ws, err := fabric.NewWaitSet()
	if err == nil {
		defer ws.Close()
		for _, q := range qs {
			ws.Add(q)
		}
	}
	ready()
	var h measure.Hist
	var last [256][maxNodes]uint64 // by generator port, sink port
	frms := make([]ethernet.Frame, 64)
	var first, lastAt time.Time
	var u ethernet.UDP4
	sp := newSpinner(spin)
	for {
		// Asked to stop, the sink still takes what its rings hold.
		stopping := ctx.Err() != nil
		got := 0
		for pi, q := range qs {
			n, err := q.Recv(frms)
			if err != nil {
				return res, err
			}
			if n == 0 {
				continue
			}
			got += n
			now := measure.MonoNow()
			for _, f := range frms[:n] {
				d := q.Data(f)
				pl, ok := ethernet.ParseUDP4(d, &u)
				if !ok || len(pl) < probeLen || binary.BigEndian.Uint32(pl) != probeMagic || d[22] != genTTL-1 {
					res.Bad++
					continue
				}
				seq := binary.BigEndian.Uint64(pl[4:])
				if in := pl[20]; seq < last[in][pi] {
					res.Reordered++
				} else {
					last[in][pi] = seq
				}
				h.Add(now - int64(binary.BigEndian.Uint64(pl[12:])))
				res.Received++
				res.PerPort[pi]++
				res.Bytes += uint64(len(d))
			}
			q.Release(frms[:n])
		}
		if got > 0 {
			lastAt = time.Now()
			if first.IsZero() {
				first = lastAt
			}
			sp.work()
		} else if stopping {
			break
		} else if sp.idle(ctx) {
			if ws != nil { // idle: give the core away until a port has work
				ws.WaitFor(ctx, idleMax)
			} else {
				nap()
			}
		}
	}
	for _, q := range qs {
		res.Kernel = append(res.Kernel, q.Stats().Kernel)
	}
	if !first.IsZero() {
		res.Seconds = lastAt.Sub(first).Seconds()
	}
	res.MedianUs, res.P99Us = h.Quantile(0.5)/1e3, h.Quantile(0.99)/1e3
	return res, nil
}
