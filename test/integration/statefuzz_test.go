package integration

// The differential state fuzzer of issue #31, part 4.
//
// A program is three or four clients, each with a random sequence of steps
// drawn from a grammar of what changes a session (SET/RESET/set_config in
// their spellings, roles, PREPARE/EXECUTE/DEALLOCATE, DISCARD,
// LISTEN/UNLISTEN, advisory locks, temporary tables/views/sequences,
// cursors WITH HOLD, DO blocks, functions that set the role, transaction
// blocks with savepoints and errors) and OBSERVE steps that read the
// client's view of its session. Steps go over the simple protocol (one
// statement or several in one Query), the extended protocol with an unnamed
// or a named statement, or pipelined (several statements before one Sync,
// or a Sync after each).
//
// Every client's program first runs alone on a direct connection of its own
// to PostgreSQL: that gives the reference answer of every step. Then all
// clients run their programs concurrently through poolerd in transaction
// mode with a pool of one or two server connections, interleaved in a
// seeded order, so that server connections change hands between clients
// all the time. Every step's answer (command tags, rows, SQLSTATE; for
// OBSERVE the session's state) must be what the client got directly. The
// first difference is a finding: the test prints the seed, the client, the
// step, both answers, and the program shrunk to the steps that still show
// a difference.
//
// Budgets: by default (`make test`) a fixed set of seeds and then random
// ones for STATEFUZZ_DURATION (default 20s); `make fuzz-state` runs
// STATEFUZZ_PROGRAMS programs. STATEFUZZ_SEED=n STATEFUZZ_PROGRAMS=1 runs
// one program again. STATEFUZZ_HOLES=1 also generates the productions of
// sfKnownHoles.
//
// The hand-off check (verify_handoff) runs always; a dirty connection it
// finds is a finding like a differing answer. Answers compare SQLSTATEs
// only; STATEFUZZ_ERRORS=1 prints every error's message too (whose
// statement a 42P05 or 26000 is about: the client's name or poolerd's).
//
// Helpers are prefixed sf.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/console"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/test/pgtest"
)

// sfKnownHoles are the productions that generate the holes of issue #31
// that are not fixed yet: the fuzzer skips them (unless STATEFUZZ_HOLES=1)
// so that `make test` passes on today's code. Delete an entry when its fix
// lands; the fuzzer then checks it in every run. (Issue #31's holes are cited by what they are: the numbering was
// not at hand.)
var sfKnownHoles = map[string]string{
	// Issue #31's holes 1, 4, 5 (set_role_prepared_rerun,
	// discard_all_then_listen, temp_select_into_long, temp_create_pg_temp,
	// cursor_hold_odd) are fixed and generated again. What is left of
	// hole 6 and the fuzzer's own findings of that family is no longer a
	// leak (the next client gets RESET ROLE; RESET ALL) but the documented
	// loss of the client's own value on its next connection:
	"custom_option_odd":        "a customized option set under a name poolerd cannot read (E'' with a backslash): no other client sees it, but its own client keeps it only while it keeps that server connection (docs/transaction-mode.md)",
	"set_config_computed_name": "a customized option set under a computed name: no other client sees it, but its own client keeps it only while it keeps that server connection (docs/transaction-mode.md)",
	"do_set_custom":            "a DO block that sets a customized option: no other client sees it, but its own client keeps it only while it keeps that server connection (docs/transaction-mode.md)",
	"set_config_fn":            "a function that sets a customized option (SELECT f()): no other client sees it, but its own client keeps it only while it keeps that server connection (docs/transaction-mode.md)",
}

// sfDocumented are productions whose difference from a direct connection
// docs/transaction-mode.md documents; the fuzzer never generates them.
var sfDocumented = map[string]string{
	"do_listen":            "session state created inside a DO block is not detected (Differences that remain)",
	"fn_set_role_no_block": "a role set inside a called function is not kept from one transaction to the next (Roles)",
}

// sfFixture is the database, roles and objects the programs use: a fresh
// database per run, so that public.t1 and the schema sfx are ours alone.
type sfFixture struct {
	db     string // the database clients reach through poolerd
	refDB  string // the same objects, for the direct reference runs (advisory locks are per database)
	r1, r2 string // NOLOGIN roles granted to app
	direct sfDirectConns
}

