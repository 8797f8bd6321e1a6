// Package fabrictest is the conformance suite that every Weft backend
// passes, the way golang.org/x/net/nettest checks a net.Conn.
//
// A test case has two roles, A and B, each a function that drives one end
// of a connected pair. The roles talk only through the endpoints, as two
// programs would: B announces its RMA regions to A in a message, A tells B
// when it is done. That lets the same cases run in one process
// (TestPair: the roles run as parallel subtests) and across two processes
// (TestProcesses: role B runs in a child process, a re-execution of the
// test binary).
//
// A backend's tests call both:
//
//	func TestConformance(t *testing.T) {
//		fabrictest.TestPair(t, func(t *testing.T) (a, b fabric.Endpoint) { ... })
//	}
//
//	func TestConformanceProcesses(t *testing.T) {
//		fabrictest.TestProcesses(t, func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint { ... })
//	}
//
// Cases that need a capability the backend lacks (RMA, reliability) check
// the other behaviour instead: Write must then fail with
// fabric.ErrNotSupported.
package fabrictest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// Side names a role of a test case.
type Side int

// The two sides.
const (
	SideA Side = iota
	SideB
)

// String returns "A" or "B".
func (s Side) String() string { return string(rune('A' + int(s))) }

// Case is one conformance test: role A and role B run concurrently, each
// on one end of a fresh connected pair. A role's endpoint is closed when
// the role returns.
type Case struct {
	Name string
	A, B func(t *testing.T, ep fabric.Endpoint)
}

// MakePair returns a fresh connected pair of endpoints for one case.
type MakePair func(t *testing.T) (a, b fabric.Endpoint)

// Opener opens one side of the connection named key. Both processes call
// it with the same key, one with SideA and one with SideB; it blocks until
// the connection is up.
type Opener func(t testing.TB, key string, side Side) fabric.Endpoint

// Timeout bounds every blocking step of a role: a minute, three under the
// race detector.
var Timeout = Scale(60 * time.Second)

// Scale stretches a test's time bound, or a timer the test sets, for the
// race detector: three times under it, as is otherwise. A timer that
// declares a silent peer gone is one: the detector slows a process
// several times over, and a peer that stalls looks dead.
func Scale(d time.Duration) time.Duration { return d * raceScale }

// Cases returns the conformance cases.
func Cases() []Case {
	cs := []Case{
		{"PingPongSizes", pingPongA, pingPongB},
		{"OrderedBursts", orderedA, orderedB},
		{"GatherScatter", gatherA, gatherB},
		{"MessageLimits", limitsA, limitsB},
		{"Backpressure", backpressureA, backpressureB},
		{"Completions", completionsA, completionsB},
		{"Registration", registrationA, registrationB},
		{"RMA", rmaA, rmaB},
		{"CloseWhileBlocked", closeA, closeB},
		{"Concurrent", concurrentA, concurrentB},
		{"Views", viewsA, viewsB},
		{"Mistakes", mistakesA, mistakesB},
	}
	return append(cs, violationCases()...)
}

// TestPair runs every case with both roles in this process.
func TestPair(t *testing.T, mp MakePair) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			a, b := mp(t)
			t.Run("A", func(t *testing.T) {
				t.Parallel()
				defer a.Close()
				c.A(t, a)
			})
			t.Run("B", func(t *testing.T) {
				t.Parallel()
				defer b.Close()
				c.B(t, b)
			})
		})
	}
}

const (
	envCase = "WEFT_FABRICTEST_CASE"
	envKey  = "WEFT_FABRICTEST_KEY"
)

var keySeq atomic.Uint64

// TestProcesses runs every case with role A in this process and role B in
// a child process: the test binary re-executed to run only the calling
// test, which then finds its case in the environment.
func TestProcesses(t *testing.T, open Opener) {
	if name := os.Getenv(envCase); name != "" {
		runChild(t, open, name, os.Getenv(envKey))
		return
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			key := fmt.Sprintf("%s-%d-%d", c.Name, os.Getpid(), keySeq.Add(1))
			ctx, cancel := context.WithTimeout(context.Background(), 3*Timeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+top+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), envCase+"="+c.Name, envKey+"="+key)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatalf("start side B: %v", err)
			}
			waited := false
			wait := func() {
				if waited {
					return
				}
				waited = true
				if err := cmd.Wait(); err != nil {
					t.Errorf("side B (pid %d) failed: %v\n%s", cmd.Process.Pid, err, out.String())
				}
			}
			defer func() {
				if waited {
					return
				}
				if t.Skipped() {
					// Role A skipped (a capability is missing); B skips
					// too: let it finish rather than kill it.
					done := make(chan struct{})
					go func() { defer close(done); cmd.Wait() }()
					select {
					case <-done:
						waited = true
						return
					case <-time.After(Timeout):
					}
				}
				cmd.Process.Kill()
				wait()
			}()
			ep := open(t, key, SideA)
			func() {
				defer ep.Close()
				c.A(t, ep)
			}()
			wait()
		})
	}
}

// TestSide runs one role of every case in this process, in order. The
// other role runs elsewhere (another process, another host, another
// implementation of the same protocol), which calls TestSide with the
// other side. open connects the two for each case, named by key (the
// case's name), and blocks until the connection is up: for example side A
// listens and side B dials, retrying while A does not listen yet.
func TestSide(t *testing.T, side Side, open Opener) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			ep := open(t, c.Name, side)
			defer ep.Close()
			if side == SideA {
				c.A(t, ep)
			} else {
				c.B(t, ep)
			}
		})
	}
}

