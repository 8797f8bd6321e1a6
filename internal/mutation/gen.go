package mutation

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"hash/fnv"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The generator: where List holds breaks written by hand, Generate makes
// one mutant from every check, bound and counter in a package's source, in
// the style of the bugs a refactor or a hasty fix introduces:
//
//   - bound: a comparison's boundary moves (< to <=, >= to >, ...);
//   - negate: == becomes != and back (comparisons with nil are left to
//     drop-check, which covers the guards they appear in);
//   - drop-check: an if whose body leaves (return, panic, continue,
//     break, goto) never fires: its condition C becomes false && (C);
//   - drop-term: one side of && or || is dropped, so a combined check
//     loses one of its parts;
//   - off-by-one: x+1 and x-1 become x;
//   - drop-count: a counter's .Add(n) statement is removed.
//
// A mutant's ID (file, function, operator, the text it replaces and its
// index among equal ones in that function) survives edits elsewhere in
// the file, so the list of accepted survivors stays valid as lines move.

// Mutant is one generated change to one file.
type Mutant struct {
	// ID names the mutant: file:func:op:text#k.
	ID string
	// Pkg is the package, as go test takes it ("./roce/wire/").
	Pkg string
	// File is the file, relative to the module root.
	File string
	// Func is the enclosing function ("(*QP).post", "parse").
	Func string
	// Line is the line of the change.
	Line int
	// Entry is the line of the function's first statement: a test that
	// covers it calls the function, and only such a test can catch the
	// mutant. (The line of a condition is not enough: cover counts an
	// if's or a for's condition in the block after it, so a test that
	// takes the other branch would not be chosen.)
	Entry int
	// Op is the operator: bound, negate, drop-check, drop-term,
	// off-by-one or drop-count.
	Op string
	// Off and End delimit the bytes that New replaces.
	Off, End int
	// Old is the text replaced; New replaces it.
	Old, New string
}

// Apply returns src with the mutant applied.
func (m Mutant) Apply(src []byte) []byte {
	out := make([]byte, 0, len(src)+len(m.New))
	out = append(out, src[:m.Off]...)
	out = append(out, m.New...)
	return append(out, src[m.End:]...)
}

// Sampled reports whether the mutant is in the 1-in-k sample: a fixed
// subset chosen by its ID's hash, so a sample is the same on every run of
// the same code.
func (m Mutant) Sampled(k int) bool {
	if k <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(m.ID))
	return h.Sum32()%uint32(k) == 0
}

// Generate returns the mutants of the package in dir (relative to root):
// every non-test Go file except cgo files and the String, Error and
// GoString methods, whose text no rule depends on.
func Generate(root, dir string) ([]Mutant, error) {
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Mutant
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, f)
		ms, err := generateFile(rel, src)
		if err != nil {
			return nil, err
		}
		for i := range ms {
			ms[i].Pkg = "./" + filepath.ToSlash(filepath.Clean(dir)) + "/"
		}
		out = append(out, ms...)
	}
	return out, nil
}

func generateFile(rel string, src []byte) ([]Mutant, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	for _, im := range f.Imports {
		if im.Path.Value == `"C"` {
			return nil, nil
		}
	}
	var out []Mutant
	seen := map[string]int{}
	off := func(p token.Pos) int { return fset.Position(p).Offset }
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		switch fn.Name.Name {
		case "String", "Error", "GoString", "Format":
			continue
		}
		name := funcName(fn)
		entry := fset.Position(fn.Body.Lbrace).Line
		if len(fn.Body.List) > 0 {
			entry = fset.Position(fn.Body.List[0].Pos()).Line
		}
		add := func(op string, from, to token.Pos, repl string) {
			o, e := off(from), off(to)
			old := string(src[o:e])
			key := name + ":" + op + ":" + oneLine(old)
			k := seen[key]
			seen[key]++
			out = append(out, Mutant{
				ID:   fmt.Sprintf("%s:%s#%d", rel, key, k),
				File: rel, Func: name, Line: fset.Position(from).Line, Entry: entry,
				Op: op, Off: o, End: e, Old: old, New: repl,
			})
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				binary(n, src, off, add)
			case *ast.IfStmt:
				if leaves(n.Body) {
					c := string(src[off(n.Cond.Pos()):off(n.Cond.End())])
					add("drop-check", n.Cond.Pos(), n.Cond.End(), "false && ("+c+")")
				}
			case *ast.ExprStmt:
				if c, ok := n.X.(*ast.CallExpr); ok {
					if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "Add" && len(c.Args) == 1 {
						if _, ok := s.X.(*ast.SelectorExpr); ok && !isWaitGroup(s.X) {
							add("drop-count", n.Pos(), n.End(), "_ = 0")
						}
					}
				}
			}
			return true
		})
	}
	return out, nil
}

