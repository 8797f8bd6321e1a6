package typednil

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// listed is the part of go list -json that the test reads.
type listed struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
	Standard   bool
	Module     *struct{ Path string }
}

// TestModule type-checks every package of the module (without cgo) and
// fails on each return that can put a typed nil in an interface.
func TestModule(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-export", "-deps", "-json", "./...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var mine []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Path == "github.com/weft-io/weft" {
			mine = append(mine, p)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, errors.New("no export data for " + path)
		}
		return os.Open(f)
	})
	var found []Finding
	for _, p := range mine {
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		found = append(found, Check(fset, files, info)...)
	}
	if len(mine) < 20 {
		t.Fatalf("checked %d packages; go list found too few", len(mine))
	}
	for _, f := range found {
		t.Errorf("%s", strings.TrimPrefix(f.String(), root+"/"))
	}
}

// TestCheck holds the checker to the shapes it must and must not report.
func TestCheck(t *testing.T) {
	const src = `package p

type I interface{ M() }
type T struct{}

func (*T) M() {}

func mk() (*T, error)     { return nil, nil }
func mkI() (I, error)     { return nil, nil }

func bad1() (I, error) { return mk() }
func bad2() (I, error) { t, err := mk(); return t, err }
func bad3() (I, error) {
	f := func() (I, error) { return mk() }
	return f()
}
func good1() (I, error) { t, err := mk(); if err != nil { return nil, err }; return t, nil }
func good2() (I, error) { return mkI() }
func good3() (I, error) { return &T{}, nil }
func good4() (*T, error) { return mk() }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
	if _, err := (&types.Config{}).Check("p", fset, []*ast.File{f}, info); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range Check(fset, []*ast.File{f}, info) {
		got = append(got, x.Func)
	}
	want := "bad1 bad2 func literal"
	if strings.Join(got, " ") != want {
		t.Errorf("reported %q, want %q", strings.Join(got, " "), want)
	}
}
