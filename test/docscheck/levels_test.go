package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poolerd/poolerd/test/mdtable"
)

// logCalls returns, for each message poolerd logs with a fixed level
// (log.Info("msg", …), Warn, Error, Debug), the levels it is logged at.
func logCalls(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	fset := token.NewFileSet()
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				level := strings.ToLower(sel.Sel.Name)
				switch level {
				case "debug", "info", "warn", "error":
				default:
					return true
				}
				if msg, ok := stringLit(call.Args[0]); ok {
					if out[msg] == nil {
						out[msg] = map[string]bool{}
					}
					out[msg][level] = true
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestLoggedLevels: in the tables of log events (| message | level | …),
// a message logged at one fixed level is documented at that level (a
// level cell may name several, "info / warn", and qualify them).
func TestLoggedLevels(t *testing.T) {
	calls := logCalls(t)
	checked := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, f)
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i++ {
			h := mdtable.Cells(strings.TrimSpace(lines[i]))
			if len(h) < 2 || h[0] != "message" || h[1] != "level" {
				continue
			}
			for i += 2; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
				row := mdtable.Cells(strings.TrimSpace(lines[i]))
				if len(row) < 2 {
					continue
				}
				for _, m := range spanRE.FindAllStringSubmatch(row[0], -1) {
					levels, ok := calls[m[1]]
					if !ok {
						continue // a pattern (`shutting down: …`) or a dynamic level
					}
					checked++
					for lv := range levels {
						if !strings.Contains(row[1], lv) {
							t.Errorf("%s:%d: `%s` is documented at %q; poolerd logs it at %s", name, i+1, m[1], row[1], lv)
						}
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d logged messages checked", checked)
	}
	t.Logf("%d logged messages checked", checked)
}