func sfSetup(t *testing.T) *sfFixture {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	p := "sf_" + hex.EncodeToString(b[:])
	f := &sfFixture{db: p, refDB: p + "_ref", r1: p + "_r1", r2: p + "_r2"}
	ctx := ctxTimeout(t, 60*time.Second)
	for _, q := range []string{
		"CREATE ROLE " + f.r1 + " NOLOGIN",
		"CREATE ROLE " + f.r2 + " NOLOGIN",
		"GRANT " + f.r1 + ", " + f.r2 + " TO " + pgtest.RoleApp,
		"CREATE DATABASE " + f.db,
		"GRANT CONNECT, TEMP ON DATABASE " + f.db + " TO PUBLIC",
		"CREATE DATABASE " + f.refDB,
		"GRANT CONNECT, TEMP ON DATABASE " + f.refDB + " TO PUBLIC",
	} {
		if err := pg.Exec(ctx, "postgres", q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		f.direct.closeAll()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range []string{"DROP DATABASE IF EXISTS " + f.db + " WITH (FORCE)",
			"DROP DATABASE IF EXISTS " + f.refDB + " WITH (FORCE)",
			"DROP ROLE IF EXISTS " + f.r1, "DROP ROLE IF EXISTS " + f.r2} {
			if err := pg.Exec(ctx, "postgres", q); err != nil {
				t.Logf("statefuzz cleanup: %v", err)
			}
		}
	})
	// Owned by the superuser: app cannot drop or change them, so a DROP
	// TABLE t1 that finds no temporary t1 fails the same way everywhere.
	setup := strings.NewReplacer("{r1}", f.r1).Replace(`
CREATE TABLE public.t1 (v text); INSERT INTO public.t1 VALUES ('public');
CREATE VIEW public.v1 AS SELECT 'public'::text AS v;
CREATE SCHEMA sfx; GRANT USAGE ON SCHEMA sfx TO PUBLIC;
CREATE TABLE sfx.t1 (v text); INSERT INTO sfx.t1 VALUES ('sfx');
CREATE VIEW sfx.v1 AS SELECT 'sfx'::text AS v;
GRANT SELECT ON public.t1, public.v1, sfx.t1, sfx.v1 TO PUBLIC;
-- sf_peek reads t1 and v1 as the session resolves them (a temporary one
-- first), whatever the current role may read.
CREATE FUNCTION public.sf_peek() RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $f$
DECLARE a text; b text;
BEGIN
  SELECT string_agg(v, ',' ORDER BY v) INTO a FROM t1;
  SELECT string_agg(v, ',' ORDER BY v) INTO b FROM v1;
  RETURN 't1=' || coalesce(a, '') || ' v1=' || coalesce(b, '');
END $f$;
GRANT EXECUTE ON FUNCTION public.sf_peek() TO PUBLIC;
CREATE FUNCTION public.sf_set_role() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN PERFORM set_config('role', '{r1}', false); RETURN 1; END $f$;
CREATE PROCEDURE public.sf_set_role_proc() LANGUAGE plpgsql AS $f$
BEGIN EXECUTE 'SET ROLE {r1}'; END $f$;
CREATE FUNCTION public.sf_set_tenant(v text) RETURNS text LANGUAGE sql AS $f$
SELECT set_config('myapp.tenant', v, false) $f$;`)
	for _, db := range []string{f.db, f.refDB} {
		if err := pg.Exec(ctx, db, setup); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// sfObserveSQL reads the client's view of its session in one row. A custom
// option that is not defined reads as ”: poolerd documents that an option
// another client set stays defined as ” on a server connection.
const sfObserveSQL = `SELECT concat_ws(' | ',
 'user=' || current_user, 'session_user=' || session_user,
 'search_path=' || current_setting('search_path'),
 'statement_timeout=' || current_setting('statement_timeout'),
 'work_mem=' || current_setting('work_mem'),
 'application_name=' || current_setting('application_name'),
 'DateStyle=' || current_setting('DateStyle'),
 'TimeZone=' || current_setting('TimeZone'),
 'IntervalStyle=' || current_setting('IntervalStyle'),
 'myapp.tenant=' || coalesce(current_setting('myapp.tenant', true), ''),
 'myapp.other=' || coalesce(current_setting('myapp.other', true), ''),
 'listen=' || coalesce((SELECT string_agg(c, ',' ORDER BY c) FROM pg_listening_channels() c), ''),
 public.sf_peek(),
 'temp=' || coalesce((SELECT string_agg(relname || ':' || relkind, ',' ORDER BY relname) FROM pg_class WHERE relnamespace = pg_my_temp_schema()), ''),
 'prepared=' || coalesce((SELECT string_agg(name || ':' || statement, ',' ORDER BY name) FROM pg_prepared_statements WHERE from_sql), ''),
 'locks=' || coalesce((SELECT string_agg(classid || '/' || objid || '/' || objsubid || '/' || mode, ',' ORDER BY classid, objid, objsubid, mode) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted), ''),
 'cursors=' || coalesce((SELECT string_agg(name || ':' || is_holdable || ':' || is_binary || ':' || is_scrollable, ',' ORDER BY name) FROM pg_cursors WHERE name LIKE 'cur%'), ''))`

// sfReported are the ParameterStatus values an OBSERVE compares: what the
// client was told of its own session.
var sfReported = []string{"application_name", "DateStyle", "TimeZone", "IntervalStyle",
	"session_authorization", "is_superuser", "standard_conforming_strings", "client_encoding",
	"default_transaction_read_only"}

// sfMode is how a step is sent.
type sfMode int

const (
	sfSimple    sfMode = iota // one Query (several statements joined with ";")
	sfUnnamed                 // extended protocol, unnamed statement, one Sync
	sfNamed                   // extended protocol, a named statement per text, one Sync
	sfPipeline                // extended, unnamed and named mixed, one Sync at the end
	sfPipeSyncs               // extended, unnamed and named mixed, a Sync after each
	sfModes
)

func (m sfMode) String() string {
	return [...]string{"simple", "unnamed", "named", "pipeline", "pipeline-syncs"}[m]
}

// sfObserve is the statement text of an OBSERVE step.
const sfObserve = "OBSERVE"

// sfStep is one step of a client's program.
type sfStep struct {
	Prod string // the production that made it
	Mode sfMode
	SQL  []string // one statement, or several for a multi-statement Query or a pipeline
}

func (s sfStep) String() string {
	if s.Prod == sfObserve {
		return "OBSERVE"
	}
	return fmt.Sprintf("[%s %s] %s", s.Prod, s.Mode, strings.Join(s.SQL, "; "))
}

// sfProgram is what one fuzz case runs.
type sfProgram struct {
	Seed     int64
	PoolSize int
	Holes    bool // generated with sfKnownHoles (STATEFUZZ_HOLES=1)
	Clients  [][]sfStep
}

func (p *sfProgram) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, pool of %d\n", p.Seed, p.PoolSize)
	for i, c := range p.Clients {
		for j, s := range c {
			fmt.Fprintf(&b, "  client %d step %d: %s\n", i, j, s)
		}
	}
	return b.String()
}

// sfGen generates one client's program.
type sfGen struct {
	r      *mrand.Rand
	f      *sfFixture
	client int
	prods  []sfProduction // the productions it may use
}

func (g *sfGen) pick(s ...string) string { return s[g.r.Intn(len(s))] }

// sfOption is a setting the grammar changes and OBSERVE reads.
type sfOption struct {
	name   string
	values []string
}

var sfOptions = []sfOption{
	{"statement_timeout", []string{"0", "'5s'", "123456"}},
	{"work_mem", []string{"'4MB'", "'65kB'", "1234"}},
	{"search_path", []string{"public", "sfx, public", `"$user", public`}},
	{"application_name", []string{"'app_a'", "'app_b'"}},
	{"DateStyle", []string{"'ISO, DMY'", "'SQL, MDY'", "'German'"}},
	{"TimeZone", []string{"'UTC'", "'Europe/Paris'", "'America/New_York'"}},
	{"IntervalStyle", []string{"postgres", "iso_8601", "sql_standard"}},
	{"myapp.tenant", []string{"'tenant_a'", "'tenant_b'"}},
	{"myapp.other", []string{"'x1'", "'x2'"}},
}

// sfProduction makes the statements of one or more steps; each inner slice
// is one step ("OBSERVE" alone is an observation); a step of several
// statements goes in one request (a multi-statement Query or a pipeline).
type sfProduction struct {
	name string
	gen  func(g *sfGen) [][]string
}

func one(s ...string) [][]string { return [][]string{s} }

func (g *sfGen) option() sfOption { return sfOptions[g.r.Intn(len(sfOptions))] }

func (g *sfGen) value(o sfOption) string { return o.values[g.r.Intn(len(o.values))] }

// literal turns a SET value into a string constant for set_config.
func literal(v string) string {
	if strings.HasPrefix(v, "'") {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

func (g *sfGen) role() string { return g.pick(g.f.r1, g.f.r2) }

// key is an advisory lock key of this client's own: clients never wait
// for each other's locks (directly they never would).
func (g *sfGen) key() string { return strconv.Itoa(7310000 + 10*g.client + g.r.Intn(2)) }

func (g *sfGen) tag() string { return fmt.Sprintf("'c%d_%d'", g.client, g.r.Intn(100)) }

var sfProductions = []sfProduction{
	{"set", func(g *sfGen) [][]string {
		o := g.option()
		return one(fmt.Sprintf(g.pick("SET %s = %s", "SET %s TO %s", "SET SESSION %s = %s", "set %s to %s"), o.name, g.value(o)))
	}},
	{"set_local", func(g *sfGen) [][]string {
		o := g.option()
		return one(fmt.Sprintf("SET LOCAL %s = %s", o.name, g.value(o)))
	}},
	{"reset", func(g *sfGen) [][]string {
		o := g.option()
		if o.name == "application_name" || o.name == "DateStyle" || o.name == "TimeZone" {
			o = sfOptions[0]
		}
		return one("RESET " + o.name)
	}},
	{"reset_all", func(g *sfGen) [][]string { return one(g.pick("RESET ALL", "SET ALL TO DEFAULT")) }},
	{"set_default", func(g *sfGen) [][]string {
		return one("SET " + g.pick("work_mem", "statement_timeout", "myapp.tenant") + " TO DEFAULT")
	}},
	{"set_config", func(g *sfGen) [][]string {
		o := g.option()
		return one(fmt.Sprintf("SELECT set_config('%s', %s, %s)", o.name, literal(g.value(o)), g.pick("false", "true", "false")))
	}},
	{"set_config_fn", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("SELECT public.sf_set_tenant(%s)", g.tag()))
	}},
	{"set_config_computed_name", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("SELECT set_config('myapp.' || %s, %s, false)", g.pick("'tenant'", "'other'"), g.tag()))
	}},
	{"custom_option_odd", func(g *sfGen) [][]string {
		return one(fmt.Sprintf(g.pick(`SET "myapp"."tenant" = %s`, `SET myapp . tenant = %s`, `SET MyApp.Tenant TO %s`,
			`SET "myapp.tenant" = %s`, `SET /* c */ myapp.other = %s`), g.tag()))
	}},
	{"set_role", func(g *sfGen) [][]string {
		return one(fmt.Sprintf(g.pick("SET ROLE %s", "SET SESSION ROLE %s", `SET "role" TO %s`, "set role = %s",
			"SELECT set_config('role', '%s', false)"), g.role()))
	}},
	{"set_role_local", func(g *sfGen) [][]string {
		return one(fmt.Sprintf(g.pick("SET LOCAL ROLE %s", "SELECT set_config('role', '%s', true)"), g.role()))
	}},
	{"reset_role", func(g *sfGen) [][]string {
		return one(g.pick("RESET ROLE", "SET ROLE NONE", "RESET SESSION AUTHORIZATION", "SET SESSION AUTHORIZATION DEFAULT"))
	}},
	{"session_authorization", func(g *sfGen) [][]string {
		return one("SET SESSION AUTHORIZATION " + g.pick(g.f.r1, pgtest.RoleApp))
	}},
	{"set_role_prepared_rerun", func(g *sfGen) [][]string {
		// A named statement that sets the role, run, undone, run again.
		q := fmt.Sprintf("SELECT set_config('role', '%s', false)", g.f.r1)
		return [][]string{{q}, {"RESET ROLE"}, {sfObserve}, {q}}
	}},
	{"do_set_custom", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("DO $$ begin perform set_config('myapp.tenant', %s, false); end $$", g.tag()))
	}},
	{"do_set", func(g *sfGen) [][]string {
		return one(g.pick(
			fmt.Sprintf("DO $$ begin execute 'set role %s'; end $$", g.role()),
			"DO $$ begin perform 1; end $$",
			"DO $$ begin execute 'reset role'; end $$"))
	}},
	{"do_listen", func(g *sfGen) [][]string { return one("DO $$ begin execute 'listen ch1'; end $$") }},
	{"fn_set_role_no_block", func(g *sfGen) [][]string { return one("SELECT public.sf_set_role()") }},
	{"call_set_role", func(g *sfGen) [][]string { return one("CALL public.sf_set_role_proc()") }},
	{"fn_set_role_block", func(g *sfGen) [][]string {
		return [][]string{{"BEGIN"}, {"SELECT public.sf_set_role()"}, {sfObserve}, {"ROLLBACK"}}
	}},
	{"prepare", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("PREPARE p%d AS SELECT %s", 1+g.r.Intn(2), g.pick("1", "current_user::text",
			"coalesce(current_setting('myapp.tenant', true), '')", "public.sf_peek()", "$1::int + 1")))
	}},
	{"execute", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("EXECUTE p%d%s", 1+g.r.Intn(2), g.pick("", "(41)")))
	}},
	{"deallocate", func(g *sfGen) [][]string {
		return one(g.pick("DEALLOCATE p1", "DEALLOCATE PREPARE p2", "DEALLOCATE ALL"))
	}},
	{"discard", func(g *sfGen) [][]string {
		return one(g.pick("DISCARD ALL", "DISCARD TEMP", "DISCARD PLANS", "DISCARD SEQUENCES"))
	}},
	{"discard_all_then_listen", func(g *sfGen) [][]string {
		return one("DISCARD ALL", "LISTEN ch"+strconv.Itoa(1+g.r.Intn(2)))
	}},
	{"listen", func(g *sfGen) [][]string { return one("LISTEN ch" + strconv.Itoa(1+g.r.Intn(2))) }},
	{"unlisten", func(g *sfGen) [][]string { return one(g.pick("UNLISTEN ch1", "UNLISTEN ch2", "UNLISTEN *")) }},
	{"advisory_lock", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("SELECT %s(%s)", g.pick("pg_advisory_lock", "pg_advisory_lock_shared",
			"pg_try_advisory_lock", "pg_try_advisory_lock_shared", "pg_advisory_xact_lock"), g.key()))
	}},
	{"advisory_unlock", func(g *sfGen) [][]string {
		return one(g.pick(fmt.Sprintf("SELECT pg_advisory_unlock(%s)", g.key()),
			fmt.Sprintf("SELECT pg_advisory_unlock_shared(%s)", g.key()), "SELECT pg_advisory_unlock_all()"))
	}},
	{"temp_create", func(g *sfGen) [][]string {
		return one(g.pick(
			fmt.Sprintf("CREATE TEMP TABLE t1 AS SELECT %s::text AS v", g.tag()),
			fmt.Sprintf("CREATE TEMPORARY VIEW v1 AS SELECT %s::text AS v", g.tag()),
			"CREATE TEMP SEQUENCE s1",
			"CREATE TEMP TABLE t2 (v text) ON COMMIT DROP",
			fmt.Sprintf("SELECT %s::text AS v INTO TEMP t1", g.tag())))
	}},
	{"temp_select_into_long", func(g *sfGen) [][]string {
		var cols []string
		for i := 0; i < 40; i++ {
			cols = append(cols, fmt.Sprintf("%d AS c%d", i, i))
		}
		return one(fmt.Sprintf("SELECT %s::text AS v, %s INTO TEMP t1", g.tag(), strings.Join(cols, ", ")))
	}},
	{"temp_create_pg_temp", func(g *sfGen) [][]string {
		return one(fmt.Sprintf("CREATE TABLE pg_temp.t1 AS SELECT %s::text AS v", g.tag()))
	}},
	{"temp_drop", func(g *sfGen) [][]string {
		return one(g.pick("DROP TABLE t1", "DROP TABLE IF EXISTS t1", "DROP VIEW v1", "DROP SEQUENCE s1", "DROP TABLE IF EXISTS pg_temp.t1"))
	}},
	{"temp_use", func(g *sfGen) [][]string {
		return one(g.pick(fmt.Sprintf("INSERT INTO t1 VALUES (%s)", g.tag()), "SELECT nextval('s1')", "SELECT v FROM t1 ORDER BY v"))
	}},
	{"cursor_hold", func(g *sfGen) [][]string {
		return one(fmt.Sprintf(g.pick("DECLARE cur%d CURSOR WITH HOLD FOR SELECT generate_series(1, 5)",
			"DECLARE cur%d NO SCROLL CURSOR WITH HOLD FOR SELECT generate_series(1, 5)",
			"DECLARE cur%d CURSOR FOR SELECT generate_series(1, 5)"), 1+g.r.Intn(2)))
	}},
	{"cursor_hold_odd", func(g *sfGen) [][]string {
		return one(fmt.Sprintf(g.pick("DECLARE cur%d BINARY INSENSITIVE NO SCROLL CURSOR WITH HOLD FOR SELECT generate_series(1, 5)",
			"DECLARE cur%d INSENSITIVE CURSOR WITH HOLD FOR SELECT generate_series(1, 5)",
			"DECLARE cur%d SCROLL CURSOR WITH HOLD FOR SELECT generate_series(1, 5)"), 1+g.r.Intn(2)))
	}},
	{"cursor_use", func(g *sfGen) [][]string {
		n := 1 + g.r.Intn(2)
		return one(g.pick(fmt.Sprintf("FETCH 1 FROM cur%d", n), fmt.Sprintf("FETCH ALL FROM cur%d", n),
			fmt.Sprintf("MOVE 2 IN cur%d", n), fmt.Sprintf("CLOSE cur%d", n), "CLOSE ALL"))
	}},
	{"block", func(g *sfGen) [][]string {
		return one(g.pick("BEGIN", "START TRANSACTION", "BEGIN ISOLATION LEVEL REPEATABLE READ", "COMMIT", "ROLLBACK", "END"))
	}},
	{"savepoint", func(g *sfGen) [][]string {
		return one(g.pick("SAVEPOINT sp1", "ROLLBACK TO SAVEPOINT sp1", "RELEASE SAVEPOINT sp1"))
	}},
	{"error", func(g *sfGen) [][]string {
		return one(g.pick("SELECT 1/0", "SELECT * FROM no_such_table", "SELEC 1"))
	}},
	{"block_with_error", func(g *sfGen) [][]string {
		var p sfProduction
		for p.name == "" || strings.HasPrefix(p.name, "block") {
			p = g.prods[g.r.Intn(len(g.prods))]
		}
		steps := [][]string{{"BEGIN"}}
		steps = append(steps, p.gen(g)...)
		if g.r.Intn(2) == 0 {
			steps = append(steps, []string{"SAVEPOINT sp1"}, []string{"SELECT 1/0"}, []string{"ROLLBACK TO SAVEPOINT sp1"})
		} else {
			steps = append(steps, []string{"SELECT 1/0"})
		}
		steps = append(steps, []string{sfObserve}, []string{g.pick("COMMIT", "ROLLBACK")})
		return steps
	}},
	{"plain", func(g *sfGen) [][]string {
		return one(g.pick("SELECT 1", "SELECT current_user", "SELECT coalesce(current_setting('myapp.tenant', true), '')", "SELECT public.sf_peek()"))
	}},
}

