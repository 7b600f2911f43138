package integration

// Starting from PgBouncer's packaged sample, and restarts and upgrades that
// drop nobody: so_reuseport and the hand-over of the listening socket
// (takeover_socket, poolerd --takeover), on the real binary.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/test/pgtest"
)

// debianSample is the pgbouncer.ini Debian's pgbouncer package installs as
// /etc/pgbouncer/pgbouncer.ini, unchanged.
const debianSample = "../../internal/pgbini/testdata/debian-pgbouncer.ini"

// TestDebianSampleStarts starts the binary with Debian's sample
// pgbouncer.ini as it is shipped: no database, an empty userlist. As
// PgBouncer, poolerd starts and serves its refusals: a client of any
// database gets FATAL 3D000 "no such database", and nobody can log in to
// the admin console (auth_type md5, no password anywhere). Only the port
// is set on the command line (6432 may be taken where the tests run), the
// HTTP endpoint is turned off, the sample's unix_socket_dir
// (/var/run/postgresql) is a temporary directory (POOLERD_UNIX_SOCKET_DIR),
// where a client of the Unix socket gets the same refusal, and where the
// package is not installed the empty userlist is a temporary one.
func TestDebianSampleStarts(t *testing.T) {
	t.Parallel()
	if real, err := os.ReadFile("/etc/pgbouncer/pgbouncer.ini"); err == nil {
		shipped, err := os.ReadFile(debianSample)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(real, shipped) {
			t.Logf("note: /etc/pgbouncer/pgbouncer.ini differs from %s; testing the copy", debianSample)
		}
	}
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	args := []string{"--config", debianSample, "--listen", listen, "--http-listen="}
	if _, err := os.Stat("/etc/pgbouncer/userlist.txt"); err != nil {
		empty := t.TempDir() + "/userlist.txt"
		lcWrite(t, empty, "")
		args = append(args, "--auth-file", empty)
	}
	sockDir := t.TempDir()
	// The sample's logfile (/var/log/postgresql/pgbouncer.log) is a
	// temporary file too.
	logFile := filepath.Join(sockDir, "pgbouncer.log")
	// So are its pidfile (/var/run/postgresql/pgbouncer.pid) and its
	// syslog (off in the sample).
	pidFile := filepath.Join(sockDir, "pgbouncer.pid")
	proc := lcStartBinaryEnv(t, bin, []string{"POOLERD_UNIX_SOCKET_DIR=" + sockDir, "POOLERD_LOG_FILE=" + logFile, "POOLERD_PIDFILE=" + pidFile}, args...)
	_, port, _ := net.SplitHostPort(listen)

	loginAt := func(dsn, db string) *pgconn.PgError {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := pgconn.Connect(ctx, dsn)
			cancel()
			if err == nil {
				_ = c.Close(context.Background())
				t.Fatalf("login to %s succeeded, want it refused", db)
			}
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				return pe
			}
			if time.Now().After(deadline) {
				t.Fatalf("login to %s: %v\n%s", db, err, proc.stderr.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	login := func(db string) *pgconn.PgError {
		t.Helper()
		return loginAt("postgres://someone:secret@"+listen+"/"+db+"?sslmode=disable", db)
	}
	pe := login("appdb")
	if st, err := os.Stat(filepath.Join(sockDir, ".s.PGSQL."+port)); err != nil || st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o777 {
		t.Errorf("the sample's Unix socket: %v, %v (want a socket, mode 0777)", st, err)
	}
	if pe := loginAt("host="+sockDir+" port="+port+" user=someone password=secret dbname=appdb", "appdb"); pe.Code != "3D000" {
		t.Errorf("login to appdb over the Unix socket: %s %s %q, want 3D000", pe.Severity, pe.Code, pe.Message)
	}
	if pe.Severity != "FATAL" || pe.Code != "3D000" || pe.Message != "no such database: appdb" || !strings.Contains(pe.Hint, "[databases]") {
		t.Errorf("login to appdb: %s %s %q hint %q, want FATAL 3D000 no such database: appdb", pe.Severity, pe.Code, pe.Message, pe.Hint)
	}
	if pe := login("pgbouncer"); pe.Code != "28P01" {
		t.Errorf("login to the admin console: %s %s %q, want 28P01 (an empty userlist lets nobody in)", pe.Severity, pe.Code, pe.Message)
	}
	out := proc.stderr.String()
	if b, err := os.ReadFile(logFile); err != nil || !strings.Contains(string(b), "no databases: every client") {
		t.Errorf("the sample's logfile: %v\n%s", err, b)
	}
	for _, want := range []string{"no databases: every client but the admin console's is refused", "auth_type md5 needs client passwords"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Every setting of the sample is honoured (its pidfile included).
	if strings.Contains(out, "settings poolerd does not honour") {
		t.Errorf("settings of Debian's sample not honoured:\n%s", out)
	}
	if b, err := os.ReadFile(pidFile); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(proc.cmd.Process.Pid) {
		t.Errorf("pidfile: %q %v", b, err)
	}
	if err := proc.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code, _ := proc.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGINT; output:\n%s", code, proc.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(sockDir, ".s.PGSQL."+port)); !os.IsNotExist(err) {
		t.Errorf("the Unix socket file after exit: %v", err)
	}
}

// upgradeStart runs the binary from a YAML file holding yaml, in front of
// the test PostgreSQL on listen, and returns the DSN clients use.
func upgradeStart(t *testing.T, bin, listen, yaml string, extra ...string) (*lcProc, string) {
	t.Helper()
	upstream := pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	file := filepath.Join(t.TempDir(), "poolerd.yaml")
	lcWrite(t, file, yaml)
	args := append([]string{"--config", file, "--listen", listen, "--http-listen=", "--upstream", upstream, "--pool-mode", "transaction"}, extra...)
	proc := lcStartBinary(t, bin, args...)
	u, _ := url.Parse(upstream)
	u.Host = listen
	return proc, u.String()
}

// waitOutput waits until the process has written want.
func waitOutput(t *testing.T, p *lcProc, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(p.stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("poolerd did not log %q:\n%s", want, p.stderr.String())
		}
		select {
		case <-p.done:
			t.Fatalf("poolerd exited before logging %q:\n%s", want, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// connectLoop runs clients that each connect, run SELECT 1 and disconnect,
// over and over, until stop is called; stop returns how many rounds
// succeeded and the failures.
func connectLoop(t *testing.T, dsn string, clients int) (stop func() (int, []error)) {
	t.Helper()
	var (
		mu   sync.Mutex
		ok   int
		errs []error
		wg   sync.WaitGroup
	)
	done := make(chan struct{})
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				err := func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					c, err := pgconn.Connect(ctx, dsn)
					if err != nil {
						return fmt.Errorf("connect: %w", err)
					}
					defer c.Close(context.Background())
					if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
						return fmt.Errorf("SELECT 1: %w", err)
					}
					return nil
				}()
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ok++
				}
				mu.Unlock()
			}
		}()
	}
	return func() (int, []error) {
		close(done)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return ok, errs
	}
}

