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
	return fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, _ fabrictest.Side) (*Endpoint, error) {
		return DialShm(ctx, path, sc, tc)
	})
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

func TestWaitSet(t *testing.T) {
	fabrictest.TestWaitSet(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := pair(t, ShmConfig{}, Config{})
		return a, b
	})
}