// sfGenerate makes the program of seed.
func sfGenerate(seed int64, f *sfFixture, holes bool) *sfProgram {
	r := mrand.New(mrand.NewSource(seed))
	p := &sfProgram{Seed: seed, PoolSize: 1 + r.Intn(2), Holes: holes}
	n := 3 + r.Intn(2)
	var prods []sfProduction
	for _, pr := range sfProductions {
		if sfDocumented[pr.name] != "" || (!holes && sfKnownHoles[pr.name] != "") {
			continue
		}
		prods = append(prods, pr)
	}
	for c := 0; c < n; c++ {
		g := &sfGen{r: r, f: f, client: c, prods: prods}
		var steps []sfStep
		for len(steps) < 4+r.Intn(12) {
			if r.Intn(4) == 0 {
				steps = append(steps, sfStep{Prod: sfObserve})
				continue
			}
			pr := prods[r.Intn(len(prods))]
			out := pr.gen(g)
			// Now and then two steps go in one request: a multi-statement
			// Query or a pipeline.
			if len(out) == 1 && len(out[0]) == 1 && r.Intn(5) == 0 {
				pr2 := prods[r.Intn(len(prods))]
				if o2 := pr2.gen(g); len(o2) == 1 {
					both := append(append([]string{}, out[0]...), o2[0]...)
					if holes || !sfDropsAll(both) || sfKnownHoles["drop_all_hidden"] == "" {
						out = [][]string{both}
					}
				}
			}
			for _, sqls := range out {
				if len(sqls) == 1 && sqls[0] == sfObserve {
					steps = append(steps, sfStep{Prod: sfObserve})
					continue
				}
				var m sfMode
				if len(sqls) > 1 {
					m = [...]sfMode{sfSimple, sfPipeline, sfPipeSyncs}[r.Intn(3)]
				} else {
					m = sfMode(r.Intn(int(sfModes)))
				}
				name := pr.name
				if sfDropsAll(sqls) && (m != sfSimple || len(sqls) > 1) && sfKnownHoles[name] == "" {
					// DEALLOCATE ALL or DISCARD ALL over the extended
					// protocol or beside another statement: a production
					// of its own.
					name = "drop_all_hidden"
				}
				if !holes && name != pr.name && sfKnownHoles[name] != "" {
					// drop_all_hidden is a hole: the statement goes
					// as a simple Query of its own instead.
					m, name = sfSimple, pr.name
				}
				steps = append(steps, sfStep{Prod: name, Mode: m, SQL: sqls})
			}
		}
		steps = append(steps, sfStep{Prod: sfObserve})
		p.Clients = append(p.Clients, steps)
	}
	return p
}

