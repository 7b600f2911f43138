package sqlscan

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	cases := []struct {
		sql  string
		want Effects
	}{
		{"SELECT 1", Effects{Statements: 1}},
		{"", Effects{}},
		{" ; ;", Effects{}},
		{"SET work_mem = '64MB'", Effects{Statements: 1, Settings: true}},
		{"set SESSION statement_timeout to 5", Effects{Statements: 1, Settings: true}},
		{"SET LOCAL work_mem = '1MB'", Effects{Statements: 1}},
		{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", Effects{Statements: 1}},
		{"SET ROLE admin", Effects{Statements: 1, Pin: PinRole}},
		{"SET SESSION AUTHORIZATION bob", Effects{Statements: 1, Pin: PinRole}},
		{"RESET ALL", Effects{Statements: 1, Settings: true}},
		{"select set_config('a.b', '1', false)", Effects{Statements: 1, Settings: true}},
		{"DISCARD ALL", Effects{Statements: 1, Settings: true, DeallocateAll: true, FirstDropAllDiscard: true, Unpin: true, Undo: allKinds}},
		{"DISCARD TEMP", Effects{Statements: 1, Undo: kindTempTable}},
		{"CREATE TEMP TABLE t (a int)", Effects{Statements: 1, Pin: PinTempTable, Temp: true}},
		{"create global temporary table t (a int)", Effects{Statements: 1, Pin: PinTempTable, Temp: true}},
		{"CREATE OR REPLACE TEMP VIEW v AS SELECT 1", Effects{Statements: 1, Pin: PinTempTable, Temp: true}},
		{"CREATE TABLE temp (a int)", Effects{Statements: 1, Pin: PinTempTable, Temp: true}}, // any TEMP in a CREATE: errs to the safe side
		{`CREATE TABLE "temp" (a int)`, Effects{Statements: 1}},
		{"CREATE TEMP TABLE t (x int) ON COMMIT DROP", Effects{Statements: 1, Temp: true}},
		{"CREATE TEMP TABLE t (x int) ON COMMIT DELETE ROWS", Effects{Statements: 1, Pin: PinTempTable, Temp: true}},
		{"SELECT * INTO TEMP t FROM x", Effects{Statements: 1, Pin: PinTempTable, Temp: true}},
		{"PREPARE p AS SELECT 1", Effects{Statements: 1, Pin: PinPrepare}},
		{"PREPARE TRANSACTION 'x'", Effects{Statements: 1, Commits: true}},
		{"LISTEN chan", Effects{Statements: 1, Pin: PinListen}},
		{"UNLISTEN *", Effects{Statements: 1, Undo: kindListen}},
		{"SELECT pg_advisory_lock(1)", Effects{Statements: 1, Pin: PinAdvisoryLock}},
		{"SELECT pg_catalog.PG_TRY_ADVISORY_LOCK_SHARED(1)", Effects{Statements: 1, Pin: PinAdvisoryLock}},
		{"SELECT pg_advisory_xact_lock(1)", Effects{Statements: 1}},
		{"SELECT 'pg_advisory_lock(1)'", Effects{Statements: 1}},
		{"SELECT $$ pg_advisory_lock(1) $$", Effects{Statements: 1}},
		{"SELECT $f$ ; SET x = 1; $f$, $1", Effects{Statements: 1}},
		{"SELECT \"pg_advisory_lock\"(1)", Effects{Statements: 1, Pin: PinAdvisoryLock}},
		{`SELECT "pg_catalog"."pg_try_advisory_lock_shared"(1)`, Effects{Statements: 1, Pin: PinAdvisoryLock}},
		{`SELECT "PG_ADVISORY_LOCK"(1)`, Effects{Statements: 1, Calls: true}},
		{"-- SET x = 1\nSELECT 1 /* ; LISTEN x /* nested */ ; */", Effects{Statements: 1}},
		{"DECLARE c CURSOR WITH HOLD FOR SELECT 1", Effects{Statements: 1, Pin: PinCursorOnHold}},
		{"DECLARE c CURSOR FOR SELECT 1", Effects{Statements: 1}},
		{"BEGIN", Effects{Statements: 1, BeginTx: true}},
		{"start transaction read only", Effects{Statements: 1, BeginTx: true}},
		{"BEGIN; SELECT 1; COMMIT", Effects{Statements: 3, Commits: true, EndTx: true}},
		{"BEGIN; SELECT 1", Effects{Statements: 2, BeginTx: true}},
		{"BEGIN; SAVEPOINT a; ROLLBACK TO a", Effects{Statements: 3, BeginTx: true}},
		{"BEGIN; SELECT 1; ROLLBACK", Effects{Statements: 3, EndTx: true}},
		{"COMMIT AND CHAIN", Effects{Statements: 1, Commits: true}},
		{"BEGIN; COMMIT AND CHAIN", Effects{Statements: 2, BeginTx: true, Commits: true}},
		{"ROLLBACK", Effects{Statements: 1, EndTx: true}},
		{"abort", Effects{Statements: 1, EndTx: true}},
		{"BEGIN; SAVEPOINT s; ROLLBACK TO SAVEPOINT s", Effects{Statements: 3, BeginTx: true}},
		{"end", Effects{Statements: 1, Commits: true, EndTx: true}},
		{"COMMIT PREPARED 'x'", Effects{Statements: 1, Commits: true}},
		{"ROLLBACK PREPARED 'x'", Effects{Statements: 1, Commits: true}},
		{"DEALLOCATE s1", Effects{Statements: 1, Deallocates: 1, Undo: kindPrepare}},
		{"DEALLOCATE PREPARE \"S1\";", Effects{Statements: 1, Deallocates: 1, Undo: kindPrepare}},
		{"DEALLOCATE ALL", Effects{Statements: 1, DeallocateAll: true, Undo: kindPrepare}},
		// The first drop of every statement is the one whose answer makes
		// it final.
		{"DEALLOCATE ALL; DISCARD ALL", Effects{Statements: 2, Settings: true, DeallocateAll: true, Unpin: true, Undo: allKinds}},
		{"DISCARD ALL; DEALLOCATE ALL", Effects{Statements: 2, Settings: true, DeallocateAll: true, FirstDropAllDiscard: true, Unpin: true, Undo: allKinds}},
		{"DEALLOCATE s1; SELECT 1; deallocate s2", Effects{Statements: 3, Deallocates: 2, Undo: kindPrepare}},
		{"SELECT E'\\'; LISTEN x'", Effects{Statements: 1}},
		{"SELECT 'it''s; LISTEN x'", Effects{Statements: 1}},
		{"SET a.b = 1; LISTEN x", Effects{Statements: 2, Settings: true, Pin: PinListen}},
		{"DO $$ BEGIN EXECUTE 'SET ROLE x'; END $$", Effects{Statements: 1, Settings: true, Commits: true, Calls: true}},
		{"CALL p()", Effects{Statements: 1, Settings: true, Calls: true, Commits: true}},
		{"ROLLBACK; INSERT INTO t VALUES (1)", Effects{Statements: 2, EndTx: true, AfterEndTx: true}},
		{"commit; select 1; rollback", Effects{Statements: 3, Commits: true, EndTx: true}},
		{"ROLLBACK; SELECT 1; BEGIN; SELECT 2", Effects{Statements: 4, BeginTx: true}},
		{"COMMIT; BEGIN; INSERT INTO t VALUES (1)", Effects{Statements: 3, BeginTx: true, Commits: true}},
		{"ROLLBACK AND CHAIN; SELECT 1", Effects{Statements: 2}},
		{"ROLLBACK TO SAVEPOINT s; SELECT 1", Effects{Statements: 2}},
		{"END; SELECT 1", Effects{Statements: 2, Commits: true, EndTx: true, AfterEndTx: true}},
	}
	for _, c := range cases {
		if got := Scan(c.sql); got != c.want {
			t.Errorf("Scan(%q) = %+v, want %+v", c.sql, got, c.want)
		}
	}
}

