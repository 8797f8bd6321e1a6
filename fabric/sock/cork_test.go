package sock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// corkMsg is writer w's message number seq: a header (writer, seq,
// length) and a payload that depends on all three, size bytes in all.
func corkMsg(w, seq, size int) []byte {
	b := make([]byte, size)
	b[0] = byte(w)
	binary.LittleEndian.PutUint16(b[1:], uint16(seq))
	binary.LittleEndian.PutUint16(b[3:], uint16(size))
	copy(b[5:], pattern(uint64(w)<<32|uint64(seq), size-5))
	return b
}

// TestConcurrentWritesAtomic: Writes from many goroutines at once on one
// Conn, small ones (combined when they queue) and some beyond corkMax,
// each arrive whole, never interleaved with another's bytes, and each
// writer's in the order it wrote them.
func TestConcurrentWritesAtomic(t *testing.T) {
	const writers, per = 16, 150
	forEach(t, func(t *testing.T, be backend) {
		a, c := connPair(t, be, nil)
		sizes := make([][]int, writers)
		total := 0
		for w := range sizes {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range per {
				s := 5 + r.IntN(200)
				switch r.IntN(20) {
				case 0:
					s = corkMax + r.IntN(3*corkMax) // not combined
				case 1, 2:
					s = corkMax - r.IntN(64) // fills the batch fast
				}
				sizes[w] = append(sizes[w], s)
				total += s
			}
		}
		errs := make(chan error, writers)
		for w := range writers {
			go func() {
				for seq, s := range sizes[w] {
					m := corkMsg(w, seq, s)
					if n, err := c.Write(m); n != len(m) || err != nil {
						errs <- fmt.Errorf("writer %d, message %d: Write = %d, %v", w, seq, n, err)
						return
					}
				}
				errs <- nil
			}()
		}
		read := make(chan error, 1)
		go func() {
			r := bufio.NewReader(a)
			next := make([]int, writers)
			for got := 0; got < total; {
				var h [5]byte
				if _, err := io.ReadFull(r, h[:]); err != nil {
					read <- fmt.Errorf("after %d bytes: %v", got, err)
					return
				}
				w, seq, size := int(h[0]), int(binary.LittleEndian.Uint16(h[1:])), int(binary.LittleEndian.Uint16(h[3:]))
				if w >= writers || seq != next[w] || size != sizes[w][seq] {
					read <- fmt.Errorf("after %d bytes: header of writer %d, message %d, %d bytes; want message %d of writer %d (interleaved?)", got, w, seq, size, next[w], w)
					return
				}
				m := make([]byte, size)
				copy(m, h[:])
				if _, err := io.ReadFull(r, m[5:]); err != nil {
					read <- err
					return
				}
				if want := corkMsg(w, seq, size); !bytes.Equal(m, want) {
					read <- fmt.Errorf("writer %d, message %d: %s", w, seq, firstDiff(m, want))
					return
				}
				next[w]++
				got += size
			}
			read <- nil
		}()
		for range writers {
			if err := testenv.Recv(t, errs, "a writer"); err != nil {
				t.Fatal(err)
			}
		}
		if err := testenv.Recv(t, read, "the reader"); err != nil {
			t.Fatal(err)
		}
	})
}

// corkSetup holds a first Write on b (over ntb, through gatedData)
// after its DATA frame went out, holding wmu, and queues k small Writes
// behind it. It returns the connections, the gate, the held Write's
// message and result, the queued messages and their results.
type corkSetup struct {
	a, b    *Conn
	g       *gatedData
	first   []byte
	held    chan corkRes
	msgs    [][]byte
	results chan corkRes
}

type corkRes struct {
	i   int
	n   int
	err error
}

func newCorkSetup(t *testing.T, ep func(fabric.Endpoint) fabric.Endpoint, k, size int) *corkSetup {
	ea, eb := ntbPair(t, nil)
	s := &corkSetup{g: &gatedData{Endpoint: eb, holding: make(chan struct{}), gate: make(chan struct{})}}
	cfg := &Config{KeepAlive: -1} // no PING among the frames counted
	var err error
	if s.a, err = NewConn(ea, cfg); err != nil {
		t.Fatal(err)
	}
	var be fabric.Endpoint = s.g
	if ep != nil {
		be = ep(s.g)
	}
	if s.b, err = NewConn(be, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The gate first: the held Write holds smu, which Close takes.
		select {
		case <-s.g.gate:
		default:
			close(s.g.gate)
		}
		s.a.Close()
		s.b.Close()
	})
	s.g.armed.Store(true)
	s.first = bytes.Repeat([]byte{'F'}, 100)
	s.held = make(chan corkRes, 1)
	go func() {
		n, err := s.b.Write(s.first)
		s.held <- corkRes{-1, n, err}
	}()
	testenv.Recv(t, s.g.holding, "the first Write's DATA frame sent")
	s.results = make(chan corkRes, k)
	for i := range k {
		m := []byte("message " + strconv.Itoa(i) + " ")
		m = append(m, bytes.Repeat([]byte{byte('a' + i%26)}, size-len(m))...)
		s.msgs = append(s.msgs, m)
		go func() {
			n, err := s.b.Write(m)
			s.results <- corkRes{i, n, err}
		}()
	}
	if !testenv.Eventually(testenv.Timeout, func() bool { return s.b.cork.cqn.Load() == int32(k) }) {
		t.Fatalf("%d Writes queued behind a held one, want %d", s.b.cork.cqn.Load(), k)
	}
	return s
}

