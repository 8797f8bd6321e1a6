package prom_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/observe"
	"github.com/weft-io/weft/observe/prom"

	_ "github.com/weft-io/weft/ntb"
)

func TestHandler(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	a, b := fabrictest.OpenPair(t, 0, func(ctx context.Context, _ fabrictest.Side) (fabric.Endpoint, error) {
		return fabric.Open(ctx, "ntb", path, nil)
	})
	r := observe.NewRegistry("test")
	if err := r.AddEndpoint("a", a, true); err != nil {
		t.Fatal(err)
	}
	if err := r.AddEndpoint("b", b, false); err != nil {
		t.Fatal(err)
	}
	buf, _ := a.Alloc(4096, fabric.AccessLocalWrite)
	msgs := []fabric.Message{{SGEs: []fabric.SGE{{Region: buf, Length: 100}}}}
	for range 7 {
		if _, err := a.SendWait(testenv.Context(t), msgs); err != nil {
			t.Fatalf("SendWait: %v", err)
		}
	}
	srv := httptest.NewServer(prom.Handler(r))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	text := string(body)
	for _, c := range []struct {
		re   string
		want float64
	}{
		{`weft_endpoint_tx_messages_total\{backend="ntb",source="a"\} (\S+)`, 7},
		{`weft_endpoint_tx_bytes_total\{backend="ntb",source="a"\} (\S+)`, 700},
		{`weft_up\{backend="ntb",source="b"\} (\S+)`, 1},
	} {
		m := regexp.MustCompile(c.re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no %s in\n%s", c.re, text)
		}
		if v, _ := strconv.ParseFloat(m[1], 64); v != c.want {
			t.Errorf("%s = %v, want %v", c.re, v, c.want)
		}
	}
	if !regexp.MustCompile(`# TYPE weft_endpoint_drops_malformed_total counter`).MatchString(text) {
		t.Errorf("no TYPE line for the drop counters:\n%s", text)
	}
}
