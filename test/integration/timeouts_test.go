package integration

// Tests of poolerd's session timeouts (internal/proxy/watchdog.go):
// query_timeout (cancel, then close after the cancel grace), its per-database
// and per-user overrides, transaction_timeout, idle_transaction_timeout,
// client_idle_timeout and server_response_timeout, and how they interact
// with each other and with shutdown (the four scenarios of the timeout
// precedence ADR, seed 002, as TestPrecedence*).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/test/faultproxy"
	"github.com/poolerd/poolerd/test/pgtest"
)

// ---------------------------------------------------------------------------
// Helpers (prefixed "to"; shared with leak_test.go).

// toDur returns a pointer to d, for config.Overrides.
func toDur(d time.Duration) *time.Duration { return &d }

// toLogEntry is one line of poolerd's console log.
type toLogEntry struct {
	Level, Msg string
	Fields     map[string]any
	Raw        string
}

// str returns field k as a string ("" if absent); numbers are formatted.
func (e toLogEntry) str(k string) string {
	switch v := e.Fields[k].(type) {
	case string:
		return v
	case float64:
		return fmt.Sprintf("%g", v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// dur returns field k parsed as a duration.
func (e toLogEntry) dur(t *testing.T, k string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(e.str(k))
	if err != nil {
		t.Fatalf("log field %s of %q is not a duration: %v", k, e.Raw, err)
	}
	return d
}

// toLogEntries returns poolerd's log lines whose message starts with
// prefix, with their structured fields (the console encoder writes
// "time\tLEVEL\tmessage\t{json fields}").
func toLogEntries(t *testing.T, p *instance, prefix string) []toLogEntry {
	t.Helper()
	var out []toLogEntry
	for _, line := range strings.Split(p.logs.String(), "\n") {
		parts := strings.Split(line, "\t")
		if len(parts) < 3 || !strings.HasPrefix(parts[2], prefix) {
			continue
		}
		e := toLogEntry{Level: parts[1], Msg: parts[2], Raw: line, Fields: map[string]any{}}
		if last := parts[len(parts)-1]; len(parts) > 3 && strings.HasPrefix(last, "{") {
			if err := json.Unmarshal([]byte(last), &e.Fields); err != nil {
				t.Fatalf("cannot parse the fields of log line %q: %v", line, err)
			}
		}
		out = append(out, e)
	}
	return out
}

// toStartProxy starts a fault proxy in front of PostgreSQL, closed when the
// test ends (after poolerd, which is started later).
func toStartProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	fp, err := faultproxy.Start(pg.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fp.Close() })
	return fp
}

// toStartViaProxy starts poolerd with its upstream routed through fp. Held
// responses are released when the test ends, before poolerd shuts down.
func toStartViaProxy(t *testing.T, fp *faultproxy.Proxy, mutate func(c *config.Config)) *instance {
	t.Helper()
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = "postgres://app:secret@" + fp.Addr() + "/app?sslmode=disable"
		if mutate != nil {
			mutate(c)
		}
	})
	t.Cleanup(func() { fp.HoldResponses(false) })
	return p
}

// toPgErr returns err as a PostgreSQL error, failing the test otherwise.
func toPgErr(t *testing.T, err error, what string) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: want a PostgreSQL error, got %v", what, err)
	}
	return pe
}

// toSuper opens a superuser connection straight to PostgreSQL.
func toSuper(t *testing.T) *pgx.Conn {
	t.Helper()
	return connectDSN(t, pg.SuperDSN("postgres"))
}

// toSeenByServer reports whether PostgreSQL has received the statement sql
// (the last statement of some backend is exactly sql).
func toSeenByServer(t *testing.T, super *pgx.Conn, sql string) bool {
	t.Helper()
	var n int
	if err := super.QueryRow(ctxTimeout(t, 5*time.Second),
		"SELECT count(*) FROM pg_stat_activity WHERE query = $1", sql).Scan(&n); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return n > 0
}

// toTerminateBackends ends the backends whose last statement contains
// marker (cleanup of a leftover query).
func toTerminateBackends(marker string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = pg.Exec(ctx, "postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE "+
		"'%"+marker+"%' AND pid <> pg_backend_pid()")
}

// toRowTable creates a table with one row (id 1, v 0) and returns its name.
func toRowTable(t *testing.T) string {
	t.Helper()
	tbl := relayTable(t, "id int PRIMARY KEY, v int NOT NULL")
	if _, err := relayDirect(t).Exec(ctxTimeout(t, 10*time.Second), "INSERT INTO "+tbl+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	return tbl
}

// toAwaitFatal reads from a raw client until an ErrorResponse arrives
// (within d) and checks that it is FATAL code and that the connection is then
// closed. It returns the error and when it arrived.
func toAwaitFatal(t *testing.T, c *feConn, d time.Duration, code string) (*pgproto3.ErrorResponse, time.Time) {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	for {
		m, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("no FATAL %s within %s: %v", code, d, err)
		}
		if e, ok := m.(*pgproto3.ErrorResponse); ok {
			at := time.Now()
			cp := *e
			if cp.Severity != "FATAL" || cp.Code != code {
				t.Fatalf("got %s %s %q, want FATAL %s", cp.Severity, cp.Code, cp.Message, code)
			}
			c.expectClosed(3 * time.Second)
			return &cp, at
		}
		t.Fatalf("got %s while waiting for FATAL %s", describeMsg(m), code)
	}
}

