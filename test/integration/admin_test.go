package integration

// Tests of the admin console (the virtual database "pgbouncer"): the column
// lists of every SHOW against PgBouncer 1.25's (docs/admin-console-reference.md),
// what the values say under load, permissions, the parser, and the control
// commands (PAUSE/RESUME, DISABLE/ENABLE, RECONNECT/WAIT_CLOSE, KILL,
// KILL_CLIENT, SET, SHUTDOWN); and access through lib/pq, the driver of
// pgbouncer_exporter.
//
// The helpers of this file, reload_test.go and observability_test.go are
// prefixed ob.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	_ "github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/console"
	"github.com/poolerd/poolerd/internal/health"
	"github.com/poolerd/poolerd/internal/observe"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/test/pgtest"
)

// ---------------------------------------------------------------------------
// Helpers (prefixed ob).

// obOpts configure obStart.
type obOpts struct {
	// mutate adjusts the harness's configuration (as startPoolerd's);
	// ignored when cfg is set.
	mutate func(c *config.Config)
	// cfg is a complete, validated configuration to run with as is (from
	// a config.Loader, say).
	cfg *config.Config
	// reload gives the server this reloader (RELOAD on the console).
	reload proxy.ReloadFunc
	// metrics instruments the server (before Warm and Serve, as main.go
	// does) and registers the Go, process and build info collectors.
	metrics bool
	// http serves the health endpoints (health.New, as main.go does) on
	// 127.0.0.1:0.
	http bool
	// stats runs the SHOW STATS averages ticker (observe.Stats.Run).
	stats bool
}

// obInst is a poolerd started by obStart.
type obInst struct {
	*instance
	reg  *prometheus.Registry
	base string // http://127.0.0.1:port of the health server, if any
	hc   *http.Client
}

// obStart starts poolerd in-process like startPoolerd, with what
// startPoolerd cannot do: metrics registered before Warm, the HTTP server,
// a reloader and the stats ticker. Everything stops when the test ends.
func obStart(t *testing.T, o obOpts) *obInst {
	t.Helper()
	var cfg config.Config
	if o.cfg != nil {
		cfg = *o.cfg
	} else {
		cfg = config.Defaults()
		cfg.Listen = "127.0.0.1:0"
		cfg.HTTPListen = ""
		cfg.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		cfg.MaxSize = 5
		cfg.CheckoutTimeout = 10 * time.Second
		cfg.ShutdownTimeout = 5 * time.Second
		cfg.LogLevel = "debug"
		cfg.AdminUsers = []string{pgtest.RoleApp}
		testVerifyHandoff(&cfg)
		if o.mutate != nil {
			o.mutate(&cfg)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("invalid test configuration: %v", err)
		}
	}
	logs := newLogBuffer()
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, logs, zapcore.DebugLevel))
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	srv := proxy.New(&cfg, log)
	srv.SetVersion("ob-test")
	reg := prometheus.NewRegistry()
	if o.metrics {
		if err := srv.Instrument(reg); err != nil {
			t.Fatalf("Instrument: %v", err)
		}
		if err := observe.Register(reg, srv); err != nil {
			t.Fatalf("observe.Register: %v", err)
		}
		reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
			// main.go registers poolerd_build_info itself; the same here.
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "poolerd_build_info",
				Help:        "poolerd's version; always 1.",
				ConstLabels: prometheus.Labels{"version": "ob-test", "goversion": runtime.Version()},
			}, func() float64 { return 1 }),
		)
	}
	if o.reload != nil {
		srv.SetReloader(o.reload, nil)
	}
	statsCtx, stopStats := context.WithCancel(context.Background())
	statsDone := make(chan struct{})
	if o.stats {
		stats := observe.NewStats(srv, log)
		srv.SetConsole(console.New(srv, stats))
		go func() { defer close(statsDone); stats.Run(statsCtx) }()
	} else {
		srv.SetConsole(console.New(srv, nil))
		close(statsDone)
	}
	srv.Warm()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	inst := &obInst{instance: &instance{srv: srv, addr: ln.Addr().String(), cfg: &cfg, logs: logs}, reg: reg}
	var hs *health.Server
	httpDone := make(chan struct{})
	if o.http {
		hln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hs = health.New(health.Options{Ready: srv, Gatherer: reg, Report: func() any { return observe.Report(srv) },
			Pprof: cfg.HTTPPprof, Log: log})
		go func() { defer close(httpDone); _ = hs.Serve(hln) }()
		inst.base = "http://" + hln.Addr().String()
		tr := &http.Transport{MaxIdleConnsPerHost: 4}
		inst.hc = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	} else {
		close(httpDone)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if hs != nil {
			inst.hc.Transport.(*http.Transport).CloseIdleConnections()
			_ = hs.Shutdown(ctx)
		}
		<-httpDone
		_ = srv.Shutdown(ctx)
		<-done
		stopStats()
		<-statsDone
		checkHandoffs(t, inst.instance)
		if t.Failed() {
			dumpLog(t, "poolerd log", logs.String())
		}
	})
	return inst
}

// obAdmin opens an admin console connection as user (password secret).
func obAdmin(t *testing.T, p *instance, user string) *pgconn.PgConn {
	t.Helper()
	return obAdminDB(t, p, user, "pgbouncer")
}

// obAdminDB is obAdmin with the console's database name (pgbouncer or poolerd).
func obAdminDB(t *testing.T, p *instance, user, db string) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.Connect(ctxTimeout(t, 15*time.Second), p.dsn(user, pgtest.Password, db))
	if err != nil {
		t.Fatalf("admin console login as %s: %v", user, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// obConn opens a pgx connection to database db through p as app, with
// application_name app (transaction-pooling-safe exec mode).
func obConn(t *testing.T, p *instance, db, app string) *pgx.Conn {
	t.Helper()
	return connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, db, txExecMode, "application_name="+app))
}

// obTable is the answer to one console command.
type obTable struct {
	Cols   []string
	OIDs   []uint32
	Fields []pgconn.FieldDescription
	Rows   [][][]byte
	Tag    string
}

// obRun runs sql on the console and returns its single result.
func obRun(ctx context.Context, c *pgconn.PgConn, sql string) (obTable, error) {
	results, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return obTable{}, err
	}
	if len(results) != 1 {
		return obTable{}, fmt.Errorf("%s: %d results, want 1", sql, len(results))
	}
	r := results[0]
	tb := obTable{Tag: r.CommandTag.String(), Rows: r.Rows, Fields: r.FieldDescriptions}
	for _, fd := range r.FieldDescriptions {
		tb.Cols = append(tb.Cols, fd.Name)
		tb.OIDs = append(tb.OIDs, fd.DataTypeOID)
	}
	return tb, nil
}

// obShow runs a console command that must succeed.
func obShow(t *testing.T, c *pgconn.PgConn, sql string) obTable {
	t.Helper()
	tb, err := obRun(ctxTimeout(t, 15*time.Second), c, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tb
}

// obCmd runs a console command that must succeed with tag.
func obCmd(t *testing.T, c *pgconn.PgConn, sql, tag string) {
	t.Helper()
	if tb := obShow(t, c, sql); tb.Tag != tag {
		t.Fatalf("%s: tag %q, want %q", sql, tb.Tag, tag)
	}
}

// obErr runs a console command that must fail with ERROR code and message
// msg; the connection must stay usable.
func obErr(t *testing.T, c *pgconn.PgConn, sql, code, msg string) *pgconn.PgError {
	t.Helper()
	_, err := obRun(ctxTimeout(t, 15*time.Second), c, sql)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: got %v, want ERROR %s %q", sql, err, code, msg)
	}
	if pe.Severity != "ERROR" || pe.Code != code || pe.Message != msg {
		t.Fatalf("%s: got %s %s %q (detail %q), want ERROR %s %q", sql, pe.Severity, pe.Code, pe.Message, pe.Detail, code, msg)
	}
	if tb, err := obRun(ctxTimeout(t, 15*time.Second), c, "SHOW VERSION"); err != nil || len(tb.Rows) != 1 {
		t.Fatalf("console unusable after the error of %s: %v", sql, err)
	}
	return pe
}

func (tb obTable) col(name string) int { return slices.Index(tb.Cols, name) }

// val returns row i's value of column name ("" for NULL).
func (tb obTable) val(i int, name string) string {
	j := tb.col(name)
	if j < 0 {
		panic("no column " + name)
	}
	return string(tb.Rows[i][j])
}

// isNull reports whether row i's value of column name is NULL.
func (tb obTable) isNull(i int, name string) bool { return tb.Rows[i][tb.col(name)] == nil }

// num returns row i's value of column name as an integer (-1 if it is not).
func (tb obTable) num(i int, name string) int64 {
	n, err := strconv.ParseInt(tb.val(i, name), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// find returns the first row whose columns have the given values
// (column, value pairs), or -1.
func (tb obTable) find(pairs ...string) int {
rows:
	for i := range tb.Rows {
		for k := 0; k+1 < len(pairs); k += 2 {
			if tb.val(i, pairs[k]) != pairs[k+1] {
				continue rows
			}
		}
		return i
	}
	return -1
}

// must is find that fails the test when no row matches.
func (tb obTable) must(t *testing.T, what string, pairs ...string) int {
	t.Helper()
	i := tb.find(pairs...)
	if i < 0 {
		t.Fatalf("%s: no row with %v in\n%s", what, pairs, tb)
	}
	return i
}

// column returns every row's value of column name.
func (tb obTable) column(name string) []string {
	out := make([]string, len(tb.Rows))
	for i := range tb.Rows {
		out[i] = tb.val(i, name)
	}
	return out
}

func (tb obTable) String() string {
	var b strings.Builder
	b.WriteString(strings.Join(tb.Cols, " | "))
	for _, r := range tb.Rows {
		b.WriteString("\n")
		vals := make([]string, len(r))
		for j, v := range r {
			if v == nil {
				vals[j] = "NULL"
			} else {
				vals[j] = string(v)
			}
		}
		b.WriteString(strings.Join(vals, " | "))
	}
	return b.String()
}

// obConfigValue returns SHOW CONFIG's value of key.
func obConfigValue(t *testing.T, c *pgconn.PgConn, key string) string {
	t.Helper()
	tb := obShow(t, c, "SHOW CONFIG")
	return tb.val(tb.must(t, "SHOW CONFIG", "key", key), "value")
}

// obPoolRow returns SHOW POOLS and the row of database db, user app.
func obPoolRow(t *testing.T, c *pgconn.PgConn, db string) (obTable, int) {
	t.Helper()
	tb := obShow(t, c, "SHOW POOLS")
	return tb, tb.must(t, "SHOW POOLS", "database", db, "user", pgtest.RoleApp)
}

// obPoolSize returns SHOW DATABASES' pool_size (the effective max_size) of db.
func obPoolSize(t *testing.T, c *pgconn.PgConn, db string) int64 {
	t.Helper()
	tb := obShow(t, c, "SHOW DATABASES")
	return tb.num(tb.must(t, "SHOW DATABASES", "name", db), "pool_size")
}

// obCheckMaxSize checks the max_size of the app/app pool (what the pool
// itself enforces) and SHOW DATABASES' pool_size of app.
func obCheckMaxSize(t *testing.T, p *instance, c *pgconn.PgConn, want int, when string) {
	t.Helper()
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).MaxSize; got != want {
		t.Errorf("pool max_size %d %s, want %d", got, when, want)
	}
	if got := obPoolSize(t, c, pgtest.DBApp); got != int64(want) {
		t.Errorf("SHOW DATABASES pool_size %d %s, want %d", got, when, want)
	}
}

// obRaw is a client connection taken over from pgconn after login, to read
// exactly what poolerd sends (a FATAL before the close, say).
type obRaw struct {
	t  *testing.T
	nc net.Conn
	fe *pgproto3.Frontend
}

// obRawConnect logs in to db through p as user and hijacks the connection.
func obRawConnect(t *testing.T, p *instance, user, db string, extra ...string) *obRaw {
	t.Helper()
	pc, err := pgconn.Connect(ctxTimeout(t, 15*time.Second), p.dsn(user, pgtest.Password, db, extra...))
	if err != nil {
		t.Fatalf("connect to %s as %s: %v", db, user, err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		t.Fatalf("hijack: %v", err)
	}
	r := &obRaw{t: t, nc: hc.Conn, fe: pgproto3.NewFrontend(hc.Conn, hc.Conn)}
	t.Cleanup(func() { _ = r.nc.Close() })
	return r
}

// send writes a simple query.
func (r *obRaw) send(sql string) {
	r.t.Helper()
	r.fe.Send(&pgproto3.Query{String: sql})
	_ = r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := r.fe.Flush(); err != nil {
		r.t.Fatalf("send %q: %v", sql, err)
	}
}

// exec runs a simple query and fails the test on an error.
func (r *obRaw) exec(sql string) {
	r.t.Helper()
	r.send(sql)
	_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = r.nc.SetReadDeadline(time.Time{}) }()
	for {
		m, err := r.fe.Receive()
		if err != nil {
			r.t.Fatalf("%s: %v", sql, err)
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			r.t.Fatalf("%s: %s %s %s", sql, m.Severity, m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			return
		}
	}
}

// expectEnd reads until the connection closes (within d) and returns the
// messages received before the close; a timeout fails the test.
func (r *obRaw) expectEnd(d time.Duration) []pgproto3.BackendMessage {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(d))
	var got []pgproto3.BackendMessage
	for {
		m, err := r.fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				r.t.Fatalf("connection still open after %s (received %d messages)", d, len(got))
			}
			return got
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			cp := *m
			got = append(got, &cp)
		default:
			got = append(got, m)
		}
	}
}

