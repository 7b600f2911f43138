package docscheck

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A pattern is text in which some stretches stand for "anything": a format
// verb in a Go string, a placeholder (X, N, …) in a documented quote. Two
// patterns match when some text fits both.
type pattern []rune

// Wildcards: wild stands for any text, empty included (a format verb, or
// an ellipsis in a quote); value for one value a quote gives as an example
// or a placeholder (30s, "app", X): a format verb, or text without a space.
const (
	wild  rune = -1
	value rune = -2
)

func isWild(r rune) bool { return r < 0 }

// fmtVerb is a fmt verb with its flags, width and precision.
var fmtVerb = regexp.MustCompile(`%[-+# 0]*(\*|[0-9]+)?(\.(\*|[0-9]+))?[a-zA-Z]`)

// fromCode turns a Go string (a format string or a literal) into a pattern:
// every verb is a wildcard, %% a percent sign.
func fromCode(s string) pattern {
	var p pattern
	for len(s) > 0 {
		if strings.HasPrefix(s, "%%") {
			p = append(p, '%')
			s = s[2:]
			continue
		}
		if loc := fmtVerb.FindStringIndex(s); loc != nil && loc[0] == 0 {
			p = p.addWild()
			s = s[loc[1]:]
			continue
		}
		r, n := utf8.DecodeRuneInString(s)
		p = append(p, r)
		s = s[n:]
	}
	return p
}

// placeholders the docs write for a value: whole words only.
var placeholders = map[string]bool{
	"X": true, "N": true, "D": true, "NAME": true, "KEY": true, "DB": true, "USER": true,
	"STATE": true, "BUCKET": true, "VERSION": true, "FILE": true,
}

// docPlaceholder matches what a documented quote writes for "some value":
// an ellipsis, <something>, [optional part], an upper-case placeholder
// word, or an example value: a quoted name, a number, duration or address
// (what a format verb prints).
var docPlaceholder = regexp.MustCompile(`…|\.\.\.|<[^<>]*>|\[[^\[\]]*\]|\b[A-Z]+\b|"[^"]*"|\b[0-9][0-9.:]*(?:ms|µs|us|ns|s|m|h|KB|MB|GB|%)?\b`)

// fromDoc turns a documented quote into a pattern.
func fromDoc(s string) pattern {
	var p pattern
	for len(s) > 0 {
		loc := docPlaceholder.FindStringIndex(s)
		if loc == nil {
			p = append(p, []rune(s)...)
			break
		}
		m := s[loc[0]:loc[1]]
		if (m[0] >= 'A' && m[0] <= 'Z' && !placeholders[m]) || m == `""` {
			// An upper-case word that is text (ERROR, SIGHUP, PAUSE).
			p = append(p, []rune(s[:loc[1]])...)
			s = s[loc[1]:]
			continue
		}
		p = append(p, []rune(s[:loc[0]])...)
		if m == "…" || m == "..." || m[0] == '<' || m[0] == '[' {
			p = p.addWild()
		} else {
			p = p.addValue()
		}
		s = s[loc[1]:]
	}
	return p
}

func (p pattern) addWild() pattern {
	if len(p) > 0 && isWild(p[len(p)-1]) {
		p[len(p)-1] = wild
		return p
	}
	return append(p, wild)
}

func (p pattern) addValue() pattern {
	if len(p) > 0 && p[len(p)-1] == wild {
		return p
	}
	return append(p, value)
}

// String shows a pattern with * for its wildcards.
func (p pattern) String() string {
	var b strings.Builder
	for _, r := range p {
		switch r {
		case wild:
			b.WriteString("*")
		case value:
			b.WriteString("?")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// matches reports whether some text fits both patterns.
func matches(a, b pattern) bool { return align(a, b) >= 0 }

// align returns, over the ways some text fits both patterns, the most
// characters that a and b both have as literal text at the same place; -1
// when no text fits both. A documented quote that fits a Go string only
// because the string's verbs swallow most of it is not that string.
func align(a, b pattern) int {
	// Cheap rejection: the literal starts and ends must agree.
	for i := 0; i < len(a) && i < len(b) && !isWild(a[i]) && !isWild(b[i]); i++ {
		if a[i] != b[i] {
			return -1
		}
	}
	for i, j := len(a)-1, len(b)-1; i >= 0 && j >= 0 && !isWild(a[i]) && !isWild(b[j]); i, j = i-1, j-1 {
		if a[i] != b[j] {
			return -1
		}
	}
	// takes reports whether wildcard w may take in r as well.
	takes := func(w, r rune) bool { return w == wild || isWild(r) || r != ' ' }
	// best[j]: over the ways a[:i] and b[:j] fit the same text, the most
	// aligned literal characters; -1 if they cannot.
	n, m := len(a), len(b)
	best := make([]int, m+1)
	next := make([]int, m+1)
	for j := range best {
		best[j] = -1
	}
	best[0] = 0
	for j := 1; j <= m && isWild(b[j-1]); j++ {
		best[j] = 0
	}
	for i := 1; i <= n; i++ {
		for j := 0; j <= m; j++ {
			v := -1
			if isWild(a[i-1]) {
				v = best[j] // a's wildcard ends here
				if j > 0 && takes(a[i-1], b[j-1]) {
					v = max(v, next[j-1]) // it takes b[j-1] too
				}
			}
			if j > 0 && isWild(b[j-1]) {
				v = max(v, next[j-1]) // b's wildcard ends here
				if takes(b[j-1], a[i-1]) {
					v = max(v, best[j]) // it takes a[i-1] too
				}
			}
			if j > 0 && !isWild(a[i-1]) && !isWild(b[j-1]) && a[i-1] == b[j-1] && best[j-1] >= 0 {
				v = max(v, best[j-1]+1)
			}
			next[j] = v
		}
		best, next = next, best
	}
	return best[m]
}

// literals counts the literal characters of p.
func literals(p pattern) int {
	n := 0
	for _, r := range p {
		if !isWild(r) {
			n++
		}
	}
	return n
}

// cuts returns p and the beginnings of p that end at a natural break (a
// documented quote may name a message by its start): before a wildcard,
// before , ; : . ( or ', or before a space that is not followed by a
// letter. "upstream unavailable" is a beginning of "upstream unavailable,
// next retry in %s"; "server accepts connections again; retrying" is not
// one of "…; retrying now".
func cuts(p pattern) []pattern {
	out := []pattern{p}
	for k := 1; k < len(p); k++ {
		switch r := p[k]; {
		case isWild(r), strings.ContainsRune(",;:.('", r):
		case r == ' ' && (k+1 == len(p) || isWild(p[k+1]) || !unicode.IsLetter(p[k+1])):
		default:
			continue
		}
		out = append(out, p[:k])
	}
	return out
}
