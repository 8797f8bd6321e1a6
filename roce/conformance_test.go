package roce

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// freePort returns a TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// rcPair connects two endpoints of two engines (127.0.0.1 and 127.0.0.2).
func rcPair(t testing.TB, query string) (a, b *Endpoint) {
	t.Helper()
	// UDP, whoever owns the rings of these addresses (link=auto would
	// take shared memory where this process does): the query may name
	// another link, the last value of a key being the one that counts.
	query = "link=udp&" + query
	port := freePort(t)
	return fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, s fabrictest.Side) (*Endpoint, error) {
		addr := fmt.Sprintf("listen:127.0.0.1:%d?%s", port, query)
		if s == fabrictest.SideB {
			addr = fmt.Sprintf("127.0.0.1:%d?local=127.0.0.2&%s", port, query)
		}
		ep, err := fabric.Open(ctx, "roce", addr, nil)
		if err != nil {
			return nil, err
		}
		return ep.(*Endpoint), nil
	})
}

func TestConformance(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := rcPair(t, "")
		return a, b
	})
}

func TestConformanceUD(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := rcPair(t, "type=ud")
		return a, b
	})
}

// TestConformanceProcesses runs role B in a child process with its own
// engine on 127.0.0.2; the roles find each other's TCP exchange through a
// file named by the case key.
func TestConformanceProcesses(t *testing.T) {
	fabrictest.TestProcesses(t, func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint {
		return processSide(t, "weft-roce-ft-"+key, side, "listen:127.0.0.1:%d", "127.0.0.1:%d?local=127.0.0.2")
	})
}

// processSide opens one side of a pair whose sides run in two processes:
// side A listens on a free port (listenFmt) and publishes it in a file
// named name, side B waits for the file and dials the port (dialFmt).
func processSide(t testing.TB, name string, side fabrictest.Side, listenFmt, dialFmt string) fabric.Endpoint {
	portFile := filepath.Join(os.TempDir(), name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := listenFmt
	var port int
	if side == fabrictest.SideA {
		port = freePort(t)
		os.WriteFile(portFile+".tmp", []byte(strconv.Itoa(port)), 0o600)
		os.Rename(portFile+".tmp", portFile)
		t.Cleanup(func() { os.Remove(portFile) })
	} else {
		addr = dialFmt
		for {
			b, err := os.ReadFile(portFile)
			if err == nil {
				port, _ = strconv.Atoi(string(b))
				break
			}
			if ctx.Err() != nil {
				t.Fatal("no port file from side A")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	ep, err := fabric.Open(ctx, "roce", fmt.Sprintf(addr, port), nil)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

func TestWaitSet(t *testing.T) {
	fabrictest.TestWaitSet(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := rcPair(t, "")
		return a, b
	})
}
