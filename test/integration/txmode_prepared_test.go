package integration

// Transaction-mode (and statement-mode) prepared statements against real
// PostgreSQL, with many clients over a small pool: pgx in every query exec
// mode, pgbench -M prepared, lib/pq through database/sql, pipelines with an
// error in the middle, protocol error parity with a direct connection
// message by message, statement deduplication and the per-connection LRU
// with their metrics, search_path as part of a statement's identity, and
// statement mode.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	_ "github.com/lib/pq"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// ---------------------------------------------------------------------------
// Helpers (prefixed txp).

// txpStart starts poolerd in pool mode mode with a pool of size server
// connections; maxPrep > 0 sets max_prepared_statements.
func txpStart(t *testing.T, mode string, size, maxPrep int) *instance {
	t.Helper()
	return startPoolerd(t, func(c *config.Config) {
		c.PoolMode = mode
		c.MaxSize = size
		if maxPrep > 0 {
			c.MaxPreparedStatements = maxPrep
		}
		c.LogLevel = "info"
	})
}

// txpErrs collects errors from many goroutines.
type txpErrs struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (e *txpErrs) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if len(e.first) < 10 {
		e.first = append(e.first, fmt.Sprintf(format, args...))
	}
}

// check fails the test if any error was collected.
func (e *txpErrs) check(t *testing.T, what string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n > 0 {
		t.Errorf("%s: %d errors; first:\n  %s", what, e.n, strings.Join(e.first, "\n  "))
	}
}

// txpParallel runs f(0..n-1) in n goroutines and waits for them.
func txpParallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

// txpConnect opens a pgx connection in query exec mode mode (goroutine
// safe: no t.Fatal).
func txpConnect(ctx context.Context, dsn string, mode pgx.QueryExecMode) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = mode
	return pgx.ConnectConfig(ctx, cfg)
}

// txpRaw is a client connection driven message by message, usable from
// any goroutine (errors are returned, not reported).
type txpRaw struct {
	nc net.Conn
	fe *pgproto3.Frontend
}

func txpDial(ctx context.Context, dsn string) (*txpRaw, error) {
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	hc, err := pc.Hijack()
	if err != nil {
		return nil, err
	}
	// hc.Frontend, not a new one on hc.Conn: pgconn may have a background
	// read in flight (it starts one when a write during login is slow),
	// whose bytes only its own reader returns; a new Frontend would miss
	// the first answer and wait forever.
	return &txpRaw{nc: hc.Conn, fe: hc.Frontend}, nil
}

func (r *txpRaw) close() {
	_ = r.nc.SetDeadline(time.Now().Add(time.Second))
	r.fe.Send(&pgproto3.Terminate{})
	_ = r.fe.Flush()
	_ = r.nc.Close()
}

// txpStep is what a client sends in one write and how much of the answer
// it reads: up to the rfq-th ReadyForQuery, or (rfq 0) up to the first
// message whose description starts with until.
type txpStep struct {
	name  string
	msgs  []pgproto3.FrontendMessage
	rfq   int
	until string
}

// run sends the step's messages in one write and returns the description
// of every message received for it.
func (r *txpRaw) run(st txpStep) ([]string, error) {
	for _, m := range st.msgs {
		r.fe.Send(m)
	}
	_ = r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := r.fe.Flush(); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	_ = r.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = r.nc.SetReadDeadline(time.Time{}) }()
	var trace []string
	rfqs := 0
	for {
		msg, err := r.fe.Receive()
		if err != nil {
			return trace, fmt.Errorf("receive after %v: %w", trace, err)
		}
		d := txpDescribe(msg)
		trace = append(trace, d)
		if isRFQ(msg) {
			rfqs++
			if st.rfq > 0 && rfqs == st.rfq {
				return trace, nil
			}
		}
		if st.rfq == 0 && strings.HasPrefix(d, st.until) {
			return trace, nil
		}
	}
}

// txpDescribe is describeMsg with the columns of a RowDescription and the
// types of a ParameterDescription.
func txpDescribe(m pgproto3.BackendMessage) string {
	switch m := m.(type) {
	case *pgproto3.RowDescription:
		cols := make([]string, len(m.Fields))
		for i, f := range m.Fields {
			cols[i] = fmt.Sprintf("%s:%d", f.Name, f.DataTypeOID)
		}
		return "RowDescription(" + strings.Join(cols, ",") + ")"
	case *pgproto3.ParameterDescription:
		oids := make([]string, len(m.ParameterOIDs))
		for i, o := range m.ParameterOIDs {
			oids[i] = strconv.FormatUint(uint64(o), 10)
		}
		return "ParameterDescription(" + strings.Join(oids, ",") + ")"
	}
	return describeMsg(m)
}

