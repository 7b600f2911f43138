// Package pgbini reads PgBouncer's pgbouncer.ini as a poolerd configuration
// source: it parses the file (with its %include files), translates the
// [databases], [users] and [pgbouncer] sections into the tree of keys a
// poolerd YAML file holds, and names every setting poolerd does not honour
// with what to do instead. It applies nothing itself: internal/config loads
// the tree like a YAML file and validates it.
package pgbini

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// maxIncludeDepth bounds %include nesting (PgBouncer's own limit is 10).
const maxIncludeDepth = 10

// entry is one "key = value" line of a pgbouncer.ini.
type entry struct {
	section string // lower case
	key     string // lower case in [pgbouncer]; as written (unquoted) in [databases] and [users]
	value   string
	file    string
	line    int
}

// where is the entry's position, for messages: "pgbouncer.ini:12".
func (e entry) where() string {
	if e.line == 0 {
		return filepath.Base(e.file)
	}
	return fmt.Sprintf("%s:%d", filepath.Base(e.file), e.line)
}

// Detect reports whether data looks like a pgbouncer.ini rather than YAML:
// its first line that is neither blank nor a comment opens a section
// ("[databases]") or is a %include. A YAML file cannot start that way (a
// "[" starts a flow sequence, which poolerd's configuration never is).
func Detect(data []byte) bool {
	for _, raw := range bytes.Split(data, []byte("\n")) {
		line := strings.TrimSpace(string(raw))
		if line == "" || line[0] == ';' || line[0] == '#' {
			continue
		}
		if strings.HasPrefix(line, "%include") {
			return true
		}
		if !strings.HasPrefix(line, "[") || !strings.HasSuffix(line, "]") {
			return false
		}
		name := strings.ToLower(strings.TrimSpace(line[1 : len(line)-1]))
		return name != "" && !strings.ContainsAny(name, ",:{}\"'")
	}
	return false
}

// parseFile reads path and the files it includes, in order. A %include
// path that is relative is taken from the directory of the file naming it.
func parseFile(path string, data []byte, depth int, section string, out *[]entry) (string, error) {
	if depth > maxIncludeDepth {
		return section, fmt.Errorf("%s: %%include nested more than %d deep", path, maxIncludeDepth)
	}
	for i, raw := range strings.Split(string(data), "\n") {
		n := i + 1
		line := strings.TrimSpace(strings.TrimSuffix(raw, "\r"))
		if line == "" || line[0] == ';' || line[0] == '#' {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "%include"); ok {
			inc := strings.TrimSpace(rest)
			if inc == "" {
				return section, fmt.Errorf("%s:%d: %%include without a file name", path, n)
			}
			if !filepath.IsAbs(inc) {
				inc = filepath.Join(filepath.Dir(path), inc)
			}
			b, err := os.ReadFile(inc)
			if err != nil {
				return section, fmt.Errorf("%s:%d: %%include: %w", path, n, err)
			}
			// An included file continues the section it was included in.
			if section, err = parseFile(inc, b, depth+1, section, out); err != nil {
				return section, err
			}
			continue
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") {
				return section, fmt.Errorf("%s:%d: section header without ]", path, n)
			}
			section = strings.ToLower(strings.TrimSpace(line[1 : len(line)-1]))
			continue
		}
		key, value, err := splitKey(line)
		if err != nil {
			return section, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if section == "" {
			return section, fmt.Errorf("%s:%d: %q is outside any section: put it under [pgbouncer], [databases] or [users]", path, n, key)
		}
		if section == "pgbouncer" {
			key = strings.ToLower(key)
		}
		*out = append(*out, entry{section: section, key: key, value: value, file: path, line: n})
	}
	return section, nil
}

// splitKey splits "key = value". A key may be double-quoted, with "" for a
// quote inside it (how PgBouncer writes database names with other
// characters than letters, digits and _).
func splitKey(line string) (key, value string, err error) {
	rest := line
	if strings.HasPrefix(line, `"`) {
		var b strings.Builder
		i := 1
		for ; i < len(line); i++ {
			if line[i] == '"' {
				if i+1 < len(line) && line[i+1] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			b.WriteByte(line[i])
		}
		if i >= len(line) {
			return "", "", fmt.Errorf("unterminated quoted name")
		}
		key, rest = b.String(), strings.TrimSpace(line[i+1:])
		if !strings.HasPrefix(rest, "=") {
			return "", "", fmt.Errorf("expected = after the name %q", key)
		}
		return key, strings.TrimSpace(rest[1:]), nil
	}
	k, v, ok := strings.Cut(rest, "=")
	if !ok {
		return "", "", fmt.Errorf("expected key = value, found %q", line)
	}
	key = strings.TrimSpace(k)
	if key == "" {
		return "", "", fmt.Errorf("a line starts with =")
	}
	return key, strings.TrimSpace(v), nil
}

// param is one key=value of a [databases] or [users] connection string.
type param struct{ key, value string }

// parseConnString parses libpq-style "key=value key='quoted value'" pairs,
// as PgBouncer's [databases] and [users] entries hold them. In a quoted
// value, \' and ” stand for a quote and \\ for a backslash.
func parseConnString(s string) ([]param, error) {
	var out []param
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i >= len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := strings.ToLower(s[start:i])
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i >= len(s) || s[i] != '=' {
			return nil, fmt.Errorf("%q has no =value", key)
		}
		i++
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		var v strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				switch {
				case c == '\\' && i+1 < len(s):
					v.WriteByte(s[i+1])
					i += 2
					continue
				case c == '\'' && i+1 < len(s) && s[i+1] == '\'':
					v.WriteByte('\'')
					i += 2
					continue
				case c == '\'':
					closed = true
				}
				if closed {
					i++
					break
				}
				v.WriteByte(c)
				i++
			}
			if !closed {
				return nil, fmt.Errorf("the value of %s has no closing quote", key)
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' {
				v.WriteByte(s[i])
				i++
			}
		}
		out = append(out, param{key: key, value: v.String()})
	}
}