// toCollect reads messages from a raw client up to ReadyForQuery (within d)
// and describes them.
func toCollect(t *testing.T, c *feConn, d time.Duration) []string {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = c.nc.SetReadDeadline(time.Now().Add(20 * time.Second)) }()
	var out []string
	for {
		m, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("receive after %v: %v", out, err)
		}
		out = append(out, describeMsg(m))
		if isRFQ(m) {
			return out
		}
	}
}

// toEventuallyPool waits up to 5s for the app/app pool's stats to satisfy
// cond, and shows them if they never do.
func toEventuallyPool(t *testing.T, p *instance, what string, cond func(proxy.PoolStats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
		if cond(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 5s waiting for %s; pool: total %d idle %d active %d opening %d waiting %d",
				what, st.Total, st.Idle, st.Active, st.Opening, st.Waiting)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// toBetween fails the test unless lo <= d <= hi.
func toBetween(t *testing.T, what string, d, lo, hi time.Duration) {
	t.Helper()
	if d < lo || d > hi {
		t.Errorf("%s after %s, want between %s and %s", what, d, lo, hi)
	}
}

// ---------------------------------------------------------------------------
// query_timeout

// A query running longer than query_timeout is cancelled: the client gets
// ERROR 57014 naming query_timeout, keeps its session and its server
// connection, the pool counts one query timeout and the log names the limit
// and the query. Both protocols.
func TestTimeoutQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode pgx.QueryExecMode
		sql  string
		args []any
	}{
		{"simple", pgx.QueryExecModeSimpleProtocol, "SELECT pg_sleep(5) /* to-qt-simple */", nil},
		{"extended", pgx.QueryExecModeExec, "SELECT pg_sleep($1::float8) /* to-qt-extended */", []any{5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startPoolerd(t, func(c *config.Config) {
				c.QueryTimeout = 300 * time.Millisecond
				// The pool's size is counted: a connection in a
				// hand-off check is not idle, so the next query would
				// open another one.
				c.VerifyHandoff = config.VerifyHandoffOff
			})
			c := p.connect(t, txExecMode)
			ctx := ctxTimeout(t, 30*time.Second)
			if _, err := c.Exec(ctx, "SELECT 1", tc.mode); err != nil {
				t.Fatal(err)
			}
			before := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)

			start := time.Now()
			_, err := c.Exec(ctx, tc.sql, append([]any{tc.mode}, tc.args...)...)
			elapsed := time.Since(start)
			pe := toPgErr(t, err, "query past query_timeout")
			if pe.Code != "57014" || pe.Severity != "ERROR" || !strings.Contains(pe.Message, "query_timeout") {
				t.Fatalf("got %s %s %q, want ERROR 57014 naming query_timeout", pe.Severity, pe.Code, pe.Message)
			}
			if !strings.Contains(pe.Message, "300ms") {
				t.Errorf("message %q does not give the limit (300ms)", pe.Message)
			}
			toBetween(t, "the query was cancelled", elapsed, 250*time.Millisecond, 2500*time.Millisecond)

			// The session goes on, on the same (uncorrupted) connection.
			var n int
			if err := c.QueryRow(ctx, "SELECT 42", tc.mode).Scan(&n); err != nil || n != 42 {
				t.Fatalf("after the timeout: %d, %v", n, err)
			}
			if c.PgConn().IsClosed() {
				t.Fatal("the client was disconnected")
			}
			p.waitNoActive(t, pgtest.DBApp)
			st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
			if got := st.SessionTimeouts["query"]; got != 1 {
				t.Errorf("SessionTimeouts[query] = %d, want 1 (%v)", got, st.SessionTimeouts)
			}
			if st.Total != before.Total {
				t.Errorf("pool has %d connections after the timeout, %d before: a cancelled query must not cost its server connection", st.Total, before.Total)
			}
			found := false
			for _, e := range toLogEntries(t, p, "query timeout reached") {
				if e.str("query") == tc.sql && e.str("query_timeout") == "300ms" {
					found = true
				}
			}
			if !found {
				t.Errorf("no log line names query_timeout (300ms) and the query %q", tc.sql)
			}
		})
	}
}

