package mutation

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
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
//
// Two mutants run at a time (WEFT_MUTATION_JOBS changes that), each in a
// copy of the module of its own, and never two of the same package: a
// package's tests assume no other instance of themselves runs beside them
// (fixed namespace, interface and file names), while tests of different
// packages already run side by side in go test ./... . The guarding test
// runs with the race detector only for the mutations that declare Race,
// and with testenv.Timeout shortened to mutantTimeout.
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
	jobs := 2
	if v := os.Getenv("WEFT_MUTATION_JOBS"); v != "" {
		if jobs, err = strconv.Atoi(v); err != nil || jobs < 1 {
			t.Fatalf("WEFT_MUTATION_JOBS=%q: want a positive number", v)
		}
	}
	var todo []Mutation
	for _, m := range List {
		if pick.MatchString(m.Name) {
			todo = append(todo, m)
		}
	}
	if len(todo) == 0 {
		t.Fatalf("WEFT_MUTATION=%q selects no mutation", sel)
	}
	jobs = min(jobs, len(todo))
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(todo)
	var wg sync.WaitGroup
	for range jobs {
		tmp := t.TempDir()
		if err := CopyModule(root, tmp); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				m, ok := q.next()
				if !ok {
					return
				}
				t.Run(m.Name, func(t *testing.T) { runMutant(t, tmp, m) })
				q.done(m)
			}
		})
	}
	wg.Wait()
}

// mutantTimeout is testenv.Timeout in the guarding tests of the mutants
// (testenv.TimeoutEnv): a mutant that hangs a wait is caught in 15 s, not
// 60. The 8 mutations caught that way (the rndv stalls and second looks,
// the sock write deadline and direct read, the XDP link's write after
// Close) also time out at 60 s; no other is killed by the bound. A kill by
// it is reported with its "timed out after 15s" line, so that one which
// only a longer wait would have passed can be told from a hang.
const mutantTimeout = "15s"

// runMutant applies m to the module at tmp, runs its guarding test there
// and fails t unless that test fails.
func runMutant(t *testing.T, tmp string, m Mutation) {
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
	args := []string{"test", "-count=1"}
	mode := "without the race detector"
	if m.Race {
		args = append(args, "-race")
		mode = "with -race"
	}
	args = append(args, "-run", m.Run, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), testenv.TimeoutEnv+"="+mutantTimeout)
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
		t.Fatalf("SURVIVED: %s; %s=%s go test %s passed on the broken code (%s):\n%s",
			m.Why, testenv.TimeoutEnv, mutantTimeout, strings.Join(args[1:], " "), mode, text)
	case !strings.Contains(text, "--- FAIL") && !strings.Contains(text, "\npanic: ") && !strings.Contains(text, "\nfatal error: "):
		// A break that panics (or deadlocks into the runtime's
		// fatal error) in a goroutine of its own ends the test
		// binary without a --- FAIL line: that is caught too.
		t.Fatalf("go test failed without a failing test (%v):\n%s", err, text)
	}
	// One Log call, so that the lines stay together in the output of
	// two mutants that run at once.
	var b strings.Builder
	fmt.Fprintf(&b, "killed by %s in %s %s (go test wall time %v)", m.Run, m.Pkg, mode, took.Round(10*time.Millisecond))
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "--- FAIL") || strings.Contains(l, "_test.go:") ||
			strings.Contains(l, "race detected") || strings.Contains(l, "timed out after") {
			fmt.Fprintf(&b, "\n  %s", strings.TrimSpace(l))
		}
	}
	t.Log(b.String())
}

// queue hands the mutations out in their order to the workers of
// TestMutations, never one whose package a worker is testing.
type queue struct {
	mu      sync.Mutex
	changed *sync.Cond
	todo    []Mutation
	busy    map[string]bool // packages under test
}

func newQueue(todo []Mutation) *queue {
	q := &queue{todo: todo, busy: map[string]bool{}}
	q.changed = sync.NewCond(&q.mu)
	return q
}

// next returns the first mutation whose package is free, waiting for one
// to be; false once none is left.
func (q *queue) next() (Mutation, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.todo) > 0 {
		for i, m := range q.todo {
			if !q.busy[m.Pkg] {
				q.busy[m.Pkg] = true
				q.todo = append(q.todo[:i:i], q.todo[i+1:]...)
				return m, true
			}
		}
		q.changed.Wait()
	}
	return Mutation{}, false
}

// done frees m's package.
func (q *queue) done(m Mutation) {
	q.mu.Lock()
	delete(q.busy, m.Pkg)
	q.mu.Unlock()
	q.changed.Broadcast()
}