// expectFatal expects a FATAL code/msg and then the end of the connection.
func (r *obRaw) expectFatal(d time.Duration, code, msg string) {
	r.t.Helper()
	got := r.expectEnd(d)
	for _, m := range got {
		if e, ok := m.(*pgproto3.ErrorResponse); ok && e.Severity == "FATAL" && e.Code == code && e.Message == msg {
			return
		}
	}
	var desc []string
	for _, m := range got {
		desc = append(desc, describeMsg(m))
	}
	r.t.Fatalf("got %v before the close, want FATAL %s %q", desc, code, msg)
}

// obLoginErr connects (pgconn) with dsn, which must fail with a server
// error; it returns it.
func obLoginErr(t *testing.T, dsn string) *pgconn.PgError {
	t.Helper()
	c, err := pgconn.Connect(ctxTimeout(t, 15*time.Second), dsn)
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatalf("login succeeded, want it refused")
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("login failed without a server error: %v", err)
	}
	return pe
}

// obAsync runs f in a goroutine; the channel delivers its error.
func obAsync(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// obAsyncLogin logs in to database app as app (with startup parameters
// extra) and runs SELECT 1, on a goroutine; the channel gets the outcome.
func obAsyncLogin(ctx context.Context, p *instance, extra ...string) <-chan error {
	return obAsync(func() error {
		c, err := pgx.Connect(ctx, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBApp, append([]string{txExecMode}, extra...)...))
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "SELECT 1")
		return err
	})
}

// obPending checks that ch has not delivered within d.
func obPending(t *testing.T, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned early (err %v)", what, err)
	case <-time.After(d):
	}
}

// obDone waits up to d for ch and returns its error.
func obDone(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s still not done after %s", what, d)
		return nil
	}
}

// obBegin opens a transaction on c and returns the backend pid serving it.
func obBegin(t *testing.T, c *pgx.Conn) int {
	t.Helper()
	ctx := ctxTimeout(t, 15*time.Second)
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatalf("BEGIN: %v", err)
	}
	var pid int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("pg_backend_pid: %v", err)
	}
	return pid
}

func obExec(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	if _, err := c.Exec(ctxTimeout(t, 15*time.Second), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// ---------------------------------------------------------------------------
// Column lists.

// obPgBouncerColumns are PgBouncer 1.25's columns, "name:letter" with the
// letters of pktbuf_write_RowDescription (s text, i int4, N numeric, T
// timestamp sent as text).
var obPgBouncerColumns = map[string][]string{
	"POOLS": {"database:s", "user:s", "cl_active:i", "cl_waiting:i", "cl_active_cancel_req:i", "cl_waiting_cancel_req:i",
		"sv_active:i", "sv_active_cancel:i", "sv_being_canceled:i", "sv_idle:i", "sv_used:i", "sv_tested:i", "sv_login:i",
		"maxwait:i", "maxwait_us:i", "pool_mode:s", "load_balance_hosts:s"},
	"STATS": {"database:s", "total_server_assignment_count:N", "total_xact_count:N", "total_query_count:N",
		"total_received:N", "total_sent:N", "total_xact_time:N", "total_query_time:N", "total_wait_time:N",
		"total_client_parse_count:N", "total_server_parse_count:N", "total_bind_count:N",
		"avg_server_assignment_count:N", "avg_xact_count:N", "avg_query_count:N", "avg_recv:N", "avg_sent:N",
		"avg_xact_time:N", "avg_query_time:N", "avg_wait_time:N", "avg_client_parse_count:N",
		"avg_server_parse_count:N", "avg_bind_count:N"},
	"STATS_TOTALS": {"database:s", "server_assignment_count:N", "xact_count:N", "query_count:N", "bytes_received:N",
		"bytes_sent:N", "xact_time:N", "query_time:N", "wait_time:N", "client_parse_count:N", "server_parse_count:N",
		"bind_count:N"},
	"STATS_AVERAGES": {"database:s", "server_assignment_count:N", "xact_count:N", "query_count:N", "bytes_received:N",
		"bytes_sent:N", "xact_time:N", "query_time:N", "wait_time:N", "avg_client_parse_count:N",
		"avg_server_parse_count:N", "avg_bind_count:N"},
	"CLIENTS": obSocketColumns,
	"SERVERS": obSocketColumns,
	"DATABASES": {"name:s", "host:s", "port:i", "database:s", "force_user:s", "pool_size:i", "min_pool_size:i",
		"reserve_pool_size:i", "server_lifetime:i", "pool_mode:s", "load_balance_hosts:s", "max_connections:i",
		"current_connections:i", "max_client_connections:i", "current_client_connections:i", "paused:i", "disabled:i"},
	"USERS": {"name:s", "pool_size:s", "reserve_pool_size:s", "pool_mode:s", "max_user_connections:i",
		"current_connections:i", "max_user_client_connections:i", "current_client_connections:i"},
	"LISTS":   {"list:s", "items:i"},
	"STATE":   {"key:s", "value:s"},
	"VERSION": {"version:s"},
	"CONFIG":  {"key:s", "value:s", "default:s", "changeable:s"},
}

var obSocketColumns = []string{"type:s", "user:s", "database:s", "replication:s", "state:s", "addr:s", "port:i",
	"local_addr:s", "local_port:i", "connect_time:T", "request_time:T", "wait:i", "wait_us:i", "close_needed:i",
	"ptr:s", "link:s", "remote_pid:i", "tls:s", "application_name:s", "prepared_statements:i", "id:i"}

// obExtraColumns are the columns poolerd may send after PgBouncer's: exactly
// these for the listed commands. POOLS has exactly PgBouncer's 17 (tools
// pick a layout by column count); VERSION, LISTS and CONFIG must have none
// (pgbouncer_exporter checks their column count); the others may have any.
var obExtraColumns = map[string][]string{
	"POOLS":   {},
	"VERSION": {},
	"LISTS":   {},
	"CONFIG":  {},
	"STATE":   {},
}

var obLetterOID = map[string]uint32{"s": 25, "i": 23, "N": 1700, "T": 25, "q": 20}

func TestAdminShowColumns(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		two, session := 2, config.PoolSession
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password,
			Overrides: config.Overrides{MaxSize: &two, PoolMode: &session}}}
	}})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	// One client, so that CLIENTS and SERVERS have rows of each kind.
	c := obConn(t, p.instance, pgtest.DBApp, "obcols")
	obBegin(t, c)

	for _, cmd := range []string{"POOLS", "STATS", "STATS_TOTALS", "STATS_AVERAGES", "CLIENTS", "SERVERS",
		"DATABASES", "USERS", "LISTS", "STATE", "VERSION", "CONFIG"} {
		t.Run(cmd, func(t *testing.T) {
			tb := obShow(t, adm, "SHOW "+cmd)
			if tb.Tag != "SHOW" {
				t.Errorf("tag %q, want SHOW", tb.Tag)
			}
			want := obPgBouncerColumns[cmd]
			if len(tb.Cols) < len(want) {
				t.Fatalf("%d columns %v, want PgBouncer's %d first", len(tb.Cols), tb.Cols, len(want))
			}
			for i, spec := range want {
				name, letter, _ := strings.Cut(spec, ":")
				if tb.Cols[i] != name {
					t.Fatalf("column %d is %q, want %q\ngot  %v\nwant %v", i+1, tb.Cols[i], name, tb.Cols, want)
				}
				if tb.OIDs[i] != obLetterOID[letter] {
					t.Errorf("column %s has type OID %d, want %d (%s)", name, tb.OIDs[i], obLetterOID[letter], letter)
				}
			}
			extra := tb.Cols[len(want):]
			if allowed, ok := obExtraColumns[cmd]; ok {
				var names []string
				for j, spec := range allowed {
					name, letter, _ := strings.Cut(spec, ":")
					names = append(names, name)
					if k := len(want) + j; k < len(tb.OIDs) && tb.OIDs[k] != obLetterOID[letter] {
						t.Errorf("extra column %s has type OID %d, want %d", name, tb.OIDs[k], obLetterOID[letter])
					}
				}
				if !slices.Equal(extra, names) {
					t.Errorf("columns after PgBouncer's: %v, want %v", extra, names)
				}
			} else if len(extra) > 0 {
				t.Logf("poolerd's own columns after PgBouncer's: %v", extra)
			}
			// Every field as PgBouncer sends it: no table, typmod -1,
			// text format, int4 of size 4.
			for _, fd := range tb.Fields {
				size := int16(-1)
				if fd.DataTypeOID == 23 {
					size = 4
				}
				if fd.TableOID != 0 || fd.TableAttributeNumber != 0 || fd.TypeModifier != -1 || fd.Format != 0 || fd.DataTypeSize != size {
					t.Errorf("field %s: %+v", fd.Name, fd)
				}
			}
			for i, r := range tb.Rows {
				if len(r) != len(tb.Cols) {
					t.Fatalf("row %d has %d values for %d columns", i, len(r), len(tb.Cols))
				}
				for j, v := range r {
					if v != nil && tb.OIDs[j] != 25 {
						if _, err := strconv.ParseInt(string(v), 10, 64); err != nil {
							t.Errorf("row %d column %s = %q is not an integer", i, tb.Cols[j], v)
						}
					}
				}
			}
			if len(tb.Rows) == 0 {
				t.Errorf("no rows")
			}
			t.Logf("%d columns, %d rows", len(tb.Cols), len(tb.Rows))
		})
	}

	t.Run("row names", func(t *testing.T) {
		lists := obShow(t, adm, "SHOW LISTS")
		wantLists := []string{"databases", "users", "peers", "pools", "peer_pools", "free_clients", "used_clients",
			"login_clients", "free_servers", "used_servers", "dns_names", "dns_zones", "dns_queries", "dns_pending"}
		if got := lists.column("list"); !slices.Equal(got, wantLists) {
			t.Errorf("SHOW LISTS rows %v, want %v", got, wantLists)
		}
		state := obShow(t, adm, "SHOW STATE")
		if got := state.column("key"); !slices.Equal(got, []string{"active", "paused", "suspended"}) {
			t.Errorf("SHOW STATE rows %v", got)
		}
		if got := state.column("value"); !slices.Equal(got, []string{"yes", "no", "no"}) {
			t.Errorf("SHOW STATE values %v while running, want yes no no", got)
		}
		ver := obShow(t, adm, "SHOW VERSION")
		if len(ver.Rows) != 1 || !strings.HasPrefix(ver.val(0, "version"), "PgBouncer 1.25.") {
			t.Errorf("SHOW VERSION %s, want one row starting with PgBouncer 1.25.", ver)
		}
		cfg := obShow(t, adm, "SHOW CONFIG")
		keys := cfg.column("key")
		if !slices.IsSorted(keys) {
			t.Errorf("SHOW CONFIG keys not sorted: %v", keys)
		}
		for _, k := range []string{"max_size", "listen", "pool_mode", "admin_users", "stats_users", "query_timeout"} {
			if !slices.Contains(keys, k) {
				t.Errorf("SHOW CONFIG has no %s", k)
			}
		}
		i := cfg.must(t, "SHOW CONFIG", "key", "listen")
		if cfg.val(i, "changeable") != "no" || cfg.val(cfg.must(t, "SHOW CONFIG", "key", "max_size"), "changeable") != "yes" {
			t.Errorf("changeable: listen %q, max_size %q; want no, yes", cfg.val(i, "changeable"),
				cfg.val(cfg.must(t, "SHOW CONFIG", "key", "max_size"), "changeable"))
		}
		if v := cfg.val(cfg.must(t, "SHOW CONFIG", "key", "max_size"), "value"); v != "5" {
			t.Errorf("SHOW CONFIG max_size = %q, want 5", v)
		}
		// The admin pool and database come first, as pgbouncer.
		pools := obShow(t, adm, "SHOW POOLS")
		if pools.val(0, "database") != "pgbouncer" || pools.val(0, "user") != "pgbouncer" || pools.val(0, "pool_mode") != "statement" {
			t.Errorf("first SHOW POOLS row is not the admin pool:\n%s", pools)
		}
		for i := range pools.Rows {
			if !pools.isNull(i, "load_balance_hosts") {
				t.Errorf("load_balance_hosts of %s is not NULL", pools.val(i, "database"))
			}
		}
		clients := obShow(t, adm, "SHOW CLIENTS")
		i = clients.must(t, "SHOW CLIENTS", "application_name", "obcols")
		if clients.isNull(i, "link") || clients.isNull(i, "tls") || clients.val(i, "type") != "C" || clients.val(i, "replication") != "none" {
			t.Errorf("client row:\n%s", clients)
		}
		if _, err := time.Parse("2006-01-02 15:04:05 MST", clients.val(i, "connect_time")); err != nil {
			t.Errorf("connect_time %q is not like PgBouncer's: %v", clients.val(i, "connect_time"), err)
		}
		admRow := clients.must(t, "SHOW CLIENTS", "database", "pgbouncer")
		if clients.val(admRow, "user") != pgtest.RoleApp || clients.val(admRow, "link") != "" {
			t.Errorf("admin console client row:\n%s", clients)
		}
		// USERS: an override is text "%9d", none is '' (not NULL);
		// pool_mode is NULL when not overridden.
		users := obShow(t, adm, "SHOW USERS")
		si := users.must(t, "SHOW USERS", "name", pgtest.RoleSCRAM)
		ai := users.must(t, "SHOW USERS", "name", pgtest.RoleApp)
		if users.val(si, "pool_size") != "        2" || users.val(si, "pool_mode") != "session" ||
			users.isNull(ai, "pool_size") || users.val(ai, "pool_size") != "" || !users.isNull(ai, "pool_mode") ||
			users.isNull(ai, "reserve_pool_size") {
			t.Errorf("SHOW USERS overrides:\n%s", users)
		}
		if users.val(0, "name") != "pgbouncer" {
			t.Errorf("SHOW USERS does not start with pgbouncer:\n%s", users)
		}
		// DATABASES: the sidecar's database, no forced user, no pool_mode
		// override; the admin database first.
		dbs := obShow(t, adm, "SHOW DATABASES")
		di := dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp)
		if dbs.val(di, "host") != pg.Host || dbs.num(di, "port") != int64(pg.Port) || dbs.val(di, "database") != pgtest.DBApp ||
			!dbs.isNull(di, "force_user") || !dbs.isNull(di, "pool_mode") || dbs.num(di, "pool_size") != 5 ||
			dbs.num(di, "server_lifetime") != 3600 || dbs.num(di, "current_client_connections") != 1 {
			t.Errorf("SHOW DATABASES app:\n%s", dbs)
		}
		if dbs.val(0, "name") != "pgbouncer" || dbs.val(0, "force_user") != "pgbouncer" || !dbs.isNull(0, "host") {
			t.Errorf("SHOW DATABASES admin row:\n%s", dbs)
		}
		servers := obShow(t, adm, "SHOW SERVERS")
		i = servers.must(t, "SHOW SERVERS", "application_name", "obcols")
		if servers.val(i, "type") != "S" || servers.val(i, "state") != "active" || servers.isNull(i, "tls") {
			t.Errorf("server row:\n%s", servers)
		}
	})
	obExec(t, c, "COMMIT")
}

