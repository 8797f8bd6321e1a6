package ntb

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// A topology is hosts joined by bridges, each bridge its own emulated
// device and transport: one process opens several bridges, as a host with
// a multi-port NTB switch (PCIeLINK's four ports) does.
type topology struct {
	nodes int
	links [][2]int              // bridge i joins links[i][0] and links[i][1]
	next  func(at, dst int) int // next hop from at towards dst
	flows [][2]int              // src sends to dst, at least two hops away
}

var topologies = map[string]topology{
	// A ring of 4: bridge i joins i and i+1; traffic goes clockwise, two
	// hops to the opposite host, relayed by the host between.
	"ring4": {nodes: 4, links: [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 0}},
		next:  func(at, dst int) int { return (at + 1) % 4 },
		flows: [][2]int{{0, 2}, {1, 3}, {2, 0}, {3, 1}}},
	// A star: host 0 is the hub with a bridge to each leaf; leaf to leaf
	// is two hops through the hub.
	"star4": {nodes: 4, links: [][2]int{{0, 1}, {0, 2}, {0, 3}},
		next: func(at, dst int) int {
			if at == 0 {
				return dst
			}
			return 0
		},
		flows: [][2]int{{1, 2}, {2, 3}, {3, 1}}},
	// Back to back: one bridge, one hop.
	"pair": {nodes: 2, links: [][2]int{{0, 1}}, next: func(at, dst int) int { return dst },
		flows: [][2]int{{0, 1}, {1, 0}}},
}

const (
	topoMsgs    = 2000
	topoHdr     = 16 // src, dst u32; seq u64
	envTopoNode = "WEFT_TOPO_NODE"
	envTopoDir  = "WEFT_TOPO_DIR"
	envTopoName = "WEFT_TOPO"
)

// TestTopologies runs every topology with one process per host: the test
// binary re-executed per node. Each host sends numbered messages to its
// flow's destination; hosts on the way forward them over Weft's API
// (Recv on one bridge, Send on the next); each destination checks that
// every message arrived once, in order and intact.
func TestTopologies(t *testing.T) {
	if node := os.Getenv(envTopoNode); node != "" {
		n, _ := strconv.Atoi(node)
		runTopoNode(t, topologies[os.Getenv(envTopoName)], n, os.Getenv(envTopoDir))
		return
	}
	for name := range topologies {
		t.Run(name, func(t *testing.T) {
			top := topologies[name]
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			outs := make([]bytes.Buffer, top.nodes)
			errs := make([]error, top.nodes)
			for i := 0; i < top.nodes; i++ {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTopologies$", "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), envTopoNode+"="+strconv.Itoa(i), envTopoDir+"="+dir, envTopoName+"="+name)
				cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = cmd.Wait() }()
			}
			wg.Wait()
			for i := range errs {
				if errs[i] != nil || !bytes.Contains(outs[i].Bytes(), []byte("--- PASS: TestTopologies")) {
					t.Errorf("host %d: %v\n%s", i, errs[i], outs[i].String())
				}
			}
		})
	}
}

