package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// Session mode passes the real backend through (issue 13, item 3): the pid
// in a session-mode client's BackendKeyData is its server connection's own,
// so that pg_backend_pid(), pg_stat_activity, pg_terminate_backend and cancel
// requests all agree on which backend is the client's. The key is poolerd's,
// one per client, as the backend serves the next client after this one.
// Transaction mode keeps poolerd's own pids.

func sessionMode(c *config.Config) { c.PoolMode = config.PoolSession }

// backendPID is what the server behind c says its pid is.
func backendPID(t *testing.T, ctx context.Context, c *pgx.Conn) uint32 {
	t.Helper()
	return uint32(lcBackendPID(t, ctx, c))
}

// runOn starts sql on c in the background and waits until pg_stat_activity
// (through direct) shows it running on backend pid. The returned channel
// gets the query's result; the query is over before the test ends (its
// cleanup runs before that of c, registered earlier).
func runOn(t *testing.T, c, direct *pgx.Conn, pid uint32, sql string) <-chan error {
	t.Helper()
	qctx, stop := context.WithCancel(context.Background())
	errc, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		_, err := c.Exec(qctx, sql)
		errc <- err
	}()
	t.Cleanup(func() { stop(); <-done })
	ctx := ctxTimeout(t, 10*time.Second)
	eventually(t, 5*time.Second, "the query to run on backend "+fmt.Sprint(pid), func() bool {
		var n int
		err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query = $2",
			pid, sql).Scan(&n)
		return err == nil && n == 1
	})
	return errc
}

// The pid in a session-mode client's BackendKeyData is its backend's, from
// login on: pg_stat_activity lists the backend under that pid with the
// client's application_name before the client sent anything, and two
// clients have two backends.
func TestSessionKeyIsTheBackends(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, sessionMode)
	ctx := ctxTimeout(t, 20*time.Second)
	direct := relayDirect(t)
	app := relayName("sesskey")
	a := p.connect(t, "application_name="+app)
	b := p.connect(t)

	eventually(t, 5*time.Second, "pg_stat_activity to list a's pid with a's application_name", func() bool {
		var name, user string
		err := direct.QueryRow(ctx, "SELECT application_name, usename FROM pg_stat_activity WHERE pid = $1",
			a.PgConn().PID()).Scan(&name, &user)
		return err == nil && name == app && user == pgtest.RoleApp
	})
	// Each holds its server connection from login: a pool of two, both
	// in use, before any query.
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Active != 2 {
		t.Fatalf("two session-mode clients logged in: %+v, want 2 active server connections", st)
	}
	pidA, pidB := backendPID(t, ctx, a), backendPID(t, ctx, b)
	if pidA != a.PgConn().PID() || pidB != b.PgConn().PID() {
		t.Fatalf("BackendKeyData pids %d and %d, backends %d and %d", a.PgConn().PID(), b.PgConn().PID(), pidA, pidB)
	}
	if pidA == pidB {
		t.Fatalf("two session-mode clients share backend %d", pidA)
	}
	var name string
	if err := a.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil || name != app {
		t.Fatalf("a's application_name %q (%v), want %q", name, err, app)
	}
}

// A cancel request from a session-mode client, sent to poolerd with the
// backend's pid and the client's key, cancels the client's query (57014);
// one with the right pid and a wrong key does nothing.
func TestSessionKeyCancel(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, sessionMode)
	ctx := ctxTimeout(t, 30*time.Second)
	direct := relayDirect(t)
	a := p.connect(t)
	pid := a.PgConn().PID()
	// The client's pid is the backend its query runs on.
	errc := runOn(t, a, direct, pid, fmt.Sprintf("SELECT pg_sleep(10) /* %s */", relayName("cancel")))

	wrong := binary.BigEndian.AppendUint32(nil, binary.BigEndian.Uint32(a.PgConn().SecretKey())+1)
	sendCancel(t, p.addr, pid, wrong)
	select {
	case err := <-errc:
		t.Fatalf("a cancel request with a wrong key ended the query: %v", err)
	case <-time.After(300 * time.Millisecond):
	}

	start := time.Now()
	if err := a.PgConn().CancelRequest(ctx); err != nil {
		t.Fatalf("cancel request: %v", err)
	}
	select {
	case err := <-errc:
		if code := pgCode(err); code != "57014" {
			t.Fatalf("want query_canceled (57014), got %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the cancel request did not stop the query")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the cancel took %s", d)
	}
	if got := backendPID(t, ctx, a); got != pid {
		t.Fatalf("after the cancel the session runs on backend %d, want %d", got, pid)
	}
}

