package integration

// Tests driven by PostgreSQL's own client programs, psql and pgbench.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// needTool returns the path of a client program or skips the test.
func needTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not on PATH", name)
	}
	return path
}

// toolCmd prepares a libpq program to run against poolerd as app on
// database db, in dir, with only the PG* environment set here.
func (p *instance) toolCmd(t *testing.T, ctx context.Context, db, dir, name string, args ...string) *exec.Cmd {
	t.Helper()
	host, port, err := net.SplitHostPort(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env,
		"PGHOST="+host, "PGPORT="+port, "PGUSER="+pgtest.RoleApp, "PGPASSWORD="+pgtest.Password,
		"PGDATABASE="+db, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10", "PGAPPNAME=poolerd-it",
		"PSQLRC=/dev/null")
	return cmd
}

// runToolErr runs a libpq program (see toolCmd) and returns its stdout,
// stderr and exit error.
func (p *instance) runToolErr(t *testing.T, timeout time.Duration, db, dir, name string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := p.toolCmd(t, ctx, db, dir, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s: %s", filepath.Base(name), strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return stdout.String(), stderr.String(), err
}

// runTool is runToolErr for a program that must succeed.
func (p *instance) runTool(t *testing.T, timeout time.Duration, db, dir, name string, args ...string) (string, string) {
	t.Helper()
	stdout, stderr, err := p.runToolErr(t, timeout, db, dir, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout, stderr
}

var (
	pgbenchTPS    = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	pgbenchFailed = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	pgbenchXacts  = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
)

// pgbench -i and select-only runs in the simple and extended protocols.
func TestToolsPgbench(t *testing.T) {
	pgbench := needTool(t, "pgbench")
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MaxSize = 5 })
	// pgbench's tables have fixed names: use database other, where no
	// other test of this package creates them.
	const db = pgtest.DBOther
	dir := t.TempDir()
	_, stderr := p.runTool(t, 60*time.Second, db, dir, pgbench, "-i", "-s", "1", "-q")
	if !strings.Contains(stderr, "done") {
		t.Fatalf("pgbench -i did not report done:\n%s", stderr)
	}
	ctx := ctxTimeout(t, 10*time.Second)
	c := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, db, txExecMode))
	var accounts int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pgbench_accounts").Scan(&accounts); err != nil {
		t.Fatal(err)
	}
	if accounts != 100000 {
		t.Fatalf("pgbench_accounts has %d rows, want 100000", accounts)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.Exec(ctx, "DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history")
	})

	for _, mode := range []string{"simple", "extended"} {
		out, stderr := p.runTool(t, 60*time.Second, db, dir, pgbench, "-S", "-M", mode, "-c", "20", "-j", "2", "-T", "3", "-n")
		m := pgbenchTPS.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("-M %s: no tps in output:\n%s\n%s", mode, out, stderr)
		}
		tps, _ := strconv.ParseFloat(m[1], 64)
		if tps <= 0 {
			t.Fatalf("-M %s: tps %v", mode, tps)
		}
		if f := pgbenchFailed.FindStringSubmatch(out); f == nil || f[1] != "0" {
			t.Fatalf("-M %s: failed transactions: %v\n%s\n%s", mode, f, out, stderr)
		}
		x := pgbenchXacts.FindStringSubmatch(out)
		if x == nil || x[1] == "0" {
			t.Fatalf("-M %s: transactions processed: %v\n%s", mode, x, out)
		}
		if strings.Contains(stderr, "ERROR") || strings.Contains(stderr, "FATAL") {
			t.Fatalf("-M %s: errors reported:\n%s", mode, stderr)
		}
		t.Logf("-M %s: tps %.0f, %s transactions", mode, tps, x[1])
	}
	st := p.poolStats(t, db, pgtest.RoleApp)
	if st.Total > 5 || st.PeakActive > 5 {
		t.Fatalf("pool exceeded max_size: %+v", st)
	}
	p.waitNoActive(t, db)
}

// psql with several statements in one -c, and \copy in and out.
func TestToolsPsql(t *testing.T) {
	psql := needTool(t, "psql")
	t.Parallel()
	p := startPoolerd(t, nil)
	dir := t.TempDir()

	out, _ := p.runTool(t, 20*time.Second, pgtest.DBApp, dir, psql, "-X", "-At", "-v", "ON_ERROR_STOP=1",
		"-c", "SELECT 1; SELECT 2", "-c", "SELECT 'three' AS x, current_user")
	if out != "1\n2\nthree|app\n" {
		t.Fatalf("psql -c output %q", out)
	}

	// An error in the middle of a -c: psql reports it and exits 1, and
	// the following statements of that string do not run.
	stdout, stderr, err := p.runToolErr(t, 20*time.Second, pgtest.DBApp, dir, psql, "-X", "-At", "-v", "ON_ERROR_STOP=1",
		"-c", "SELECT 1; SELECT 1/0; SELECT 3")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("psql with a failing statement: want exit status 1, got %v", err)
	}
	if strings.Contains(stdout, "3") || !strings.Contains(stderr, "division by zero") {
		t.Fatalf("psql with a failing statement: stdout %q stderr %q", stdout, stderr)
	}
	// The session is still fine for the next psql.
	out, _ = p.runTool(t, 20*time.Second, pgtest.DBApp, dir, psql, "-X", "-At", "-c", "SELECT 40 + 2")
	if out != "42\n" {
		t.Fatalf("psql after a failure: %q", out)
	}

	tbl := relayName("it")
	var in strings.Builder
	sum := 0
	for i := 1; i <= 2000; i++ {
		fmt.Fprintf(&in, "%d,\"line %d, with comma\",%s\n", i, i, strings.Repeat("x", i%50))
		sum += i
	}
	if err := os.WriteFile(filepath.Join(dir, "in.csv"), []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`CREATE TABLE %[1]s (id int, a text, b text);
\copy %[1]s from 'in.csv' with (format csv)
SELECT count(*), sum(id) FROM %[1]s;
\copy (SELECT id, a, b FROM %[1]s ORDER BY id) to 'out.csv' with (format csv)
DROP TABLE %[1]s;
`, tbl)
	if err := os.WriteFile(filepath.Join(dir, "script.sql"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		dc, err := pgx.Connect(ctx, directDSN(pgtest.DBApp))
		if err == nil {
			_, _ = dc.Exec(context.Background(), "DROP TABLE IF EXISTS "+tbl)
			_ = dc.Close(context.Background())
		}
	})
	out, _ = p.runTool(t, 30*time.Second, pgtest.DBApp, dir, psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-f", "script.sql")
	want := fmt.Sprintf("CREATE TABLE\nCOPY 2000\n2000|%d\nCOPY 2000\nDROP TABLE\n", sum)
	if out != want {
		t.Fatalf("psql script output %q, want %q", out, want)
	}
	got, err := os.ReadFile(filepath.Join(dir, "out.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != in.String() {
		t.Fatalf("\\copy out differs from what \\copy in loaded (%d vs %d bytes)", len(got), in.Len())
	}
	p.waitNoActive(t, pgtest.DBApp)
}
