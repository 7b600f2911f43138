package integration

// Starting from PgBouncer's packaged sample, and restarts and upgrades that
// drop nobody: so_reuseport and the hand-over of the listening socket
// (takeover_socket, poolerd --takeover), on the real binary.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
// HTTP endpoint is turned off, and where the package is not installed the
// empty userlist is a temporary one.
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
	proc := lcStartBinary(t, bin, args...)

	login := func(db string) *pgconn.PgError {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := pgconn.Connect(ctx, "postgres://someone:secret@"+listen+"/"+db+"?sslmode=disable")
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
	pe := login("appdb")
	if pe.Severity != "FATAL" || pe.Code != "3D000" || pe.Message != "no such database: appdb" || !strings.Contains(pe.Hint, "[databases]") {
		t.Errorf("login to appdb: %s %s %q hint %q, want FATAL 3D000 no such database: appdb", pe.Severity, pe.Code, pe.Message, pe.Hint)
	}
	if pe := login("pgbouncer"); pe.Code != "28P01" {
		t.Errorf("login to the admin console: %s %s %q, want 28P01 (an empty userlist lets nobody in)", pe.Severity, pe.Code, pe.Message)
	}
	out := proc.stderr.String()
	for _, want := range []string{"no databases: every client but the admin console's is refused", "auth_type md5 needs client passwords", "pgbouncer.ini settings poolerd does not honour"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if err := proc.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code, _ := proc.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGINT; output:\n%s", code, proc.stderr.String())
	}
}
