package mutation

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestTable checks every mutation against the code as it is: it still
// applies (its text occurs once), its names are unique, and its guarding
// test exists in its package. It runs in every go test, so a change to the
// code that leaves a mutation behind fails here, not silently later.
func TestTable(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range List {
		if seen[m.Name] {
			t.Errorf("two mutations named %s", m.Name)
		}
		seen[m.Name] = true
		if m.Pkg == "" || m.Run == "" || m.Why == "" {
			t.Errorf("%s: Pkg, Run and Why are required", m.Name)
		}
		if err := m.Check(root); err != nil {
			t.Error(err)
			continue
		}
		// The top-level test the pattern selects must be declared in the
		// package's test files.
		top := strings.Split(m.Run, "/")[0]
		re, err := regexp.Compile(top)
		if err != nil {
			t.Errorf("%s: -run %q: %v", m.Name, m.Run, err)
			continue
		}
		files, _ := filepath.Glob(filepath.Join(root, m.Pkg, "*_test.go"))
		decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`)
		found := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range decl.FindAllStringSubmatch(string(b), -1) {
				found = found || re.MatchString(d[1])
			}
		}
		if !found {
			t.Errorf("%s: no test in %s matches %q", m.Name, m.Pkg, top)
		}
	}
}

// TestMutations applies each mutation to a copy of the module and runs its
// guarding test there, which must fail. It runs when WEFT_MUTATION is set:
// to 1 for all, or to a regular expression over the names.
func TestMutations(t *testing.T) {
	sel := os.Getenv("WEFT_MUTATION")
	if sel == "" {
		t.Skip("set WEFT_MUTATION=1 (or a pattern over mutation names) to run the mutations")
	}
	if sel == "1" {
		sel = ""
	}
	pick, err := regexp.Compile(sel)
	if err != nil {
		t.Fatalf("WEFT_MUTATION=%q: %v", sel, err)
	}
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := CopyModule(root, tmp); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, m := range List {
		if !pick.MatchString(m.Name) {
			continue
		}
		ran++
		t.Run(m.Name, func(t *testing.T) {
			restore, err := m.Apply(tmp)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := restore(); err != nil {
					t.Fatal(err)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			dir, pkg := goTestDir(tmp, m.Pkg)
			cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-race", "-run", m.Run, pkg)
			cmd.Dir = dir
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			text := string(out)
			switch {
			case ctx.Err() != nil:
				t.Fatalf("%s: the guarding test did not finish in 5 minutes:\n%s", m.Why, text)
			case strings.Contains(text, "[build failed]") || strings.Contains(text, "[setup failed]"):
				t.Fatalf("the mutated code does not build (the mutation proves nothing):\n%s", text)
			case err == nil:
				t.Fatalf("SURVIVED: %s; go test -run '%s' %s passed on the broken code:\n%s", m.Why, m.Run, m.Pkg, text)
			case !strings.Contains(text, "--- FAIL") && !strings.Contains(text, "\npanic: ") && !strings.Contains(text, "\nfatal error: "):
				// A break that panics (or deadlocks into the runtime's
				// fatal error) in a goroutine of its own ends the test
				// binary without a --- FAIL line: that is caught too.
				t.Fatalf("go test failed without a failing test (%v):\n%s", err, text)
			}
			t.Logf("killed by %s in %s (go test wall time %v)", m.Run, m.Pkg, took.Round(10*time.Millisecond))
			for _, l := range strings.Split(text, "\n") {
				if strings.Contains(l, "--- FAIL") || strings.Contains(l, "_test.go:") {
					t.Logf("  %s", strings.TrimSpace(l))
				}
			}
		})
	}
	if ran == 0 {
		t.Fatalf("WEFT_MUTATION=%q selects no mutation", sel)
	}
}
