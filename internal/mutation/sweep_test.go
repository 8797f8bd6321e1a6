package mutation

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Swept is the packages that take input from a peer, the wire or a user:
// the generator's scope (issue 29).
var Swept = []string{
	"./fabric/", "./fabric/sock/", "./fabric/rdm/",
	"./roce/", "./roce/cm/", "./roce/wire/", "./roce/link/", "./roce/exchange/",
	"./ntb/", "./ntb/pci/", "./ntb/hw/",
	"./ethernet/", "./batch/", "./vnet/",
	"./internal/addrparam/", "./internal/acceptq/",
	"./tools/router/",
}

// TestGenerate checks the generator on every swept package: it parses
// them all, each mutant changes its file, IDs are unique, and every ID
// survivors.txt accepts is still generated.
func TestGenerate(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	all := map[string]bool{}
	for _, p := range Swept {
		ms, err := Generate(root, p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if len(ms) == 0 {
			t.Errorf("%s: no mutants", p)
		}
		ids := map[string]bool{}
		for _, m := range ms {
			if ids[m.ID] {
				t.Errorf("two mutants %s", m.ID)
			}
			ids[m.ID] = true
			all[m.ID] = true
			if m.Old == m.New {
				t.Errorf("%s changes nothing", m.ID)
			}
		}
		total += len(ms)
	}
	t.Logf("%d mutants in %d packages", total, len(Swept))
	// Every accepted survivor is still a mutant of the code: an entry the
	// code has moved away from is stale and must go.
	acc, err := Accepted(root)
	if err != nil {
		t.Fatal(err)
	}
	for id := range acc {
		if !all[id] {
			t.Errorf("survivors.txt: %s is no longer generated (the code changed): remove it", id)
		}
	}
}

// TestSweep runs generated mutants against their packages' own tests. It
// runs when WEFT_SWEEP is set: to "all" for every swept package, or to a
// comma-separated list of packages ("./roce/wire/,./batch/"), each with
// an optional ":k" that samples it 1 in k ("./roce/:32").
//
//   - WEFT_SWEEP_SAMPLE=k runs the fixed 1-in-k sample (by ID hash).
//   - WEFT_SWEEP_ONLY is a regular expression over mutant IDs.
//   - WEFT_SWEEP_REPORT names a file for the table and the survivors;
//     each outcome is also appended to that name plus ".progress" as it
//     comes.
//   - WEFT_SWEEP_LIST=1 lists the picked mutants' IDs and runs nothing.
//
// A survivor that survivors.txt does not accept fails the test: it is a
// rule no test holds.
func TestSweep(t *testing.T) {
	sel := os.Getenv("WEFT_SWEEP")
	if sel == "" {
		t.Skip("set WEFT_SWEEP=all (or a list of packages) to run the generated mutants")
	}
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := Swept
	if sel != "all" {
		pkgs = strings.Split(sel, ",")
	}
	k := 1
	if s := os.Getenv("WEFT_SWEEP_SAMPLE"); s != "" {
		if k, err = strconv.Atoi(s); err != nil || k < 1 {
			t.Fatalf("WEFT_SWEEP_SAMPLE=%q: want a positive integer", s)
		}
	}
	only := regexp.MustCompile(os.Getenv("WEFT_SWEEP_ONLY"))
	accepted, err := Accepted(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Each outcome is appended to the progress file as it comes, so a run
	// cut short (a timeout, the session's end) keeps what it learnt.
	var progress *os.File
	if f := os.Getenv("WEFT_SWEEP_REPORT"); f != "" {
		if progress, err = os.Create(f + ".progress"); err != nil {
			t.Fatal(err)
		}
		defer progress.Close()
	}
	var report strings.Builder
	fmt.Fprintf(&report, "| package | mutants | killed | survived | not reached | invalid | accepted (equivalent) | kill ratio (of all valid) |\n|---|---|---|---|---|---|---|---|\n")
	var all Tally
	var surv strings.Builder
	for _, p := range pkgs {
		k := k
		if pk, ks, ok := strings.Cut(p, ":"); ok {
			if k, err = strconv.Atoi(ks); err != nil || k < 1 {
				t.Fatalf("WEFT_SWEEP: %q: want package:k with k a positive integer", p)
			}
			p = pk
		}
		ms, err := Generate(root, p)
		if err != nil {
			t.Fatal(err)
		}
		var pick []Mutant
		for _, m := range ms {
			if m.Sampled(k) && only.MatchString(m.ID) {
				pick = append(pick, m)
			}
		}
		if len(pick) == 0 {
			continue
		}
		if os.Getenv("WEFT_SWEEP_LIST") != "" {
			for _, m := range pick {
				t.Logf("%s\t%s:%d", m.ID, m.File, m.Line)
			}
			continue
		}
		start := time.Now()
		cov, err := MeasureCoverage(ctx, root, p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: coverage of %d tests in %v; %d of %d mutants picked", p, len(cov.Took), time.Since(start).Round(time.Second), len(pick), len(ms))
		tl := Tally{Pkg: p}
		for _, m := range pick {
			o, log, err := m.Run(ctx, root, cov)
			if err != nil {
				t.Fatal(err)
			}
			tl.Mutants++
			if progress != nil {
				fmt.Fprintf(progress, "%s\t%s\t%s:%d\t%s\t%q -> %q\n", o, m.ID, m.File, m.Line, m.Op, oneLine(m.Old), oneLine(m.New))
			}
			switch {
			case o.Caught():
				tl.Killed++
			case o == Invalid:
				tl.Invalid++
				t.Logf("invalid: %s\n%s", m.ID, tail([]byte(log), 5))
			default:
				if o == NotReached {
					tl.NotReached++
				} else {
					tl.Survived++
				}
				why, ok := accepted[m.ID]
				if ok {
					tl.Accepted++
					if strings.HasPrefix(why, "equivalent") {
						tl.Equivalent++
					}
				} else {
					t.Errorf("%s: %s:%d %s %q -> %q", o, m.File, m.Line, m.Op, oneLine(m.Old), oneLine(m.New))
				}
				fmt.Fprintf(&surv, "%s\t%s\t%s:%d\t%s\n", m.ID, o, m.File, m.Line, why)
			}
		}
		report.WriteString(tl.row(p))
		all.add(tl)
		t.Logf("%s: %d/%d killed in %v", p, tl.Killed, tl.Mutants-tl.Invalid, time.Since(start).Round(time.Second))
	}
	report.WriteString(all.row("all"))
	out := report.String() + "\nSurvivors (ID, outcome, place, accepted reason):\n" + surv.String()
	t.Log("\n" + out)
	if f := os.Getenv("WEFT_SWEEP_REPORT"); f != "" {
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// row is the tally's line of the report's table.
func (t Tally) row(name string) string {
	return fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d (%d) | %.0f%% (%.0f%%) |\n", name, t.Mutants, t.Killed, t.Survived,
		t.NotReached, t.Invalid, t.Accepted, t.Equivalent, 100*t.Ratio(), 100*t.RawRatio())
}

// add adds u's counts to t.
func (t *Tally) add(u Tally) {
	t.Mutants += u.Mutants
	t.Killed += u.Killed
	t.Survived += u.Survived
	t.NotReached += u.NotReached
	t.Invalid += u.Invalid
	t.Accepted += u.Accepted
	t.Equivalent += u.Equivalent
}

// TestGoTestDir checks where go test runs for a package: the root for
// the root module's packages, the nested module's directory for one of
// its packages (the root module cannot test them).
func TestGoTestDir(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ pkg, dir, rel string }{
		{"./fabric/", root, "./fabric/"},
		{"./tools/router/", root + "/tools", "./router/"},
		{"./tools/", root + "/tools", "./"},
	} {
		if dir, rel := goTestDir(root, c.pkg); dir != c.dir || rel != c.rel {
			t.Errorf("goTestDir(%s) = %s, %s; want %s, %s", c.pkg, dir, rel, c.dir, c.rel)
		}
	}
}
