package roce

import (
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
)

func TestSplitAddr(t *testing.T) {
	for _, c := range []struct {
		in, boot string
		listen   bool
	}{
		{"10.0.0.1", "10.0.0.1:18515", false},
		{"listen:10.0.0.1:99?mtu=4096", "10.0.0.1:99", true},
		{"[fd00::1]", "[fd00::1]:18515", false},
	} {
		l, b, p, err := SplitAddr(c.in)
		if err != nil || l != c.listen || b != c.boot || p == nil {
			t.Errorf("SplitAddr(%q) = %v %q %v %v", c.in, l, b, p, err)
		}
	}
	for _, bad := range []string{"", "listen:", "h?%zz"} {
		if _, _, _, err := SplitAddr(bad); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("SplitAddr(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if o, err := ParseAddr("listen:127.0.0.1?type=ud&mtu=4096"); err != nil || !o.Listen || o.Type != UD || o.MTU != 4096 || o.Bootstrap != "127.0.0.1:18515" {
		t.Errorf("ParseAddr = %+v, %v", o, err)
	}
}
