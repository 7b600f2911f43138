package auth

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// maxUserlistLine bounds the length of one auth_file line.
const maxUserlistLine = 1 << 20

// UserlistEntry is one user of a PgBouncer auth_file.
type UserlistEntry struct {
	// Name is the user name, unquoted.
	Name string
	// Secret is the parsed password. An empty password field ("") yields
	// the zero Secret (Kind 0), which matches no password; PgBouncer allows
	// this for users that only log in with auth_type trust.
	Secret Secret
	// Line is the 1-based line number the entry came from.
	Line int
}

// UserlistError is the error [ParseUserlist] returns: what is wrong and on
// which line. It never contains a secret.
type UserlistError struct {
	// Line is the 1-based line number, or 0 for a read error.
	Line int
	// Err describes the problem.
	Err error
}

// Error implements error.
func (e *UserlistError) Error() string {
	if e.Line == 0 {
		return "auth file: " + e.Err.Error()
	}
	return fmt.Sprintf("auth file line %d: %v", e.Line, e.Err)
}

// Unwrap returns the underlying problem.
func (e *UserlistError) Unwrap() error { return e.Err }

// ParseUserlist reads a PgBouncer auth_file ("userlist.txt"):
//
//	"username" "secret" [ignored ...]
//
// Both fields are enclosed in double quotes; a double quote inside a field
// is written twice (""). The fields are separated by blanks (spaces or
// tabs); anything after the second field is ignored, as in PgBouncer.
// Blank lines and lines whose first non-blank character is ';' or '#' are
// comments. Lines may end in CRLF. Secrets are parsed with [ParseSecret].
//
// Unlike PgBouncer, which logs "broken auth file" and stops loading,
// ParseUserlist returns a [*UserlistError] naming the line for a malformed
// line, an empty user name, an invalid SCRAM secret or a duplicate user
// name. Errors never include a secret.
func ParseUserlist(r io.Reader) ([]UserlistEntry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxUserlistLine)
	var entries []UserlistEntry
	seen := make(map[string]int)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if lineNo == 1 {
			line = strings.TrimPrefix(line, "\uFEFF") // UTF-8 byte order mark
		}
		e, ok, err := parseUserlistLine(line)
		if err != nil {
			return nil, &UserlistError{Line: lineNo, Err: err}
		}
		if !ok {
			continue
		}
		if first, dup := seen[e.Name]; dup {
			return nil, &UserlistError{Line: lineNo, Err: fmt.Errorf("duplicate user %q (first defined on line %d)", e.Name, first)}
		}
		seen[e.Name] = lineNo
		e.Line = lineNo
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &UserlistError{Line: lineNo + 1, Err: fmt.Errorf("line longer than %d bytes: %w", maxUserlistLine, err)}
		}
		return nil, &UserlistError{Err: fmt.Errorf("reading: %w", err)}
	}
	return entries, nil
}

// parseUserlistLine parses one line; ok is false for blank and comment
// lines.
func parseUserlistLine(line string) (e UserlistEntry, ok bool, err error) {
	line = strings.TrimSuffix(line, "\r")
	rest := trimBlanks(line)
	if rest == "" || rest[0] == ';' || rest[0] == '#' {
		return e, false, nil
	}
	if rest[0] != '"' {
		return e, false, errors.New(`expected a user name in double quotes at the start of the line`)
	}
	name, rest, ok := unquoteField(rest)
	if !ok {
		return e, false, errors.New("unterminated quoted user name")
	}
	if name == "" {
		return e, false, errors.New("empty user name")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return e, false, errors.New("user name contains a NUL byte")
	}
	afterName := trimBlanks(rest)
	if afterName == "" {
		// Not naming the field: a lone field might be a password.
		return e, false, errors.New("missing secret field (expected two double-quoted fields)")
	}
	if afterName[0] != '"' || len(afterName) == len(rest) {
		return e, false, fmt.Errorf("user %q: expected blanks and a secret in double quotes after the user name", name)
	}
	secret, _, ok := unquoteField(afterName)
	if !ok {
		return e, false, fmt.Errorf("user %q: unterminated quoted secret", name)
	}
	// Anything after the secret is ignored, as in PgBouncer.
	e.Name = name
	if secret != "" {
		if strings.IndexByte(secret, 0) >= 0 {
			return e, false, fmt.Errorf("user %q: secret contains a NUL byte", name)
		}
		s, err := ParseSecret(secret)
		if err != nil {
			return e, false, fmt.Errorf("user %q: %w", name, err)
		}
		e.Secret = s
	}
	return e, true, nil
}

// trimBlanks removes leading spaces, tabs, vertical tabs and form feeds.
func trimBlanks(s string) string {
	return strings.TrimLeft(s, " \t\v\f")
}

// unquoteField parses a field that starts with '"' and returns its value
// with "" turned into " and the text after the closing quote.
func unquoteField(s string) (value, rest string, ok bool) {
	var b strings.Builder
	i := 1
	for {
		j := strings.IndexByte(s[i:], '"')
		if j < 0 {
			return "", "", false
		}
		b.WriteString(s[i : i+j])
		i += j + 1
		if i < len(s) && s[i] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i:], true
	}
}
