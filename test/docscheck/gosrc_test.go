package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, from this package's directory.
const root = "../.."

// codeFile is one parsed non-test Go file of poolerd.
type codeFile struct {
	path string // as walked from this directory: ../../internal/proxy/session.go
	f    *ast.File
}

// codeFiles parses every non-test Go file under cmd/ and internal/.
func codeFiles(t *testing.T) []codeFile {
	t.Helper()
	fset := token.NewFileSet()
	var out []codeFile
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			out = append(out, codeFile{path, f})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// codeStrings returns every string poolerd's non-test code can print, as
// patterns: each string literal, and each concatenation of literals with
// other expressions (those become wildcards), from the Go files under cmd/
// and internal/ (tests excluded).
func codeStrings(t *testing.T) []pattern {
	t.Helper()
	var out []pattern
	seen := map[string]bool{}
	add := func(p pattern) {
		if letters(p) < 4 {
			// "%s", "%s: %w" and the like match any text: they say
			// nothing about where a documented message comes from.
			return
		}
		if k := p.String(); !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	var files []*ast.File
	for _, cf := range codeFiles(t) {
		files = append(files, cf.f)
	}
	// String constants, by name, so that pre + name + post is read with
	// the constants' text; a name declared twice with different values
	// stays a wildcard.
	consts := map[string]*string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if d, ok := n.(*ast.GenDecl); ok && d.Tok == token.CONST {
				for _, spec := range d.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i >= len(vs.Values) {
							continue
						}
						if s, ok := stringLit(vs.Values[i]); ok {
							if prev, dup := consts[name.Name]; dup && (prev == nil || *prev != s) {
								consts[name.Name] = nil
							} else {
								consts[name.Name] = &s
							}
						}
					}
				}
			}
			return true
		})
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if s, ok := stringLit(n); ok {
					add(fromCode(s))
				}
			case *ast.BinaryExpr:
				if n.Op == token.ADD {
					if p, ok := concat(n, consts); ok {
						add(p)
					}
				}
			}
			return true
		})
	}
	if len(out) < 500 {
		t.Fatalf("only %d strings found in the Go sources: is %s the repository root?", len(out), root)
	}
	return out
}

// letters counts the letters of p's literal text.
func letters(p pattern) int {
	n := 0
	for _, r := range p {
		if unicode.IsLetter(r) {
			n++
		}
	}
	return n
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// concat folds a + b + … into one pattern when at least one operand is a
// string literal; the other operands are wildcards.
func concat(e *ast.BinaryExpr, consts map[string]*string) (pattern, bool) {
	var p pattern
	lits := 0
	var walk func(e ast.Expr)
	walk = func(e ast.Expr) {
		if b, ok := e.(*ast.BinaryExpr); ok && b.Op == token.ADD {
			walk(b.X)
			walk(b.Y)
			return
		}
		if s, ok := stringLit(e); ok {
			lits++
			p = append(p, fromCode(s)...)
			return
		}
		if id, ok := e.(*ast.Ident); ok && consts[id.Name] != nil {
			lits++
			p = append(p, fromCode(*consts[id.Name])...)
			return
		}
		p = p.addWild()
	}
	walk(e)
	// Collapse wildcards that became adjacent.
	var q pattern
	for _, r := range p {
		if isWild(r) {
			q = q.addWild()
		} else {
			q = append(q, r)
		}
	}
	return q, lits > 0
}