// ---------------------------------------------------------------------------
// Values under load.

func TestAdminValuesUnderLoad(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) { c.MaxSize = 3 }})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	ctx := ctxTimeout(t, 40*time.Second)

	// SHOW STATS counts what a client ran.
	statsRow := func() (obTable, int) {
		tb := obShow(t, adm, "SHOW STATS")
		return tb, tb.must(t, "SHOW STATS", "database", pgtest.DBApp)
	}
	e := obConn(t, p.instance, pgtest.DBApp, "obE")
	obExec(t, e, "SELECT 1") // the session's parameters are settled
	eventually(t, 5*time.Second, "the first query counted", func() bool {
		tb, i := statsRow()
		return tb.num(i, "total_query_count") >= 1
	})
	// Each successful login counts (poolerd_client_logins_total); a
	// refused one does not.
	logins := func() uint64 { return p.srv.DatabaseTotals()[pgtest.DBApp].ClientLogins }
	l0 := logins()
	for range 3 {
		lc := obConn(t, p.instance, pgtest.DBApp, "obLogin")
		if err := lc.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if pe := loginPgError(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
		t.Fatalf("wrong password: %s", pe.Code)
	}
	if d := logins() - l0; d != 3 {
		t.Errorf("client logins grew by %d after 3 logins and a refused one, want 3", d)
	}
	before, bi := statsRow()
	totalsBefore := obShow(t, adm, "SHOW STATS_TOTALS")
	const xacts = 7
	for range xacts {
		obExec(t, e, "BEGIN")
		obExec(t, e, "SELECT 1")
		obExec(t, e, "COMMIT")
	}
	eventually(t, 5*time.Second, "SHOW STATS to count the transactions", func() bool {
		tb, i := statsRow()
		return tb.num(i, "total_xact_count")-before.num(bi, "total_xact_count") >= xacts
	})
	after, ai := statsRow()
	delta := func(col string) int64 { return after.num(ai, col) - before.num(bi, col) }
	if d := delta("total_xact_count"); d != xacts {
		t.Errorf("total_xact_count grew by %d, want %d", d, xacts)
	}
	if d := delta("total_query_count"); d != 3*xacts {
		t.Errorf("total_query_count grew by %d, want %d (BEGIN, SELECT, COMMIT per transaction)", d, 3*xacts)
	}
	if d := delta("total_server_assignment_count"); d != xacts {
		t.Errorf("total_server_assignment_count grew by %d, want %d (one per transaction)", d, xacts)
	}
	for _, col := range []string{"total_received", "total_sent", "total_xact_time", "total_query_time"} {
		if d := delta(col); d <= 0 {
			t.Errorf("%s grew by %d, want > 0", col, d)
		}
	}
	// STATS_TOTALS says the same with its own names.
	totalsAfter := obShow(t, adm, "SHOW STATS_TOTALS")
	tb, tbi := totalsBefore, totalsBefore.must(t, "SHOW STATS_TOTALS", "database", pgtest.DBApp)
	ta, tai := totalsAfter, totalsAfter.must(t, "SHOW STATS_TOTALS", "database", pgtest.DBApp)
	if d := ta.num(tai, "xact_count") - tb.num(tbi, "xact_count"); d != xacts {
		t.Errorf("STATS_TOTALS xact_count grew by %d, want %d", d, xacts)
	}
	if ta.num(tai, "bytes_received") != after.num(ai, "total_received") {
		t.Errorf("STATS_TOTALS bytes_received %d != STATS total_received %d", ta.num(tai, "bytes_received"), after.num(ai, "total_received"))
	}
	e.Close(ctx)

	// Load: three clients hold transactions (max_size 3), one is idle and
	// one waits for a server connection.
	pids := map[string]int{}
	var holders []*pgx.Conn
	for _, name := range []string{"obA", "obB", "obC"} {
		c := obConn(t, p.instance, pgtest.DBApp, name)
		pids[name] = obBegin(t, c)
		holders = append(holders, c)
	}
	obConn(t, p.instance, pgtest.DBApp, "obD")
	w := obConn(t, p.instance, pgtest.DBApp, "obW")
	waitDone := obAsync(func() error { _, err := w.Exec(ctx, "SELECT 1"); return err })
	eventually(t, 5*time.Second, "a waiting client in SHOW POOLS", func() bool {
		tb, i := obPoolRow(t, adm, pgtest.DBApp)
		return tb.num(i, "cl_waiting") == 1
	})

	time.Sleep(150 * time.Millisecond) // W has waited a while
	pools, i := obPoolRow(t, adm, pgtest.DBApp)
	if wait := pools.num(i, "maxwait")*1e6 + pools.num(i, "maxwait_us"); wait < 150e3 || wait > 10e6 {
		t.Errorf("SHOW POOLS maxwait %ds %dus, want the waiting client's wait (>= 150ms)", pools.num(i, "maxwait"), pools.num(i, "maxwait_us"))
	}
	for col, want := range map[string]int64{"cl_active": 4, "cl_waiting": 1, "sv_active": 3, "sv_idle": 0, "sv_used": 0,
		"sv_tested": 0, "sv_login": 0, "cl_active_cancel_req": 0} {
		if got := pools.num(i, col); got != want {
			t.Errorf("SHOW POOLS %s = %d, want %d\n%s", col, got, want, pools)
		}
	}
	if pools.val(i, "pool_mode") != "transaction" {
		t.Errorf("SHOW POOLS pool_mode %q", pools.val(i, "pool_mode"))
	}

	clients := obShow(t, adm, "SHOW CLIENTS")
	servers := obShow(t, adm, "SHOW SERVERS")
	if n := len(slices.DeleteFunc(servers.column("database"), func(s string) bool { return s != pgtest.DBApp })); n != 3 {
		t.Errorf("SHOW SERVERS has %d servers of app, want 3\n%s", n, servers)
	}
	ids := map[string]bool{}
	for i := range clients.Rows {
		ids[clients.val(i, "id")] = true
	}
	for i := range servers.Rows {
		ids[servers.val(i, "id")] = true
	}
	if len(ids) != len(clients.Rows)+len(servers.Rows) {
		t.Errorf("ids of clients and servers are not unique:\n%s\n%s", clients, servers)
	}
	for name, pid := range pids {
		ci := clients.must(t, "SHOW CLIENTS", "application_name", name)
		if st := clients.val(ci, "state"); st != "active" {
			t.Errorf("client %s state %q, want active", name, st)
		}
		link := clients.val(ci, "link")
		si := servers.find("ptr", link)
		if link == "" || si < 0 {
			t.Errorf("client %s link %q matches no server ptr\n%s\n%s", name, link, clients, servers)
			continue
		}
		if got := servers.val(si, "link"); got != clients.val(ci, "ptr") {
			t.Errorf("server of %s links to %q, want the client's ptr %q", name, got, clients.val(ci, "ptr"))
		}
		if got := servers.num(si, "remote_pid"); got != int64(pid) {
			t.Errorf("server of %s has remote_pid %d, want the backend pid %d", name, got, pid)
		}
		if servers.val(si, "state") != "active" || servers.val(si, "application_name") != name ||
			servers.val(si, "user") != pgtest.RoleApp || servers.val(si, "database") != pgtest.DBApp {
			t.Errorf("server row of %s:\n%s", name, servers)
		}
		if servers.num(si, "port") != int64(pg.Port) {
			t.Errorf("server port %d, want %d", servers.num(si, "port"), pg.Port)
		}
	}
	di := clients.must(t, "SHOW CLIENTS", "application_name", "obD")
	if clients.val(di, "state") != "idle" || clients.val(di, "link") != "" {
		t.Errorf("idle client: state %q link %q, want idle and no link", clients.val(di, "state"), clients.val(di, "link"))
	}
	wi := clients.must(t, "SHOW CLIENTS", "application_name", "obW")
	if clients.val(wi, "state") != "waiting" || clients.val(wi, "link") != "" {
		t.Errorf("waiting client: state %q link %q, want waiting and no link", clients.val(wi, "state"), clients.val(wi, "link"))
	}
	if wait := clients.num(wi, "wait")*1e6 + clients.num(wi, "wait_us"); wait < 150e3 || wait > 10e6 {
		t.Errorf("waiting client: wait %ds %dus, want >= 150ms", clients.num(wi, "wait"), clients.num(wi, "wait_us"))
	}
	if clients.num(di, "wait") != 0 || clients.num(di, "wait_us") != 0 {
		t.Errorf("idle client has a wait: %ds %dus", clients.num(di, "wait"), clients.num(di, "wait_us"))
	}
	if clients.num(wi, "port") <= 0 || clients.val(wi, "addr") != "127.0.0.1" {
		t.Errorf("client addr %q port %d", clients.val(wi, "addr"), clients.num(wi, "port"))
	}

	dbs := obShow(t, adm, "SHOW DATABASES")
	di = dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp)
	for col, want := range map[string]int64{"current_connections": 3, "current_client_connections": 5, "pool_size": 3,
		"paused": 0, "disabled": 0} {
		if got := dbs.num(di, col); got != want {
			t.Errorf("SHOW DATABASES %s = %d, want %d\n%s", col, got, want, dbs)
		}
	}
	users := obShow(t, adm, "SHOW USERS")
	ui := users.must(t, "SHOW USERS", "name", pgtest.RoleApp)
	// Clients by login user, this console session included, as
	// PgBouncer counts them.
	if users.num(ui, "current_connections") != 3 || users.num(ui, "current_client_connections") != 6 {
		t.Errorf("SHOW USERS:\n%s", users)
	}
	lists := obShow(t, adm, "SHOW LISTS")
	for name, want := range map[string]int64{"used_clients": 6, "used_servers": 3, "pools": 2} {
		if got := lists.num(lists.must(t, "SHOW LISTS", "list", name), "items"); got != want {
			t.Errorf("SHOW LISTS %s = %d, want %d", name, got, want)
		}
	}

	// A commit frees a server for the waiting client.
	obExec(t, holders[0], "COMMIT")
	if err := obDone(t, waitDone, 5*time.Second, "the waiting client's query"); err != nil {
		t.Fatalf("waiting client: %v", err)
	}
	eventually(t, 5*time.Second, "no waiting client", func() bool {
		tb, i := obPoolRow(t, adm, pgtest.DBApp)
		return tb.num(i, "cl_waiting") == 0 && tb.num(i, "sv_active") == 2
	})
	for _, c := range holders[1:] {
		obExec(t, c, "COMMIT")
	}
}

