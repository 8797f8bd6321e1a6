package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/rdm"
)

// The back-plane joins the nodes in a full mesh through one fabric/rdm
// endpoint per node. RouteBricks-style, the node where a packet enters
// looks it up, and hands it to the node that owns its egress port over the
// back-plane; that node only transmits it.
//
// A back-plane name is a backend ("ntb", "roce", "ethernet"), optionally
// with "+batch": packets to one peer are then coalesced into one message
// per batch with package batch (one SGE per packet, gathered in place from
// the node's staging slots) instead of one message per packet.
//
// Each pair of nodes uses one connection: the node of lower rank dials,
// the other accepts, so both send and receive on the same connection and
// each node can read the peer's messages straight off it with a
// batch.Splitter (which also passes unbatched messages through whole).

const (
	slotSize  = 2048 // a staging slot holds one frame
	slotCount = 1024 // staging slots per peer
)

// splitBackplane returns the backend of bp and whether it is batched.
func splitBackplane(bp string) (backend string, batched bool) {
	return strings.CutSuffix(bp, "+batch")
}

// nodeName is how node i is known in the mesh.
func nodeName(i int) string { return "n" + strconv.Itoa(i) }

func nodeRank(name string) (int, error) { return strconv.Atoi(strings.TrimPrefix(name, "n")) }

// Ports of the verbs back-plane (one node per machine): the rdma_cm port
// every node listens at (librdmacm's default, as rdma_server's), and the
// TCP port of the run's control connection (see control).
const (
	verbsCMPort = 7471
	ctlPort     = 7470
)

// meshConfig returns the listen address and rdm configuration of node
// c.Rank of c.Nodes over backend. NTB joins two hosts per bridge, so node
// i listens on one emulated bridge per peer (a file in c.Dir); the network
// back-planes of one host listen on the point-to-point veth of each pair
// (pairIP, pairMAC). Verbs joins nodes on different machines, each with
// its RDMA device: one rdma_cm listener per node at its address in
// c.Addrs takes every peer.
func meshConfig(backend string, c NodeConfig) (string, *rdm.Config, error) {
	i, n, set := c.Rank, c.Nodes, c.Settings
	cfg := &rdm.Config{Name: nodeName(i), DialTimeout: 5 * time.Second}
	cfg.Options.QueueDepth = set.QueueDepth
	cfg.Options.MaxMsgSize = 64 << 10
	cfg.Options.Spin = time.Duration(set.Spin)
	var listen func(j int) string
	var dial func(j int) string
	self := ""
	switch backend {
	case "ntb":
		listen = func(j int) string { return filepath.Join(c.Dir, fmt.Sprintf("b-%d-%d", i, j)) }
		dial = func(j int) string { return filepath.Join(c.Dir, fmt.Sprintf("b-%d-%d?listener=1", j, i)) }
	case "roce":
		var params []string
		if set.GSO {
			params = append(params, "gso=1")
		}
		if set.XDP {
			params = append(params, "link=xdp")
		}
		q := ""
		if len(params) > 0 {
			q = "?" + strings.Join(params, "&")
		}
		listen = func(j int) string { return "listen:" + pairIP(i, j).String() + ":18515" + q }
		dial = func(j int) string { return pairIP(j, i).String() + ":18515" + q }
	case "ethernet":
		// Raw Ethernet framing (EtherType 0x88B5), the paper's
		// DPDK-Ethernet baseline: no IP or UDP on the back-plane.
		listen = func(j int) string { return pairIf(j) }
		dial = func(j int) string { return pairIf(j) + "?peer=" + pairMAC(j, i).String() + "&listener=1" }
	case "verbs":
		if len(c.Addrs) != n {
			return "", nil, fmt.Errorf("back-plane verbs: %d addresses for %d nodes: %w", len(c.Addrs), n, errNeedAddrs)
		}
		cm := func(j int) string { return "rdmacm://" + netip.AddrPortFrom(c.Addrs[j], verbsCMPort).String() }
		self = cm(i)
		dial = cm
	default:
		return "", nil, fmt.Errorf("back-plane %q: want ntb, roce, ethernet or verbs (+batch)", backend)
	}
	for j := range n {
		if j != i && listen != nil {
			cfg.Listen = append(cfg.Listen, listen(j))
		}
	}
	cfg.Resolve = func(name string) (string, error) {
		j, err := nodeRank(name)
		if err != nil || j < 0 || j >= n {
			return "", fmt.Errorf("no node %q", name)
		}
		return dial(j), nil
	}
	return self, cfg, nil
}

// errNeedAddrs: the verbs back-plane runs one node per machine and needs
// every node's address (-addrs).
var errNeedAddrs = errors.New("verbs needs every node's RDMA address (-addrs), one node per machine")

// Backplane is a node's side of the mesh.
type Backplane struct {
	rank, n int
	backend string
	batched bool
	set     Settings
	ep      *rdm.Endpoint
	links   []*Link // by rank; nil for this node
	ups     chan *Link
	ctx     context.Context
	logf    func(string, ...any)
	// rejoin: this node was restarted and dials every peer; the others
	// wait for it.
	rejoin bool
}