func runChild(t *testing.T, open Opener, name, key string) {
	for _, c := range Cases() {
		if c.Name == name {
			ep := open(t, key, SideB)
			defer ep.Close()
			c.B(t, ep)
			return
		}
	}
	t.Fatalf("fabrictest: no case %q", name)
}

// role is the per-role toolkit: a context, send and receive buffers and
// reusable message slices.
type role struct {
	t    *testing.T
	ep   fabric.Endpoint
	ctx  context.Context
	caps fabric.Caps
	sbuf *fabric.Region
	rbuf *fabric.Region
	smsg []fabric.Message
	rmsg []fabric.Message
}

func newRole(t *testing.T, ep fabric.Endpoint) *role {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	r := &role{t: t, ep: ep, ctx: ctx, caps: ep.Caps()}
	if r.caps.MaxMsgSize < 1 || r.caps.MaxSGEs < 1 {
		t.Fatalf("Caps %+v: MaxMsgSize and MaxSGEs must be positive", r.caps)
	}
	if r.caps.InlineSize < 512 {
		// The burst cases reuse buffers of up to 512 bytes as soon as
		// Send returns.
		t.Fatalf("Caps.InlineSize %d: the suite needs at least 512", r.caps.InlineSize)
	}
	r.sbuf = r.alloc(r.caps.MaxMsgSize, 0)
	r.rbuf = r.alloc(r.caps.MaxMsgSize, fabric.AccessLocalWrite)
	r.smsg = make([]fabric.Message, 1)
	r.rmsg = make([]fabric.Message, 1)
	return r
}

func (r *role) alloc(n int, acc fabric.Access) *fabric.Region {
	r.t.Helper()
	reg, err := r.ep.Alloc(n, acc)
	if err != nil {
		r.t.Fatalf("Alloc(%d, %v): %v", n, acc, err)
	}
	r.t.Cleanup(func() { reg.Close() })
	return reg
}

// send sends p (copied into the send buffer) as one message.
func (r *role) send(p []byte, imm uint32, flags fabric.MsgFlags) {
	r.t.Helper()
	copy(r.sbuf.Bytes(), p)
	r.smsg[0] = fabric.Message{SGEs: []fabric.SGE{{Region: r.sbuf, Length: len(p)}}, Imm: imm, Flags: flags}
	r.sendMsgs(r.smsg)
}

// settleCtx marks the completion sendMsgs waits for.
const settleCtx = 0xF00D_0000_0000_0001

// sendMsgs sends every message, waiting out backpressure. If a message is
// larger than Caps.InlineSize its buffers belong to the endpoint until it
// completes, so sendMsgs signals the last message and waits for its
// completion before it returns.
func (r *role) sendMsgs(msgs []fabric.Message) {
	r.t.Helper()
	settle := false
	for i := range msgs {
		settle = settle || fabric.SGELen(msgs[i].SGEs) > r.caps.InlineSize
	}
	if settle {
		msgs[len(msgs)-1].Flags |= fabric.FlagSignal
		msgs[len(msgs)-1].Context = settleCtx
		defer r.settle()
	}
	for len(msgs) > 0 {
		n, err := r.ep.SendWait(r.ctx, msgs)
		if err != nil {
			r.t.Fatalf("SendWait: %v", err)
		}
		msgs = msgs[n:]
	}
}

func (r *role) settle() {
	r.t.Helper()
	for {
		if c := r.wait(); c.Context == settleCtx {
			if err := c.Err(); err != nil {
				r.t.Fatalf("send completed with %v", err)
			}
			return
		}
	}
}

// recv receives one message into the receive buffer and returns its bytes
// (valid until the next recv) and the message.
func (r *role) recv() ([]byte, fabric.Message) {
	r.t.Helper()
	r.rmsg[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}
	n, err := r.ep.RecvWait(r.ctx, r.rmsg)
	if err != nil {
		r.t.Fatalf("RecvWait: %v", err)
	}
	if n != 1 {
		r.t.Fatalf("RecvWait returned %d messages for a burst of 1", n)
	}
	m := r.rmsg[0]
	if m.Len < 0 || m.Len > r.rbuf.Len() {
		r.t.Fatalf("Recv set Len %d for a %d-byte buffer", m.Len, r.rbuf.Len())
	}
	return r.rbuf.Bytes()[:m.Len], m
}

// expect receives a control message and checks it is want.
func (r *role) expect(want string) {
	r.t.Helper()
	got, _ := r.recv()
	if string(got) != want {
		r.t.Fatalf("got control message %q, want %q", trunc(got), want)
	}
}

// waitGone waits until the peer has gone: a receive fails with an error.
// Messages that still arrive are returned to the caller's check.
func (r *role) waitGone(onMsg func([]byte)) error {
	r.t.Helper()
	for {
		r.rmsg[0] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}
		n, err := r.ep.RecvWait(r.ctx, r.rmsg)
		if err != nil {
			return err
		}
		if n == 1 && onMsg != nil {
			onMsg(r.rbuf.Bytes()[:r.rmsg[0].Len])
		}
	}
}

func trunc(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// fill writes a deterministic pattern derived from seed.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// sizes returns the message sizes 1..max used by the integrity test.
func sizes(max int) []int {
	var out []int
	for _, s := range []int{1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 127, 128, 255, 256,
		511, 512, 1000, 1023, 1024, 1025, 1472, 1500, 2047, 2048, 4095, 4096, 4097, 8191, 8192,
		9000, 16384, 32767, 32768, 65535, 65536} {
		if s < max {
			out = append(out, s)
		}
	}
	if max > 1 {
		out = append(out, max-1)
	}
	return append(out, max)
}

func pingPongA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	for i, n := range sizes(r.caps.MaxMsgSize) {
		want := pattern(n, uint64(i))
		r.send(want, 0, 0)
		got, _ := r.recv()
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: echo differs at byte %d of %d (got %d bytes)", n, firstDiff(got, want), n, len(got))
		}
	}
}

