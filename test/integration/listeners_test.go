package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/test/pgtest"
)

// TestListeners: the binary listens on every address of listen and on a
// Unix socket in unix_socket_dir, .s.PGSQL.<the first address's port>, with
// unix_socket_mode; access rules tell the two kinds of client apart: a
// local rule (trust) admits Unix-socket clients without a password, a host
// rule (reject) refuses TCP clients of 127.0.0.1 on either port. It runs
// with event_loops on (the test does not check which loop, if any, a
// Unix-socket session lands on: only that it is served).
func TestListeners(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	a1, a2 := lcFreeAddr(t), lcFreeAddr(t)
	sockDir := t.TempDir()
	file := filepath.Join(t.TempDir(), "poolerd.yaml")
	lcWrite(t, file, fmt.Sprintf(`listen: %s, %s
unix_socket_dir: %s
unix_socket_mode: "0700"
pool_mode: transaction
event_loops: "2"
auth_type: hba
auth_hba_rules:
  - {type: local, database: all, user: all, method: trust}
  - {type: host, database: all, user: all, address: 127.0.0.1/32, method: reject}
`, a1, a2, sockDir))
	proc := lcStartBinary(t, bin, "--config", file, "--http-listen=", "--upstream", pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	_, port, _ := net.SplitHostPort(a1)
	sock := filepath.Join(sockDir, ".s.PGSQL."+port)

	// attempt logs in with dsn and runs SELECT 1: nil, or the error.
	attempt := func(dsn string) error {
		t.Helper()
		c, err := connectAnswered(t, proc, dsn)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctxTimeout(t, 5*time.Second), "SELECT 1").ReadAll()
		return err
	}
	unixDSN := fmt.Sprintf("host=%s port=%s user=%s password=wrong dbname=%s sslmode=disable", sockDir, port, pgtest.RoleApp, pgtest.DBApp)
	if err := attempt(unixDSN); err != nil {
		t.Fatalf("over the Unix socket (local trust): %v\n%s", err, proc.stderr.String())
	}
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o700 {
		t.Fatalf("the Unix socket %s: %v, %v (want a socket, mode 0700)", sock, st, err)
	}
	for _, a := range []string{a1, a2} {
		err := attempt(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", pgtest.RoleApp, pgtest.Password, a, pgtest.DBApp))
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "28000" || !strings.Contains(pe.Message, "rejects connection for host \"127.0.0.1\"") {
			t.Errorf("over TCP at %s: %v, want 28000 rejected by the host rule", a, err)
		}
	}
	if out := proc.stderr.String(); !strings.Contains(out, a1) || !strings.Contains(out, a2) || !strings.Contains(out, sock) {
		t.Errorf("the startup log does not name every listener (%s, %s, %s):\n%s", a1, a2, sock, out)
	}
}

// TestPeerAuth: peer authentication of Unix-socket clients (SO_PEERCRED):
// a client logs in as the database user of its operating-system user's
// name, or as one an ident map (auth_ident_file, map=) lets it; any other
// user is refused with PostgreSQL's message and a DETAIL naming the
// operating-system user or the map. The database entry forces the server
// user, so that who the client is decides nothing on the server.
func TestPeerAuth(t *testing.T) {
	t.Parallel()
	me, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	bin := lcBuildBinary(t)
	addr := lcFreeAddr(t)
	sockDir := t.TempDir()
	dir := t.TempDir()
	ident := filepath.Join(dir, "ident.conf")
	lcWrite(t, ident, fmt.Sprintf("# map  system user  database user\nm  %q  mapped\nm  /^(.*)$  \\1_alias\nother  someone_else  mapped_only\n", me.Username))
	file := filepath.Join(dir, "poolerd.yaml")
	lcWrite(t, file, fmt.Sprintf(`listen: %s
unix_socket_dir: %s
pool_mode: transaction
auth_type: hba
auth_ident_file: %s
auth_hba_rules:
  - {type: local, database: all, user: "mapped,%s_alias", method: peer, map: m}
  - {type: local, database: all, user: mapped_only, method: peer, map: other}
  - {type: local, database: all, user: all, method: peer}
  - {type: host, database: all, user: all, address: all, method: reject}
databases:
  - name: app
    host: %s
    port: %d
    dbname: %s
    user: %s
    password: %s
`, addr, sockDir, ident, me.Username, pg.Host, pg.Port, pgtest.DBApp, pgtest.RoleApp, pgtest.Password))
	proc := lcStartBinary(t, bin, "--config", file, "--http-listen=")
	_, port, _ := net.SplitHostPort(addr)
	login := func(as string) (string, error) {
		t.Helper()
		c, err := connectAnswered(t, proc, fmt.Sprintf("host=%s port=%s user=%s dbname=app sslmode=disable", sockDir, port, as))
		if err != nil {
			return "", err
		}
		defer c.Close(context.Background())
		res, err := c.Exec(ctxTimeout(t, 5*time.Second), "SELECT current_user").ReadAll()
		if err != nil {
			return "", err
		}
		return string(res[0].Rows[0][0]), nil
	}
	for _, as := range []string{me.Username, "mapped", me.Username + "_alias"} {
		if got, err := login(as); err != nil || got != pgtest.RoleApp {
			t.Errorf("peer login as %q (operating-system user %q): %q, %v; want in, as %s on the server", as, me.Username, got, err, pgtest.RoleApp)
		}
	}
	for as, detail := range map[string]string{
		"not_" + me.Username: fmt.Sprintf("the client runs as operating-system user %q", me.Username),
		"mapped_only":        fmt.Sprintf("ident map \"other\" does not let operating-system user %q log in as \"mapped_only\"", me.Username),
	} {
		_, err := login(as)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "28000" || pe.Message != fmt.Sprintf("Peer authentication failed for user %q", as) || pe.Detail != detail {
			t.Errorf("peer login as %q: %v (detail %q), want 28000 Peer authentication failed, detail %q", as, err, detailOf(err), detail)
		}
	}
	// PgBouncer's local admin: user pgbouncer on the Unix socket, from
	// poolerd's own operating-system user, gets the console without a
	// password, as an admin (admin_users is empty here); over TCP it
	// is an ordinary user (refused by the host rule).
	adm, err := connectAnswered(t, proc, fmt.Sprintf("host=%s port=%s user=pgbouncer dbname=pgbouncer sslmode=disable", sockDir, port))
	if err != nil {
		t.Fatalf("console as pgbouncer over the Unix socket: %v", err)
	}
	if _, err := adm.Exec(ctxTimeout(t, 5*time.Second), "RECONNECT").ReadAll(); err != nil {
		t.Errorf("an admin command as the local pgbouncer: %v", err)
	}
	adm.Close(context.Background())
	if _, err := connectAnswered(t, proc, fmt.Sprintf("host=127.0.0.1 port=%s user=pgbouncer dbname=pgbouncer sslmode=disable", port)); err == nil {
		t.Error("console as pgbouncer over TCP without a password")
	}
}

// TestListenersUnixSocketNoTLS: client_tls_sslmode require refuses plain
// TCP clients, and not Unix-socket ones (no TLS there), as PgBouncer and
// PostgreSQL do.
func TestListenersUnixSocketNoTLS(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	addr := lcFreeAddr(t)
	sockDir := t.TempDir()
	file := filepath.Join(t.TempDir(), "poolerd.yaml")
	lcWrite(t, file, fmt.Sprintf(`listen: %s
unix_socket_dir: %s
auth_type: trust
client_tls_sslmode: require
client_tls_cert_file: %s
client_tls_key_file: %s
`, addr, sockDir, files.ServerCert, files.ServerKey))
	proc := lcStartBinary(t, bin, "--config", file, "--http-listen=", "--upstream", pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	_, port, _ := net.SplitHostPort(addr)
	c, err := connectAnswered(t, proc, fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", sockDir, port, pgtest.RoleApp, pgtest.DBApp))
	if err != nil {
		t.Fatalf("plain over the Unix socket with client_tls_sslmode require: %v", err)
	}
	if _, err := c.Exec(ctxTimeout(t, 5*time.Second), "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	_, err = connectAnswered(t, proc, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgtest.RoleApp, addr, pgtest.DBApp))
	if err == nil || !strings.Contains(err.Error(), "SSL required") {
		t.Errorf("plain over TCP: %v, want SSL required", err)
	}
}

// connectAnswered connects with dsn, trying again until poolerd answers
// (it may still be starting): the connection, or the server's error.
func connectAnswered(t *testing.T, proc *lcProc, dsn string) (*pgconn.PgConn, error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pgconn.Connect(ctx, dsn)
		cancel()
		var pe *pgconn.PgError
		switch {
		case err == nil:
			return c, nil
		case errors.As(err, &pe):
			return nil, pe
		case time.Now().After(deadline):
			t.Fatalf("%s: %v\n%s", dsn, err, proc.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIniHTTPPortInUse: a configuration read from a pgbouncer.ini, which
// names no HTTP endpoint, starts without it when the default http_listen
// (127.0.0.1:9930) is in use, saying so, as a second PgBouncer on the host
// would start; a YAML configuration with the same default refuses to
// start, naming the address.
func TestIniHTTPPortInUse(t *testing.T) {
	t.Parallel()
	if ln, err := net.Listen("tcp", "127.0.0.1:9930"); err == nil {
		defer ln.Close() // else something else holds it: the same for the test
	}
	bin := lcBuildBinary(t)
	dir := t.TempDir()
	addr := lcFreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	ini := filepath.Join(dir, "pgbouncer.ini")
	lcWrite(t, ini, fmt.Sprintf("[databases]\napp = host=%s port=%d user=%s password=%s\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %s\nunix_socket_dir =\nauth_type = trust\n", pg.Host, pg.Port, pgtest.RoleApp, pgtest.Password, port))
	proc := lcStartBinary(t, bin, "--config", ini)
	waitOutput(t, proc, "http_listen is in use: serving without the HTTP endpoint")
	c, err := connectAnswered(t, proc, fmt.Sprintf("postgres://%s@%s/app?sslmode=disable", pgtest.RoleApp, addr))
	if err != nil {
		t.Fatalf("through the ini's poolerd: %v", err)
	}
	_ = c.Close(context.Background())

	yaml := filepath.Join(dir, "poolerd.yaml")
	lcWrite(t, yaml, fmt.Sprintf("listen: %s\nupstream: %s\n", lcFreeAddr(t), pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)))
	strict := lcStartBinary(t, bin, "--config", yaml)
	if code, _ := strict.wait(t, 15*time.Second); code == 0 || !strings.Contains(strict.stderr.String(), "listen on 127.0.0.1:9930 (http_listen") {
		t.Errorf("YAML with the default http_listen in use: exit %d\n%s", code, strict.stderr.String())
	}
}

// TestShutdownKeepsUnixSocketForConsole: SIGINT (safe shutdown) and SIGTERM
// (SHUTDOWN WAIT_FOR_CLIENTS) close the TCP listeners at once but keep the
// Unix socket open for admin console logins until the last client has
// left, as PgBouncer does: an operator can watch the shutdown with SHOW on
// the local socket. Other logins there get 57P01; RESUME is refused with
// "pooler is shutting down"; a console connected before the signal keeps
// working; once the clients are gone the process exits and the socket with
// it.
func TestShutdownKeepsUnixSocketForConsole(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			addr := lcFreeAddr(t)
			sockDir := t.TempDir()
			file := filepath.Join(t.TempDir(), "poolerd.yaml")
			lcWrite(t, file, fmt.Sprintf(`listen: %s
unix_socket_dir: %s
pool_mode: transaction
auth_type: hba
auth_hba_rules:
  - {type: local, database: all, user: all, method: trust}
  - {type: host, database: all, user: all, address: 127.0.0.1/32, method: trust}
`, addr, sockDir))
			proc := lcStartBinary(t, bin, "--config", file, "--http-listen=", "--upstream", pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
			_, port, _ := net.SplitHostPort(addr)
			tcpDSN := fmt.Sprintf("host=127.0.0.1 port=%s user=%s dbname=%s sslmode=disable", port, pgtest.RoleApp, pgtest.DBApp)
			unixDSN := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", sockDir, port, pgtest.RoleApp, pgtest.DBApp)
			consoleDSN := fmt.Sprintf("host=%s port=%s user=pgbouncer dbname=pgbouncer sslmode=disable", sockDir, port)
			run := func(c *pgconn.PgConn, sql string) error {
				_, err := c.Exec(ctxTimeout(t, 5*time.Second), sql).ReadAll()
				return err
			}

			client, err := connectAnswered(t, proc, tcpDSN)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close(context.Background())
			if err := run(client, "BEGIN; SELECT 1"); err != nil {
				t.Fatal(err)
			}
			before, err := connectAnswered(t, proc, consoleDSN)
			if err != nil {
				t.Fatalf("console over the Unix socket: %v", err)
			}
			defer before.Close(context.Background())
			if err := proc.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, "the TCP listener to close", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				c, err := pgconn.Connect(ctx, tcpDSN)
				if err == nil {
					c.Close(context.Background())
				}
				return err != nil && strings.Contains(err.Error(), "refused")
			})

			// The console is served on the Unix socket, new and old.
			adm, err := connectAnswered(t, proc, consoleDSN)
			if err != nil {
				t.Fatalf("console login over the Unix socket during the shutdown: %v\n%s", err, proc.stderr.String())
			}
			defer adm.Close(context.Background())
			if err := run(adm, "SHOW VERSION"); err != nil {
				t.Errorf("SHOW VERSION during the shutdown: %v", err)
			}
			if err := run(before, "SHOW CLIENTS"); err != nil {
				t.Errorf("SHOW CLIENTS on a console connected before the signal: %v", err)
			}
			var pe *pgconn.PgError
			if err := run(adm, "RESUME"); !errors.As(err, &pe) || pe.Code != "08P01" || pe.Message != "pooler is shutting down" {
				t.Errorf("RESUME during the shutdown: %v, want 08P01 pooler is shutting down", err)
			}
			// Any other login there is refused.
			if _, err := connectAnswered(t, proc, unixDSN); !errors.As(err, &pe) || pe.Code != "57P01" {
				t.Errorf("a client login over the Unix socket during the shutdown: %v, want 57P01", err)
			}
			// A connection to the Unix socket that sends nothing does not
			// hold the exit up (it could only become a console session).
			silent, err := net.Dial("unix", filepath.Join(sockDir, ".s.PGSQL."+port))
			if err != nil {
				t.Fatal(err)
			}
			defer silent.Close()

			// The client's transaction finishes; then it is gone and so is
			// poolerd (SIGINT ends it at its idle point; SIGTERM waits for
			// it to leave).
			if err := run(client, "COMMIT"); err != nil {
				t.Errorf("COMMIT during the shutdown: %v", err)
			}
			if sig == syscall.SIGTERM {
				client.Close(context.Background())
			}
			if code, _ := proc.wait(t, 10*time.Second); code != 0 {
				t.Errorf("exit status %d", code)
			}
			if c, err := pgconn.Connect(ctxTimeout(t, 2*time.Second), consoleDSN); err == nil {
				c.Close(context.Background())
				t.Error("the Unix socket still answers after the exit")
			}
		})
	}
}