func FuzzScan(f *testing.F) {
	for _, s := range []string{"SELECT 1", "$a$ x $a$", "/* /* */", "E'\\", `"a""b"`, "$1$"} {
		f.Add(s)
	}
	for _, c := range undoCases {
		f.Add(c.sql)
	}
	for _, s := range []string{"SET ROLE '", "SET ROLE =", "SET SESSION AUTHORIZATION", "RESET", "CLOSE", "UNLISTEN",
		"DROP", "DISCARD", `SET ROLE "none`, "SET role TO 'none''", "pg_advisory_unlock"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := Scan(s)
		if e.Undo&^allKinds != 0 {
			t.Fatalf("Scan(%q).Undo = %08b, not a set of pin kinds", s, uint8(e.Undo))
		}
		if e.Unpin && e.Undo != allKinds {
			t.Fatalf("Scan(%q) unpins but Undo = %v", s, e.Undo)
		}
		_ = e.Undo.String()
	})
}

// undoCases are SQL texts and the kinds of pinned state they may undo
// (Undo), with what they pin (Pin).
var undoCases = []struct {
	sql  string
	undo Kinds
	pin  string
}{
	// CLOSE: any cursor, WITH HOLD ones included.
	{"CLOSE c", kindCursorOnHold, ""},
	{"close ALL", kindCursorOnHold, ""},
	{`CLOSE "My Cursor";`, kindCursorOnHold, ""},
	{"BEGIN; CLOSE c; COMMIT", kindCursorOnHold, ""},
	{"DECLARE c CURSOR WITH HOLD FOR SELECT 1; CLOSE c", kindCursorOnHold, PinCursorOnHold},
	{"COMMIT", 0, ""}, // COMMIT and ROLLBACK leave WITH HOLD cursors open
	{"ROLLBACK", 0, ""},
	{"BEGIN; DECLARE c CURSOR FOR SELECT 1; END", 0, ""},
	{"CLOSE", 0, ""},
	{"SELECT 'CLOSE c'", 0, ""},
	{"-- CLOSE c\nSELECT 1", 0, ""},
	{"/* CLOSE c; */ SELECT 1", 0, ""},
	{"SELECT close FROM t", 0, ""},
	{`"CLOSE" c`, 0, ""},

	// UNLISTEN.
	{"UNLISTEN chan", kindListen, ""},
	{"unlisten *", kindListen, ""},
	{`UNLISTEN "Chan"`, kindListen, ""},
	{"LISTEN a; UNLISTEN a", kindListen, PinListen},
	{"UNLISTEN", 0, ""},
	{"SELECT 'UNLISTEN *'", 0, ""},
	{"NOTIFY unlisten", 0, ""},

	// The advisory unlock functions, wherever they are called.
	{"SELECT pg_advisory_unlock(1)", kindAdvisoryLock, ""},
	{"SELECT pg_advisory_unlock_shared(1, 2)", kindAdvisoryLock, ""},
	{"SELECT pg_advisory_unlock_all()", kindAdvisoryLock, ""},
	{"select PG_ADVISORY_UNLOCK_ALL()", kindAdvisoryLock, ""},
	{"SELECT pg_catalog.pg_advisory_unlock(1)", kindAdvisoryLock, ""},
	{`SELECT "pg_advisory_unlock"(1)`, kindAdvisoryLock, ""},
	{`SELECT "pg_catalog"."pg_advisory_unlock_all"()`, kindAdvisoryLock, ""},
	{"SELECT count(*) FROM jobs WHERE pg_advisory_unlock(id)", kindAdvisoryLock, ""},
	{"UPDATE t SET done = pg_advisory_unlock_shared(7) WHERE id = 1", kindAdvisoryLock, ""},
	{"WITH x AS (SELECT pg_advisory_unlock_all()) SELECT * FROM x", kindAdvisoryLock, ""},
	{"SELECT pg_advisory_lock(1); SELECT pg_advisory_unlock(1)", kindAdvisoryLock, PinAdvisoryLock},
	{"SELECT pg_advisory_unlock FROM t", kindAdvisoryLock, ""}, // the name counts, as for the locks
	{"SELECT 'pg_advisory_unlock(1)'", 0, ""},
	{"SELECT $$ pg_advisory_unlock(1) $$", 0, ""},
	{"SELECT $f$pg_advisory_unlock_all()$f$", 0, ""},
	{"-- pg_advisory_unlock(1)\nSELECT 1", 0, ""},
	{`SELECT "PG_ADVISORY_UNLOCK"(1)`, 0, ""}, // a function of the user's
	{"SELECT my_pg_advisory_unlock(1), pg_advisory_unlocks(2)", 0, ""},
	{"SELECT pg_advisory_xact_lock(1)", 0, ""},
	{"DO $$ BEGIN PERFORM pg_advisory_unlock_all(); END $$", 0, ""}, // not read: stays pinned

	// DROP of the relations that can be temporary, DISCARD TEMP.
	{"DROP TABLE t", kindTempTable, ""},
	{"drop table if exists t, u cascade", kindTempTable, ""},
	{"DROP TABLE pg_temp.t", kindTempTable, ""},
	{`DROP TABLE "T"`, kindTempTable, ""},
	{"DROP VIEW v", kindTempTable, ""},
	{"DROP SEQUENCE IF EXISTS s", kindTempTable, ""},
	{"DISCARD TEMP", kindTempTable, ""},
	{"discard temporary", kindTempTable, ""},
	{"CREATE TEMP TABLE t (a int); DROP TABLE t", kindTempTable, PinTempTable},
	{"DROP INDEX i", 0, ""},
	{"DROP FUNCTION f()", 0, ""},
	{"DROP MATERIALIZED VIEW m", 0, ""}, // never temporary
	{"DROP SCHEMA s CASCADE", 0, ""},
	{"DISCARD PLANS", 0, ""},
	{"DISCARD SEQUENCES", 0, ""},
	{"TRUNCATE t", 0, ""},
	{"ALTER TABLE t DROP COLUMN a", 0, ""},
	{"SELECT 'DROP TABLE t'", 0, ""},
	{"CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ DROP TABLE t $$", 0, ""},
	{"CREATE FUNCTION f() RETURNS void LANGUAGE sql AS 'DROP TABLE t'", 0, ""},
	{"DO $$ BEGIN DROP TABLE t; END $$", 0, ""}, // not read: stays pinned

	// DEALLOCATE.
	{"DEALLOCATE p", kindPrepare, ""},
	{"deallocate prepare p", kindPrepare, ""},
	{"DEALLOCATE ALL", kindPrepare, ""},
	{"DEALLOCATE PREPARE ALL", kindPrepare, ""},
	{`DEALLOCATE "P"`, kindPrepare, ""},
	{"PREPARE p AS SELECT 1; DEALLOCATE p", kindPrepare, PinPrepare},
	{"DEALLOCATE", 0, ""},
	{"SELECT 'DEALLOCATE p'", 0, ""},

	// Back to the login role or session authorization.
	{"RESET ROLE", kindRole, ""},
	{"reset role", kindRole, ""},
	{`RESET "role"`, kindRole, ""},
	{"RESET SESSION AUTHORIZATION", kindRole, ""},
	{"RESET session_authorization", kindRole, ""},
	{`RESET "SESSION_AUTHORIZATION"`, kindRole, ""},
	{"SET ROLE x; RESET ROLE", kindRole, PinRole},
	{"SET ROLE NONE", kindRole, PinRole}, // a session-level SET of the role pins, whatever the value
	{"SET SESSION ROLE none", kindRole, PinRole},
	{"SET ROLE 'none'", kindRole, PinRole},
	{`SET ROLE "none"`, kindRole, PinRole},
	{"SET ROLE /* c */ NONE", kindRole, PinRole},
	{"SET role TO DEFAULT", kindRole, PinRole},
	{"SET role = none", kindRole, PinRole},
	{`SET "ROLE" TO 'none'`, kindRole, PinRole},
	{"SET SESSION AUTHORIZATION DEFAULT", kindRole, PinRole},
	{"set session session authorization default", kindRole, PinRole},
	{"SET session_authorization TO DEFAULT", kindRole, PinRole},
	{`SET "session_authorization" = DEFAULT`, kindRole, PinRole},
	{"RESET ALL", 0, ""}, // leaves role and session_authorization alone
	{"RESET role.tenant", 0, ""},
	{"RESET work_mem", 0, ""},
	{"SET ROLE x", 0, PinRole},
	{"SET ROLE 'NONE'", 0, PinRole}, // a role named NONE
	{`SET ROLE "NONE"`, 0, PinRole},
	{"SET ROLE default_role", 0, PinRole},
	{"SET SESSION AUTHORIZATION 'default'", 0, PinRole}, // a user named default
	{"SET SESSION AUTHORIZATION none", 0, PinRole},
	{"SET LOCAL ROLE NONE", 0, ""}, // transaction-local
	{"SET LOCAL SESSION AUTHORIZATION DEFAULT", 0, ""},
	{"SET role.tenant = none", 0, ""},
	{"SELECT set_config('role', 'none', false)", 0, PinRole}, // not recognised as a reset
	{"SELECT 'RESET ROLE'", 0, ""},
	{"ALTER ROLE app RESET ROLE", 0, ""},

	// DISCARD ALL undoes every kind; statements add up.
	{"DISCARD ALL", allKinds, ""},
	{"CLOSE c; UNLISTEN *; SELECT pg_advisory_unlock_all(); DROP TABLE t; DEALLOCATE ALL; RESET ROLE",
		kindCursorOnHold | kindListen | kindAdvisoryLock | kindTempTable | kindPrepare | kindRole, ""},
	{"SELECT 1; CLOSE c; SELECT 2; UNLISTEN x", kindCursorOnHold | kindListen, ""},
	{"SELECT abalance FROM pgbench_accounts WHERE aid = $1", 0, ""},
}