// sfDropsAll says whether one of the statements drops every prepared
// statement of the session.
func sfDropsAll(sqls []string) bool {
	for _, q := range sqls {
		if q == "DEALLOCATE ALL" || q == "DISCARD ALL" {
			return true
		}
	}
	return false
}

// sfClient is one client's connection and what it has prepared.
type sfClient struct {
	pc    *pgconn.PgConn
	named map[string]bool // statement names this client prepared (protocol level)
	dead  bool
}

// sfStmtName is the protocol-level name of a statement text.
func sfStmtName(sql string) string {
	h := uint32(2166136261)
	for i := 0; i < len(sql); i++ {
		h = (h ^ uint32(sql[i])) * 16777619
	}
	return fmt.Sprintf("fz_%08x", h)
}

// sfErr renders an error: a SQLSTATE for a server's error, the connection's
// death otherwise (and the client stops).
func (c *sfClient) sfErr(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if os.Getenv("STATEFUZZ_ERRORS") != "" {
			// The answers compare codes only; the message says which
			// statement (poolerd's name or the client's) a code is about.
			fmt.Fprintf(os.Stderr, "statefuzz error %s: %s\n", pgErr.Code, pgErr.Message)
		}
		return "ERROR " + pgErr.Code
	}
	c.dead = true
	return "CONNECTION LOST"
}