// checkRounds stops a connectLoop and fails the test for each failed round,
// and if fewer than 50 ran (the loop proves little then).
func checkRounds(t *testing.T, what string, stop func() (int, []error)) {
	t.Helper()
	checkRoundsMin(t, what, stop, 50)
}

// checkRoundsMin is checkRounds with a floor of min rounds.
func checkRoundsMin(t *testing.T, what string, stop func() (int, []error), min int) {
	t.Helper()
	n, errs := stop()
	t.Logf("%d connect + SELECT 1 rounds%s, %d failed", n, what, len(errs))
	for i, err := range errs {
		if i < 5 {
			t.Errorf("round failed: %v", err)
		}
	}
	if n < min {
		t.Errorf("only %d rounds%s (want %d)", n, what, min)
	}
}

// TestSOReusePort: with so_reuseport two poolerd processes bind one port;
// the first is stopped with SIGINT while clients keep connecting, and not
// one connection or query fails: the second serves them all from then on.
func TestSOReusePort(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	const yaml = "so_reuseport: true\n"
	old, dsn := upgradeStart(t, bin, listen, yaml)
	connectRetry(t, ctxTimeout(t, 15*time.Second), dsn, old)
	stop := connectLoop(t, dsn, 4)
	time.Sleep(500 * time.Millisecond)
	next, _ := upgradeStart(t, bin, listen, yaml)
	waitOutput(t, next, "poolerd starting")
	time.Sleep(time.Second) // both accept
	if err := old.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code, _ := old.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("old poolerd: exit %d after SIGINT\n%s", code, old.stderr.String())
	}
	time.Sleep(time.Second) // the new one alone
	checkRounds(t, "", stop)
	c := connectRetry(t, ctxTimeout(t, 10*time.Second), dsn, next)
	if _, err := c.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
		t.Fatalf("through the new poolerd: %v", err)
	}
}

