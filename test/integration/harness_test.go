// Package integration runs poolerd in-process against a real PostgreSQL
// started by the test harness (test/pgtest), and talks to it with real
// clients: pgx, lib/pq-style raw protocol, psql and pgbench.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/console"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/test/pgtest"
)

// pg is the PostgreSQL server every test in this package uses.
var pg *pgtest.Server

func TestMain(m *testing.M) {
	var err error
	pg, err = pgtest.Start(pgtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: cannot start PostgreSQL:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := pg.Cleanup(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: cleanup:", err)
	}
	// No log line of any poolerd the tests ran holds a secret.
	if code == 0 {
		if found := secretsInLogs(); len(found) > 0 {
			fmt.Fprintln(os.Stderr, "integration: secrets in poolerd's logs:\n"+strings.Join(found, "\n"))
			code = 1
		}
	}
	// Every goroutine poolerd started (sessions, server readers, pool
	// maintainers) must have ended with its instance's shutdown.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// instance is one poolerd running in the test process.
type instance struct {
	srv  *proxy.Server
	addr string
	cfg  *config.Config
	logs *logBuffer
	// dirtyHandoffs: the test leaves dirty server connections on purpose;
	// the hand-off check's WARN does not fail it (see checkHandoffs).
	dirtyHandoffs bool
}

// handoffDirtyLog is the WARN of the hand-off check (proxy handoff.go).
const handoffDirtyLog = "hand-off check: server connection holds session state poolerd did not expect"

// testVerifyHandoff sets verify_handoff for a test's poolerd: always,
// unless POOLERD_TEST_VERIFY_HANDOFF says otherwise (off, sample).
func testVerifyHandoff(cfg *config.Config) {
	cfg.VerifyHandoff = config.VerifyHandoffAlways
	if v := os.Getenv("POOLERD_TEST_VERIFY_HANDOFF"); v != "" {
		cfg.VerifyHandoff = v
	}
}

// checkHandoffs fails t if p's log holds the hand-off check's WARN: a
// server connection about to pass to another client held session state
// poolerd did not expect, which every test must leave none of.
func checkHandoffs(t *testing.T, p *instance) {
	t.Helper()
	if p.dirtyHandoffs {
		return
	}
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(line, handoffDirtyLog) {
			t.Errorf("dirty server connection at a hand-off: %s", line)
		}
	}
}

// allLogs keeps every poolerd log of the run, for secretsInLogs.
var allLogs struct {
	mu   sync.Mutex
	bufs []*logBuffer
}

// newLogBuffer returns a log buffer that secretsInLogs will read.
func newLogBuffer() *logBuffer {
	l := &logBuffer{}
	allLogs.mu.Lock()
	allLogs.bufs = append(allLogs.bufs, l)
	allLogs.mu.Unlock()
	return l
}

// secretsInLogs looks through every poolerd log of the run for what must
// never be logged: the test roles' password (as a field value or in a
// connection URL), the superuser's password, SCRAM secrets and private
// keys. It returns one line per finding.
func secretsInLogs() []string {
	allLogs.mu.Lock()
	defer allLogs.mu.Unlock()
	var found []string
	for _, l := range allLogs.bufs {
		found = append(found, secretsIn(l.String())...)
	}
	return found
}

// secretsIn lists the lines of log text that hold a secret (see
// secretsInLogs).
func secretsIn(text string) []string {
	needles := []string{`"` + pgtest.Password + `"`, ":" + pgtest.Password + "@", "=" + pgtest.Password + " ",
		"SCRAM-SHA-256$", "PRIVATE KEY"}
	if u, err := url.Parse(pg.SuperDSN("postgres")); err == nil {
		if pw, ok := u.User.Password(); ok {
			needles = append(needles, pw)
		}
	}
	var found []string
	for _, line := range strings.Split(text, "\n") {
		for _, n := range needles {
			if strings.Contains(line, n) {
				found = append(found, fmt.Sprintf("%q in: %s", n, line))
			}
		}
	}
	return found
}

// logBuffer collects poolerd's log output for assertions and for printing
// when a test fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) Sync() error { return nil }

// String returns everything logged so far.
func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startPoolerd starts poolerd in front of pg in sidecar form (upstream
// app:secret) with a small pool; mutate adjusts the configuration before it
// is validated. The instance is shut down when the test ends.
func startPoolerd(t *testing.T, mutate func(c *config.Config)) *instance {
	t.Helper()
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	cfg.MaxSize = 5
	cfg.CheckoutTimeout = 10 * time.Second
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.LogLevel = "debug"
	testVerifyHandoff(&cfg)
	if v := os.Getenv("POOLERD_TEST_EVENT_LOOPS"); v != "" {
		cfg.EventLoops = v // make test runs the relay's tests again with event_loops off
	}
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("invalid test configuration: %v", err)
	}
	logs := newLogBuffer()
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, logs, zapcore.DebugLevel))
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	srv := proxy.New(&cfg, log)
	srv.SetConsole(console.New(srv, nil))
	srv.Warm()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	inst := &instance{srv: srv, addr: ln.Addr().String(), cfg: &cfg, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		checkHandoffs(t, inst)
		if t.Failed() {
			dumpLog(t, "poolerd log", logs.String())
		}
	})
	return inst
}

// dsn is a connection URL for poolerd; extra are query parameters such as
// "application_name=x".
func (p *instance) dsn(user, password, db string, extra ...string) string {
	u := url.URL{Scheme: "postgres", Host: p.addr, Path: "/" + db}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	q := url.Values{"sslmode": {"disable"}}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		q.Set(k, v)
	}
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

// appDSN is the DSN of the default user and database.
func (p *instance) appDSN(extra ...string) string {
	return p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBApp, extra...)
}

// connect opens a pgx connection through poolerd as app to app.
func (p *instance) connect(t *testing.T, extra ...string) *pgx.Conn {
	t.Helper()
	return connectDSN(t, p.appDSN(extra...))
}

func connectDSN(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// directDSN connects to PostgreSQL itself, bypassing poolerd.
func directDSN(db string) string {
	return pg.DSN(pgtest.RoleApp, pgtest.Password, db)
}

// ctx returns a context that ends with the test or after d.
func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// poolStats returns the stats of the pool for (database, user).
func (p *instance) poolStats(t *testing.T, database, user string) proxy.PoolStats {
	t.Helper()
	for _, ps := range p.srv.Pools() {
		if ps.Database == database && ps.User == user {
			return ps
		}
	}
	t.Fatalf("no pool for %s/%s", database, user)
	return proxy.PoolStats{}
}

// logTailLines is how many of a failed test's last poolerd log lines go into
// the test output. The whole log goes to a file: a failure's own message
// must stay in the last part of the output, which is all CI shows.
const logTailLines = 80

// dumpLog reports what poolerd logged in a failed test t: the last
// logTailLines lines in the test output, the whole log in a file under the
// system temp dir, whose path it names.
func dumpLog(t *testing.T, what, log string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	path := "(not written)"
	dir := os.Getenv("POOLERD_TEST_LOG_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	if f, err := os.CreateTemp(dir, "poolerd-"+strings.ReplaceAll(t.Name(), "/", "_")+"-*.log"); err == nil {
		_, werr := f.WriteString(log)
		if cerr := f.Close(); werr == nil && cerr == nil {
			path = f.Name()
		}
	}
	if len(lines) <= logTailLines {
		t.Logf("%s (whole log in %s):\n%s", what, path, log)
		return
	}
	t.Logf("%s, last %d of %d lines (whole log in %s):\n%s", what, logTailLines, len(lines), path,
		strings.Join(lines[len(lines)-logTailLines:], "\n"))
}
