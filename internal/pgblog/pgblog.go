// Package pgblog writes poolerd's log entries as PgBouncer writes its log
// (log_format: pgbouncer), so that what was built on PgBouncer's log keeps
// working when poolerd takes its place: searches and alerts on "closing
// because:", pgbadger's PgBouncer reports, a runbook's grep.
//
// A line is PgBouncer's: the time, the process id in brackets, the level
// (LOG, WARNING, ERROR, DEBUG), the socket prefix of a line about one
// connection ("C-0x1f: db/user@10.0.0.5:50312 " for a client, "S-0x2a:
// db/user@10.0.0.9:5432 " for a server connection; the number is poolerd's
// session or conn_id, in hex, where PgBouncer prints a pointer) and the
// text. The events PgBouncer logs too get its words (Translate); every other
// entry its message followed by its fields as key=value.
//
// The package only formats: which events poolerd logs, and with which
// fields, is the logging code's (docs/observability.md lists them).
package pgblog

import (
	"encoding/base64"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// Encoder is a zapcore.Encoder writing PgBouncer's lines. Its zero value is
// not usable: New makes one.
type Encoder struct {
	pid int
	// withTime: the line starts with the time and the process id; false
	// for syslog, which stamps both itself.
	withTime bool
	bufs     *buffer.Pool
	fields   []field // added by With, in order
	ns       string  // the open namespace's prefix ("ns.")
}

type field struct{ key, val string }

// New is an Encoder for a process with id pid.
func New(pid int, withTime bool) *Encoder {
	p := buffer.NewPool()
	return &Encoder{pid: pid, withTime: withTime, bufs: &p}
}

// Clone implements zapcore.Encoder.
func (e *Encoder) Clone() zapcore.Encoder { return e.clone() }

func (e *Encoder) clone() *Encoder {
	c := *e
	c.fields = append([]field(nil), e.fields...)
	return &c
}

// EncodeEntry implements zapcore.Encoder.
func (e *Encoder) EncodeEntry(ent zapcore.Entry, extra []zapcore.Field) (*buffer.Buffer, error) {
	c := e
	if len(extra) > 0 {
		c = e.clone()
		for _, f := range extra {
			f.AddTo(c)
		}
	}
	b := e.bufs.Get()
	if e.withTime {
		b.AppendString(ent.Time.Format("2006-01-02 15:04:05.000 MST"))
		b.AppendString(" [")
		b.AppendInt(int64(e.pid))
		b.AppendString("] ")
	}
	b.AppendString(levelTag(ent.Level))
	b.AppendByte(' ')
	l := line{fields: c.fields}
	b.AppendString(l.prefix())
	b.AppendString(l.text(ent.Message))
	b.AppendByte('\n')
	return b, nil
}

// levelTag is PgBouncer's name of a level.
func levelTag(l zapcore.Level) string {
	switch {
	case l <= zapcore.DebugLevel:
		return "DEBUG"
	case l == zapcore.InfoLevel:
		return "LOG"
	case l == zapcore.WarnLevel:
		return "WARNING"
	case l == zapcore.ErrorLevel:
		return "ERROR"
	default:
		return "FATAL"
	}
}

// line is one entry's fields while it is written; used marks those the
// prefix or the text has shown.
type line struct {
	fields []field
	used   map[string]bool
}

// get is the last value of key (a later field wins, as in JSON).
func (l *line) get(key string) (string, bool) {
	for i := len(l.fields) - 1; i >= 0; i-- {
		if l.fields[i].key == key {
			if l.used == nil {
				l.used = map[string]bool{}
			}
			l.used[key] = true
			return l.fields[i].val, true
		}
	}
	return "", false
}

func (l *line) or(key, dflt string) string {
	if v, ok := l.get(key); ok && v != "" {
		return v
	}
	return dflt
}

// prefix is PgBouncer's socket prefix for a line about a client (field
// session) or a server connection (conn_id); empty for any other line.
func (l *line) prefix() string {
	kind, id, ok := byte('C'), "", false
	if id, ok = l.get("session"); !ok {
		if id, ok = l.get("conn_id"); !ok {
			return ""
		}
		kind = 'S'
	}
	if n, err := strconv.ParseUint(id, 10, 64); err == nil {
		id = strconv.FormatUint(n, 16)
	}
	db := l.or("database", "(nodb)")
	user := l.or("user", "(nouser)")
	var addr string
	if kind == 'C' {
		addr = l.or("client", "unix")
	} else {
		addr = l.or("host", l.or("server", ""))
		l.get("server") // the pool's first server: the host says which one
	}
	return fmt.Sprintf("%c-0x%s: %s/%s@%s ", kind, id, db, user, bracketed(addr))
}

// bracketed writes an IPv6 host:port as PgBouncer does: [::1]:5432.
func bracketed(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !strings.Contains(host, ":") {
		return addr
	}
	return "[" + host + "]:" + port
}

// age is PgBouncer's "(age=Ns)" from a duration field.
func (l *line) age(key string) string {
	d, _ := time.ParseDuration(l.or(key, "0s"))
	return fmt.Sprintf("(age=%ds)", int64(d/time.Second))
}

// text is the line after the prefix.
func (l *line) text(msg string) string {
	if t, ok := l.translate(msg); ok {
		return t
	}
	var b strings.Builder
	b.WriteString(msg)
	for i, f := range l.fields {
		if l.used[f.key] || l.later(i) {
			continue
		}
		b.WriteByte(' ')
		b.WriteString(f.key)
		b.WriteByte('=')
		b.WriteString(quoted(f.val))
	}
	return b.String()
}

// later reports whether field i is overridden by a later one of its key.
func (l *line) later(i int) bool {
	for _, f := range l.fields[i+1:] {
		if f.key == l.fields[i].key {
			return true
		}
	}
	return false
}

// quoted quotes a value that would not read as one word.
func quoted(v string) string {
	if v == "" || strings.ContainsAny(v, " \t\n\"=") {
		return strconv.Quote(v)
	}
	return v
}

// translate is PgBouncer's text for the events it logs too; false for the
// others.
func (l *line) translate(msg string) (string, bool) {
	switch msg {
	case "client connected":
		return fmt.Sprintf("login attempt: db=%s user=%s tls=%s", l.or("database", ""), l.or("user", ""), l.or("tls", "no")), true
	case "client disconnected":
		return "closing because: " + clientReason(l) + " " + l.age("duration"), true
	case "client login refused", "client from the old poolerd refused":
		return "closing because: " + l.or("reason", "login failed") + " (age=0s)", true
	case "client authentication failed":
		if l.or("method", "") == "scram-sha-256" {
			return "closing because: SASL authentication failed (age=0s)", true
		}
		return "closing because: password authentication failed (age=0s)", true
	case "client login timed out":
		return "closing because: client_login_timeout " + l.age("duration"), true
	case "server connection opened":
		return "new connection to server (from " + bracketed(l.or("local", "unix")) + ")", true
	case "server connection closed":
		return "closing because: " + ServerReason(l.or("reason", "")) + " " + l.age("age"), true
	case "server connect failed", "server of the entry failed; trying its next":
		return connectFailed(l.or("error", "")), true
	case "auth_query failed":
		// PgBouncer quotes the server's refusal as it came: of the
		// login as auth_user as for any server login, or of the query.
		err := l.or("error", "")
		if login, ok := strings.CutPrefix(err, authUserLogin); ok {
			return connectFailed(login), true
		}
		return fmt.Sprintf("auth_query for user %s failed: %s", l.or("user", ""), err), true
	case "configuration reload failed; keeping the running configuration":
		// PgBouncer logs the reason as it found it, unquoted; a TLS file
		// that does not load as its TLS setup failing, with the C
		// library's words for the system's error.
		reason := strings.Join(strings.Fields(l.or("error", "")), " ")
		if strings.Contains(reason, "client_tls_") || strings.Contains(reason, "server_tls_") {
			return "TLS setup failed: " + strerror(reason) + " (" + msg + ")", true
		}
		return msg + ": " + reason, true
	case "replication server login failed":
		return "closing because: login failed (age=0s) " + l.or("error", ""), true
	case "idle pool removed":
		d, _ := time.ParseDuration(l.or("age", "0s"))
		return fmt.Sprintf("cleaning up idle pool for user %s on db %s because: pool idle timeout (age= %ds)",
			l.or("user", ""), l.or("database", ""), int64(d/time.Second)), true
	case "registered new auto-database":
		return "registered new auto-database: " + l.or("database", ""), true
	}
	return "", false
}

// strerror gives the system errors in text Go's way ("no such file or
// directory") the C library's capital ("No such file or directory"), as
// PgBouncer's lines quote strerror.
func strerror(text string) string {
	for n := syscall.Errno(1); n < 256; n++ {
		e := n.Error()
		if e == "" || strings.HasPrefix(e, "errno ") {
			continue
		}
		if i := strings.Index(text, ": "+e); i >= 0 && (len(text) == i+2+len(e) || strings.ContainsAny(text[i+2+len(e):i+3+len(e)], ";,) \n")) {
			text = text[:i+2] + strings.ToUpper(e[:1]) + e[1:] + text[i+2+len(e):]
		}
	}
	return text
}

// authUserLogin starts the error of an auth_query whose login as
// auth_user failed (the proxy's runAuthQuery).
const authUserLogin = "log in as auth_user: "

// connectFailed is PgBouncer's line for a failed connect attempt: the
// server's refusal as PgBouncer quotes it ("server login failed: FATAL
// password authentication failed for user …"), or PgBouncer's reason for
// another failure, followed by poolerd's error.
func connectFailed(err string) string {
	for _, sev := range []string{"FATAL", "ERROR"} {
		if i := strings.Index(err, sev+": "); i >= 0 {
			msg := err[i+len(sev)+2:]
			if j := strings.LastIndex(msg, " (SQLSTATE "); j >= 0 {
				msg = msg[:j]
			}
			return "server login failed: " + sev + " " + msg
		}
	}
	why := "connect failed"
	switch {
	case strings.Contains(err, "timeout") || strings.Contains(err, "deadline exceeded"):
		why = "connect timeout"
	case strings.Contains(err, "no such host") || strings.Contains(err, "server misbehaving"):
		why = "server DNS lookup failed"
	case strings.Contains(err, "x509: ") || strings.Contains(err, "failed to verify certificate"):
		why = "TLS handshake failed: certificate verify failed" // OpenSSL's words, which PgBouncer logs
	}
	return "closing because: " + why + " (age=0s) error=" + quoted(err)
}

// clientReason is PgBouncer's words for why a client's connection ended.
func clientReason(l *line) string {
	reason, ok := l.get("reason")
	if !ok || reason == "" {
		if _, failed := l.get("error"); failed {
			return "client unexpected eof"
		}
		return "client close request"
	}
	l.get("sqlstate")
	if detail, _ := l.get("detail"); strings.Contains(detail, "shutting down") {
		return "server shutting down"
	}
	return reason
}

// ServerReason is PgBouncer's words for why poolerd closed a server
// connection, from poolerd's eviction or recycle reason (the reason label
// of poolerd_server_evictions_total, and max_lifetime, max_queries,
// idle_timeout); a reason PgBouncer has no words for is written with
// spaces for its underscores.
func ServerReason(reason string) string {
	switch reason {
	case "":
		return "server connection closed"
	case "server_closed":
		return "server conn crashed?"
	case "broken", "client_left_in_transaction", "client_left_mid_request", "write_failed":
		return "unclean server"
	case "reset_query_failed":
		return "reset query failed"
	case "validation_failed":
		return "test query failed"
	case "paused":
		return "pause mode"
	case "reconnect":
		return "database configuration changed"
	case "over_max_size", "reserve_idle":
		return "too many servers in the pool"
	case "make_room", "evicted":
		return "evicted"
	case "max_lifetime":
		return "server lifetime over"
	case "idle_timeout":
		return "server idle timeout"
	case "handoff_dirty":
		return "idle server got dirty"
	case "shutdown":
		return "pooler is shutting down"
	}
	return strings.ReplaceAll(reason, "_", " ")
}

// The zapcore.ObjectEncoder methods: each field becomes its text.

func (e *Encoder) add(key, val string) { e.fields = append(e.fields, field{e.ns + key, val}) }

// AddArray implements zapcore.ObjectEncoder.
func (e *Encoder) AddArray(key string, v zapcore.ArrayMarshaler) error {
	m := zapcore.NewMapObjectEncoder()
	err := m.AddArray(key, v)
	e.add(key, fmt.Sprint(m.Fields[key]))
	return err
}

// AddObject implements zapcore.ObjectEncoder.
func (e *Encoder) AddObject(key string, v zapcore.ObjectMarshaler) error {
	m := zapcore.NewMapObjectEncoder()
	err := m.AddObject(key, v)
	e.add(key, fmt.Sprint(m.Fields[key]))
	return err
}

// AddBinary implements zapcore.ObjectEncoder.
func (e *Encoder) AddBinary(key string, v []byte) {
	e.add(key, base64.StdEncoding.EncodeToString(v))
}

// AddByteString implements zapcore.ObjectEncoder.
func (e *Encoder) AddByteString(key string, v []byte) { e.add(key, string(v)) }

// AddBool implements zapcore.ObjectEncoder.
func (e *Encoder) AddBool(key string, v bool) { e.add(key, strconv.FormatBool(v)) }

// AddComplex128 implements zapcore.ObjectEncoder.
func (e *Encoder) AddComplex128(key string, v complex128) { e.add(key, fmt.Sprint(v)) }

// AddComplex64 implements zapcore.ObjectEncoder.
func (e *Encoder) AddComplex64(key string, v complex64) { e.add(key, fmt.Sprint(v)) }

// AddDuration implements zapcore.ObjectEncoder.
func (e *Encoder) AddDuration(key string, v time.Duration) { e.add(key, v.String()) }

// AddFloat64 implements zapcore.ObjectEncoder.
func (e *Encoder) AddFloat64(key string, v float64) {
	e.add(key, strconv.FormatFloat(v, 'g', -1, 64))
}

// AddFloat32 implements zapcore.ObjectEncoder.
func (e *Encoder) AddFloat32(key string, v float32) {
	e.add(key, strconv.FormatFloat(float64(v), 'g', -1, 32))
}

// AddInt implements zapcore.ObjectEncoder.
func (e *Encoder) AddInt(key string, v int) { e.AddInt64(key, int64(v)) }

// AddInt64 implements zapcore.ObjectEncoder.
func (e *Encoder) AddInt64(key string, v int64) { e.add(key, strconv.FormatInt(v, 10)) }

// AddInt32 implements zapcore.ObjectEncoder.
func (e *Encoder) AddInt32(key string, v int32) { e.AddInt64(key, int64(v)) }

// AddInt16 implements zapcore.ObjectEncoder.
func (e *Encoder) AddInt16(key string, v int16) { e.AddInt64(key, int64(v)) }

// AddInt8 implements zapcore.ObjectEncoder.
func (e *Encoder) AddInt8(key string, v int8) { e.AddInt64(key, int64(v)) }

// AddString implements zapcore.ObjectEncoder.
func (e *Encoder) AddString(key, v string) { e.add(key, v) }

// AddTime implements zapcore.ObjectEncoder.
func (e *Encoder) AddTime(key string, v time.Time) {
	e.add(key, v.Format("2006-01-02 15:04:05.000 MST"))
}

// AddUint implements zapcore.ObjectEncoder.
func (e *Encoder) AddUint(key string, v uint) { e.AddUint64(key, uint64(v)) }

// AddUint64 implements zapcore.ObjectEncoder.
func (e *Encoder) AddUint64(key string, v uint64) { e.add(key, strconv.FormatUint(v, 10)) }

// AddUint32 implements zapcore.ObjectEncoder.
func (e *Encoder) AddUint32(key string, v uint32) { e.AddUint64(key, uint64(v)) }

// AddUint16 implements zapcore.ObjectEncoder.
func (e *Encoder) AddUint16(key string, v uint16) { e.AddUint64(key, uint64(v)) }

// AddUint8 implements zapcore.ObjectEncoder.
func (e *Encoder) AddUint8(key string, v uint8) { e.AddUint64(key, uint64(v)) }

// AddUintptr implements zapcore.ObjectEncoder.
func (e *Encoder) AddUintptr(key string, v uintptr) { e.AddUint64(key, uint64(v)) }

// AddReflected implements zapcore.ObjectEncoder.
func (e *Encoder) AddReflected(key string, v any) error {
	e.add(key, fmt.Sprint(v))
	return nil
}

// OpenNamespace implements zapcore.ObjectEncoder: the keys that follow are
// written as key.name.
func (e *Encoder) OpenNamespace(key string) { e.ns += key + "." }
