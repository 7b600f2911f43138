package integration

// Tests of leak detection (leak_detection_threshold, internal/proxy/
// watchdog.go): a client that keeps its server connection busy (inside a
// transaction or a query) for longer than the threshold is reported with a
// WARN "possible connection leak" saying who, where, how long and doing
// what; the warning repeats only when the connection has been held twice as
// long as at the previous one (threshold × 1, 2, 4, 8 ...).

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

const toLeakMsg = "possible connection leak"

// toLeakWarnings returns the leak warnings about the client at address
// client ("" for every client).
func toLeakWarnings(t *testing.T, p *instance, client string) []toLogEntry {
	t.Helper()
	var out []toLogEntry
	for _, e := range toLogEntries(t, p, toLeakMsg) {
		if e.Level != "WARN" {
			t.Errorf("leak report logged at %s, want WARN: %s", e.Level, e.Raw)
		}
		if client == "" || e.str("client") == client {
			out = append(out, e)
		}
	}
	return out
}

// toCheckLeakSchedule checks the held durations of successive warnings
// about one busy period, which lasted between spanMin and spanMax: the first
// at the threshold (not before, not much after), each next one when the
// connection has been held twice as long as at the previous warning, and
// none missing before the period ended.
func toCheckLeakSchedule(t *testing.T, ws []toLogEntry, threshold, spanMin, spanMax time.Duration) {
	t.Helper()
	const slack = 750 * time.Millisecond // timer latency on a busy machine
	if len(ws) == 0 {
		t.Fatalf("no leak warning for a connection held %s with threshold %s", spanMin, threshold)
	}
	var prev time.Duration
	var helds []time.Duration
	defer func() {
		t.Logf("leak warnings at held = %v (connection held %s to %s)", helds, spanMin.Round(time.Millisecond), spanMax.Round(time.Millisecond))
	}()
	for i, w := range ws {
		held := w.dur(t, "held")
		helds = append(helds, held)
		due := threshold
		if i > 0 {
			due = 2 * prev
		}
		// held is rounded to the millisecond.
		if held < due-time.Millisecond || held > due+slack {
			t.Errorf("warning %d at held=%s, want it when held reaches %s (previous at %s)", i+1, held, due, prev)
		}
		if held > spanMax+slack {
			t.Errorf("warning %d at held=%s, after the connection was released (held at most %s)", i+1, held, spanMax)
		}
		prev = held
	}
	if next := 2 * prev; next < spanMin-slack {
		t.Errorf("%d warnings, the last at held=%s: the one due at %s is missing (held at least %s)", len(ws), prev, next, spanMin)
	}
}

// A transaction held open past the threshold: warnings at held ≈ 300ms,
// 600ms and 1.2s (doubling), each naming the connection, the client, its
// application_name, user and database, the state and the query.
func TestLeakTransaction(t *testing.T) {
	t.Parallel()
	const threshold = 300 * time.Millisecond
	p := startPoolerd(t, func(c *config.Config) { c.LeakDetectionThreshold = threshold })
	app := relayName("to_leak_app")
	c := p.connect(t, "default_query_exec_mode=simple_protocol", "application_name="+app)
	client := c.PgConn().Conn().LocalAddr().String()
	sql := "SELECT '" + relayName("leaky") + "'"
	ctx := ctxTimeout(t, 20*time.Second)

	// The connection is busy from a moment between start and begun.
	start := time.Now()
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	begun := time.Now()
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(time.Second)))
	// Within the first second: the warning at 300ms and, held twice as
	// long, the one at 600ms; never more (the next is due at 1.2s).
	n := len(toLeakWarnings(t, p, client))
	if n > 2 {
		t.Errorf("%d leak warnings within 1s (threshold 300ms), want the one at 300ms and at most the one at 600ms", n)
	}
	if n == 0 && begun.Sub(start) < 200*time.Millisecond {
		t.Errorf("no leak warning within 1s (threshold 300ms)")
	}
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	committing := time.Now()
	if _, err := c.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	spanMin, spanMax := committing.Sub(begun), time.Since(start)
	atCommit := len(toLeakWarnings(t, p, client))
	time.Sleep(800 * time.Millisecond)

	ws := toLeakWarnings(t, p, client)
	if len(ws) != atCommit {
		t.Errorf("%d leak warnings after the transaction ended, %d at its end", len(ws), atCommit)
	}
	toCheckLeakSchedule(t, ws, threshold, spanMin, spanMax)
	if len(ws) > 3 && spanMax < 2400*time.Millisecond {
		t.Errorf("%d warnings for a connection held %s; the next after 1.2s is due at 2.4s", len(ws), spanMax)
	}
	for _, w := range ws {
		for k, want := range map[string]string{
			"client": client, "application_name": app, "user": pgtest.RoleApp, "database": pgtest.DBApp,
			"state": "idle in transaction", "query": sql, "leak_detection_threshold": "300ms",
		} {
			if got := w.str(k); got != want {
				t.Errorf("leak warning field %s = %q, want %q: %s", k, got, want, w.Raw)
			}
		}
		if w.str("conn_id") == "" {
			t.Errorf("leak warning without conn_id: %s", w.Raw)
		}
		if held := w.dur(t, "held"); held < threshold {
			t.Errorf("leak warning with held=%s below the threshold", held)
		}
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Leaks; got != uint64(len(ws)) {
		t.Errorf("Leaks = %d, but %d warnings were logged", got, len(ws))
	}
}

