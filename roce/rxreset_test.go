package roce

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/link"
)

// rxLink returns two datagrams at its first read, leaving their packets
// as a link may (a buffer of its own, an offset), then nothing; each
// later read checks that the engine reset those packets, and that an
// empty read's batch comes back as it left it (a mark in pkts[5]).
type rxLink struct {
	mu     sync.Mutex
	reads  int
	errs   []string
	closed chan struct{}
	once   sync.Once
}

func (l *rxLink) ReadBatch(pkts []link.Packet) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reads++
	if l.reads == 1 {
		for i := range 2 {
			p := &pkts[i]
			p.Buf, p.Off, p.N = p.Buf[:16], 4, 12 // malformed: dropped
			p.Addr, p.SrcPort = netip.MustParseAddrPort("10.0.0.1:4791"), 4791
		}
		return 2, nil
	}
	for i := range 2 {
		if p := pkts[i]; len(p.Buf) != rxBufSize || p.Off != 0 || p.N != 0 || p.Addr.IsValid() || p.SrcPort != 0 {
			l.errs = append(l.errs, fmt.Sprintf("read %d: packet %d not reset (len %d, Off %d, N %d, %v)", l.reads, i, len(p.Buf), p.Off, p.N, p.Addr))
		}
	}
	if l.reads > 2 && pkts[5].Off != 77 {
		l.errs = append(l.errs, fmt.Sprintf("read %d: the engine rewrote packet 5 after an empty read", l.reads))
	}
	pkts[5].Off = 77 // beyond what it returns: the engine need not look
	return 0, nil
}

func (l *rxLink) WriteBatch(pkts []link.Packet) (int, error) { return len(pkts), nil }

func (l *rxLink) WaitRead(ctx context.Context, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-l.closed:
	}
	return nil
}

func (l *rxLink) LocalAddr() netip.AddrPort {
	return netip.MustParseAddrPort("10.0.0.2:4791")
}

func (l *rxLink) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// TestPollResetsReturned: a poll resets the packets a read returned, for
// the next read, and only those: an empty poll writes none of the batch
// (Link.ReadBatch leaves pkts[n:] alone).
func TestPollResetsReturned(t *testing.T) {
	l := &rxLink{closed: make(chan struct{})}
	e, err := NewEngine(EngineConfig{Link: l})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	read := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.reads
	}
	if !testenv.Eventually(testenv.Timeout, func() bool { e.poll(); return read() >= 5 }) {
		t.Fatalf("%d reads in %v", read(), testenv.Timeout)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.errs {
		t.Error(s)
	}
}