func sfRows(rows [][][]byte) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(" (")
		for i, v := range r {
			if i > 0 {
				b.WriteString(",")
			}
			if v == nil {
				b.WriteString("NULL")
			} else {
				b.WriteString(strconv.Quote(string(v)))
			}
		}
		b.WriteString(")")
	}
	return b.String()
}

// paramsOf gives the statement parameters for a text that has $1.
func paramsOf(sql string) [][]byte {
	if strings.Contains(sql, "$1") && !strings.HasPrefix(sql, "PREPARE") {
		return [][]byte{[]byte("41")}
	}
	return nil
}

// run sends one step and renders the client's answer.
func (c *sfClient) run(ctx context.Context, st sfStep) string {
	if c.dead {
		return "CONNECTION LOST"
	}
	if st.Prod == sfObserve {
		return c.observe(ctx)
	}
	switch st.Mode {
	case sfSimple:
		var b strings.Builder
		results, err := c.pc.Exec(ctx, strings.Join(st.SQL, "; ")).ReadAll()
		for _, r := range results {
			b.WriteString(r.CommandTag.String() + sfRows(r.Rows) + ";")
		}
		if err != nil {
			b.WriteString(c.sfErr(err))
		}
		return b.String()
	case sfUnnamed:
		r := c.pc.ExecParams(ctx, st.SQL[0], paramsOf(st.SQL[0]), nil, nil, nil).Read()
		if r.Err != nil {
			return c.sfErr(r.Err)
		}
		return r.CommandTag.String() + sfRows(r.Rows)
	case sfNamed:
		name := sfStmtName(st.SQL[0])
		var b strings.Builder
		if !c.named[name] {
			if _, err := c.pc.Prepare(ctx, name, st.SQL[0], nil); err != nil {
				return "prepare " + c.sfErr(err)
			}
			c.named[name] = true
		}
		r := c.pc.ExecPrepared(ctx, name, paramsOf(st.SQL[0]), nil, nil).Read()
		if r.Err != nil {
			var pgErr *pgconn.PgError
			if errors.As(r.Err, &pgErr) && pgErr.Code == "26000" {
				delete(c.named, name) // DISCARD ALL or DEALLOCATE ALL took it: prepare it again next time
			}
			b.WriteString(c.sfErr(r.Err))
			return b.String()
		}
		return r.CommandTag.String() + sfRows(r.Rows)
	default:
		return c.pipeline(ctx, st)
	}
}

