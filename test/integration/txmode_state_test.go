package integration

// Tests of session state in transaction mode (issue 5, items 3 and 5): what
// a client's SET, temporary table, session advisory lock, LISTEN, SET ROLE,
// SQL PREPARE or cursor WITH HOLD does never reaches another client that
// shares its server connections, and the client that made the state keeps
// it.
//
// Pools are small (1 or 2 server connections) so that clients share
// servers. The pinning tests start from a fresh pool whose first server
// connection is the pinned client's: without pinning, the next client would
// get that same (idle) connection and see the state. Where a test needs a
// request on one given server connection of a pool of 2, two holder clients
// open a transaction each, so that both servers are busy, and the holder of
// the wanted one commits (tsHolders.on).
//
// Helpers are prefixed ts.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// ---------------------------------------------------------------------------
// Helpers.

// tsStart starts poolerd in transaction mode with a pool of size server
// connections, metrics and the admin console (admin user app).
func tsStart(t *testing.T, size int, mutate func(c *config.Config)) *obInst {
	t.Helper()
	return obStart(t, obOpts{metrics: true, mutate: func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = size
		c.MinSize = 0
		c.CheckoutTimeout = 10 * time.Second
		c.LogLevel = "info"
		if mutate != nil {
			mutate(c)
		}
	}})
}

// tsConn connects through p as app with application_name app, in pgx's
// default query exec mode (named statements, cached).
func tsConn(t *testing.T, p *obInst, app string) *pgx.Conn {
	t.Helper()
	return connectDSN(t, p.appDSN("application_name="+app))
}

