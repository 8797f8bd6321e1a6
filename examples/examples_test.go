// Package examples_test checks the promise of examples/: programs a user
// can copy out, so they import only Weft's public packages, and they run.
package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

// examples are the programs under examples/, each run with no arguments.
var examples = []string{"pingpong", "stream", "rma", "batching", "listener", "vnet"}

// needRoot are the examples that need root (network namespaces, TAP
// devices).
var needRoot = map[string]bool{"vnet": true}

func TestPublicImportsOnly(t *testing.T) {
	args := []string{"list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`}
	for _, name := range examples {
		args = append(args, "./"+name)
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		seen++
		for _, imp := range f[1:] {
			if strings.Contains(imp, "/internal/") || strings.HasSuffix(imp, "/internal") {
				t.Errorf("%s imports %s: an example cannot be copied out of the module", f[0], imp)
			}
		}
	}
	if seen != len(examples) {
		t.Fatalf("go list found %d example packages, want %d:\n%s", seen, len(examples), out)
	}
}

func TestRun(t *testing.T) {
	bin := t.TempDir()
	for _, name := range examples {
		t.Run(name, func(t *testing.T) {
			if needRoot[name] {
				testenv.RequireRoot(t)
			}
			exe := filepath.Join(bin, name)
			if out, err := exec.Command("go", "build", "-o", exe, "./"+name).CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe)
			cmd.Dir = bin
			cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, out)
			}
			t.Logf("%s", out)
		})
	}
}
