package integration

// Tests of issue 22, item 1: in transaction and statement mode no client
// ever runs as a role that another client of its pool set, whatever form
// changed the role: the spellings of SET ROLE and SET SESSION AUTHORIZATION
// the scanner pins, set_config in any position, and the changes no scanner
// can see (DO blocks, procedures, functions called from a SELECT).
//
// Every case runs on a pool of ONE server connection, so that a leaked role
// would be inherited by the next client. Client A changes its role and
// stays connected while client B asks who it is (B either waits for the
// one server connection and is refused with 53300, because A is pinned to
// it, or gets it and must be its login role); then A leaves and client C
// asks. B and C also read a table whose row-level security policy shows a
// row only to the role that owns it: A's role owns one row, and nobody but
// A may ever see it.
//
// Helpers are prefixed role.

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// roleFixture is a NOLOGIN role granted to app, the functions and the
// procedure that switch to it, and a table with row-level security.
type roleFixture struct {
	role    string // the role A switches to ("elevated")
	fnCfg   string // plpgsql function: PERFORM set_config('role', role, false)
	fnExec  string // plpgsql function: EXECUTE 'SET ROLE role'
	proc    string // plpgsql procedure: EXECUTE 'SET ROLE role'
	fnSA    string // plpgsql function: EXECUTE 'SET SESSION AUTHORIZATION role' (superuser callers)
	table   string // RLS: a row of role, visible only where current_user = role
	secret  string // the body of that row
	replace *strings.Replacer
}

// roleSetup creates the fixture; everything is dropped when the test ends.
func roleSetup(t *testing.T) *roleFixture {
	t.Helper()
	f := &roleFixture{role: relayName("role_el")}
	f.fnCfg, f.fnExec, f.proc, f.fnSA = f.role+"_fc", f.role+"_fx", f.role+"_p", f.role+"_fsa"
	f.table, f.secret = f.role+"_t", "secret of "+f.role
	f.replace = strings.NewReplacer("{r}", f.role, "{fc}", f.fnCfg, "{fx}", f.fnExec, "{p}", f.proc, "{fsa}", f.fnSA)
	ctx := ctxTimeout(t, 60*time.Second)
	if err := pg.Exec(ctx, "postgres", "CREATE ROLE "+f.role+" NOLOGIN; GRANT "+f.role+" TO "+pgtest.RoleApp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after poolerd's shutdown (cleanups run last first)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := pg.Exec(ctx, pgtest.DBApp, f.sql("DROP TABLE IF EXISTS {r}_t; DROP FUNCTION IF EXISTS {fc}(); "+
			"DROP FUNCTION IF EXISTS {fx}(); DROP FUNCTION IF EXISTS {fsa}(); DROP PROCEDURE IF EXISTS {p}()")); err != nil {
			t.Logf("drop fixture: %v", err)
		}
		if err := pg.Exec(ctx, "postgres", "DROP ROLE IF EXISTS "+f.role); err != nil {
			t.Logf("drop role %s: %v", f.role, err)
		}
	})
	setup := f.sql(`
CREATE FUNCTION {fc}() RETURNS int LANGUAGE plpgsql AS $f$ BEGIN PERFORM set_config('role', '{r}', false); RETURN 1; END $f$;
CREATE FUNCTION {fx}() RETURNS int LANGUAGE plpgsql AS $f$ BEGIN EXECUTE 'SET ROLE {r}'; RETURN 1; END $f$;
CREATE FUNCTION {fsa}() RETURNS int LANGUAGE plpgsql AS $f$ BEGIN EXECUTE 'SET SESSION AUTHORIZATION {r}'; RETURN 1; END $f$;
CREATE PROCEDURE {p}() LANGUAGE plpgsql AS $f$ BEGIN EXECUTE 'SET ROLE {r}'; END $f$;
CREATE TABLE {r}_t (owner name NOT NULL, body text NOT NULL);
ALTER TABLE {r}_t ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON {r}_t USING (owner = current_user);
GRANT SELECT ON {r}_t TO PUBLIC;
INSERT INTO {r}_t VALUES ('{r}', 'secret of {r}'), ('nobody', 'not yours');`)
	if err := pg.Exec(ctx, pgtest.DBApp, setup); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *roleFixture) sql(s string) string { return f.replace.Replace(s) }