// pipeline sends a step's statements in one pipeline: every other one
// named (Parse+Describe, then Bind+Execute), the rest unnamed.
func (c *sfClient) pipeline(ctx context.Context, st sfStep) string {
	p := c.pc.StartPipeline(ctx)
	// exp is what the pipeline asked for, in order: the name of a Parse
	// ("" for an Execute) or a Sync. PostgreSQL skips the rest of a Sync
	// group after an error, and so does pgconn's GetResults.
	type request struct {
		prepare string
		sync    bool
	}
	var exp []request
	for i, q := range st.SQL {
		if i%2 == 1 {
			name := sfStmtName(q)
			if !c.named[name] {
				p.SendPrepare(name, q, nil)
				exp = append(exp, request{prepare: name})
			}
			p.SendQueryPrepared(name, paramsOf(q), nil, nil)
		} else {
			p.SendQueryParams(q, paramsOf(q), nil, nil, nil)
		}
		exp = append(exp, request{})
		if st.Mode == sfPipeSyncs {
			p.SendPipelineSync()
			exp = append(exp, request{sync: true})
		}
	}
	if st.Mode != sfPipeSyncs {
		p.SendPipelineSync()
		exp = append(exp, request{sync: true})
	}
	var b strings.Builder
	if err := p.Flush(); err != nil {
		_ = p.Close()
		return "flush " + c.sfErr(err)
	}
	j := 0
	failed := func(err error) {
		b.WriteString(c.sfErr(err) + ";")
		if j < len(exp) && exp[j].sync {
			return // an error where a Sync's answer was due: the Sync is still due
		}
		for j++; j < len(exp) && !exp[j].sync; j++ {
		}
	}
	for !c.dead {
		res, err := p.GetResults()
		if err != nil {
			failed(err)
			continue
		}
		if res == nil {
			break
		}
		switch r := res.(type) {
		case *pgconn.ResultReader:
			rr := r.Read()
			if rr.Err != nil {
				failed(rr.Err)
				continue
			}
			b.WriteString(rr.CommandTag.String() + sfRows(rr.Rows) + ";")
		case *pgconn.StatementDescription:
			b.WriteString("prepared;")
			if j < len(exp) && exp[j].prepare != "" {
				c.named[exp[j].prepare] = true
			}
		case *pgconn.PipelineSync:
			b.WriteString("sync;")
		default:
			fmt.Fprintf(&b, "%T;", r)
		}
		j++
	}
	if err := p.Close(); err != nil && !c.dead {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			b.WriteString("close " + c.sfErr(err))
		}
	}
	return b.String()
}

// observe reads the session's state, the reported parameters and the
// transaction status.
func (c *sfClient) observe(ctx context.Context) string {
	var b strings.Builder
	results, err := c.pc.Exec(ctx, sfObserveSQL).ReadAll()
	for _, r := range results {
		b.WriteString(sfRows(r.Rows))
	}
	if err != nil {
		b.WriteString(c.sfErr(err))
	}
	b.WriteString(" | reported:")
	for _, k := range sfReported {
		b.WriteString(" " + k + "=" + c.pc.ParameterStatus(k))
	}
	fmt.Fprintf(&b, " | tx=%c", c.pc.TxStatus())
	return b.String()
}

// sfConnect opens a client connection; directly or through poolerd.
func sfConnect(ctx context.Context, dsn string) (*sfClient, error) {
	pc, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("statefuzz: connect: %w", err)
	}
	return &sfClient{pc: pc, named: map[string]bool{}}, nil
}

// sfReference runs every client's program alone on its own direct
// connection and returns the answers. The clients run at the same time:
// nothing one does can reach another directly (their advisory lock keys
// differ, and the objects they share are read-only).
func sfReference(ctx context.Context, f *sfFixture, p *sfProgram) ([][]string, error) {
	out := make([][]string, len(p.Clients))
	errs := make([]error, len(p.Clients))
	var wg sync.WaitGroup
	for i, steps := range p.Clients {
		wg.Add(1)
		go func(i int, steps []sfStep) {
			defer wg.Done()
			c, err := f.direct.get(ctx, pg.DSN(pgtest.RoleApp, pgtest.Password, f.refDB))
			if err != nil {
				errs[i] = err
				return
			}
			for _, st := range steps {
				out[i] = append(out[i], c.run(ctx, st))
			}
			f.direct.put(ctx, c)
		}(i, steps)
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// sfDirectConns keeps direct connections between programs: a connection
// goes back after ROLLBACK and DISCARD ALL (which closes cursors, resets
// the session authorization, every setting, LISTEN, advisory locks,
// prepared statements, temporary objects and sequences), a fresh session
// for what OBSERVE reads, and saves a login per client per program.
type sfDirectConns struct {
	mu   sync.Mutex
	idle []*sfClient
}

func (d *sfDirectConns) get(ctx context.Context, dsn string) (*sfClient, error) {
	d.mu.Lock()
	if n := len(d.idle); n > 0 {
		c := d.idle[n-1]
		d.idle = d.idle[:n-1]
		d.mu.Unlock()
		return c, nil
	}
	d.mu.Unlock()
	return sfConnect(ctx, dsn)
}

func (d *sfDirectConns) put(ctx context.Context, c *sfClient) {
	if !c.dead {
		_, err := c.pc.Exec(ctx, "ROLLBACK; DISCARD ALL").ReadAll()
		if err == nil && c.pc.TxStatus() == 'I' {
			c.named = map[string]bool{}
			d.mu.Lock()
			d.idle = append(d.idle, c)
			d.mu.Unlock()
			return
		}
	}
	_ = c.pc.Close(ctx)
}

func (d *sfDirectConns) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.idle {
		_ = c.pc.Close(context.Background())
	}
	d.idle = nil
}

// sfPoolerd is a poolerd instance for the fuzzer: warnings only, logs
// kept in a bounded buffer (the fuzzer starts thousands).
type sfPoolerd struct {
	srv  *proxy.Server
	addr string
	logs *sfLog
	done chan struct{}
}

// sfLog keeps the last 256 KB of a poolerd's log.
type sfLog struct {
	mu  sync.Mutex
	buf []byte
}

func (l *sfLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if len(l.buf) > 256<<10 {
		l.buf = append([]byte(nil), l.buf[len(l.buf)-128<<10:]...)
	}
	return len(p), nil
}

func (l *sfLog) Sync() error { return nil }

func (l *sfLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

func sfStartPoolerd(f *sfFixture, poolSize int, holes bool) (*sfPoolerd, error) {
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, f.db)
	cfg.PoolMode = "transaction"
	cfg.MaxSize = poolSize
	cfg.CheckoutTimeout = 60 * time.Second // the scheduler never lets a client wait for nothing
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.LogLevel = "warn"
	cfg.AuthType = config.AuthTrust // the clients' logins are not what this tests
	// The hand-off check runs before every hand-off; a dirty connection
	// is a finding (sfRunOne).
	testVerifyHandoff(&cfg)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("statefuzz: configuration: %w", err)
	}
	logs := &sfLog{}
	enc := zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, logs, zapcore.WarnLevel))
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("statefuzz: listen: %w", err)
	}
	srv := proxy.New(&cfg, log)
	srv.SetConsole(console.New(srv, nil))
	srv.Warm()
	p := &sfPoolerd{srv: srv, addr: ln.Addr().String(), logs: logs, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		_ = srv.Serve(ln)
	}()
	return p, nil
}