// txpRunSteps runs steps on a new connection to dsn and returns the trace
// of each.
func txpRunSteps(ctx context.Context, dsn string, steps []txpStep) ([][]string, error) {
	r, err := txpDial(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer r.close()
	out := make([][]string, 0, len(steps))
	for _, st := range steps {
		tr, err := r.run(st)
		if err != nil {
			return out, fmt.Errorf("step %q: %w", st.name, err)
		}
		out = append(out, tr)
	}
	return out, nil
}

// txpDiff compares traces with the golden ones of a direct connection; it
// returns "" when they match.
func txpDiff(steps []txpStep, golden, got [][]string) string {
	for i, st := range steps {
		if i >= len(got) {
			return fmt.Sprintf("step %q: no answer", st.name)
		}
		if strings.Join(golden[i], " | ") != strings.Join(got[i], " | ") {
			return fmt.Sprintf("step %q:\n    direct:  %s\n    poolerd: %s", st.name,
				strings.Join(golden[i], " | "), strings.Join(got[i], " | "))
		}
	}
	return ""
}

// Shorthand for frontend messages.
func txpParse(name, query string) *pgproto3.Parse {
	return &pgproto3.Parse{Name: name, Query: query}
}

func txpBind(stmt string, params ...string) *pgproto3.Bind {
	ps := make([][]byte, len(params))
	for i, p := range params {
		ps[i] = []byte(p)
	}
	return &pgproto3.Bind{PreparedStatement: stmt, Parameters: ps}
}

func txpExec() *pgproto3.Execute { return &pgproto3.Execute{} }
func txpSync() *pgproto3.Sync    { return &pgproto3.Sync{} }
func txpQuery(sql string) *pgproto3.Query {
	return &pgproto3.Query{String: sql}
}
func txpDescribeStmt(name string) *pgproto3.Describe {
	return &pgproto3.Describe{ObjectType: 'S', Name: name}
}
func txpCloseStmt(name string) *pgproto3.Close { return &pgproto3.Close{ObjectType: 'S', Name: name} }

func txpMsgs(m ...pgproto3.FrontendMessage) []pgproto3.FrontendMessage { return m }

// txpContains reports whether any line of trace contains s.
func txpContains(trace []string, s string) bool {
	for _, l := range trace {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// 1. pgx in each query exec mode.

// txpPgxClient runs iters iterations of a mix of parameterized queries,
// shared by every client and per client, a transaction, an expected error
// and a batch, checking every result. It returns the first wrong result.
func txpPgxClient(ctx context.Context, conn *pgx.Conn, c, iters int, table string) error {
	own := fmt.Sprintf("SELECT $1::int * %d AS own", c+1) // one statement per client
	inserted := 0
	for i := range iters {
		{
			switch (i*3 + c) % 7 {
			case 0:
				var n int
				if err := conn.QueryRow(ctx, "SELECT $1::int + 1 AS n", i).Scan(&n); err != nil {
					return fmt.Errorf("iteration %d, $1+1: %w", i, err)
				}
				if n != i+1 {
					return fmt.Errorf("iteration %d, $1+1: got %d", i, n)
				}
			case 1:
				var s string
				if err := conn.QueryRow(ctx, "SELECT $1::text || ':' || $2::int AS s", fmt.Sprint("c", c), i).Scan(&s); err != nil {
					return fmt.Errorf("iteration %d, concat: %w", i, err)
				}
				if want := fmt.Sprintf("c%d:%d", c, i); s != want {
					return fmt.Errorf("iteration %d, concat: got %q, want %q", i, s, want)
				}
			case 2:
				n := 1 + i%5
				rows, err := conn.Query(ctx, "SELECT g, g * $2::int AS m FROM generate_series(1, $1::int) AS g", n, c)
				if err != nil {
					return fmt.Errorf("iteration %d, series: %w", i, err)
				}
				got := 0
				for rows.Next() {
					var g, m int
					if err := rows.Scan(&g, &m); err != nil {
						rows.Close()
						return fmt.Errorf("iteration %d, series: %w", i, err)
					}
					got++
					if g != got || m != got*c {
						rows.Close()
						return fmt.Errorf("iteration %d, series: row %d is (%d, %d)", i, got, g, m)
					}
				}
				if err := rows.Err(); err != nil {
					return fmt.Errorf("iteration %d, series: %w", i, err)
				}
				if got != n {
					return fmt.Errorf("iteration %d, series: %d rows, want %d", i, got, n)
				}
			case 3:
				var n int
				if err := conn.QueryRow(ctx, own, i).Scan(&n); err != nil {
					return fmt.Errorf("iteration %d, own statement: %w", i, err)
				}
				if n != i*(c+1) {
					return fmt.Errorf("iteration %d, own statement: got %d, want %d", i, n, i*(c+1))
				}
			case 4:
				tx, err := conn.Begin(ctx)
				if err != nil {
					return fmt.Errorf("iteration %d, begin: %w", i, err)
				}
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (c, i) VALUES ($1, $2)", c, i); err != nil {
					_ = tx.Rollback(ctx)
					return fmt.Errorf("iteration %d, insert: %w", i, err)
				}
				var n int
				if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE c = $1", c).Scan(&n); err != nil {
					_ = tx.Rollback(ctx)
					return fmt.Errorf("iteration %d, count: %w", i, err)
				}
				if err := tx.Commit(ctx); err != nil {
					return fmt.Errorf("iteration %d, commit: %w", i, err)
				}
				inserted++
				if n != inserted {
					return fmt.Errorf("iteration %d, count in transaction: got %d, want %d", i, n, inserted)
				}
			case 5:
				var n int
				err := conn.QueryRow(ctx, "SELECT 10 / $1::int AS q", 0).Scan(&n)
				if code := pgCode(err); code != "22012" {
					return fmt.Errorf("iteration %d, 10/0: got %v, want SQLSTATE 22012", i, err)
				}
				if err := conn.QueryRow(ctx, "SELECT 10 / $1::int AS q", 5).Scan(&n); err != nil || n != 2 {
					return fmt.Errorf("iteration %d, 10/5 after the error: %d, %v", i, n, err)
				}
			case 6:
				b := &pgx.Batch{}
				b.Queue("SELECT $1::int + 1 AS n", i)
				b.Queue(own, i)
				b.Queue("SELECT $1::text || ':' || $2::int AS s", "b", i)
				br := conn.SendBatch(ctx, b)
				var n1, n2 int
				var s string
				err1 := br.QueryRow().Scan(&n1)
				err2 := br.QueryRow().Scan(&n2)
				err3 := br.QueryRow().Scan(&s)
				errc := br.Close()
				if err := errors.Join(err1, err2, err3, errc); err != nil {
					return fmt.Errorf("iteration %d, batch: %w", i, err)
				}
				if n1 != i+1 || n2 != i*(c+1) || s != fmt.Sprintf("b:%d", i) {
					return fmt.Errorf("iteration %d, batch: got %d, %d, %q", i, n1, n2, s)
				}
			}
		}
	}
	return nil
}

// Forty pgx clients over a pool of four, in each of pgx's query exec modes
// (and CacheStatement again with an LRU far smaller than the statements in
// use): every result is right and nothing fails but the expected division
// by zero.
func TestTxPreparedPgxModes(t *testing.T) {
	t.Parallel()
	const clients, iters = 40, 50
	modes := []struct {
		name    string
		mode    pgx.QueryExecMode
		maxPrep int
	}{
		{"CacheStatement", pgx.QueryExecModeCacheStatement, 0},
		{"CacheDescribe", pgx.QueryExecModeCacheDescribe, 0},
		// Prepares the unnamed statement in one round trip and binds it
		// in the next, maybe on another server connection.
		{"DescribeExec", pgx.QueryExecModeDescribeExec, 0},
		{"Exec", pgx.QueryExecModeExec, 0},
		{"SimpleProtocol", pgx.QueryExecModeSimpleProtocol, 0},
		// 45 distinct statements in use, 3 kept per server connection:
		// most Binds find their statement evicted and inject it again.
		{"CacheStatementLRU3", pgx.QueryExecModeCacheStatement, 3},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			p := txpStart(t, config.PoolTransaction, 4, m.maxPrep)
			table := relayTable(t, "c int, i int")
			ctx := ctxTimeout(t, 120*time.Second)
			var errs txpErrs
			start := time.Now()
			txpParallel(clients, func(c int) {
				conn, err := txpConnect(ctx, p.appDSN(), m.mode)
				if err != nil {
					errs.add("client %d: connect: %v", c, err)
					return
				}
				defer conn.Close(context.Background())
				if err := txpPgxClient(ctx, conn, c, iters, table); err != nil {
					errs.add("client %d: %v", c, err)
				}
			})
			errs.check(t, m.name)
			t.Logf("%s: %d clients x %d iterations in %s", m.name, clients, iters, time.Since(start).Round(time.Millisecond))
			if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.PeakActive > 4 || st.Total > 4 {
				t.Errorf("pool exceeded its size of 4: %+v", st)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 2. pgbench.

// pgbench -M prepared with 16 clients through a pool of 4 runs with no failed
// transaction, and one server-side Parse per server connection serves all
// 16 clients; -M extended and -M simple too. The TPS of each, and of
// PostgreSQL directly, are logged.
func TestTxPreparedPgbench(t *testing.T) {
	pgbench := needTool(t, "pgbench")
	// Not parallel: pgbench's tables have fixed names in database app, and
	// the throughput figures mean more on a quiet machine.
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 4
		c.LogLevel = "info"
	}})
	dir := t.TempDir()
	p.runTool(t, 60*time.Second, pgtest.DBApp, dir, pgbench, "-i", "-s", "1", "-q")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, pgtest.DBApp, "DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history")
	})
	direct := &instance{addr: pg.Addr()}

	// bench runs pgbench -S and returns its tps; through poolerd (checked)
	// every transaction must succeed; directly (reference) it is only
	// logged.
	bench := func(who *instance, mode, secs string, checked bool) float64 {
		t.Helper()
		out, stderr, err := who.runToolErr(t, 60*time.Second, pgtest.DBApp, dir, pgbench,
			"-M", mode, "-c", "16", "-j", "2", "-T", secs, "-S", "-n")
		if !checked {
			m := pgbenchTPS.FindStringSubmatch(out)
			if err != nil || m == nil {
				t.Logf("direct -M %s: %v\n%s\n%s", mode, err, out, stderr)
				return 0
			}
			tps, _ := strconv.ParseFloat(m[1], 64)
			return tps
		}
		if err != nil {
			t.Fatalf("-M %s: %v\n%s\n%s", mode, err, out, stderr)
		}
		if f := pgbenchFailed.FindStringSubmatch(out); f == nil || f[1] != "0" {
			t.Errorf("-M %s: failed transactions %v\n%s\n%s", mode, f, out, stderr)
		}
		if x := pgbenchXacts.FindStringSubmatch(out); x == nil || x[1] == "0" {
			t.Errorf("-M %s: transactions processed %v\n%s", mode, x, out)
		}
		if strings.Contains(stderr, "ERROR") || strings.Contains(stderr, "FATAL") {
			t.Errorf("-M %s: errors reported:\n%s", mode, stderr)
		}
		m := pgbenchTPS.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("-M %s: no tps in the output:\n%s\n%s", mode, out, stderr)
		}
		tps, _ := strconv.ParseFloat(m[1], 64)
		return tps
	}
	metric := func(name string) float64 {
		_, ms := obScrape(t, p)
		v, ok := ms.get(name, "database="+pgtest.DBApp, "user="+pgtest.RoleApp)
		if !ok {
			t.Fatalf("metric %s{database=app,user=app} missing", name)
		}
		return v
	}

	// evictions counts the pool's server connections closed so far, every
	// reason: when -T ends, pgbench's clients leave with requests running,
	// and each connection so discarded is replaced by one on which a client
	// still running may prepare the statement once more.
	evictions := func() float64 {
		_, ms := obScrape(t, p)
		n := 0.0
		for _, r := range ms.labelValues("poolerd_server_evictions_total", "reason") {
			v, _ := ms.get("poolerd_server_evictions_total", "database="+pgtest.DBApp, "user="+pgtest.RoleApp, "reason="+r)
			n += v
		}
		return n
	}
	cp0, sp0, ev0 := metric("poolerd_prepared_client_parses_total"), metric("poolerd_prepared_server_parses_total"), evictions()
	prepared := bench(p.instance, "prepared", "5", true)
	cp, sp := metric("poolerd_prepared_client_parses_total")-cp0, metric("poolerd_prepared_server_parses_total")-sp0
	ev := evictions() - ev0
	t.Logf("-M prepared: client Parses %.0f, server Parses %.0f, server connections closed %.0f", cp, sp, ev)
	if cp < 16 {
		t.Errorf("-M prepared: %.0f client Parses counted, want at least one per client (16)", cp)
	}
	if sp > 4+ev {
		t.Errorf("-M prepared: %.0f server Parses for one statement over 4 server connections (%.0f of them replaced), want at most %.0f", sp, ev, 4+ev)
	}
	extended := bench(p.instance, "extended", "3", true)
	simple := bench(p.instance, "simple", "3", true)
	directPrepared := bench(direct, "prepared", "3", false)
	directSimple := bench(direct, "simple", "3", false)
	t.Logf("tps through poolerd (pool 4, transaction mode): prepared %.0f, extended %.0f, simple %.0f", prepared, extended, simple)
	t.Logf("tps direct (16 backends): prepared %.0f, simple %.0f", directPrepared, directSimple)
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.PeakActive > 4 || st.Total > 4 {
		t.Errorf("pool exceeded its size of 4: %+v", st)
	}
}

// ---------------------------------------------------------------------------
// 3. lib/pq through database/sql.

