package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shellValue is what the banner of scripts/run.sh fills in: $VAR, ${VAR}
// or $(command), which may hold nested parentheses one level deep.
var shellValue = regexp.MustCompile(`\$\{[A-Za-z_]+\}|\$[A-Za-z_]+|\$\((?:[^()]|\([^()]*\))*\)`)

var shellDefault = regexp.MustCompile(`(?m)^([A-Z_]+)=\$\{[A-Z_]+:-([^}]*)\}$`)

// runBanner returns the lines scripts/run.sh prints once poolerd is up:
// the here-document after `cat <<EOF`, as patterns.
func runBanner(t *testing.T) []pattern {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "scripts", "run.sh"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\ncat <<EOF\n")
	if !ok {
		t.Fatal("scripts/run.sh has no `cat <<EOF` banner any more: update this test")
	}
	body, _, ok := strings.Cut(rest, "\nEOF\n")
	if !ok {
		t.Fatal("scripts/run.sh: the banner's here-document does not end")
	}
	// Variables with a default (PG_PORT=${RUN_PG_PORT:-15432}) print it
	// when the environment does not set them, as the README assumes.
	defaults := map[string]string{}
	for _, m := range shellDefault.FindAllStringSubmatch(string(b), -1) {
		defaults[m[1]] = m[2]
	}
	var out []pattern
	for _, ln := range strings.Split(body, "\n") {
		var p pattern
		for ln != "" {
			loc := shellValue.FindStringIndex(ln)
			if loc == nil {
				p = append(p, []rune(ln)...)
				break
			}
			p = append(p, []rune(ln[:loc[0]])...)
			name := strings.Trim(ln[loc[0]:loc[1]], "${}")
			if d, ok := defaults[name]; ok {
				p = append(p, []rune(d)...)
			} else {
				p = p.addWild()
			}
			ln = ln[loc[1]:]
		}
		out = append(out, p)
	}
	return out
}

// readmeRunOutput returns the code block the README shows as what
// `make run` prints: the first one after "and prints".
func readmeRunOutput(t *testing.T) ([]string, int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i := range lines {
		if !strings.Contains(lines[i], "make run") {
			continue
		}
		for j := i; j < len(lines) && j < i+12; j++ {
			if !strings.Contains(lines[j], "prints") {
				continue
			}
			for k := j + 1; k < len(lines); k++ {
				if strings.HasPrefix(lines[k], "```") {
					for e := k + 1; e < len(lines); e++ {
						if strings.HasPrefix(lines[e], "```") {
							return lines[k+1 : e], k + 2
						}
					}
				}
			}
		}
	}
	t.Fatal("README.md: no code block after a sentence saying what `make run` prints")
	return nil, 0
}

// TestReadmeMakeRunOutput: the README's `make run` output is the banner of
// scripts/run.sh, line for line, with example values where the script fills
// them in.
func TestReadmeMakeRunOutput(t *testing.T) {
	banner := runBanner(t)
	// The here-document starts and ends with an empty line; the README's
	// block leaves them out.
	for len(banner) > 0 && len(banner[0]) == 0 {
		banner = banner[1:]
	}
	for len(banner) > 0 && len(banner[len(banner)-1]) == 0 {
		banner = banner[:len(banner)-1]
	}
	readme, first := readmeRunOutput(t)
	if len(readme) != len(banner) {
		t.Errorf("README.md:%d shows %d lines of `make run` output, scripts/run.sh prints %d:\n%s", first, len(readme), len(banner), patterns(banner))
	}
	for i := 0; i < len(readme) && i < len(banner); i++ {
		doc := readme[i]
		if !matches(banner[i], readmePattern(doc)) || align(banner[i], readmePattern(doc)) < literals(banner[i]) {
			t.Errorf("README.md:%d: %q is not what scripts/run.sh prints there: %q", first+i, doc, banner[i].String())
		}
	}
}

// readmePattern reads a README line literally, except an ellipsis.
func readmePattern(s string) pattern {
	var p pattern
	for _, part := range strings.Split(s, "…") {
		if len(p) > 0 {
			p = p.addWild()
		}
		p = append(p, []rune(part)...)
	}
	return p
}

func patterns(ps []pattern) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("  " + p.String() + "\n")
	}
	return b.String()
}

// TestReadmeLayoutListsEveryPackage: the README's layout block names every
// package directory under cmd/, internal/ and test/ (with its job), and
// none that is gone.
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no ## Layout section any more: update this test")
	}
	_, block, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("README.md's layout has no code block")
	}
	block, _, _ = strings.Cut(block, "```")
	listed := map[string]bool{}
	for _, ln := range strings.Split(block, "\n") {
		if f := strings.Fields(ln); len(f) > 1 && strings.HasSuffix(f[0], "/") && strings.Count(f[0], "/") == 2 {
			listed[strings.TrimSuffix(f[0], "/")] = true
		}
	}
	for _, top := range []string{"cmd", "internal", "test"} {
		entries, err := os.ReadDir(filepath.Join(root, top))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() || e.Name() == "testdata" {
				continue
			}
			dir := top + "/" + e.Name()
			if !listed[dir] {
				t.Errorf("README.md's layout does not list %s/ (add a line saying what it is for)", dir)
			}
			delete(listed, dir)
		}
	}
	for dir := range listed {
		t.Errorf("README.md's layout lists %s/, which does not exist", dir)
	}
}