func runTopoNode(t *testing.T, top topology, me int, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Open every bridge this host is on, each its own device and
	// transport, concurrently (each waits for its peer).
	eps := map[int]*Endpoint{} // by neighbour
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, l := range top.links {
		if l[0] != me && l[1] != me {
			continue
		}
		peer := l[0] + l[1] - me
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep, err := DialShm(ctx, filepath.Join(dir, fmt.Sprintf("bridge%d", i)), ShmConfig{MemSize: 4 << 20}, Config{RingSize: 256 << 10})
			if err != nil {
				t.Errorf("bridge %d to host %d: %v", i, peer, err)
				return
			}
			mu.Lock()
			eps[peer] = ep
			mu.Unlock()
		}()
	}
	wg.Wait()
	defer func() {
		for _, ep := range eps {
			ep.Close()
		}
	}()
	if t.Failed() {
		return
	}
	for a, ea := range eps {
		for b, eb := range eps {
			if a != b && ea.t == eb.t {
				t.Fatalf("bridges to %d and %d share a transport", a, b)
			}
		}
	}
	expect := -1 // the source whose flow ends here
	target := -1
	for _, f := range top.flows {
		if f[1] == me {
			expect = f[0]
		}
		if f[0] == me {
			target = f[1]
		}
	}
	received := make(chan struct{})
	allDone := func() bool {
		for i := 0; i < top.nodes; i++ {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("done%d", i))); err != nil {
				return false
			}
		}
		return true
	}
	if expect < 0 {
		close(received)
	}
	// One sender per bridge, fed by a queue: this host's flow and what it
	// forwards.
	var rwg sync.WaitGroup
	stop := make(chan struct{})
	queues := map[int]chan []byte{}
	for to, ep := range eps {
		q := make(chan []byte, topoMsgs*top.nodes)
		queues[to] = q
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			sb, _ := ep.Alloc(256, 0)
			out := make([]fabric.Message, 1)
			for {
				var m []byte
				select {
				case <-stop:
					return
				case m = <-q:
				}
				copy(sb.Bytes(), m)
				out[0] = fabric.Message{SGEs: []fabric.SGE{{Region: sb, Length: len(m)}}}
				if _, err := ep.SendWait(ctx, out); err != nil {
					t.Errorf("send to %d: %v", to, err)
					return
				}
			}
		}()
	}
	// One receiver per bridge: deliver or forward.
	for from, ep := range eps {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			buf, _ := ep.Alloc(32*256, fabric.AccessLocalWrite)
			msgs := make([]fabric.Message, 32)
			next := uint64(0)
			for {
				for i := range msgs {
					msgs[i] = fabric.Message{SGEs: []fabric.SGE{{Region: buf, Offset: 256 * i, Length: 256}}}
				}
				rctx, rcancel := context.WithTimeout(ctx, 50*time.Millisecond)
				n, err := ep.RecvWait(rctx, msgs)
				rcancel()
				select {
				case <-stop:
					return
				default:
				}
				if err != nil && ctx.Err() != nil {
					t.Errorf("receive from %d: %v", from, err)
					return
				}
				for i := 0; i < n; i++ {
					m := buf.Bytes()[256*i : 256*i+msgs[i].Len]
					if len(m) < topoHdr {
						t.Errorf("short message of %d bytes from %d", len(m), from)
						return
					}
					src, dst, seq := int(binary.LittleEndian.Uint32(m)), int(binary.LittleEndian.Uint32(m[4:])), binary.LittleEndian.Uint64(m[8:])
					if dst != me {
						// Queue it for the next hop: a receiver that
						// blocked on a full next bridge would close a
						// cycle of waits around the ring.
						queues[top.next(me, dst)] <- bytes.Clone(m)
						continue
					}
					if src != expect || seq != next || !bytes.Equal(m[topoHdr:], payload(src, seq)) {
						t.Errorf("host %d: message src %d seq %d (want src %d seq %d) of %d bytes", me, src, seq, expect, next, len(m))
						cancel() // fail now, not at the deadline
						return
					}
					if next++; next == topoMsgs {
						close(received)
					}
				}
			}
		}()
	}
	// Send this host's flow.
	if target >= 0 {
		for seq := uint64(0); seq < topoMsgs; seq++ {
			p := payload(me, seq)
			b := make([]byte, topoHdr+len(p))
			binary.LittleEndian.PutUint32(b, uint32(me))
			binary.LittleEndian.PutUint32(b[4:], uint32(target))
			binary.LittleEndian.PutUint64(b[8:], seq)
			copy(b[topoHdr:], p)
			queues[top.next(me, target)] <- b
		}
	}
	select {
	case <-received:
	case <-ctx.Done():
		t.Fatalf("host %d: not every message from %d arrived", me, expect)
	}
	os.WriteFile(filepath.Join(dir, fmt.Sprintf("done%d", me)), nil, 0o600)
	// Keep relaying until every host has what it expects.
	for !allDone() && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	rwg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("host %d: the others did not finish", me)
	}
}

// payload is a message body that names its source and sequence: 1 to 200
// bytes.
func payload(src int, seq uint64) []byte {
	p := make([]byte, 1+int(seq*7+uint64(src))%200)
	for i := range p {
		p[i] = byte(uint64(i) + seq*3 + uint64(src)*101)
	}
	return p
}