// lib/pq names its statements "1", "2", ... per connection, in the order
// database/sql prepares them there, so the same name means different SQL
// on different client connections. Forty goroutines over 20 lib/pq
// connections over a pool of 4 use shared prepared statements (from
// db.Prepare, and in transactions through tx.Stmt), one of their own for
// the whole run, and short-lived ones (Prepare, Query, Close). database/sql
// closes a statement on an idle connection while it holds its pool lock,
// which the goroutines holding server connections in transactions need:
// a Close that waited for a server connection would stall everything until
// checkout_timeout (see TestTxPreparedCloseWithoutServer).
func TestTxPreparedLibPQ(t *testing.T) {
	t.Parallel()
	p := txpStart(t, config.PoolTransaction, 4, 0)
	table := relayTable(t, "c int, i int")
	db, err := sql.Open("postgres", p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)
	ctx := ctxTimeout(t, 120*time.Second)

	prep := func(q string) *sql.Stmt {
		t.Helper()
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			t.Fatalf("prepare %q: %v", q, err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	add := prep("SELECT $1::int + $2::int")
	bang := prep("SELECT $1::text || '!'")
	series := prep("SELECT g FROM generate_series(1, $1::int) AS g")
	insert := prep("INSERT INTO " + table + " (c, i) VALUES ($1, $2)")
	count := prep("SELECT count(*) FROM " + table + " WHERE c = $1")

	const clients, iters = 40, 50
	var errs txpErrs
	owns := make([]*sql.Stmt, clients)
	txpParallel(clients, func(c int) {
		inserted := 0
		fail := func(i int, what string, err error) { errs.add("client %d, iteration %d, %s: %v", c, i, what, err) }
		// A statement of the goroutine's own, closed at the end.
		own, err := db.PrepareContext(ctx, fmt.Sprintf("SELECT $1::int * %d", c+2))
		if err != nil {
			fail(0, "prepare own", err)
			return
		}
		owns[c] = own
		for i := range iters {
			switch (i + c) % 6 {
			case 0:
				var n int
				if err := add.QueryRowContext(ctx, i, c).Scan(&n); err != nil || n != i+c {
					fail(i, "add", fmt.Errorf("%d, %v", n, err))
					return
				}
			case 1:
				var s string
				if err := bang.QueryRowContext(ctx, fmt.Sprint(c, "-", i)).Scan(&s); err != nil || s != fmt.Sprint(c, "-", i, "!") {
					fail(i, "bang", fmt.Errorf("%q, %v", s, err))
					return
				}
			case 2:
				rows, err := series.QueryContext(ctx, 1+i%4)
				if err != nil {
					fail(i, "series", err)
					return
				}
				got := 0
				for rows.Next() {
					var g int
					if err := rows.Scan(&g); err != nil || g != got+1 {
						fail(i, "series row", fmt.Errorf("%d, %v", g, err))
					}
					got++
				}
				if err := rows.Close(); err != nil || rows.Err() != nil || got != 1+i%4 {
					fail(i, "series", fmt.Errorf("%d rows, %v %v", got, err, rows.Err()))
					return
				}
			case 3:
				var n int
				if err := own.QueryRowContext(ctx, i).Scan(&n); err != nil || n != i*(c+2) {
					fail(i, "own statement", fmt.Errorf("%d, %v", n, err))
					return
				}
			case 4:
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					fail(i, "begin", err)
					return
				}
				if _, err := tx.StmtContext(ctx, insert).ExecContext(ctx, c, i); err != nil {
					_ = tx.Rollback()
					fail(i, "insert", err)
					return
				}
				var n int
				if err := tx.StmtContext(ctx, count).QueryRowContext(ctx, c).Scan(&n); err != nil {
					_ = tx.Rollback()
					fail(i, "count", err)
					return
				}
				if err := tx.Commit(); err != nil {
					fail(i, "commit", err)
					return
				}
				inserted++
				if n != inserted {
					fail(i, "count", fmt.Errorf("got %d, want %d", n, inserted))
					return
				}
			case 5:
				st, err := db.PrepareContext(ctx, fmt.Sprintf("SELECT $1::int - %d", c))
				if err != nil {
					fail(i, "prepare short-lived", err)
					return
				}
				var n int
				err = st.QueryRowContext(ctx, i).Scan(&n)
				errc := st.Close()
				if err != nil || errc != nil || n != i-c {
					fail(i, "short-lived statement", fmt.Errorf("%d, %v, %v", n, err, errc))
					return
				}
			}
		}
	})
	for c, st := range owns {
		if st != nil {
			if err := st.Close(); err != nil {
				errs.add("client %d: close own statement: %v", c, err)
			}
		}
	}
	errs.check(t, "lib/pq")
	// The statements are gone: preparing the same SQL again works.
	var n int
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.PeakActive > 4 {
		t.Errorf("pool exceeded its size of 4: %+v", st)
	}

	// lib/pq's Query with arguments prepares the unnamed statement in one
	// round trip (Parse, Describe, Sync) and binds it in the next.
	t.Run("unnamed statements across round trips", func(t *testing.T) {
		var errs txpErrs
		txpParallel(clients, func(c int) {
			// Each client's own SQL: another client's unnamed statement
			// gives a wrong result, not just an error.
			q := fmt.Sprintf("SELECT $1::text || $2::text || '/%d'", c)
			for i := range 20 {
				var s string
				want := fmt.Sprintf("u%d/%d", i, c)
				if err := db.QueryRowContext(ctx, q, "u", strconv.Itoa(i)).Scan(&s); err != nil || s != want {
					errs.add("client %d, iteration %d: %q, %v (want %q)", c, i, s, err, want)
					return
				}
			}
		})
		errs.check(t, "lib/pq unnamed")
	})
}

// A client's unnamed statement, prepared in one round trip and bound in the
// next, is its own even if other clients used the server connection in
// between: PostgreSQL keeps a direct connection's unnamed statement until
// the next Parse of the unnamed statement or simple Query. Pool of one;
// client B uses the server between client A's two round trips.
func TestTxPreparedUnnamedAcrossSyncs(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	p := txpStart(t, config.PoolTransaction, 1, 0)
	prepareA := txpStep{name: "A: Parse unnamed, Describe, Sync", rfq: 1, msgs: txpMsgs(
		txpParse("", "SELECT $1::text || ' from A' AS a"), txpDescribeStmt(""), txpSync())}
	bindA := txpStep{name: "A: Bind unnamed, Execute, Sync", rfq: 1, msgs: txpMsgs(txpBind("", "x"), txpExec(), txpSync())}
	for _, between := range []txpStep{
		{name: "B: simple Query", rfq: 1, msgs: txpMsgs(txpQuery("SELECT 1"))},
		{name: "B: its own unnamed statement", rfq: 1, msgs: txpMsgs(
			txpParse("", "SELECT $1::text || ' from B' AS b"), txpBind("", "y"), txpExec(), txpSync())},
	} {
		t.Run(between.name, func(t *testing.T) {
			// The golden answers: each client on its own direct connection.
			run := func(dsn string) (a1, b, a2 []string) {
				t.Helper()
				ra, err := txpDial(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer ra.close()
				rb, err := txpDial(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer rb.close()
				for _, x := range []struct {
					r   *txpRaw
					st  txpStep
					out *[]string
				}{{ra, prepareA, &a1}, {rb, between, &b}, {ra, bindA, &a2}} {
					tr, err := x.r.run(x.st)
					if err != nil {
						t.Fatalf("%s: %v", x.st.name, err)
					}
					*x.out = tr
				}
				return a1, b, a2
			}
			_, _, direct := run(directDSN(pgtest.DBApp))
			if strings.Join(direct, " | ") != "BindComplete | DataRow(x from A) | CommandComplete(SELECT 1) | ReadyForQuery(I)" {
				t.Fatalf("direct: %v", direct)
			}
			_, _, got := run(p.appDSN())
			if strings.Join(got, " | ") != strings.Join(direct, " | ") {
				t.Errorf("A's Bind after B used the server:\n    direct:  %s\n    poolerd: %s", strings.Join(direct, " | "), strings.Join(got, " | "))
			}
		})
	}
}

// A Close (and its Sync) of a client that holds no server connection needs
// none: the issue has poolerd answer the client's Close itself. Forwarding
// it instead makes it wait for a server connection, and database/sql closes
// statements while holding its pool lock, which the clients holding the
// server connections (in transactions) need: lib/pq stalls until
// checkout_timeout. Pool of one, held by a client in a transaction; another
// client closes a statement it prepared earlier, and one it never had.
func TestTxPreparedCloseWithoutServer(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	p := startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 1
		c.CheckoutTimeout = 3 * time.Second
	})
	b, err := txpDial(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if tr, err := b.run(txpStep{name: "B: Parse", rfq: 1, msgs: txpMsgs(txpParse("s1", "SELECT 1"), txpSync())}); err != nil || !txpContains(tr, "ParseComplete") {
		t.Fatalf("B: Parse: %v, %v", tr, err)
	}
	a, err := txpDial(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	if tr, err := a.run(txpStep{name: "A: BEGIN", rfq: 1, msgs: txpMsgs(txpQuery("BEGIN"))}); err != nil || !txpContains(tr, "ReadyForQuery(T)") {
		t.Fatalf("A: BEGIN: %v, %v", tr, err)
	}
	start := time.Now()
	tr, err := b.run(txpStep{name: "B: Close s1, Close nosuch, Sync", rfq: 1, msgs: txpMsgs(
		txpCloseStmt("s1"), txpCloseStmt("nosuch"), txpSync())})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tr, " | "); got != "CloseComplete | CloseComplete | ReadyForQuery(I)" || time.Since(start) > 2*time.Second {
		t.Fatalf("B's Close while A holds the only server connection: %s after %s", got, time.Since(start).Round(time.Millisecond))
	}
	if _, err := a.run(txpStep{name: "A: COMMIT", rfq: 1, msgs: txpMsgs(txpQuery("COMMIT"))}); err != nil {
		t.Fatal(err)
	}
	if tr, err := b.run(txpStep{name: "B: Bind s1", rfq: 1, msgs: txpMsgs(txpBind("s1"), txpExec(), txpSync())}); err != nil ||
		!txpContains(tr, `ErrorResponse(ERROR 26000: prepared statement "s1" does not exist)`) {
		t.Errorf("B: Bind of the closed s1: %v, %v", tr, err)
	}
}

// ---------------------------------------------------------------------------
// 4. Pipelines with an error in the middle.

// A pipeline of three Sync groups in one write whose middle group fails
// (a Parse with bad SQL, or an Execute that divides by zero) answers exactly
// as PostgreSQL does directly: in order, the middle group's error with
// PostgreSQL's SQLSTATE, the groups after it working, and the failed Parse
// leaving no statement behind (a later Bind of it is 26000, and its name
// can be prepared again). Ten clients run it five times each over a pool of
// three, so later steps land on other server connections.
func TestTxPreparedPipelineErrorRaw(t *testing.T) {
	t.Parallel()
	steps := []txpStep{
		{name: "pipeline with a bad Parse in the middle", rfq: 3, msgs: txpMsgs(
			txpParse("s1", "SELECT $1::int + 1"), txpBind("s1", "41"), txpExec(), txpSync(),
			txpParse("s2", "SELEC $1"), txpBind("s2", "1"), txpExec(), txpSync(),
			txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Bind of the failed statement", rfq: 1, msgs: txpMsgs(txpBind("s2", "1"), txpExec(), txpSync())},
		{name: "Describe of the failed statement", rfq: 1, msgs: txpMsgs(txpDescribeStmt("s2"), txpSync())},
		{name: "the failed name prepared again", rfq: 1, msgs: txpMsgs(
			txpParse("s2", "SELECT $1::int * 2"), txpBind("s2", "21"), txpExec(), txpSync())},
		{name: "pipeline with an execution error in the middle", rfq: 3, msgs: txpMsgs(
			txpBind("s1", "1"), txpExec(), txpSync(),
			// Divided at execution: "10 / $1" would be folded when a
			// custom plan is made at Bind, and whether the plan is
			// custom depends on how often the (shared) statement ran.
			txpParse("s3", "SELECT 10 / g FROM generate_series($1::int, $1::int) AS g"), txpBind("s3", "0"), txpExec(), txpParse("s4", "SELECT 4"), txpSync(),
			txpBind("s2", "5"), txpExec(), txpSync())},
		{name: "a Parse that ran before the error stays", rfq: 1, msgs: txpMsgs(txpBind("s3", "5"), txpExec(), txpSync())},
		{name: "a Parse skipped after the error was never made", rfq: 1, msgs: txpMsgs(txpBind("s4"), txpExec(), txpSync())},
		{name: "all statements after the errors", rfq: 3, msgs: txpMsgs(
			txpBind("s1", "99"), txpExec(), txpSync(),
			txpBind("s2", "50"), txpExec(), txpSync(),
			txpBind("s3", "2"), txpExec(), txpSync())},
	}
	ctx := ctxTimeout(t, 120*time.Second)
	golden, err := txpRunSteps(ctx, directDSN(pgtest.DBApp), steps)
	if err != nil {
		t.Fatalf("direct: %v", err)
	}
	// What the brief promises, on the direct connection itself.
	if g := strings.Join(golden[0], " | "); !strings.Contains(g, "42601") || !strings.Contains(g, "DataRow(42)") || !strings.Contains(g, "DataRow(2)") {
		t.Fatalf("direct PostgreSQL answered the pipeline unexpectedly: %s", g)
	}
	if !txpContains(golden[1], `ErrorResponse(ERROR 26000: prepared statement "s2" does not exist)`) {
		t.Fatalf("direct PostgreSQL answered the Bind of s2 unexpectedly: %v", golden[1])
	}

	p := txpStart(t, config.PoolTransaction, 3, 0)
	var errs txpErrs
	txpParallel(10, func(c int) {
		for round := range 5 {
			got, err := txpRunSteps(ctx, p.appDSN(), steps)
			if err != nil {
				errs.add("client %d, round %d: %v", c, round, err)
				return
			}
			if d := txpDiff(steps, golden, got); d != "" {
				errs.add("client %d, round %d: %s", c, round, d)
				return
			}
		}
	})
	errs.check(t, "pipelines")

	// The Bind that follows a failed group in the same write is read
	// before the error arrives.
	t.Run("Bind in the same write after a failed Parse", func(t *testing.T) {
		d := txpCompare(t, ctx, p.appDSN(), nil, []txpStep{
			{name: "Parse s2 bad, Sync, Bind s2, Execute, Sync", rfq: 2, msgs: txpMsgs(
				txpParse("s2", "SELEC $1"), txpSync(), txpBind("s2", "1"), txpExec(), txpSync())},
		})
		if d != "" {
			t.Error(d)
		}
	})
	t.Run("Bind in the same write after a skipped Parse of a statement the server has", func(t *testing.T) {
		p1 := txpStart(t, config.PoolTransaction, 1, 0)
		d := txpCompare(t, ctx, p1.appDSN(), []txpStep{
			{name: "another client prepares the same SQL", rfq: 1, msgs: txpMsgs(
				txpParse("x", "SELECT 41 AS v"), txpBind("x"), txpExec(), txpSync())},
		}, []txpStep{
			{name: "Bind nosuch, Parse s4, Sync, Bind s4, Execute, Sync", rfq: 2, msgs: txpMsgs(
				txpBind("nosuch"), txpParse("s4", "SELECT 41 AS v"), txpSync(), txpBind("s4"), txpExec(), txpSync())},
		})
		if d != "" {
			t.Error(d)
		}
	})
}

// txpCompare runs steps on a connection to PostgreSQL directly and on one
// to poolerd (dsn), each while setup has run on another connection that
// stays open, and returns how the answers differ ("" if they do not).
func txpCompare(t *testing.T, ctx context.Context, dsn string, setup, steps []txpStep) string {
	t.Helper()
	run := func(dsn string) [][]string {
		t.Helper()
		if len(setup) > 0 {
			r, err := txpDial(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer r.close()
			for _, st := range setup {
				if _, err := r.run(st); err != nil {
					t.Fatalf("setup %q: %v", st.name, err)
				}
			}
		}
		out, err := txpRunSteps(ctx, dsn, steps)
		if err != nil {
			t.Fatalf("%v (answers so far: %v)", err, out)
		}
		return out
	}
	golden := run(directDSN(pgtest.DBApp))
	return txpDiff(steps, golden, run(dsn))
}

// pgx batches in CacheStatement mode with an error in the middle (at
// execution, and in the SQL itself) give each query the outcome they get
// directly, and the connection goes on working; twenty clients over a pool
// of four.
func TestTxPreparedPipelineErrorPgxBatch(t *testing.T) {
	t.Parallel()
	type query struct {
		sql  string
		args func(i int) []any
	}
	batches := map[string][]query{
		"execution error": {
			{"SELECT $1::int + 1", func(i int) []any { return []any{i} }},
			{"SELECT 10 / g FROM generate_series($1::int, $1::int) AS g", func(int) []any { return []any{0} }},
			{"SELECT $1::int * 2", func(i int) []any { return []any{i} }},
		},
		"syntax error": {
			{"SELECT $1::int + 1", func(i int) []any { return []any{i} }},
			{"SELEC $1::int", func(i int) []any { return []any{i} }},
			{"SELECT $1::int * 2", func(i int) []any { return []any{i} }},
		},
		"no error": {
			{"SELECT $1::int + 1", func(i int) []any { return []any{i} }},
			{"SELECT 10 / g FROM generate_series($1::int, $1::int) AS g", func(int) []any { return []any{5} }},
			{"SELECT $1::int * 2", func(i int) []any { return []any{i} }},
		},
	}
	names := []string{"execution error", "syntax error", "no error"}
	run := func(ctx context.Context, conn *pgx.Conn, name string, i int) ([]string, error) {
		b := &pgx.Batch{}
		for _, q := range batches[name] {
			b.Queue(q.sql, q.args(i)...)
		}
		br := conn.SendBatch(ctx, b)
		var out []string
		for range batches[name] {
			var n int
			if err := br.QueryRow().Scan(&n); err != nil {
				code := pgCode(err)
				if code == "" {
					code = "not a server error"
				}
				out = append(out, "error "+code)
			} else {
				out = append(out, strconv.Itoa(n))
			}
		}
		_ = br.Close()
		var n int
		if err := conn.QueryRow(ctx, "SELECT $1::int - 1", i).Scan(&n); err != nil || n != i-1 {
			return out, fmt.Errorf("query after the batch: %d, %v", n, err)
		}
		return out, nil
	}
	ctx := ctxTimeout(t, 120*time.Second)
	dc, err := txpConnect(ctx, directDSN(pgtest.DBApp), pgx.QueryExecModeCacheStatement)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close(context.Background())
	golden := map[string][]string{}
	for _, name := range names {
		// Outcomes do not depend on i other than through values; use i=7.
		out, err := run(ctx, dc, name, 7)
		if err != nil {
			t.Fatalf("direct, %s: %v", name, err)
		}
		golden[name] = out
	}
	t.Logf("direct outcomes: %v", golden)
	if golden["execution error"][1] != "error 22012" || golden["syntax error"][1] != "error 42601" || golden["no error"][0] != "8" {
		t.Fatalf("direct PostgreSQL answered unexpectedly: %v", golden)
	}

	p := txpStart(t, config.PoolTransaction, 4, 0)
	var errs txpErrs
	txpParallel(20, func(c int) {
		conn, err := txpConnect(ctx, p.appDSN(), pgx.QueryExecModeCacheStatement)
		if err != nil {
			errs.add("client %d: connect: %v", c, err)
			return
		}
		defer conn.Close(context.Background())
		for round := range 10 {
			name := names[(round+c)%len(names)]
			out, err := run(ctx, conn, name, 7)
			if err != nil {
				errs.add("client %d, round %d, %s: %v", c, round, name, err)
				return
			}
			if strings.Join(out, ",") != strings.Join(golden[name], ",") {
				errs.add("client %d, round %d, %s: outcomes %v, direct %v", c, round, name, out, golden[name])
				return
			}
		}
	})
	errs.check(t, "pgx batches")
}

// ---------------------------------------------------------------------------
// 5. Error parity with a direct connection.

// txpParitySteps is a session of one client exercising every rule of
// named statements; each step's answer must be what PostgreSQL gives a
// direct connection, message for message.
func txpParitySteps() []txpStep {
	add := "SELECT $1::int + 1"
	return []txpStep{
		{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
		{name: "Bind s1", rfq: 1, msgs: txpMsgs(txpBind("s1", "41"), txpExec(), txpSync())},
		{name: "Parse of an existing name skips to Sync", rfq: 1, msgs: txpMsgs(
			txpParse("s1", add), txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Parse of an existing name with other SQL", rfq: 1, msgs: txpMsgs(txpParse("s1", "SELECT 2"), txpSync())},
		{name: "s1 unchanged after the duplicates", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Bind of an unknown name", rfq: 1, msgs: txpMsgs(txpBind("nosuch"), txpExec(), txpSync())},
		{name: "Describe of an unknown name", rfq: 1, msgs: txpMsgs(txpDescribeStmt("nosuch"), txpSync())},
		{name: "Close of an unknown name", rfq: 1, msgs: txpMsgs(txpCloseStmt("nosuch"), txpSync())},
		{name: "Close and Parse again with other SQL", rfq: 1, msgs: txpMsgs(
			txpCloseStmt("s1"), txpParse("s1", "SELECT 'new:' || $1::text AS v"), txpBind("s1", "x"), txpExec(), txpSync())},
		{name: "Close", rfq: 1, msgs: txpMsgs(txpCloseStmt("s1"), txpSync())},
		{name: "Bind after Close", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Parse after Close", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpBind("s1", "5"), txpExec(), txpSync())},
		{name: "Flush-only round trip: Parse, Describe, Flush", until: "RowDescription", msgs: txpMsgs(
			txpParse("s3", "SELECT $1::int AS a, $2::text AS b"), txpDescribeStmt("s3"), &pgproto3.Flush{})},
		{name: "Flush-only round trip: Bind, Execute, Sync", rfq: 1, msgs: txpMsgs(txpBind("s3", "7", "seven"), txpExec(), txpSync())},
		{name: "Describe of a known name", rfq: 1, msgs: txpMsgs(txpDescribeStmt("s3"), txpSync())},
		{name: "several Syncs in one write", rfq: 3, msgs: txpMsgs(
			txpParse("s6", "SELECT $1::int * 6"), txpSync(),
			txpBind("s6", "2"), txpExec(), txpSync(),
			txpBind("s6", "3"), txpExec(), txpSync())},
		{name: "two names for the same SQL", rfq: 1, msgs: txpMsgs(
			txpParse("a1", "SELECT 10 AS ten"), txpParse("a2", "SELECT 10 AS ten"),
			txpBind("a1"), txpExec(), txpBind("a2"), txpExec(), txpSync())},
		{name: "Close of one of the two names", rfq: 2, msgs: txpMsgs(
			txpCloseStmt("a1"), txpSync(), txpBind("a2"), txpExec(), txpSync())},
		{name: "the closed one of the two", rfq: 1, msgs: txpMsgs(txpBind("a1"), txpExec(), txpSync())},
		{name: "unnamed statements pass through", rfq: 1, msgs: txpMsgs(
			txpParse("", "SELECT $1::int AS u"), txpBind("", "3"), txpExec(), txpSync())},
		{name: "a failed Parse", rfq: 1, msgs: txpMsgs(txpParse("s2", "SELEC 1"), txpSync())},
		{name: "a failed Parse leaves no mapping", rfq: 1, msgs: txpMsgs(txpBind("s2"), txpExec(), txpSync())},
		{name: "the failed name can be prepared", rfq: 1, msgs: txpMsgs(
			txpParse("s2", "SELECT 2 AS two"), txpBind("s2"), txpExec(), txpSync())},
		{name: "a Parse skipped after an error in its group", rfq: 1, msgs: txpMsgs(
			txpBind("nosuch"), txpParse("s4", "SELECT 4"), txpSync())},
		{name: "the skipped Parse was not made", rfq: 1, msgs: txpMsgs(txpBind("s4"), txpExec(), txpSync())},
		{name: "a Parse before an error in its group stays", rfq: 2, msgs: txpMsgs(
			txpParse("s5", "SELECT 5 AS five"), txpParse("", "SELEC"), txpSync(), txpBind("s5"), txpExec(), txpSync())},
		{name: "a Close skipped after an error in its group", rfq: 1, msgs: txpMsgs(
			txpBind("nosuch"), txpCloseStmt("s5"), txpSync())},
		{name: "the skipped Close was not made", rfq: 1, msgs: txpMsgs(txpBind("s5"), txpExec(), txpSync())},
		{name: "prepared statements in a transaction block", rfq: 3, msgs: txpMsgs(
			txpQuery("BEGIN"), txpParse("s7", "SELECT $1::int + 7"), txpBind("s7", "1"), txpExec(), txpSync(), txpQuery("COMMIT"))},
		{name: "Parse in an aborted transaction", rfq: 4, msgs: txpMsgs(
			txpQuery("BEGIN"), txpQuery("SELECT 1/0"), txpParse("s8", "SELECT 8"), txpSync(), txpQuery("ROLLBACK"))},
		{name: "the Parse in the aborted transaction was not made", rfq: 1, msgs: txpMsgs(txpBind("s8"), txpExec(), txpSync())},
		{name: "DEALLOCATE name", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE s1"))},
		{name: "Bind after DEALLOCATE", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Parse after DEALLOCATE", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpBind("s1", "9"), txpExec(), txpSync())},
		{name: "DEALLOCATE PREPARE of a name", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE PREPARE s7"))},
		{name: "Bind after DEALLOCATE PREPARE", rfq: 1, msgs: txpMsgs(txpBind("s7", "1"), txpExec(), txpSync())},
		{name: "DEALLOCATE of an unknown name", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE nosuch"))},
		{name: "DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE ALL"))},
		{name: "Bind s1 after DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Bind s3 after DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpBind("s3", "1", "x"), txpExec(), txpSync())},
		{name: "Parse after DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(
			txpParse("s1", add), txpParse("s3", "SELECT 3"), txpBind("s1", "2"), txpExec(), txpBind("s3"), txpExec(), txpSync())},
		{name: "DISCARD ALL", rfq: 1, msgs: txpMsgs(txpQuery("DISCARD ALL"))},
		{name: "Bind after DISCARD ALL", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		{name: "Parse after DISCARD ALL", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpBind("s1", "3"), txpExec(), txpSync())},
	}
}

// Every step of txpParitySteps answers through poolerd exactly as directly
// (message types, SQLSTATEs, messages naming the client's own statement
// names, data): with a pool of 4 and six clients at once, and with a pool of
// one server connection that keeps a single statement, so that nearly every
// Bind and Describe needs its statement injected.
func TestTxPreparedErrorParity(t *testing.T) {
	t.Parallel()
	steps := txpParitySteps()
	ctx := ctxTimeout(t, 120*time.Second)
	golden, err := txpRunSteps(ctx, directDSN(pgtest.DBApp), steps)
	if err != nil {
		t.Fatalf("direct: %v", err)
	}
	// The expectations of the brief, checked on PostgreSQL's own answers so
	// that the comparison below compares what it should.
	want := map[string]string{
		"Parse of an existing name skips to Sync":    `ErrorResponse(ERROR 42P05: prepared statement "s1" already exists) | ReadyForQuery(I)`,
		"Parse of an existing name with other SQL":   `ErrorResponse(ERROR 42P05: prepared statement "s1" already exists) | ReadyForQuery(I)`,
		"Bind of an unknown name":                    `ErrorResponse(ERROR 26000: prepared statement "nosuch" does not exist) | ReadyForQuery(I)`,
		"Describe of an unknown name":                `ErrorResponse(ERROR 26000: prepared statement "nosuch" does not exist) | ReadyForQuery(I)`,
		"Close of an unknown name":                   `CloseComplete | ReadyForQuery(I)`,
		"Close and Parse again with other SQL":       `CloseComplete | ParseComplete | BindComplete | DataRow(new:x) | CommandComplete(SELECT 1) | ReadyForQuery(I)`,
		"Bind after DEALLOCATE":                      `ErrorResponse(ERROR 26000: prepared statement "s1" does not exist) | ReadyForQuery(I)`,
		"Parse after DEALLOCATE":                     `ParseComplete | BindComplete | DataRow(10) | CommandComplete(SELECT 1) | ReadyForQuery(I)`,
		"Flush-only round trip: Bind, Execute, Sync": `BindComplete | DataRow(7,seven) | CommandComplete(SELECT 1) | ReadyForQuery(I)`,
		"Bind after DISCARD ALL":                     `ErrorResponse(ERROR 26000: prepared statement "s1" does not exist) | ReadyForQuery(I)`,
	}
	for i, st := range steps {
		if w, ok := want[st.name]; ok && strings.Join(golden[i], " | ") != w {
			t.Fatalf("direct PostgreSQL, step %q: %s, expected %s", st.name, strings.Join(golden[i], " | "), w)
		}
	}
	configs := []struct {
		name                   string
		size, maxPrep, clients int
		rounds                 int
	}{
		{"pool 4, 6 clients", 4, 0, 6, 3},
		// One client: with several, a skipped eviction leaves the server
		// connection's list wrong (TestTxPreparedSkippedEviction).
		{"pool 1, max_prepared_statements 1", 1, 1, 1, 2},
	}
	for _, cf := range configs {
		t.Run(cf.name, func(t *testing.T) {
			p := txpStart(t, config.PoolTransaction, cf.size, cf.maxPrep)
			var errs txpErrs
			txpParallel(cf.clients, func(c int) {
				for round := range cf.rounds {
					got, err := txpRunSteps(ctx, p.appDSN(), steps)
					if err != nil {
						errs.add("client %d, round %d: %v", c, round, err)
						return
					}
					if d := txpDiff(steps, golden, got); d != "" {
						errs.add("client %d, round %d: %s", c, round, d)
						return
					}
				}
			})
			errs.check(t, cf.name)
		})
	}
}

// Statements that do not do what poolerd's bookkeeping assumes: a
// DEALLOCATE or DISCARD ALL that fails on the server, a DEALLOCATE that is
// one of several statements of a query string, and a Close that an earlier
// error skips. Each is compared with a direct connection, over a pool of
// one server connection.
func TestTxPreparedDeallocateEdges(t *testing.T) {
	t.Parallel()
	add := "SELECT $1::int + 1"
	cases := []struct {
		name  string
		bug   string    // what poolerd once got wrong here (documentation)
		setup []txpStep // on another connection that stays open
		steps []txpStep
	}{
		{"DISCARD ALL refused inside a transaction block", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "BEGIN; DISCARD ALL; ROLLBACK", rfq: 3, msgs: txpMsgs(txpQuery("BEGIN"), txpQuery("DISCARD ALL"), txpQuery("ROLLBACK"))},
			{name: "Bind s1 after the failed DISCARD ALL", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s1 again", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
		}},
		{"DISCARD ALL refused while another client has the same statement", "", []txpStep{
			{name: "another client prepares the SQL", rfq: 1, msgs: txpMsgs(txpParse("other", add), txpSync())},
		}, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "BEGIN; DISCARD ALL; ROLLBACK", rfq: 3, msgs: txpMsgs(txpQuery("BEGIN"), txpQuery("DISCARD ALL"), txpQuery("ROLLBACK"))},
			{name: "Parse s9 of the same SQL", rfq: 1, msgs: txpMsgs(txpParse("s9", add), txpBind("s9", "1"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE in an aborted transaction", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "BEGIN; 1/0; DEALLOCATE s1; ROLLBACK", rfq: 4, msgs: txpMsgs(
				txpQuery("BEGIN"), txpQuery("SELECT 1/0"), txpQuery("DEALLOCATE s1"), txpQuery("ROLLBACK"))},
			{name: "Bind s1 after the failed DEALLOCATE", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE ALL in an aborted transaction", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "BEGIN; 1/0; DEALLOCATE ALL; ROLLBACK", rfq: 4, msgs: txpMsgs(
				txpQuery("BEGIN"), txpQuery("SELECT 1/0"), txpQuery("DEALLOCATE ALL"), txpQuery("ROLLBACK"))},
			{name: "Bind s1 after the failed DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s1 again", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
		}},
		{"DEALLOCATE among several statements of a query string", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "DEALLOCATE s1; SELECT 1", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE s1; SELECT 1"))},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s1 again", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpBind("s1", "1"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE ALL over the extended protocol", "the statements were dropped on the server but poolerd still listed " +
			"them: the client's s1 answered 42P05 to a new Parse, and another client's statement of the same SQL got 26000", []txpStep{
			{name: "another client prepares the SQL", rfq: 1, msgs: txpMsgs(txpParse("other", add), txpSync())},
		}, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "Parse/Bind/Execute DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpParse("", "DEALLOCATE ALL"), txpBind(""), txpExec(), txpSync())},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s1 again", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpBind("s1", "2"), txpExec(), txpSync())},
			{name: "Parse s9 of the other client's SQL", rfq: 1, msgs: txpMsgs(txpParse("s9", add), txpBind("s9", "3"), txpExec(), txpSync())},
		}},
		{"DISCARD ALL over the extended protocol", "as DEALLOCATE ALL", []txpStep{
			{name: "another client prepares the SQL", rfq: 1, msgs: txpMsgs(txpParse("other", add), txpSync())},
		}, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "Parse d, Bind d, Execute (DISCARD ALL)", rfq: 1, msgs: txpMsgs(txpParse("d", "DISCARD ALL"), txpBind("d"), txpExec(), txpSync())},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s9 of the other client's SQL", rfq: 1, msgs: txpMsgs(txpParse("s9", add), txpBind("s9", "3"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE ALL pipelined before a Parse, over the extended protocol", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "DEALLOCATE ALL, then Parse s1 and Bind it, one Sync", rfq: 1, msgs: txpMsgs(
				txpParse("", "DEALLOCATE ALL"), txpBind(""), txpExec(),
				txpParse("s1", add), txpBind("s1", "4"), txpExec(), txpSync())},
			{name: "Bind s1", rfq: 1, msgs: txpMsgs(txpBind("s1", "5"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE ALL bound but never executed", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "Parse/Bind DEALLOCATE ALL, no Execute", rfq: 1, msgs: txpMsgs(txpParse("", "DEALLOCATE ALL"), txpBind(""), txpSync())},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE ALL, then a statement that fails, in one query string", "", []txpStep{
			{name: "another client prepares the SQL", rfq: 1, msgs: txpMsgs(txpParse("other", add), txpSync())},
		}, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "DEALLOCATE ALL; SELECT 1/0", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE ALL; SELECT 1/0"))},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s9 of the other client's SQL", rfq: 1, msgs: txpMsgs(txpParse("s9", add), txpBind("s9", "3"), txpExec(), txpSync())},
		}},
		{"a statement that fails, then DEALLOCATE ALL, in one query string", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "SELECT 1/0; DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpQuery("SELECT 1/0; DEALLOCATE ALL"))},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE of a name and DEALLOCATE ALL in one query string", "", []txpStep{
			{name: "another client prepares the SQL", rfq: 1, msgs: txpMsgs(txpParse("other", add), txpSync())},
		}, []txpStep{
			{name: "Parse s1, Parse s2", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpParse("s2", "SELECT 2"), txpSync())},
			{name: "DEALLOCATE s2; DEALLOCATE ALL", rfq: 1, msgs: txpMsgs(txpQuery("DEALLOCATE s2; DEALLOCATE ALL"))},
			{name: "Bind s1 after it", rfq: 1, msgs: txpMsgs(txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "Parse s9 of the other client's SQL", rfq: 1, msgs: txpMsgs(txpParse("s9", add), txpBind("s9", "3"), txpExec(), txpSync())},
		}},
		{"DISCARD ALL refused in a block, then a Bind pipelined behind it", "the names were forgotten when the DISCARD ALL " +
			"was sent: the Bind behind it went out under the client's name and got 26000 where PostgreSQL says 25P02", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "BEGIN", rfq: 1, msgs: txpMsgs(txpQuery("BEGIN"))},
			{name: "DISCARD ALL (unnamed), Sync, Bind s1, Execute, Sync", rfq: 2, msgs: txpMsgs(
				txpParse("", "DISCARD ALL"), txpBind(""), txpExec(), txpSync(), txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "ROLLBACK", rfq: 1, msgs: txpMsgs(txpQuery("ROLLBACK"))},
			{name: "Bind s1", rfq: 1, msgs: txpMsgs(txpBind("s1", "2"), txpExec(), txpSync())},
		}},
		{"DEALLOCATE refused in a block, then a Bind pipelined behind it", "", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "BEGIN; SELECT 1/0", rfq: 2, msgs: txpMsgs(txpQuery("BEGIN"), txpQuery("SELECT 1/0"))},
			{name: "DEALLOCATE s1, then Bind s1, Execute, Sync", rfq: 2, msgs: txpMsgs(
				txpQuery("DEALLOCATE s1"), txpBind("s1", "1"), txpExec(), txpSync())},
			{name: "ROLLBACK", rfq: 1, msgs: txpMsgs(txpQuery("ROLLBACK"))},
			{name: "Bind s1", rfq: 1, msgs: txpMsgs(txpBind("s1", "2"), txpExec(), txpSync())},
		}},
		{"Close skipped after an error, then Bind in the same write", "a Close that an earlier error skipped is undone only when " +
			"the error arrives: a Bind of the statement in the same write is forwarded under the client's name (26000)", nil, []txpStep{
			{name: "Parse s1", rfq: 1, msgs: txpMsgs(txpParse("s1", add), txpSync())},
			{name: "Bind nosuch, Close s1, Sync, Bind s1, Execute, Sync", rfq: 2, msgs: txpMsgs(
				txpBind("nosuch"), txpCloseStmt("s1"), txpSync(), txpBind("s1", "1"), txpExec(), txpSync())},
		}},
	}
	p := txpStart(t, config.PoolTransaction, 1, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxTimeout(t, 30*time.Second)
			if d := txpCompare(t, ctx, p.appDSN(), tc.setup, tc.steps); d != "" {
				t.Error(d)
			}
		})
	}
}

// An eviction (poolerd's Close of the least recently used statement) that
// an earlier error in its Sync group makes the server skip leaves the
// statement prepared. Pool of one server connection keeping one statement:
// client B prepares a statement; client A's pipeline fails before the Parse
// that needed B's statement evicted. B must still get the server connection
// while A is idle, and A preparing B's SQL must work.
func TestTxPreparedSkippedEviction(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 120*time.Second)
	p := startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 1
		c.MaxPreparedStatements = 1
		c.CheckoutTimeout = 3 * time.Second
	})
	steps := []struct {
		client string
		st     txpStep
	}{
		{"B", txpStep{name: "B: Parse b", rfq: 1, msgs: txpMsgs(txpParse("b", "SELECT 5 AS five"), txpSync())}},
		{"A", txpStep{name: "A: Bind nosuch, Parse s4 (evicts b's statement), Sync", rfq: 1, msgs: txpMsgs(
			txpBind("nosuch"), txpParse("s4", "SELECT 4"), txpSync())}},
		{"B", txpStep{name: "B: a query while A is idle", rfq: 1, msgs: txpMsgs(txpQuery("SELECT 1"))}},
		{"A", txpStep{name: "A: Parse s5 with b's SQL", rfq: 1, msgs: txpMsgs(
			txpParse("s5", "SELECT 5 AS five"), txpBind("s5"), txpExec(), txpSync())}},
		{"B", txpStep{name: "B: Bind b", rfq: 1, msgs: txpMsgs(txpBind("b"), txpExec(), txpSync())}},
	}
	run := func(dsn string) [][]string {
		t.Helper()
		conns := map[string]*txpRaw{}
		for _, n := range []string{"B", "A"} {
			r, err := txpDial(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer r.close()
			conns[n] = r
		}
		var out [][]string
		for _, x := range steps {
			tr, err := conns[x.client].run(x.st)
			if err != nil {
				t.Fatalf("%s: %v", x.st.name, err)
			}
			out = append(out, tr)
		}
		return out
	}
	golden := run(directDSN(pgtest.DBApp))
	got := run(p.appDSN())
	for i, x := range steps {
		if strings.Join(golden[i], " | ") != strings.Join(got[i], " | ") {
			t.Errorf("step %q:\n    direct:  %s\n    poolerd: %s", x.st.name, strings.Join(golden[i], " | "), strings.Join(got[i], " | "))
		}
	}
}