func pingPongB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	for i, n := range sizes(r.caps.MaxMsgSize) {
		got, _ := r.recv()
		want := pattern(n, uint64(i))
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: received %d bytes, differing at byte %d", n, len(got), firstDiff(got, want))
		}
		r.send(got, 0, 0)
	}
}

// orderedA sends many messages in bursts; each carries its sequence
// number and a pattern seeded by it. B checks order and content.
const orderedCount = 20000

func orderedSize(i int, max int) int { return min(8+(i*37)%300, max) }

func orderedA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if r.caps.MaxMsgSize < 8 {
		t.Skip("messages smaller than 8 bytes")
	}
	sendNumbered(t, r, orderedCount, 32, 512, func(i int) int { return orderedSize(i, r.caps.MaxMsgSize) })
	if !r.caps.Reliable {
		// Datagrams may be lost, the end marker too: repeat it until B
		// answers.
		unreliableEnd(t, r, "ordered-end", "ordered-ok")
		return
	}
	r.expect("ordered-ok")
}

// sendNumbered sends count messages in bursts: message i has size(i)
// bytes (at most maxSize), filled by fill(i) with i in its first 8 bytes,
// and immediate data i.
func sendNumbered(t *testing.T, r *role, count, burst, maxSize int, size func(i int) int) {
	t.Helper()
	regs := make([]*fabric.Region, burst)
	msgs := make([]fabric.Message, burst)
	sges := make([]fabric.SGE, burst)
	for i := range regs {
		regs[i] = r.alloc(maxSize, 0)
	}
	for seq := 0; seq < count; {
		k := min(burst, count-seq)
		for j := 0; j < k; j++ {
			n := size(seq + j)
			b := regs[j].Bytes()[:n]
			fill(b, uint64(seq+j))
			binary.LittleEndian.PutUint64(b, uint64(seq+j))
			sges[j] = fabric.SGE{Region: regs[j], Length: n}
			msgs[j] = fabric.Message{SGEs: sges[j : j+1], Imm: uint32(seq + j), Flags: fabric.FlagImm}
		}
		// Retry the tail of a partial burst until all of it is out.
		for sent := 0; sent < k; {
			n, err := r.ep.SendWait(r.ctx, msgs[sent:k])
			if err != nil {
				t.Fatalf("SendWait at %d: %v", seq+sent, err)
			}
			if n < 0 || n > k-sent {
				t.Fatalf("SendWait returned %d for %d messages", n, k-sent)
			}
			sent += n
		}
		seq += k
	}
}

// unreliableEnd sends marker every 10 ms until ack arrives (for backends
// that may lose any single message).
func unreliableEnd(t *testing.T, r *role, marker, ack string) {
	t.Helper()
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}}
	for deadline := time.Now().Add(Timeout); time.Now().Before(deadline); {
		r.send([]byte(marker), 0, 0)
		for until := time.Now().Add(10 * time.Millisecond); time.Now().Before(until); {
			msgs[0].SGEs[0].Length = r.rbuf.Len()
			n, err := r.ep.Recv(msgs)
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if n == 1 && string(r.rbuf.Bytes()[:msgs[0].Len]) == ack {
				return
			}
			if n == 0 {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	t.Fatalf("no %q after %q", ack, marker)
}

func orderedB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if r.caps.MaxMsgSize < 8 {
		t.Skip("messages smaller than 8 bytes")
	}
	const burst = 16
	regs := make([]*fabric.Region, burst)
	msgs := make([]fabric.Message, burst)
	for i := range regs {
		regs[i] = r.alloc(512, fabric.AccessLocalWrite)
	}
	sges := make([]fabric.SGE, burst)
	want := make([]byte, 512)
	delivered := 0
	for seq := 0; seq < orderedCount; {
		for j := range msgs {
			sges[j] = fabric.SGEOf(regs[j])
			msgs[j] = fabric.Message{SGEs: sges[j : j+1]}
		}
		n, err := ep.RecvWait(r.ctx, msgs)
		if err != nil {
			t.Fatalf("RecvWait after %d messages: %v", seq, err)
		}
		for j := 0; j < n; j++ {
			m := msgs[j]
			got := regs[j].Bytes()[:m.Len]
			if !r.caps.Reliable {
				if string(got) == "ordered-end" {
					if seq < orderedCount/2 {
						t.Fatalf("only %d of %d datagrams arrived", seq, orderedCount)
					}
					t.Logf("%d of %d datagrams arrived, in order and intact", delivered, orderedCount)
					for i := 0; i < 5; i++ {
						r.send([]byte("ordered-ok"), 0, 0)
						time.Sleep(5 * time.Millisecond)
					}
					return
				}
				// Losses are allowed; order, duplicates and content are not.
				if len(got) >= 8 {
					if s := int(binary.LittleEndian.Uint64(got)); s >= seq && s < orderedCount {
						seq = s
					}
				}
			}
			size := orderedSize(seq, r.caps.MaxMsgSize)
			if m.Len != size {
				t.Fatalf("message %d: %d bytes, want %d", seq, m.Len, size)
			}
			if s := binary.LittleEndian.Uint64(got); s != uint64(seq) {
				t.Fatalf("message %d arrived as number %d: out of order, lost or duplicated", seq, s)
			}
			w := want[:size]
			fill(w, uint64(seq))
			binary.LittleEndian.PutUint64(w, uint64(seq))
			if !bytes.Equal(got, w) {
				t.Fatalf("message %d corrupt at byte %d", seq, firstDiff(got, w))
			}
			if m.Flags&fabric.FlagImm == 0 || m.Imm != uint32(seq) {
				t.Fatalf("message %d: immediate %#x (flags %#x), want %#x", seq, m.Imm, m.Flags, seq)
			}
			seq++
			delivered++
		}
	}
	if !r.caps.Reliable {
		// Everything arrived: still wait for A's end marker.
		for {
			got, _ := r.recv()
			if string(got) == "ordered-end" {
				for i := 0; i < 5; i++ {
					r.send([]byte("ordered-ok"), 0, 0)
					time.Sleep(5 * time.Millisecond)
				}
				return
			}
		}
	}
	r.send([]byte("ordered-ok"), 0, 0)
	st := ep.Stats()
	if st.RxMessages < orderedCount {
		t.Errorf("Stats().RxMessages = %d after %d messages", st.RxMessages, orderedCount)
	}
}

// gatherA sends one message gathered from SGEs in three regions; B
// scatters it over three SGEs of other sizes.
func gatherA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	total := min(3000, r.caps.MaxMsgSize)
	want := pattern(total, 77)
	nsge := min(4, r.caps.MaxSGEs)
	regs := []*fabric.Region{r.alloc(4096, 0), r.alloc(4096, 0), r.alloc(4096, 0)}
	// Split want into nsge pieces at various offsets of the regions.
	sges := make([]fabric.SGE, 0, nsge)
	off := 0
	for i := 0; i < nsge; i++ {
		n := total / nsge
		if i == nsge-1 {
			n = total - off
		}
		reg := regs[i%3]
		at := 3 + 100*i + 1100*(i/3)
		copy(reg.Bytes()[at:], want[off:off+n])
		sges = append(sges, fabric.SGE{Region: reg, Offset: at, Length: n})
		off += n
	}
	r.sendMsgs([]fabric.Message{{SGEs: sges, Imm: 0xC0FFEE, Flags: fabric.FlagImm}})
	r.expect("gather-ok")
}