// SHOW STATS_AVERAGES and the avg_ columns of SHOW STATS follow the last
// stats_period.
func TestAdminStatsAverages(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{stats: true, mutate: func(c *config.Config) { c.StatsPeriod = time.Second }})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	c := obConn(t, p.instance, pgtest.DBApp, "obavg")
	stop := make(chan struct{})
	done := obAsync(func() error {
		for {
			select {
			case <-stop:
				return nil
			default:
			}
			if _, err := c.Exec(context.Background(), "SELECT pg_sleep(0.002)"); err != nil {
				return err
			}
		}
	})
	eventually(t, 5*time.Second, "averages over the last second", func() bool {
		tb := obShow(t, adm, "SHOW STATS_AVERAGES")
		i := tb.find("database", pgtest.DBApp)
		return i >= 0 && tb.num(i, "xact_count") > 0 && tb.num(i, "query_count") > 0 && tb.num(i, "query_time") >= 2000
	})
	close(stop)
	if err := obDone(t, done, 5*time.Second, "the load"); err != nil {
		t.Fatal(err)
	}
	st := obShow(t, adm, "SHOW STATS")
	i := st.must(t, "SHOW STATS", "database", pgtest.DBApp)
	if st.num(i, "avg_xact_count") <= 0 || st.num(i, "avg_query_time") < 2000 {
		t.Errorf("SHOW STATS averages:\n%s", st)
	}
}

// ---------------------------------------------------------------------------
// Permissions.

func TestAdminPermissions(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.AdminUsers = []string{pgtest.RoleApp}
		c.StatsUsers = []string{pgtest.RoleSCRAM}
		c.Users = []config.User{
			{Name: pgtest.RoleSCRAM, Password: pgtest.Password},
			{Name: pgtest.RoleMD5, Password: pgtest.Password},
		}
	}})
	victim := obConn(t, p.instance, pgtest.DBApp, "obvictim")
	obExec(t, victim, "SELECT 1")

	t.Run("stats user", func(t *testing.T) {
		st := obAdmin(t, p.instance, pgtest.RoleSCRAM)
		for _, cmd := range []string{"POOLS", "STATS", "STATS_TOTALS", "STATS_AVERAGES", "TOTALS", "CLIENTS", "SERVERS",
			"DATABASES", "USERS", "LISTS", "STATE", "VERSION", "CONFIG"} {
			obShow(t, st, "SHOW "+cmd)
		}
		clients := obShow(t, st, "SHOW CLIENTS")
		id := clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "obvictim"), "id")
		for _, cmd := range []string{"PAUSE", "PAUSE app", "RESUME", "RELOAD", "KILL_CLIENT " + id, "KILL app", "KILL",
			"DISABLE app", "ENABLE app", "RECONNECT", "WAIT_CLOSE", "SHUTDOWN", "SHUTDOWN WAIT_FOR_CLIENTS",
			"SET max_size = 2", "SET log_connections = false"} {
			obErr(t, st, cmd, "08P01", "admin access needed")
		}
		// Argument errors come first, as in PgBouncer.
		obErr(t, st, "SHUTDOWN now", "08P01", "invalid command 'SHUTDOWN now', use SHOW HELP;")
		obErr(t, st, "RELOAD app", "08P01", "invalid command 'RELOAD app', use SHOW HELP;")
		// None of it happened.
		select {
		case m := <-p.srv.ShutdownRequests():
			t.Fatalf("a stats user's SHUTDOWN was passed on (%q)", m)
		default:
		}
		if _, err := victim.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
			t.Fatalf("the victim of a stats user's KILL_CLIENT is hurt: %v", err)
		}
		if v := obConfigValue(t, st, "max_size"); v != "5" {
			t.Fatalf("max_size %s after a stats user's SET", v)
		}
		if tb := obShow(t, st, "SHOW STATE"); tb.val(1, "value") != "no" {
			t.Fatalf("paused after a stats user's PAUSE:\n%s", tb)
		}
	})

	t.Run("neither", func(t *testing.T) {
		pe := obLoginErr(t, p.dsn(pgtest.RoleMD5, pgtest.Password, "pgbouncer"))
		if pe.Severity != "FATAL" || pe.Code != "08P01" || pe.Message != "not allowed" {
			t.Fatalf("got %s %s %q, want FATAL 08P01 not allowed", pe.Severity, pe.Code, pe.Message)
		}
		// The alias too.
		pe = obLoginErr(t, p.dsn(pgtest.RoleMD5, pgtest.Password, "poolerd"))
		if pe.Code != "08P01" || pe.Message != "not allowed" {
			t.Fatalf("poolerd alias: got %s %q", pe.Code, pe.Message)
		}
		// A wrong password is refused before anything else.
		pe = obLoginErr(t, p.dsn(pgtest.RoleApp, "wrong", "pgbouncer"))
		if pe.Code != "28P01" {
			t.Fatalf("wrong password: got %s %q, want 28P01", pe.Code, pe.Message)
		}
	})

	t.Run("admin", func(t *testing.T) {
		adm := obAdmin(t, p.instance, pgtest.RoleApp)
		obShow(t, obAdminDB(t, p.instance, pgtest.RoleApp, "poolerd"), "SHOW POOLS") // the alias
		for _, cmd := range []string{"POOLS", "CLIENTS", "CONFIG"} {
			obShow(t, adm, "SHOW "+cmd)
		}
		obCmd(t, adm, "SET log_connections = false", "SET log_connections=false")
		if v := obConfigValue(t, adm, "log_connections"); v != "false" {
			t.Errorf("log_connections %q after SET", v)
		}
		obCmd(t, adm, "PAUSE", "PAUSE")
		obCmd(t, adm, "RESUME", "RESUME")
		obCmd(t, adm, "DISABLE other", "DISABLE")
		obCmd(t, adm, "ENABLE other", "ENABLE")
		obCmd(t, adm, "RECONNECT", "RECONNECT")
		obCmd(t, adm, "WAIT_CLOSE", "WAIT_CLOSE")
		obErr(t, adm, "RELOAD", "F0000", "RELOAD failed, see logs for additional details")
		clients := obShow(t, adm, "SHOW CLIENTS")
		id := clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "obvictim"), "id")
		obCmd(t, adm, "KILL_CLIENT "+id, "KILL_CLIENT")
		if _, err := victim.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err == nil {
			t.Fatal("the client survived KILL_CLIENT")
		}
	})
}

// ---------------------------------------------------------------------------
// Parser.