func TestScanUndo(t *testing.T) {
	for _, c := range undoCases {
		e := Scan(c.sql)
		if e.Undo != c.undo || e.Pin != c.pin {
			t.Errorf("Scan(%q): Undo %q, Pin %q; want Undo %q, Pin %q", c.sql, e.Undo, e.Pin, c.undo, c.pin)
		}
		if !e.Undo.Empty() && !e.Interesting() {
			t.Errorf("Scan(%q) undoes %q but is not Interesting", c.sql, e.Undo)
		}
	}
}

// TestScanUndoSpacing: blanks and block comments between the words change
// nothing (line comments and newlines are left out: they would end a line
// comment of the text early).
func TestScanUndoSpacing(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	seps := []string{" ", "\t", "\r", "\f", "   ", "/* ; CLOSE x */", "/* a /* b; UNLISTEN * */ c */"}
	for _, c := range undoCases {
		want := Scan(c.sql)
		for range 20 {
			sql := strings.Map(func(r rune) rune {
				if r == ' ' {
					return '\x00'
				}
				return r
			}, c.sql)
			var b strings.Builder
			for _, part := range strings.Split(sql, "\x00") {
				if b.Len() > 0 {
					b.WriteString(seps[r.IntN(len(seps))])
				}
				b.WriteString(part)
			}
			if got := Scan(b.String()); got.Undo != want.Undo || got.Pin != want.Pin {
				t.Fatalf("Scan(%q): Undo %q, Pin %q; Scan(%q): Undo %q, Pin %q",
					b.String(), got.Undo, got.Pin, c.sql, want.Undo, want.Pin)
			}
		}
	}
}