func gatherB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	total := min(3000, r.caps.MaxMsgSize)
	want := pattern(total, 77)
	regs := []*fabric.Region{r.alloc(4096, fabric.AccessLocalWrite), r.alloc(4096, fabric.AccessLocalWrite),
		r.alloc(4096, fabric.AccessLocalWrite)}
	lens := []int{5, 1017, 4096}
	nsge := min(3, r.caps.MaxSGEs)
	sges := make([]fabric.SGE, nsge)
	for i := range sges {
		sges[i] = fabric.SGE{Region: regs[i], Offset: 11 * i, Length: min(lens[i], 4096-11*i)}
	}
	if nsge < 3 {
		sges[nsge-1] = fabric.SGE{Region: regs[nsge-1], Length: 4096}
	}
	msgs := []fabric.Message{{SGEs: sges}}
	n, err := ep.RecvWait(r.ctx, msgs)
	if err != nil || n != 1 {
		t.Fatalf("RecvWait = %d, %v", n, err)
	}
	m := msgs[0]
	if m.Len != total {
		t.Fatalf("received %d bytes, want %d", m.Len, total)
	}
	var got []byte
	for _, s := range sges {
		got = append(got, s.Bytes()...)
	}
	got = got[:total]
	if !bytes.Equal(got, want) {
		t.Fatalf("scattered message differs at byte %d", firstDiff(got, want))
	}
	if m.Flags&fabric.FlagImm == 0 || m.Imm != 0xC0FFEE {
		t.Fatalf("immediate data %#x flags %#x, want 0xC0FFEE with FlagImm", m.Imm, m.Flags)
	}
	r.send([]byte("gather-ok"), 0, 0)
}

// limitsA checks argument validation: oversized messages, too many SGEs,
// bad SGEs and closed regions fail with typed errors and send nothing;
// the message after them arrives intact.
func limitsA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	big := r.alloc(r.caps.MaxMsgSize+1, 0)
	one := []fabric.Message{{}}
	check := func(what string, sges []fabric.SGE, target error) {
		t.Helper()
		one[0] = fabric.Message{SGEs: sges}
		n, err := ep.Send(one)
		if n != 0 || !errorsIs(err, target) {
			t.Errorf("%s: Send = %d, %v; want 0 and an error matching %v", what, n, err, target)
		}
	}
	check("message over MaxMsgSize", []fabric.SGE{fabric.SGEOf(big)}, fabric.ErrMessageSize)
	if r.caps.MaxSGEs < 1024 {
		sges := make([]fabric.SGE, r.caps.MaxSGEs+1)
		for i := range sges {
			sges[i] = fabric.SGE{Region: r.sbuf, Offset: i, Length: 1}
		}
		check("MaxSGEs+1 SGEs", sges, fabric.ErrMessageSize)
	}
	check("SGE without region", []fabric.SGE{{Length: 1}}, fabric.ErrInvalid)
	check("SGE past the region", []fabric.SGE{{Region: r.sbuf, Offset: r.sbuf.Len() - 1, Length: 2}}, fabric.ErrBounds)
	check("negative offset", []fabric.SGE{{Region: r.sbuf, Offset: -1, Length: 2}}, fabric.ErrBounds)
	dead := r.alloc(64, 0)
	if err := dead.Close(); err != nil {
		t.Fatalf("Region.Close: %v", err)
	}
	if err := dead.Close(); err != nil {
		t.Fatalf("second Region.Close: %v", err)
	}
	check("closed region", []fabric.SGE{fabric.SGEOf(dead)}, os.ErrClosed)
	// MaxSGEs SGEs is fine, and a valid message gets through afterwards.
	k := min(r.caps.MaxSGEs, 16)
	sges := make([]fabric.SGE, k)
	want := pattern(k, 5)
	copy(r.sbuf.Bytes(), want)
	for i := range sges {
		sges[i] = fabric.SGE{Region: r.sbuf, Offset: i, Length: 1}
	}
	r.sendMsgs([]fabric.Message{{SGEs: sges}})
	r.expect("limits-ok")
}