// When the server does not answer the cancel (its replies are held by the
// fault proxy: the cancel itself reaches PostgreSQL, but its 57014 reply
// never comes back), the server connection is closed after query_timeout
// plus the cancel grace (5s) and the client gets FATAL 57014; nothing stays
// checked out.
func TestTimeoutQueryCancelIgnored(t *testing.T) {
	t.Parallel()
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.QueryTimeout = 300 * time.Millisecond
		// The server is hung right after the first query: its
		// connection's hand-off check would never be answered.
		c.VerifyHandoff = config.VerifyHandoffOff
	})
	c := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 40*time.Second)
	var pid int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		t.Fatal(err)
	}

	fp.HoldResponses(true)
	start := time.Now()
	_, err := c.Exec(ctx, "SELECT pg_sleep(30) /* to-qt-ignored */")
	elapsed := time.Since(start)
	pe := toPgErr(t, err, "query whose cancel is not answered")
	if pe.Code != "57014" || pe.Severity != "FATAL" || !strings.Contains(pe.Message, "query_timeout") ||
		!strings.Contains(pe.Message, "cancel") || !strings.Contains(pe.Message, "closed") {
		t.Fatalf("got %s %s %q, want FATAL 57014 saying the cancel went unanswered and the connection was closed", pe.Severity, pe.Code, pe.Message)
	}
	// query_timeout (300ms) + cancel grace (5s), with a margin for a busy
	// machine. (The client must not also wait for the second CancelRequest
	// poolerd sends before closing the connection: that one may hang as
	// long as the first.)
	toBetween(t, "the client got FATAL 57014", elapsed, 5*time.Second, 8*time.Second)
	fp.HoldResponses(false)

	// Nothing stays checked out, and the connection is closed (the pool
	// may open a replacement: it keeps one connection warm).
	toEventuallyPool(t, p, "no active server connection", func(st proxy.PoolStats) bool { return st.Active == 0 })
	direct := relayDirect(t)
	eventually(t, 5*time.Second, "the timed-out connection's backend to exit", func() bool {
		return backendState(t, direct, pid) == ""
	})
	eventually(t, 5*time.Second, "the proxied connections to close", func() bool { return fp.Conns() <= 1 })
	// One query, one timeout: the cancel and the close after the grace are
	// the same timeout.
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["query"]; got != 1 {
		t.Errorf("SessionTimeouts[query] = %d for one timed-out query, want 1", got)
	}
	// The pool still serves a new client.
	c2 := p.connect(t, txExecMode)
	var pid2 int
	if err := c2.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid2); err != nil {
		t.Fatalf("new client after the timeout: %v", err)
	}
	if pid2 == pid {
		t.Errorf("the timed-out server connection (backend %d) was reused", pid)
	}
}

// query_timeout per database and per user: the global value is off; the
// database "other" sets 400ms; user app sets 300ms (it wins over other's
// 400ms), user clear_user sets 0 (it wins over other's 400ms: off), user
// scram_user sets nothing (inherits).
func TestTimeoutQueryOverrides(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.QueryTimeout = 0
		c.Databases = []config.Database{{Name: pgtest.DBOther,
			Overrides: config.Overrides{QueryTimeout: toDur(400 * time.Millisecond)}}}
		c.Users = []config.User{
			// app's password comes from the upstream URL.
			{Name: pgtest.RoleApp, Overrides: config.Overrides{QueryTimeout: toDur(300 * time.Millisecond)}},
			{Name: pgtest.RoleSCRAM, Password: pgtest.Password},
			{Name: pgtest.RoleClear, Password: pgtest.Password, Overrides: config.Overrides{QueryTimeout: toDur(0)}},
		}
	})
	cases := []struct {
		user, db string
		limit    string // "" = not cancelled
	}{
		{pgtest.RoleApp, pgtest.DBApp, "300ms"},     // user override
		{pgtest.RoleSCRAM, pgtest.DBApp, ""},        // global: off
		{pgtest.RoleSCRAM, pgtest.DBOther, "400ms"}, // database override
		{pgtest.RoleApp, pgtest.DBOther, "300ms"},   // user's 300ms over the database's 400ms
		{pgtest.RoleClear, pgtest.DBOther, ""},      // user's 0 over the database's 400ms
	}
	conns := make([]*pgx.Conn, len(cases))
	for i, tc := range cases {
		conns[i] = connectDSN(t, p.dsn(tc.user, pgtest.Password, tc.db, txExecMode))
	}
	type result struct {
		err     error
		elapsed time.Duration
	}
	results := make([]result, len(cases))
	var wg sync.WaitGroup
	for i := range cases {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			_, err := conns[i].Exec(ctx, "SELECT pg_sleep(1.5)")
			results[i] = result{err, time.Since(start)}
		})
	}
	wg.Wait()
	for i, tc := range cases {
		r := results[i]
		what := fmt.Sprintf("%s@%s", tc.user, tc.db)
		if tc.limit == "" {
			if r.err != nil {
				t.Errorf("%s: pg_sleep(1.5) failed: %v; want no query_timeout", what, r.err)
			}
		} else {
			var pe *pgconn.PgError
			if !errors.As(r.err, &pe) || pe.Code != "57014" || !strings.Contains(pe.Message, "due to query timeout (query_timeout "+tc.limit+")") {
				t.Errorf("%s: got %v after %s, want 57014 naming query_timeout (%s)", what, r.err, r.elapsed, tc.limit)
			} else if r.elapsed > 1400*time.Millisecond {
				t.Errorf("%s: cancelled only after %s", what, r.elapsed)
			}
		}
		want := uint64(0)
		if tc.limit != "" {
			want = 1
		}
		if got := p.poolStats(t, tc.db, tc.user).SessionTimeouts["query"]; got != want {
			t.Errorf("%s: SessionTimeouts[query] = %d, want %d", what, got, want)
		}
	}
}

// ---------------------------------------------------------------------------
// transaction_timeout, idle_transaction_timeout

