package ntb

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
)

func TestListener(t *testing.T) {
	fabrictest.TestListener(t, fabrictest.ListenSetup{
		Backend: "ntb",
		Addr:    filepath.Join(t.TempDir(), "bridge"),
		Clients: maxQueues, // one endpoint per queue of the bridge
	})
}

// TestListenerConformance runs the conformance cases over endpoints that
// a listener accepted and a dialer connected on a shared bridge.
func TestListenerConformance(t *testing.T) {
	dir := t.TempDir()
	n := 0
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		n++
		return fabrictest.ListenPair(t, "ntb", filepath.Join(dir, "bridge"+string(rune('a'+n))), nil)
	})
}

func TestConnMsgParse(t *testing.T) {
	m := connMsg(connAcc, 42)
	if k, n, err := parseConnMsg(m[:]); err != nil || k != connAcc || n != 42 {
		t.Fatalf("parse = %q %d %v", k, n, err)
	}
	bad := m
	bad[7] = 'X'
	for _, b := range [][]byte{m[:15], append(m[:], 0), bad[:], []byte("WEFTNTXC01234567")} {
		if _, _, err := parseConnMsg(b); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("parse(%q) = %v, want ErrMalformed", b, err)
		}
	}
}

func FuzzConnMsg(f *testing.F) {
	m := connMsg(connReq, 7)
	f.Add(m[:])
	f.Add([]byte("WEFTNTBZ"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, n, err := parseConnMsg(b)
		if err == nil {
			if again := connMsg(k, n); string(again[:]) != string(b) {
				t.Fatalf("accepted %q, which does not re-encode to itself", b)
			}
		}
	})
}

// TestListenerIdleAllocs: a listener waiting for connections polls its
// queues every millisecond (connIO.poll) without allocating.
func TestListenerIdleAllocs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		t   *Transport
		err error
	}
	ch := make(chan res, 1)
	go func() {
		tr, err := openBridge(ctx, path, ShmConfig{}, Config{}, true)
		ch <- res{tr, err}
	}()
	a, err := openBridge(ctx, path, ShmConfig{}, Config{}, true)
	r := testenv.Recv(t, ch, "the other side's openBridge")
	if err != nil || r.err != nil {
		t.Fatalf("openBridge: %v / %v", err, r.err)
	}
	defer a.Close()
	defer r.t.Close()
	c, err := newConnIO(a.endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if n := testing.AllocsPerRun(100, func() { c.poll() }); n != 0 {
		t.Fatalf("an idle poll allocates %v times", n)
	}
}