func limitsB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	// A receive into memory without local-write permission fails and
	// loses nothing: the message is still there for a good receive.
	ro := r.alloc(4096, 0)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(ro)}}}
	deadline := time.Now().Add(Timeout)
	for {
		n, err := ep.Recv(msgs)
		if err != nil {
			if !errorsIs(err, fabric.ErrAccess) {
				t.Fatalf("Recv into a read-only region: %v, want an error matching ErrAccess", err)
			}
			break
		}
		if n != 0 {
			t.Fatalf("Recv into a region without AccessLocalWrite returned a message")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message arrived")
		}
		time.Sleep(50 * time.Microsecond)
	}
	k := min(r.caps.MaxSGEs, 16)
	got, _ := r.recv()
	if want := pattern(k, 5); !bytes.Equal(got, want) {
		t.Fatalf("message after the failed receive: got %x, want %x", got, want)
	}
	r.send([]byte("limits-ok"), 0, 0)
}

// Backpressure: A fills its send queue while B does not receive, and must
// see a partial burst (n < len) with a nil error. B fills the other
// direction, then announces itself; A drains; both then check that every
// message accepted arrived exactly once.
func backpressureA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if !r.caps.Reliable {
		t.Skip("backend is not reliable: a full receiver drops rather than pushing back")
	}
	sent := fillUntilFull(t, r, 0xA)
	// Drain B's messages up to its marker.
	drainUntilMarker(t, r, 0xB)
	var done [8]byte
	binary.LittleEndian.PutUint64(done[:], uint64(sent))
	r.send(append([]byte("A-DONE"), done[:]...), 0, 0)
	r.expect("bp-ok")
}

func backpressureB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if !r.caps.Reliable {
		t.Skip("backend is not reliable")
	}
	fillUntilFull(t, r, 0xB)
	r.send([]byte("B-FULL"), 0, 0) // blocks until A drains
	got := drainUntilMarker(t, r, 0xA)
	r.send([]byte("bp-ok"), 0, 0)
	_ = got
}

// fillUntilFull sends small numbered messages in bursts until a burst is
// only partly accepted, and returns how many were accepted. Each message
// carries tag and its number.
func fillUntilFull(t *testing.T, r *role, tag byte) int {
	t.Helper()
	const burst = 64
	msgs := make([]fabric.Message, burst)
	reg := r.alloc(burst*16, 0)
	sges := make([]fabric.SGE, burst)
	seq := 0
	partial := false
	for limit := 0; limit < 1<<22 && !partial; {
		for j := range msgs {
			b := reg.Bytes()[16*j : 16*j+16]
			b[0] = tag
			binary.LittleEndian.PutUint64(b[8:], uint64(seq+j))
			sges[j] = fabric.SGE{Region: reg, Offset: 16 * j, Length: 16}
			msgs[j] = fabric.Message{SGEs: sges[j : j+1]}
		}
		n, err := r.ep.Send(msgs)
		if err != nil {
			t.Fatalf("Send while filling, after %d messages: %v", seq, err)
		}
		if n < 0 || n > burst {
			t.Fatalf("Send returned %d for a burst of %d", n, burst)
		}
		seq += n
		limit += burst
		partial = n < burst
		if err := r.ctx.Err(); err != nil {
			t.Fatalf("filling: %v", err)
		}
	}
	if tag == 0xA && !partial {
		t.Fatalf("sent %d messages to a peer that does not receive without seeing backpressure", seq)
	}
	return seq
}

// drainUntilMarker receives tag-numbered messages until a 6-byte marker
// ("A-DONE" + count or "B-FULL"), checking the numbers run 0, 1, 2, ...
func drainUntilMarker(t *testing.T, r *role, tag byte) int {
	t.Helper()
	next := 0
	for {
		got, _ := r.recv()
		if len(got) == 16 && got[0] == tag {
			if s := binary.LittleEndian.Uint64(got[8:]); s != uint64(next) {
				t.Fatalf("message %d of the fill arrived as %d", next, s)
			}
			next++
			continue
		}
		switch {
		case string(got) == "B-FULL":
			return next
		case len(got) == 14 && string(got[:6]) == "A-DONE":
			if n := int(binary.LittleEndian.Uint64(got[6:])); n != next {
				t.Fatalf("A counted %d messages as sent, %d arrived", n, next)
			}
			return next
		default:
			t.Fatalf("unexpected message %q while draining", trunc(got))
		}
	}
}

