package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBothEnds runs the README's main job, shortened, on both backends
// that can run both ends here: the table comes out and both processes
// end with status 0 (the server answers the client's stop message).
func TestBothEnds(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "weft-pingpong")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, backend := range []string{"ntb", "roce"} {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, exe, "-backend", backend, "-sizes", "8,4096", "-n", "200", "-warmup", "20", "-ref-n", "2000").CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, want := range []string{"#bytes", "\n8 ", "\n4096 "} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if backend == "ntb" && !strings.Contains(string(out), "reference round trip median") {
				t.Errorf("output lacks the shared-memory reference:\n%s", out)
			}
		})
	}
}

// TestNoPeer checks that a client with nothing to connect to says what
// it waits for and gives up after -timeout with status 1.
func TestNoPeer(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "weft-pingpong")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	start := time.Now()
	out, err := exec.Command(exe, "-backend", "roce", "-addr", "127.0.0.1:1", "-timeout", "1s").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("gave up after %v with -timeout 1s", el)
	}
	for _, want := range []string{"waiting for a server at roce 127.0.0.1:1", "no peer at roce 127.0.0.1:1 within 1s"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
