package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// The admin console: the virtual database "pgbouncer" (alias "poolerd"),
// compatible with PgBouncer 1.25's console so that its tools work
// unchanged (column names, order and types of every SHOW; command tags;
// error texts). See docs/observability.md and
// docs/admin-console-reference.md.

// pgbouncerVersion is the PgBouncer release whose console poolerd mimics;
// tools read it from SHOW VERSION to pick a column layout.
const pgbouncerVersion = "1.25.2"

// adminDatabase is the name the console reports itself as.
const adminDatabase = "pgbouncer"

func isAdminDB(name string) bool { return name == "pgbouncer" || name == "poolerd" }

// PostgreSQL type OIDs used by the console, as PgBouncer sends them.
const (
	oidText    = 25
	oidInt4    = 23
	oidInt8    = 20
	oidNumeric = 1700
)

// adminError is an error the console reports: ERROR, SQLSTATE 08P01 unless
// set, and the session goes on.
func adminError(format string, args ...any) *wire.Error {
	return &wire.Error{Severity: "ERROR", Code: "08P01", Message: fmt.Sprintf(format, args...)}
}

var errAdminAccess = func() *wire.Error { return adminError("admin access needed") }

// adminLogin finishes the login of an admin console client: only
// admin_users and stats_users get in.
func (s *session) adminLogin() bool {
	cfg := s.srv.cfg()
	s.admin = true
	s.adminAll = slices.Contains(cfg.AdminUsers, s.user)
	if !s.adminAll && !slices.Contains(cfg.StatsUsers, s.user) {
		s.fail(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "not allowed",
			Hint: "the admin console is open to the users in admin_users and stats_users"})
		s.log.Info("admin console login refused: user not in admin_users or stats_users")
		return false
	}
	welcome := wire.AppendAuthOk(nil)
	for _, kv := range [][2]string{
		{"server_version", pgbouncerVersion + "/bouncer"}, {"client_encoding", "UTF8"}, {"server_encoding", "UTF8"},
		{"DateStyle", "ISO"}, {"TimeZone", "GMT"}, {"standard_conforming_strings", "on"}, {"is_superuser", "on"},
	} {
		welcome = wire.AppendParameterStatus(welcome, kv[0], kv[1])
	}
	s.srv.register(s)
	welcome = wire.AppendBackendKeyData(welcome, s.pid, s.key)
	welcome = wire.AppendReadyForQuery(welcome, wire.TxIdle)
	if _, err := s.conn.Write(welcome); err != nil {
		s.srv.forget(s)
		return false
	}
	if cfg.LogConnections {
		s.log.Info("admin console client connected", zap.Bool("admin", s.adminAll))
	}
	return true
}

// runAdmin serves console commands until the client leaves.
func (s *session) runAdmin() {
	for {
		typ, body, err := wire.ReadMessage(s.conn, 1<<20)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			s.end(err)
			return
		}
		s.lastReq.Store(s.srv.nanotime())
		switch typ {
		case 'Q':
			sql := string(body)
			if i := strings.IndexByte(sql, 0); i >= 0 {
				sql = sql[:i]
			}
			if quit := s.adminQuery(sql); quit {
				s.end(nil)
				return
			}
		case 'X':
			s.end(nil)
			return
		case 'P', 'B', 'E', 'D', 'S', 'H', 'C':
			s.fail(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "extended query protocol not supported by admin console",
				Hint: "use the simple query protocol (psql does; in drivers, a simple-protocol or exec mode)"})
			s.end(nil)
			return
		default:
			s.fail(adminError("unsupported packet type for admin console: %d", typ))
			s.end(nil)
			return
		}
	}
}

// adminQuery runs one console command and answers it. It returns true when
// the session must end (SHUTDOWN).
func (s *session) adminQuery(sql string) bool {
	out, quit, werr := s.adminCommand(sql)
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
	s.writeClient(out)
	return false
}