// pg_terminate_backend reaches a session-mode client's backend both from
// the client itself and from a tool that takes the pid the client reports;
// either way the client gets the server's FATAL and its session ends.
func TestSessionKeyTerminate(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, sessionMode)
	ctx := ctxTimeout(t, 20*time.Second)
	direct := relayDirect(t)
	a := p.connect(t)
	b := p.connect(t)

	_, err := a.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57P01" || pe.Severity != "FATAL" {
		t.Fatalf("pg_terminate_backend(pg_backend_pid()): %v, want the server's FATAL 57P01", err)
	}
	eventually(t, 5*time.Second, "a's connection to close", a.IsClosed)

	var ok bool
	if err := direct.QueryRow(ctx, "SELECT pg_terminate_backend($1)", b.PgConn().PID()).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) from another connection: %v %v; want true", b.PgConn().PID(), ok, err)
	}
	_, err = b.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatal("b's query ran after its backend was terminated")
	}
	if errors.As(err, &pe) && pe.Code != "57P01" {
		t.Fatalf("b after its backend was terminated: %v, want 57P01 or a closed connection", err)
	}
	p.waitNoActive(t, pgtest.DBApp)
}

// Transaction mode still issues poolerd's own keys: the client's pid is not
// a backend's, and it lies above the pids an operating system gives
// PostgreSQL's backends.
func TestSessionKeyTransactionModeOwnKey(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	ctx := ctxTimeout(t, 20*time.Second)
	c := p.connect(t, txExecMode)
	pid := c.PgConn().PID()
	if got := backendPID(t, ctx, c); got == pid {
		t.Fatalf("transaction-mode client given its backend's pid %d", pid)
	}
	if pid < 1<<22 {
		t.Fatalf("transaction-mode pid %d is in the range of real pids (below %d)", pid, 1<<22)
	}
	p.waitNoActive(t, pgtest.DBApp) // an idle transaction-mode client holds none
}

// A cancel request with the key of a client that has left does not reach
// the next client of the same backend, though that client has the same pid:
// each client has a key of its own.
func TestSessionKeyStaleCancel(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		sessionMode(c)
		c.MaxSize = 1
	})
	ctx := ctxTimeout(t, 30*time.Second)
	direct := relayDirect(t)
	a, err := pgx.Connect(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	pid, oldKey := a.PgConn().PID(), a.PgConn().SecretKey()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b := p.connect(t)
	if b.PgConn().PID() != pid {
		t.Fatalf("the next client got pid %d, want %d (the pool's only backend)", b.PgConn().PID(), pid)
	}
	if bytes.Equal(b.PgConn().SecretKey(), oldKey) {
		t.Fatal("the next client of the backend got the key of the client before it")
	}

	errc := runOn(t, b, direct, pid, fmt.Sprintf("SELECT pg_sleep(1.5) /* %s */", relayName("stale")))
	sendCancel(t, p.addr, pid, oldKey)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("the cancel request of the client that left hit the next client's query: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b's query did not finish")
	}
}

// A session-mode client holds its server connection from login: a login
// finding the pool full waits (in the pool's queue) for one, and is refused
// with FATAL 53300 after checkout_timeout; a client that leaves without a
// query gives its connection back clean.
func TestSessionKeyPoolSizing(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		sessionMode(c)
		c.MaxSize = 1
		c.CheckoutTimeout = time.Second
	})
	ctx := ctxTimeout(t, 30*time.Second)
	a, err := pgx.Connect(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	pidA := a.PgConn().PID()
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Active != 1 || st.Total != 1 {
		t.Fatalf("one session-mode client logged in: %+v, want its server connection active", st)
	}

	_, err = pgx.Connect(ctx, p.appDSN())
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "53300" || pe.Severity != "FATAL" || !strings.Contains(pe.Hint, "max_size") {
		t.Fatalf("login with the pool full: %v, want FATAL 53300 with a hint naming max_size", err)
	}

	type result struct {
		c   *pgx.Conn
		err error
	}
	waiting := make(chan result, 1)
	go func() {
		c, err := pgx.Connect(ctx, p.appDSN())
		waiting <- result{c, err}
	}()
	eventually(t, 5*time.Second, "the second login to wait for a server connection", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Waiting == 1
	})
	if err := a.Close(ctx); err != nil { // leaves without having sent a query
		t.Fatal(err)
	}
	r := <-waiting
	if r.err != nil {
		t.Fatalf("login waiting for the connection a left: %v", r.err)
	}
	defer r.c.Close(context.Background())
	if r.c.PgConn().PID() != pidA {
		t.Fatalf("the waiting login got backend %d, want %d (the only one, given back clean)", r.c.PgConn().PID(), pidA)
	}
	if got := backendPID(t, ctx, r.c); got != pidA {
		t.Fatalf("pg_backend_pid %d, want %d", got, pidA)
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Total != 1 {
		t.Fatalf("after the hand-over: %+v, want the one connection reused", st)
	}
}

// A session-mode client that never sent a query is idle: shutdown ends it at
// once with 57P01, as it does a transaction-mode one.
func TestSessionKeyShutdownIdle(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, sessionMode)
	c := dialFE(t, p.addr)
	c.login(pgtest.RoleApp, pgtest.Password)
	eventually(t, 5*time.Second, "the client to hold its server connection", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Active == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown with an idle session-mode client took %s", d)
	}
	e := c.expectError()
	if e.Code != "57P01" || e.Severity != "FATAL" {
		t.Errorf("idle session-mode client got %s %s %s, want FATAL 57P01", e.Severity, e.Code, e.Message)
	}
	c.expectClosed(3 * time.Second)
}