// roleForm is one way of changing the role.
type roleForm struct {
	name string
	sql  string // {r} is the role, {fc}, {fx}, {fsa}, {p} the fixture's functions
	args []any  // sent with the extended protocol (Parse/Bind/Execute), else the simple one
	// keeps: A keeps its role in later transactions (pinned, by the
	// scanner or by the check after a statement that may change it).
	keeps bool
}

// roleForms are the forms a non-superuser login can run.
var roleForms = []roleForm{
	{name: "set_role", sql: "SET ROLE {r}", keeps: true},
	{name: "set_session_role", sql: "SET SESSION ROLE {r}", keeps: true},
	{name: "set_quoted_role_to", sql: `SET "role" TO {r}`, keeps: true},
	{name: "set_session_quoted_role_to", sql: `SET SESSION "role" TO {r}`, keeps: true},
	{name: "set_role_equals", sql: "set role = {r}", keeps: true},
	{name: "set_role_mixed_case", sql: "SeT RoLe {r}", keeps: true},
	{name: "set_role_second_statement", sql: "SELECT 1; SET ROLE {r}", keeps: true},
	{name: "set_role_after_64KB_comment", sql: "/* " + strings.Repeat("padding ", 9<<10) + "*/ SET ROLE {r}", keeps: true},
	{name: "set_config", sql: "SELECT set_config('role', '{r}', false)", keeps: true},
	{name: "set_config_second_statement_qualified", sql: "select 1; select pg_catalog.set_config('role', '{r}', false)", keeps: true},
	{name: "set_config_quoted_name", sql: `SELECT "set_config"('role', '{r}', false)`, keeps: true},
	{name: "set_config_nested_upper", sql: "SELECT length(upper(SET_CONFIG('ROLE', '{r}', FALSE)))", keeps: true},
	{name: "set_config_extended", sql: "SELECT set_config($1, $2, $3)", args: []any{"role", "{r}", false}, keeps: true},
	{name: "set_config_extended_unnamed", sql: "SELECT set_config($1, $2, $3)", args: []any{pgx.QueryExecModeExec, "role", "{r}", false}, keeps: true},
	{name: "do_execute_set_role", sql: "DO $$ begin execute 'set role {r}'; end $$", keeps: true},
	{name: "do_perform_set_config", sql: "DO $$ begin perform set_config('role', '{r}', false); end $$", keeps: true},
	{name: "call_procedure", sql: "CALL {p}()", keeps: true},
	{name: "select_function_set_config", sql: "SELECT {fc}()"},
	{name: "select_function_execute_set_role", sql: "SELECT {fx}()"},
	{name: "select_function_extended", sql: "SELECT {fc}() + $1::int", args: []any{0}},
	{name: "select_function_extended_unnamed", sql: "SELECT {fx}() + $1::int", args: []any{pgx.QueryExecModeExec, 0}},
}

// roleStart starts poolerd with one server connection in mode, with a
// short checkout_timeout: a client that waits for a connection another
// client is pinned to is refused quickly.
func roleStart(t *testing.T, mode string, mutate func(c *config.Config)) *obInst {
	t.Helper()
	return tsStart(t, 1, func(c *config.Config) {
		c.PoolMode = mode
		c.CheckoutTimeout = time.Second
		if mutate != nil {
			mutate(c)
		}
	})
}

// roleRun runs form f on c; it must succeed.
func roleRun(t *testing.T, fx *roleFixture, c *pgx.Conn, f roleForm) {
	t.Helper()
	ctx := ctxTimeout(t, 15*time.Second)
	var err error
	if f.args != nil {
		args := make([]any, len(f.args))
		for i, a := range f.args {
			if s, ok := a.(string); ok {
				a = fx.sql(s)
			}
			args[i] = a
		}
		_, err = c.Exec(ctx, fx.sql(f.sql), args...)
	} else {
		_, err = c.Exec(ctx, fx.sql(f.sql), pgx.QueryExecModeSimpleProtocol)
	}
	if err != nil {
		t.Fatalf("%s: %v", f.name, err)
	}
}