// TestCorkCombines: small Writes queued behind one in progress go out as
// one DATA frame once it is done, each whole.
func TestCorkCombines(t *testing.T) {
	const k = 5
	s := newCorkSetup(t, nil, k, 60)
	frames := s.b.stats.framesTx.Load()
	close(s.g.gate)
	s.check(t)
	// The held frame is counted once its send returns, at the gate.
	if d := s.b.stats.framesTx.Load() - frames; d != 2 {
		t.Errorf("%d queued Writes went out in %d frames, want 1", k, d-1)
	}
}

// TestCorkDrained: more queued Writes than a holder sends after its own
// (corkRounds full batches) all go out: the holder appoints one of the
// writers left to send the rest.
func TestCorkDrained(t *testing.T) {
	k := corkRounds*corkBuf/corkMax + 4
	s := newCorkSetup(t, nil, k, corkMax)
	close(s.g.gate)
	s.check(t)
}

// check takes the results of the held Write and the queued ones, which
// must all have succeeded, and reads the stream: the held message, then
// each queued one whole.
func (s *corkSetup) check(t *testing.T) {
	t.Helper()
	if r := testenv.Recv(t, s.held, "the held Write"); r.n != len(s.first) || r.err != nil {
		t.Fatalf("held Write = %d, %v", r.n, r.err)
	}
	for range s.msgs {
		if r := testenv.Recv(t, s.results, "a queued Write"); r.n != len(s.msgs[r.i]) || r.err != nil {
			t.Fatalf("queued Write %d = %d, %v", r.i, r.n, r.err)
		}
	}
	want := len(s.first)
	for _, m := range s.msgs {
		want += len(m)
	}
	got := make([]byte, want)
	if _, err := io.ReadFull(s.a, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:len(s.first)], s.first) {
		t.Fatalf("first message: %q", got[:len(s.first)])
	}
	rest := got[len(s.first):]
	for len(rest) > 0 {
		found := false
		for _, m := range s.msgs {
			if bytes.HasPrefix(rest, m) {
				rest, found = rest[len(m):], true
				break
			}
		}
		if !found {
			t.Fatalf("no whole message at %q", rest)
		}
	}
}

// TestCorkQueuedDeadline: a queued Write whose deadline passes before
// its bytes were taken returns a timeout with nothing written, and its
// bytes are never sent.
func TestCorkQueuedDeadline(t *testing.T) {
	s := newCorkSetup(t, nil, 1, 60)
	s.b.SetWriteDeadline(time.Now().Add(-time.Second))
	r := testenv.Recv(t, s.results, "the queued Write, past its deadline")
	if r.n != 0 || !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("queued Write past its deadline = %d, %v; want 0, a timeout", r.n, r.err)
	}
	s.b.SetWriteDeadline(time.Time{})
	close(s.g.gate)
	if r := testenv.Recv(t, s.held, "the held Write"); r.n != len(s.first) || r.err != nil {
		t.Fatalf("held Write = %d, %v", r.n, r.err)
	}
	after := []byte("after")
	if n, err := s.b.Write(after); n != len(after) || err != nil {
		t.Fatalf("Write after = %d, %v", n, err)
	}
	if err := s.b.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(s.a)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte{}, s.first...), after...); !bytes.Equal(got, want) {
		t.Fatalf("stream %q, want %q (the timed-out Write's bytes sent?)", got, want)
	}
}

var errInjected = errors.New("injected send failure")

// failingSend fails every send once armed.
type failingSend struct {
	fabric.Endpoint
	fail atomic.Bool
}

func (f *failingSend) Send(msgs []fabric.Message) (int, error) {
	if f.fail.Load() {
		return 0, errInjected
	}
	return f.Endpoint.Send(msgs)
}

func (f *failingSend) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	if f.fail.Load() {
		return 0, errInjected
	}
	return f.Endpoint.SendWait(ctx, msgs)
}

// TestCorkErrorFanOut: the failure of a combined frame reaches every
// writer whose bytes were in it, with nothing written.
func TestCorkErrorFanOut(t *testing.T) {
	const k = 4
	var f *failingSend
	s := newCorkSetup(t, func(ep fabric.Endpoint) fabric.Endpoint {
		f = &failingSend{Endpoint: ep}
		return f
	}, k, 60)
	f.fail.Store(true)
	close(s.g.gate)
	if r := testenv.Recv(t, s.held, "the held Write"); r.n != len(s.first) || r.err != nil {
		t.Fatalf("held Write = %d, %v (its frame went out)", r.n, r.err)
	}
	for range k {
		if r := testenv.Recv(t, s.results, "a queued Write"); r.n != 0 || !errors.Is(r.err, errInjected) {
			t.Errorf("queued Write %d = %d, %v; want 0, %v", r.i, r.n, r.err, errInjected)
		}
	}
}