// A query running past the threshold is reported as "active query".
func TestLeakActiveQuery(t *testing.T) {
	t.Parallel()
	const threshold = 300 * time.Millisecond
	p := startPoolerd(t, func(c *config.Config) { c.LeakDetectionThreshold = threshold })
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	client := c.PgConn().Conn().LocalAddr().String()
	sql := "SELECT pg_sleep(1) /* " + relayName("to_leak_active") + " */"
	start := time.Now()
	if _, err := c.Exec(ctxTimeout(t, 20*time.Second), sql); err != nil {
		t.Fatal(err)
	}
	span := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	ws := toLeakWarnings(t, p, client)
	toCheckLeakSchedule(t, ws, threshold, span, span)
	for _, w := range ws {
		if w.str("state") != "active query" || w.str("query") != sql {
			t.Errorf("leak warning: state %q, query %q; want \"active query\", %q", w.str("state"), w.str("query"), sql)
		}
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Leaks; got != uint64(len(ws)) {
		t.Errorf("Leaks = %d, but %d warnings were logged", got, len(ws))
	}
}

// Parameter values (Bind) never appear in the log: the warning shows the
// query text with its placeholders only.
func TestLeakNoBindValues(t *testing.T) {
	t.Parallel()
	const secret = "supersecretvalue"
	p := startPoolerd(t, func(c *config.Config) { c.LeakDetectionThreshold = 300 * time.Millisecond })
	c := p.connect(t, txExecMode)
	client := c.PgConn().Conn().LocalAddr().String()
	ctx := ctxTimeout(t, 20*time.Second)

	// Idle in a transaction after a statement with a parameter.
	const inTx = "SELECT $1::text AS to_leak_bind_tx"
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := tx.QueryRow(ctx, inTx, pgx.QueryExecModeExec, secret).Scan(&got); err != nil || got != secret {
		t.Fatalf("%s: %q, %v", inTx, got, err)
	}
	time.Sleep(700 * time.Millisecond)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A running statement with a parameter.
	const active = "SELECT pg_sleep(0.7), $1::text AS to_leak_bind_active"
	if _, err := c.Exec(ctx, active, pgx.QueryExecModeExec, secret+"2"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)

	seen := map[string]bool{}
	for _, w := range toLeakWarnings(t, p, client) {
		seen[w.str("query")] = true
	}
	for _, q := range []string{inTx, active} {
		if !seen[q] {
			t.Errorf("no leak warning shows the query %q (warnings for %v)", q, seen)
		}
	}
	if strings.Contains(p.logs.String(), secret) {
		t.Errorf("a parameter value reached the log")
	}
}

// Threshold 0 disables leak detection.
func TestLeakDisabled(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.LeakDetectionThreshold = 0 })
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 'to-leak-disabled'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond)
	if _, err := c.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT pg_sleep(0.8)"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if ws := toLeakWarnings(t, p, ""); len(ws) != 0 {
		t.Errorf("leak warning with leak_detection_threshold 0: %s", ws[0].Raw)
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Leaks; got != 0 {
		t.Errorf("Leaks = %d, want 0", got)
	}
}

// The query in the warning is cut to its first 200 characters.
func TestLeakLongQueryTruncated(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.LeakDetectionThreshold = 300 * time.Millisecond })
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	client := c.PgConn().Conn().LocalAddr().String()
	ctx := ctxTimeout(t, 20*time.Second)
	sql := "SELECT '" + strings.Repeat("a", 150) + relayName("to_leak_long") + strings.Repeat("z", 400) + "' AS long_one"
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := c.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	ws := toLeakWarnings(t, p, client)
	if len(ws) == 0 {
		t.Fatal("no leak warning")
	}
	for _, w := range ws {
		if q := w.str("query"); q != sql[:200] {
			t.Errorf("query in the warning has %d characters (%.40q...), want the first 200 of the %d-character query", len(q), q, len(sql))
		}
	}
}

