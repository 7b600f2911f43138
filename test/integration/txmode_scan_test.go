package integration

// Tests of issue 31, holes 5 and 6: session state that the SQL scanner did
// not see reached the next client. Every case runs in transaction mode on a
// pool of ONE server connection: client A runs a step and stays connected
// (idle); client B connects and looks at its server connection. B must not
// see A's temporary table, cursor, customized option or role, or else be
// refused (53300) because A is rightly pinned to the one connection.
//
// Helpers are prefixed scan.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// scanCase is one step of A's and what B asks afterwards.
type scanCase struct {
	name  string
	sql   string // {t} is a table name, {c} a cursor's, {f} a function's, {r} A's role, {fc} a function that sets it
	args  []any  // sent with the extended protocol, else the simple one
	probe string // what B asks; B must get want, or 53300
	want  string
	// keeps: A still sees this in a later transaction (the value of
	// myapp.tenant): poolerd carries it along.
	keeps string
}

// scanRun runs sql on c (simple protocol without args); it must succeed.
func scanRun(t *testing.T, c *pgx.Conn, sql string, args []any) {
	t.Helper()
	ctx := ctxTimeout(t, 15*time.Second)
	var err error
	if args != nil {
		_, err = c.Exec(ctx, sql, args...)
	} else {
		_, err = c.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scanAsk runs a one-value query on c; refused is set when poolerd refused
// it for want of a server connection (53300).
func scanAsk(t *testing.T, c *pgx.Conn, q string) (v string, refused bool) {
	t.Helper()
	err := c.QueryRow(ctxTimeout(t, 15*time.Second), q, pgx.QueryExecModeSimpleProtocol).Scan(&v)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "53300" {
		return "", true
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v, false
}

// scanCheck runs case sc: A's step, then B's probe while A stays
// connected, then (for keeps) A's own look.
func scanCheck(t *testing.T, p *obInst, repl *strings.Replacer, sc scanCase) {
	t.Helper()
	a := connectDSN(t, p.appDSN("application_name=scan_a"))
	args := make([]any, len(sc.args))
	for i, x := range sc.args {
		if s, ok := x.(string); ok {
			x = repl.Replace(s)
		}
		args[i] = x
	}
	if sc.args == nil {
		args = nil
	}
	scanRun(t, a, repl.Replace(sc.sql), args)
	b := connectDSN(t, p.appDSN("application_name=scan_b"))
	if got, refused := scanAsk(t, b, repl.Replace(sc.probe)); !refused && got != sc.want {
		t.Errorf("%s: B, while A is connected: %s = %q, want %q (or 53300)", sc.name, sc.probe, got, sc.want)
	}
	if sc.keeps != "" {
		if got, _ := scanAsk(t, a, repl.Replace(sc.probe)); got != sc.keeps {
			t.Errorf("%s: A, in its next transaction: %s = %q, want %q", sc.name, sc.probe, got, sc.keeps)
		}
	}
}

const (
	scanTempProbe   = "SELECT count(*)::text FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()"
	scanCursorProbe = "SELECT count(*)::text FROM pg_catalog.pg_cursors"
	scanTenantProbe = "SELECT coalesce(pg_catalog.current_setting('myapp.tenant', true), '')"
	scanRoleProbe   = "SELECT current_user::text"
)

// TestScanTempAndCursor: temporary tables and a cursor WITH HOLD in the
// spellings the scanner missed pin A; B never sees them.
func TestScanTempAndCursor(t *testing.T) {
	tbl := relayName("scan_t")
	repl := strings.NewReplacer("{t}", tbl, "{c}", tbl+"_c")
	ctx := ctxTimeout(t, 30*time.Second)
	// public.{t}: B's unqualified name must read this table, not A's.
	if err := pg.Exec(ctx, pgtest.DBApp, repl.Replace("CREATE TABLE {t} (src text); INSERT INTO {t} VALUES ('public'); GRANT SELECT ON {t} TO PUBLIC")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, pgtest.DBApp, repl.Replace("DROP TABLE IF EXISTS {t}"))
	})
	cases := []scanCase{
		{name: "select_into_temp_past_words", sql: "SELECT 'temp' AS src, 2 AS b, 3 AS c, 4 AS d INTO TEMP {t}",
			probe: "SELECT string_agg(src, ',') FROM {t}", want: "public"},
		{name: "with_select_into_temp", sql: "WITH q AS (SELECT 'temp'::text AS src) SELECT * INTO TEMP {t} FROM q",
			probe: scanTempProbe, want: "0"},
		{name: "create_table_pg_temp", sql: "CREATE TABLE pg_temp.{t} (x int)", probe: scanTempProbe, want: "0"},
		{name: "create_table_pg_temp_extended", sql: "CREATE TABLE pg_temp.{t} (x int)", args: []any{},
			probe: scanTempProbe, want: "0"},
		{name: "cursor_with_hold_options", sql: "DECLARE {c} BINARY INSENSITIVE NO SCROLL CURSOR WITH HOLD FOR SELECT 1",
			probe: scanCursorProbe, want: "0"},
	}
	for _, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			p := roleStart(t, config.PoolTransaction, nil)
			scanCheck(t, p, repl, sc)
		})
	}
}

