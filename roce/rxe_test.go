//go:build rxe

package roce

// Interop with Linux Soft-RoCE: the tests boot the rxe VMs of
// ../shared/rxe-vm (kernel rxe, rdma-core, perftest) and run rdma-core's
// and perftest's programs in the guest against this engine on the host
// side of the bridge (10.77.0.1). They need root and the harness; build
// them with -tags rxe:
//
//	go test -tags rxe -run TestRxe -v ./roce/
//
// TestRxeInterop writes the guest script and starts the harness, whose
// host command is this test binary again, running TestRxeHost in the
// harness's namespace. Guest and host walk through the same list of
// steps; the side that is the client of a step retries until the server
// listens.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

const guestIP = "10.77.0.2"

// rxeStep is one interop exchange. Guest is the guest's command line;
// Host runs the matching Weft side.
type rxeStep struct {
	Name  string
	Guest string
	Host  func(t *testing.T, ctx context.Context) error
}

var rcSizes = []int{1, 64, 1024, 1500, 4096, 65536}
var udSizes = []int{1, 64, 1024}

const rxeIters = 50

func rxeSteps() []rxeStep {
	var steps []rxeStep
	for _, s := range rcSizes {
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("rc-pingpong-server-%d", s),
			Guest: fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g 1 -n %d -s %d", rxeIters, s),
			Host: func(t *testing.T, ctx context.Context) error {
				return weftPingpong(ctx, guestIP+":18515?keepalive=0", s, true)
			}})
	}
	for _, s := range rcSizes {
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("rc-pingpong-client-%d", s),
			Guest: fmt.Sprintf("retry ibv_rc_pingpong -d rxe0 -g 1 -n %d -s %d 10.77.0.1", rxeIters, s),
			Host: func(t *testing.T, ctx context.Context) error {
				return weftPingpong(ctx, "listen:10.77.0.1:18515?keepalive=0", s, false)
			}})
	}
	for _, s := range udSizes {
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("ud-pingpong-server-%d", s),
			Guest: fmt.Sprintf("ibv_ud_pingpong -d rxe0 -g 1 -n %d -s %d", rxeIters, s),
			Host: func(t *testing.T, ctx context.Context) error {
				return weftPingpong(ctx, guestIP+":18515?type=ud", s, true)
			}})
	}
	for _, s := range udSizes {
		steps = append(steps, rxeStep{
			Name:  fmt.Sprintf("ud-pingpong-client-%d", s),
			Guest: fmt.Sprintf("retry ibv_ud_pingpong -d rxe0 -g 1 -n %d -s %d 10.77.0.1", rxeIters, s),
			Host: func(t *testing.T, ctx context.Context) error {
				return weftPingpong(ctx, "listen:10.77.0.1:18515?type=ud", s, false)
			}})
	}
	return append(steps, perftestSteps()...)
}

// weftPingpong plays ibv_*_pingpong's protocol: n strictly alternating
// messages each way, the client first; each side sends only after its
// previous send completed and a message arrived. Payloads are 0x7b, as
// the pingpong programs fill theirs.
func weftPingpong(ctx context.Context, addr string, size int, client bool) error {
	ep, err := fabric.Open(ctx, "roce", addr, &fabric.Options{})
	if err != nil {
		return err
	}
	defer ep.Close()
	sbuf, _ := ep.Alloc(size, 0)
	rbuf, _ := ep.Alloc(size+64, fabric.AccessLocalWrite)
	for i := range sbuf.Bytes() {
		sbuf.Bytes()[i] = 0x7b
	}
	send := func(i int) error {
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(sbuf)}, Flags: fabric.FlagSignal, Context: uint64(i)}}
		if _, err := ep.SendWait(ctx, msgs); err != nil {
			return err
		}
		out := make([]fabric.Completion, 1)
		if _, err := ep.CQ().Wait(ctx, out); err != nil {
			return err
		}
		if err := out[0].Err(); err != nil {
			return fmt.Errorf("send %d completed with %v", i, err)
		}
		return nil
	}
	recv := func(i int) error {
		msgs := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rbuf)}}}
		if _, err := ep.RecvWait(ctx, msgs); err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		got := rbuf.Bytes()[:msgs[0].Len]
		if len(got) != size || bytes.IndexFunc(got, func(r rune) bool { return r != 0x7b }) >= 0 {
			return fmt.Errorf("message %d: %d bytes, want %d bytes of 0x7b", i, len(got), size)
		}
		return nil
	}
	for i := 0; i < rxeIters; i++ {
		if client {
			if err := send(i); err != nil {
				return err
			}
			if err := recv(i); err != nil {
				return err
			}
		} else {
			if err := recv(i); err != nil {
				return err
			}
			if err := send(i); err != nil {
				return err
			}
		}
	}
	return nil
}

