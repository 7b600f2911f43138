package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func requirePostgres(t *testing.T) {
	t.Helper()
	dir, err := FindBinDir()
	if err != nil {
		t.Skipf("skipping: PostgreSQL server binaries not available: %v", err)
	}
	t.Logf("PostgreSQL binaries in %s", dir)
}

type roleCase struct {
	role, password string
}

var roleCases = []roleCase{
	{RoleApp, Password},
	{RoleSCRAM, Password},
	{RoleMD5, Password},
	{RoleClear, Password},
	{RoleTrust, ""},
}

func checkRoles(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, rc := range roleCases {
		conn, err := pgx.Connect(ctx, s.DSN(rc.role, rc.password, DBApp))
		if err != nil {
			t.Fatalf("connect as %s: %v\nlog:\n%s", rc.role, err, s.LogTail(20))
		}
		var cu string
		err = conn.QueryRow(ctx, "SELECT current_user").Scan(&cu)
		conn.Close(ctx)
		if err != nil {
			t.Fatalf("SELECT current_user as %s: %v", rc.role, err)
		}
		if cu != rc.role {
			t.Fatalf("current_user = %q, want %q", cu, rc.role)
		}
	}
}

func TestServerLifecycle(t *testing.T) {
	requirePostgres(t)
	begin := time.Now()

	s, err := Start(Options{Logf: t.Logf})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	t.Logf("started in %v", time.Since(begin))

	if s.Host != "127.0.0.1" || s.Port == 0 || s.Addr() != "127.0.0.1:"+strconv.Itoa(s.Port) {
		t.Fatalf("bad address: host=%q port=%d addr=%q", s.Host, s.Port, s.Addr())
	}
	if fi, err := os.Stat(s.DataDir); err != nil || !fi.IsDir() {
		t.Fatalf("DataDir %q: %v", s.DataDir, err)
	}
	if _, err := os.Stat(filepath.Join(s.BinDir, "pg_ctl")); err != nil {
		t.Fatalf("BinDir %q has no pg_ctl: %v", s.BinDir, err)
	}

	// Every role over TCP with its auth method.
	checkRoles(t, s)

	// Wrong password must be rejected for password-authenticated roles.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, role := range []string{RoleApp, RoleSCRAM, RoleMD5, RoleClear} {
		conn, err := pgx.Connect(ctx, s.DSN(role, "wrong", DBApp))
		if err == nil {
			conn.Close(ctx)
			t.Fatalf("%s connected with a wrong password", role)
		}
	}

	// Stored password formats.
	super, err := pgx.Connect(ctx, s.SuperDSN("postgres"))
	if err != nil {
		t.Fatalf("superuser connect: %v", err)
	}
	for role, prefix := range map[string]string{
		RoleMD5:   "md5",
		RoleSCRAM: "SCRAM-SHA-256$",
		RoleApp:   "SCRAM-SHA-256$",
		RoleClear: "SCRAM-SHA-256$",
	} {
		var pw string
		if err := super.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&pw); err != nil {
			t.Fatalf("rolpassword of %s: %v", role, err)
		}
		if !strings.HasPrefix(pw, prefix) {
			t.Fatalf("rolpassword of %s = %.20q..., want prefix %q", role, pw, prefix)
		}
	}
	// Databases and owners.
	for _, db := range []string{DBApp, DBOther} {
		var owner string
		if err := super.QueryRow(ctx, "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", db).Scan(&owner); err != nil {
			t.Fatalf("owner of %s: %v", db, err)
		}
		if owner != RoleApp {
			t.Fatalf("owner of %s = %q, want %q", db, owner, RoleApp)
		}
	}
	var maxConns string
	if err := super.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil || maxConns != "300" {
		t.Fatalf("max_connections = %q, %v", maxConns, err)
	}
	super.Close(ctx)

	// Non-owner roles can create tables in app's public schema.
	for _, rc := range roleCases[1:] {
		conn, err := pgx.Connect(ctx, s.DSN(rc.role, rc.password, DBApp))
		if err != nil {
			t.Fatalf("connect as %s: %v", rc.role, err)
		}
		_, err = conn.Exec(ctx, "CREATE TABLE "+pgx.Identifier{"t_" + rc.role}.Sanitize()+" (id int)")
		conn.Close(ctx)
		if err != nil {
			t.Fatalf("%s cannot create a table in %s: %v", rc.role, DBApp, err)
		}
	}

	// Exec as superuser, multi-statement.
	if err := s.Exec(ctx, DBApp, "CREATE TABLE marker (v text); INSERT INTO marker VALUES ('kept')"); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if err := s.Exec(ctx, DBApp, "SELECT no_such_column FROM marker"); err == nil {
		t.Fatal("Exec of bad SQL returned nil error")
	}
	if tail := s.LogTail(5); !strings.Contains(s.LogTail(100), "no_such_column") || len(strings.Split(tail, "\n")) > 5 {
		t.Fatalf("LogTail does not look right:\n%s", tail)
	}
	if strings.Contains(s.LogTail(10000), s.superPassword) {
		t.Fatal("superuser password appears in the server log")
	}

	// Restart and reconnect; data survives.
	port := s.Port
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Port != port {
		t.Fatalf("port changed across Restart: %d -> %d", port, s.Port)
	}
	checkRoles(t, s)

	// Stop: nobody can connect; Stop is idempotent; StartAgain resumes.
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	shortCtx, shortCancel := context.WithTimeout(ctx, 2*time.Second)
	if conn, err := pgx.Connect(shortCtx, s.DSN(RoleTrust, "", DBApp)); err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	shortCancel()
	if _, err := os.Stat(s.DataDir); err != nil {
		t.Fatalf("Stop removed the data dir: %v", err)
	}
	if err := s.StartAgain(); err != nil {
		t.Fatalf("StartAgain: %v", err)
	}
	checkRoles(t, s)
	conn, err := pgx.Connect(ctx, s.SuperDSN(DBApp))
	if err != nil {
		t.Fatalf("superuser connect after StartAgain: %v", err)
	}
	var v string
	err = conn.QueryRow(ctx, "SELECT v FROM marker").Scan(&v)
	conn.Close(ctx)
	if err != nil || v != "kept" {
		t.Fatalf("marker after restart = %q, %v", v, err)
	}

	// Cleanup removes the dir and is idempotent.
	root := filepath.Dir(s.DataDir)
	if err := s.Cleanup(); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s still exists after Cleanup (err=%v)", root, err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	shortCtx, shortCancel = context.WithTimeout(ctx, 2*time.Second)
	defer shortCancel()
	if conn, err := pgx.Connect(shortCtx, s.DSN(RoleTrust, "", DBApp)); err == nil {
		conn.Close(ctx)
		t.Fatal("server still accepting connections after Cleanup")
	}
	t.Logf("lifecycle test took %v", time.Since(begin))
}

