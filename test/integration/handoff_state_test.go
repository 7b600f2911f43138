package integration

// Tests of issue 31 (no client's state reaches another), items 1, 2 and 4:
// a prepared statement that changes session state applies its effects at
// every execution, not only at its first Parse; a parameter sync that fails
// never leaves the previous client's role in place; DISCARD ALL unpins only
// once what was sent after it has been answered.
//
// Every case runs on a pool of ONE server connection: client A does the
// step and stays connected, idle; client B asks who it is. B either gets
// the connection and must see a clean session, or is refused with 53300
// because A is rightly pinned to it.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestHandOffPreparedRunAgain: a statement that changes session state,
// prepared once and executed again (Bind/Execute only) after the state
// was undone and the client unpinned, pins the client again. pgx's
// statement cache, JDBC after prepareThreshold and psycopg's prepare=True
// all do this.
func TestHandOffPreparedRunAgain(t *testing.T) {
	fx := roleSetup(t)
	type form struct {
		name   string
		set    string // runs through mode (prepared), twice
		undo   string // simple protocol, between the two runs
		lookAt string // what B reads: must be clean
		clean  string
	}
	forms := []form{
		{"set_role", "SET ROLE {r}", "RESET ROLE", "SELECT current_user::text", pgtest.RoleApp},
		{"set_config_role", "SELECT set_config('role', '{r}', false)", "RESET ROLE", "SELECT current_user::text", pgtest.RoleApp},
		{"listen", "LISTEN hs_chan", "UNLISTEN hs_chan", "SELECT pg_catalog.count(*)::text FROM pg_catalog.pg_listening_channels()", "0"},
		{"advisory_lock", "SELECT pg_advisory_lock(4242)", "SELECT pg_advisory_unlock(4242)",
			"SELECT pg_catalog.count(*)::text FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()", "0"},
	}
	modes := []struct {
		name    string
		mode    pgx.QueryExecMode
		maxPrep int // max_prepared_statements; -1: the default
	}{
		{"cache_statement", pgx.QueryExecModeCacheStatement, -1},
		{"cache_describe", pgx.QueryExecModeCacheDescribe, -1},
		// Names passed through: the statement stays on the one server
		// connection, and its Bind must still pin.
		{"cache_statement_names_passed_through", pgx.QueryExecModeCacheStatement, 0},
	}
	for _, f := range forms {
		for _, m := range modes {
			t.Run(f.name+"/"+m.name, func(t *testing.T) {
				p := roleStart(t, config.PoolTransaction, func(c *config.Config) {
					if m.maxPrep >= 0 {
						c.MaxPreparedStatements = m.maxPrep
					}
				})
				ctx := ctxTimeout(t, 30*time.Second)
				a := connectDSN(t, p.appDSN())
				run := func(sql string, mode pgx.QueryExecMode) {
					t.Helper()
					rows, err := a.Query(ctx, fx.sql(sql), mode)
					if err == nil {
						rows.Close()
						err = rows.Err()
					}
					if err != nil {
						t.Fatalf("A: %s: %v", sql, err)
					}
				}
				run(f.set, m.mode)
				run(f.undo, pgx.QueryExecModeSimpleProtocol)
				// Undone: A is unpinned once the check has run; B gets
				// the connection.
				b := connectDSN(t, p.appDSN())
				if got, refused := scanAsk(t, b, f.lookAt); refused || got != f.clean {
					t.Fatalf("B after A undid %s: %q (refused %v), want %q", f.name, got, refused, f.clean)
				}
				run(f.set, m.mode) // Bind/Execute of the cached statement
				if got, refused := scanAsk(t, b, f.lookAt); !refused && got != f.clean {
					t.Errorf("B after A ran its prepared %s again: %q, want %q (or 53300: A pinned)", f.name, got, f.clean)
				}
			})
		}
	}
}