func TestAdminParser(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)

	for _, q := range []string{"show pools", "ShOw PoOlS", "SHOW POOLS;", "  show \t pools ;  ", "show\npools\n;",
		`SHOW "pools"`, `"show" "POOLS"`, "show pools ;", "SHOW POOLS ;"} {
		tb, err := obRun(ctxTimeout(t, 10*time.Second), adm, q)
		if err != nil {
			t.Errorf("%q: %v", q, err)
			continue
		}
		if tb.Tag != "SHOW" || len(tb.Cols) == 0 || tb.Cols[2] != "cl_active" {
			t.Errorf("%q did not answer SHOW POOLS: %v", q, tb.Cols)
		}
	}
	if tb := obShow(t, adm, "select version"); tb.Cols[0] != "version" {
		t.Errorf("SELECT version: %v", tb.Cols)
	}
	if tb := obShow(t, adm, "show stats_totals;"); tb.Cols[1] != "server_assignment_count" {
		t.Errorf("show stats_totals;: %v", tb.Cols)
	}
	for _, q := range []string{"SHOW POOLS; SHOW LISTS", "SHOW POOLS foo", "SHOW nonsense", "SELECT 1", "SHOW", "FROB",
		"SHOW POOLS;;", "SHOW pools-x", `SHOW "pools`, "SHOW POOLS, LISTS", "PAUSE a b"} {
		obErr(t, adm, q, "08P01", "invalid command '"+q+"', use SHOW HELP;")
	}
	obErr(t, adm, "SHOW "+strings.Repeat("x", 64), "08P01", "bad arguments")
	obErr(t, adm, "PAUSE pgbouncer", "08P01", "cannot pause admin db: pgbouncer")

	// SHOW HELP is a NOTICE and a SHOW tag.
	var notices []*pgconn.Notice
	cfg, err := pgconn.ParseConfig(p.dsn(pgtest.RoleApp, pgtest.Password, "pgbouncer"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n) }
	hc, err := pgconn.ConnectConfig(ctxTimeout(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close(context.Background())
	if tb := obShow(t, hc, "SHOW HELP"); tb.Tag != "SHOW" || len(notices) != 1 || notices[0].Message != "Console usage" ||
		!strings.HasPrefix(notices[0].Detail, "\n\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION") {
		t.Errorf("SHOW HELP: tag %q, notices %+v", tb.Tag, notices)
	}

	// The extended protocol: FATAL 08P01 and the connection is closed.
	xc := obAdmin(t, p.instance, pgtest.RoleApp)
	rr := xc.ExecParams(ctxTimeout(t, 10*time.Second), "SHOW POOLS", nil, nil, nil, nil).Read()
	var pe *pgconn.PgError
	if !errors.As(rr.Err, &pe) || pe.Severity != "FATAL" || pe.Code != "08P01" ||
		pe.Message != "extended query protocol not supported by admin console" {
		t.Fatalf("extended protocol: got %v, want FATAL 08P01", rr.Err)
	}
	select {
	case <-xc.CleanupDone():
	case <-time.After(5 * time.Second):
		if _, err := obRun(ctxTimeout(t, 5*time.Second), xc, "SHOW VERSION"); err == nil {
			t.Fatal("the console connection still works after an extended-protocol message")
		}
	}
	// Also with a raw Parse: the FATAL comes, then the close.
	raw := obRawConnect(t, p.instance, pgtest.RoleApp, "pgbouncer")
	raw.fe.Send(&pgproto3.Parse{Query: "SHOW POOLS"})
	raw.fe.Send(&pgproto3.Sync{})
	if err := raw.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	raw.expectFatal(5*time.Second, "08P01", "extended query protocol not supported by admin console")
	// The console still serves others.
	obShow(t, adm, "SHOW VERSION")
}

// ---------------------------------------------------------------------------
// PAUSE and RESUME.

// TestAdminSuspendResume: SUSPEND stops all new work at once, without
// waiting for transactions and without closing server connections: a
// request that needs a server connection waits (a login too, when it
// must ask its server), a client in a transaction goes on with its own,
// and after RESUME every waiting request is served on the connections
// that stayed open (the same backends). A shutdown ends a suspension.
func TestAdminSuspendResume(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) { c.MinSize = 1 }})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	a := obConn(t, p.instance, pgtest.DBApp, "obA")
	b := obConn(t, p.instance, pgtest.DBApp, "obB")
	pidB := obBackendPID(t, b)
	eventually(t, 5*time.Second, "ready", func() bool { ok, _ := p.srv.Ready(); return ok })

	obCmd(t, adm, "PAUSE app", "PAUSE")
	obErr(t, adm, "SUSPEND", "08P01", "cannot suspend with paused databases")
	obCmd(t, adm, "RESUME app", "RESUME")
	pidB = obBackendPID(t, b) // the pause closed the connections
	obBegin(t, a)             // holds a server connection through the suspension
	obCmd(t, adm, "SUSPEND", "SUSPEND")
	if got := obShow(t, adm, "SHOW STATE").column("value"); !slices.Equal(got, []string{"no", "no", "yes"}) {
		t.Errorf("SHOW STATE while suspended: %v, want active=no paused=no suspended=yes", got)
	}
	if ok, reason := p.srv.Ready(); ok || !strings.Contains(reason, "suspended") {
		t.Errorf("Ready() = %v, %q while suspended", ok, reason)
	}
	obErr(t, adm, "SUSPEND", "08P01", "already suspended/paused")
	obErr(t, adm, "PAUSE", "08P01", "already suspended/paused")
	obErr(t, adm, "KILL", "08P01", "already suspended/paused")

	ctx := ctxTimeout(t, 30*time.Second)
	bDone := obAsync(func() error { _, err := b.Exec(ctx, "SELECT 1"); return err })
	obPending(t, bDone, 300*time.Millisecond, "B's query while suspended")
	obExec(t, a, "SELECT 1") // its transaction's connection is its own
	obExec(t, a, "COMMIT")
	// A's connection came back: kept, not handed out, not closed.
	obPending(t, bDone, 300*time.Millisecond, "B's query after A's commit while suspended")
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Total == 0 || st.Waiting != 1 {
		t.Errorf("while suspended: %d server connections open, %d waiting; want them open and B waiting", st.Total, st.Waiting)
	}
	clients := obShow(t, adm, "SHOW CLIENTS")
	if st := clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "obB"), "state"); st != "waiting" {
		t.Errorf("B is %q while suspended, want waiting", st)
	}
	// A login with parameters its pool has not seen must ask the server:
	// it waits too.
	lateDone := obAsyncLogin(ctx, p.instance, "application_name=oblate", "DateStyle=German")
	obPending(t, lateDone, 300*time.Millisecond, "a new client while suspended")

	obCmd(t, adm, "RESUME", "RESUME")
	if err := obDone(t, bDone, 5*time.Second, "B's query after RESUME"); err != nil {
		t.Fatalf("B's query after RESUME: %v", err)
	}
	if err := obDone(t, lateDone, 5*time.Second, "the new client after RESUME"); err != nil {
		t.Fatalf("the client that logged in while suspended: %v", err)
	}
	if got := obShow(t, adm, "SHOW STATE").column("value"); !slices.Equal(got, []string{"yes", "no", "no"}) {
		t.Errorf("SHOW STATE after RESUME: %v", got)
	}
	obErr(t, adm, "RESUME", "08P01", "pooler is not paused/suspended")
	// The connections stayed open: B's backend is among them (a PAUSE
	// would have closed every one).
	pids := map[int]bool{}
	for range 3 {
		pids[obBackendPID(t, b)] = true
		pids[obBackendPID(t, a)] = true
	}
	if !pids[pidB] {
		t.Errorf("backends after RESUME %v, want B's %d among them (kept through the suspension)", pids, pidB)
	}

	// A shutdown ends a suspension: the queued request is served.
	obCmd(t, adm, "SUSPEND", "SUSPEND")
	bDone = obAsync(func() error { _, err := b.Exec(ctx, "SELECT 1"); return err })
	obPending(t, bDone, 300*time.Millisecond, "B's query while suspended again")
	shut := obAsync(func() error { return p.srv.Shutdown(ctxTimeout(t, 10*time.Second)) })
	if err := obDone(t, bDone, 5*time.Second, "B's query once the shutdown began"); err != nil {
		t.Errorf("B's query queued while suspended, in a shutdown: %v", err)
	}
	_ = obDone(t, shut, 10*time.Second, "the shutdown")
}

// TestAdminSuspendDrain: a drain (SHUTDOWN WAIT_FOR_CLIENTS, and the
// hand-over of --takeover, which drains) ends a suspension, so that a
// request waiting in it is served and its client can reach the idle point
// where it leaves or is handed over.
func TestAdminSuspendDrain(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	b := obConn(t, p.instance, pgtest.DBApp, "obB")
	obExec(t, b, "SELECT 1")
	obCmd(t, adm, "SUSPEND", "SUSPEND")
	ctx := ctxTimeout(t, 30*time.Second)
	bDone := obAsync(func() error { _, err := b.Exec(ctx, "SELECT 1"); return err })
	obPending(t, bDone, 300*time.Millisecond, "B's query while suspended")
	drained := obAsync(func() error { return p.srv.Drain(ctxTimeout(t, 10*time.Second)) })
	if err := obDone(t, bDone, 5*time.Second, "B's query once the drain began"); err != nil {
		t.Fatalf("B's query queued while suspended, in a drain: %v", err)
	}
	_ = b.Close(ctx)
	_ = adm.Close(ctx)
	if err := obDone(t, drained, 10*time.Second, "the drain"); err != nil {
		t.Errorf("drain: %v", err)
	}
}

