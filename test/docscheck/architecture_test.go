package docscheck

import (
	"go/ast"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goNames is what the non-test Go code under cmd/ and internal/ declares:
// its file names, its methods by receiver type, and the top-level names of
// each package (by the package's directory name).
type goNames struct {
	files   map[string]bool            // base names: session.go
	methods map[string]map[string]bool // receiver type -> method names
	pkgs    map[string]map[string]bool // package dir -> top-level names and method names
}

func readGoNames(t *testing.T) goNames {
	t.Helper()
	n := goNames{files: map[string]bool{}, methods: map[string]map[string]bool{}, pkgs: map[string]map[string]bool{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	for _, cf := range codeFiles(t) {
		n.files[filepath.Base(cf.path)] = true
		f := cf.f
		pkg := filepath.Base(filepath.Dir(cf.path))
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(n.pkgs, pkg, d.Name.Name)
					continue
				}
				typ := d.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok { // generic: Pool[C]
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					add(n.methods, id.Name, d.Name.Name)
				}
				add(n.pkgs, pkg, d.Name.Name) // pool.Enqueue: the package's Pool.Enqueue
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(n.pkgs, pkg, s.Name.Name)
						if _, ok := n.methods[s.Name.Name]; !ok {
							n.methods[s.Name.Name] = map[string]bool{}
						}
						// Fields and interface methods count as
						// names of the type too.
						switch tt := s.Type.(type) {
						case *ast.StructType:
							for _, f := range tt.Fields.List {
								for _, fn := range f.Names {
									add(n.methods, s.Name.Name, fn.Name)
								}
							}
						case *ast.InterfaceType:
							for _, m := range tt.Methods.List {
								for _, mn := range m.Names {
									add(n.methods, s.Name.Name, mn.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, vn := range s.Names {
							add(n.pkgs, pkg, vn.Name)
						}
					}
				}
			}
		}
	}
	return n
}

var (
	docGoFile = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*\\.go)`")
	docDotted = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*)\\.([A-Za-z_][A-Za-z0-9_]*)(?:\\(\\))?`")
)

// TestArchitectureNamesExist: every Go file docs/architecture.md names
// (`session.go`) exists, and every `type.method` or `package.Name` it
// names, where the first part is one of the code's types or packages (a
// package's name may stand for its type: pool.Enqueue), exists too, so that the page's walk through the code does not go stale
// as the code moves.
func TestArchitectureNamesExist(t *testing.T) {
	n := readGoNames(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for i, line := range strings.Split(string(b), "\n") {
		for _, m := range docGoFile.FindAllStringSubmatch(line, -1) {
			checked++
			if !n.files[m[1]] {
				t.Errorf("docs/architecture.md:%d names %s, which no non-test Go file under cmd/ or internal/ is", i+1, m[1])
			}
		}
		for _, m := range docDotted.FindAllStringSubmatch(line, -1) {
			first, second := m[1], m[2]
			if second == "go" {
				continue // a file name
			}
			if names, ok := n.methods[first]; ok {
				checked++
				if !names[second] {
					t.Errorf("docs/architecture.md:%d names %s.%s: type %s has no method or field %s", i+1, first, second, first, second)
				}
				continue
			}
			if names, ok := n.pkgs[first]; ok {
				checked++
				if !names[second] {
					t.Errorf("docs/architecture.md:%d names %s.%s: package %s declares no %s", i+1, first, second, first, second)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d names checked in docs/architecture.md: the patterns no longer find its references", checked)
	}
}