// Completions: signaled sends complete with their contexts, in order;
// unsignaled ones produce nothing; Wait honours its context.
func completionsA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	cq := ep.CQ()
	out := make([]fabric.Completion, 8)
	ctx, cancel := context.WithTimeout(r.ctx, 20*time.Millisecond)
	if n, err := cq.Wait(ctx, out); n != 0 || !errorsIs(err, context.DeadlineExceeded) {
		t.Errorf("Wait on an empty queue = %d, %v; want 0, context.DeadlineExceeded", n, err)
	}
	cancel()
	const count = 100
	copy(r.sbuf.Bytes(), "x")
	for i := 0; i < count; i++ {
		f := fabric.MsgFlags(0)
		if i%2 == 0 {
			f = fabric.FlagSignal
		}
		r.sendMsgs([]fabric.Message{{SGEs: []fabric.SGE{{Region: r.sbuf, Length: 1 + i%7}}, Flags: f, Context: uint64(1000 + i)}})
	}
	for i := 0; i < count; i += 2 {
		n, err := cq.Wait(r.ctx, out[:1])
		if err != nil || n != 1 {
			t.Fatalf("Wait for completion %d = %d, %v", i, n, err)
		}
		c := out[0]
		if c.Context != uint64(1000+i) || c.Op != fabric.OpSend || c.Status != fabric.StatusOK || c.Len != 1+i%7 {
			t.Fatalf("completion %+v, want context %d, send, ok, len %d", c, 1000+i, 1+i%7)
		}
		if c.Err() != nil {
			t.Fatalf("successful completion has Err %v", c.Err())
		}
	}
	r.expect("completions-ok")
	if n := cq.Poll(out); n != 0 {
		t.Fatalf("%d completions for unsignaled sends: %+v", n, out[:n])
	}
}

func completionsB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	for i := 0; i < 100; i++ {
		got, _ := r.recv()
		if len(got) != 1+i%7 {
			t.Fatalf("message %d: %d bytes", i, len(got))
		}
	}
	r.send([]byte("completions-ok"), 0, 0)
}

// Registration: keys, permissions and idempotent deregistration.
func registrationA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	seen := map[fabric.Key]bool{}
	var prev fabric.Key
	steps := map[fabric.Key]int{}
	acc := fabric.AccessLocalWrite
	if r.caps.RMA {
		acc |= fabric.AccessRemoteRead | fabric.AccessRemoteWrite
	}
	for i := 0; i < 32; i++ {
		reg, err := ep.Alloc(64, acc)
		if err != nil {
			t.Fatalf("Alloc: %v", err)
		}
		defer reg.Close()
		if reg.Len() != 64 || len(reg.Bytes()) != 64 || !reg.Access().Has(acc) {
			t.Fatalf("region of %d bytes with access %v, want 64 and %v", reg.Len(), reg.Access(), acc)
		}
		k := reg.RemoteKey()
		if r.caps.RMA {
			if k == 0 || seen[k] {
				t.Fatalf("remote key %#x is zero or repeated", k)
			}
			seen[k] = true
			if i > 0 {
				steps[k-prev]++
			}
			prev = k
		} else if k != 0 {
			t.Errorf("remote key %#x on a backend without RMA", k)
		}
	}
	for d, n := range steps {
		if n > 4 {
			t.Errorf("remote keys are guessable: %d of 31 consecutive keys differ by %#x", n, d)
		}
	}
	local, err := ep.Register(make([]byte, 100), fabric.AccessLocalWrite)
	if err != nil {
		t.Fatalf("Register local memory: %v", err)
	}
	if local.RemoteKey() != 0 {
		t.Errorf("region without remote access has remote key %#x", local.RemoteKey())
	}
	if err := local.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := local.Close(); err != nil || !local.Closed() {
		t.Fatalf("second Close = %v, Closed() = %v; want nil, true", err, local.Closed())
	}
	if _, err := ep.Alloc(0, 0); err == nil {
		t.Errorf("Alloc(0) succeeded")
	}
	r.send([]byte("reg-done"), 0, 0)
	r.expect("reg-ok")
}

func registrationB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	r.expect("reg-done")
	r.send([]byte("reg-ok"), 0, 0)
}

func encodeIOV(v fabric.RemoteIOV) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b, v.Addr)
	binary.LittleEndian.PutUint64(b[8:], v.Len)
	binary.LittleEndian.PutUint64(b[16:], uint64(v.Key))
	return b
}

func decodeIOV(t *testing.T, b []byte) fabric.RemoteIOV {
	t.Helper()
	if len(b) != 24 {
		t.Fatalf("region descriptor of %d bytes", len(b))
	}
	return fabric.RemoteIOV{Addr: binary.LittleEndian.Uint64(b), Len: binary.LittleEndian.Uint64(b[8:]),
		Key: fabric.Key(binary.LittleEndian.Uint64(b[16:]))}
}

// wait polls the completion queue for one completion.
func (r *role) wait() fabric.Completion {
	r.t.Helper()
	out := make([]fabric.Completion, 1)
	n, err := r.ep.CQ().Wait(r.ctx, out)
	if err != nil || n != 1 {
		r.t.Fatalf("CQ Wait = %d, %v", n, err)
	}
	return out[0]
}

const rmaSize = 64 << 10