// A transaction that lasts longer than transaction_timeout ends the client
// with FATAL 25P04, and the row lock it took is released at once.
func TestTimeoutTransaction(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.TransactionTimeout = 500 * time.Millisecond })
	tbl := toRowTable(t)
	direct := relayDirect(t)

	// A raw client takes the row lock and then sends nothing: the FATAL
	// arrives on its own.
	raw := dialFE(t, p.addr)
	raw.login(pgtest.RoleApp, pgtest.Password)
	began := time.Now()
	raw.mustQuery("BEGIN")
	raw.mustQuery("UPDATE " + tbl + " SET v = v + 1 WHERE id = 1")
	e, at := toAwaitFatal(t, raw, 10*time.Second, "25P04")
	if !strings.Contains(e.Message, "transaction_timeout") {
		t.Errorf("message %q does not name transaction_timeout", e.Message)
	}
	toBetween(t, "FATAL 25P04", at.Sub(began), 450*time.Millisecond, 3*time.Second)
	// The lock went with the server connection.
	if d := updateWithLockTimeout(t, direct, tbl, 1, "3s"); d > 2*time.Second {
		t.Errorf("the row lock was released only %s after the timeout", d)
	}
	var v int
	if err := direct.QueryRow(ctxTimeout(t, 5*time.Second), "SELECT v FROM "+tbl+" WHERE id = 1").Scan(&v); err != nil || v != 1 {
		t.Errorf("v = %d (%v), want 1: the timed-out transaction must have rolled back", v, err)
	}

	// A pgx client: BEGIN; SELECT 1; 1s later its next statement fails with
	// the FATAL (or finds the connection closed after it).
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	for _, sql := range []string{"BEGIN", "SELECT 1"} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	time.Sleep(time.Second)
	_, err := c.Exec(ctx, "SELECT 2")
	if err == nil {
		t.Fatal("a statement 1s into a transaction with transaction_timeout 500ms succeeded")
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code != "25P04" || !strings.Contains(pe.Message, "transaction_timeout")) {
		t.Errorf("next statement: got %s %q, want FATAL 25P04 naming transaction_timeout", pe.Code, pe.Message)
	}

	p.waitNoActive(t, pgtest.DBApp)
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if got := st.SessionTimeouts["transaction"]; got != 2 {
		t.Errorf("SessionTimeouts[transaction] = %d, want 2 (%v)", got, st.SessionTimeouts)
	}
}

// A client idle in a transaction longer than idle_transaction_timeout is
// ended with FATAL 25P03; its server connection is discarded (the backend
// exits) and the lock is released. A transaction that keeps working is not
// affected.
func TestTimeoutIdleTransaction(t *testing.T) {
	t.Parallel()
	// 1 s, not less: on a loaded CI machine a query and the 100 ms pause
	// between queries have taken longer than 300 ms.
	p := startPoolerd(t, func(c *config.Config) { c.IdleTransactionTimeout = time.Second })
	tbl := toRowTable(t)
	direct := relayDirect(t)

	// Busy but never idle for 1 s: not ended.
	busy := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := busy.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		if _, err := busy.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("a working transaction was ended: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := busy.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT: %v", err)
	}

	raw := dialFE(t, p.addr)
	raw.login(pgtest.RoleApp, pgtest.Password)
	raw.mustQuery("BEGIN")
	pid := raw.mustQuery("SELECT pg_backend_pid()")[0]
	raw.mustQuery("UPDATE " + tbl + " SET v = v + 1 WHERE id = 1")
	idleSince := time.Now()
	e, at := toAwaitFatal(t, raw, 10*time.Second, "25P03")
	if !strings.Contains(e.Message, "idle_transaction_timeout") {
		t.Errorf("message %q does not name idle_transaction_timeout", e.Message)
	}
	toBetween(t, "FATAL 25P03", at.Sub(idleSince), 900*time.Millisecond, 5*time.Second)
	if d := updateWithLockTimeout(t, direct, tbl, 1, "3s"); d > 2*time.Second {
		t.Errorf("the row lock was released only %s after the timeout", d)
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the idle transaction's backend to exit", func() bool {
		return backendState(t, direct, n) == ""
	})
	p.waitNoActive(t, pgtest.DBApp)
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if got := st.SessionTimeouts["idle_transaction"]; got != 1 {
		t.Errorf("SessionTimeouts[idle_transaction] = %d, want 1 (%v)", got, st.SessionTimeouts)
	}
}

// ---------------------------------------------------------------------------
// client_idle_timeout

// An idle client (outside a transaction) is ended with FATAL 57P05; a client
// that keeps sending queries is not.
func TestTimeoutClientIdle(t *testing.T) {
	t.Parallel()
	// 1 s, not less: on a loaded CI machine a query and the 100 ms pause
	// between queries have taken longer than 300 ms.
	p := startPoolerd(t, func(c *config.Config) { c.ClientIdleTimeout = time.Second })

	idle := dialFE(t, p.addr)
	idle.login(pgtest.RoleApp, pgtest.Password)
	idle.mustQuery("SELECT 1")
	since := time.Now()
	active := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	activeDone := make(chan error, 1)
	go func() {
		// A query every 100 ms for 1.5 s, then one more at once: the
		// client is never idle for client_idle_timeout (the main
		// goroutine may be slow to get to it on a loaded machine).
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
			if _, err := active.Exec(ctx, "SELECT 1"); err != nil {
				activeDone <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := active.Exec(ctx, "SELECT 2"); err != nil {
			activeDone <- fmt.Errorf("active client after 1.5s: %w", err)
			return
		}
		activeDone <- nil
	}()

	e, at := toAwaitFatal(t, idle, 10*time.Second, "57P05")
	if !strings.Contains(e.Message, "client_idle_timeout") {
		t.Errorf("message %q does not name client_idle_timeout", e.Message)
	}
	toBetween(t, "FATAL 57P05", at.Sub(since), 900*time.Millisecond, 4*time.Second)
	if err := <-activeDone; err != nil {
		t.Fatalf("a client querying every 100ms was ended: %v", err)
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["client_idle"]; got != 1 {
		t.Errorf("SessionTimeouts[client_idle] = %d, want 1", got)
	}
}

// A client whose last query ran longer than client_idle_timeout and which
// then stays idle must still be ended: idleness starts when it got its
// result, and the limit keeps applying.
func TestTimeoutClientIdleAfterLongQuery(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ClientIdleTimeout = 300 * time.Millisecond })
	raw := dialFE(t, p.addr)
	raw.login(pgtest.RoleApp, pgtest.Password)
	// Waiting for a result is not being idle.
	if rows := raw.mustQuery("SELECT pg_sleep(0.8)::text || 'done'"); len(rows) != 1 || rows[0] != "done" {
		t.Fatalf("long query: %v", rows)
	}
	since := time.Now()
	e, at := toAwaitFatal(t, raw, 5*time.Second, "57P05")
	if !strings.Contains(e.Message, "client_idle_timeout") {
		t.Errorf("message %q does not name client_idle_timeout", e.Message)
	}
	if d := at.Sub(since); d > 2*time.Second {
		t.Errorf("FATAL 57P05 only %s after the client became idle", d)
	}
}