// binary adds the mutants of one binary expression.
func binary(n *ast.BinaryExpr, src []byte, off func(token.Pos) int, add func(op string, from, to token.Pos, repl string)) {
	text := func(e ast.Expr) string { return string(src[off(e.Pos()):off(e.End())]) }
	flip := map[token.Token]string{
		token.LSS: "<=", token.LEQ: "<", token.GTR: ">=", token.GEQ: ">",
	}
	switch n.Op {
	case token.LSS, token.LEQ, token.GTR, token.GEQ:
		if isConst(n.X) && isConst(n.Y) {
			return
		}
		add("bound", n.OpPos, n.OpPos+token.Pos(len(n.Op.String())), flip[n.Op])
	case token.EQL, token.NEQ:
		if isNil(n.X) || isNil(n.Y) || (isConst(n.X) && isConst(n.Y)) {
			return
		}
		neg := "!="
		if n.Op == token.NEQ {
			neg = "=="
		}
		add("negate", n.OpPos, n.OpPos+2, neg)
	case token.LAND:
		// The dropped side stays in the text, so its names stay used.
		add("drop-term", n.Pos(), n.End(), "((true || ("+text(n.X)+")) && ("+text(n.Y)+"))")
		add("drop-term", n.Pos(), n.End(), "(("+text(n.X)+") && (true || ("+text(n.Y)+")))")
	case token.LOR:
		add("drop-term", n.Pos(), n.End(), "((false && ("+text(n.X)+")) || ("+text(n.Y)+"))")
		add("drop-term", n.Pos(), n.End(), "(("+text(n.X)+") || (false && ("+text(n.Y)+")))")
	case token.ADD, token.SUB:
		if l, ok := n.Y.(*ast.BasicLit); ok && l.Value == "1" && !isConst(n.X) {
			add("off-by-one", n.Pos(), n.End(), "("+text(n.X)+")")
		}
	}
}

// leaves reports whether a block ends by leaving: the checks whose
// removal lets bad input through.
func leaves(b *ast.BlockStmt) bool {
	if len(b.List) == 0 {
		return false
	}
	switch s := b.List[len(b.List)-1].(type) {
	case *ast.ReturnStmt:
		return true
	case *ast.BranchStmt:
		return s.Tok != token.FALLTHROUGH
	case *ast.ExprStmt:
		if c, ok := s.X.(*ast.CallExpr); ok {
			if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "panic" {
				return true
			}
		}
	}
	return false
}

func isNil(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "nil"
}

// isConst reports whether e is a literal. The generator has no types, so
// named constants are not recognised: a comparison of two of them is
// mutated too.
func isConst(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return true
	case *ast.ParenExpr:
		return isConst(e.X)
	}
	return false
}

func isWaitGroup(e ast.Expr) bool {
	s, ok := e.(*ast.SelectorExpr)
	return ok && (s.Sel.Name == "wg" || strings.HasSuffix(strings.ToLower(s.Sel.Name), "wg"))
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	star := ""
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = "*", s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	id, _ := t.(*ast.Ident)
	if id == nil {
		return fn.Name.Name
	}
	return "(" + star + id.Name + ")." + fn.Name.Name
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return s
}