// RMA: B exposes a region; A writes, writes with immediate and reads it,
// with multi-SGE local lists, and B checks the bytes.
func rmaA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if !r.caps.RMA {
		one := []fabric.Message{{SGEs: []fabric.SGE{{Region: r.sbuf, Length: 1}}}}
		if _, err := ep.Write(one); !errorsIs(err, fabric.ErrNotSupported) {
			t.Errorf("Write on a backend without RMA: %v, want ErrNotSupported", err)
		}
		if _, err := ep.Read(one); !errorsIs(err, fabric.ErrNotSupported) {
			t.Errorf("Read on a backend without RMA: %v, want ErrNotSupported", err)
		}
		r.send([]byte("no-rma"), 0, 0)
		return
	}
	got, _ := r.recv()
	remote := decodeIOV(t, got)
	if remote.Len != rmaSize {
		t.Fatalf("descriptor length %d", remote.Len)
	}
	size := min(rmaSize, r.caps.MaxRMASize)
	src := r.alloc(size, 0)
	data := pattern(size, 1234)
	copy(src.Bytes(), data)
	// 1. A signaled write of the first half, gathered from three SGEs.
	half := size / 2
	sges := []fabric.SGE{{Region: src, Length: 100}, {Region: src, Offset: 100, Length: 1000}, {Region: src, Offset: 1100, Length: half - 1100}}
	if r.caps.MaxSGEs < 3 {
		sges = []fabric.SGE{{Region: src, Length: half}}
	}
	w := []fabric.Message{{SGEs: sges, Remote: remote.Slice(0, uint64(half)), Flags: fabric.FlagSignal, Context: 7}}
	if n, err := ep.Write(w); n != 1 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if c := r.wait(); c.Context != 7 || c.Op != fabric.OpWrite || c.Err() != nil || c.Len != half {
		t.Fatalf("write completion %+v (err %v)", c, c.Err())
	}
	// 2. The second half with immediate data: B gets a notification.
	w[0] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: half, Length: size - half}},
		Remote: remote.Slice(uint64(half), uint64(size-half)), Imm: 0x5EED, Flags: fabric.FlagImm | fabric.FlagSignal, Context: 8}
	if n, err := ep.Write(w); n != 1 || err != nil {
		t.Fatalf("Write with immediate = %d, %v", n, err)
	}
	if c := r.wait(); c.Context != 8 || c.Err() != nil {
		t.Fatalf("write-with-immediate completion %+v (err %v)", c, c.Err())
	}
	r.expect("rma-written")
	// 3. Read back what B changed: B wrote its own pattern at 1000..3000.
	dst := r.alloc(size, fabric.AccessLocalWrite)
	rd := []fabric.Message{{SGEs: []fabric.SGE{{Region: dst, Length: 10}, {Region: dst, Offset: 10, Length: size - 10}},
		Remote: remote.Slice(0, uint64(size)), Flags: fabric.FlagSignal, Context: 9}}
	if r.caps.MaxSGEs < 2 {
		rd[0].SGEs = []fabric.SGE{fabric.SGEOf(dst)}
	}
	if n, err := ep.Read(rd); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if c := r.wait(); c.Context != 9 || c.Op != fabric.OpRead || c.Err() != nil || c.Len != size {
		t.Fatalf("read completion %+v (err %v)", c, c.Err())
	}
	want := append([]byte(nil), data...)
	fill(want[1000:3000], 4321)
	if !bytes.Equal(dst.Bytes(), want) {
		t.Fatalf("read data differs at byte %d", firstDiff(dst.Bytes(), want))
	}
	// 4. A descriptor without a length (Len 0: not known, as protocols
	// that advertise only an address and a key send it): the initiator
	// does not check it, and the target's bounds check alone applies.
	clear(dst.Bytes()[:64])
	rd[0] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Length: 64}}, Remote: fabric.RemoteIOV{Addr: remote.Addr + 8, Key: remote.Key},
		Flags: fabric.FlagSignal, Context: 10}
	if n, err := ep.Read(rd[:1]); n != 1 || err != nil {
		t.Fatalf("Read with Remote.Len 0 = %d, %v", n, err)
	}
	if c := r.wait(); c.Context != 10 || c.Err() != nil || c.Len != 64 {
		t.Fatalf("read completion %+v (err %v) with Remote.Len 0", c, c.Err())
	}
	if !bytes.Equal(dst.Bytes()[:64], want[8:72]) {
		t.Fatalf("read with Remote.Len 0 differs at byte %d", firstDiff(dst.Bytes()[:64], want[8:72]))
	}
	r.send([]byte("rma-read"), 0, 0)
}

func rmaB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	if !r.caps.RMA {
		r.expect("no-rma")
		return
	}
	reg := r.alloc(rmaSize, fabric.AccessLocalWrite|fabric.AccessRemoteRead|fabric.AccessRemoteWrite)
	if reg.RemoteKey() == 0 {
		t.Fatalf("region with remote access has no remote key")
	}
	r.send(encodeIOV(reg.Remote()), 0, 0)
	size := min(rmaSize, r.caps.MaxRMASize)
	_, m := r.recv()
	if m.Flags&fabric.FlagRemoteWrite == 0 || m.Flags&fabric.FlagImm == 0 || m.Imm != 0x5EED || m.Len != size-size/2 {
		t.Fatalf("write-with-immediate notification: flags %#x imm %#x len %d", m.Flags, m.Imm, m.Len)
	}
	want := pattern(size, 1234)
	if !bytes.Equal(reg.Bytes()[:size], want) {
		t.Fatalf("written data differs at byte %d", firstDiff(reg.Bytes()[:size], want))
	}
	fill(reg.Bytes()[1000:3000], 4321)
	r.send([]byte("rma-written"), 0, 0)
	r.expect("rma-read")
}