// ---------------------------------------------------------------------------
// server_response_timeout

// A server that receives a query but sends nothing back for
// server_response_timeout is declared hung: the client gets ERROR 08007
// naming the limit (the query may have run) and keeps its session, and the
// server connection is closed.
func TestTimeoutServerResponse(t *testing.T) {
	t.Parallel()
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.ServerResponseTimeout = 500 * time.Millisecond
		// The server is hung right after the first query: its
		// connection's hand-off check would never be answered.
		c.VerifyHandoff = config.VerifyHandoffOff
	})
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	var pid int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if n := fp.Conns(); n != 1 {
		t.Fatalf("%d proxied server connections, want 1", n)
	}

	fp.HoldResponses(true)
	start := time.Now()
	_, err := c.Exec(ctx, "SELECT 1 /* to-sr-hung */")
	elapsed := time.Since(start)
	pe := toPgErr(t, err, "query to a hung server")
	if pe.Code != "08007" || pe.Severity != "ERROR" || !strings.Contains(pe.Message, "server_response_timeout") {
		t.Fatalf("got %s %s %q, want ERROR 08007 naming server_response_timeout", pe.Severity, pe.Code, pe.Message)
	}
	toBetween(t, "ERROR 08007", elapsed, 450*time.Millisecond, 2500*time.Millisecond)
	// The hung connection is closed (the pool may already be opening a
	// replacement: it keeps one connection warm).
	toEventuallyPool(t, p, "the hung server connection to be discarded", func(st proxy.PoolStats) bool {
		return st.Active == 0 && st.Idle == 0 && st.Total == st.Opening
	})
	direct := relayDirect(t)
	eventually(t, 5*time.Second, "the hung connection's backend to exit", func() bool {
		return backendState(t, direct, pid) == ""
	})
	// poolerd closed its side; the proxy lets go of the pair once the held
	// bytes can flow again, and only the replacement remains.
	fp.HoldResponses(false)
	eventually(t, 5*time.Second, "the proxied connection to close", func() bool { return fp.Conns() <= 1 })
	var pid2 int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid2); err != nil {
		t.Fatalf("the same client after the timeout: %v", err)
	}
	if pid2 == pid {
		t.Errorf("the hung server connection (backend %d) was reused", pid)
	}
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if got := st.SessionTimeouts["server_response"]; got != 1 {
		t.Errorf("SessionTimeouts[server_response] = %d, want 1 (%v)", got, st.SessionTimeouts)
	}
	if got := st.SessionTimeouts["query"]; got != 0 {
		t.Errorf("SessionTimeouts[query] = %d, want 0", got)
	}
}

// PostgreSQL sends nothing while a query runs (pg_sleep here), so a query
// running longer than server_response_timeout is indistinguishable from a
// hung server and is ended with ERROR 08007 (the session is kept):
// server_response_timeout must exceed the longest query (use query_timeout
// to bound queries).
func TestTimeoutServerResponseLongQuery(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ServerResponseTimeout = 500 * time.Millisecond })
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := c.Exec(ctx, "SELECT pg_sleep(0.1)"); err != nil {
		t.Fatalf("a query shorter than server_response_timeout: %v", err)
	}
	start := time.Now()
	_, err := c.Exec(ctx, "SELECT pg_sleep(1.5)")
	elapsed := time.Since(start)
	pe := toPgErr(t, err, "query longer than server_response_timeout")
	if pe.Code != "08007" || !strings.Contains(pe.Message, "server_response_timeout") {
		t.Fatalf("got %s %q, want 08007 naming server_response_timeout", pe.Code, pe.Message)
	}
	toBetween(t, "ERROR 08007", elapsed, 450*time.Millisecond, 1400*time.Millisecond)
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("the client after the timeout: %v", err)
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["server_response"]; got != 1 {
		t.Errorf("SessionTimeouts[server_response] = %d, want 1", got)
	}
}