// adminCommand parses and runs a command; it returns the reply (without
// ReadyForQuery).
func (s *session) adminCommand(sql string) (out []byte, quit bool, werr *wire.Error) {
	if key, value, ok, bad := parseSet(sql); ok || bad {
		if bad {
			return nil, false, adminError("bad arguments")
		}
		return s.adminSet(key, value)
	}
	cmd, arg, ok := parseAdmin(sql)
	if !ok {
		return nil, false, adminError("invalid command '%s', use SHOW HELP;", sql)
	}
	if len(cmd) > 15 || len(arg) > 63 {
		return nil, false, adminError("bad arguments")
	}
	cmd = strings.ToUpper(cmd)
	if cmd == "SELECT" {
		cmd = "SHOW"
	}
	if cmd == "SHOW" {
		return s.adminShow(strings.ToUpper(arg), sql)
	}
	switch cmd {
	case "RELOAD":
		if arg != "" {
			return nil, false, adminError("invalid command '%s', use SHOW HELP;", sql)
		}
	case "SHUTDOWN":
		switch strings.ToUpper(arg) {
		case "", "WAIT_FOR_SERVERS", "WAIT_FOR_CLIENTS":
		default:
			return nil, false, adminError("invalid command '%s', use SHOW HELP;", sql)
		}
	case "PAUSE", "RESUME", "DISABLE", "ENABLE", "RECONNECT", "KILL", "KILL_CLIENT", "WAIT_CLOSE":
	default:
		return nil, false, adminError("invalid command '%s', use SHOW HELP;", sql)
	}
	if !s.adminAll {
		return nil, false, errAdminAccess()
	}
	return s.adminControl(cmd, arg)
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
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] == '"' {
				if i+1 < len(s) && s[i+1] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				return b.String(), i + 1, b.Len() > 0
			}
			b.WriteByte(s[i])
		}
		return "", 0, false
	}
	i := 0
	for i < len(s) && (s[i] == '_' || s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z') {
		i++
	}
	return s[:i], i, i > 0
}

// parseSet reads SET key = value (or TO); the value is a word or a
// single-quoted string (” escapes a quote). ok: it is a SET; bad: it is a
// malformed SET.
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
		var b strings.Builder
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\'' {
				if i+1 < len(rest) && rest[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				if strings.TrimSpace(rest[i+1:]) != "" {
					return "", "", false, true
				}
				return k, b.String(), true, b.Len() > 255
			}
			b.WriteByte(rest[i])
		}
		return "", "", false, true
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

// resultSet builds a console reply: RowDescription, DataRows, CommandComplete.
type resultSet struct {
	buf  []byte
	cols int
}

type column struct {
	name string
	oid  uint32
}

func newResult(cols ...column) *resultSet {
	r := &resultSet{cols: len(cols)}
	start := len(r.buf)
	r.buf = append(r.buf, 'T', 0, 0, 0, 0)
	r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(len(cols)))
	for _, c := range cols {
		r.buf = append(r.buf, c.name...)
		r.buf = append(r.buf, 0)
		r.buf = binary.BigEndian.AppendUint32(r.buf, 0) // table OID
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0) // column number
		r.buf = binary.BigEndian.AppendUint32(r.buf, c.oid)
		size := int16(-1)
		switch c.oid {
		case oidInt4:
			size = 4
		case oidInt8:
			size = 8
		}
		r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(size))
		r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff) // typmod -1
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0)          // text format
	}
	binary.BigEndian.PutUint32(r.buf[start+1:], uint32(len(r.buf)-start-1))
	return r
}

// null is a NULL value in a row.
type null struct{}

// row appends a DataRow; values are strings, integers, null{} or *string.
func (r *resultSet) row(values ...any) {
	start := len(r.buf)
	r.buf = append(r.buf, 'D', 0, 0, 0, 0)
	r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(len(values)))
	for _, v := range values {
		var s string
		switch x := v.(type) {
		case null:
			r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff)
			continue
		case *string:
			if x == nil {
				r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff)
				continue
			}
			s = *x
		case string:
			s = x
		case int:
			s = strconv.Itoa(x)
		case int64:
			s = strconv.FormatInt(x, 10)
		case uint64:
			s = strconv.FormatUint(x, 10)
		default:
			s = fmt.Sprint(x)
		}
		r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(s)))
		r.buf = append(r.buf, s...)
	}
	binary.BigEndian.PutUint32(r.buf[start+1:], uint32(len(r.buf)-start-1))
}

// done appends CommandComplete with tag.
func (r *resultSet) done(tag string) []byte { return appendCommandComplete(r.buf, tag) }