// CloseWhileBlocked: A blocks in RecvWait and in a completion Wait, closes
// the endpoint and checks both return os.ErrClosed, and that every later
// call does. B sees the peer go: its receive fails with ErrPeerGone and a
// link event arrives.
func closeA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	r.expect("hello")
	errs := make(chan error, 2)
	go func() {
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r.rbuf)}}}
		_, err := ep.RecvWait(context.Background(), msgs)
		errs <- err
	}()
	go func() {
		_, err := ep.CQ().Wait(context.Background(), make([]fabric.Completion, 1))
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond) // let both block; the checks below do not depend on it
	if err := ep.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			if !errorsIs(err, os.ErrClosed) {
				t.Errorf("blocked call returned %v, want os.ErrClosed", err)
			}
		case <-time.After(Timeout):
			t.Fatalf("a call blocked at Close did not return")
		}
	}
	if err := ep.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	one := []fabric.Message{{SGEs: []fabric.SGE{{Region: r.sbuf, Length: 1}}}}
	if _, err := ep.Send(one); !errorsIs(err, os.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	if _, err := ep.Recv(one); !errorsIs(err, os.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if _, err := ep.SendWait(r.ctx, one); !errorsIs(err, os.ErrClosed) {
		t.Errorf("SendWait after Close: %v", err)
	}
	if _, err := ep.Register(make([]byte, 8), 0); !errorsIs(err, os.ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
}

func closeB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	r.send([]byte("hello"), 0, 0)
	if !r.caps.Reliable {
		// Datagrams carry no acknowledgements, so nothing tells B that A
		// closed; A's checks are local.
		return
	}
	err := r.waitGone(func(b []byte) { t.Errorf("unexpected message %q", trunc(b)) })
	if !errorsIs(err, fabric.ErrPeerGone) {
		t.Fatalf("receive after the peer closed: %v, want ErrPeerGone", err)
	}
	one := []fabric.Message{{SGEs: []fabric.SGE{{Region: r.sbuf, Length: 1}}}}
	if _, err := ep.Send(one); !errorsIs(err, fabric.ErrPeerGone) {
		t.Errorf("Send to a closed peer: %v, want ErrPeerGone", err)
	}
	deadline := time.After(Timeout)
	for {
		select {
		case ev := <-ep.Events():
			if ev.Kind == fabric.EventLinkDown || ev.Kind == fabric.EventPeerGone {
				return
			}
		case <-deadline:
			t.Fatalf("no link-down or peer-gone event")
		}
	}
}

// Concurrent: two goroutines send tagged sequences, a third receives the
// echoes, a fourth registers and reads stats; B echoes everything.
const concurrentPer = 3000

// lossyIdle is how long the Concurrent case waits for more datagrams
// before it concludes the rest were lost (unreliable backends only).
const lossyIdle = 3 * time.Second

func concurrentA(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	errs := make(chan error, 4)
	for g := 0; g < 2; g++ {
		go func() {
			reg, err := ep.Alloc(16, 0)
			if err != nil {
				errs <- err
				return
			}
			defer reg.Close()
			msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
			for i := 0; i < concurrentPer; i++ {
				binary.LittleEndian.PutUint64(reg.Bytes(), uint64(g))
				binary.LittleEndian.PutUint64(reg.Bytes()[8:], uint64(i))
				for {
					n, err := ep.SendWait(r.ctx, msgs)
					if err != nil {
						errs <- fmt.Errorf("sender %d: %w", g, err)
						return
					}
					if n == 1 {
						break
					}
				}
			}
			errs <- nil
		}()
	}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				errs <- nil
				return
			default:
			}
			_ = ep.Stats()
			reg, err := ep.Alloc(128, fabric.AccessLocalWrite)
			if err != nil {
				errs <- err
				return
			}
			reg.Close()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	next := [2]int{}
	reg := r.alloc(16, fabric.AccessLocalWrite)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(reg)}}}
	// An unreliable backend may lose datagrams (either way): echoes must
	// still come in order per sender, and most must arrive.
	lossy := !r.caps.Reliable
	got := 0
	for next[0] < concurrentPer || next[1] < concurrentPer {
		ctx := r.ctx
		if lossy {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(r.ctx, lossyIdle)
			defer cancel()
		}
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			if lossy && r.ctx.Err() == nil && got >= concurrentPer {
				t.Logf("%d of %d echoes arrived, in order", got, 2*concurrentPer)
				break
			}
			t.Fatalf("RecvWait after %d echoes: %v", got, err)
		}
		g := binary.LittleEndian.Uint64(reg.Bytes())
		i := binary.LittleEndian.Uint64(reg.Bytes()[8:])
		if g > 1 || int(i) < next[g] || (!lossy && int(i) != next[g]) || i >= concurrentPer {
			t.Fatalf("echo (%d, %d), want (%d, %d)", g, i, g, next[min(g, 1)])
		}
		next[g] = int(i) + 1
		got++
	}
	close(stop)
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func concurrentB(t *testing.T, ep fabric.Endpoint) {
	r := newRole(t, ep)
	const burst = 16
	reg := r.alloc(16*burst, fabric.AccessLocalWrite)
	src := r.alloc(16*burst, 0)
	rmsgs := make([]fabric.Message, burst)
	smsgs := make([]fabric.Message, burst)
	next := [2]int{}
	lossy := !r.caps.Reliable
	for got := 0; next[0] < concurrentPer || next[1] < concurrentPer; {
		for j := range rmsgs {
			rmsgs[j] = fabric.Message{SGEs: []fabric.SGE{{Region: reg, Offset: 16 * j, Length: 16}}}
		}
		ctx := r.ctx
		if lossy {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(r.ctx, lossyIdle)
			defer cancel()
		}
		n, err := ep.RecvWait(ctx, rmsgs)
		if err != nil {
			if lossy && r.ctx.Err() == nil && got >= concurrentPer {
				break // the rest was lost
			}
			t.Fatalf("RecvWait after %d: %v", got, err)
		}
		copy(src.Bytes(), reg.Bytes()[:16*n])
		for j := 0; j < n; j++ {
			b := src.Bytes()[16*j:]
			g, i := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
			if g > 1 || int(i) < next[g] || (!lossy && int(i) != next[g]) || i >= concurrentPer {
				t.Fatalf("message (%d, %d) out of order", g, i)
			}
			next[g] = int(i) + 1
			smsgs[j] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: 16 * j, Length: 16}}}
		}
		r.sendMsgs(smsgs[:n])
		got += n
	}
}
