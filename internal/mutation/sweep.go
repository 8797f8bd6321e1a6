package mutation

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The sweep runs generated mutants the way a mutation tester does, on
// Weft's terms: the tests that guard a package are its own (a rule tested
// only through another package does not count), each mutant runs only the
// tests that call its function, and the mutated file goes to the compiler
// through go build's -overlay, so no copy of the module is made and the
// tree is never touched.

// Coverage maps the lines of one package to the top-level tests that run
// them.
type Coverage struct {
	// Pkg is the package, as go test takes it.
	Pkg string
	// Lines maps "file:line" (file relative to the module root) to the
	// tests that ran the line.
	Lines map[string][]string
	// Took is each test's wall time on the code as it is.
	Took map[string]time.Duration
	// Failed lists the tests that failed on the code as it is: they
	// guard nothing and are never selected.
	Failed []string
}

// MeasureCoverage builds pkg's test binary with coverage and runs each of
// its tests, fuzz targets (their seed corpus) and examples alone, to
// learn which lines each one reaches.
func MeasureCoverage(ctx context.Context, root, pkg string) (*Coverage, error) {
	tmp, err := os.MkdirTemp("", "weft-cover-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "pkg.test")
	modDir, modPkg := goTestDir(root, pkg)
	build := exec.CommandContext(ctx, "go", "test", "-c", "-cover", "-covermode=set", "-o", bin, modPkg)
	build.Dir = modDir
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mutation: building %s with coverage: %v\n%s", pkg, err, out)
	}
	dir := filepath.Join(root, pkg)
	list := exec.CommandContext(ctx, bin, "-test.list", ".")
	list.Dir = dir
	out, err := list.Output()
	if err != nil {
		return nil, fmt.Errorf("mutation: listing the tests of %s: %v", pkg, err)
	}
	mod, err := modulePath(root)
	if err != nil {
		return nil, err
	}
	c := &Coverage{Pkg: pkg, Lines: map[string][]string{}, Took: map[string]time.Duration{}}
	for _, name := range strings.Fields(string(out)) {
		if strings.HasPrefix(name, "Benchmark") {
			continue
		}
		prof := filepath.Join(tmp, "cover.out")
		os.Remove(prof)
		run := exec.CommandContext(ctx, bin, "-test.run", "^"+regexp.QuoteMeta(name)+"$",
			"-test.count=1", "-test.timeout=10m", "-test.coverprofile="+prof)
		run.Dir = dir
		start := time.Now()
		out, err := run.CombinedOutput()
		c.Took[name] = time.Since(start)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			c.Failed = append(c.Failed, name)
			fmt.Fprintf(os.Stderr, "mutation: %s %s fails on the code as it is (left out):\n%s\n", pkg, name, tail(out, 20))
			continue
		}
		if err := c.addProfile(prof, mod, name); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// addProfile records the lines a cover profile marks as run.
func (c *Coverage) addProfile(path, mod, test string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // a test that ran no statement of the package
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// github.com/x/y/file.go:12.3,14.2 2 1
		line := sc.Text()
		colon := strings.LastIndex(line, ":")
		if colon < 0 || strings.HasPrefix(line, "mode:") {
			continue
		}
		file := strings.TrimPrefix(strings.TrimPrefix(line[:colon], mod), "/")
		var l0, c0, l1, c1, stmts, count int
		if _, err := fmt.Sscanf(line[colon+1:], "%d.%d,%d.%d %d %d", &l0, &c0, &l1, &c1, &stmts, &count); err != nil || count == 0 {
			continue
		}
		for l := l0; l <= l1; l++ {
			k := file + ":" + strconv.Itoa(l)
			if !seen[k] {
				seen[k] = true
				c.Lines[k] = append(c.Lines[k], test)
			}
		}
	}
	return sc.Err()
}

// Tests returns the tests that call the mutant's function: those that
// cover its first statement.
func (c *Coverage) Tests(m Mutant) []string {
	return c.Lines[m.File+":"+strconv.Itoa(m.Entry)]
}