func TestAdminPauseResume(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) { c.MinSize = 1 }})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	pauser := obAdmin(t, p.instance, pgtest.RoleApp)
	a := obConn(t, p.instance, pgtest.DBApp, "obA")
	b := obConn(t, p.instance, pgtest.DBApp, "obB")
	obExec(t, b, "SELECT 1")
	eventually(t, 5*time.Second, "ready", func() bool { ok, _ := p.srv.Ready(); return ok })
	obErr(t, adm, "RESUME", "08P01", "pooler is not paused/suspended")

	obBegin(t, a)
	paused := obAsync(func() error { _, err := obRun(ctxTimeout(t, 30*time.Second), pauser, "PAUSE"); return err })
	obPending(t, paused, 500*time.Millisecond, "PAUSE with a transaction open")

	// New requests wait; they do not fail.
	ctx := ctxTimeout(t, 30*time.Second)
	bDone := obAsync(func() error { _, err := b.Exec(ctx, "SELECT 1"); return err })
	obPending(t, bDone, 300*time.Millisecond, "B's query during PAUSE")
	state := obShow(t, adm, "SHOW STATE")
	if got := state.column("value"); !slices.Equal(got, []string{"no", "yes", "no"}) {
		t.Errorf("SHOW STATE while pausing: %v, want active=no paused=yes suspended=no", got)
	}
	dbs := obShow(t, adm, "SHOW DATABASES")
	if v := dbs.num(dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp), "paused"); v != 1 {
		t.Errorf("SHOW DATABASES paused = %d while paused", v)
	}
	if ok, reason := p.srv.Ready(); ok || !strings.Contains(reason, "paused") {
		t.Errorf("Ready() = %v, %q while paused", ok, reason)
	}
	obErr(t, adm, "PAUSE", "08P01", "already suspended/paused")
	obErr(t, adm, "KILL app", "08P01", "already suspended/paused")

	// A's transaction ends: its server is closed and PAUSE answers.
	t0 := time.Now()
	obExec(t, a, "COMMIT")
	if err := obDone(t, paused, 5*time.Second, "PAUSE after the commit"); err != nil {
		t.Fatalf("PAUSE: %v", err)
	}
	t.Logf("PAUSE answered %s after the commit", time.Since(t0).Round(time.Millisecond))
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Total != 0 {
		t.Errorf("PAUSE answered with %d server connections open", st.Total)
	}
	obPending(t, bDone, 500*time.Millisecond, "B's query while paused")
	clients := obShow(t, adm, "SHOW CLIENTS")
	if st := clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "obB"), "state"); st != "waiting" {
		t.Errorf("B is %q while paused, want waiting", st)
	}
	pools, i := obPoolRow(t, adm, pgtest.DBApp)
	if pools.num(i, "cl_waiting") != 1 || pools.num(i, "sv_idle")+pools.num(i, "sv_active") != 0 {
		t.Errorf("SHOW POOLS while paused:\n%s", pools)
	}
	if ok, _ := p.srv.Ready(); ok {
		t.Error("Ready() true while paused")
	}

	// A client logging in now waits as well, and gets in after RESUME.
	lateDone := obAsyncLogin(ctx, p.instance, "application_name=oblate")
	obPending(t, lateDone, 300*time.Millisecond, "a new client while paused")
	obCmd(t, adm, "RESUME", "RESUME")
	if err := obDone(t, bDone, 5*time.Second, "B's query after RESUME"); err != nil {
		t.Fatalf("B's query after RESUME: %v", err)
	}
	if err := obDone(t, lateDone, 5*time.Second, "the new client after RESUME"); err != nil {
		t.Fatalf("the client that logged in during PAUSE: %v", err)
	}
	eventually(t, 5*time.Second, "ready after RESUME", func() bool { ok, _ := p.srv.Ready(); return ok })
	if got := obShow(t, adm, "SHOW STATE").column("value"); !slices.Equal(got, []string{"yes", "no", "no"}) {
		t.Errorf("SHOW STATE after RESUME: %v", got)
	}
	obErr(t, adm, "RESUME", "08P01", "pooler is not paused/suspended")

	// PAUSE db: only that database; SHOW STATE does not show it.
	other := obConn(t, p.instance, pgtest.DBOther, "obO")
	obExec(t, other, "SELECT 1")
	obCmd(t, adm, "PAUSE app", "PAUSE")
	if got := obShow(t, adm, "SHOW STATE").column("value"); !slices.Equal(got, []string{"yes", "no", "no"}) {
		t.Errorf("SHOW STATE after PAUSE app: %v (per-database pauses do not show)", got)
	}
	dbs = obShow(t, adm, "SHOW DATABASES")
	if dbs.num(dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp), "paused") != 1 ||
		dbs.num(dbs.must(t, "SHOW DATABASES", "name", pgtest.DBOther), "paused") != 0 {
		t.Errorf("SHOW DATABASES after PAUSE app:\n%s", dbs)
	}
	if ok, _ := p.srv.Ready(); ok {
		t.Error("Ready() true with the configured database paused")
	}
	bDone = obAsync(func() error { _, err := b.Exec(ctx, "SELECT 1"); return err })
	obExec(t, other, "SELECT 1") // other databases go on
	obPending(t, bDone, 500*time.Millisecond, "a query of the paused database")
	obErr(t, adm, "RESUME other", "08P01", "database other is not paused")
	obCmd(t, adm, "RESUME app", "RESUME")
	if err := obDone(t, bDone, 5*time.Second, "the query after RESUME app"); err != nil {
		t.Fatal(err)
	}
	obErr(t, adm, "RESUME app", "08P01", "database app is not paused")
	eventually(t, 5*time.Second, "ready after RESUME app", func() bool { ok, _ := p.srv.Ready(); return ok })

	// A cancel request on the console connection waiting for PAUSE ends
	// the wait and resumes the pooler (PgBouncer's admin_handle_cancel).
	obBegin(t, a)
	paused = obAsync(func() error { _, err := obRun(ctxTimeout(t, 30*time.Second), pauser, "PAUSE"); return err })
	obPending(t, paused, 300*time.Millisecond, "PAUSE with a transaction open")
	if err := pauser.CancelRequest(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	err := obDone(t, paused, 5*time.Second, "the cancelled PAUSE")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("cancelled PAUSE: %v, want ERROR 57014", err)
	}
	if got := obShow(t, adm, "SHOW STATE").column("value"); !slices.Equal(got, []string{"yes", "no", "no"}) {
		t.Errorf("SHOW STATE after a cancelled PAUSE: %v, want resumed", got)
	}
	obExec(t, b, "SELECT 1")
	obExec(t, a, "COMMIT")
	obShow(t, pauser, "SHOW VERSION") // the console connection goes on
	eventually(t, 5*time.Second, "ready after the cancelled PAUSE", func() bool { ok, _ := p.srv.Ready(); return ok })

	// The same for PAUSE db: that database is resumed.
	obBegin(t, a)
	paused = obAsync(func() error { _, err := obRun(ctxTimeout(t, 30*time.Second), pauser, "PAUSE app"); return err })
	obPending(t, paused, 300*time.Millisecond, "PAUSE app with a transaction open")
	if err := pauser.CancelRequest(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := obDone(t, paused, 5*time.Second, "the cancelled PAUSE app"); !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("cancelled PAUSE app: %v, want ERROR 57014", err)
	}
	dbs = obShow(t, adm, "SHOW DATABASES")
	if v := dbs.num(dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp), "paused"); v != 0 {
		t.Errorf("SHOW DATABASES app paused = %d after a cancelled PAUSE app", v)
	}
	obExec(t, b, "SELECT 1")
	obExec(t, a, "COMMIT")
	eventually(t, 5*time.Second, "ready after the cancelled PAUSE app", func() bool { ok, _ := p.srv.Ready(); return ok })
}

// ---------------------------------------------------------------------------
// DISABLE and ENABLE.

func TestAdminDisableEnable(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	old := obConn(t, p.instance, pgtest.DBApp, "obold")
	obExec(t, old, "SELECT 1")

	obCmd(t, adm, "DISABLE app", "DISABLE")
	pe := obLoginErr(t, p.appDSN())
	if pe.Severity != "FATAL" || pe.Code != "08P01" || pe.Message != `database "app" is disabled` {
		t.Fatalf("login to a disabled database: %s %s %q", pe.Severity, pe.Code, pe.Message)
	}
	obExec(t, old, "BEGIN")
	obExec(t, old, "SELECT 1")
	obExec(t, old, "COMMIT")
	connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther)) // other databases are open
	dbs := obShow(t, adm, "SHOW DATABASES")
	if v := dbs.num(dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp), "disabled"); v != 1 {
		t.Errorf("SHOW DATABASES disabled = %d", v)
	}
	obErr(t, adm, "DISABLE", "08P01", "a database is required")
	obErr(t, adm, "ENABLE", "08P01", "a database is required")
	obErr(t, adm, "DISABLE pgbouncer", "08P01", "cannot disable admin db: pgbouncer")

	obCmd(t, adm, "ENABLE app", "ENABLE")
	c := connectDSN(t, p.appDSN(txExecMode))
	obExec(t, c, "SELECT 1")
	dbs = obShow(t, adm, "SHOW DATABASES")
	if v := dbs.num(dbs.must(t, "SHOW DATABASES", "name", pgtest.DBApp), "disabled"); v != 0 {
		t.Errorf("SHOW DATABASES disabled = %d after ENABLE", v)
	}
}

// ---------------------------------------------------------------------------
// RECONNECT and WAIT_CLOSE.

func TestAdminReconnectWaitClose(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) { c.MinSize = 2 }})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	waiter := obAdmin(t, p.instance, pgtest.RoleApp)
	eventually(t, 5*time.Second, "2 idle servers", func() bool {
		st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
		return st.Idle == 2 && st.Total == 2
	})
	a := obConn(t, p.instance, pgtest.DBApp, "obA")
	pidA := obBegin(t, a)
	eventually(t, 5*time.Second, "min_size refilled", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Idle >= 1
	})
	before := obShow(t, adm, "SHOW SERVERS")
	oldIdle := map[int64]bool{}
	for i := range before.Rows {
		if before.val(i, "state") == "idle" {
			oldIdle[before.num(i, "remote_pid")] = true
		}
		if before.num(i, "close_needed") != 0 {
			t.Errorf("close_needed before RECONNECT:\n%s", before)
		}
	}
	if len(oldIdle) == 0 {
		t.Fatalf("no idle server:\n%s", before)
	}

	obCmd(t, adm, "RECONNECT", "RECONNECT")
	servers := obShow(t, adm, "SHOW SERVERS")
	ai := servers.must(t, "SHOW SERVERS", "remote_pid", strconv.Itoa(pidA))
	if servers.num(ai, "close_needed") != 1 || servers.val(ai, "state") != "active" {
		t.Errorf("A's server after RECONNECT:\n%s", servers)
	}
	// Idle servers are replaced by new ones.
	eventually(t, 5*time.Second, "the idle servers replaced", func() bool {
		tb := obShow(t, adm, "SHOW SERVERS")
		fresh := 0
		for i := range tb.Rows {
			pid := tb.num(i, "remote_pid")
			if oldIdle[pid] {
				return false
			}
			if pid != int64(pidA) && tb.num(i, "close_needed") == 0 {
				fresh++
			}
		}
		return fresh >= 1
	})
	c := obConn(t, p.instance, pgtest.DBApp, "obC")
	if pid := obBackendPID(t, c); oldIdle[int64(pid)] || pid == pidA {
		t.Errorf("a new request ran on an old server (pid %d)", pid)
	}

	waited := obAsync(func() error { _, err := obRun(ctxTimeout(t, 30*time.Second), waiter, "WAIT_CLOSE"); return err })
	obPending(t, waited, 500*time.Millisecond, "WAIT_CLOSE with A's transaction open")
	obExec(t, a, "COMMIT")
	if err := obDone(t, waited, 5*time.Second, "WAIT_CLOSE after the commit"); err != nil {
		t.Fatalf("WAIT_CLOSE: %v", err)
	}
	servers = obShow(t, adm, "SHOW SERVERS")
	if servers.find("remote_pid", strconv.Itoa(pidA)) >= 0 {
		t.Errorf("A's server still open after WAIT_CLOSE:\n%s", servers)
	}
	for i := range servers.Rows {
		if servers.num(i, "close_needed") != 0 {
			t.Errorf("close_needed left after WAIT_CLOSE:\n%s", servers)
		}
	}
	// The backend itself is gone.
	direct := relayDirect(t)
	eventually(t, 5*time.Second, "A's backend to exit", func() bool {
		var n int
		_ = direct.QueryRow(ctxTimeout(t, 5*time.Second), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pidA).Scan(&n)
		return n == 0
	})
	if pid := obBackendPID(t, a); pid == pidA {
		t.Errorf("A runs on its old backend after WAIT_CLOSE")
	}
	// Nothing to wait for now: answered at once.
	t0 := time.Now()
	obCmd(t, adm, "WAIT_CLOSE app", "WAIT_CLOSE")
	if d := time.Since(t0); d > time.Second {
		t.Errorf("WAIT_CLOSE with nothing to close took %s", d)
	}
	obErr(t, adm, "WAIT_CLOSE pgbouncer", "08P01", "cannot wait in admin db: pgbouncer")
}

