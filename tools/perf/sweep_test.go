package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/tools/measure"
)

// TestSweep runs the sweep's client and server in one process over an
// emulated NTB bridge, briefly, in every mode.
func TestSweep(t *testing.T) {
	measure.InitClock()
	addr := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := &fabric.Options{MaxMsgSize: 64 << 10}
	peer := make(chan fabric.Endpoint, 1)
	go func() {
		ep, err := fabric.Open(ctx, "ntb", addr, opts)
		if err != nil {
			t.Error(err)
		}
		peer <- ep
	}()
	a, err := fabric.Open(ctx, "ntb", addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := <-peer
	if b == nil {
		t.FailNow()
	}
	defer b.Close()
	served := make(chan error, 1)
	go func() { served <- serveSweep(ctx, b, false) }()

	cfg := sweepConfig{sizes: []int{64, 1500}, modes: allModes, dur: 50 * time.Millisecond,
		latDur: 30 * time.Millisecond, runs: 1, group: 32, latRate: 100e3, maxMsg: 64 << 10}
	cl := &client{ep: a, cfg: cfg}
	if err := cl.init(); err != nil {
		t.Fatal(err)
	}
	var pts []Point
	for _, size := range cfg.sizes {
		for _, mode := range cfg.modes {
			p, err := cl.measure(ctx, mode, size)
			if err != nil {
				t.Fatalf("%s %d: %v", mode, size, err)
			}
			p.Backend = "ntb"
			t.Logf("%+v", p)
			if p.Packets == 0 || p.PktPerSec <= 0 || p.Gaps != 0 || p.LatP50us <= 0 || p.LatP99us < p.LatP50us {
				t.Fatalf("%s %d: %+v", mode, size, p)
			}
			if (mode == "batched") != (p.PktPerBatch > 0) {
				t.Fatalf("%s: %.1f packets per batch", mode, p.PktPerBatch)
			}
			pts = append(pts, p)
		}
	}
	if err := control(ctx, a, cl.ctl, immQuit, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	rep := summarize(cfg, pts)
	if len(rep.Points) != 6 || len(rep.Summary) != 2 || rep.Summary[0].Speedup <= 0 || rep.Summary[0].BoundUs <= 0 {
		t.Fatalf("%+v", rep)
	}
	if err := writePlot(filepath.Join(t.TempDir(), "sweep.png"), rep, true); err != nil {
		t.Fatal(err)
	}
}

// TestLocalPair checks the addresses with which stream and sweep modes
// run both ends themselves: a roce receiver listens on 127.0.0.1 where
// the sender dials from 127.0.0.2, each mode on a port of its own; ntb
// ends share one bridge file, which cleanup removes.
func TestLocalPair(t *testing.T) {
	port := func(s string) string {
		s = strings.TrimPrefix(s, "listen:")
		s = s[:strings.IndexByte(s, '?')]
		return s[strings.LastIndexByte(s, ':')+1:]
	}
	srv, cli, cleanup := localPair("roce", "perf-sweep")
	cleanup()
	if !strings.HasPrefix(srv, "listen:127.0.0.1:") || !strings.HasPrefix(cli, "127.0.0.1:") ||
		!strings.Contains(cli, "local=127.0.0.2") || port(srv) != port(cli) {
		t.Fatalf("roce sweep: server %q, client %q", srv, cli)
	}
	srv2, _, _ := localPair("roce", "perf")
	if port(srv2) == port(srv) {
		t.Fatalf("stream and sweep share port %s", port(srv))
	}
	srv, cli, cleanup = localPair("ntb", "perf-sweep")
	if srv != cli || !strings.Contains(srv, "weft-perf-sweep-") {
		t.Fatalf("ntb: server %q, client %q", srv, cli)
	}
	os.WriteFile(srv, nil, 0o600)
	cleanup()
	if _, err := os.Stat(srv); !os.IsNotExist(err) {
		t.Fatalf("bridge %s left behind: %v", srv, err)
	}
}