// Link is the connection to one peer node with its send staging and its
// receive splitter. It belongs to the forwarding loop.
type Link struct {
	rank   int
	peer   rdm.Peer
	conn   fabric.Endpoint
	up     bool
	inline int // Send copies messages up to this size

	region *fabric.Region
	buf    []byte
	free   []uint32 // free staging slots

	// unbatched: one message per packet
	msgs     []fabric.Message
	npending int
	sges     []fabric.SGE
	comps    []fabric.Completion
	// batched
	co      *batch.Coalescer
	cookies []uint64

	sp   *batch.Splitter
	pkts []batch.Packet
}

// openBackplane opens node rank's endpoint and connects to every peer,
// waiting up to the context's deadline for the whole mesh.
//
// A node that was restarted (rejoin) dials every peer, since they only
// wait for it: a survivor never dials a lost peer, so no attempt is wasted
// on a node that is not back yet.
func openBackplane(ctx context.Context, c NodeConfig, logf func(string, ...any)) (*Backplane, error) {
	backend, batched := splitBackplane(c.Backplane)
	rank, n := c.Rank, c.Nodes
	listen, cfg, err := meshConfig(backend, c)
	if err != nil {
		return nil, err
	}
	ep, err := rdm.Open(ctx, backend, listen, cfg)
	if err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	b := &Backplane{rank: rank, n: n, backend: backend, batched: batched, set: c.Settings, ep: ep,
		links: make([]*Link, n), ups: make(chan *Link, n), ctx: ctx, logf: logf, rejoin: c.Rejoin}
	for j := range n {
		if j == rank {
			continue
		}
		l, err := b.connect(ctx, j, rank < j || c.Rejoin)
		if err != nil {
			ep.Close()
			return nil, fmt.Errorf("node %d: peer %d: %w", rank, j, err)
		}
		b.links[j] = l
	}
	return b, nil
}

// connect makes (dial) or waits for the connection to peer j and sets up
// its link.
func (b *Backplane) connect(ctx context.Context, j int, dial bool) (*Link, error) {
	p, err := b.ep.Insert(nodeName(j))
	if err != nil {
		return nil, err
	}
	for dial {
		err := b.ep.Connect(ctx, p)
		if err == nil {
			break
		}
		// A peer that refuses has no listener yet: it is still starting
		// (its FIB, on another machine), and the mesh waits for every
		// node until ctx's deadline. rdm reports the failed attempt as
		// the peer's loss; Rejoin ignores that stale handle.
		if !errors.Is(err, fabric.ErrRefused) || ctx.Err() != nil {
			return nil, err
		}
		b.ep.Remove(p)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(refusedRetry):
		}
		if p, err = b.ep.Insert(nodeName(j)); err != nil {
			return nil, err
		}
	}
	var conn fabric.Endpoint
	for conn = b.ep.Endpoint(p); conn == nil; conn = b.ep.Endpoint(p) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	l := &Link{rank: j, peer: p, conn: conn, up: true, inline: conn.Caps().InlineSize}
	if l.region, err = b.stagingRegion(conn); err != nil {
		return nil, err
	}
	l.buf = l.region.Bytes()
	for s := range slotCount {
		l.free = append(l.free, uint32(s))
	}
	burst := max(b.set.Burst, 1)
	l.msgs = make([]fabric.Message, burst)
	l.sges = make([]fabric.SGE, burst)
	for i := range l.msgs {
		l.msgs[i].SGEs = l.sges[i : i+1]
	}
	l.comps = make([]fabric.Completion, 64)
	l.cookies = make([]uint64, slotCount)
	if b.batched {
		l.co, err = batch.NewCoalescer(conn, &batch.Options{
			MaxPackets: min(b.set.BatchPackets, conn.Caps().MaxSGEs-1),
			MaxBytes:   min(b.set.BatchBytes, conn.Caps().MaxMsgSize),
			Deadline:   time.Duration(b.set.BatchDeadline),
		})
		if err != nil {
			return nil, err
		}
	}
	if l.sp, err = batch.NewSplitter(conn, nil); err != nil {
		return nil, err
	}
	l.pkts = make([]batch.Packet, burst)
	return l, nil
}

// refusedRetry is the pause between dials that a peer refused because
// it did not listen yet.
const refusedRetry = 200 * time.Millisecond

// stagingRegion returns the memory a link stages its packets in. rdm's
// host memory serves every backend that moves local bytes with the CPU;
// verbs refuses it (its NIC reads the SGEs itself, and a batch is larger
// than the bounce slot that Send copies into), so there the staging slots
// are registered with the connection.
func (b *Backplane) stagingRegion(conn fabric.Endpoint) (*fabric.Region, error) {
	if b.backend == "verbs" {
		return conn.Alloc(slotSize*slotCount, 0)
	}
	return b.ep.Alloc(slotSize * slotCount)
}