// TestTakeoverListener: a poolerd started with --takeover gets the running
// one's listening sockets, TCP and Unix, over takeover_socket; the old one
// stops accepting, drains and exits; clients connecting all along, to
// either, see no failure, and the Unix socket's file stays. The new one
// offers the sockets in turn: a third takes them over the same way, and
// removes the file when it stops.
func TestTakeoverListener(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	sockDir := t.TempDir()
	yaml := "takeover_socket: " + filepath.Join(t.TempDir(), "takeover.sock") + "\nunix_socket_dir: " + sockDir + "\n"
	first, dsn := upgradeStart(t, bin, listen, yaml)
	_, port, _ := net.SplitHostPort(listen)
	sockFile := filepath.Join(sockDir, ".s.PGSQL."+port)
	unixDSN := fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=%s sslmode=disable", sockDir, port, pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	// Connected clients hold the old process up: it exits once they leave.
	_ = connectRetry(t, ctxTimeout(t, 15*time.Second), dsn, first).Close(context.Background())
	stop := connectLoop(t, dsn, 4)
	stopUnix := connectLoop(t, unixDSN, 2)
	prev := first
	for i := range 2 {
		time.Sleep(500 * time.Millisecond)
		next, _ := upgradeStart(t, bin, listen, yaml, "--takeover")
		waitOutput(t, next, "hand-over done")
		if code, _ := prev.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("upgrade %d: old poolerd exit %d\n%s", i+1, code, prev.stderr.String())
		}
		if !strings.Contains(prev.stderr.String(), "listening socket handed over to a new poolerd") {
			t.Errorf("upgrade %d: old poolerd's log:\n%s", i+1, prev.stderr.String())
		}
		if _, err := os.Stat(sockFile); err != nil {
			t.Fatalf("upgrade %d: the Unix socket file after the old poolerd exited: %v", i+1, err)
		}
		prev = next
	}
	time.Sleep(500 * time.Millisecond)
	checkRounds(t, " over two hand-overs", stop)
	checkRoundsMin(t, " over the Unix socket, over two hand-overs", stopUnix, 10)
	if err := prev.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code, _ := prev.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("last poolerd: exit %d after SIGINT\n%s", code, prev.stderr.String())
	}
	if _, err := os.Stat(sockFile); !os.IsNotExist(err) {
		t.Errorf("the Unix socket file after the last poolerd (which took it over) exited: %v", err)
	}
	// Without a running poolerd to take over from, --takeover refuses to
	// start rather than bind the port itself.
	lone, _ := upgradeStart(t, bin, lcFreeAddr(t), "takeover_socket: "+filepath.Join(t.TempDir(), "none.sock")+"\n", "--takeover")
	if code, _ := lone.wait(t, 15*time.Second); code == 0 || !strings.Contains(lone.stderr.String(), "no running poolerd answers") {
		t.Errorf("--takeover with nobody to take over from: exit %d\n%s", code, lone.stderr.String())
	}
}

// TestTakeoverPgbench measures an upgrade under load: pgbench -C (a new
// connection per transaction, as applications that connect per request
// or whose pools recycle connections) runs through poolerd while it is
// upgraded twice with --takeover. Not one transaction fails and no client
// is aborted. (Without -C pgbench keeps its connections: the old process
// ends them at their next idle point, and pgbench aborts those clients;
// docs/operations.md.)
func TestTakeoverPgbench(t *testing.T) {
	takeoverPgbench(t, "-C")
}

