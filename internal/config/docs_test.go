package config

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/mdtable"
)

// TestReferenceListsEveryKey keeps docs/configuration.md true: every key,
// its environment variable and its flag appear in the reference.
func TestReferenceListsEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	for _, k := range Keys() {
		for _, s := range []string{"`" + k.Name + "`", "`" + k.Env() + "`"} {
			if !strings.Contains(text, s) {
				t.Errorf("docs/configuration.md does not mention %s", s)
			}
		}
		if k.Flag != "" && !strings.Contains(text, "`--"+k.Flag+"`") {
			t.Errorf("docs/configuration.md does not mention --%s", k.Flag)
		}
	}
}

// docTable returns the rows of the first markdown table in doc whose
// header starts with the given cells, as cells.
func docTable(t *testing.T, doc, name string, header ...string) [][]string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	for i := 0; i+1 < len(lines); i++ {
		h := mdtable.Cells(lines[i])
		if len(h) < len(header) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "|-") {
			continue
		}
		match := true
		for j, want := range header {
			if h[j] != want {
				match = false
			}
		}
		if !match {
			continue
		}
		var rows [][]string
		for k := i + 2; k < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[k]), "|"); k++ {
			rows = append(rows, mdtable.Cells(lines[k]))
		}
		return rows
	}
	t.Fatalf("%s: no table with the header %q", name, header)
	return nil
}

var codeSpan = regexp.MustCompile("`([^`]*)`")

// docDefault reads a documented default: the first code span (`30s`), or
// a word for the empty value ("empty", "off", nothing at all).
func docDefault(cell string) (string, bool) {
	if m := codeSpan.FindStringSubmatch(cell); m != nil {
		return m[1], true
	}
	switch w := strings.TrimSpace(strings.Trim(cell, "*")); w {
	case "", "empty", "off":
		return "", true
	}
	return "", false
}

// sameDefault reports whether doc, a documented default, is v, the code's.
func sameDefault(doc string, v any) bool {
	switch v := v.(type) {
	case time.Duration:
		if doc == "" || doc == "0" {
			return v == 0
		}
		d, err := time.ParseDuration(doc)
		return err == nil && d == v
	case int:
		if doc == "" {
			return false
		}
		n, err := strconv.Atoi(doc)
		return err == nil && n == v
	case bool:
		b, err := strconv.ParseBool(doc)
		return err == nil && b == v
	case []string:
		return doc == strings.Join(v, ",")
	case string:
		return doc == v
	case float64:
		f, err := strconv.ParseFloat(doc, 64)
		return err == nil && f == v
	}
	return false
}

// TestReferenceDefaults keeps the table of top-level keys in
// docs/configuration.md true: one row per key, with its flag, environment
// variable and default as the code has them, and no row for a key that
// does not exist.
func TestReferenceDefaults(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := docTable(t, string(doc), "docs/configuration.md", "key", "flag", "environment variable", "default")
	def := Defaults()
	byName := map[string]Key{}
	for _, k := range Keys() {
		byName[k.Name] = k
	}
	seen := map[string]bool{}
	for _, r := range rows {
		m := codeSpan.FindStringSubmatch(r[0])
		if m == nil || len(r) < 4 {
			t.Errorf("docs/configuration.md: a key row without a key: %q", r)
			continue
		}
		name := m[1]
		k, ok := byName[name]
		if !ok {
			t.Errorf("docs/configuration.md documents `%s`, which is not a key (internal/config.Keys)", name)
			continue
		}
		seen[name] = true
		flag := ""
		if k.Flag != "" {
			flag = "`--" + k.Flag + "`"
		}
		if r[1] != flag {
			t.Errorf("docs/configuration.md: `%s` has the flag %q, the code %q", name, r[1], flag)
		}
		if r[2] != "`"+k.Env()+"`" {
			t.Errorf("docs/configuration.md: `%s` has the environment variable %q, the code `%s`", name, r[2], k.Env())
		}
		d, ok := docDefault(r[3])
		if v := defaultValue(&def, name); !ok || !sameDefault(d, v) {
			t.Errorf("docs/configuration.md: `%s` defaults to %q, the code to %q", name, r[3], FormatValue(&def, name))
		}
	}
	for _, k := range Keys() {
		if !seen[k.Name] {
			t.Errorf("docs/configuration.md: no row for `%s` in the table of top-level keys", k.Name)
		}
	}
}

// TestReadmeSummary keeps the README's configuration summary true: every
// key it names exists, with the default the code has.
func TestReadmeSummary(t *testing.T) {
	doc, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := docTable(t, string(doc), "README.md", "key", "default")
	def := Defaults()
	byName := map[string]bool{}
	for _, k := range Keys() {
		byName[k.Name] = true
	}
	// The lists, which have no default and no scalar value.
	lists := map[string]bool{"databases": true, "users": true, "rate_limits": true, "auth_hba_rules": true}
	checked := 0
	for _, r := range rows {
		var keys []string
		for _, m := range codeSpan.FindAllStringSubmatch(r[0], -1) {
			switch {
			case byName[m[1]]:
				keys = append(keys, m[1])
			case lists[m[1]]:
			default:
				t.Errorf("README.md: the configuration summary names `%s`, which is not a key", m[1])
			}
		}
		if len(keys) == 0 || len(r) < 2 {
			continue
		}
		// One default per key ("`60s`, `15s`, `30s`", "`20` / `0`"), or
		// one for all of them ("off", "`0` (no limit)").
		parts := splitDefaults(r[1])
		if len(parts) != len(keys) && len(parts) != 1 {
			t.Errorf("README.md: %d keys (%s) but %d defaults (%s)", len(keys), r[0], len(parts), r[1])
			continue
		}
		for i, name := range keys {
			p := parts[0]
			if len(parts) > 1 {
				p = parts[i]
			}
			d, ok := docDefault(p)
			if v := defaultValue(&def, name); !ok || !sameDefault(d, v) {
				t.Errorf("README.md: `%s` defaults to %q, the code to %q", name, p, FormatValue(&def, name))
			}
			checked++
		}
	}
	if checked < 30 {
		t.Errorf("only %d defaults checked in the README's summary: has its table changed shape?", checked)
	}
}

// splitDefaults splits "`memory`, empty, `50ms`, `allow`" or "`20` / `0`"
// outside code spans.
func splitDefaults(cell string) []string {
	var out []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(cell); i++ {
		c := cell[i]
		if c == '`' {
			inCode = !inCode
		}
		if !inCode && (c == ',' || c == '/') {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	return append(out, strings.TrimSpace(cur.String()))
}