// ---------------------------------------------------------------------------
// 6. Deduplication, the LRU and their metrics.

// With one server connection that keeps two statements: four clients with
// five statements each, executed round robin, always get the right results
// (statements are evicted and injected again all the time, as the
// evictions metric shows); then ten clients preparing the same two
// statements share one server-side statement each: the later ones are
// cache hits and the server sees fewer Parses than the clients send.
func TestTxPreparedDedupLRUMetrics(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 1
		c.MaxPreparedStatements = 2
		c.LogLevel = "info"
	}})
	type counts struct{ client, server, hits, evictions float64 }
	scrape := func() counts {
		t.Helper()
		_, ms := obScrape(t, p)
		var c counts
		for _, m := range []struct {
			name string
			v    *float64
		}{
			{"poolerd_prepared_client_parses_total", &c.client},
			{"poolerd_prepared_server_parses_total", &c.server},
			{"poolerd_prepared_cache_hits_total", &c.hits},
			{"poolerd_prepared_evictions_total", &c.evictions},
		} {
			v, ok := ms.get(m.name, "database="+pgtest.DBApp, "user="+pgtest.RoleApp)
			if !ok {
				t.Fatalf("metric %s{database=app,user=app} missing", m.name)
			}
			*m.v = v
		}
		return c
	}
	ctx := ctxTimeout(t, 120*time.Second)

	// Phase 1: the LRU.
	before := scrape()
	var errs txpErrs
	txpParallel(4, func(c int) {
		conn, err := txpConnect(ctx, p.appDSN(), pgx.QueryExecModeCacheStatement)
		if err != nil {
			errs.add("client %d: connect: %v", c, err)
			return
		}
		defer conn.Close(context.Background())
		for k := range 5 {
			// Clients 0 and 1 share their SQL, 2 and 3 have their own.
			q := fmt.Sprintf("SELECT $1::int + %d", 100*k)
			if c >= 2 {
				q = fmt.Sprintf("SELECT $1::int + %d", 1000*c+100*k)
			}
			if _, err := conn.Prepare(ctx, fmt.Sprintf("lru%d", k), q); err != nil {
				errs.add("client %d: prepare lru%d: %v", c, k, err)
				return
			}
		}
		for i := range 30 {
			k := i % 5
			var n int
			if err := conn.QueryRow(ctx, fmt.Sprintf("lru%d", k), i).Scan(&n); err != nil {
				errs.add("client %d: execute lru%d: %v", c, k, err)
				return
			}
			base := 100 * k
			if c >= 2 {
				base += 1000 * c
			}
			if n != i+base {
				errs.add("client %d: lru%d(%d) = %d, want %d", c, k, i, n, i+base)
				return
			}
		}
	})
	errs.check(t, "round robin over an LRU of 2")
	after := scrape()
	t.Logf("LRU phase: client Parses %+.0f, server Parses %+.0f, cache hits %+.0f, evictions %+.0f",
		after.client-before.client, after.server-before.server, after.hits-before.hits, after.evictions-before.evictions)
	if after.evictions-before.evictions <= 0 {
		t.Errorf("no evictions counted with 20 statements in use and room for 2")
	}

	// Phase 2: deduplication across clients, all connected at once.
	dedup := func(t *testing.T, keep bool) (cp, sp, hits float64) {
		t.Helper()
		before := scrape()
		for c := range 10 {
			conn := connectConfig(t, p.appDSN(), nil)
			if _, err := conn.Prepare(ctx, fmt.Sprintf("dedup_a_%d", c), "SELECT $1::text || '-dedup'"); err != nil {
				t.Fatalf("client %d: %v", c, err)
			}
			if _, err := conn.Prepare(ctx, fmt.Sprintf("dedup_b_%d", c), "SELECT $1::int - 1"); err != nil {
				t.Fatalf("client %d: %v", c, err)
			}
			var s string
			var n int
			if err := conn.QueryRow(ctx, fmt.Sprintf("dedup_a_%d", c), fmt.Sprint(c)).Scan(&s); err != nil || s != fmt.Sprint(c, "-dedup") {
				t.Fatalf("client %d: dedup_a = %q, %v", c, s, err)
			}
			if err := conn.QueryRow(ctx, fmt.Sprintf("dedup_b_%d", c), c).Scan(&n); err != nil || n != c-1 {
				t.Fatalf("client %d: dedup_b = %d, %v", c, n, err)
			}
			if !keep {
				_ = conn.Close(ctx)
			}
		}
		after := scrape()
		cp, sp, hits = after.client-before.client, after.server-before.server, after.hits-before.hits
		t.Logf("client Parses %.0f, server Parses %.0f, cache hits %.0f, evictions %.0f",
			cp, sp, hits, after.evictions-before.evictions)
		return cp, sp, hits
	}
	check := func(t *testing.T, cp, sp, hits float64) {
		t.Helper()
		if cp < 20 {
			t.Errorf("%.0f client Parses counted for 10 clients preparing 2 statements each", cp)
		}
		if sp >= cp || sp > 2 {
			t.Errorf("%.0f server Parses for %.0f client Parses of 2 distinct statements on one server connection that keeps 2: want at most 2", sp, cp)
		}
		if hits < 18 {
			t.Errorf("%.0f cache hits: the 9 clients after the first prepare statements already on the server (want 18)", hits)
		}
	}
	t.Run("clients connected together", func(t *testing.T) {
		cp, sp, hits := dedup(t, true)
		check(t, cp, sp, hits)
	})
	t.Run("each client gone before the next comes", func(t *testing.T) {
		// The server connection still has the statements when their
		// last client has left: the next client's Parse is a cache hit.
		cp, sp, hits := dedup(t, false)
		check(t, cp, sp, hits)
	})
}