// TestAdminReconnectFastClose: with server_fast_close, RECONNECT ends a
// session-mode client idle on an old server connection at once (FATAL
// 57P01 "database configuration changed"), and one in a transaction at
// its end, never inside it; without it, both keep their connections
// until their sessions end.
func TestAdminReconnectFastClose(t *testing.T) {
	t.Parallel()
	for _, fast := range []bool{true, false} {
		t.Run(fmt.Sprintf("server_fast_close=%v", fast), func(t *testing.T) {
			t.Parallel()
			p := obStart(t, obOpts{mutate: func(c *config.Config) {
				c.PoolMode = config.PoolSession
				c.ServerFastClose = fast
			}})
			adm := obAdmin(t, p.instance, pgtest.RoleApp)
			idle := obConn(t, p.instance, pgtest.DBApp, "fc_idle")
			pidIdle := obBackendPID(t, idle)
			busy := obConn(t, p.instance, pgtest.DBApp, "fc_busy")
			pidBusy := obBegin(t, busy)
			obExec(t, busy, "CREATE TEMP TABLE fc (x int)")

			obCmd(t, adm, "RECONNECT", "RECONNECT")
			time.Sleep(300 * time.Millisecond)
			// The transaction goes on, on its connection, and commits.
			obExec(t, busy, "INSERT INTO fc VALUES (1)")
			if pid := obBackendPID(t, busy); pid != pidBusy {
				t.Fatalf("the transaction moved from backend %d to %d", pidBusy, pid)
			}
			obExec(t, busy, "COMMIT")
			if !fast {
				for _, c := range []struct {
					conn *pgx.Conn
					pid  int
				}{{idle, pidIdle}, {busy, pidBusy}} {
					if pid := obBackendPID(t, c.conn); pid != c.pid {
						t.Errorf("without server_fast_close the session moved from backend %d to %d", c.pid, pid)
					}
				}
				return
			}
			for what, c := range map[string]*pgx.Conn{"idle": idle, "after its commit": busy} {
				var err error
				eventually(t, 5*time.Second, what+" client ended", func() bool {
					_, err = c.Exec(ctxTimeout(t, 5*time.Second), "SELECT 1")
					return err != nil
				})
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "57P01" || !strings.Contains(pe.Message, "database configuration changed") {
					if !strings.Contains(err.Error(), "closed") {
						t.Errorf("%s: got %v, want FATAL 57P01 database configuration changed", what, err)
					}
				}
			}
			if !strings.Contains(p.logs.String(), "client closed: its server connection is being replaced (server_fast_close)") {
				t.Error("no log line for the fast close")
			}
			// New clients get new server connections.
			c := obConn(t, p.instance, pgtest.DBApp, "fc_new")
			if pid := obBackendPID(t, c); pid == pidIdle || pid == pidBusy {
				t.Errorf("a new client got an old backend %d", pid)
			}
		})
	}
}

// TestAdminSetServerTLSReconnects: a changed server_tls_sslmode (SET or a
// reload) replaces the server connections, as PgBouncer recycles them on
// any server TLS change: none made with the old setting is used again.
func TestAdminSetServerTLSReconnects(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.ServerTLSSSLMode, c.MaxSize, c.MinSize = "prefer", 1, 0
		// No sslmode in the URL: the global server_tls_sslmode applies.
		c.Upstream = fmt.Sprintf("postgres://%s:%s@%s:%d/%s", pgtest.RoleApp, pgtest.Password, pg.Host, pg.Port, pgtest.DBApp)
	}})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	c := obConn(t, p.instance, pgtest.DBApp, "tlsre")
	old := obBackendPID(t, c)
	obCmd(t, adm, "SET server_tls_sslmode = disable", "SET server_tls_sslmode=disable")
	if pid := obBackendPID(t, c); pid == old {
		t.Errorf("backend %d, made under server_tls_sslmode prefer, used after the SET", pid)
	}
}

// TestLoginNotifyMessage: login_notify_message reaches each client that
// logs in to a database as a NOTICE before its first ReadyForQuery (as
// PgBouncer's key); a console login does not get it.
func TestLoginNotifyMessage(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) { c.LoginNotifyMessage = "You are now connected to poolerd" }})
	notices := func(db string) []string {
		cfg, err := pgconn.ParseConfig(p.dsn(pgtest.RoleApp, pgtest.Password, db))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { got = append(got, n.Severity+" "+n.Code+" "+n.Message) }
		c, err := pgconn.ConnectConfig(ctxTimeout(t, 10*time.Second), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		return got
	}
	if got := notices(pgtest.DBApp); !slices.Equal(got, []string{"NOTICE 00000 You are now connected to poolerd"}) {
		t.Errorf("notices at login %q, want the login_notify_message", got)
	}
	if got := notices("pgbouncer"); len(got) != 0 {
		t.Errorf("console login got notices %q", got)
	}
}

// TestQueryWaitNotify: a request that waits query_wait_notify for a server
// connection gets one NOTICE in PgBouncer's words, once per wait, and runs
// when a connection frees up; a shorter wait gets none.
func TestQueryWaitNotify(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.MaxSize, c.MinSize, c.PoolMode = 1, 0, config.PoolTransaction
		c.QueryWaitNotify = 300 * time.Millisecond
	}})
	holder := obConn(t, p.instance, pgtest.DBApp, "qwn_holder")
	cfg, err := pgconn.ParseConfig(p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		got = append(got, n.Message)
		mu.Unlock()
	}
	waiter, err := pgconn.ConnectConfig(ctxTimeout(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(context.Background())
	notices := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	const want = "No server connection available in postgres backend, client being queued"
	for round, hold := range []time.Duration{800 * time.Millisecond, 800 * time.Millisecond, 0} {
		obExec(t, holder, "BEGIN")
		obExec(t, holder, "SELECT 1")
		committed := make(chan error, 1)
		go func() {
			time.Sleep(hold)
			_, err := holder.Exec(context.Background(), "COMMIT")
			committed <- err
		}()
		if _, err := waiter.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1").ReadAll(); err != nil {
			t.Fatalf("round %d: the waiting request: %v", round, err)
		}
		if err := <-committed; err != nil {
			t.Fatal(err)
		}
		wantN := min(round+1, 2)
		if n := notices(); len(n) != wantN || n[len(n)-1] != want {
			t.Fatalf("round %d (held %s): notices %q, want %d of %q", round, hold, n, wantN, want)
		}
	}
}

// TestAutoDatabaseLogged: the first pool of a database served by upstream
// (or the * entry), not by an entry of its own, is logged once in
// PgBouncer's words; an entry's database is not.
func TestAutoDatabaseLogged(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password}}
		c.Databases = []config.Database{{Name: "named", DBName: pgtest.DBApp}}
	})
	connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	connectDSN(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp)) // a second pool of it
	connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "named"))
	entries := toLogEntries(t, p, "registered new auto-database")
	if len(entries) != 1 || entries[0].str("database") != pgtest.DBApp {
		t.Errorf("auto-database log lines %v, want one for %s", entries, pgtest.DBApp)
	}
}

func obBackendPID(t *testing.T, c *pgx.Conn) int {
	t.Helper()
	var pid int
	if err := c.QueryRow(ctxTimeout(t, 10*time.Second), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("pg_backend_pid: %v", err)
	}
	return pid
}

// ---------------------------------------------------------------------------
// KILL and KILL_CLIENT.

func TestAdminKill(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	idle := obRawConnect(t, p.instance, pgtest.RoleApp, pgtest.DBApp, "application_name=obidle")
	idle.exec("SELECT 1")
	inTx := obRawConnect(t, p.instance, pgtest.RoleApp, pgtest.DBApp, "application_name=obtx")
	inTx.exec("BEGIN")
	inTx.exec("SELECT 1")
	other := obConn(t, p.instance, pgtest.DBOther, "obother")
	obExec(t, other, "SELECT 1")

	obErr(t, adm, "KILL pgbouncer", "08P01", "cannot kill admin db: pgbouncer")
	obCmd(t, adm, "KILL app", "KILL")
	idle.expectFatal(5*time.Second, "08P01", "database removed")
	inTx.expectFatal(5*time.Second, "08P01", "database removed")
	obExec(t, other, "SELECT 1") // another database: untouched
	// The pool is gone with its stats; poolerd may have created the
	// configured pool again (paused, empty).
	obCheckKilledPools(t, adm, pgtest.DBApp)
	// The database stays, paused (PgBouncer: "paused: 1 if paused (by
	// PAUSE db or KILL)"), so that an operator sees why its clients wait.
	dbs := obShow(t, adm, "SHOW DATABASES")
	if i := dbs.find("name", pgtest.DBApp); i < 0 {
		t.Errorf("after KILL app, SHOW DATABASES has no row for app, so nothing shows that it is paused:\n%s", dbs)
	} else if v := dbs.num(i, "paused"); v != 1 {
		t.Errorf("SHOW DATABASES paused = %d after KILL", v)
	}
	clients := obShow(t, adm, "SHOW CLIENTS")
	if clients.find("database", pgtest.DBApp) >= 0 {
		t.Errorf("clients of the killed database remain:\n%s", clients)
	}

	// New clients wait until RESUME app.
	ctx := ctxTimeout(t, 30*time.Second)
	newDone := obAsync(func() error {
		c, err := pgx.Connect(ctx, p.appDSN(txExecMode))
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "SELECT 1")
		return err
	})
	obPending(t, newDone, 700*time.Millisecond, "a new client of the killed database")
	obCmd(t, adm, "RESUME app", "RESUME")
	if err := obDone(t, newDone, 5*time.Second, "the new client after RESUME app"); err != nil {
		t.Fatalf("new client after RESUME app: %v", err)
	}
}

// KILL without a database (1.25) kills every database but the console.
func TestAdminKillAll(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	spectator := obAdmin(t, p.instance, pgtest.RoleApp)
	a := obRawConnect(t, p.instance, pgtest.RoleApp, pgtest.DBApp)
	a.exec("SELECT 1")
	o := obRawConnect(t, p.instance, pgtest.RoleApp, pgtest.DBOther)
	o.exec("SELECT 1")
	obCmd(t, adm, "KILL", "KILL")
	a.expectFatal(5*time.Second, "08P01", "database removed")
	o.expectFatal(5*time.Second, "08P01", "database removed")
	obShow(t, spectator, "SHOW VERSION") // console clients stay
	obCheckKilledPools(t, adm, pgtest.DBApp)
	obCheckKilledPools(t, adm, pgtest.DBOther)
	// Both stay in SHOW DATABASES, paused until RESUME (PgBouncer keeps the
	// database; "paused: 1 if paused (by PAUSE db or KILL)").
	dbs := obShow(t, adm, "SHOW DATABASES")
	for _, db := range []string{pgtest.DBApp, pgtest.DBOther} {
		if i := dbs.find("name", db); i < 0 {
			t.Errorf("after KILL, SHOW DATABASES has no row for %s, so nothing shows that it is paused:\n%s", db, dbs)
		} else if dbs.num(i, "paused") != 1 {
			t.Errorf("after KILL, SHOW DATABASES %s paused = %d", db, dbs.num(i, "paused"))
		}
	}
	for _, db := range []string{pgtest.DBApp, pgtest.DBOther} {
		obCmd(t, adm, "RESUME "+db, "RESUME")
	}
	obExec(t, connectDSN(t, p.appDSN(txExecMode)), "SELECT 1")
	obExec(t, connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther, txExecMode)), "SELECT 1")
}

// obCheckKilledPools checks that database db's pools were removed by KILL:
// SHOW POOLS and SHOW STATS have no row for it, or only that of a new,
// empty pool.
func obCheckKilledPools(t *testing.T, adm *pgconn.PgConn, db string) {
	t.Helper()
	pools := obShow(t, adm, "SHOW POOLS")
	for i := range pools.Rows {
		if pools.val(i, "database") != db {
			continue
		}
		for _, col := range []string{"cl_active", "cl_waiting", "sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"} {
			if pools.num(i, col) != 0 {
				t.Errorf("after KILL %s, SHOW POOLS still counts %s:\n%s", db, col, pools)
			}
		}
	}
	stats := obShow(t, adm, "SHOW STATS")
	if i := stats.find("database", db); i >= 0 && stats.num(i, "total_query_count") != 0 {
		t.Errorf("after KILL %s, SHOW STATS keeps the killed pool's counts:\n%s", db, stats)
	}
}