// TestHandOffUnnamedRunAgain: the unnamed statement, bound again in a
// later request without a new Parse (lib/pq, pgx's describe-exec), applies
// its effects again too.
func TestHandOffUnnamedRunAgain(t *testing.T) {
	fx := roleSetup(t)
	p := roleStart(t, config.PoolTransaction, nil)
	a := dialFE(t, p.addr)
	a.login(pgtest.RoleApp, pgtest.Password)
	setRole := fx.sql("SET ROLE {r}")
	a.send(&pgproto3.Parse{Query: setRole}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hsReadUntilReady(t, a)
	// RESET ROLE as a named statement: the unnamed one stays.
	a.send(&pgproto3.Parse{Name: "r", Query: "RESET ROLE"}, &pgproto3.Bind{PreparedStatement: "r"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hsReadUntilReady(t, a)
	b := connectDSN(t, p.appDSN())
	if got, refused := scanAsk(t, b, "SELECT current_user::text"); refused || got != pgtest.RoleApp {
		t.Fatalf("B after A's RESET ROLE: %q (refused %v), want %s", got, refused, pgtest.RoleApp)
	}
	a.send(&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}) // SET ROLE again
	hsReadUntilReady(t, a)
	if got, refused := scanAsk(t, b, "SELECT current_user::text"); !refused && got != pgtest.RoleApp {
		t.Errorf("B after A bound its unnamed SET ROLE again: %q, want %s (or 53300)", got, pgtest.RoleApp)
	}
}

// hsLastAnswer reads c's messages up to ReadyForQuery and returns the
// last ParseComplete ("ParseComplete") or error (its SQLSTATE) among them.
func hsLastAnswer(c *feConn) string {
	got := ""
	for {
		switch m := c.recv().(type) {
		case *pgproto3.ParseComplete:
			got = "ParseComplete"
		case *pgproto3.ErrorResponse:
			got = m.Code
		case *pgproto3.ReadyForQuery:
			return got
		}
	}
}

// hsReadUntilReady reads c's messages up to ReadyForQuery; an error fails
// the test.
func hsReadUntilReady(t *testing.T, c *feConn) {
	t.Helper()
	for {
		switch m := c.recv().(type) {
		case *pgproto3.ReadyForQuery:
			return
		case *pgproto3.ErrorResponse:
			t.Fatalf("server error: %s %s", m.Code, m.Message)
		}
	}
}

// TestHandOffDiscardAllPipelined: DISCARD ALL followed, in one write, by
// a statement that creates session state leaves the client pinned, whether
// it was pinned before or not: the state is A's, B never gets it.
func TestHandOffDiscardAllPipelined(t *testing.T) {
	forms := []struct {
		name, after, lookAt, clean string
	}{
		{"listen", "LISTEN hs_discard", "SELECT pg_catalog.count(*)::text FROM pg_catalog.pg_listening_channels()", "0"},
		{"advisory_lock", "SELECT pg_advisory_lock(4343)",
			"SELECT pg_catalog.count(*)::text FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()", "0"},
		{"temp_table", "CREATE TEMP TABLE hs_discard_t (x int)",
			"SELECT pg_catalog.count(*)::text FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()", "0"},
	}
	for _, f := range forms {
		for _, shape := range []string{"unpinned", "pinned"} {
			t.Run(f.name+"/"+shape, func(t *testing.T) {
				p := roleStart(t, config.PoolTransaction, nil)
				a := dialFE(t, p.addr)
				a.login(pgtest.RoleApp, pgtest.Password)
				if shape == "pinned" {
					// Pinned first, so that DISCARD ALL has a pin to let go.
					a.mustQuery("LISTEN hs_first")
				}
				// One write; in one text DISCARD ALL would run in the
				// text's implicit transaction block and fail.
				a.send(&pgproto3.Query{String: "DISCARD ALL"}, &pgproto3.Query{String: f.after})
				hsReadUntilReady(t, a)
				hsReadUntilReady(t, a)
				b := connectDSN(t, p.appDSN())
				if got, refused := scanAsk(t, b, f.lookAt); !refused && got != f.clean {
					t.Errorf("B after A's DISCARD ALL and %s: %q, want %q (or 53300: A pinned)", f.after, got, f.clean)
				}
			})
		}
	}
}

// TestHandOffFailedParamSync: a parameter sync that fails (temp_buffers
// cannot change once the backend used a temporary table) neither leaves
// the previous client's role in place nor returns the connection to the
// pool: B runs as its login role, and the connection is closed. The temp
// table is made by a function, which poolerd cannot see into: one it sees
// closes the connection when A is done with it (TestTempSchemaNotHandedOn),
// and B's sync never meets that backend.
func TestHandOffFailedParamSync(t *testing.T) {
	fx := roleSetup(t)
	p := roleStart(t, config.PoolTransaction, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	// B first, so that its startup parameter is one poolerd must apply.
	b := connectDSN(t, p.appDSN("options=-c temp_buffers=16MB"))
	if got, _ := scanAsk(t, b, "SELECT current_setting('temp_buffers')"); got != "16MB" {
		t.Fatalf("B's temp_buffers: %q, want 16MB", got)
	}
	a := connectDSN(t, p.appDSN("options=-c role="+fx.role))
	if got, _ := scanAsk(t, a, "SELECT current_user::text"); got != fx.role {
		t.Fatalf("A's current_user: %q, want %s", got, fx.role)
	}
	mkTemp := relayName("hs_mk_temp")
	if err := pg.Exec(ctx, pgtest.DBApp, "CREATE FUNCTION "+mkTemp+"() RETURNS int LANGUAGE plpgsql AS "+
		"$$ BEGIN CREATE TEMP TABLE hs_t ON COMMIT DROP AS SELECT 1; RETURN 1; END $$"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Exec(context.Background(), pgtest.DBApp, "DROP FUNCTION IF EXISTS "+mkTemp+"()") })
	for _, q := range []string{"BEGIN", "SELECT " + mkTemp + "()", "COMMIT"} {
		if _, err := a.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("A: %s: %v", q, err)
		}
	}
	before := hsBackendPIDs(t)
	if got, refused := scanAsk(t, b, "SELECT current_user::text || '|' || pg_catalog.pg_backend_pid()"); refused || !strings.HasPrefix(got, pgtest.RoleApp+"|") {
		t.Fatalf("B after A (role %s, a temp table): %q (refused %v), want %s", fx.role, got, refused, pgtest.RoleApp)
	}
	// That connection is not pooled: B's next request, and C's, run on
	// another backend, as their own role.
	c := connectDSN(t, p.appDSN())
	for i := 0; ; i++ {
		got, refused := scanAsk(t, c, "SELECT current_user::text || '|' || pg_catalog.pg_backend_pid()")
		if refused {
			t.Fatal("C refused")
		}
		who, pid, _ := strings.Cut(got, "|")
		if who != pgtest.RoleApp {
			t.Fatalf("C: %q, want %s", got, pgtest.RoleApp)
		}
		if !before[pid] {
			break
		}
		if i > 50 {
			t.Fatalf("C still on backend %s, whose parameter sync failed", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, _ := scanAsk(t, b, "SELECT current_setting('temp_buffers') || '|' || current_user"); got != "16MB|"+pgtest.RoleApp {
		t.Errorf("B on a fresh connection: %q, want 16MB|%s", got, pgtest.RoleApp)
	}
}

// hsBackendPIDs lists the pids of app's backends now.
func hsBackendPIDs(t *testing.T) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pg.SuperDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, "SELECT pid::text FROM pg_stat_activity WHERE usename = $1", pgtest.RoleApp)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]bool{}
	for rows.Next() {
		var pid string
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids[pid] = true
	}
	return pids
}

// TestHandOffCachedParseInFailedBlock: a named Parse inside a failed
// transaction block is refused (25P02) as directly, also when poolerd
// answers it from a definition already prepared on the connection (found
// by TestStateFuzz, seed 4006434).
func TestHandOffCachedParseInFailedBlock(t *testing.T) {
	p := roleStart(t, config.PoolTransaction, nil)
	const text = "SELECT 42 AS cached"
	// B prepares the text first: the one connection has its definition.
	b := dialFE(t, p.addr)
	b.login(pgtest.RoleApp, pgtest.Password)
	b.send(&pgproto3.Parse{Name: "s", Query: text}, &pgproto3.Sync{})
	hsReadUntilReady(t, b)
	a := dialFE(t, p.addr)
	a.login(pgtest.RoleApp, pgtest.Password)
	a.mustQuery("BEGIN")
	if _, e := a.query("SELECT 1/0"); e == nil || e.Code != "22012" {
		t.Fatalf("1/0: %v", e)
	}
	a.send(&pgproto3.Parse{Name: "mine", Query: text}, &pgproto3.Sync{})
	if got := hsLastAnswer(a); got != "25P02" {
		t.Errorf("Parse in a failed block: %s, want 25P02 as directly", got)
	}
	a.mustQuery("ROLLBACK")
	// The name was not created.
	a.send(&pgproto3.Bind{PreparedStatement: "mine"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	if got := hsLastAnswer(a); got != "26000" {
		t.Errorf("Bind of the refused name: %q, want 26000", got)
	}
}

// TestHandOffCachedRollbackInFailedBlock: a named Parse of ROLLBACK inside
// a failed block is accepted, as directly, also when poolerd answers it
// from a definition already prepared on the connection (the state fuzzer,
// seed 5000548).
func TestHandOffCachedRollbackInFailedBlock(t *testing.T) {
	p := roleStart(t, config.PoolTransaction, nil)
	b := dialFE(t, p.addr)
	b.login(pgtest.RoleApp, pgtest.Password)
	b.send(&pgproto3.Parse{Name: "rb", Query: "ROLLBACK"}, &pgproto3.Sync{})
	hsReadUntilReady(t, b)
	a := dialFE(t, p.addr)
	a.login(pgtest.RoleApp, pgtest.Password)
	a.mustQuery("BEGIN")
	if _, e := a.query("SELECT 1/0"); e == nil || e.Code != "22012" {
		t.Fatalf("1/0: %v", e)
	}
	a.send(&pgproto3.Parse{Name: "mine", Query: "ROLLBACK"}, &pgproto3.Bind{PreparedStatement: "mine"},
		&pgproto3.Execute{}, &pgproto3.Sync{})
	var tag string
	for done := false; !done; {
		switch m := a.recv().(type) {
		case *pgproto3.CommandComplete:
			tag = string(m.CommandTag)
		case *pgproto3.ErrorResponse:
			t.Fatalf("ROLLBACK in a failed block: %s %s, want ROLLBACK as directly", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			done = true
			if m.TxStatus != 'I' {
				t.Errorf("status after ROLLBACK: %c", m.TxStatus)
			}
		}
	}
	if tag != "ROLLBACK" {
		t.Errorf("tag %q, want ROLLBACK", tag)
	}
}