func TestKinds(t *testing.T) {
	var k Kinds
	if !k.Empty() || k.String() != "" {
		t.Fatalf("zero Kinds: Empty %v, String %q", k.Empty(), k)
	}
	pins := []string{PinTempTable, PinPrepare, PinListen, PinAdvisoryLock, PinCursorOnHold, PinRole, PinSessionParams}
	for _, p := range pins {
		var one Kinds
		one.Add(p)
		if one.Empty() || !one.Has(p) || one.String() != p {
			t.Errorf("Add(%q): %08b, String %q", p, uint8(one), one)
		}
		for _, q := range pins {
			if q != p && one.Has(q) {
				t.Errorf("Add(%q) has %q", p, q)
			}
		}
		k.Add(p)
	}
	if k != allKinds {
		t.Errorf("every pin kind: %08b, want %08b", uint8(k), uint8(allKinds))
	}
	k.Add("no_such_kind")
	k.Add("")
	if k != allKinds || k.Has("no_such_kind") || k.Has("") {
		t.Errorf("an unknown name changed or is in %08b", uint8(k))
	}
	var got []string
	for n := range k.All() {
		got = append(got, n)
	}
	if strings.Join(got, " ") != strings.Join(pins, " ") {
		t.Errorf("All: %q, want %q", got, pins)
	}
	for n := range k.All() {
		if n != PinTempTable {
			t.Errorf("All went on after yield returned false: %q", n)
		}
		break
	}
	two := kindListen | kindRole
	if two.String() != PinListen+","+PinRole {
		t.Errorf("String: %q", two)
	}
}

// TestScanAllocs: Scan allocates nothing, undo statements included.
func TestScanAllocs(t *testing.T) {
	for _, sql := range []string{
		"SELECT abalance FROM pgbench_accounts WHERE aid = $1",
		"CLOSE c; UNLISTEN *; SELECT pg_advisory_unlock_all(); DROP TABLE t; DEALLOCATE ALL; RESET ROLE",
		"SET ROLE 'none'; SET SESSION AUTHORIZATION DEFAULT",
		"SELECT pg_catalog.set_config('role', $1, false)",
		"DISCARD ALL",
	} {
		if n := testing.AllocsPerRun(100, func() { _ = Scan(sql) }); n != 0 {
			t.Errorf("Scan(%q): %v allocations", sql, n)
		}
	}
}

func BenchmarkScan(b *testing.B) {
	q := "SELECT abalance FROM pgbench_accounts WHERE aid = $1"
	b.ReportAllocs()
	for b.Loop() {
		_ = Scan(q)
	}
}