// Outcome is what a mutant's run came to.
type Outcome string

// The outcomes. Killed and TimedOut count as caught; Invalid (the mutant
// does not compile) counts neither way.
const (
	Killed     Outcome = "killed"
	TimedOut   Outcome = "timed out"
	Survived   Outcome = "survived"
	NotReached Outcome = "not reached"
	Invalid    Outcome = "invalid"
)

// Caught reports whether a test failed on the mutant.
func (o Outcome) Caught() bool { return o == Killed || o == TimedOut }

// Run applies m through an overlay and runs the tests that call its function.
// The log is go test's output.
func (m Mutant) Run(ctx context.Context, root string, c *Coverage) (Outcome, string, error) {
	tests := c.Tests(m)
	if len(tests) == 0 {
		return NotReached, "", nil
	}
	src, err := os.ReadFile(filepath.Join(root, m.File))
	if err != nil {
		return "", "", err
	}
	tmp, err := os.MkdirTemp("", "weft-mutant-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	mutated := filepath.Join(tmp, filepath.Base(m.File))
	if err := os.WriteFile(mutated, m.Apply(src), 0o644); err != nil {
		return "", "", err
	}
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(root, m.File): mutated}})
	overlay := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlay, ov, 0o644); err != nil {
		return "", "", err
	}
	dir, pkg := goTestDir(root, m.Pkg)
	var took time.Duration
	quoted := make([]string, len(tests))
	for i, t := range tests {
		quoted[i] = regexp.QuoteMeta(t)
		took += c.Took[t]
	}
	// A hang must fail within a minute of the tests' own time.
	limit := 3*took + time.Minute
	cmd := exec.CommandContext(ctx, "go", "test", "-overlay="+overlay, "-count=1", "-vet=off", "-failfast",
		"-timeout="+limit.String(), "-run", "^("+strings.Join(quoted, "|")+")$", pkg)
	cmd.Dir = dir
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	text := buf.String()
	switch {
	case ctx.Err() != nil:
		return "", text, ctx.Err()
	case strings.Contains(text, "[build failed]") || strings.Contains(text, "[setup failed]"):
		return Invalid, text, nil
	case err == nil:
		return Survived, text, nil
	case strings.Contains(text, "panic: test timed out"):
		return TimedOut, text, nil
	}
	return Killed, text, nil
}

// Accepted is the survivors judged equivalent or not worth a test, each
// with its reason, read from survivors.txt beside this file: one per line,
// the mutant's ID, a tab, the reason.
func Accepted(root string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(root, "internal", "mutation", "survivors.txt"))
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for i, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		id, why, ok := strings.Cut(l, "\t")
		if !ok || strings.TrimSpace(why) == "" {
			return nil, fmt.Errorf("survivors.txt:%d: want the mutant's ID, a tab and a reason", i+1)
		}
		out[id] = strings.TrimSpace(why)
	}
	return out, nil
}

func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("mutation: no module line in %s/go.mod", root)
}

func tail(b []byte, n int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// Tally counts one package's outcomes.
type Tally struct {
	Pkg                                            string
	Mutants, Killed, Survived, NotReached, Invalid int
	// Accepted survivors are in survivors.txt; Equivalent ones (their
	// reason says "equivalent") change nothing a test could see.
	Accepted, Equivalent int
}

// Ratio is the share of the mutants a test could catch (valid and not
// equivalent) that a test caught: the usual mutation score.
func (t Tally) Ratio() float64 {
	n := t.Mutants - t.Invalid - t.Equivalent
	if n == 0 {
		return 1
	}
	return float64(t.Killed) / float64(n)
}

// RawRatio is the share of all valid mutants a test caught.
func (t Tally) RawRatio() float64 {
	n := t.Mutants - t.Invalid
	if n == 0 {
		return 1
	}
	return float64(t.Killed) / float64(n)
}