// roleWho asks c who it is and how many rows of the fixture's table it
// sees: "current_user|session_user|rows". refused is set when poolerd
// refused the request for want of a server connection (53300).
func roleWho(t *testing.T, fx *roleFixture, c *pgx.Conn) (who string, refused bool) {
	t.Helper()
	q := fx.sql("SELECT current_user || '|' || session_user || '|' || (SELECT count(*) FROM {r}_t)")
	err := c.QueryRow(ctxTimeout(t, 15*time.Second), q, pgx.QueryExecModeSimpleProtocol).Scan(&who)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "53300" {
		return "", true
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return who, false
}

// roleCheckOthers runs the test's scenario for form f: A (connected with
// dsnA) runs it; B asks while A stays; A leaves; C asks. B and C must be
// login|login|0 (or B refused, 53300).
func roleCheckOthers(t *testing.T, fx *roleFixture, p *obInst, dsn string, login string, f roleForm) {
	t.Helper()
	want := login + "|" + login + "|0"
	a := connectDSN(t, dsn)
	roleRun(t, fx, a, f)
	if f.keeps {
		if who, _ := roleWho(t, fx, a); who != fx.role+"|"+login+"|1" {
			t.Errorf("A, after %s, is %q in its next transaction, want %s|%s|1", f.name, who, fx.role, login)
		}
	}
	b := connectDSN(t, dsn)
	if who, refused := roleWho(t, fx, b); !refused && who != want {
		t.Errorf("B, while A (after %s) is connected: %q, want %q (or 53300)", f.name, who, want)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := connectDSN(t, dsn)
	// A's server connection is reset when A leaves; C may have to wait a
	// moment for it (B's refused request, if any, is long over).
	if who, refused := roleWho(t, fx, c); refused || who != want {
		t.Errorf("C, after A (after %s) left: %q (refused %v), want %q", f.name, who, refused, want)
	}
	if who, refused := roleWho(t, fx, b); refused || who != want {
		t.Errorf("B, after A (after %s) left: %q (refused %v), want %q", f.name, who, refused, want)
	}
}

// TestRoleNotInherited: for each form and pool mode, no other client of
// the pool runs as A's role or sees its rows.
func TestRoleNotInherited(t *testing.T) {
	fx := roleSetup(t)
	for _, mode := range []string{config.PoolTransaction, config.PoolStatement} {
		for _, f := range roleForms {
			t.Run(mode+"/"+f.name, func(t *testing.T) {
				p := roleStart(t, mode, nil)
				roleCheckOthers(t, fx, p, p.appDSN(), pgtest.RoleApp, f)
			})
		}
	}
}

// TestRoleSessionAuthorization: the forms that need a superuser login
// (SET SESSION AUTHORIZATION, and a superuser's SET ROLE, which PostgreSQL
// reports as is_superuser off), through a pool whose login is the
// harness's superuser.
func TestRoleSessionAuthorization(t *testing.T) {
	fx := roleSetup(t)
	u, err := url.Parse(pg.SuperDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok || u.User.Username() != pgtest.SuperUser {
		t.Skipf("the harness's superuser DSN has no password: %s", u.Redacted())
	}
	forms := []roleForm{
		{name: "set_session_authorization", sql: "SET SESSION AUTHORIZATION {r}", keeps: true},
		{name: "set_session_session_authorization", sql: "SET SESSION SESSION AUTHORIZATION {r}", keeps: true},
		{name: "set_quoted_session_authorization", sql: `SET "session_authorization" TO {r}`, keeps: true},
		{name: "set_session_authorization_equals", sql: `set SESSION_AUTHORIZATION = '{r}'`, keeps: true},
		{name: "set_config_session_authorization", sql: "SELECT set_config('session_authorization', '{r}', false)", keeps: true},
		{name: "do_session_authorization", sql: "DO $$ begin execute 'set session authorization {r}'; end $$", keeps: true},
		{name: "select_function_session_authorization", sql: "SELECT {fsa}()", keeps: true},
		{name: "superuser_set_role_in_function", sql: "SELECT {fx}()", keeps: true},
		{name: "superuser_set_role", sql: "SET ROLE {r}", keeps: true},
	}
	for _, mode := range []string{config.PoolTransaction, config.PoolStatement} {
		for _, f := range forms {
			t.Run(mode+"/"+f.name, func(t *testing.T) {
				p := roleStart(t, mode, func(c *config.Config) {
					c.Upstream = pg.SuperDSN(pgtest.DBApp)
					c.AdminUsers = []string{pgtest.SuperUser}
				})
				dsn := p.dsn(pgtest.SuperUser, pw, pgtest.DBApp)
				roleCheckSuper(t, fx, dsn, f)
			})
		}
	}
}

// roleCheckSuper is roleCheckOthers for a superuser login, which sees every
// row whatever the policy says: only who the clients are is compared.
func roleCheckSuper(t *testing.T, fx *roleFixture, dsn string, f roleForm) {
	t.Helper()
	login := pgtest.SuperUser
	who := func(c *pgx.Conn) (string, bool) {
		var s string
		err := c.QueryRow(ctxTimeout(t, 15*time.Second), "SELECT current_user || '|' || session_user", pgx.QueryExecModeSimpleProtocol).Scan(&s)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "53300" {
			return "", true
		}
		if err != nil {
			t.Fatalf("who: %v", err)
		}
		return s, false
	}
	want := login + "|" + login
	a := connectDSN(t, dsn)
	roleRun(t, fx, a, f)
	if f.keeps {
		got, _ := who(a)
		if !strings.HasPrefix(got, fx.role+"|") {
			t.Errorf("A, after %s, is %q in its next transaction, want %s|...", f.name, got, fx.role)
		}
	}
	b := connectDSN(t, dsn)
	if got, refused := who(b); !refused && got != want {
		t.Errorf("B, while A (after %s) is connected: %q, want %q (or 53300)", f.name, got, want)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := connectDSN(t, dsn)
	if got, refused := who(c); refused || got != want {
		t.Errorf("C, after A (after %s) left: %q (refused %v), want %q", f.name, got, refused, want)
	}
}

// TestRoleTenants: two tenants share a pool of one server connection; each
// switches to its own role with a different form in turn, and the other
// (which switched nothing in that transaction) never sees its rows.
func TestRoleTenants(t *testing.T) {
	fx := roleSetup(t)
	p := roleStart(t, config.PoolTransaction, nil)
	for _, f := range roleForms {
		if f.keeps {
			continue // pinned: the other tenant would wait, tested above
		}
		a := connectDSN(t, p.appDSN())
		b := connectDSN(t, p.appDSN())
		for round := range 3 {
			roleRun(t, fx, a, f)
			who, refused := roleWho(t, fx, b)
			if refused || who != "app|app|0" {
				t.Fatalf("%s, round %d: tenant B is %q (refused %v), want app|app|0", f.name, round, who, refused)
			}
		}
		_ = a.Close(context.Background())
		_ = b.Close(context.Background())
	}
}

// TestRoleFunctionCallMessage: a function that sets the role, called with
// the protocol's FunctionCall message (by OID, no SQL text), does not reach
// the next client either.
func TestRoleFunctionCallMessage(t *testing.T) {
	fx := roleSetup(t)
	var oid uint32
	d := relayDirect(t)
	if err := d.QueryRow(ctxTimeout(t, 10*time.Second), fx.sql("SELECT '{fx}'::regproc::oid")).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{config.PoolTransaction, config.PoolStatement} {
		t.Run(mode, func(t *testing.T) {
			p := roleStart(t, mode, nil)
			a := dialFE(t, p.addr)
			a.login(pgtest.RoleApp, pgtest.Password)
			a.send(&pgproto3.FunctionCall{Function: oid, ResultFormatCode: 0})
			for done := false; !done; {
				switch m := a.recv().(type) {
				case *pgproto3.FunctionCallResponse:
				case *pgproto3.ReadyForQuery:
					done = true
				case *pgproto3.ErrorResponse:
					t.Fatalf("FunctionCall: %s (SQLSTATE %s)", m.Message, m.Code)
				default:
					t.Fatalf("unexpected %T after FunctionCall", m)
				}
			}
			if got := a.mustQuery("SELECT current_user::text"); len(got) != 1 || got[0] != fx.role {
				t.Fatalf("A after its FunctionCall: %q, want %s", got, fx.role)
			}
			b := connectDSN(t, p.appDSN())
			if who, refused := roleWho(t, fx, b); refused || who != "app|app|0" {
				t.Errorf("B after A's FunctionCall: %q (refused %v), want app|app|0", who, refused)
			}
		})
	}
}