func (p *sfPoolerd) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	<-p.done
	if found := secretsIn(p.logs.String()); len(found) > 0 {
		return fmt.Errorf("statefuzz: secrets in poolerd's log:\n%s", strings.Join(found, "\n"))
	}
	return nil
}

// waiting is how many checkouts wait in poolerd's pool.
func (p *sfPoolerd) waiting(db string) int {
	for _, ps := range p.srv.Pools() {
		if ps.Database == db {
			return ps.Waiting
		}
	}
	return 0
}

// sfRunPoolerd runs the clients' programs concurrently through poolerd.
// A seeded scheduler hands the next step to a random client that is not
// busy and waits until that step is answered or is waiting in poolerd's
// checkout queue (a pinned client or an open transaction holds the
// connection), then goes on; a client whose program is done disconnects,
// freeing a connection it was pinned to.
func sfRunPoolerd(ctx context.Context, f *sfFixture, p *sfProgram, inst *sfPoolerd) ([][]string, error) {
	n := len(p.Clients)
	out := make([][]string, n)
	clients := make([]*sfClient, n)
	dsn := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", pgtest.RoleApp, pgtest.Password, inst.addr, f.db)
	for i := range clients {
		c, err := sfConnect(ctx, dsn)
		if err != nil {
			for _, c := range clients[:i] {
				_ = c.pc.Close(ctx)
			}
			return nil, err
		}
		clients[i] = c
	}
	type done struct {
		client int
		answer string
	}
	results := make(chan done, n)
	next := make([]int, n)
	busy := make([]bool, n)
	inflight := 0
	r := mrand.New(mrand.NewSource(p.Seed ^ 0x5eed))
	defer func() {
		// A stuck run: the context has ended, so every unanswered step
		// ends soon; then every connection is closed.
		for ; inflight > 0; inflight-- {
			<-results
		}
		for _, c := range clients {
			_ = c.pc.Close(context.Background())
		}
	}()
	collect := func(d done) {
		out[d.client] = append(out[d.client], d.answer)
		busy[d.client] = false
		inflight--
		next[d.client]++
		if next[d.client] == len(p.Clients[d.client]) {
			_ = clients[d.client].pc.Close(ctx) // frees a connection it was pinned to
		}
	}
	for {
		var ready []int
		for i := range clients {
			if !busy[i] && next[i] < len(p.Clients[i]) {
				ready = append(ready, i)
			}
		}
		if len(ready) == 0 {
			if inflight == 0 {
				break
			}
			select {
			case d := <-results:
				collect(d)
			case <-ctx.Done():
				return out, fmt.Errorf("statefuzz: stuck: %d steps unanswered: %w", inflight, ctx.Err())
			}
			continue
		}
		i := ready[r.Intn(len(ready))]
		busy[i] = true
		inflight++
		go func(i int, st sfStep) {
			results <- done{i, clients[i].run(ctx, st)}
		}(i, p.Clients[i][next[i]])
		// Wait until client i's step is answered or every unanswered step
		// waits for a server connection.
		for busy[i] {
			select {
			case d := <-results:
				collect(d)
				continue
			case <-ctx.Done():
				return out, fmt.Errorf("statefuzz: stuck: %d steps unanswered: %w", inflight, ctx.Err())
			case <-time.After(time.Millisecond):
			}
			if inflight > 0 && inst.waiting(f.db) >= inflight {
				break
			}
		}
	}
	return out, nil
}

// sfDiff is the first difference between the reference and poolerd's
// answers, or nil.
type sfDiff struct {
	client, step int
	direct, got  string
}

func sfCompare(ref, got [][]string) *sfDiff {
	for c := range ref {
		for s := range ref[c] {
			g := "(no answer)"
			if c < len(got) && s < len(got[c]) {
				g = got[c][s]
			}
			if ref[c][s] != g {
				return &sfDiff{client: c, step: s, direct: ref[c][s], got: g}
			}
		}
	}
	return nil
}

// sfRunOne runs program p directly and through a fresh poolerd and
// returns the first difference, if any.
func sfRunOne(f *sfFixture, p *sfProgram) (*sfDiff, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The reference and poolerd's run are independent: run them at once.
	var ref [][]string
	var refErr error
	refDone := make(chan struct{})
	go func() {
		defer close(refDone)
		ref, refErr = sfReference(ctx, f, p)
	}()
	inst, err := sfStartPoolerd(f, p.PoolSize, p.Holes)
	if err != nil {
		<-refDone
		return nil, err
	}
	got, runErr := sfRunPoolerd(ctx, f, p, inst)
	stopErr := inst.stop()
	<-refDone
	if err := errors.Join(refErr, stopErr); err != nil {
		return nil, err
	}
	if runErr != nil {
		return &sfDiff{client: -1, step: -1, direct: "(all steps answered)", got: runErr.Error()}, nil
	}
	if d := sfCompare(ref, got); d != nil {
		return d, nil
	}
	inst.logs.mu.Lock()
	logs := string(inst.logs.buf)
	inst.logs.mu.Unlock()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, handoffDirtyLog) {
			return &sfDiff{client: -1, step: -1, direct: "(no dirty hand-off)", got: line}, nil
		}
	}
	return nil, nil
}

// sfShrink drops steps (and whole clients) while the program still shows
// a difference, each candidate tried twice (interleavings vary).
func sfShrink(f *sfFixture, p *sfProgram, deadline time.Time) *sfProgram {
	fails := func(q *sfProgram) bool {
		for try := 0; try < 2; try++ {
			if d, err := sfRunOne(f, q); err == nil && d != nil {
				return true
			}
		}
		return false
	}
	cur := p
	for changed := true; changed && time.Now().Before(deadline); {
		changed = false
		for c := 0; c < len(cur.Clients) && len(cur.Clients) > 1; c++ {
			q := &sfProgram{Seed: cur.Seed, PoolSize: cur.PoolSize, Holes: cur.Holes}
			q.Clients = append(append([][]sfStep{}, cur.Clients[:c]...), cur.Clients[c+1:]...)
			if fails(q) {
				cur, changed = q, true
				c--
			}
		}
		for c := 0; c < len(cur.Clients); c++ {
			for s := 0; s < len(cur.Clients[c]) && time.Now().Before(deadline); s++ {
				q := &sfProgram{Seed: cur.Seed, PoolSize: cur.PoolSize, Holes: cur.Holes}
				for cc, steps := range cur.Clients {
					if cc == c {
						steps = append(append([]sfStep{}, steps[:s]...), steps[s+1:]...)
					}
					q.Clients = append(q.Clients, steps)
				}
				if len(q.Clients[c]) == 0 {
					continue
				}
				if fails(q) {
					cur, changed = q, true
					s--
				}
			}
		}
	}
	return cur
}

