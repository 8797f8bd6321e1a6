package ntb

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

const (
	stressEnv   = "WEFT_NTB_DB_STRESS" // the helper's bridge file
	cyclesEnv   = "WEFT_NTB_DB_CYCLES" // cycles of TestDoorbellStress (default 20000)
	bitPing     = 1 << 0
	bitPong     = 1 << 1
	bitStop     = 1 << 2
	stressLimit = 30 * time.Minute // the child's bound: the parent kills it sooner
	cycleLimit  = 10 * time.Second // one round trip's: a lost wake-up fails here
)

// TestDoorbellStress rings doorbells back and forth between two processes,
// each sleeping in DBWait for every one: the parent rings ping and waits
// for pong, the child waits for ping and rings pong. A wake-up lost
// between a sleeper's check and its park stops the ping-pong, and the
// test fails at its deadline instead of finishing. WEFT_NTB_DB_CYCLES
// sets the cycles (millions for a soak: go test -run DoorbellStress
// -count=1 with WEFT_NTB_DB_CYCLES=2000000).
func TestDoorbellStress(t *testing.T) {
	if path := os.Getenv(stressEnv); path != "" {
		stressChild(path)
		return
	}
	cycles := 20000
	if v, err := strconv.Atoi(os.Getenv(cyclesEnv)); err == nil && v > 0 {
		cycles = v
	}
	path := filepath.Join(t.TempDir(), "bridge")
	d, err := OpenShm(path, ShmConfig{MemSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDoorbellStress$")
	cmd.Env = append(os.Environ(), stressEnv+"="+path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitLink(t, d, true)
	start := time.Now()
	for i := range cycles {
		if err := d.PeerDBSet(bitPing); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), cycleLimit)
		for {
			set, err := d.DBWait(ctx, bitPong)
			if err != nil {
				t.Fatalf("cycle %d of %d: no pong: %v (a lost wake-up)", i, cycles, err)
			}
			if set != 0 {
				break
			}
		}
		cancel()
		d.DBClear(bitPong)
	}
	el := time.Since(start)
	d.PeerDBSet(bitStop)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if d.sleeps.Load() == 0 {
		t.Fatal("DBWait never slept: the test did not cover the sleep path")
	}
	t.Logf("%d cycles in %v (%v per round trip), %d sleeps", cycles, el, el/time.Duration(cycles), d.sleeps.Load())
}

func stressChild(path string) {
	d, err := OpenShm(path, ShmConfig{})
	if err != nil {
		os.Exit(2)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), stressLimit)
	defer cancel()
	for {
		set, err := d.DBWait(ctx, bitPing|bitStop)
		if err != nil {
			os.Exit(3)
		}
		if set&bitStop != 0 {
			return
		}
		if set&bitPing != 0 {
			d.DBClear(bitPing)
			d.PeerDBSet(bitPong)
		}
	}
}
