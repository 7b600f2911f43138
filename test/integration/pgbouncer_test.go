package integration

// What a PgBouncer user brings along: poolerd started from a pgbouncer.ini
// and a userlist.txt, and the signals of PgBouncer 1.23+ on the real
// binary.

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/test/pgtest"
)

// TestPgbouncerIni starts the binary from a pgbouncer.ini written as
// PgBouncer's documentation shows it, with a userlist.txt, in front of the
// test PostgreSQL, and serves a query through it, over TCP and over the
// Unix socket of unix_socket_dir; a database with a host list (host=a,b)
// serves too, and SHOW DATABASES shows it as PgBouncer does.
func TestPgbouncerIni(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	_, port, _ := net.SplitHostPort(listen)
	dir, sockDir := t.TempDir(), t.TempDir()
	ini := fmt.Sprintf(`;; pgbouncer.ini
[databases]
appdb = host=%s port=%d dbname=%s client_encoding=UNICODE
multi = host=%s,localhost port=%d dbname=%s
* = host=%s port=%d

[users]
%s = pool_mode=transaction max_user_connections=5

[pgbouncer]
logfile = pgbouncer.log
pidfile = pgbouncer.pid
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir = %s
auth_type = scram-sha-256
auth_file = userlist.txt
admin_users = %s
default_pool_size = 4
server_idle_timeout = 60
query_wait_timeout = 10
%%include extra.ini
`, pg.Host, pg.Port, pgtest.DBApp, pg.Host, pg.Port, pgtest.DBApp, pg.Host, pg.Port, pgtest.RoleApp, port, sockDir, pgtest.RoleApp)
	lcWrite(t, filepath.Join(dir, "pgbouncer.ini"), ini)
	lcWrite(t, filepath.Join(dir, "extra.ini"), "idle_transaction_timeout = 30.5\ntcp_defer_accept = 1\n")
	lcWrite(t, filepath.Join(dir, "userlist.txt"), fmt.Sprintf("%q %q\n", pgtest.RoleApp, pgtest.Password))

	// Started in the ini's directory, where PgBouncer takes the ini's
	// relative file names from (logfile, auth_file).
	proc := lcStartBinaryIn(t, bin, dir, nil, "--config", filepath.Join(dir, "pgbouncer.ini"), "--http-listen=")
	ctx := ctxTimeout(t, 30*time.Second)
	dsn := fmt.Sprintf("postgres://%s:%s@%s/appdb?sslmode=disable", pgtest.RoleApp, url.QueryEscape(pgtest.Password), listen)
	c := connectRetry(t, ctx, dsn, proc)
	var db string
	if err := c.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if db != pgtest.DBApp {
		t.Errorf("current_database %q, want %q", db, pgtest.DBApp)
	}
	// The Unix socket, and the database with a host list.
	sock := fmt.Sprintf("host=%s port=%s user=%s password=%s sslmode=disable dbname=", sockDir, port, pgtest.RoleApp, pgtest.Password)
	cm, err := pgx.Connect(ctx, sock+"multi")
	if err != nil {
		t.Fatalf("database multi over the Unix socket: %v", err)
	}
	defer cm.Close(context.Background())
	if err := cm.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != pgtest.DBApp {
		t.Errorf("database multi: %q, %v", db, err)
	}
	admin, err := pgx.Connect(ctx, sock+"pgbouncer")
	if err != nil {
		t.Fatalf("the admin console over the Unix socket: %v", err)
	}
	defer admin.Close(context.Background())
	var host, balance string
	rows, err := admin.Query(ctx, "SHOW DATABASES", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatalf("SHOW DATABASES: %v", err)
	}
	for rows.Next() {
		if v := rows.RawValues(); string(v[0]) == "multi" {
			host, balance = string(v[1]), string(v[10]) // host, load_balance_hosts
		}
	}
	rows.Close()
	if want := fmt.Sprintf("%s:%d,localhost:%d", pg.Host, pg.Port, pg.Port); host != want || balance != "round-robin" {
		t.Errorf("SHOW DATABASES multi: host %q load_balance_hosts %q, want %q and round-robin", host, balance, want)
	}
	_ = admin.Close(ctx)
	_ = cm.Close(ctx)
	// logfile (relative: in the working directory) gets the log too, in PgBouncer's
	// format (log_format defaults to pgbouncer for an ini); SIGHUP opens it
	// again after a rotation renamed it.
	logPath := filepath.Join(dir, "pgbouncer.log")
	if b, err := os.ReadFile(logPath); err != nil || !strings.Contains(string(b), "poolerd starting") {
		t.Fatalf("logfile %s: %v\n%s", logPath, err, b)
	}
	pgbLines := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \[\d+\] LOG C-0x[0-9a-f]+: multi/` + pgtest.RoleApp + `@unix closing because: client close request \(age=\d+s\)$`),
		regexp.MustCompile(`(?m)^\S+ \S+ \S+ \[\d+\] LOG S-0x[0-9a-f]+: appdb/` + pgtest.RoleApp + `@\S+:\d+ new connection to server \(from \S+:\d+\)$`),
		regexp.MustCompile(`(?m)^\S+ \S+ \S+ \[\d+\] LOG C-0x[0-9a-f]+: appdb/` + pgtest.RoleApp + `@127\.0\.0\.1:\d+ login attempt: db=appdb user=` + pgtest.RoleApp + ` tls=no$`),
	}
	eventually(t, 10*time.Second, "PgBouncer's log lines in the logfile", func() bool {
		b, _ := os.ReadFile(logPath)
		for _, re := range pgbLines {
			if !re.Match(b) {
				return false
			}
		}
		return true
	})
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := proc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, proc, "SIGHUP received")
	if b, err := os.ReadFile(logPath); err != nil || !strings.Contains(string(b), "SIGHUP received") {
		t.Errorf("logfile after the rotation and SIGHUP: %v\n%s", err, b)
	}
	out := proc.stderr.String()
	for _, want := range []string{"pgbouncer.ini settings poolerd does not honour", "tcp_defer_accept (extra.ini:2)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "settings poolerd does not honour"); n != 1 {
		t.Errorf("%d warnings about settings not honoured, want 1", n)
	}
	for _, honoured := range []string{"client_encoding", "pidfile"} {
		if strings.Contains(out, honoured+" (") {
			t.Errorf("%s reported as not honoured:\n%s", honoured, out)
		}
	}
	// pidfile (relative: beside the ini) names the process while it runs,
	// and goes with it.
	pidPath := filepath.Join(dir, "pgbouncer.pid")
	if b, err := os.ReadFile(pidPath); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(proc.cmd.Process.Pid) {
		t.Errorf("pidfile %s: %q %v, want %d", pidPath, b, err, proc.cmd.Process.Pid)
	}
	_ = c.Close(ctx)
	if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, _ := proc.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, proc.stderr.String())
	}
	if _, err := os.Stat(pidPath); !os.IsNotExist(err) {
		t.Errorf("pidfile left after the exit: %v", err)
	}
}

func lcWrite(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// connectRetry connects to dsn, retrying while the binary starts.
func connectRetry(t *testing.T, ctx context.Context, dsn string, proc *lcProc) *pgx.Conn {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := pgx.Connect(ctx, dsn)
		if err == nil {
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("cannot connect through poolerd: %v\n%s", err, proc.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSignalsLikePgBouncer sends each signal to the real binary: SIGTERM
// waits for the clients to leave, SIGINT for the transactions to end,
// SIGQUIT for nothing; a second shutdown signal exits at once; SIGUSR1 and
// SIGUSR2 pause and resume. (SIGHUP: TestReloadSIGHUP.)
func TestSignalsLikePgBouncer(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	upstream := pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	direct := appDirect(t)
	ctx := ctxTimeout(t, 120*time.Second)
	if _, err := direct.Exec(ctx, "CREATE TABLE IF NOT EXISTS signals_binary (sig text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, "DELETE FROM signals_binary"); err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T) (*lcProc, string) {
		listen := lcFreeAddr(t)
		proc := lcStartBinary(t, bin, "--listen", listen, "--http-listen=", "--upstream", upstream)
		u, _ := url.Parse(upstream)
		u.Host = listen
		return proc, u.String() + "&" + txExecMode
	}
	rows := func(sig string) int {
		var n int
		if err := direct.QueryRow(ctx, "SELECT count(*) FROM signals_binary WHERE sig = $1", sig).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	running := func(p *lcProc) bool {
		select {
		case <-p.done:
			return false
		default:
			return true
		}
	}

	t.Run("SIGTERM waits for clients", func(t *testing.T) {
		proc, dsn := start(t)
		c := connectRetry(t, ctx, dsn, proc)
		idle := connectRetry(t, ctx, dsn, proc)
		if _, err := c.Exec(ctx, "BEGIN; INSERT INTO signals_binary VALUES ('term')"); err != nil {
			t.Fatal(err)
		}
		if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if _, err := c.Exec(ctx, "INSERT INTO signals_binary VALUES ('term')"); err != nil {
			t.Fatalf("statement inside the transaction after SIGTERM: %v", err)
		}
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatalf("COMMIT after SIGTERM: %v", err)
		}
		pgxQueryFails(t, c) // active after SIGTERM: ended at its idle point
		if _, err := pgx.Connect(ctx, dsn); err == nil {
			t.Error("a new connection was accepted after SIGTERM")
		}
		time.Sleep(time.Second)
		if !running(proc) {
			t.Fatalf("poolerd exited while a client was still connected; output:\n%s", proc.stderr.String())
		}
		_ = idle.Close(ctx)
		if code, _ := proc.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, proc.stderr.String())
		}
		if n := rows("term"); n != 2 {
			t.Errorf("%d rows committed, want 2", n)
		}
		if !strings.Contains(proc.stderr.String(), "SIGTERM: no new clients; exiting when the connected ones have left") {
			t.Errorf("no SIGTERM line:\n%s", proc.stderr.String())
		}
	})

	t.Run("second SIGTERM exits at once", func(t *testing.T) {
		proc, dsn := start(t)
		connectRetry(t, ctx, dsn, proc)
		_ = proc.cmd.Process.Signal(syscall.SIGTERM)
		time.Sleep(500 * time.Millisecond)
		if !running(proc) {
			t.Fatal("poolerd exited at the first SIGTERM with a client connected")
		}
		_ = proc.cmd.Process.Signal(syscall.SIGTERM)
		if code, took := proc.wait(t, 10*time.Second); code != 0 || took > 8*time.Second {
			t.Fatalf("exit code %d after %s; output:\n%s", code, took, proc.stderr.String())
		}
		if !strings.Contains(proc.stderr.String(), "second signal: exiting at once") {
			t.Errorf("no second-signal line:\n%s", proc.stderr.String())
		}
	})

	t.Run("SIGINT waits for transactions", func(t *testing.T) {
		proc, dsn := start(t)
		c := connectRetry(t, ctx, dsn, proc)
		connectRetry(t, ctx, dsn, proc) // idle: ended at once, does not hold the exit
		if _, err := c.Exec(ctx, "BEGIN; INSERT INTO signals_binary VALUES ('int')"); err != nil {
			t.Fatal(err)
		}
		if err := proc.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if _, err := c.Exec(ctx, "INSERT INTO signals_binary VALUES ('int')"); err != nil {
			t.Fatalf("statement inside the transaction after SIGINT: %v", err)
		}
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatalf("COMMIT after SIGINT: %v", err)
		}
		pgxQueryFails(t, c)
		if code, _ := proc.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGINT; output:\n%s", code, proc.stderr.String())
		}
		if n := rows("int"); n != 2 {
			t.Errorf("%d rows committed, want 2", n)
		}
	})

	t.Run("SIGQUIT exits at once", func(t *testing.T) {
		proc, dsn := start(t)
		c := connectRetry(t, ctx, dsn, proc)
		if _, err := c.Exec(ctx, "BEGIN; INSERT INTO signals_binary VALUES ('quit')"); err != nil {
			t.Fatal(err)
		}
		if err := proc.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
			t.Fatal(err)
		}
		code, took := proc.wait(t, 10*time.Second)
		if code != 0 || took > 8*time.Second {
			t.Fatalf("exit code %d after %s; output:\n%s", code, took, proc.stderr.String())
		}
		pgxQueryFails(t, c)
		eventually(t, 10*time.Second, "the open transaction rolled back", func() bool {
			var n int
			_ = direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO signals_binary%' AND datname = current_database()").Scan(&n)
			return n == 0
		})
		if n := rows("quit"); n != 0 {
			t.Errorf("%d rows of the transaction cut by SIGQUIT committed, want 0", n)
		}
		if !strings.Contains(proc.stderr.String(), "SIGQUIT: immediate shutdown") {
			t.Errorf("no immediate-shutdown line:\n%s", proc.stderr.String())
		}
	})

	t.Run("SIGUSR1 pauses, SIGUSR2 resumes", func(t *testing.T) {
		proc, dsn := start(t)
		c := connectRetry(t, ctx, dsn, proc)
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if err := proc.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "paused", func() bool { return strings.Contains(proc.stderr.String(), "\tpaused\t") })
		answered := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, "SELECT 2")
			answered <- err
		}()
		select {
		case err := <-answered:
			t.Fatalf("a query was answered while paused (err %v)", err)
		case <-time.After(700 * time.Millisecond):
		}
		if err := proc.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-answered:
			if err != nil {
				t.Fatalf("query after SIGUSR2: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("query still waiting 10s after SIGUSR2; output:\n%s", proc.stderr.String())
		}
		if !running(proc) {
			t.Fatal("poolerd exited on SIGUSR1/SIGUSR2")
		}
		_ = proc.cmd.Process.Signal(syscall.SIGQUIT)
		proc.wait(t, 10*time.Second)
	})
}