// In session mode a client holds its server connection between
// transactions: being idle outside a transaction is not a leak. A
// transaction held open in session mode still is.
func TestLeakSessionModeIdleNotFlagged(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolSession
		c.LeakDetectionThreshold = 300 * time.Millisecond
	})
	ctx := ctxTimeout(t, 20*time.Second)
	idle := p.connect(t, "default_query_exec_mode=simple_protocol")
	idleAddr := idle.PgConn().Conn().LocalAddr().String()
	if _, err := idle.Exec(ctx, "SELECT 'to-leak-session-idle'"); err != nil {
		t.Fatal(err)
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Active != 1 {
		t.Fatalf("session-mode client holds %d server connections, want 1", st.Active)
	}

	busy := p.connect(t, "default_query_exec_mode=simple_protocol")
	busyAddr := busy.PgConn().Conn().LocalAddr().String()
	for _, sql := range []string{"BEGIN", "SELECT 'to-leak-session-tx'"} {
		if _, err := busy.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if _, err := busy.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if _, err := idle.Exec(ctx, "SELECT 2"); err != nil {
		t.Fatalf("idle session-mode client: %v", err)
	}
	time.Sleep(100 * time.Millisecond)

	if ws := toLeakWarnings(t, p, idleAddr); len(ws) != 0 {
		t.Errorf("a session-mode client idle outside a transaction was flagged: %s", ws[0].Raw)
	}
	if ws := toLeakWarnings(t, p, busyAddr); len(ws) == 0 {
		t.Errorf("a session-mode transaction held 1s with threshold 300ms was not flagged")
	}
}

const toWaitMsg = "a request has waited wait_warning for a server connection"

// wait_warning: on a pool of one held in a transaction, a second client's
// request waits; once it has waited wait_warning, one WARN says so with the
// pool's counts and the holder (its client, application_name, state and
// query); a longer wait logs no second line within 10 s, and a request that
// waits less than wait_warning logs none.
func TestWaitWarning(t *testing.T) {
	t.Parallel()
	const warnAfter = time.Second
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		c.WaitWarning = warnAfter
		c.CheckoutTimeout = 20 * time.Second
	})
	app := relayName("to_wait_holder")
	holder := p.connect(t, "default_query_exec_mode=simple_protocol", "application_name="+app)
	holderAddr := holder.PgConn().Conn().LocalAddr().String()
	waiter := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)
	sql := "SELECT '" + relayName("holding") + "'"

	// A short wait: no warning.
	if _, err := holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "SELECT 1")
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a maintainer tick or more
	if ws := toLogEntries(t, p, toWaitMsg); len(ws) != 0 {
		t.Fatalf("wait warning for a wait of 300 ms (wait_warning 1s): %s", ws[0].Raw)
	}

	// A long wait: one warning, naming the holder.
	if _, err := holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := waiter.Exec(ctx, "SELECT 2")
		done <- err
	}()
	eventually(t, 5*time.Second, "the wait warning", func() bool {
		return len(toLogEntries(t, p, toWaitMsg)) > 0
	})
	time.Sleep(2500 * time.Millisecond) // the wait goes on, past two more ticks
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ws := toLogEntries(t, p, toWaitMsg)
	if len(ws) != 1 {
		t.Fatalf("%d wait warnings for one wait of about 3.5 s, want 1 (at most one per pool per 10 s)", len(ws))
	}
	w := ws[0]
	if w.Level != "WARN" {
		t.Errorf("wait warning logged at %s, want WARN", w.Level)
	}
	for k, want := range map[string]string{
		"database": pgtest.DBApp, "user": pgtest.RoleApp, "wait_warning": "1s",
		"max_size": "1", "active": "1", "idle": "0", "waiting": "1",
		"holder_client": holderAddr, "holder_application_name": app,
		"holder_state": "idle in transaction", "holder_query": sql,
	} {
		if got := w.str(k); got != want {
			t.Errorf("wait warning field %s = %q, want %q: %s", k, got, want, w.Raw)
		}
	}
	if waited := w.dur(t, "waited"); waited < warnAfter {
		t.Errorf("wait warning at waited=%s, below wait_warning", waited)
	}
	if busy := w.dur(t, "holder_busy_for"); busy < warnAfter {
		t.Errorf("holder_busy_for=%s: the holder has held its connection since before the wait began", busy)
	}
}