func findHarness(t *testing.T) string {
	if d := os.Getenv("WEFT_RXE_VM"); d != "" {
		return d
	}
	dir, _ := os.Getwd()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		p := filepath.Join(d, "shared", "rxe-vm", "run.sh")
		if _, err := os.Stat(p); err == nil {
			return filepath.Dir(p)
		}
		p = filepath.Join(filepath.Dir(d), "shared", "rxe-vm", "run.sh")
		if _, err := os.Stat(p); err == nil {
			return filepath.Dir(p)
		}
	}
	testenv.SkipOrFail(t, "no rxe-vm harness (set WEFT_RXE_VM)")
	return ""
}

// TestRxeInterop runs every step: the rdma-core and perftest programs in
// a Soft-RoCE guest, Weft's engine on the host.
func TestRxeInterop(t *testing.T) {
	testenv.RequireRoot(t)
	harness := findHarness(t)
	dir := t.TempDir()
	var gs strings.Builder
	gs.WriteString("#!/bin/sh\n# Generated by roce/rxe_test.go.\nfail=0\n")
	gs.WriteString("retry() { i=0; until \"$@\"; do i=$((i+1)); [ $i -ge 90 ] && return 1; sleep 1; done; }\n")
	for _, s := range rxeSteps() {
		fmt.Fprintf(&gs, "echo '>>> %s'\nif ! %s; then echo 'STEP FAILED: %s'; fail=1; fi\nsleep 1\n", s.Name, s.Guest, s.Name)
	}
	gs.WriteString("sleep 3\nexit $fail\n")
	script := filepath.Join(dir, "guest.sh")
	if err := os.WriteFile(script, []byte(gs.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(dir, "rxe.pcap")
	if p := os.Getenv("WEFT_RXE_PCAP"); p != "" {
		pcap = p
	}
	cmd := exec.Command(filepath.Join(harness, "run.sh"), "-n", "1", "-t", "900", "-c", pcap, script,
		os.Args[0], "-test.run=^TestRxeHost$", "-test.v", "-test.timeout=15m")
	cmd.Env = append(os.Environ(), "WEFT_RXE_HOST=1")
	out, err := cmd.CombinedOutput()
	t.Logf("harness output:\n%s", out)
	if err != nil {
		t.Fatalf("interop failed: %v (capture in %s)", err, pcap)
	}
	if bytes.Contains(out, []byte("STEP FAILED")) || !bytes.Contains(out, []byte("--- PASS: TestRxeHost")) {
		t.Fatalf("interop failed (capture in %s)", pcap)
	}
}

// TestRxeHost is the host side, run by the harness in its namespace.
func TestRxeHost(t *testing.T) {
	if os.Getenv("WEFT_RXE_HOST") != "1" {
		t.Skip("run by TestRxeInterop inside the harness")
	}
	for _, s := range rxeSteps() {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		start := time.Now()
		err := s.Host(t, ctx)
		cancel()
		if err != nil {
			t.Errorf("step %s: %v", s.Name, err)
		} else {
			t.Logf("step %s: ok in %v", s.Name, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func perftestSteps() []rxeStep { return nil }
