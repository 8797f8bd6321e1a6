// Package typednil finds the typed-nil interface bug in Weft's own code:
// a function whose result is an interface (fabric.Endpoint, net.Conn,
// error) that returns a concrete pointer straight through, as in
//
//	func (driver) Open(...) (fabric.Endpoint, error) { return DialShm(...) }
//
// where DialShm returns (*Endpoint, error). On failure the caller gets a
// nil *Endpoint inside a non-nil fabric.Endpoint, and its Close panics.
// Check reports every such return; TestModule runs it over the module,
// so the pattern cannot come back.
//
// Two shapes are reported, for each result of interface type whose value
// has a nilable concrete type (pointer, map, slice, channel, function):
//
//   - return f(...), where f's results fill the function's results;
//   - return x, err, where x is a variable and the error is not the
//     literal nil (the common "ep, err := f(); return ep, err").
//
// A return whose value is a composite literal's address, or that returns
// the literal nil beside the value, cannot carry a typed nil and is not
// reported.
package typednil

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
)

// Finding is one return that can put a typed nil in an interface.
type Finding struct {
	Pos  token.Position
	Func string // the enclosing function
	Msg  string
}

func (f Finding) String() string { return fmt.Sprintf("%s: %s: %s", f.Pos, f.Func, f.Msg) }

// Check reports the typed-nil returns in the files of one type-checked
// package.
func Check(fset *token.FileSet, files []*ast.File, info *types.Info) []Finding {
	var out []Finding
	for _, f := range files {
		var stack []funcCtx
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			switch n := n.(type) {
			case *ast.FuncDecl:
				stack = append(stack, funcCtx{n.Name.Name, n.Type})
			case *ast.FuncLit:
				stack = append(stack, funcCtx{"func literal", n.Type})
			case *ast.ReturnStmt:
				if len(stack) > 0 {
					out = append(out, checkReturn(fset, info, stack[len(stack)-1], n)...)
				}
				stack = append(stack, stack[len(stack)-1])
			default:
				stack = append(stack, topOr(stack))
			}
			return true
		})
	}
	return out
}

type funcCtx struct {
	name string
	typ  *ast.FuncType
}

func topOr(s []funcCtx) funcCtx {
	if len(s) == 0 {
		return funcCtx{}
	}
	return s[len(s)-1]
}

// results returns the declared result types of fn.
func results(info *types.Info, fn *ast.FuncType) []types.Type {
	if fn == nil || fn.Results == nil {
		return nil
	}
	var ts []types.Type
	for _, f := range fn.Results.List {
		t := info.TypeOf(f.Type)
		k := max(len(f.Names), 1)
		for range k {
			ts = append(ts, t)
		}
	}
	return ts
}

func checkReturn(fset *token.FileSet, info *types.Info, fc funcCtx, r *ast.ReturnStmt) []Finding {
	want := results(info, fc.typ)
	if len(want) == 0 || len(r.Results) == 0 {
		return nil
	}
	var out []Finding
	report := func(i int, got types.Type, how string) {
		out = append(out, Finding{
			Pos:  fset.Position(r.Pos()),
			Func: fc.name,
			Msg:  fmt.Sprintf("result %d: %s returns a %s as %s; a nil one makes a non-nil interface", i, how, got, want[i]),
		})
	}
	if len(r.Results) == 1 && len(want) > 1 {
		// return f(...): f's results fill ours.
		tup, ok := info.TypeOf(r.Results[0]).(*types.Tuple)
		if !ok || tup.Len() != len(want) {
			return nil
		}
		for i := range want {
			if isInterface(want[i]) && nilable(tup.At(i).Type()) {
				report(i, tup.At(i).Type(), "the call")
			}
		}
		return out
	}
	if len(r.Results) != len(want) {
		return nil
	}
	// return x, err with err not the literal nil.
	last := r.Results[len(r.Results)-1]
	if isNilIdent(info, last) {
		return nil
	}
	for i, e := range r.Results[:len(r.Results)-1] {
		id, ok := ast.Unparen(e).(*ast.Ident)
		if !ok || !isInterface(want[i]) {
			continue
		}
		if _, isVar := info.Uses[id].(*types.Var); !isVar {
			continue
		}
		if t := info.TypeOf(id); nilable(t) {
			report(i, t, "variable "+id.Name)
		}
	}
	return out
}

func isNilIdent(info *types.Info, e ast.Expr) bool {
	id, ok := ast.Unparen(e).(*ast.Ident)
	if !ok {
		return false
	}
	_, isNil := info.Uses[id].(*types.Nil)
	return isNil
}

func isInterface(t types.Type) bool {
	return t != nil && types.IsInterface(t) && !isTypeParam(t)
}

func isTypeParam(t types.Type) bool {
	_, ok := types.Unalias(t).(*types.TypeParam)
	return ok
}

// nilable reports whether t is a concrete type with a nil value.
func nilable(t types.Type) bool {
	if t == nil || isTypeParam(t) {
		return false
	}
	switch t.Underlying().(type) {
	case *types.Pointer, *types.Map, *types.Slice, *types.Chan, *types.Signature:
		return true
	}
	return false
}
