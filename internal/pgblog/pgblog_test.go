package pgblog

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logged is what a logger with the pgbouncer encoder writes for fn.
func logged(t *testing.T, withTime bool, fn func(log *zap.Logger)) string {
	t.Helper()
	var buf bytes.Buffer
	log := zap.New(zapcore.NewCore(New(4242, withTime), zapcore.AddSync(&buf), zapcore.DebugLevel))
	fn(log)
	return buf.String()
}

// TestLines: the events PgBouncer logs too come out in its words, with its
// socket prefix; the suite of PgBouncer searches them with these regexes.
func TestLines(t *testing.T) {
	client := func(log *zap.Logger) *zap.Logger {
		return log.With(zap.Uint64("session", 31), zap.String("client", "127.0.0.1:50312"), zap.String("database", "app"), zap.String("user", "alice"))
	}
	pool := func(log *zap.Logger) *zap.Logger {
		return log.With(zap.String("database", "app"), zap.String("user", "alice"), zap.String("server", "10.0.0.9:5432"))
	}
	for _, tc := range []struct {
		name string
		log  func(*zap.Logger)
		want string
	}{
		{"refused login", func(l *zap.Logger) {
			client(l).Info("client login refused", zap.String("sqlstate", "3D000"), zap.String("reason", "no such database: nosuchdb"))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 closing because: no such database: nosuchdb (age=0s)\n"},
		{"wrong password", func(l *zap.Logger) {
			client(l).Info("client authentication failed", zap.String("method", "md5"))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 closing because: password authentication failed (age=0s)\n"},
		{"client left", func(l *zap.Logger) {
			client(l).Info("client disconnected", zap.Duration("duration", 2500*time.Millisecond))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 closing because: client close request (age=2s)\n"},
		{"client reset", func(l *zap.Logger) {
			client(l).Info("client disconnected", zap.Duration("duration", time.Second), zap.Error(errors.New("read: connection reset by peer")))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 closing because: client unexpected eof (age=1s)\n"},
		{"shutdown", func(l *zap.Logger) {
			client(l).Info("client disconnected", zap.Duration("duration", 3*time.Second), zap.String("reason", "terminating connection due to administrator command"),
				zap.String("sqlstate", "57P01"), zap.String("detail", "poolerd is shutting down"))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 closing because: server shutting down (age=3s)\n"},
		{"timeout", func(l *zap.Logger) {
			client(l).Info("client disconnected", zap.Duration("duration", 61*time.Second), zap.String("reason", "query timeout"), zap.String("sqlstate", "57014"))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 closing because: query timeout (age=61s)\n"},
		{"login", func(l *zap.Logger) {
			client(l).Info("client connected", zap.String("pool_mode", "transaction"), zap.String("application_name", "psql"))
		}, "LOG C-0x1f: app/alice@127.0.0.1:50312 login attempt: db=app user=alice tls=no\n"},
		{"IPv6 client", func(l *zap.Logger) {
			l.Info("client login refused", zap.Uint64("session", 2), zap.String("client", "[::1]:40000"), zap.String("reason", "x"))
		}, "LOG C-0x2: (nodb)/(nouser)@[::1]:40000 closing because: x (age=0s)\n"},
		{"server opened", func(l *zap.Logger) {
			pool(l).Info("server connection opened", zap.Uint64("conn_id", 42), zap.String("host", "10.0.0.7:5432"), zap.String("local", "10.0.0.5:41000"), zap.Uint32("backend_pid", 77))
		}, "LOG S-0x2a: app/alice@10.0.0.7:5432 new connection to server (from 10.0.0.5:41000)\n"},
		{"server closed", func(l *zap.Logger) {
			pool(l).Info("server connection closed", zap.Uint64("conn_id", 42), zap.String("host", "10.0.0.7:5432"), zap.String("reason", "idle_timeout"), zap.Duration("age", 601*time.Second))
		}, "LOG S-0x2a: app/alice@10.0.0.7:5432 closing because: server idle timeout (age=601s)\n"},
		{"server refused login", func(l *zap.Logger) {
			pool(l).Warn("server connect failed", zap.Int("attempt", 1), zap.Error(errors.New(`server: FATAL: database "nope" does not exist (SQLSTATE 3D000)`)))
		}, "WARNING server login failed: FATAL database \"nope\" does not exist\n"},
		{"server unreachable", func(l *zap.Logger) {
			pool(l).Warn("server connect failed", zap.Error(errors.New("dial tcp 10.0.0.9:5432: connect: connection refused")))
		}, "WARNING closing because: connect failed (age=0s) error=\"dial tcp 10.0.0.9:5432: connect: connection refused\"\n"},
		{"auto-database", func(l *zap.Logger) {
			l.Info("registered new auto-database", zap.String("database", "p9"))
		}, "LOG registered new auto-database: p9\n"},
		{"auth_query failed", func(l *zap.Logger) {
			l.Error("auth_query failed", zap.String("database", "postgres"), zap.String("user", "stats"),
				zap.Error(errors.New(`ERROR: relation "not_pg_shadow" does not exist (SQLSTATE 42P01)`)))
		}, "ERROR auth_query for user stats failed: ERROR: relation \"not_pg_shadow\" does not exist (SQLSTATE 42P01)\n"},
		{"auth_query login failed", func(l *zap.Logger) {
			l.Error("auth_query failed", zap.String("database", "nosuchdb"), zap.String("user", "u"),
				zap.Error(errors.New(`log in as auth_user: server: FATAL: database "nosuchdb" does not exist (SQLSTATE 3D000)`)))
		}, "ERROR server login failed: FATAL database \"nosuchdb\" does not exist\n"},
		{"replication login", func(l *zap.Logger) {
			l.Warn("replication server login failed", zap.String("error", "must be superuser or replication role to start walsender"))
		}, "WARNING closing because: login failed (age=0s) must be superuser or replication role to start walsender\n"},
		{"reload failed", func(l *zap.Logger) {
			l.Error("configuration reload failed; keeping the running configuration", zap.Error(errors.New("config x.ini: auth_dbname \"pgbouncer\": cannot use the reserved \"pgbouncer\" database\n  as an auth_dbname")))
		}, "ERROR configuration reload failed; keeping the running configuration: config x.ini: auth_dbname \"pgbouncer\": cannot use the reserved \"pgbouncer\" database as an auth_dbname\n"},
		{"reload failed on a TLS file", func(l *zap.Logger) {
			l.Error("configuration reload failed; keeping the running configuration", zap.Error(errors.New("config x.ini: client_tls_cert_file / client_tls_key_file: open /c/dummy.crt: no such file or directory")))
		}, "ERROR TLS setup failed: config x.ini: client_tls_cert_file / client_tls_key_file: open /c/dummy.crt: No such file or directory (configuration reload failed; keeping the running configuration)\n"},
		{"DNS failed", func(l *zap.Logger) {
			l.Info("server of the entry failed; trying its next", zap.String("host", "nohost:5432"),
				zap.Error(errors.New("dial tcp: lookup nohost on 127.0.0.53:53: no such host")))
		}, "LOG closing because: server DNS lookup failed (age=0s) error=\"dial tcp: lookup nohost on 127.0.0.53:53: no such host\"\n"},
		{"certificate", func(l *zap.Logger) {
			l.Warn("server connect failed", zap.Error(errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority")))
		}, "WARNING closing because: TLS handshake failed: certificate verify failed (age=0s) error=\"tls: failed to verify certificate: x509: certificate signed by unknown authority\"\n"},
		{"SCRAM failed", func(l *zap.Logger) {
			l.Info("client authentication failed", zap.String("method", "scram-sha-256"))
		}, "LOG closing because: SASL authentication failed (age=0s)\n"},
		{"idle pool", func(l *zap.Logger) {
			l.Info("idle pool removed", zap.String("database", "p0"), zap.String("user", "bouncer"),
				zap.Duration("age", 3500*time.Millisecond), zap.String("reason", "pool_idle_timeout"))
		}, "LOG cleaning up idle pool for user bouncer on db p0 because: pool idle timeout (age= 3s)\n"},
		{"other events", func(l *zap.Logger) {
			pool(l).Warn("pool health changed", zap.String("from", "healthy"), zap.String("to", "unhealthy"), zap.String("reason", "connect failed: x"), zap.Int("open", 0))
		}, "WARNING pool health changed database=app user=alice server=10.0.0.9:5432 from=healthy to=unhealthy reason=\"connect failed: x\" open=0\n"},
		{"levels", func(l *zap.Logger) {
			l.Debug("d")
			l.Error("e", zap.Strings("settings", []string{"a", "b"}), zap.Bool("ok", false))
		}, "DEBUG d\nERROR e settings=\"[a b]\" ok=false\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := logged(t, false, tc.log); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// TestTimeAndPID: a line for a file or stderr starts as PgBouncer's, with
// the time to the millisecond and the process id; one for syslog without.
func TestTimeAndPID(t *testing.T) {
	at := time.Date(2026, 12, 2, 18, 5, 6, 789_000_000, time.UTC)
	enc := New(4242, true)
	b, err := enc.EncodeEntry(zapcore.Entry{Level: zapcore.InfoLevel, Time: at, Message: "stats"}, []zapcore.Field{zap.Int("xacts", 3)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "2026-12-02 18:05:06.789 UTC [4242] LOG stats xacts=3\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// The fields of one entry do not stay with the encoder.
	b2, _ := enc.EncodeEntry(zapcore.Entry{Level: zapcore.InfoLevel, Time: at, Message: "stats"}, nil)
	if strings.Contains(b2.String(), "xacts") {
		t.Errorf("a field of an earlier entry came back: %q", b2.String())
	}
}

// TestServerReason: every eviction and recycle reason poolerd has reads as
// PgBouncer's words where PgBouncer has some, and never as an identifier.
func TestServerReason(t *testing.T) {
	for reason, want := range map[string]string{
		"server_closed": "server conn crashed?", "max_lifetime": "server lifetime over", "idle_timeout": "server idle timeout",
		"reconnect": "database configuration changed", "make_room": "evicted", "client_left_mid_request": "unclean server",
		"temp_schema": "temp schema", "": "server connection closed",
	} {
		if got := ServerReason(reason); got != want {
			t.Errorf("ServerReason(%q) = %q, want %q", reason, got, want)
		}
	}
}
