package units

import "testing"

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{{"0", 0, true}, {"64K", 64 << 10, true}, {"16m", 16 << 20, true}, {"1G", 1 << 30, true},
		{"", 0, false}, {"K", 0, false}, {"-1", 0, false}, {"3G", 0, false}, {"12x", 0, false}} {
		got, err := ParseSize(c.in, 2<<30)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseSize(%q) = %d, %v", c.in, got, err)
		}
	}
}
