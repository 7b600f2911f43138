package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/test/pgtest"
)

// TestPgbouncerIniDropIn starts the binary from a pgbouncer.ini that uses
// what the second drop-in round added: a Unix socket (unix_socket_dir,
// unix_socket_mode), a reserve pool, a per-database auth_user and
// auth_query, and a replication connection. It serves each of them; then
// `poolerd convert` turns the ini into YAML, and a poolerd started from
// that YAML serves the same.
func TestPgbouncerIniDropIn(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 2*time.Minute)
	const authPW, userPW = "dri-auth-pw", "dri-user-pw"
	authQueryRoles(ctx, t, "dri_auth", authPW, userPW, "dri_user")
	if err := pg.Exec(ctx, "postgres", `DO $$ BEGIN CREATE ROLE dri_repl LOGIN REPLICATION PASSWORD '`+pgtest.Password+`';
		EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	_, port, _ := net.SplitHostPort(listen)
	dir, sockDir := t.TempDir(), t.TempDir()
	// pool_size 1 with a reserve of 1: a second client waits 0.2 s, then
	// gets the reserve connection, well within query_wait_timeout.
	ini := fmt.Sprintf(`[databases]
app = host=%s port=%d dbname=%s pool_size=1 reserve_pool=1 auth_user=dri_auth auth_query='SELECT rolname::text, rolpassword FROM pg_catalog.pg_authid WHERE rolname = $1'

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir = %s
unix_socket_mode = 0700
auth_type = scram-sha-256
auth_file = userlist.txt
admin_users = dri_auth
pool_mode = transaction
reserve_pool_timeout = 0.2
query_wait_timeout = 5
`, pg.Host, pg.Port, pgtest.DBApp, port, sockDir)
	lcWrite(t, filepath.Join(dir, "pgbouncer.ini"), ini)
	lcWrite(t, filepath.Join(dir, "userlist.txt"), fmt.Sprintf("\"dri_auth\" %q\n\"dri_repl\" %q\n", authPW, pgtest.Password))

	sock := filepath.Join(sockDir, ".s.PGSQL."+port)
	serve := func(t *testing.T, proc *lcProc) {
		t.Helper()
		// dri_user is in no auth_file: the database's auth_query finds
		// it, over the Unix socket.
		sockDSN := fmt.Sprintf("host=%s port=%s user=dri_user password=%s dbname=app sslmode=disable", sockDir, port, userPW)
		a := connectRetry(t, ctx, sockDSN, proc)
		if got := scalarText(t, a, "SELECT current_user"); got != "dri_user" {
			t.Errorf("over the Unix socket: current_user %q, want dri_user", got)
		}
		if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("the Unix socket %s: %v %v, want mode 0700", sock, fi.Mode(), err)
		}
		// The reserve: A holds the pool's one connection in a
		// transaction; B's query is served by the reserve connection.
		if _, err := a.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		b, err := pgx.Connect(ctx, fmt.Sprintf("postgres://dri_user:%s@%s/app?sslmode=disable", userPW, listen))
		if err != nil {
			t.Fatalf("a second client: %v", err)
		}
		defer b.Close(context.Background())
		start := time.Now()
		if got := scalarText(t, b, "SELECT 'served'"); got != "served" {
			t.Errorf("the second client's query: %q", got)
		}
		if waited := time.Since(start); waited < 150*time.Millisecond {
			t.Errorf("the second client was served after %s: before reserve_pool_timeout, so not by the reserve", waited)
		}
		if _, err := a.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
		// A replication connection, passed through to PostgreSQL.
		rc, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://dri_repl:%s@%s/app?sslmode=disable&replication=database", pgtest.Password, listen))
		if err != nil {
			t.Fatalf("replication connection: %v", err)
		}
		defer rc.Close(context.Background())
		res, err := rc.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][3]) != pgtest.DBApp {
			t.Errorf("IDENTIFY_SYSTEM through poolerd: %v %v, want one row naming database %s", res, err, pgtest.DBApp)
		}
	}
	stop := func(t *testing.T, proc *lcProc) {
		t.Helper()
		if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, _ := proc.wait(t, 15*time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, proc.stderr.String())
		}
	}

	proc := lcStartBinaryIn(t, bin, dir, nil, "--config", filepath.Join(dir, "pgbouncer.ini"), "--http-listen=")
	t.Run("ini", func(t *testing.T) { serve(t, proc) })
	if out := proc.stderr.String(); strings.Contains(out, "does not honour") {
		t.Errorf("settings reported as not honoured:\n%s", out)
	}
	stop(t, proc)

	conv := exec.CommandContext(ctx, bin, "convert", "pgbouncer.ini")
	conv.Dir = dir
	yml, err := conv.Output()
	if err != nil {
		t.Fatalf("poolerd convert: %v", err)
	}
	for _, want := range []string{"unix_socket_dir: " + sockDir, "reserve_pool_timeout: 200ms", "auth_query: 'SELECT rolname::text"} {
		if !strings.Contains(string(yml), want) {
			t.Errorf("the converted YAML lacks %q:\n%s", want, yml)
		}
	}
	lcWrite(t, filepath.Join(dir, "poolerd.yaml"), string(yml))
	proc = lcStartBinaryIn(t, bin, dir, nil, "--config", filepath.Join(dir, "poolerd.yaml"), "--http-listen=")
	t.Run("converted", func(t *testing.T) { serve(t, proc) })
	stop(t, proc)
}