func sfEnvInt(name string, def int64) int64 {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return def
}

// sfFixedSeeds always run first in the short budget: twelve, then seeds
// whose programs once differed. 20000947: a pipeline whose DISCARD ALL
// failed with the Parse of its own statement, whose undo listed that
// statement again (dropped.undo), so the next client's Parse of the same
// text was answered from the cache and its Describe got 26000. 30007593:
// the same for the client's own name (its Parse of DISCARD ALL skipped
// with the DISCARD ALL, the name mapped again: 42P05 for its next Parse).
// 50002140: a pipelined BEGIN ISOLATION LEVEL whose Parse was answered
// from the cache failed with 25001, the scratch Parse (then a SELECT)
// having taken the transaction's snapshot (it fails about one run in ten;
// TestTxPreparedCacheHitTakesNoSnapshot always). 60068749: DEALLOCATE ALL;
// DISCARD ALL in one Query made one drop, undone by the DISCARD ALL's
// error although the DEALLOCATE ALL had dropped everything: another
// client's Bind got 26000. 889613268 (CI) and 901000447: DISCARD ALL; a
// named statement, a Sync after each: the Parse waited for the DISCARD
// ALL's answer, and the settings snapshot that answer started released the
// connection while the session handled the rest of the read, which went to
// another connection with the Parse twice (42P05; on a loaded machine only,
// TestReadKeepsItsServerAfterWaiting always).
var sfFixedSeeds = []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 20000947, 30007593, 50002140, 60068749, 889613268, 901000447}

// TestStateFuzz is the differential state fuzzer (see the top of this
// file).
func TestStateFuzz(t *testing.T) {
	t.Parallel()
	f := sfSetup(t)
	holes := os.Getenv("STATEFUZZ_HOLES") == "1"
	programs := sfEnvInt("STATEFUZZ_PROGRAMS", 0)
	duration := time.Duration(sfEnvInt("STATEFUZZ_DURATION", 20)) * time.Second
	var seeds func(i int64) (int64, bool)
	base := sfEnvInt("STATEFUZZ_SEED", time.Now().UnixNano()%1_000_000_000)
	start := time.Now()
	switch {
	case os.Getenv("STATEFUZZ_SEED") != "" || programs > 0:
		if programs == 0 {
			programs = 1
		}
		limit := time.Duration(sfEnvInt("STATEFUZZ_MAX_SECONDS", 0)) * time.Second
		seeds = func(i int64) (int64, bool) {
			return base + i, i < programs && (limit == 0 || time.Since(start) < limit)
		}
		t.Logf("statefuzz: %d programs, seeds %d..%d", programs, base, base+programs-1)
	default:
		seeds = func(i int64) (int64, bool) {
			if i < int64(len(sfFixedSeeds)) {
				return sfFixedSeeds[i], true
			}
			return base + i, time.Since(start) < duration
		}
		t.Logf("statefuzz: fixed seeds %v, then seeds from %d for %s (STATEFUZZ_SEED=n STATEFUZZ_PROGRAMS=1 runs seed n again)",
			sfFixedSeeds, base+int64(len(sfFixedSeeds)), duration)
	}
	findings := map[string]bool{}
	ran := 0
	for i := int64(0); ; i++ {
		seed, ok := seeds(i)
		if !ok {
			break
		}
		p := sfGenerate(seed, f, holes)
		d, err := sfRunOne(f, p)
		ran++
		if err != nil {
			t.Fatalf("statefuzz seed %d: %v", seed, err)
		}
		if ran%1000 == 0 {
			t.Logf("statefuzz: %d programs so far (%s), %d findings", ran, time.Since(start).Round(time.Second), len(findings))
		}
		if d == nil {
			continue
		}
		// One report per production of the step that differed.
		key := "stuck"
		if d.client >= 0 {
			key = p.Clients[d.client][d.step].Prod
			if key == sfObserve {
				key = "observe: " + sfObserveDiff(d.direct, d.got)
			}
			if strings.Contains(d.got, "ERROR 26000") && !strings.Contains(d.direct, "ERROR 26000") {
				key = "a named statement lost (26000)"
			}
		}
		if findings[key] && os.Getenv("STATEFUZZ_KEEP_GOING") == "1" {
			continue
		}
		findings[key] = true
		min := sfShrink(f, p, time.Now().Add(time.Duration(sfEnvInt("STATEFUZZ_SHRINK_SECONDS", 60))*time.Second))
		md, _ := sfRunOne(f, min)
		msg := fmt.Sprintf("statefuzz: seed %d: client %d step %d differs from a direct connection\n  step:   %s\n  direct: %s\n  poolerd: %s\nprogram:\n%s",
			seed, d.client, d.step, sfStepAt(p, d), d.direct, d.got, p)
		msg += "shrunk program:\n" + min.String()
		if md != nil {
			msg += fmt.Sprintf("  shrunk: client %d step %d\n  direct: %s\n  poolerd: %s\n", md.client, md.step, md.direct, md.got)
		}
		msg += "(rerun: STATEFUZZ_SEED=" + strconv.FormatInt(seed, 10) + " STATEFUZZ_PROGRAMS=1)"
		if os.Getenv("STATEFUZZ_KEEP_GOING") == "1" {
			t.Errorf("%s", msg)
			continue
		}
		t.Fatalf("%s", msg)
	}
	t.Logf("statefuzz: %d programs in %s, %d findings", ran, time.Since(start).Round(time.Second), len(findings))
}

func sfStepAt(p *sfProgram, d *sfDiff) string {
	if d.client < 0 {
		return "(the run)"
	}
	return p.Clients[d.client][d.step].String()
}

// sfObserveDiff names the parts of two observations that differ.
func sfObserveDiff(a, b string) string {
	pa, pb := strings.Split(a, " | "), strings.Split(b, " | ")
	var names []string
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y string
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if x != y {
			name, _, _ := strings.Cut(x+y, "=")
			names = append(names, strings.TrimLeft(name, ` ("`))
		}
	}
	return strings.Join(names, ",")
}