// search_path is part of a statement's identity: two clients preparing the
// same text (the same pgx statement name too) under different search_paths,
// where the text means different tables with different column types, each
// get their own table's rows over one server connection.
func TestTxPreparedSearchPath(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 120*time.Second)
	sa, sb := relayName("txp_a"), relayName("txp_b")
	dc := relayDirect(t)
	if _, err := dc.Exec(ctx, fmt.Sprintf(
		"CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.t (v text); INSERT INTO %[1]s.t VALUES ('alpha');"+
			"CREATE SCHEMA %[2]s; CREATE TABLE %[2]s.t (v int); INSERT INTO %[2]s.t VALUES (42)", sa, sb)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, pgtest.DBApp, fmt.Sprintf("DROP SCHEMA IF EXISTS %s, %s CASCADE", sa, sb))
	})
	p := txpStart(t, config.PoolTransaction, 1, 0)
	ca := connectConfig(t, p.appDSN("search_path="+sa), nil)
	cb := connectConfig(t, p.appDSN("search_path="+sb), nil)
	// A third client that sets its search_path with SET.
	cc := connectConfig(t, p.appDSN(), nil)
	if _, err := cc.Exec(ctx, "SET search_path TO "+sb); err != nil {
		t.Fatal(err)
	}
	const q = "SELECT v FROM t WHERE $1::int > 0"
	for i := 1; i <= 10; i++ {
		var a string
		if err := ca.QueryRow(ctx, q, i).Scan(&a); err != nil || a != "alpha" {
			t.Fatalf("round %d, search_path %s: %q, %v", i, sa, a, err)
		}
		var b int
		if err := cb.QueryRow(ctx, q, i).Scan(&b); err != nil || b != 42 {
			t.Fatalf("round %d, search_path %s: %d, %v", i, sb, b, err)
		}
		var c int
		if err := cc.QueryRow(ctx, q, i).Scan(&c); err != nil || c != 42 {
			t.Fatalf("round %d, SET search_path %s: %d, %v", i, sb, c, err)
		}
	}
}