// Stage copies frame into a staging slot for peer l and queues it: into
// the open batch, or as the next message of the burst that Flush sends.
// It reports false if the packet had to be dropped (no slot, batch
// descriptors or burst room: the back-plane is behind).
func (l *Link) Stage(frame []byte) bool {
	if !l.up || len(l.free) == 0 || len(frame) > slotSize {
		return false
	}
	s := l.free[len(l.free)-1]
	off := int(s) * slotSize
	copy(l.buf[off:], frame)
	sge := fabric.SGE{Region: l.region, Offset: off, Length: len(frame)}
	if l.co != nil {
		if l.co.Add(sge, uint64(s)) != nil {
			return false
		}
		l.free = l.free[:len(l.free)-1]
		return true
	}
	k := l.pending()
	if k == len(l.msgs) {
		return false
	}
	l.free = l.free[:len(l.free)-1]
	l.sges[k] = sge
	l.msgs[k].Context = uint64(s)
	l.msgs[k].Flags = 0
	if len(frame) > l.inline {
		l.msgs[k].Flags = fabric.FlagSignal
	}
	l.npending++
	return true
}

func (l *Link) pending() int { return l.npending }

// Flush sends what Stage queued (unbatched) or keeps the batches' deadline
// (batched), and takes back the staging slots whose messages are done. It
// returns how many packets were dropped because the connection failed
// (unbatched: what the peer pushes back stays queued; Stage drops when
// the queue is full).
func (b *Backplane) Flush(l *Link, now time.Time) (dropped int, err error) {
	if l.co != nil {
		_, err = l.co.Tick(now)
		n := l.co.Reclaim(l.cookies)
		for _, c := range l.cookies[:n] {
			l.free = append(l.free, uint32(c))
		}
	} else {
		if k := l.npending; k > 0 {
			var n int
			n, err = b.ep.Send(l.peer, l.msgs[:k])
			for i := range n {
				if l.msgs[i].Flags&fabric.FlagSignal == 0 {
					l.free = append(l.free, uint32(l.msgs[i].Context))
				}
			}
			if err != nil {
				// The connection failed: what it did not take is lost.
				for i := n; i < k; i++ {
					l.free = append(l.free, uint32(l.msgs[i].Context))
				}
				dropped, l.npending = k-n, 0
			} else {
				// The peer pushed back (its window is full): what it did
				// not take stays queued, in order, for the next Flush,
				// like a router's output queue. Stage drops (BPDrop) once
				// the queue is full, so a peer stalled for a moment costs
				// nothing and one that stays slow costs what overflows.
				for i := n; i < k; i++ {
					l.sges[i-n] = l.sges[i]
					l.msgs[i-n].Context, l.msgs[i-n].Flags = l.msgs[i].Context, l.msgs[i].Flags
				}
				l.npending = k - n
			}
		}
		for {
			n := l.conn.CQ().Poll(l.comps)
			for _, c := range l.comps[:n] {
				l.free = append(l.free, uint32(c.Context))
			}
			if n < len(l.comps) {
				break
			}
		}
	}
	if err != nil && errors.Is(err, fabric.ErrPeerGone) {
		l.up = false
	}
	return dropped, err
}

// Receive hands each packet that arrived from peer l to fn, and returns
// how many.
func (l *Link) Receive(fn func([]byte)) (int, error) {
	if !l.up {
		return 0, nil
	}
	n, err := l.sp.Recv(l.pkts)
	for i := range n {
		fn(l.pkts[i].Data)
	}
	l.sp.Release(l.pkts[:n])
	if err != nil && errors.Is(err, fabric.ErrPeerGone) {
		l.up = false
	}
	return n, err
}

// close drops the link's coalescer and splitter (the connection is rdm's).
func (l *Link) close() {
	l.up = false
	if l.co != nil {
		l.co.Close()
	}
	l.sp.Close()
}

// Events reports peers that went away; the node then calls Rejoin.
func (b *Backplane) Events() <-chan rdm.Event { return b.ep.Events() }

// Rejoin takes the link to the node of a lost peer out of service and
// waits in the background for the peer to come back and dial us; the loop
// picks the new link up from Ups (the peer may take any time).
func (b *Backplane) Rejoin(ev rdm.Event) {
	j, err := nodeRank(ev.Name)
	if err != nil || j < 0 || j >= b.n || b.links[j] == nil || b.links[j].peer != ev.Peer {
		return
	}
	b.links[j].close()
	b.logf("node %d: peer %d gone (%v); rejoining", b.rank, j, ev.Err)
	go func() {
		for b.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
			l, err := b.connect(ctx, j, false)
			cancel()
			if err == nil {
				b.logf("node %d: peer %d back", b.rank, j)
				b.ups <- l
				return
			}
			if b.ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				b.logf("node %d: peer %d: %v", b.rank, j, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}

// Ups delivers links that came (back) up after Rejoin.
func (b *Backplane) Ups() <-chan *Link { return b.ups }

// Close closes the endpoint and every connection.
func (b *Backplane) Close() error {
	for _, l := range b.links {
		if l != nil {
			l.close()
		}
	}
	return b.ep.Close()
}