// TestTakeoverPgbenchConnected: pgbench clients that stay connected (no
// -C), in simple and prepared query mode, run through two upgrades without
// one failed transaction: each old poolerd passes its clients, with their
// prepared statements, to the new one at their next idle point.
func TestTakeoverPgbenchConnected(t *testing.T) {
	for _, mode := range []string{"simple", "prepared"} {
		t.Run(mode, func(t *testing.T) { takeoverPgbench(t, "-M", mode) })
	}
}

// takeoverPgbench runs pgbench (with extra flags) through two upgrades
// with --takeover and requires every transaction to succeed.
func takeoverPgbench(t *testing.T, extra ...string) {
	pgbench := needTool(t, "pgbench")
	t.Parallel()
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	dir := t.TempDir()
	yaml := "takeover_socket: " + filepath.Join(dir, "takeover.sock") + "\n"
	first, dsn := upgradeStart(t, bin, listen, yaml)
	_ = connectRetry(t, ctxTimeout(t, 15*time.Second), dsn, first).Close(context.Background())
	lcWrite(t, filepath.Join(dir, "select1.sql"), "SELECT 1;\n")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	host, port, _ := strings.Cut(listen, ":")
	args := append([]string{"-n", "-c", "8", "-j", "2", "-T", "8", "-f", "select1.sql"}, extra...)
	cmd := exec.CommandContext(ctx, pgbench, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "PGHOST="+host, "PGPORT="+port, "PGUSER="+pgtest.RoleApp, "PGPASSWORD="+pgtest.Password,
		"PGDATABASE="+pgtest.DBApp, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	prev := first
	for i := range 2 {
		time.Sleep(2 * time.Second)
		next, _ := upgradeStart(t, bin, listen, yaml, "--takeover")
		waitOutput(t, next, "hand-over done")
		if code, _ := prev.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("upgrade %d: old poolerd exit %d\n%s", i+1, code, prev.stderr.String())
		}
		if strings.Contains(prev.stderr.String(), "not handed over") {
			t.Errorf("upgrade %d: the old poolerd ended clients instead of passing them:\n%s", i+1, prev.stderr.String())
		}
		prev = next
	}
	err := cmd.Wait()
	out := stdout.String()
	x := pgbenchXacts.FindStringSubmatch(out)
	f := pgbenchFailed.FindStringSubmatch(out)
	tps := pgbenchTPS.FindStringSubmatch(out)
	if err != nil || x == nil || f == nil || f[1] != "0" || strings.Contains(stderr.String(), "aborted") {
		t.Fatalf("pgbench: %v\n%s\n%s", err, out, stderr.String())
	}
	t.Logf("pgbench %s -c 8 -T 8 through two hand-overs: %s transactions, %s failed, %s", strings.Join(extra, " "), x[1], f[1], tps[0])
}

// TestTakeoverSocketShutdown: a poolerd offering its listener on
// takeover_socket, stopped with SIGINT while a transaction is open, refuses
// new connections during the drain (the offer's duplicate of the socket is
// closed too) and removes the socket file.
func TestTakeoverSocketShutdown(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	listen := lcFreeAddr(t)
	sock := filepath.Join(t.TempDir(), "takeover.sock")
	proc, dsn := upgradeStart(t, bin, listen, "takeover_socket: "+sock+"\n")
	ctx := ctxTimeout(t, 30*time.Second)
	c := connectRetry(t, ctx, dsn, proc)
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := proc.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, proc, "shutting down: no new clients")
	deadline := time.Now().Add(5 * time.Second)
	for {
		nc, err := net.DialTimeout("tcp", listen, time.Second)
		if err != nil {
			break // refused
		}
		nc.Close()
		if time.Now().After(deadline) {
			t.Fatal("connections still accepted by the kernel during the drain")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("takeover_socket during the drain: %v", err)
	}
	if _, err := c.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT during the drain: %v", err)
	}
	if code, _ := proc.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, proc.stderr.String())
	}
}
