package ntb

import (
	"errors"
	"strings"
	"testing"

	"github.com/weft-io/weft/fabric"
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