// BenchmarkScanCalls reads a statement that calls built-ins and a
// function of the application's.
func BenchmarkScanCalls(b *testing.B) {
	q := "SELECT count(*), max(created_at) FROM orders WHERE customer_id = app.current_customer($1)"
	b.ReportAllocs()
	for b.Loop() {
		_ = Scan(q)
	}
}

// BenchmarkScanUndo reads what a client sends to give back session state.
func BenchmarkScanUndo(b *testing.B) {
	q := "CLOSE c; SELECT pg_advisory_unlock($1); RESET ROLE"
	b.ReportAllocs()
	for b.Loop() {
		_ = Scan(q)
	}
}

// BenchmarkScanSetConfig is the statement row-level-security applications
// send at the start of each transaction: set_config's arguments are read.
func BenchmarkScanSetConfig(b *testing.B) {
	q := "SELECT pg_catalog.set_config('app.tenant', $1, true)"
	b.ReportAllocs()
	for b.Loop() {
		_ = Scan(q)
	}
}

func TestDeallocations(t *testing.T) {
	sql := `DEALLOCATE s1; SELECT 'DEALLOCATE x'; deallocate PREPARE "My""S"; DEALLOCATE ALL; DEALLOCATE MyStmt`
	got := Deallocations(sql)
	want := []string{"s1", `My"S`, "mystmt"}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i, n := range got {
		if n.Name != want[i] {
			t.Errorf("%d: name %q, want %q", i, n.Name, want[i])
		}
		if i == 1 && sql[n.Start:n.End] != `"My""S"` {
			t.Errorf("quoted name at %q", sql[n.Start:n.End])
		}
		if i == 0 && sql[n.Start:n.End] != "s1" {
			t.Errorf("name at %q", sql[n.Start:n.End])
		}
	}
}

func TestCustomOptions(t *testing.T) {
	got := CustomOptions(`SET myapp.tenant = 'a'; SET SESSION "MyApp".Region TO x; RESET other.opt; SET work_mem = '1MB'; ` +
		`SELECT set_config('rls.user', '7', false), set_config('plain', 'x', false); SET LOCAL x.y = 1; SELECT 'SET a.b = 1'`)
	want := []string{"myapp.tenant", "myapp.region", "other.opt", "rls.user"}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: %q, want %q", i, got[i], want[i])
		}
	}
}

// roleCases are SQL texts and whether they change the session's role (or
// session authorization) in a way the scanner must pin.
var roleCases = []struct {
	sql string
	pin bool
	// check: not pinned, but may change the role: the pooler must check
	// the session after it ran (Settings).
	check bool
}{
	{"SET ROLE x", true, false},
	{"SeT RoLe x", true, false},
	{"set role = x", true, false},
	{"SET role TO 'x'", true, false},
	{"SET SESSION ROLE x", true, false},
	{`SET "role" TO x`, true, false},
	{`SET "ROLE" = x`, true, false},
	{`SET SESSION "role" TO x`, true, false},
	{"SET /* c */ SESSION -- c\n ROLE x", true, false},
	{"SET ROLE NONE", true, false},
	{"SET SESSION AUTHORIZATION bob", true, false},
	{"set session session authorization bob", true, false},
	{"SET SESSION AUTHORIZATION DEFAULT", true, false},
	{`SET "session_authorization" TO bob`, true, false},
	{"SET SESSION session_authorization = 'bob'", true, false},
	{"SELECT 1; SET ROLE x", true, false},
	{"SELECT 1; SET ROLE x; SELECT 2", true, false},
	{"/* " + strings.Repeat("x", 70<<10) + " */ SET ROLE x", true, false},
	{"SELECT set_config('role', 'x', false)", true, false},
	{"select SET_CONFIG('ROLE', 'x', FALSE)", true, false},
	{"SELECT set_config('session_authorization', 'x', false)", true, false},
	{"SELECT set_config('role'::text, 'x', 'off')", true, false},
	{"SELECT set_config('role', 'x', NULL)", true, false},
	{"SELECT set_config('role', lower('X'), false)", true, false},
	{"select 1; select pg_catalog.set_config('role', 'x', false)", true, false},
	{`SELECT "set_config"('role', 'x', false)`, true, false},
	{`SELECT "pg_catalog"."set_config"('role', 'x', false)`, true, false},
	{"SELECT length(upper(set_config('role', 'x', false)))", true, false},
	{"SELECT 1 WHERE set_config('role', 'x', false) IS NOT NULL", true, false},
	{"WITH a AS (SELECT set_config('role', 'x', false)) SELECT * FROM a", true, false},
	{"SELECT set_config('role', 'x', (false))", true, false},

	{"DO $$ BEGIN EXECUTE 'SET ROLE x'; END $$", false, true},
	{"CALL set_my_role()", false, true},
	{"SET LOCAL ROLE x", false, false},
	{"SET LOCAL SESSION AUTHORIZATION bob", false, false},
	{`SET LOCAL "role" = x`, false, false},
	{"SET role.tenant = 'x'", false, false},
	{"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", false, false},
	{"RESET ROLE", false, true},
	{"RESET SESSION AUTHORIZATION", false, true},
	{"SELECT 'SET ROLE x'", false, false},
	{"SELECT $$ SET ROLE x $$", false, false},
	{"-- SET ROLE x\nSELECT 1", false, false},
	{"SELECT set_config('role', 'x', true)", false, true},
	{"SELECT set_config('role', 'x', 'on')", false, true},
	{"SELECT set_config('role', 'x', ' TRUE ')", false, true},
	{"SELECT set_config('work_mem', '1MB', false)", false, true},
	{"SELECT set_config($1, $2, $3)", false, true},
	{"SELECT set_config(name, 'x', false) FROM t", false, true},
	{"SELECT set_config('ro' || 'le', 'x', false)", false, true},
	{`SELECT "SET_CONFIG"('role', 'x', false)`, false, false},
	{"SELECT my_set_config('role', 'x', false)", false, false},
	{"SELECT set_config", false, true},
	{"SELECT set_config('role', 'x'", false, true},
	{"SELECT set_config('role'; SET LOCAL ROLE x", false, true},
	{"ALTER ROLE app SET role = x", false, false},
	{"CREATE FUNCTION f() RETURNS int SET role = x AS 'SELECT 1' LANGUAGE sql", false, false},
}