// ---------------------------------------------------------------------------
// 7. Statement mode.

// In statement mode BEGIN (simple or extended protocol, or pgx's Begin)
// ends the session with FATAL 08P01, as PgBouncer ends it, so that none of
// the statements meant for the block runs on its own (a psql script without
// ON_ERROR_STOP goes on after an ERROR); single statements, prepared
// statements from many clients, and query strings of several statements
// (a whole transaction among them) work.
func TestTxPreparedStatementMode(t *testing.T) {
	t.Parallel()
	p := txpStart(t, config.PoolStatement, 2, 0)
	ctx := ctxTimeout(t, 120*time.Second)
	table := relayTable(t, "v int")

	ended := func(what string, err error) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "08P01" || pe.Message != "transaction blocks not allowed in statement pooling mode" {
			t.Fatalf("%s: got %v, want FATAL 08P01 transaction blocks not allowed in statement pooling mode", what, err)
		}
		if pe.Hint == "" {
			t.Errorf("%s: the refusal has no hint", what)
		}
	}
	for _, tc := range []struct {
		what string
		run  func(c *pgx.Conn) error
	}{
		{"BEGIN", func(c *pgx.Conn) error { _, err := c.Exec(ctx, "BEGIN"); return err }},
		{"pgx Begin", func(c *pgx.Conn) error { _, err := c.Begin(ctx); return err }},
		{"START TRANSACTION", func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, "start transaction isolation level serializable")
			return err
		}},
		{"a query string that leaves a block open", func(c *pgx.Conn) error {
			_, err := c.PgConn().Exec(ctx, "BEGIN; INSERT INTO "+table+" VALUES (9)").ReadAll()
			return err
		}},
	} {
		c := connectConfig(t, p.appDSN(), nil)
		ended(tc.what, tc.run(c))
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Errorf("%s: the session went on after the refusal", tc.what)
		}
	}
	conn := connectConfig(t, p.appDSN(), nil)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after the refused block: %d, %v; want none (nothing meant for the block ran)", n, err)
	}

	// BEGIN through the extended protocol ends the session too.
	rc, err := txpDial(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.close()
	tr, _ := rc.run(txpStep{name: "extended BEGIN", rfq: 1, msgs: txpMsgs(txpParse("", "BEGIN"), txpBind(""), txpExec(), txpSync())})
	if len(tr) != 1 || !strings.Contains(tr[0], "08P01") {
		t.Fatalf("extended BEGIN: %v, want one FATAL 08P01 and the end", tr)
	}
	if err := conn.QueryRow(ctx, "SELECT $1::int + 1", 1).Scan(&n); err != nil || n != 2 {
		t.Fatalf("another client's query: %d, %v", n, err)
	}

	// Query strings of several statements are one statement for the pool.
	results, err := conn.PgConn().Exec(ctx, "SELECT 1; SELECT 2").ReadAll()
	if err != nil || len(results) != 2 || string(results[1].Rows[0][0]) != "2" {
		t.Fatalf("SELECT 1; SELECT 2: %v, %v", results, err)
	}
	t.Run("transaction as one query string", func(t *testing.T) {
		// The refusal's hint says to send the transaction as one query
		// string: that must work.
		results, err := conn.PgConn().Exec(ctx, fmt.Sprintf(
			"BEGIN; INSERT INTO %[1]s VALUES (1); INSERT INTO %[1]s VALUES (2); COMMIT", table)).ReadAll()
		if err != nil {
			t.Fatalf("BEGIN; INSERT; INSERT; COMMIT as one query string: %v", err)
		}
		if len(results) != 4 {
			t.Fatalf("%d results", len(results))
		}
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 2 {
			t.Fatalf("rows after the transaction: %d, %v", n, err)
		}
	})

	// Many clients with prepared statements over the pool of 2.
	var errs txpErrs
	txpParallel(20, func(c int) {
		cn, err := txpConnect(ctx, p.appDSN(), pgx.QueryExecModeCacheStatement)
		if err != nil {
			errs.add("client %d: %v", c, err)
			return
		}
		defer cn.Close(context.Background())
		for i := range 20 {
			var a int
			var b string
			if err := cn.QueryRow(ctx, "SELECT $1::int * 2", i).Scan(&a); err != nil || a != 2*i {
				errs.add("client %d: %d, %v", c, a, err)
				return
			}
			if err := cn.QueryRow(ctx, fmt.Sprintf("SELECT $1::text || '/%d'", c), strconv.Itoa(i)).Scan(&b); err != nil || b != fmt.Sprintf("%d/%d", i, c) {
				errs.add("client %d: %q, %v", c, b, err)
				return
			}
		}
	})
	errs.check(t, "statement mode clients")
}

