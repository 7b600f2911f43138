package pgbini

import (
	"strings"
	"unicode"
)

// connectQuerySettings reads a [databases] entry's connect_query when it
// only sets parameters (SET name = value, SET name TO a, b, SET TIME
// ZONE …, several separated by semicolons) and returns them, to become
// the entry's server_parameters: PostgreSQL then applies them at the start
// of every server connection, and RESET ALL and DISCARD ALL bring them
// back rather than undo them. false when the query does anything else
// (poolerd runs no query on new connections).
func connectQuerySettings(q string) (map[string]string, bool) {
	stmts, ok := splitStatements(q)
	if !ok || len(stmts) == 0 {
		return nil, false
	}
	out := map[string]string{}
	for _, st := range stmts {
		toks, ok := sqlTokens(st)
		if !ok || len(toks) < 3 || !strings.EqualFold(toks[0], "set") {
			return nil, false
		}
		toks = toks[1:]
		if strings.EqualFold(toks[0], "session") && len(toks) > 3 {
			toks = toks[1:]
		}
		var name string
		var vals []string
		switch {
		case strings.EqualFold(toks[0], "local"):
			return nil, false // LOCAL lasts a transaction
		case len(toks) >= 3 && strings.EqualFold(toks[0], "time") && strings.EqualFold(toks[1], "zone"):
			name, vals = "timezone", toks[2:]
		case len(toks) >= 3 && (toks[1] == "=" || strings.EqualFold(toks[1], "to")):
			name, vals = toks[0], toks[2:]
			if strings.HasPrefix(name, `"`) {
				name = strings.ReplaceAll(name[1:len(name)-1], `""`, `"`)
			} else {
				name = strings.ToLower(name)
			}
		default:
			return nil, false
		}
		var items []string
		for i, v := range vals {
			if i%2 == 1 {
				if v != "," {
					return nil, false
				}
				continue
			}
			switch {
			case strings.EqualFold(v, "default") || strings.EqualFold(v, "local") || v == ",":
				return nil, false
			case strings.HasPrefix(v, "'"):
				items = append(items, strings.ReplaceAll(v[1:len(v)-1], "''", "'"))
			default:
				items = append(items, v)
			}
		}
		if len(vals)%2 == 0 {
			return nil, false // ends with a comma
		}
		out[name] = strings.Join(items, ", ")
	}
	return out, true
}

// splitStatements splits q at semicolons outside quotes; false for an
// unterminated quote.
func splitStatements(q string) ([]string, bool) {
	var out []string
	start, quote := 0, byte(0)
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == ';':
			out = append(out, q[start:i])
			start = i + 1
		}
	}
	if quote != 0 {
		return nil, false
	}
	out = append(out, q[start:])
	var stmts []string
	for _, s := range out {
		if strings.TrimSpace(s) != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts, true
}

// sqlTokens splits a statement into words, 'strings', "identifiers", = and
// commas; false for anything else (comments, operators, dollar quotes).
func sqlTokens(s string) ([]string, bool) {
	var out []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '=' || c == ',':
			out = append(out, string(c))
			i++
		case c == '\'' || c == '"':
			j := i + 1
			for ; j < len(s); j++ {
				if s[j] == c {
					if j+1 < len(s) && s[j+1] == c {
						j++
						continue
					}
					break
				}
			}
			if j >= len(s) {
				return nil, false
			}
			out = append(out, s[i:j+1])
			i = j + 1
		default:
			j := i
			for j < len(s) && (s[j] == '_' || s[j] == '.' || s[j] == '-' || s[j] == '+' || s[j] == '/' || s[j] == ':' ||
				unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j]))) {
				j++
			}
			if j == i {
				return nil, false
			}
			out = append(out, s[i:j])
			i = j
		}
	}
	return out, true
}