func TestAdminKillClient(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	victim := obRawConnect(t, p.instance, pgtest.RoleApp, pgtest.DBApp, "application_name=obvictim")
	victim.exec("BEGIN")
	victim.exec("SELECT 1")
	bystander := obConn(t, p.instance, pgtest.DBApp, "obbystander")
	obExec(t, bystander, "SELECT 1")

	clients := obShow(t, adm, "SHOW CLIENTS")
	id := clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "obvictim"), "id")
	obCmd(t, adm, "KILL_CLIENT "+id, "KILL_CLIENT")
	// KILL_CLIENT answers once the client is gone, as PgBouncer's does.
	if obShow(t, adm, "SHOW CLIENTS").find("id", id) >= 0 {
		t.Error("SHOW CLIENTS right after KILL_CLIENT still lists the client")
	}
	victim.expectFatal(5*time.Second, "08P01", "admin forced disconnect")
	eventually(t, 5*time.Second, "its dirty server released", func() bool {
		st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
		return st.Active == 0
	})
	obExec(t, bystander, "SELECT 1")

	obErr(t, adm, "KILL_CLIENT "+id, "08P01", "client not found")
	obErr(t, adm, "KILL_CLIENT 999999999", "08P01", "client not found")
	obErr(t, adm, "KILL_CLIENT abc", "08P01", "invalid client pointer supplied")
	obErr(t, adm, "KILL_CLIENT", "08P01", "invalid client pointer supplied")
}

// ---------------------------------------------------------------------------
// SET.

func TestAdminSet(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	a := obConn(t, p.instance, pgtest.DBApp, "obA")
	b := obConn(t, p.instance, pgtest.DBApp, "obB")
	obExec(t, b, "SELECT 1")
	obCheckMaxSize(t, p.instance, adm, 5, "before SET")

	obCmd(t, adm, "SET max_size = 1", "SET max_size=1")
	obCheckMaxSize(t, p.instance, adm, 1, "after SET max_size = 1")
	if v := obConfigValue(t, adm, "max_size"); v != "1" {
		t.Errorf("SHOW CONFIG max_size %q after SET", v)
	}
	// The pool now serves one transaction at a time.
	obBegin(t, a)
	ctx := ctxTimeout(t, 30*time.Second)
	bDone := obAsync(func() error { _, err := b.Exec(ctx, "SELECT 1"); return err })
	obPending(t, bDone, 500*time.Millisecond, "a second transaction with max_size 1")
	pools, i := obPoolRow(t, adm, pgtest.DBApp)
	if pools.num(i, "cl_waiting") != 1 || pools.num(i, "sv_active") != 1 {
		t.Errorf("SHOW POOLS with max_size 1:\n%s", pools)
	}
	obExec(t, a, "COMMIT")
	if err := obDone(t, bDone, 5*time.Second, "the second transaction"); err != nil {
		t.Fatal(err)
	}

	obCmd(t, adm, "set max_size to 3", "SET max_size=3")
	obCmd(t, adm, "SET query_timeout = '2s';", "SET query_timeout=2s")
	if v := obConfigValue(t, adm, "query_timeout"); v != "2s" {
		t.Errorf("query_timeout %q after SET", v)
	}
	obErr(t, adm, "SET listen = '127.0.0.1:1'", "08P01", "SET failed: listen can only change with a restart")
	if v := obConfigValue(t, adm, "listen"); v != "127.0.0.1:0" {
		t.Errorf("listen %q after a refused SET", v)
	}
	obErr(t, adm, "SET http_listen = '127.0.0.1:1'", "08P01", "SET failed: http_listen can only change with a restart")
	// PgBouncer's names and units: a plain number of seconds, its key
	// names for poolerd's keys; a PgBouncer setting poolerd has no
	// equivalent of is refused saying so.
	obCmd(t, adm, "SET query_timeout = 5", "SET query_timeout=5s")
	obCmd(t, adm, "SET server_idle_timeout = 90", "SET idle_timeout=90s")
	if v := obConfigValue(t, adm, "idle_timeout"); v != "1m30s" {
		t.Errorf("idle_timeout %q after SET server_idle_timeout = 90", v)
	}
	obErr(t, adm, "SET unix_socket_dir = '/tmp'", "08P01", "SET failed: unix_socket_dir can only change with a restart")
	if pe := obErr(t, adm, "SET pkt_buf = 4096", "08P01", "SET failed"); !strings.Contains(pe.Detail, "no equivalent in poolerd") {
		t.Errorf("SET pkt_buf: detail %q", pe.Detail)
	}
	for _, q := range []string{"SET no_such_key = 1", "SET max_size = 0", "SET max_size = lots", "SET query_timeout = -5",
		"SET pool_mode = statements"} {
		pe := obErr(t, adm, q, "08P01", "SET failed")
		if pe.Detail == "" {
			t.Errorf("%s: no detail says why", q)
		}
	}
	obErr(t, adm, "SET max_size", "08P01", "bad arguments")
	// The upstream URL's password shows neither in the tag nor in the log.
	dsn := pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	tb := obShow(t, adm, "SET upstream = '"+dsn+"'")
	if !strings.HasPrefix(tb.Tag, "SET upstream=") || strings.Contains(tb.Tag, ":"+pgtest.Password+"@") {
		t.Errorf("SET upstream tag %q", tb.Tag)
	}
	obErr(t, adm, "SET upstream = 'postgres://"+pgtest.RoleApp+":"+pgtest.Password+"@127.0.0.1:notaport/x'", "08P01", "SET failed")
	if strings.Contains(p.logs.String(), ":"+pgtest.Password+"@") {
		t.Errorf("the upstream password is in the log")
	}
	if v := obConfigValue(t, adm, "upstream"); strings.Contains(v, ":"+pgtest.Password+"@") {
		t.Errorf("SHOW CONFIG upstream %q shows the password", v)
	}
	obExec(t, b, "SELECT 1")
	if v := obConfigValue(t, adm, "max_size"); v != "3" {
		t.Errorf("max_size %q after refused SETs, want 3", v)
	}
}

// ---------------------------------------------------------------------------
// SHUTDOWN.

func TestAdminShutdown(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-p.srv.ShutdownRequests():
			if got != want {
				t.Errorf("shutdown request %q, want %q", got, want)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("no shutdown request %q", want)
		}
	}
	obCmd(t, adm, "SHUTDOWN WAIT_FOR_SERVERS", "SHUTDOWN")
	expect("WAIT_FOR_SERVERS")
	obCmd(t, adm, "shutdown wait_for_clients;", "SHUTDOWN")
	expect("WAIT_FOR_CLIENTS")
	obErr(t, adm, "SHUTDOWN NOW", "08P01", "invalid command 'SHUTDOWN NOW', use SHOW HELP;")
	select {
	case m := <-p.srv.ShutdownRequests():
		t.Errorf("an invalid SHUTDOWN was passed on: %q", m)
	default:
	}

	// Plain SHUTDOWN: no reply at all, the connection closes.
	raw := obRawConnect(t, p.instance, pgtest.RoleApp, "pgbouncer")
	raw.send("SHUTDOWN")
	if got := raw.expectEnd(5 * time.Second); len(got) != 0 {
		var desc []string
		for _, m := range got {
			desc = append(desc, describeMsg(m))
		}
		t.Errorf("plain SHUTDOWN answered %v, want nothing before the close", desc)
	}
	expect("")
}

// ---------------------------------------------------------------------------
// lib/pq, as pgbouncer_exporter uses it.

func TestAdminLibPQ(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.StatsUsers = []string{pgtest.RoleSCRAM}
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password}}
	}})
	c := obConn(t, p.instance, pgtest.DBApp, "obpq")
	obExec(t, c, "SELECT 1")

	host, port, _ := net.SplitHostPort(p.addr)
	// lib/pq sends extra_float_digits=2 in its startup packet.
	db, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=pgbouncer sslmode=disable",
		host, port, pgtest.RoleSCRAM, pgtest.Password))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ctx := ctxTimeout(t, 20*time.Second)

	query := func(q string) ([]string, [][]any) {
		t.Helper()
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			t.Fatal(err)
		}
		var out [][]any
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatalf("%s: scan: %v", q, err)
			}
			out = append(out, vals)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return cols, out
	}

	// The exporter's connect-time check.
	if _, rows := query("SHOW STATS"); len(rows) < 2 {
		t.Errorf("SHOW STATS: %d rows", len(rows))
	}

	cols, rows := query("SHOW stats_totals;")
	want := []string{"database", "server_assignment_count", "xact_count", "query_count", "bytes_received", "bytes_sent",
		"xact_time", "query_time", "wait_time", "client_parse_count", "server_parse_count", "bind_count"}
	if !slices.Equal(cols, want) {
		t.Errorf("SHOW stats_totals; columns %v", cols)
	}
	found := false
	for _, r := range rows {
		if s, ok := r[0].(string); ok && s == pgtest.DBApp {
			found = true
			for j, v := range r[1:] {
				b, ok := v.([]byte) // numeric arrives as bytes
				if !ok {
					t.Errorf("%s is %T, want numeric bytes", cols[j+1], v)
					continue
				}
				if _, err := strconv.ParseFloat(string(b), 64); err != nil {
					t.Errorf("%s = %q is not a number", cols[j+1], b)
				}
			}
			if n, _ := strconv.Atoi(string(r[2].([]byte))); n < 1 {
				t.Errorf("xact_count %v after a transaction", n)
			}
		}
	}
	if !found {
		t.Errorf("SHOW stats_totals; has no row for app: %v", rows)
	}

	cols, rows = query("SHOW VERSION;")
	if !slices.Equal(cols, []string{"version"}) || len(rows) != 1 {
		t.Fatalf("SHOW VERSION;: %v %v", cols, rows)
	}
	if v, _ := rows[0][0].(string); !strings.HasPrefix(v, "PgBouncer 1.25.") {
		t.Errorf("version %q", rows[0][0])
	}

	cols, rows = query("SHOW LISTS;")
	if len(cols) != 2 || len(rows) != 14 {
		t.Fatalf("SHOW LISTS;: %v, %d rows", cols, len(rows))
	}
	for _, r := range rows {
		name, _ := r[0].(string)
		if _, ok := r[1].(int64); !ok {
			t.Errorf("SHOW LISTS %s items is %T, want an integer", name, r[1])
		}
	}

	cols, rows = query("SHOW CONFIG;")
	if !slices.Equal(cols, []string{"key", "value", "default", "changeable"}) {
		t.Fatalf("SHOW CONFIG; columns %v", cols)
	}
	if len(rows) < 10 {
		t.Errorf("SHOW CONFIG; %d rows", len(rows))
	}

	// Label columns arrive as text or integers, never as numeric bytes.
	cols, rows = query("SHOW pools;")
	for _, r := range rows {
		for j, name := range cols {
			switch name {
			case "database", "user", "pool_mode":
				if _, ok := r[j].(string); !ok {
					t.Errorf("SHOW pools %s is %T", name, r[j])
				}
			case "cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait":
				if _, ok := r[j].(int64); !ok {
					t.Errorf("SHOW pools %s is %T", name, r[j])
				}
			}
		}
	}
	cols, rows = query("SHOW databases;")
	for _, r := range rows {
		for j, name := range cols {
			if name == "port" || name == "pool_size" {
				if _, ok := r[j].(int64); !ok {
					t.Errorf("SHOW databases %s is %T", name, r[j])
				}
			}
		}
	}
	cols, rows = query("SHOW clients;")
	for _, r := range rows {
		for j, name := range cols {
			if name == "connect_time" || name == "request_time" {
				if _, ok := r[j].(string); !ok {
					t.Errorf("SHOW clients %s is %T, want text", name, r[j])
				}
			}
		}
	}

	// An admin through lib/pq can act too.
	adb, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=pgbouncer sslmode=disable",
		host, port, pgtest.RoleApp, pgtest.Password))
	if err != nil {
		t.Fatal(err)
	}
	defer adb.Close()
	if _, err := adb.ExecContext(ctx, "RECONNECT;"); err != nil {
		t.Errorf("RECONNECT; through lib/pq: %v", err)
	}
}