// A client Parse of a statement the server connection already has (the
// cache hit) is sent as a Parse of a scratch statement. Its parse analysis
// must take no snapshot: a SELECT's took the transaction's snapshot, and
// the client's SET TRANSACTION ISOLATION LEVEL right after BEGIN, or its
// pipelined BEGIN ISOLATION LEVEL, then failed with 25001 ("must be called
// before any query") where a direct connection runs it (the state fuzzer's
// seed 50002140). Pool of one: the second client gets the first one's
// server connection, where the statements are prepared.
func TestTxPreparedCacheHitTakesNoSnapshot(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	p := txpStart(t, config.PoolTransaction, 1, 0)
	// pgx's default mode prepares every statement (Parse, Describe, Sync),
	// then runs it: inside the block, the second client's Parse is a hit.
	for i := range 2 {
		c, err := txpConnect(ctx, p.appDSN(), pgx.QueryExecModeCacheStatement)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "COMMIT"} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Errorf("client %d: %s: %v", i, q, err)
			}
		}
		_ = c.Close(ctx)
	}
	// One pipeline: a DO, a Sync, then BEGIN ISOLATION LEVEL under a name
	// (Parse, Describe, Bind, Execute) and a Sync: the hit's scratch Parse
	// is in BEGIN's implicit transaction.
	steps := []txpStep{{name: "DO; Sync; Parse+Describe+Bind+Execute BEGIN ISOLATION LEVEL; Sync", rfq: 2, msgs: txpMsgs(
		txpParse("", "DO $$ begin perform 1; end $$"), txpBind(""), txpExec(), txpSync(),
		txpParse("iso", "BEGIN ISOLATION LEVEL REPEATABLE READ"), txpDescribeStmt("iso"), txpBind("iso"), txpExec(), txpSync())},
		{name: "ROLLBACK", rfq: 1, msgs: txpMsgs(txpQuery("ROLLBACK"))},
	}
	golden, err := txpRunSteps(ctx, directDSN(pgtest.DBApp), steps)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(golden[0], " | ")
	if !strings.Contains(want, "CommandComplete(BEGIN) | ReadyForQuery(T)") {
		t.Fatalf("direct: %s", want)
	}
	for i := range 2 {
		got, err := txpRunSteps(ctx, p.appDSN(), steps)
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.Join(got[0], " | "); s != want {
			t.Errorf("client %d (the second one's Parse is a cache hit):\n    got:  %s\n    want: %s", i, s, want)
		}
	}
}

