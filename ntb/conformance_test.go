package ntb

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// pair opens both sides of a fresh emulated bridge.
func pair(t testing.TB, sc ShmConfig, tc Config) (a, b *Endpoint) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		ep  *Endpoint
		err error
	}
	ch := make(chan res, 1)
	go func() {
		ep, err := DialShm(ctx, path, sc, tc)
		ch <- res{ep, err}
	}()
	a, err := DialShm(ctx, path, sc, tc)
	r := <-ch
	if err != nil || r.err != nil {
		if a != nil {
			a.Close()
		}
		if r.ep != nil {
			r.ep.Close()
		}
		t.Fatalf("DialShm: %v / %v", err, r.err)
	}
	t.Cleanup(func() { a.Close(); r.ep.Close() })
	return a, r.ep
}

func TestConformance(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := pair(t, ShmConfig{}, Config{})
		return a, b
	})
}

func TestConformanceProcesses(t *testing.T) {
	fabrictest.TestProcesses(t, func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint {
		path := filepath.Join(os.TempDir(), "weft-fabrictest-"+key)
		if side == fabrictest.SideA {
			t.Cleanup(func() { os.Remove(path) })
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ep, err := DialShm(ctx, path, ShmConfig{}, Config{})
		if err != nil {
			t.Fatalf("side %v: %v", side, err)
		}
		return ep
	})
}
