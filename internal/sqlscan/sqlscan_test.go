package sqlscan

import "testing"

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
		{"DISCARD ALL", Effects{Statements: 1, Settings: true, DeallocateAll: true, Unpin: true}},
		{"DISCARD TEMP", Effects{Statements: 1}},
		{"CREATE TEMP TABLE t (a int)", Effects{Statements: 1, Pin: PinTempTable}},
		{"create global temporary table t (a int)", Effects{Statements: 1, Pin: PinTempTable}},
		{"CREATE OR REPLACE TEMP VIEW v AS SELECT 1", Effects{Statements: 1, Pin: PinTempTable}},
		{"CREATE TABLE temp (a int)", Effects{Statements: 1}},
		{"CREATE TEMP TABLE t (x int) ON COMMIT DROP", Effects{Statements: 1}},
		{"CREATE TEMP TABLE t (x int) ON COMMIT DELETE ROWS", Effects{Statements: 1, Pin: PinTempTable}},
		{"SELECT * INTO TEMP t FROM x", Effects{Statements: 1, Pin: PinTempTable}},
		{"PREPARE p AS SELECT 1", Effects{Statements: 1, Pin: PinPrepare}},
		{"PREPARE TRANSACTION 'x'", Effects{Statements: 1}},
		{"LISTEN chan", Effects{Statements: 1, Pin: PinListen}},
		{"UNLISTEN *", Effects{Statements: 1}},
		{"SELECT pg_advisory_lock(1)", Effects{Statements: 1, Pin: PinAdvisoryLock}},
		{"SELECT pg_catalog.PG_TRY_ADVISORY_LOCK_SHARED(1)", Effects{Statements: 1, Pin: PinAdvisoryLock}},
		{"SELECT pg_advisory_xact_lock(1)", Effects{Statements: 1}},
		{"SELECT 'pg_advisory_lock(1)'", Effects{Statements: 1}},
		{"SELECT $$ pg_advisory_lock(1) $$", Effects{Statements: 1}},
		{"SELECT $f$ ; SET x = 1; $f$, $1", Effects{Statements: 1}},
		{"SELECT \"pg_advisory_lock\"(1)", Effects{Statements: 1}},
		{"-- SET x = 1\nSELECT 1 /* ; LISTEN x /* nested */ ; */", Effects{Statements: 1}},
		{"DECLARE c CURSOR WITH HOLD FOR SELECT 1", Effects{Statements: 1, Pin: PinCursorOnHold}},
		{"DECLARE c CURSOR FOR SELECT 1", Effects{Statements: 1}},
		{"BEGIN", Effects{Statements: 1, BeginTx: true}},
		{"start transaction read only", Effects{Statements: 1, BeginTx: true}},
		{"BEGIN; SELECT 1; COMMIT", Effects{Statements: 3}},
		{"BEGIN; SELECT 1", Effects{Statements: 2, BeginTx: true}},
		{"BEGIN; SAVEPOINT a; ROLLBACK TO a", Effects{Statements: 3, BeginTx: true}},
		{"BEGIN; SELECT 1; ROLLBACK", Effects{Statements: 3}},
		{"COMMIT AND CHAIN", Effects{Statements: 1}},
		{"BEGIN; COMMIT AND CHAIN", Effects{Statements: 2, BeginTx: true}},
		{"DEALLOCATE s1", Effects{Statements: 1, Deallocates: 1}},
		{"DEALLOCATE PREPARE \"S1\";", Effects{Statements: 1, Deallocates: 1}},
		{"DEALLOCATE ALL", Effects{Statements: 1, DeallocateAll: true}},
		{"DEALLOCATE s1; SELECT 1; deallocate s2", Effects{Statements: 3, Deallocates: 2}},
		{"SELECT E'\\'; LISTEN x'", Effects{Statements: 1}},
		{"SELECT 'it''s; LISTEN x'", Effects{Statements: 1}},
		{"SET a.b = 1; LISTEN x", Effects{Statements: 2, Settings: true, Pin: PinListen}},
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
	f.Fuzz(func(t *testing.T, s string) { _ = Scan(s) })
}

func BenchmarkScan(b *testing.B) {
	q := "SELECT abalance FROM pgbench_accounts WHERE aid = $1"
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
