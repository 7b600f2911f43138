package console

import (
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// adminError is an error the console reports: ERROR, SQLSTATE 08P01 unless
// set, and the session goes on.
func adminError(format string, args ...any) *wire.Error {
	return &wire.Error{Severity: "ERROR", Code: "08P01", Message: fmt.Sprintf(format, args...)}
}

func errAdminAccess() *wire.Error { return adminError("admin access needed") }

func errInvalidCommand(sql string) *wire.Error {
	return adminError("invalid command '%s', use SHOW HELP;", sql)
}

// notInPoolerd says why poolerd does not have one of PgBouncer's console
// commands (SHOW FDS) and what to use instead; "" for any other.
func notInPoolerd(what string) string {
	switch what {
	case "FDS":
		return "SHOW FDS lists the sockets PgBouncer passes in an online restart: poolerd's restart (--takeover) passes the listener and each client's state itself"
	}
	return ""
}

// errNotInPoolerd refuses one of PgBouncer's commands that poolerd does
// not have (cmd as the client wrote it; what as notInPoolerd names it),
// saying why.
func errNotInPoolerd(cmd, what string) *wire.Error {
	e := adminError("%s is not supported by poolerd", cmd)
	e.Detail = notInPoolerd(what)
	e.Hint = "SHOW HELP lists poolerd's commands"
	return e
}

// query runs one console command and answers it. It returns true when
// the session must end (SHUTDOWN).
func (s *session) query(sql string) bool {
	out, quit, werr := s.command(sql)
	if werr != nil {
		out = werr.Append(out[:0])
		// Never the text of a SET: its value may be a secret (upstream).
		cmd := sql
		if key, _, ok, _ := parseSet(sql); ok {
			cmd = "SET " + key
		} else if len(cmd) > 200 {
			cmd = cmd[:200]
		}
		s.log.Info("admin console command refused", zap.String("command", cmd), zap.String("error", werr.Message))
	}
	if quit {
		return true
	}
	out = wire.AppendReadyForQuery(out, wire.TxIdle)
	_ = s.write(out)
	return false
}

// command parses and runs a command; it returns the reply (without
// ReadyForQuery).
func (s *session) command(sql string) (out []byte, quit bool, werr *wire.Error) {
	if key, value, ok, bad := parseSet(sql); ok || bad {
		if bad {
			return nil, false, adminError("bad arguments")
		}
		return s.set(key, value)
	}
	cmd, arg, ok := parseAdmin(sql)
	if !ok {
		return nil, false, errInvalidCommand(sql)
	}
	if len(cmd) > 15 || len(arg) > 63 {
		return nil, false, adminError("bad arguments")
	}
	cmd = strings.ToUpper(cmd)
	if cmd == "SELECT" {
		cmd = "SHOW"
	}
	if cmd == "SHOW" {
		return s.c.show(strings.ToUpper(arg), sql)
	}
	switch cmd {
	case "RELOAD":
		if arg != "" {
			return nil, false, errInvalidCommand(sql)
		}
	case "SHUTDOWN":
		switch strings.ToUpper(arg) {
		case "", "WAIT_FOR_SERVERS", "WAIT_FOR_CLIENTS":
		default:
			return nil, false, errInvalidCommand(sql)
		}
	case "PAUSE", "RESUME", "DISABLE", "ENABLE", "RECONNECT", "KILL", "KILL_CLIENT", "WAIT_CLOSE":
	case "SUSPEND":
		if arg != "" {
			return nil, false, errInvalidCommand(sql)
		}
	default:
		return nil, false, errInvalidCommand(sql)
	}
	if !s.admin {
		return nil, false, errAdminAccess()
	}
	return s.control(cmd, arg)
}

// parseAdmin splits a console command like PgBouncer's parser: one word, an
// optional argument, an optional trailing semicolon; words are [0-9A-Za-z_]+
// or double-quoted ("" escapes a quote, the quotes are removed).
func parseAdmin(sql string) (cmd, arg string, ok bool) {
	rest := strings.TrimSpace(sql)
	rest = strings.TrimSpace(strings.TrimSuffix(rest, ";"))
	var words []string
	for rest != "" {
		w, n, ok := adminWord(rest)
		if !ok {
			return "", "", false
		}
		words = append(words, w)
		rest = rest[n:]
		trimmed := strings.TrimLeft(rest, " \t\n\r")
		if trimmed != "" && len(trimmed) == len(rest) {
			return "", "", false // words must be separated by blanks
		}
		rest = trimmed
	}
	switch len(words) {
	case 1:
		return words[0], "", true
	case 2:
		return words[0], words[1], true
	}
	return "", "", false
}

// adminWord reads a word at the start of s.
func adminWord(s string) (word string, n int, ok bool) {
	if s[0] == '"' {
		word, n, ok = unquote(s)
		return word, n, ok && word != ""
	}
	i := 0
	for i < len(s) && (s[i] == '_' || s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z') {
		i++
	}
	return s[:i], i, i > 0
}

// unquote reads the quoted string at the start of s, quoted with s[0], in
// which two quotes stand for one; n is its length with the quotes. ok is
// false if it does not end.
func unquote(s string) (value string, n int, ok bool) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] == q {
			if i+1 < len(s) && s[i+1] == q {
				b.WriteByte(q)
				i++
				continue
			}
			return b.String(), i + 1, true
		}
		b.WriteByte(s[i])
	}
	return "", 0, false
}

// parseSet reads SET key = value (or TO); the value is a word or a
// single-quoted string (two quotes stand for one). ok: it is a SET; bad: it
// is a malformed SET.
func parseSet(sql string) (key, value string, ok, bad bool) {
	rest := strings.TrimSpace(sql)
	rest = strings.TrimSpace(strings.TrimSuffix(rest, ";"))
	if len(rest) < 4 || !strings.EqualFold(rest[:3], "set") || (rest[3] != ' ' && rest[3] != '\t' && rest[3] != '\n') {
		return "", "", false, false
	}
	rest = strings.TrimSpace(rest[3:])
	k, n, okw := adminWord(rest)
	if !okw {
		return "", "", false, true
	}
	rest = strings.TrimSpace(rest[n:])
	switch {
	case strings.HasPrefix(rest, "="):
		rest = strings.TrimSpace(rest[1:])
	case len(rest) > 2 && strings.EqualFold(rest[:2], "to") && (rest[2] == ' ' || rest[2] == '\t' || rest[2] == '\''):
		rest = strings.TrimSpace(rest[2:])
	default:
		return "", "", false, true
	}
	if strings.HasPrefix(rest, "'") {
		v, n, okq := unquote(rest)
		if !okq || strings.TrimSpace(rest[n:]) != "" {
			return "", "", false, true
		}
		return k, v, true, len(v) > 255
	}
	v, n, okv := adminWord(rest)
	if !okv || strings.TrimSpace(rest[n:]) != "" {
		// Values like 30s or 1.5 are not words: take the rest as is.
		v = rest
		if v == "" || strings.ContainsAny(v, " \t\n;'\"") {
			return "", "", false, true
		}
	}
	return k, v, true, len(v) > 255
}
