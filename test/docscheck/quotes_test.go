package docscheck

import (
	"testing"
)

// notPoolerds are quotes in the docs that are not poolerd's own messages
// and so are not in its code: keep this list short, and say whose each one
// is.
var notPoolerds = map[string]string{
	"the database system is starting up": "PostgreSQL's (57P03)",
	"too many clients":                   "PostgreSQL's 53300, shortened",
	"sorry, too many clients already":    "PostgreSQL's (53300)",
}

// composed are quotes made of poolerd's text and another library's: each
// is checked as the poolerd parts listed (each must be in the code); the
// rest is the other library's.
var composed = map[string][]string{
	// RELOAD's DETAIL: poolerd's "config FILE: " before viper's, the YAML
	// parser's or the OS's error.
	`config poolerd.yaml: '' has invalid keys: max_sise (unknown keys are errors: check the spelling against docs/configuration.md)`: {
		"config X: …", " (unknown keys are errors: check the spelling against docs/configuration.md)"},
	"config file X: While parsing config: yaml: …":   {"config file X: …"},
	"config X: '' has invalid keys: …":               {"config X: …"},
	"config file: open X: no such file or directory": {"config file: …"},
	"config X: auth_file: …":                         {"config X: …", "auth_file: …"},
}

// TestQuotedMessagesExistInCode: every error or log message the docs quote
// is a string poolerd's code can produce.
func TestQuotedMessagesExistInCode(t *testing.T) {
	var code [][]pattern
	for _, c := range codeStrings(t) {
		code = append(code, cuts(c))
	}
	n := 0
	for _, f := range docFiles(t) {
		for _, q := range quotes(t, f) {
			msg := message(q.text)
			if msg == "" || notPoolerds[msg] != "" {
				continue
			}
			n++
			if parts, ok := composed[msg]; ok {
				for _, part := range parts {
					if !inCode(code, part) {
						t.Errorf("%s:%d: %q, part of %q, is not a message in poolerd's code", q.file, q.line, part, q.text)
					}
				}
				continue
			}
			if !inCode(code, msg) {
				t.Errorf("%s:%d: %q (%s) is not a message in poolerd's code (cmd/, internal/): fix the doc or the code, or, if it is not poolerd's message, add it to notPoolerds", q.file, q.line, q.text, q.why)
			}
		}
	}
	if n < 100 {
		t.Errorf("only %d quotes checked: the extraction rules have stopped finding the docs' messages", n)
	}
	t.Logf("%d quotes checked", n)
}

// inCode reports whether msg is one of code's strings, or the beginning of
// one that ends at a natural break (see cuts). Some text must fit both, and
// the fit must rest on literal text, not on the code's verbs swallowing the
// quote: either 2/3 of msg's literal text lines up with the code's, or all
// of a code string's literal text, at least 20 characters, lines up with
// msg (an example of a format string whose verbs hold long values, such as
// a Go error), and the quote starts with a value where the string starts
// with a verb.
func inCode(code [][]pattern, msg string) bool {
	_, ok := bestMatch(code, msg)
	return ok
}

func bestMatch(code [][]pattern, msg string) (pattern, bool) {
	p := fromDoc(msg)
	need := (2*literals(p) + 2) / 3
	var best pattern
	bestN := -1
	for _, cs := range code {
		for _, c := range cs {
			n := align(c, p)
			if n < 0 {
				continue
			}
			// A code string that starts with a verb only vouches for a
			// quote that starts with a value too.
			anchored := !isWild(c[0]) || isWild(p[0])
			if lc := literals(c); n == lc && lc >= 20 && anchored {
				return c, true
			}
			if n > bestN {
				best, bestN = c, n
			}
		}
	}
	return best, bestN >= need
}
