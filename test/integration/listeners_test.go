package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/test/pgtest"
)

// TestListeners: the binary listens on every address of listen and on a
// Unix socket in unix_socket_dir, .s.PGSQL.<the first address's port>, with
// unix_socket_mode; access rules tell the two kinds of client apart: a
// local rule (trust) admits Unix-socket clients without a password, a host
// rule (reject) refuses TCP clients of 127.0.0.1 on either port.
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
auth_type: hba
auth_hba_rules:
  - {type: local, database: all, user: all, method: trust}
  - {type: host, database: all, user: all, address: 127.0.0.1/32, method: reject}
`, a1, a2, sockDir))
	proc := lcStartBinary(t, bin, "--config", file, "--http-listen=", "--upstream", pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	_, port, _ := net.SplitHostPort(a1)
	sock := filepath.Join(sockDir, ".s.PGSQL."+port)

	// attempt connects with dsn until poolerd answers (it may still be
	// starting): nil, or the server's error.
	attempt := func(dsn string) error {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := pgconn.Connect(ctx, dsn)
			cancel()
			var pe *pgconn.PgError
			switch {
			case err == nil:
				defer c.Close(context.Background())
				_, err := c.Exec(ctxTimeout(t, 5*time.Second), "SELECT 1").ReadAll()
				return err
			case errors.As(err, &pe):
				return pe
			case time.Now().After(deadline):
				t.Fatalf("%s: %v\n%s", dsn, err, proc.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
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