// slowReader yields n COPY rows, pausing after each.
type slowReader struct {
	n, i  int
	pause time.Duration
	buf   []byte
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.buf) == 0 {
		if r.i == r.n {
			return 0, io.EOF
		}
		if r.i > 0 {
			time.Sleep(r.pause)
		}
		r.i++
		r.buf = fmt.Appendf(nil, "%d\n", r.i)
	}
	k := copy(p, r.buf)
	r.buf = r.buf[k:]
	return k, nil
}

// A COPY FROM STDIN whose data takes longer than server_response_timeout
// to arrive is not a hung server: the clock is off while the server waits
// for data and starts again at the client's CopyDone (before, it counted
// from the COPY's start, so a COPY longer than the limit was ended with
// 08006 as soon as its CopyDone was sent).
func TestTimeoutServerResponseLongCopyIn(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ServerResponseTimeout = 500 * time.Millisecond })
	c := p.connect(t)
	ctx := ctxTimeout(t, 20*time.Second)
	// The server takes 0.2 s to answer the CopyDone (an AFTER STATEMENT
	// trigger), within the limit when counted from the CopyDone.
	if _, err := c.Exec(ctx, `CREATE TABLE IF NOT EXISTS slow_copy (n int);
		CREATE OR REPLACE FUNCTION slow_copy_done() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
		DROP TRIGGER IF EXISTS slow_copy_done ON slow_copy;
		CREATE TRIGGER slow_copy_done AFTER INSERT ON slow_copy FOR EACH STATEMENT EXECUTE FUNCTION slow_copy_done()`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tag, err := c.PgConn().CopyFrom(ctx, &slowReader{n: 10, pause: 150 * time.Millisecond}, "COPY slow_copy FROM STDIN")
	if err != nil {
		t.Fatalf("COPY taking %s with server_response_timeout 500ms: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if tag.RowsAffected() != 10 {
		t.Fatalf("COPY %d rows, want 10", tag.RowsAffected())
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["server_response"]; got != 0 {
		t.Errorf("SessionTimeouts[server_response] = %d, want 0", got)
	}
}

// ---------------------------------------------------------------------------
// Timeout precedence (seed 002, ADR "Timeout Precedence Hierarchy").

// Scenario 1: a per-request timeout does not affect connection state. One
// client hits query_timeout while two others run queries concurrently: they
// get no error, their server connections (same backend pid before and
// after) are not closed, and the victim's server connection survives too.
func TestPrecedenceQueryTimeoutIsolated(t *testing.T) {
	t.Parallel()
	// The others' 50 ms queries stay far inside the limit even on a loaded
	// machine (CI saw them take over 300 ms): a timeout counted for one of
	// them would be a wrong count, not a slow machine.
	const limit = 1500 * time.Millisecond
	p := startPoolerd(t, func(c *config.Config) { c.QueryTimeout = limit })
	direct := relayDirect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const simple = "default_query_exec_mode=simple_protocol"
	victim := p.connect(t, simple)
	others := []*pgx.Conn{p.connect(t, simple), p.connect(t, simple)}

	// Each client holds its server connection in a transaction, so that
	// its backend pid identifies the connection throughout.
	pidOf := func(c *pgx.Conn) int {
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	pids := map[*pgx.Conn]int{}
	for _, c := range append([]*pgx.Conn{victim}, others...) {
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		pids[c] = pidOf(c)
	}

	errs := make(chan error, len(others))
	for i, c := range others {
		go func() {
			for end := time.Now().Add(limit + 400*time.Millisecond); time.Now().Before(end); {
				var s string
				if err := c.QueryRow(ctx, fmt.Sprintf("SELECT 'other%d' FROM pg_sleep(0.05)", i)).Scan(&s); err != nil {
					errs <- fmt.Errorf("other client %d: %w", i, err)
					return
				}
				if s != fmt.Sprintf("other%d", i) {
					errs <- fmt.Errorf("other client %d got %q", i, s)
					return
				}
			}
			errs <- nil
		}()
	}
	time.Sleep(100 * time.Millisecond)
	_, err := victim.Exec(ctx, "SELECT pg_sleep(5)")
	if pe := toPgErr(t, err, "victim"); pe.Code != "57014" || !strings.Contains(pe.Message, "query_timeout") {
		t.Fatalf("victim got %s %q, want 57014 naming query_timeout", pe.Code, pe.Message)
	}
	for range others {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range others {
		if got := pidOf(c); got != pids[c] {
			t.Errorf("other client %d: backend pid %d, was %d: its server connection changed", i, got, pids[c])
		}
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Errorf("other client %d COMMIT: %v", i, err)
		}
	}
	// The victim's transaction failed (as after any error) but its server
	// connection is intact: ROLLBACK works on the same backend.
	if _, err := victim.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatalf("victim ROLLBACK: %v", err)
	}
	for c, pid := range pids {
		if st := backendState(t, direct, pid); st == "" {
			t.Errorf("backend %d (of %p) is gone: a query timeout closed a server connection", pid, c)
		}
	}
	p.waitNoActive(t, pgtest.DBApp)
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if st.Total != 3 {
		t.Errorf("pool has %d connections, want the 3 it opened", st.Total)
	}
	want := map[string]uint64{"query": 1, "transaction": 0, "idle_transaction": 0, "client_idle": 0, "server_response": 0}
	for k, v := range want {
		if st.SessionTimeouts[k] != v {
			t.Errorf("SessionTimeouts[%s] = %d, want %d", k, st.SessionTimeouts[k], v)
		}
	}
}

// Scenario 2: the hung-server timeout is disabled during shutdown. A query's
// response is held past server_response_timeout while poolerd shuts down;
// once it arrives (before the shutdown deadline) the client gets its result,
// not 08006, and no server_response timeout is counted.
func TestPrecedenceNoHungTimeoutDuringShutdown(t *testing.T) {
	t.Parallel()
	const limit = 500 * time.Millisecond
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.ServerResponseTimeout = limit
		c.ShutdownTimeout = 3 * time.Second
		// The proxy holds every answer, a hand-off check's too: the
		// connection it runs on would never come back.
		c.VerifyHandoff = config.VerifyHandoffOff
	})
	super := toSuper(t)
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	sql := fmt.Sprintf("SELECT 'shutdown-%d' /* to-prec2 */", time.Now().UnixNano())
	fp.HoldResponses(true)
	type result struct {
		s   string
		err error
	}
	res := make(chan result, 1)
	sent := time.Now()
	go func() {
		var s string
		err := c.QueryRow(ctx, sql).Scan(&s)
		res <- result{s, err}
	}()
	eventually(t, 5*time.Second, "PostgreSQL to receive the query", func() bool { return toSeenByServer(t, super, sql) })
	shutdownAt := time.Now()
	done := shutdownAsync(p, 3*time.Second)
	if d := shutdownAt.Sub(sent); d > limit*7/10 {
		fp.HoldResponses(false)
		<-res
		<-done
		t.Skipf("inconclusive: shutdown started %s after the query, too close to server_response_timeout (%s)", d, limit)
	}

	// Hold the response for well past server_response_timeout.
	time.Sleep(time.Second)
	select {
	case r := <-res:
		t.Fatalf("the client got %q, %v while its response was held: server_response_timeout fired during shutdown", r.s, r.err)
	default:
	}
	fp.HoldResponses(false)
	var r result
	select {
	case r = <-res:
	case <-time.After(5 * time.Second):
		t.Fatal("no result after the response was released")
	}
	want := strings.TrimSuffix(strings.TrimPrefix(sql, "SELECT '"), "' /* to-prec2 */")
	if r.err != nil || r.s != want {
		t.Fatalf("client got %q, %v; want %q", r.s, r.err, want)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Shutdown: %v; want it to finish once the last request was answered", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	pgxQueryFails(t, c)
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if got := st.SessionTimeouts["server_response"]; got != 0 {
		t.Errorf("SessionTimeouts[server_response] = %d during shutdown, want 0", got)
	}
	for _, e := range toLogEntries(t, p, "client connection closed: timeout") {
		t.Errorf("a session was ended by a timeout during shutdown: %s", e.Raw)
	}
}

// Scenario 3: the shutdown deadline overrides a longer query timeout. A
// query that would run 30s under a 10s query_timeout: Shutdown with a 1s
// deadline returns after about 1s, the client loses its connection, no query
// timeout is counted, and PostgreSQL is not left running the query.
func TestPrecedenceShutdownDeadlineOverQueryTimeout(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.QueryTimeout = 10 * time.Second })
	super := toSuper(t)
	marker := fmt.Sprintf("to-prec3-%d", time.Now().UnixNano())
	sql := "SELECT pg_sleep(30) /* " + marker + " */"
	t.Cleanup(func() { toTerminateBackends(marker) })
	// A raw client: pgx would send a CancelRequest of its own when it gets
	// the FATAL, which is not what every client does.
	c := dialFE(t, p.addr)
	c.login(pgtest.RoleApp, pgtest.Password)
	res := make(chan []*pgproto3.ErrorResponse, 1)
	c.send(&pgproto3.Query{String: sql})
	go func() {
		var errs []*pgproto3.ErrorResponse
		for {
			m, err := c.fe.Receive()
			if err != nil {
				res <- errs
				return
			}
			if e, ok := m.(*pgproto3.ErrorResponse); ok {
				cp := *e
				errs = append(errs, &cp)
			}
		}
	}()
	eventually(t, 5*time.Second, "the query to run", func() bool { return toSeenByServer(t, super, sql) })

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown returned %v, want the deadline error", err)
	}
	toBetween(t, "Shutdown returned", elapsed, 900*time.Millisecond, 3*time.Second)
	select {
	case errs := <-res:
		for _, e := range errs {
			if e.Code != "57P01" {
				t.Errorf("client got %s %s %q, want 57P01 or a closed connection", e.Severity, e.Code, e.Message)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client's connection did not end with the shutdown")
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["query"]; got != 0 {
		t.Errorf("SessionTimeouts[query] = %d, want 0: the shutdown, not query_timeout, ended the query", got)
	}
	eventually(t, 5*time.Second, "PostgreSQL to stop running the query", func() bool {
		var n int
		if err := super.QueryRow(ctxTimeout(t, 5*time.Second),
			"SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// Scenario 4: a late response after a query timeout is drained and never
// reaches the next client of that server connection. One server connection;
// client A's multi-statement query has its first result produced and then
// blocks; its replies are held by the proxy, query_timeout cancels it, and
// client B queues for the connection. When the replies arrive A gets its own
// rows and the 57014, and B then gets exactly its own result.
func TestPrecedenceLateResponseDrained(t *testing.T) {
	t.Parallel()
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.MaxSize = 1
		c.QueryTimeout = 300 * time.Millisecond
	})
	direct := relayDirect(t)
	a := dialFE(t, p.addr)
	a.login(pgtest.RoleApp, pgtest.Password)
	pidA, err := strconv.Atoi(a.mustQuery("SELECT pg_backend_pid()")[0])
	if err != nil {
		t.Fatal(err)
	}
	b := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)

	// The hand-off check after A's first query runs on the connection
	// once A has its answer: held, it would keep the connection from A.
	p.waitNoActive(t, pgtest.DBApp)
	fp.HoldResponses(true)
	a.send(&pgproto3.Query{String: "SELECT 'late-a'; SELECT pg_sleep(5) /* to-prec4 */"})
	eventually(t, 5*time.Second, "query_timeout to fire", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["query"] == 1
	})
	// The cancel reached PostgreSQL: A's backend is idle again, its late
	// replies (rows, 57014, ReadyForQuery) are held in the proxy.
	eventually(t, 5*time.Second, "A's query to be cancelled on the server", func() bool {
		var state, query string
		err := direct.QueryRow(ctx, "SELECT state, query FROM pg_stat_activity WHERE pid = $1", pidA).Scan(&state, &query)
		if err != nil {
			t.Fatal(err)
		}
		return state == "idle" && strings.Contains(query, "to-prec4")
	})
	type result struct {
		s   string
		err error
	}
	bres := make(chan result, 1)
	go func() {
		var s string
		err := b.QueryRow(ctx, "SELECT 'b'").Scan(&s)
		bres <- result{s, err}
	}()
	eventually(t, 5*time.Second, "B to queue for the only server connection", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Waiting == 1
	})
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-bres:
		t.Fatalf("B got %q, %v while A's response was still in flight", r.s, r.err)
	default:
	}

	fp.HoldResponses(false)
	msgs := toCollect(t, a, 10*time.Second)
	joined := strings.Join(msgs, " | ")
	if !strings.Contains(joined, "DataRow(late-a)") {
		t.Errorf("A did not get its own late rows: %s", joined)
	}
	nerr := 0
	for _, m := range msgs {
		if strings.HasPrefix(m, "ErrorResponse(") {
			nerr++
			if !strings.Contains(m, "ERROR 57014") || !strings.Contains(m, "query_timeout") {
				t.Errorf("A got %s, want ERROR 57014 naming query_timeout", m)
			}
		}
		if strings.Contains(m, "DataRow(b)") {
			t.Errorf("A got B's row: %s", joined)
		}
	}
	if nerr != 1 || msgs[len(msgs)-1] != "ReadyForQuery(I)" {
		t.Errorf("A's response: %s; want its rows, one 57014, then ReadyForQuery(I)", joined)
	}
	var r result
	select {
	case r = <-bres:
	case <-time.After(10 * time.Second):
		t.Fatal("B got no result")
	}
	if r.err != nil || r.s != "b" {
		t.Fatalf("B got %q, %v; want exactly 'b'", r.s, r.err)
	}
	if rows := a.mustQuery("SELECT 'a2'"); len(rows) != 1 || rows[0] != "a2" {
		t.Fatalf("A's next query got %v, want [a2]", rows)
	}
	var s string
	if err := b.QueryRow(ctx, "SELECT 'b2'").Scan(&s); err != nil || s != "b2" {
		t.Fatalf("B's next query got %q, %v", s, err)
	}
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if st.Total != 1 || st.SessionTimeouts["query"] != 1 {
		t.Errorf("pool: total %d, query timeouts %d; want 1 and 1 (the connection kept)", st.Total, st.SessionTimeouts["query"])
	}
}