// TestStartFailureCleansUp checks that a server that cannot start reports
// the log tail and leaves no temp dir behind.
func TestStartFailureCleansUp(t *testing.T) {
	requirePostgres(t)
	var mu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
		t.Logf(format, args...)
	}
	s, err := Start(Options{ExtraConf: []string{"no_such_setting_xyz = 1"}, Logf: logf})
	if err == nil {
		s.Cleanup()
		t.Fatal("Start succeeded with an invalid setting")
	}
	if !strings.Contains(err.Error(), "no_such_setting_xyz") {
		t.Fatalf("error does not include the log tail: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var dataDir string
	for _, l := range logs {
		if rest, ok := strings.CutPrefix(l, "pgtest: initdb "); ok {
			dataDir, _, _ = strings.Cut(rest, " ")
		}
	}
	if dataDir == "" {
		t.Fatalf("no initdb progress message in %q", logs)
	}
	if _, err := os.Stat(filepath.Dir(dataDir)); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s left behind after failed Start (err=%v)", filepath.Dir(dataDir), err)
	}
}

func TestDSN(t *testing.T) {
	s := &Server{Host: "127.0.0.1", Port: 5433, superPassword: "pw"}
	if got, want := s.DSN("u@x", "p/w:?#%", "d b"), "postgres://u%40x:p%2Fw%3A%3F%23%25@127.0.0.1:5433/d%20b?sslmode=disable"; got != want {
		t.Fatalf("DSN = %q, want %q", got, want)
	}
	u, err := url.Parse(s.DSN("u@x", "p/w:?#%", "d b"))
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); u.User.Username() != "u@x" || pw != "p/w:?#%" || u.Path != "/d b" {
		t.Fatalf("round trip: %v", u)
	}
	if got, want := s.DSN(RoleTrust, "", DBApp), "postgres://trust_user@127.0.0.1:5433/app?sslmode=disable"; got != want {
		t.Fatalf("DSN = %q, want %q", got, want)
	}
	if got, want := s.SuperDSN("postgres"), "postgres://postgres:pw@127.0.0.1:5433/postgres?sslmode=disable"; got != want {
		t.Fatalf("SuperDSN = %q, want %q", got, want)
	}
	if p, err := FreePort(); err != nil || p <= 0 {
		t.Fatalf("FreePort = %d, %v", p, err)
	}
}