// TestScanCustomOptions: a customized option A sets in a spelling whose
// name the text does not show (or did not, to the scanner) never reaches
// B; where poolerd can read the name, A keeps its value.
func TestScanCustomOptions(t *testing.T) {
	fn := relayName("scan_fn")
	repl := strings.NewReplacer("{f}", fn)
	ctx := ctxTimeout(t, 30*time.Second)
	if err := pg.Exec(ctx, pgtest.DBApp, repl.Replace(`CREATE FUNCTION {f}() RETURNS int LANGUAGE plpgsql AS
$f$ BEGIN PERFORM set_config('myapp.tenant', 'tenant_a', false); RETURN 1; END $f$`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, pgtest.DBApp, repl.Replace("DROP FUNCTION IF EXISTS {f}()"))
	})
	cases := []scanCase{
		{name: "quoted_set_config", sql: `SELECT "set_config"('myapp.tenant', 'tenant_a', false)`,
			probe: scanTenantProbe, keeps: "tenant_a"},
		{name: "escape_string_name", sql: `SELECT set_config(E'myapp.tenant', 'tenant_a', false)`,
			probe: scanTenantProbe, keeps: "tenant_a"},
		{name: "escape_string_with_escapes", sql: `SELECT set_config(E'myapp\x2etenant', 'tenant_a', false)`,
			probe: scanTenantProbe},
		{name: "parameter_name", sql: "SELECT set_config($1, $2, false)", args: []any{"myapp.tenant", "tenant_a"},
			probe: scanTenantProbe},
		{name: "computed_name", sql: "SELECT set_config('myapp.' || 'tenant', 'tenant_a', false)", probe: scanTenantProbe},
		{name: "do_block", sql: "DO $$ BEGIN PERFORM set_config('myapp.tenant', 'tenant_a', false); END $$",
			probe: scanTenantProbe},
		{name: "function_body", sql: "SELECT {f}()", probe: scanTenantProbe},
		{name: "three_part_name", sql: "SET myapp.tenant.sub = 'tenant_a'",
			probe: "SELECT coalesce(pg_catalog.current_setting('myapp.tenant.sub', true), '')", keeps: "tenant_a"},
	}
	for _, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			p := roleStart(t, config.PoolTransaction, nil)
			scanCheck(t, p, repl, sc)
		})
	}
}

// TestScanRoleCalls: a function that sets the role, called where the
// scanner did not count a call (after ON, in an array slice, named like a
// key word), does not give B A's role.
func TestScanRoleCalls(t *testing.T) {
	fx := roleSetup(t)
	ctx := ctxTimeout(t, 30*time.Second)
	// hash(int): a function named like a key word (PARTITION BY HASH);
	// {r}_d: a table A may delete from, with a row (else the join would not
	// run the function).
	if err := pg.Exec(ctx, pgtest.DBApp, fx.sql(`CREATE OR REPLACE FUNCTION public.hash(int) RETURNS int LANGUAGE plpgsql AS
$f$ BEGIN PERFORM set_config('role', '{r}', false); RETURN 1; END $f$;
CREATE TABLE {r}_d (x int); INSERT INTO {r}_d VALUES (5); GRANT ALL ON {r}_d TO PUBLIC`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, pgtest.DBApp, fx.sql("DROP FUNCTION IF EXISTS public.hash(int); DROP TABLE IF EXISTS {r}_d"))
	})
	cases := []scanCase{
		{name: "after_on", sql: "SELECT 1 FROM (SELECT 1 AS x) a JOIN (SELECT 1 AS x) b ON {fc}() = a.x"},
		{name: "after_using", sql: "DELETE FROM {r}_d USING {fc}() AS s WHERE {r}_d.x = s"},
		{name: "array_slice", sql: "SELECT (ARRAY[1, 2, 3])[1:{fc}()]"},
		{name: "keyword_name", sql: "SELECT hash(1)"},
	}
	for _, sc := range cases {
		sc.probe, sc.want = scanRoleProbe, pgtest.RoleApp
		t.Run(sc.name, func(t *testing.T) {
			p := roleStart(t, config.PoolTransaction, nil)
			scanCheck(t, p, fx.replace, sc)
		})
	}
}

// TestScanHandOverCustomOption: a client's customized option goes with it
// to the new poolerd of a takeover, and there, as before, never reaches
// another client.
func TestScanHandOverCustomOption(t *testing.T) {
	one := func(c *config.Config) {
		c.MaxSize = 1
		c.MinSize = 0
		c.CheckoutTimeout = time.Second
	}
	oldP := startPoolerd(t, one)
	newP := startPoolerd(t, one)
	ctx := ctxTimeout(t, 30*time.Second)
	a := oldP.connect(t, "default_query_exec_mode=simple_protocol")
	scanRun(t, a, "SET myapp.tenant = 'tenant_a'", nil)
	_, done := handOver(ctx, oldP, newP)
	if err := <-done; err != nil {
		t.Fatalf("HandOver: %v", err)
	}
	if got, _ := scanAsk(t, a, scanTenantProbe); got != "tenant_a" {
		t.Fatalf("A through the new poolerd: myapp.tenant = %q, want tenant_a", got)
	}
	// Another setting: the snapshot after it must still read A's option.
	scanRun(t, a, "SET work_mem = '8MB'", nil)
	if got, _ := scanAsk(t, a, scanTenantProbe); got != "tenant_a" {
		t.Errorf("A after SET work_mem: myapp.tenant = %q, want tenant_a", got)
	}
	b := newP.connect(t, "default_query_exec_mode=simple_protocol")
	if got, refused := scanAsk(t, b, scanTenantProbe); refused || got != "" {
		t.Errorf("B on the new poolerd: myapp.tenant = %q (refused %v), want empty", got, refused)
	}
}