// ---------------------------------------------------------------------------
// checkout_timeout per user (the global behaviour is covered by
// TestConcurrencyCheckoutTimeout).

// A user's checkout_timeout (and max_size) override applies to that user's
// pool only.
func TestTimeoutCheckoutPerUser(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.CheckoutTimeout = 10 * time.Second
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password, Overrides: config.Overrides{
			MaxSize: func() *int { n := 1; return &n }(), CheckoutTimeout: toDur(300 * time.Millisecond)}}}
	})
	dsn := p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp, "default_query_exec_mode=simple_protocol")
	holder, waiter := connectDSN(t, dsn), connectDSN(t, dsn)
	ctx := ctxTimeout(t, 20*time.Second)
	for _, sql := range []string{"BEGIN", "SELECT 1"} {
		if _, err := holder.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	_, err := waiter.Exec(ctx, "SELECT 2")
	elapsed := time.Since(start)
	pe := toPgErr(t, err, "checkout from a full pool")
	if pe.Code != "53300" || !strings.Contains(pe.Message, "checkout_timeout (300ms)") {
		t.Fatalf("got %s %q, want 53300 naming checkout_timeout (300ms)", pe.Code, pe.Message)
	}
	toBetween(t, "53300", elapsed, 250*time.Millisecond, 3*time.Second)
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.Exec(ctx, "SELECT 3"); err != nil {
		t.Fatalf("after the holder committed: %v", err)
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleSCRAM); st.Timeouts != 1 || st.MaxSize != 1 {
		t.Errorf("scram_user pool: %d checkout timeouts, max_size %d; want 1 and 1", st.Timeouts, st.MaxSize)
	}
	// app's pool keeps the global settings.
	app := p.connect(t, "default_query_exec_mode=simple_protocol")
	if _, err := app.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.MaxSize != 5 {
		t.Errorf("app pool max_size %d, want the global 5", st.MaxSize)
	}
}