func appendCommandComplete(dst []byte, tag string) []byte {
	start := len(dst)
	dst = append(dst, 'C', 0, 0, 0, 0)
	dst = append(dst, tag...)
	dst = append(dst, 0)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// pgTime formats a time like PgBouncer's console (text, local time).
func pgTime(t time.Time) string {
	if t.IsZero() {
		t = time.Now()
	}
	return t.Local().Format("2006-01-02 15:04:05 MST")
}

// splitAddr splits host:port for the console's addr and port columns.
func splitAddr(a net.Addr) (string, int) {
	if a == nil {
		return "", 0
	}
	if a.Network() == "unix" {
		return "unix", 0
	}
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String(), 0
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

// adminControl runs a command that changes something (admin users only).
func (s *session) adminControl(cmd, arg string) ([]byte, bool, *wire.Error) {
	srv := s.srv
	tag := func() ([]byte, bool, *wire.Error) { return appendCommandComplete(nil, cmd), false, nil }
	switch cmd {
	case "RELOAD":
		if err := srv.Reload(); err != nil {
			return nil, false, &wire.Error{Severity: "ERROR", Code: "F0000", Message: "RELOAD failed, see logs for additional details",
				Detail: err.Error(), Hint: "the running configuration is unchanged; fix the file and RELOAD again"}
		}
		return tag()
	case "SHUTDOWN":
		mode := strings.ToUpper(arg)
		srv.requestShutdown(mode)
		if mode == "" {
			return nil, true, nil // like PgBouncer: no reply, the process exits
		}
		return tag()
	case "KILL_CLIENT":
		id, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || arg == "" {
			return nil, false, adminError("invalid client pointer supplied")
		}
		victim := srv.sessionByID(id)
		if victim == nil || victim.admin && victim == s {
			return nil, false, adminError("client not found")
		}
		victim.terminate(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "admin forced disconnect",
			Hint: "an administrator ran KILL_CLIENT on this connection"})
		s.log.Info("admin console: client killed", zap.Uint64("killed_session", id))
		return tag()
	}
	// The rest take an optional or required database.
	if arg != "" && isAdminDB(arg) {
		verb := map[string]string{"PAUSE": "pause", "DISABLE": "disable", "ENABLE": "disable", "RECONNECT": "reconnect",
			"KILL": "kill", "WAIT_CLOSE": "wait in", "RESUME": "resume"}[cmd]
		return nil, false, adminError("cannot %s admin db: %s", verb, arg)
	}
	if arg == "" && (cmd == "DISABLE" || cmd == "ENABLE") {
		return nil, false, adminError("a database is required")
	}
	if arg != "" && !srv.databaseKnown(arg) {
		return nil, false, adminError("no such database: %s", arg)
	}
	ctx, cancel := context.WithCancelCause(srv.ctx)
	defer cancel(nil)
	s.waitMu.Lock()
	s.waitCancel = cancel // a cancel request on this connection interrupts a wait
	s.waitMu.Unlock()
	defer func() {
		s.waitMu.Lock()
		s.waitCancel = nil
		s.waitMu.Unlock()
	}()
	var werr *wire.Error
	switch cmd {
	case "PAUSE":
		werr = srv.pause(ctx, arg)
		if werr == nil && context.Cause(ctx) != nil {
			// PgBouncer: a cancel request while PAUSE waits resumes.
			if arg == "" {
				srv.resumeAll()
			} else {
				_ = srv.resume(arg)
			}
			werr = &wire.Error{Severity: "ERROR", Code: "57014", Message: "canceling PAUSE due to user request; resumed again"}
		}
	case "RESUME":
		werr = srv.resume(arg)
	case "DISABLE", "ENABLE":
		srv.setDisabled(arg, cmd == "DISABLE")
	case "RECONNECT":
		for _, p := range srv.poolsOf(arg) {
			p.pool.Reconnect()
		}
	case "KILL":
		werr = srv.kill(arg)
	case "WAIT_CLOSE":
		for _, p := range srv.poolsOf(arg) {
			if err := p.pool.WaitReconnected(ctx); err != nil {
				werr = &wire.Error{Severity: "ERROR", Code: "57014", Message: "canceling WAIT_CLOSE due to user request"}
				break
			}
		}
	}
	if werr != nil {
		return nil, false, werr
	}
	s.log.Info("admin console command", zap.String("command", cmd), zap.String("target", arg))
	return tag()
}