// DEALLOCATE ALL drops every prepared statement at its CommandComplete:
// a DISCARD ALL after it in the same Query, which fails there (25001: a
// multi-statement Query is a transaction block), gives nothing back. poolerd
// made the whole text one drop, tagged DISCARD ALL and undone by its error:
// it listed again a definition the server no longer had, and the next
// client's Bind of it got 26000 (the state fuzzer's seed 60068749). Pool of
// one: B prepares on the connection A's Query then empties.
func TestTxPreparedDeallocateAllThenFailedDiscard(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	p := txpStart(t, config.PoolTransaction, 1, 0)
	b, err := pgconn.Connect(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	if _, err := b.Prepare(ctx, "b_stmt", "SELECT 42", nil); err != nil {
		t.Fatal(err)
	}
	a, err := pgconn.Connect(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	_, err = a.Exec(ctx, "DEALLOCATE ALL; DISCARD ALL").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25001" {
		t.Fatalf("DEALLOCATE ALL; DISCARD ALL: %v, want 25001 (DISCARD ALL in a transaction block)", err)
	}
	r := b.ExecPrepared(ctx, "b_stmt", nil, nil, nil).Read()
	if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != "42" {
		t.Fatalf("B's prepared statement after A's DEALLOCATE ALL: %v %q", r.Err, r.Rows)
	}
}

// TestTxPreparedCapFollowsSet: max_prepared_statements changed by SET (or
// a reload) applies to connected clients' statements from their next
// Parse, as PgBouncer's cache size does: one server connection keeps 1,
// then 5, then 2 of a client's statements.
func TestTxPreparedCapFollowsSet(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize, c.MinSize = 1, 0
		c.MaxPreparedStatements = 1
	}})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	ctx := ctxTimeout(t, 30*time.Second)
	conn, err := txpConnect(ctx, p.appDSN(), pgx.QueryExecModeCacheStatement)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	prepare := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			var got int
			if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT %d + $1::int", i), 0).Scan(&got); err != nil || got != i {
				t.Fatalf("statement %d: %d %v", i, got, err)
			}
		}
	}
	onServer := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*)::int FROM pg_prepared_statements", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	prepare(0, 5)
	if n := onServer(); n != 1 {
		t.Fatalf("max_prepared_statements 1: %d statements on the server connection", n)
	}
	obCmd(t, adm, "SET max_prepared_statements = 5", "SET max_prepared_statements=5")
	prepare(5, 10)
	if n := onServer(); n != 5 {
		t.Fatalf("after SET 5: %d statements on the server connection", n)
	}
	obCmd(t, adm, "SET max_prepared_statements = 2", "SET max_prepared_statements=2")
	prepare(10, 11)
	if n := onServer(); n != 2 {
		t.Fatalf("after SET 2 and one more statement: %d statements on the server connection", n)
	}
}

// TestTxPreparedCountersNamedOnly: SHOW STATS' parse and bind counters
// count named statements only, as PgBouncer's: unnamed ones (pgx's exec
// mode, psycopg's default) leave them at 0; a named statement counts one
// client Parse, one server Parse for each server connection that prepares
// it, and one Bind per execution.
func TestTxPreparedCountersNamedOnly(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 1
		c.MaxPreparedStatements = 10
	}})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	counts := func() [3]int64 {
		t.Helper()
		tb := obShow(t, adm, "SHOW STATS")
		i := tb.find("database", pgtest.DBApp)
		if i < 0 {
			return [3]int64{}
		}
		return [3]int64{tb.num(i, "total_client_parse_count"), tb.num(i, "total_server_parse_count"), tb.num(i, "total_bind_count")}
	}
	ctx := ctxTimeout(t, 30*time.Second)
	c, err := txpConnect(ctx, p.appDSN(), pgx.QueryExecModeExec)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for range 3 {
		var n int
		if err := c.QueryRow(ctx, "SELECT $1::int", 1).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	if got := counts(); got != [3]int64{} {
		t.Fatalf("after 3 unnamed statements: client parses, server parses, binds = %v, want 0 0 0", got)
	}
	if _, err := c.Prepare(ctx, "named1", "SELECT $1::int + 1"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		var n int
		if err := c.QueryRow(ctx, "named1", i).Scan(&n); err != nil || n != i+1 {
			t.Fatalf("named1(%d) = %d, %v", i, n, err)
		}
	}
	if got := counts(); got != [3]int64{1, 1, 2} {
		t.Fatalf("after one named statement run twice: client parses, server parses, binds = %v, want 1 1 2", got)
	}
}
