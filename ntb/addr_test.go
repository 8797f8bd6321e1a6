package ntb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// Every malformed value and every unknown parameter of an ntb address is
// an error matching fabric.ErrInvalid that names the key.
func TestParseAddrMalformed(t *testing.T) {
	for _, c := range []struct{ addr, key string }{
		{"/f?mem=x", "mem"}, {"/f?ring=-1", "ring"}, {"/f?maxmsg=2T", "maxmsg"}, {"/f?queues=1.5", "queues"},
		{"/f?listener=yes", "listener"}, {"/f?queue=64", "queue"}, {"/f?queue=-2", "queue"}, {"/f?nope=1", "nope"},
		{"/f?poll=1ms", "poll"}, // a mapping's parameter
		{"mem:/f?poll=0", "poll"}, {"mem:/f?dead=soon", "dead"}, {"mem:/f?side=2", "side"},
		{"mem:/f?wc=maybe", "wc"}, {"pci:0000:00:05.0?bar=x", "bar"}, {"mem:/f?off=-1", "off"},
	} {
		_, err := parseAddr(c.addr)
		if !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), c.key) {
			t.Errorf("parseAddr(%q) = %v, want ErrInvalid naming %s", c.addr, err, c.key)
		}
	}
	a, err := parseAddr("mem:/f?side=any&poll=200us&wc=1&off=4K&size=1M&queue=3&ring=64K")
	if err != nil || a.kind != "mem" || a.path != "/f" || a.mc.Side != -1 || a.mc.Poll.Microseconds() != 200 || !a.wc ||
		a.off != 4096 || a.size != 1<<20 || a.queue != 3 || !a.listener || a.tc.RingSize != 64<<10 || a.bar != 2 {
		t.Errorf("parseAddr = %+v, %v", a, err)
	}
	if _, err := parseAddr("?mem=1M"); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("empty path: %v", err)
	}
}

// TestBadAddrs: every address that cannot be valid fails through
// fabric.Open and fabric.Listen at once, with a nil interface and an
// error matching fabric.ErrInvalid that names the key or the head.
func TestBadAddrs(t *testing.T) {
	dir := t.TempDir()
	head := dir + "/bridge"
	cases := fabrictest.BadAddrs(head, "mem", "mws", "spads", "dbbits", "queues", "ring", "maxmsg",
		"window", "dma", "dmachan", "listener", "queue")
	cases = append(cases,
		fabrictest.BadAddr{Addr: head + "\x00x", Name: "NUL"},
		fabrictest.BadAddr{Addr: head + "?dbbits=1000", Name: "dbbits"},
		fabrictest.BadAddr{Addr: head + "?mws=9", Name: "mws"},
		fabrictest.BadAddr{Addr: head + "?spads=1000", Name: "spads"},
		fabrictest.BadAddr{Addr: head + "?mem=5000", Name: "mem"},
		fabrictest.BadAddr{Addr: head + "?mem=-1", Name: "mem"},
		fabrictest.BadAddr{Addr: head + "?ring=-1", Name: "ring"},
		fabrictest.BadAddr{Addr: head + "?queue=-1", Name: "queue"},
		fabrictest.BadAddr{Addr: "pci:zz", Name: "zz"},
		fabrictest.BadAddr{Addr: "mem:" + dir + "/absent?side=2", Name: "side"},
		fabrictest.BadAddr{Addr: "?queues=2", Name: "empty path"},
	)
	fabrictest.TestBadAddrs(t, "ntb", cases)
	if _, err := os.Stat(head); err == nil {
		t.Error("a refused address created the bridge file")
	}
	// An endpoint opened on its own carries one queue; the error says
	// which key and what to do instead.
	ep, err := fabric.Open(context.Background(), "ntb", head+"?queues=2", nil)
	if ep != nil || !errors.Is(err, fabric.ErrInvalid) || !strings.Contains(err.Error(), "queues=2") ||
		!strings.Contains(err.Error(), "listener=1") {
		t.Errorf("Open with queues=2 = %v, %v; want nil and ErrInvalid naming queues=2 and listener=1", ep, err)
	}
}

// TestDocAddrs: the addresses of the package documentation work as
// written (in a temporary directory instead of /dev/shm): a pair opened
// on a bridge file, with and without transport parameters, and a
// four-queue listener dialled through its Addr.
func TestDocAddrs(t *testing.T) {
	dir := t.TempDir()
	for i, q := range []string{"", "?ring=1M&maxmsg=64K"} {
		addr := fmt.Sprintf("%s/weft%d%s", dir, i, q)
		fabrictest.OpenPair(t, 0, func(ctx context.Context, _ fabrictest.Side) (fabric.Endpoint, error) {
			return fabric.Open(ctx, "ntb", addr, nil)
		})
	}
	a, b := fabrictest.ListenPair(t, "ntb", dir+"/weft9?queues=4", nil)
	a.Close()
	b.Close()
}

// FuzzParseAddr: no address panics the parser; every refusal matches
// fabric.ErrInvalid, and every address it takes has a path without a NUL.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"/dev/shm/weft0", "/dev/shm/weft0?ring=1M&maxmsg=64K", "/b?queues=4&listener=1&queue=3",
		"pci:0000:00:05.0?side=0&bar=2&wc=1", "mem:/f?off=4K&size=1M&poll=200us", "/b?dbbits=1000", "/b\x00?mem=%00", "?=&;"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		a, err := parseAddr(addr)
		if err != nil {
			if !errors.Is(err, fabric.ErrInvalid) {
				t.Fatalf("parseAddr(%q) = %v, not ErrInvalid", addr, err)
			}
			return
		}
		if a.path == "" || strings.IndexByte(a.path, 0) >= 0 || a.queue >= maxQueues {
			t.Fatalf("parseAddr(%q) took %+v", addr, a)
		}
	})
}