func TestScanCalls(t *testing.T) {
	cases := []struct {
		sql   string
		calls bool
	}{
		{"SELECT abalance FROM pgbench_accounts WHERE aid = $1", false},
		{"SELECT f()", true},
		{"select F(1)", true},
		{`SELECT "MyFunc"(1)`, true},
		{"SELECT * FROM api.get_user($1)", true},
		{"SELECT 1 FROM t WHERE x = tenant.set_tenant('a')", true},
		{"SELECT myschema.count(*) FROM t", true},
		{"SELECT count(*), max(a), now(), lower(b), coalesce(c, 1) FROM t", false},
		{"SELECT pg_catalog.now(), \"pg_catalog\".\"lower\"('A')", false},
		{`SELECT "COUNT"(*) FROM t`, true},
		{"SELECT set_config('a.b', $1, true)", false},
		{"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP)", false},
		{"INSERT INTO s.t (a) VALUES (1) ON CONFLICT (a) DO NOTHING", false},
		{"UPDATE t SET a = a + 1 WHERE id IN (1, 2) AND EXISTS (SELECT 1)", false},
		{"SELECT a::varchar(10), CAST(b AS numeric(5, 2)), c::timestamptz(3) FROM t", false},
		{"CREATE TABLE t (a varchar(10), b numeric(5,2), PRIMARY KEY (a), CHECK (b > 0))", false},
		{"CREATE FUNCTION f(a int) RETURNS int LANGUAGE sql AS 'SELECT g(a)'", false},
		{"CREATE INDEX i ON t USING btree (a)", false},
		{"WITH x (a) AS (SELECT 1) SELECT * FROM x", false},
		{"SELECT 'f()', $$ g() $$ -- h()\n", false},
		{"SELECT row_number() OVER (PARTITION BY a ORDER BY b) FROM t", false},
		{"CALL p()", true},
		{"SELECT f(g())", true},
		{"(SELECT 1) UNION (SELECT 2); (SELECT 3)", false},
		{"SELECT (1 + 2) * (3)", false},
		{"CREATE TABLE IF NOT EXISTS t (a int GENERATED BY DEFAULT AS IDENTITY (START 1))", false},
	}
	for _, c := range cases {
		if got := Scan(c.sql).Calls; got != c.calls {
			t.Errorf("Scan(%q).Calls = %v, want %v", c.sql, got, c.calls)
		}
	}
}

func TestScanRole(t *testing.T) {
	for _, c := range roleCases {
		sql := c.sql
		e := Scan(sql)
		if got := e.Pin == PinRole; got != c.pin {
			t.Errorf("Scan(%.80q).Pin = %q, want pinned %v", sql, e.Pin, c.pin)
		}
		// Whatever is not pinned and may still change the role is
		// checked after it ran: it must at least say Settings.
		if c.check && !e.Settings {
			t.Errorf("Scan(%q).Settings = false, want true", sql)
		}
	}
}

// roleSpelling builds, from r, one spelling of a role or session
// authorization change, and reports whether it is session-level (pins) or
// local to the transaction (SET LOCAL, set_config(..., true)). It may be
// preceded and followed by other statements.
func roleSpelling(r *rand.Rand) (sql string, session bool) {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	anyCase := func(w string) string {
		b := []byte(w)
		for i, c := range b {
			if c >= 'a' && c <= 'z' && r.IntN(2) == 0 {
				b[i] = c - 'a' + 'A'
			}
		}
		return string(b)
	}
	sp := func() string {
		return pick(" ", "\n", "\t", "  ", " /* c; SET LOCAL ROLE y */ ", " -- c; 'x\n", " /* a /* b */ c */ ", "\r\n")
	}
	name := pick("x", `"X y"`, "'x'", "NONE", "DEFAULT", `"role"`)
	var b strings.Builder
	for range r.IntN(3) {
		b.WriteString(pick("SELECT 1;", "select 'a;b';", "SELECT $q$;SET ROLE y$q$;", "BEGIN;", "SELECT E'\\';';", "set work_mem = '1MB';", "RESET ROLE;"))
		b.WriteString(sp())
	}
	session = r.IntN(4) != 0
	scope := pick("", anyCase("session")+sp())
	if !session {
		scope = anyCase("local") + sp()
	}
	switch r.IntN(5) {
	case 0:
		b.WriteString(anyCase("set") + sp() + scope + anyCase("role") + sp() + name)
	case 1:
		param := pick(anyCase("role"), `"`+anyCase("role")+`"`)
		b.WriteString(anyCase("set") + sp() + scope + param + sp() + pick(anyCase("to"), "=") + sp() + name)
	case 2:
		b.WriteString(anyCase("set") + sp() + scope + anyCase("session") + sp() + anyCase("authorization") + sp() + name)
	case 3:
		param := pick(anyCase("session_authorization"), `"`+anyCase("session_authorization")+`"`)
		b.WriteString(anyCase("set") + sp() + scope + param + sp() + pick(anyCase("to"), "=") + sp() + name)
	default:
		fn := pick(anyCase("set_config"), `"set_config"`, anyCase("pg_catalog")+"."+anyCase("set_config"), `"pg_catalog"."set_config"`, anyCase("pg_catalog")+sp()+"."+sp()+`"set_config"`)
		param := "'" + pick(anyCase("role"), anyCase("session_authorization")) + "'" + pick("", "::text", "::"+anyCase("text"))
		value := pick("'x'", "lower('X')", "$1", "(SELECT 'x')", "'a,b'")
		isLocal := pick(anyCase("false"), "'f'", "'off'", "'no'", "'0'", anyCase("null"), "(false)", "$2")
		if !session {
			isLocal = pick(anyCase("true"), "'t'", "'on'", "'yes'", "' TRUE '", "'1'")
		}
		call := fn + sp() + "(" + sp() + param + sp() + "," + value + "," + sp() + isLocal + sp() + ")"
		switch r.IntN(4) {
		case 1:
			call = anyCase("upper") + "(" + call + ")"
		case 2:
			call = "length(upper(" + call + ")) + 1"
		case 3:
			call = "1 " + anyCase("where") + " " + call + " IS NOT NULL"
		}
		b.WriteString(anyCase("select") + sp() + call)
	}
	if r.IntN(2) == 0 {
		b.WriteString(pick(";", "; SELECT 2", ";\n", "; SET LOCAL work_mem = '1MB';"))
	}
	return b.String(), session
}