// tsExec runs sql, which must succeed (simple protocol without args).
func tsExec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(ctxTimeout(t, 15*time.Second), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// tsPID returns the backend pid that serves c's next request.
func tsPID(t *testing.T, c *pgx.Conn) int {
	t.Helper()
	n, err := strconv.Atoi(scalarText(t, c, "SELECT pg_backend_pid()::text"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tsErr runs sql, which must fail with SQLSTATE code; it returns the error.
func tsErr(t *testing.T, c *pgx.Conn, code, sql string, args ...any) *pgconn.PgError {
	t.Helper()
	_, err := c.Exec(ctxTimeout(t, 15*time.Second), sql, args...)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("%s: got %v, want SQLSTATE %s", sql, err, code)
	}
	return pe
}

// tsMetric returns the value of metric name{database="app",user="app",
// reason=reason}.
func tsMetric(t *testing.T, p *obInst, name, reason string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["database"] != pgtest.DBApp || labels["user"] != pgtest.RoleApp || labels["reason"] != reason {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s{database=%q,user=%q,reason=%q}", name, pgtest.DBApp, pgtest.RoleApp, reason)
	return 0
}

// tsPinReasons are the values of poolerd_pinned_clients' reason label.
var tsPinReasons = []string{"temp_table", "sql_prepare", "listen", "advisory_lock", "cursor_with_hold", "set_role"}

// tsWantPinned waits until poolerd_pinned_clients is n for reason and 0 for
// every other reason.
func tsWantPinned(t *testing.T, p *obInst, reason string, n int) {
	t.Helper()
	var last map[string]float64
	ok := func() bool {
		last = map[string]float64{}
		good := true
		for _, r := range tsPinReasons {
			v := tsMetric(t, p, "poolerd_pinned_clients", r)
			last[r] = v
			want := 0.0
			if r == reason {
				want = float64(n)
			}
			good = good && v == want
		}
		return good
	}
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("poolerd_pinned_clients: %v, want %d for %q and 0 for the others", last, n, reason)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tsPort is the client port of c, by which SHOW CLIENTS lists it.
func tsPort(c *pgx.Conn) string {
	return strconv.Itoa(c.PgConn().Conn().LocalAddr().(*net.TCPAddr).Port)
}

// tsShowClients checks the SHOW CLIENTS row of idle client c: a pinned
// client (reason != "") holds its server connection (state active, a link)
// and its pinned column says why; an unpinned one holds nothing once its
// last request is over (waited for: the server is released just after the
// client has its answer, or after a settings snapshot).
func tsShowClients(t *testing.T, p *obInst, c *pgx.Conn, reason string) {
	t.Helper()
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	defer adm.Close(context.Background())
	var tb obTable
	var problem string
	check := func() bool {
		tb = obShow(t, adm, "SHOW CLIENTS")
		i := tb.must(t, "SHOW CLIENTS", "port", tsPort(c))
		state, link := tb.val(i, "state"), tb.val(i, "link")
		switch {
		case reason != "" && (state != "active" || link == ""):
			problem = fmt.Sprintf("pinned idle client has state %q link %q, want active with its server", state, link)
		case reason == "" && (state != "idle" || link != ""):
			problem = fmt.Sprintf("unpinned idle client has state %q link %q, want idle without a server", state, link)
		case tb.col("pinned") >= 0 && tb.val(i, "pinned") != reason:
			problem = fmt.Sprintf("pinned = %q, want %q", tb.val(i, "pinned"), reason)
		default:
			return true
		}
		return false
	}
	deadline := time.Now().Add(10 * time.Second)
	for !check() {
		if time.Now().After(deadline) {
			t.Errorf("SHOW CLIENTS: %s\n%s", problem, tb)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tb.col("pinned") < 0 {
		t.Logf("SHOW CLIENTS has no pinned column: %v", tb.Cols)
	}
}

// tsShowClientsGone waits until SHOW CLIENTS no longer lists the client
// that had port port.
func tsShowClientsGone(t *testing.T, p *obInst, port string) {
	t.Helper()
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	defer adm.Close(context.Background())
	eventually(t, 10*time.Second, "the client gone from SHOW CLIENTS", func() bool {
		return obShow(t, adm, "SHOW CLIENTS").find("port", port) < 0
	})
}

// tsHolders steer other clients' requests to one server connection of a
// pool of 2.
type tsHolders struct {
	t *testing.T
	c [2]*pgx.Conn
}

func tsNewHolders(t *testing.T, p *obInst) *tsHolders {
	t.Helper()
	return &tsHolders{t: t, c: [2]*pgx.Conn{tsConn(t, p, "txs_holder0"), tsConn(t, p, "txs_holder1")}}
}

// begin opens a transaction on each holder, which makes both server
// connections of the pool busy, and returns them with their backend pids.
func (h *tsHolders) begin() ([2]pgx.Tx, [2]int) {
	h.t.Helper()
	ctx := ctxTimeout(h.t, 30*time.Second)
	var txs [2]pgx.Tx
	var pids [2]int
	for i, c := range h.c {
		tx, err := c.Begin(ctx)
		if err != nil {
			h.t.Fatalf("holder %d: begin: %v", i, err)
		}
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pids[i]); err != nil {
			h.t.Fatalf("holder %d: %v", i, err)
		}
		txs[i] = tx
	}
	if pids[0] == pids[1] {
		h.t.Fatalf("both holders are on backend %d", pids[0])
	}
	return txs, pids
}

// pids returns the backend pids of the pool's two server connections
// (opened if need be).
func (h *tsHolders) pids() [2]int {
	h.t.Helper()
	txs, pids := h.begin()
	for _, tx := range txs {
		if err := tx.Commit(ctxTimeout(h.t, 15*time.Second)); err != nil {
			h.t.Fatal(err)
		}
	}
	return pids
}

// on runs f while the server connection of backend pid is the only one
// that can be checked out: every request f makes runs there.
func (h *tsHolders) on(pid int, f func()) {
	h.t.Helper()
	txs, pids := h.begin()
	i := slices.Index(pids[:], pid)
	if i < 0 {
		for _, tx := range txs {
			_ = tx.Rollback(context.Background())
		}
		h.t.Fatalf("the server connection of backend %d is no longer in the pool (it has %v)", pid, pids)
	}
	if err := txs[i].Commit(ctxTimeout(h.t, 15*time.Second)); err != nil {
		h.t.Fatal(err)
	}
	defer func() {
		if err := txs[1-i].Commit(ctxTimeout(h.t, 15*time.Second)); err != nil {
			h.t.Error(err)
		}
	}()
	f()
}

// tsReadSettings returns current_setting(name, true) (NULL as "") for
// each name, in one simple query.
func tsReadSettings(ctx context.Context, c *pgx.Conn, names []string) (map[string]string, error) {
	cols := make([]string, len(names))
	for i, n := range names {
		cols[i] = fmt.Sprintf("coalesce(pg_catalog.current_setting('%s', true), '')", n)
	}
	vals := make([]string, len(names))
	dst := make([]any, len(names))
	for i := range vals {
		dst[i] = &vals[i]
	}
	if err := c.QueryRow(ctx, "SELECT "+strings.Join(cols, ", "), pgx.QueryExecModeSimpleProtocol).Scan(dst...); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(names))
	for i, n := range names {
		out[n] = vals[i]
	}
	return out, nil
}

func tsSettings(t *testing.T, c *pgx.Conn, names []string) map[string]string {
	t.Helper()
	m, err := tsReadSettings(ctxTimeout(t, 15*time.Second), c, names)
	if err != nil {
		t.Fatalf("reading settings: %v", err)
	}
	return m
}

// tsDiff describes how got differs from want ("" when it does not).
func tsDiff(got, want map[string]string) string {
	var d []string
	for name, w := range want {
		if g := got[name]; g != w {
			d = append(d, fmt.Sprintf("%s = %q, want %q", name, g, w))
		}
	}
	slices.Sort(d)
	return strings.Join(d, "; ")
}

// tsCheckSettings fails the test (without stopping it) when c's settings
// differ from want.
func tsCheckSettings(t *testing.T, c *pgx.Conn, who string, want map[string]string) {
	t.Helper()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	if d := tsDiff(tsSettings(t, c, names), want); d != "" {
		t.Errorf("%s: %s", who, d)
	}
}

// tsDirectSettings returns the settings of a fresh direct connection to
// PostgreSQL as app (what a new session has).
func tsDirectSettings(t *testing.T, names []string) map[string]string {
	t.Helper()
	c, err := pgx.Connect(ctxTimeout(t, 15*time.Second), directDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	return tsSettings(t, c, names)
}

// with returns a copy of m with the given name, value pairs.
func with(m map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// tsBuiltin are the (not custom) settings the SET tests change: some that
// PostgreSQL does not report with ParameterStatus and some that it does.
var tsBuiltin = []string{"work_mem", "statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
	"application_name", "TimeZone", "DateStyle"}

// tsAdvisoryHolder returns the pid of the backend holding the session
// advisory lock key (a bigint below 2^31), or 0, as a direct connection
// sees it.
func tsAdvisoryHolder(t *testing.T, direct *pgx.Conn, key int64) int {
	t.Helper()
	var pid int
	err := direct.QueryRow(ctxTimeout(t, 15*time.Second),
		"SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid = $1 AND objsubid = 1 AND granted",
		key).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// tsKey returns an advisory lock key no other test uses.
func tsKey() int64 { return 1_000_000_000 + rand.Int64N(1_000_000_000) }

// ---------------------------------------------------------------------------
// SET.
//
// Apart from the tests of known bugs at the end of this section, a client's
// settings statements are sent as one query string, or followed by a
// statement that does not change settings before the next: a settings
// statement sent while the snapshot of the previous one is still running is
// TestTxStateSetBackToBack's subject.

// Settings a client SETs (unreported ones, reported ones; with SET,
// set_config in a simple query and set_config through the extended
// protocol) are not seen by the other clients of its only server
// connection, and the client still has them after they used it.
func TestTxStateSetNotSeenByOthers(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, nil)
	defaults := tsDirectSettings(t, tsBuiltin)
	a := tsConn(t, p, "txs_set_a")
	others := []*pgx.Conn{tsConn(t, p, "txs_set_b0"), tsConn(t, p, "txs_set_b1"), tsConn(t, p, "txs_set_b2")}
	pid := tsPID(t, a)

	tsExec(t, a, "SET work_mem = '7MB'; SET statement_timeout = '42s'; SELECT set_config('lock_timeout', '3s', false); "+
		"SET application_name = 'txs_set_a2'; SET TIME ZONE 'Asia/Tokyo'; SET DateStyle = 'SQL, DMY'")
	mine := with(defaults, "work_mem", "7MB", "statement_timeout", "42s", "lock_timeout", "3s",
		"application_name", "txs_set_a2", "TimeZone", "Asia/Tokyo", "DateStyle", "SQL, DMY")
	tsCheckSettings(t, a, "A right after its SETs", mine)
	// set_config through the extended protocol, in one round trip
	// (unnamed statement; the named one is TestTxStateSetConfigPrepared's).
	tsExec(t, a, "SELECT set_config('idle_in_transaction_session_timeout', $1, false)", pgx.QueryExecModeExec, "1h")
	mine["idle_in_transaction_session_timeout"] = "1h"
	tsCheckSettings(t, a, "A right after set_config", mine)

	for round := 0; round < 3; round++ {
		for i, b := range others {
			if got := tsPID(t, b); got != pid {
				t.Fatalf("client %d is on backend %d, A on %d: the test needs one server connection", i, got, pid)
			}
			app := fmt.Sprintf("txs_set_b%d", i)
			tsCheckSettings(t, b, fmt.Sprintf("round %d: other client %d", round, i), with(defaults, "application_name", app))
			pc := b.PgConn()
			if pc.ParameterStatus("TimeZone") != defaults["TimeZone"] || pc.ParameterStatus("DateStyle") != defaults["DateStyle"] ||
				pc.ParameterStatus("application_name") != app {
				t.Errorf("round %d: other client %d was told TimeZone %q DateStyle %q application_name %q", round, i,
					pc.ParameterStatus("TimeZone"), pc.ParameterStatus("DateStyle"), pc.ParameterStatus("application_name"))
			}
		}
		tsCheckSettings(t, a, fmt.Sprintf("round %d: A after the others", round), mine)
	}
	if pc := a.PgConn(); pc.ParameterStatus("TimeZone") != "Asia/Tokyo" || pc.ParameterStatus("application_name") != "txs_set_a2" {
		t.Errorf("A was told TimeZone %q application_name %q", pc.ParameterStatus("TimeZone"), pc.ParameterStatus("application_name"))
	}
	tsWantPinned(t, p, "", 0) // SET pins nothing
}

// A client's settings follow it to its next server connection, and do not
// stay behind on the one it left for the client that gets it next.
func TestTxStateSetFollowsClient(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	defaults := tsDirectSettings(t, tsBuiltin)
	h := tsNewHolders(t, p)
	pids := h.pids()
	x, y := pids[0], pids[1]
	a := tsConn(t, p, "txs_follow_a")
	b := tsConn(t, p, "txs_follow_b")
	wantB := with(defaults, "application_name", "txs_follow_b")

	h.on(x, func() {
		tsExec(t, a, "SET work_mem = '9MB'; SET statement_timeout = '43s'; SELECT set_config('lock_timeout', '4s', false); "+
			"SET application_name = 'txs_follow_a2'; SET TimeZone = 'America/Halifax'; SET DateStyle = 'German, DMY'")
		if got := tsPID(t, a); got != x {
			t.Fatalf("A on backend %d, want %d", got, x)
		}
		tsExec(t, a, "SELECT set_config('idle_in_transaction_session_timeout', $1, false)", pgx.QueryExecModeExec, "2h")
	})
	mine := map[string]string{"work_mem": "9MB", "statement_timeout": "43s", "lock_timeout": "4s",
		"idle_in_transaction_session_timeout": "2h", "application_name": "txs_follow_a2", "TimeZone": "America/Halifax",
		"DateStyle": "German, DMY"}
	for round := 0; round < 2; round++ {
		h.on(y, func() {
			if got := tsPID(t, a); got != y {
				t.Fatalf("A on backend %d, want %d", got, y)
			}
			tsCheckSettings(t, a, fmt.Sprintf("round %d: A on its other server", round), mine)
		})
		h.on(x, func() {
			if got := tsPID(t, b); got != x {
				t.Fatalf("B on backend %d, want %d", got, x)
			}
			tsCheckSettings(t, b, fmt.Sprintf("round %d: B on the server A set things on", round), wantB)
		})
		h.on(y, func() {
			tsCheckSettings(t, b, fmt.Sprintf("round %d: B on the server A just used", round), wantB)
		})
		h.on(x, func() {
			tsCheckSettings(t, a, fmt.Sprintf("round %d: A back on its first server", round), mine)
		})
	}
	// The holders, who got both servers after A, never saw A's settings.
	for i, c := range h.c {
		tsCheckSettings(t, c, fmt.Sprintf("holder %d", i), with(defaults, "application_name", fmt.Sprintf("txs_holder%d", i)))
	}
}

// What SET, SET LOCAL, set_config, RESET, RESET ALL and DISCARD ALL leave
// behind, inside and outside transactions (committed, rolled back, rolled
// back to a savepoint, failed), is what it is on a direct connection, on
// the server where it ran and on the next; the other client never sees it.
func TestTxStateSetTransactionsLikeDirect(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	names := []string{"work_mem", "statement_timeout", "lock_timeout", "TimeZone", "DateStyle"}
	h := tsNewHolders(t, p)
	servers := h.pids()
	a := connectDSN(t, p.appDSN()) // no application_name: RESET ALL keeps it as is
	b := connectDSN(t, p.appDSN())
	direct := relayDirect(t)
	defaults := tsSettings(t, direct, names)

	// Each step's statements are sent one at a time; steps run on the
	// two server connections in turn.
	steps := []struct {
		name  string
		stmts []string
	}{
		{"SET", []string{"SET work_mem = '7MB'; SET SESSION statement_timeout = '42s'; SET TIME ZONE 'Asia/Tokyo'"}},
		{"SET LOCAL committed", []string{"BEGIN", "SET LOCAL work_mem = '9MB'", "SET LOCAL statement_timeout = '9s'", "COMMIT"}},
		{"SET rolled back", []string{"BEGIN", "SET work_mem = '11MB'", "SET DateStyle = 'SQL, DMY'", "ROLLBACK"}},
		{"SET committed", []string{"BEGIN", "SET work_mem = '12MB'", "COMMIT"}},
		{"SET rolled back to a savepoint", []string{"BEGIN", "SAVEPOINT s", "SET work_mem = '13MB'", "ROLLBACK TO SAVEPOINT s", "SET lock_timeout = '2s'", "COMMIT"}},
		{"SET in a failed transaction", []string{"BEGIN", "SET statement_timeout = '5s'", "SELECT 1/0", "COMMIT"}},
		{"set_config local", []string{"SELECT set_config('work_mem', '14MB', true)"}},
		{"SET in an implicit transaction that fails", []string{"SET work_mem = '15MB'; SELECT 1/0"}},
		{"RESET", []string{"RESET work_mem"}},
		{"SET before RESET ALL", []string{"SET work_mem = '3MB'"}},
		{"RESET ALL", []string{"RESET ALL"}},
		{"SET after RESET ALL", []string{"SET work_mem = '5MB'; SET DateStyle = 'Postgres, DMY'"}},
		{"RESET ALL in a transaction", []string{"BEGIN", "RESET ALL", "COMMIT"}},
		{"SET in a transaction, then outside", []string{"BEGIN", "SET lock_timeout = '6s'", "COMMIT", "SELECT 1", "SET statement_timeout = '7s'"}},
		{"DISCARD ALL", []string{"DISCARD ALL"}},
	}
	run := func(c *pgx.Conn, sql string) {
		_, err := c.Exec(ctxTimeout(t, 15*time.Second), sql)
		if err != nil && !strings.Contains(sql, "1/0") {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for i, st := range steps {
		here, there := servers[i%2], servers[(i+1)%2]
		for _, sql := range st.stmts {
			run(direct, sql)
		}
		want := tsSettings(t, direct, names)
		h.on(here, func() {
			for _, sql := range st.stmts {
				run(a, sql)
			}
			if got := tsPID(t, a); got != here {
				t.Fatalf("%s: A on backend %d, want %d", st.name, got, here)
			}
			if d := tsDiff(tsSettings(t, a, names), want); d != "" {
				t.Errorf("after %s: A, on the same server: %s", st.name, d)
			}
		})
		h.on(there, func() {
			if d := tsDiff(tsSettings(t, a, names), want); d != "" {
				t.Errorf("after %s: A, on its other server: %s", st.name, d)
			}
		})
		h.on(here, func() {
			if d := tsDiff(tsSettings(t, b, names), defaults); d != "" {
				t.Errorf("after %s: B, on the server A used: %s", st.name, d)
			}
		})
	}
}

// Many clients over a pool of 2: each sees exactly its own settings in
// every transaction, whatever the others set, change, reset or set locally
// in between; those that set nothing always see the defaults.
func TestTxStateSetManyClients(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	const clients, rounds = 16, 12
	names := []string{"work_mem", "statement_timeout", "lock_timeout", "application_name", "TimeZone", "DateStyle"}
	defaults := tsDirectSettings(t, names)
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		conns[i] = tsConn(t, p, fmt.Sprintf("txs_many_%d", i))
	}
	ctx := ctxTimeout(t, 60*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := with(defaults, "application_name", fmt.Sprintf("txs_many_%d", i))
			for r := 0; r < rounds; r++ {
				var stmts []string
				switch i % 4 {
				case 0: // sets nothing
				case 1:
					if r == 0 || r == rounds/2 {
						wm, st := fmt.Sprintf("%dkB", 1024*(r+2)+i), fmt.Sprintf("%ds", 100+i+r)
						stmts = append(stmts, "SET work_mem = '"+wm+"'; SET statement_timeout = '"+st+"'")
						want = with(want, "work_mem", wm, "statement_timeout", st)
					}
				case 2:
					switch r {
					case 0:
						lt, tz := fmt.Sprintf("%ds", i+1), fmt.Sprintf("Etc/GMT-%d", i%12+1)
						stmts = append(stmts, "SELECT set_config('lock_timeout', '"+lt+"', false); SET TimeZone = '"+tz+"'")
						want = with(want, "lock_timeout", lt, "TimeZone", tz)
					case rounds / 2:
						stmts = append(stmts, "RESET lock_timeout")
						want = with(want, "lock_timeout", defaults["lock_timeout"])
					}
				case 3:
					if r == 0 {
						stmts = append(stmts, fmt.Sprintf("SET application_name = 'txs_many_%d_x'; SET DateStyle = 'German, DMY'", i))
						want = with(want, "application_name", fmt.Sprintf("txs_many_%d_x", i), "DateStyle", "German, DMY")
					}
					// A SET LOCAL never outlives its transaction.
					stmts = append(stmts, "BEGIN", "SET LOCAL work_mem = '77kB'", "SET LOCAL TimeZone = 'UTC'", "COMMIT")
				}
				for _, sql := range stmts {
					if _, err := c.Exec(ctx, sql); err != nil {
						errs <- fmt.Errorf("client %d: %s: %w", i, sql, err)
						return
					}
				}
				got, err := tsReadSettings(ctx, c, names)
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				if d := tsDiff(got, want); d != "" {
					errs <- fmt.Errorf("client %d round %d: %s", i, r, d)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Known bugs.

// Settings statements sent one after another, each as soon as the previous
// one's ReadyForQuery arrives (as drivers and ORMs do when they set up a
// session), are all kept by their client and none is left on the server
// connection for the next client.
func TestTxStateSetBackToBack(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, nil)
	defaults := tsDirectSettings(t, []string{"statement_timeout", "lock_timeout"})
	a := tsConn(t, p, "txs_b2b_a")
	b := tsConn(t, p, "txs_b2b_b")
	for i := 1; i <= 20; i++ {
		tsExec(t, a, "SET lock_timeout = '1s'")
		tsExec(t, a, fmt.Sprintf("SET statement_timeout = '%ds'", i))
		if d := tsDiff(tsSettings(t, b, []string{"statement_timeout", "lock_timeout"}), defaults); d != "" {
			t.Fatalf("round %d: B, on A's server: %s", i, d)
		}
		want := map[string]string{"lock_timeout": "1s", "statement_timeout": fmt.Sprintf("%ds", i)}
		if d := tsDiff(tsSettings(t, a, []string{"statement_timeout", "lock_timeout"}), want); d != "" {
			t.Fatalf("round %d: A, after B used its server: %s", i, d)
		}
	}
}

// set_config through a named prepared statement, as pgx runs it by default
// (Parse, Describe, Sync; then Bind, Execute, Sync; later only Bind,
// Execute, Sync): the client keeps the value and nobody else sees it.
func TestTxStateSetConfigPrepared(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, nil)
	a := tsConn(t, p, "txs_prep_cfg_a")
	b := tsConn(t, p, "txs_prep_cfg_b")
	defaults := tsDirectSettings(t, []string{"lock_timeout"})
	const q = "SELECT set_config('lock_timeout', $1, false)"
	for _, v := range []string{"4s", "5s"} { // prepared, then cached by pgx
		tsExec(t, a, q, v)
		tsCheckSettings(t, b, "B after A's set_config "+v, defaults)
		tsCheckSettings(t, a, "A after B used its server", map[string]string{"lock_timeout": v})
	}
}

// Custom options (myapp.tenant), set with SET or set_config(..., false),
// are not seen by the next client of the server connection and follow
// their client; RESET removes them.
func TestTxStateSetCustomOption(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	h := tsNewHolders(t, p)
	pids := h.pids()
	x, y := pids[0], pids[1]
	a := tsConn(t, p, "txs_custom_a")
	b := tsConn(t, p, "txs_custom_b")
	none := map[string]string{"myapp.tenant": "", "myapp.region": ""}
	both := map[string]string{"myapp.tenant": "tenant_a", "myapp.region": "eu"}

	h.on(x, func() {
		tsExec(t, a, "SET myapp.tenant = 'tenant_a'; SELECT set_config('myapp.region', 'eu', false)")
		tsCheckSettings(t, a, "A on the server it set them on", both)
	})
	h.on(x, func() { tsCheckSettings(t, b, "B on the server A set them on", none) })
	h.on(y, func() { tsCheckSettings(t, a, "A on its other server", both) })
	h.on(y, func() { tsExec(t, a, "RESET myapp.tenant") })
	h.on(x, func() {
		tsCheckSettings(t, a, "A after RESET myapp.tenant", map[string]string{"myapp.tenant": "", "myapp.region": "eu"})
	})
	h.on(y, func() { tsCheckSettings(t, b, "B on the server A reset on", none) })
}

// ---------------------------------------------------------------------------
// State that pins.

// A temporary table pins its client: the client sees its table in every
// later transaction, no other client ever sees it, and when the client
// leaves its server connection is reset (DISCARD ALL) and reused without
// the table.
func TestTxStateTempTable(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	tbl := relayName("txs_tmp")
	a := tsConn(t, p, "txs_tmp_a")
	tsExec(t, a, "CREATE TEMP TABLE "+tbl+" (x int)")
	pidA := tsPID(t, a)
	tsWantPinned(t, p, "temp_table", 1)
	if got := tsMetric(t, p, "poolerd_pins_total", "temp_table"); got != 1 {
		t.Errorf("poolerd_pins_total{reason=temp_table} = %v, want 1", got)
	}
	tsShowClients(t, p, a, "temp_table")

	// The first other client would get A's server, idle in the pool, if A
	// were not pinned.
	b := tsConn(t, p, "txs_tmp_b")
	var pidB int
	var visible bool
	if err := b.QueryRow(ctx, "SELECT pg_backend_pid(), to_regclass('pg_temp."+tbl+"') IS NOT NULL").Scan(&pidB, &visible); err != nil {
		t.Fatal(err)
	}
	if pidB == pidA || visible {
		t.Fatalf("B on backend %d (A on %d) sees A's temporary table: %v", pidB, pidA, visible)
	}
	tsErr(t, b, "42P01", "SELECT count(*) FROM "+tbl)
	tsShowClients(t, p, b, "")

	// Many clients over the one server left, while A keeps using its
	// table.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 6; i++ {
		c := tsConn(t, p, fmt.Sprintf("txs_tmp_c%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 10; r++ {
				var pid int
				var visible bool
				if err := c.QueryRow(ctx, "SELECT pg_backend_pid(), to_regclass('pg_temp."+tbl+"') IS NOT NULL").Scan(&pid, &visible); err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				if pid == pidA || visible {
					errs <- fmt.Errorf("client %d on backend %d (A on %d) sees A's table: %v", i, pid, pidA, visible)
					return
				}
			}
		}()
	}
	for r := 1; r <= 10; r++ {
		tsExec(t, a, "INSERT INTO "+tbl+" VALUES ($1)", r)
		if got := scalarText(t, a, "SELECT count(*)::text FROM "+tbl); got != strconv.Itoa(r) {
			t.Fatalf("A's table has %s rows, want %d", got, r)
		}
		if got := tsPID(t, a); got != pidA {
			t.Fatalf("pinned A moved from backend %d to %d", pidA, got)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tsWantPinned(t, p, "temp_table", 1)

	// A leaves: its server connection, whose backend now has a temporary
	// schema, is closed rather than reused (TestTempSchemaNotHandedOn),
	// and the next client runs elsewhere, without the table.
	portA := tsPort(a)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "temp_table", 0)
	tsShowClientsGone(t, p, portA)
	c := tsConn(t, p, "txs_tmp_next")
	if got := tsPID(t, c); got == pidA {
		t.Fatalf("next client on A's backend %d: a connection with a temporary schema went back to the pool", pidA)
	}
	if got := scalarText(t, c, "SELECT (to_regclass('pg_temp."+tbl+"') IS NULL)::text"); got != "true" {
		t.Errorf("A's temporary table is visible to the next client")
	}
	direct := relayDirect(t)
	if got := scalarText(t, direct, "SELECT count(*)::text FROM pg_class WHERE relname = '"+tbl+"'"); got != "0" {
		t.Errorf("A's temporary table still exists after A left")
	}
	if got := tsMetric(t, p, "poolerd_pins_total", "temp_table"); got != 1 {
		t.Errorf("poolerd_pins_total{reason=temp_table} = %v, want 1", got)
	}
}

// DISCARD ALL removes every kind of session state: it unpins the client.
func TestTxStateDiscardAllUnpins(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, func(c *config.Config) { c.CheckoutTimeout = 5 * time.Second })
	tbl := relayName("txs_disc")
	a := tsConn(t, p, "txs_disc_a")
	tsExec(t, a, "CREATE TEMP TABLE "+tbl+" (x int)")
	tsWantPinned(t, p, "temp_table", 1)
	tsExec(t, a, "DISCARD ALL")
	tsWantPinned(t, p, "temp_table", 0)
	tsShowClients(t, p, a, "")
	// With a pool of 1, B would wait for A's server until checkout_timeout
	// if A were still pinned.
	b := tsConn(t, p, "txs_disc_b")
	if got := scalarText(t, b, "SELECT (to_regclass('pg_temp."+tbl+"') IS NULL)::text"); got != "true" {
		t.Errorf("B sees the temporary table A discarded")
	}
	tsErr(t, a, "42P01", "SELECT count(*) FROM "+tbl)
}

// A temporary table ON COMMIT DROP, created and dropped within one
// transaction, leaves no session state: it neither pins its client nor,
// with session_state: refuse, is refused (a direct client gets no error).
func TestTxStateTempTableOnCommitDrop(t *testing.T) {
	t.Parallel()
	const tx = "BEGIN; CREATE TEMP TABLE txs_ocd (x int) ON COMMIT DROP; INSERT INTO txs_ocd VALUES (1); COMMIT"
	p := tsStart(t, 1, nil)
	a := tsConn(t, p, "txs_ocd_a")
	tsExec(t, a, tx)
	tsWantPinned(t, p, "", 0)
	r := tsStart(t, 1, func(c *config.Config) { c.SessionState = config.SessionStateRefuse })
	b := tsConn(t, r, "txs_ocd_b")
	tsExec(t, b, tx)
}

// A session advisory lock pins its client: another client cannot take the
// lock (as on a direct connection), the holder unlocks it in a later
// transaction, and when the holder leaves holding it, the lock is released
// with the reset of its server connection.
func TestTxStateAdvisoryLock(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	key := tsKey()
	direct := relayDirect(t)
	a := tsConn(t, p, "txs_lock_a")
	tsExec(t, a, fmt.Sprintf("SELECT pg_advisory_lock(%d)", key))
	pidA := tsPID(t, a)
	tsWantPinned(t, p, "advisory_lock", 1)
	tsShowClients(t, p, a, "advisory_lock")
	if got := tsAdvisoryHolder(t, direct, key); got != pidA {
		t.Fatalf("lock held by backend %d, want A's %d", got, pidA)
	}

	// Another client cannot take it, as a direct connection cannot. If A
	// were not pinned, B would get A's server and take it again (session
	// advisory locks are reentrant).
	var directGot bool
	if err := direct.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&directGot); err != nil || directGot {
		t.Fatalf("direct pg_try_advisory_lock: %v %v, want false", directGot, err)
	}
	b := tsConn(t, p, "txs_lock_b")
	var pidB int
	var got bool
	if err := b.QueryRow(ctx, "SELECT pg_backend_pid(), pg_try_advisory_lock($1)", key).Scan(&pidB, &got); err != nil {
		t.Fatal(err)
	}
	if got || pidB == pidA {
		t.Fatalf("B (backend %d; A on %d) pg_try_advisory_lock = %v, want false", pidB, pidA, got)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "advisory_lock", 1) // B's pin, if any, ends with B

	// A keeps it over many transactions, while others use the pool.
	c := tsConn(t, p, "txs_lock_c")
	for r := 0; r < 5; r++ {
		if pid := tsPID(t, c); pid == pidA {
			t.Fatalf("client C got pinned A's backend %d", pid)
		}
		var mine bool
		if err := a.QueryRow(ctx, "SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND pid = pg_backend_pid()", key).Scan(&mine); err != nil || !mine {
			t.Fatalf("round %d: A does not see its lock: %v %v", r, mine, err)
		}
	}
	// A unlocks it in a later transaction (on another server it would get
	// false and a warning), takes it again and leaves holding it.
	var unlocked bool
	if err := a.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&unlocked); err != nil || !unlocked {
		t.Fatalf("A's pg_advisory_unlock: %v %v, want true", unlocked, err)
	}
	if got := tsAdvisoryHolder(t, direct, key); got != 0 {
		t.Fatalf("lock still held by backend %d after A unlocked it", got)
	}
	// Unpinned by the unlock, A may take it again on either server; the
	// new pin is to whichever it got.
	tsExec(t, a, fmt.Sprintf("SELECT pg_advisory_lock(%d)", key))
	pidA = tsPID(t, a)
	if got := tsAdvisoryHolder(t, direct, key); got != pidA {
		t.Fatalf("lock held by backend %d, want A's %d", got, pidA)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "advisory_lock", 0)
	// The pin's place goes first (a waiting client may pin at once), then
	// the connection's DISCARD ALL releases the lock, as a direct
	// client's backend does when it exits: soon after, not at once.
	deadline := time.Now().Add(5 * time.Second)
	for tsAdvisoryHolder(t, direct, key) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := tsAdvisoryHolder(t, direct, key); got != 0 {
		t.Fatalf("lock still held by backend %d 5 s after A left", got)
	}

	// The next client on A's server is not holding it, and can take it.
	h := tsNewHolders(t, p)
	d := tsConn(t, p, "txs_lock_d")
	h.on(pidA, func() {
		var mine int
		if err := d.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&mine); err != nil || mine != 0 {
			t.Fatalf("next client on A's server holds %d advisory locks (%v)", mine, err)
		}
	})
	if err := d.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil || !got {
		t.Fatalf("D's pg_try_advisory_lock after A left: %v %v, want true", got, err)
	}
	if err := d.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&got); err != nil || !got {
		t.Fatalf("D's pg_advisory_unlock: %v %v, want true", got, err)
	}
}

// LISTEN pins its client: notifications from other clients reach it
// between its transactions; when it leaves, its server connection stops
// listening before anyone else gets it.
func TestTxStateListen(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	ch := relayName("txs_ch")
	a := tsConn(t, p, "txs_listen_a")
	tsExec(t, a, "LISTEN "+ch)
	pidA := tsPID(t, a)
	tsWantPinned(t, p, "listen", 1)
	tsShowClients(t, p, a, "listen")

	b := tsConn(t, p, "txs_listen_b")
	pidB := tsPID(t, b)
	if pidB == pidA {
		t.Fatalf("B got pinned A's backend %d", pidA)
	}
	wait := func(payload string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := a.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("A waiting for %q: %v", payload, err)
		}
		if n.Channel != ch || n.Payload != payload || n.PID != uint32(pidB) {
			t.Fatalf("A got %+v, want %q on %s from backend %d", n, payload, ch, pidB)
		}
	}
	tsExec(t, b, "NOTIFY "+ch+", 'one'")
	wait("one")
	tsExec(t, b, "SELECT pg_notify($1, 'two')", ch)
	if got := scalarText(t, a, "SELECT count(*)::text FROM pg_listening_channels() c WHERE c = '"+ch+"'"); got != "1" {
		t.Fatalf("A listens on %s channels named %s", got, ch)
	}
	wait("two")

	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "listen", 0)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The next client on A's server: not listening, and a NOTIFY on the
	// channel reaches nobody (not even at the end of its transaction, when
	// PostgreSQL delivers what arrived during it).
	h := tsNewHolders(t, p)
	c := tsConn(t, p, "txs_listen_c")
	d := tsConn(t, p, "txs_listen_d")
	var tx pgx.Tx
	h.on(pidA, func() {
		var err error
		tx, err = c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid, listening int
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_listening_channels())", pgx.QueryExecModeSimpleProtocol).Scan(&pid, &listening); err != nil {
			t.Fatal(err)
		}
		if pid != pidA || listening != 0 {
			t.Fatalf("next client on backend %d (want A's %d) listens on %d channels", pid, pidA, listening)
		}
	})
	tsExec(t, d, "NOTIFY "+ch+", 'after'")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if n, err := c.WaitForNotification(wctx); err == nil {
		t.Fatalf("the next client on A's server got A's notification %+v", n)
	}
	if got := tsMetric(t, p, "poolerd_pins_total", "listen"); got != 1 {
		t.Errorf("poolerd_pins_total{reason=listen} = %v, want 1", got)
	}
}

// SET ROLE pins its client: it keeps its role in later transactions, no
// other client gets it, and its server connection is reset when it leaves.
func TestTxStateSetRole(t *testing.T) {
	t.Parallel()
	role := relayName("txs_role")
	ctx := ctxTimeout(t, 60*time.Second)
	if err := pg.Exec(ctx, "postgres", "CREATE ROLE "+role+" NOLOGIN; GRANT "+role+" TO "+pgtest.RoleApp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after poolerd's shutdown (cleanups run last first)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := pg.Exec(ctx, "postgres", "DROP ROLE IF EXISTS "+role); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	p := tsStart(t, 2, nil)
	a := tsConn(t, p, "txs_role_a")
	tsExec(t, a, "SET ROLE "+role)
	pidA := tsPID(t, a)
	tsWantPinned(t, p, "set_role", 1)
	tsShowClients(t, p, a, "set_role")

	b := tsConn(t, p, "txs_role_b")
	for r := 0; r < 3; r++ {
		if got := scalarText(t, a, "SELECT current_user || ' ' || session_user || ' ' || pg_backend_pid()"); got != fmt.Sprintf("%s app %d", role, pidA) {
			t.Fatalf("round %d: A is %q, want %s on backend %d", r, got, role, pidA)
		}
		var user string
		var pid int
		if err := b.QueryRow(ctx, "SELECT current_user::text, pg_backend_pid()").Scan(&user, &pid); err != nil {
			t.Fatal(err)
		}
		if user != pgtest.RoleApp || pid == pidA {
			t.Fatalf("round %d: B is %q on backend %d (A on %d)", r, user, pid, pidA)
		}
	}
	// SET LOCAL ROLE ends with its transaction, and pins nothing.
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := scalarText(t, b, "SELECT current_user"); got != pgtest.RoleApp {
		t.Fatalf("B is %q after its SET LOCAL ROLE transaction", got)
	}
	tsWantPinned(t, p, "set_role", 1)

	tsExec(t, a, "RESET ROLE")
	if got := scalarText(t, a, "SELECT current_user"); got != pgtest.RoleApp {
		t.Fatalf("A is %q after RESET ROLE", got)
	}
	tsExec(t, a, "SET ROLE "+role)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "set_role", 0)
	h := tsNewHolders(t, p)
	c := tsConn(t, p, "txs_role_c")
	h.on(pidA, func() {
		if got := scalarText(t, c, "SELECT current_user || ' ' || pg_backend_pid()"); got != fmt.Sprintf("app %d", pidA) {
			t.Fatalf("next client on A's server is %q, want app on backend %d", got, pidA)
		}
	})
}

// SQL-level PREPARE pins its client: it EXECUTEs its statement in later
// transactions; another client has no such statement; it is deallocated
// when the client leaves.
func TestTxStateSQLPrepare(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	stmt := relayName("txs_stmt")
	a := tsConn(t, p, "txs_prep_a")
	tsExec(t, a, "PREPARE "+stmt+" (int) AS SELECT $1 * 2")
	pidA := tsPID(t, a)
	tsWantPinned(t, p, "sql_prepare", 1)
	tsShowClients(t, p, a, "sql_prepare")

	b := tsConn(t, p, "txs_prep_b")
	for r := 1; r <= 3; r++ {
		tsErr(t, b, "26000", "EXECUTE "+stmt+"(1)")
		if got := scalarText(t, a, fmt.Sprintf("EXECUTE %s(%d)", stmt, 20+r)); got != strconv.Itoa(2*(20+r)) {
			t.Fatalf("A's EXECUTE gave %s", got)
		}
		if pid := tsPID(t, b); pid == pidA {
			t.Fatalf("B got pinned A's backend %d", pid)
		}
	}
	var n int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE name = $1", stmt).Scan(&n); err != nil || n != 1 {
		t.Fatalf("A sees %d statements %s (%v)", n, stmt, err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "sql_prepare", 0)
	h := tsNewHolders(t, p)
	c := tsConn(t, p, "txs_prep_c")
	h.on(pidA, func() {
		if got := tsPID(t, c); got != pidA {
			t.Fatalf("next client on backend %d, want A's %d", got, pidA)
		}
		tsErr(t, c, "26000", "EXECUTE "+stmt+"(1)")
	})
}

// DECLARE ... WITH HOLD pins its client: it FETCHes from its cursor in later
// transactions, where it left off; another client has no such cursor; it is
// closed when the client leaves.
func TestTxStateCursorWithHold(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	cur := relayName("txs_cur")
	a := tsConn(t, p, "txs_cur_a")
	tsExec(t, a, "DECLARE "+cur+" CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 10) g")
	pidA := tsPID(t, a)
	tsWantPinned(t, p, "cursor_with_hold", 1)
	tsShowClients(t, p, a, "cursor_with_hold")

	b := tsConn(t, p, "txs_cur_b")
	fetch := func() []int32 {
		t.Helper()
		rows, err := a.Query(ctx, "FETCH 3 FROM "+cur, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatalf("FETCH: %v", err)
		}
		return got
	}
	for r := 0; r < 3; r++ {
		tsErr(t, b, "34000", "FETCH 1 FROM "+cur)
		want := []int32{int32(3*r + 1), int32(3*r + 2), int32(3*r + 3)}
		if got := fetch(); !slices.Equal(got, want) {
			t.Fatalf("A fetched %v, want %v", got, want)
		}
		if pid := tsPID(t, b); pid == pidA {
			t.Fatalf("B got pinned A's backend %d", pid)
		}
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tsWantPinned(t, p, "cursor_with_hold", 0)
	h := tsNewHolders(t, p)
	c := tsConn(t, p, "txs_cur_c")
	h.on(pidA, func() {
		if got := scalarText(t, c, "SELECT count(*) || ' ' || pg_backend_pid() FROM pg_cursors"); got != fmt.Sprintf("0 %d", pidA) {
			t.Fatalf("next client on A's server: %q cursors and backend, want 0 on %d", got, pidA)
		}
	})
}

// ---------------------------------------------------------------------------
// session_state: refuse.

// With session_state: refuse, what would pin is refused (0A000, with a hint
// about session mode) before it reaches PostgreSQL: nothing is created, the
// client's connection keeps working and nobody is pinned.
func TestTxStateRefuse(t *testing.T) {
	t.Parallel()
	// A pool of 1 and a short checkout_timeout: a client pinned by mistake
	// would keep the only server from the other client.
	p := tsStart(t, 1, func(c *config.Config) {
		c.SessionState = config.SessionStateRefuse
		c.CheckoutTimeout = 3 * time.Second
	})
	ctx := ctxTimeout(t, 60*time.Second)
	tbl, tbl2 := relayName("txs_rtmp"), relayName("txs_rtmp")
	ch, stmt, cur := relayName("txs_rch"), relayName("txs_rstmt"), relayName("txs_rcur")
	key := tsKey()
	a := tsConn(t, p, "txs_refuse_a")
	b := tsConn(t, p, "txs_refuse_b")
	direct := relayDirect(t)
	cases := []struct {
		what string
		sql  string
		args []any
	}{
		{"CREATE TEMP TABLE", "CREATE TEMP TABLE " + tbl + " (x int)", nil},
		{"SELECT INTO TEMP", "SELECT 1 AS x INTO TEMP " + tbl2, nil},
		{"LISTEN", "LISTEN " + ch, nil},
		{"pg_advisory_lock", fmt.Sprintf("SELECT pg_advisory_lock(%d)", key), nil},
		{"pg_advisory_lock (extended protocol)", "SELECT pg_advisory_lock($1)", []any{key}},
		{"PREPARE", "PREPARE " + stmt + " AS SELECT 1", nil},
		{"DECLARE WITH HOLD", "DECLARE " + cur + " CURSOR WITH HOLD FOR SELECT 1", nil},
		{"SET ROLE", "SET ROLE " + pgtest.RoleApp, nil},
	}
	for _, tc := range cases {
		_, err := a.Exec(ctx, tc.sql, tc.args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "0A000" {
			t.Errorf("%s: got %v, want SQLSTATE 0A000", tc.what, err)
			continue
		}
		if !strings.Contains(pe.Hint, "pool_mode session") || !strings.Contains(pe.Message, "session state") {
			t.Errorf("%s: message %q hint %q, want them to explain session state and pool_mode session", tc.what, pe.Message, pe.Hint)
		}
		// Both clients still work: A is usable and not pinned.
		if got := scalarText(t, a, "SELECT 'a ok'"); got != "a ok" {
			t.Fatalf("after %s: A got %q", tc.what, got)
		}
		if got := scalarText(t, b, "SELECT 'b ok'"); got != "b ok" {
			t.Fatalf("after %s: B got %q", tc.what, got)
		}
	}
	// Nothing reached the server: the one server connection has none of it.
	var state string
	if err := a.QueryRow(ctx, fmt.Sprintf(`SELECT concat_ws(' ',
		(SELECT count(*) FROM pg_class WHERE relname IN ('%s', '%s')),
		(SELECT count(*) FROM pg_listening_channels()),
		(SELECT count(*) FROM pg_prepared_statements WHERE name = '%s'),
		(SELECT count(*) FROM pg_cursors WHERE name = '%s'),
		current_user)`, tbl, tbl2, stmt, cur), pgx.QueryExecModeSimpleProtocol).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "0 0 0 0 app" {
		t.Errorf("temp tables, channels, statements, cursors, user on the server: %q, want \"0 0 0 0 app\"", state)
	}
	if got := tsAdvisoryHolder(t, direct, key); got != 0 {
		t.Errorf("backend %d holds the advisory lock that was refused", got)
	}
	tsWantPinned(t, p, "", 0)
	for _, r := range tsPinReasons {
		if got := tsMetric(t, p, "poolerd_pins_total", r); got != 0 {
			t.Errorf("poolerd_pins_total{reason=%s} = %v, want 0", r, got)
		}
	}
	tsShowClients(t, p, a, "")
}

// ---------------------------------------------------------------------------
// The unnamed prepared statement.

// The unnamed prepared statement lives on between Syncs, and drivers rely
// on it: lib/pq runs a query with arguments as Parse, Describe, Sync and
// then Bind, Execute, Sync; pgx's describe_exec mode does the same. The
// Bind must run the client's own statement, as on a direct connection: not
// another client's, parsed in between on the same server connection, and
// not fail because a query of poolerd's own (a parameter sync, a settings
// snapshot) replaced it.
func TestTxStateUnnamedStatementAcrossSyncs(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	run := func(who string, c *pgconn.PgConn, want string) {
		t.Helper()
		res := c.ExecPrepared(ctx, "", nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != want {
			t.Errorf("%s: Bind of its unnamed statement gave %q, %v; want %q", who, res.Rows, res.Err, want)
		}
	}
	prepare := func(c *pgconn.PgConn, sql string) {
		t.Helper()
		if _, err := c.Prepare(ctx, "", sql, nil); err != nil {
			t.Fatalf("prepare %s: %v", sql, err)
		}
	}

	// Same startup parameters: nothing runs between the two clients.
	x, y := connectDSN(t, p.appDSN()).PgConn(), connectDSN(t, p.appDSN()).PgConn()
	prepare(x, "SELECT 'x'::text")
	prepare(y, "SELECT 'y'::text")
	run("X, after Y prepared its own", x, "x")

	// Different application_name: poolerd's parameter sync runs first.
	u, v := tsConn(t, p, "txs_unnamed_u").PgConn(), tsConn(t, p, "txs_unnamed_v").PgConn()
	prepare(u, "SELECT 'u'::text")
	prepare(v, "SELECT 'v'::text")
	run("U, after V prepared its own", u, "u")

	// One client alone, whose Parse changes settings: poolerd's settings
	// snapshot runs after its Sync.
	w := connectConfig(t, p.appDSN(), func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec })
	if _, err := w.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", "4s"); err != nil {
		t.Errorf("describe_exec set_config: %v", err)
	}

	// lib/pq, many clients over the server connection.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for c := 0; c < 8; c++ {
		db, err := sql.Open("postgres", p.appDSN())
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { _ = db.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				var got string
				err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT 'client %d: ' || $1::text", c), strconv.Itoa(i)).Scan(&got)
				if want := fmt.Sprintf("client %d: %d", c, i); err != nil || got != want {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("got %q (%v), want %q", got, err, want))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("lib/pq: %d of 200 queries wrong, first: %q", len(bad), bad[:min(3, len(bad))])
	}
}