// FuzzRoleDetection: every generated spelling of a session-level role
// change pins, every transaction-local one does not; so does one after
// an arbitrary harmless statement (the fuzzer's bytes, with what could
// open a comment, string or quoted name removed); and nothing panics.
func FuzzRoleDetection(f *testing.F) {
	f.Add(uint64(0), uint64(0), "SELECT 1")
	f.Add(uint64(1), uint64(2), "set_config('role'")
	f.Add(uint64(7), uint64(99), "/* $a$ 'x \"y")
	f.Fuzz(func(t *testing.T, s1, s2 uint64, junk string) {
		_ = Scan(junk)
		_ = CustomOptions(junk)
		_ = Deallocations(junk)
		sql, session := roleSpelling(rand.New(rand.NewPCG(s1, s2)))
		if e := Scan(sql); (e.Pin == PinRole) != session {
			t.Fatalf("Scan(%q).Pin = %q, want pinned for the role: %v", sql, e.Pin, session)
		}
		clean := strings.Map(func(r rune) rune {
			if strings.ContainsRune(`'"$;-/*\`, r) {
				return ' '
			}
			return r
		}, junk)
		if e := Scan("SELECT " + clean + ";" + sql); session && e.Pin == "" {
			t.Fatalf("Scan(%q) pins nothing", "SELECT "+clean+";"+sql)
		}
	})
}

// TestScanIssue31 reads the spellings of issue 31's holes 5 and 6 and the
// ones around them: wherever the scanner cannot be sure, it errs to the
// safe side (Pin, Settings, Calls), never to nothing.
func TestScanIssue31(t *testing.T) {
	cases := []struct {
		sql   string
		pin   string
		calls bool
	}{
		// Temporary relations, past any number of words.
		{"SELECT 1 AS a, 2 AS b, 3 AS c, 4 AS d INTO TEMP t", PinTempTable, false},
		{"SELECT 1 AS a, 2 AS b, 3 AS c, 4 AS d INTO TEMPORARY TABLE t", PinTempTable, false},
		{"WITH q AS (SELECT 1 AS x) SELECT * INTO TEMP t FROM q", PinTempTable, false},
		{"(SELECT 1 AS x INTO TEMP t)", PinTempTable, false},
		{"CREATE TABLE pg_temp.t (x int)", PinTempTable, false},
		{`CREATE TABLE "pg_temp".t (x int)`, PinTempTable, false},
		{"create table PG_TEMP_3.t (x int)", PinTempTable, false},
		{"CREATE VIEW pg_temp.v AS SELECT 1", PinTempTable, false},
		{"CREATE SEQUENCE pg_temp.s", PinTempTable, false},
		{"CREATE UNLOGGED TABLE pg_temp.t AS SELECT 1", PinTempTable, false},
		{"SELECT 1 INTO pg_temp.t", PinTempTable, false},
		{"EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1", PinTempTable, false},
		{"CREATE /* c */ OR REPLACE -- c\n TEMPORARY RECURSIVE VIEW v (n) AS SELECT 1", PinTempTable, false},
		{"CREATE TEMP TABLE t (x int) ON COMMIT DROP", "", false},
		{"CREATE TABLE pg_temp.t (x int) ON COMMIT DROP", "", false},
		{"CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1", "", false},
		{"INSERT INTO temp VALUES (1)", "", false},
		{"WITH q AS (SELECT 1) INSERT INTO temp SELECT * FROM q", "", false},
		{"SELECT * FROM temp", "", false},
		{"SELECT 'INTO TEMP t'", "", false},
		{"SELECT 1 INTO \"temp\"", "", false},
		{"DROP TABLE pg_temp.t", "", false},
		// Cursors WITH HOLD, whatever the options between.
		{"DECLARE c BINARY INSENSITIVE NO SCROLL CURSOR WITH HOLD FOR SELECT 1", PinCursorOnHold, false},
		{"DECLARE c ASENSITIVE SCROLL CURSOR /* x */ WITH -- y\n HOLD FOR SELECT 1", PinCursorOnHold, false},
		{"DECLARE c BINARY INSENSITIVE NO SCROLL CURSOR WITHOUT HOLD FOR SELECT 1", "", false},
		{"DECLARE c CURSOR FOR SELECT 'WITH HOLD'", "", false},
		// Calls after ON and USING, in an array slice, keyword names.
		{"SELECT * FROM a JOIN b ON f(a.x) = b.x", "", true},
		{"SELECT * FROM a JOIN b USING (x) WHERE g(a.y)", "", true},
		{"DELETE FROM a USING f() AS x WHERE a.id = x.id", "", true},
		{"MERGE INTO t USING f() AS s ON t.id = s.id WHEN MATCHED THEN DELETE", "", true},
		{"SELECT (ARRAY[1,2,3])[1:f(2)]", "", true},
		{"SELECT a[f(1)] FROM t", "", true},
		{"SELECT hash(1)", "", true},
		{"SELECT range(1, 2)", "", true},
		{"SELECT list(1)", "", true},
		{"SELECT over(1)", "", true},
		{"SELECT x FROM t WHERE key(x)", "", true},
		{"SELECT 1 WHERE join(1) AND set(2)", "", true},
		{"CREATE TABLE t AS SELECT * FROM a JOIN b ON f(a.x)", "", true},
		{"CREATE TABLE t (a int) PARTITION BY RANGE (a)", "", false},
		{"CREATE TABLE t (a int) PARTITION BY HASH (a)", "", false},
		{"CREATE TABLE t (a int, b text, PRIMARY KEY (a), EXCLUDE USING gist (a WITH =))", "", false},
		{"CREATE INDEX i ON t (a) INCLUDE (b)", "", false},
		{"SELECT count(*) FILTER (WHERE a) OVER (PARTITION BY b) FROM t GROUP BY CUBE (a), ROLLUP (b)", "", true},
		{"SELECT count(*) FILTER (WHERE a) OVER (PARTITION BY b) FROM t GROUP BY CUBE (a)", "", false},
		{"SELECT * FROM t GROUP BY GROUPING SETS ((a), (b)) ORDER BY (a)", "", false},
		{"SELECT * FROM a JOIN (SELECT 1) b ON true WHERE x LIKE ('a%')", "", false},
		{"UPDATE t SET (a, b) = (1, 2)", "", false},
		{"EXPLAIN (ANALYZE) SELECT 1", "", false},
		{"COPY (SELECT 1) TO STDOUT", "", false},
		{"SELECT * FROM t FETCH FIRST (3) ROWS ONLY", "", false},
		{"SELECT a::varchar(10), b::character varying(3)", "", false},
		// Customized options under names no text shows: Calls.
		{`SELECT "set_config"('myapp.tenant', 'x', false)`, "", false},
		{"SELECT set_config(E'myapp.tenant', 'x', false)", "", false},
		{`SELECT set_config(E'myapp\\x2etenant', 'x', false)`, "", true},
		{"SELECT set_config($1, $2, false)", "", true},
		{"SELECT set_config($1, $2, true)", "", false},
		{"SELECT set_config('myapp.' || 'tenant', 'x', false)", "", true},
		{"SELECT set_config(lower('MYAPP.TENANT'), 'x', false)", "", true},
		{"SELECT set_config(U&'myapp.tenant', 'x', false)", "", true},
		{"SELECT set_config('myapp.tenant'::text, $1, false)", "", false},
		{"DO $$ BEGIN PERFORM set_config('myapp.tenant', 'x', false); END $$", "", true},
		{"SELECT app.set_tenant('x')", "", true},
	}
	for _, c := range cases {
		e := Scan(c.sql)
		if e.Pin != c.pin || e.Calls != c.calls {
			t.Errorf("Scan(%q): Pin %q, Calls %v; want %q, %v", c.sql, e.Pin, e.Calls, c.pin, c.calls)
		}
		if c.pin != "" {
			// The pinning word in a later statement counts too.
			if e := Scan("SELECT 1; " + c.sql); e.Pin != c.pin {
				t.Errorf("Scan(%q) as the second statement: Pin %q", c.sql, e.Pin)
			}
		}
	}
}

// TestCustomOptionsSpellings: the names CustomOptions reads.
func TestCustomOptionsSpellings(t *testing.T) {
	cases := []struct {
		sql  string
		want []string
	}{
		{`SELECT "set_config"('myapp.tenant', 'x', false)`, []string{"myapp.tenant"}},
		{`SELECT "pg_catalog"."set_config"('myapp.tenant', 'x', false)`, []string{"myapp.tenant"}},
		{"SELECT set_config(E'myapp.tenant', 'x', false)", []string{"myapp.tenant"}},
		{`SELECT set_config(E'myapp\\x2etenant', 'x', false)`, nil},
		{"SELECT set_config($1, 'x', false)", nil},
		{"SELECT set_config('myapp.tenant'::text, 'x', false)", []string{"myapp.tenant"}},
		{"SET a.b.c = 1", []string{"a.b.c"}},
		{`SET SESSION "A"."B" TO 1; RESET x . y`, []string{"a.b", "x.y"}},
		{"SET LOCAL a.b = 1", nil},
		{"SET /* c */ myapp.tenant = 'x'", []string{"myapp.tenant"}},
	}
	for _, c := range cases {
		got := CustomOptions(c.sql)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("CustomOptions(%q) = %q, want %q", c.sql, got, c.want)
		}
	}
}
