package integration

// Authentication from a pgbouncer.ini as PgBouncer does it (issue #31,
// hole 9): a [databases] entry's user without a password logs in with
// that user's password from auth_file.

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pgbini"
	"github.com/poolerd/poolerd/test/pgtest"
)

// startFromIni starts poolerd in process with the configuration a
// pgbouncer.ini (ini, in a directory with userlist.txt holding the
// userlist pairs) gives, as cmd/poolerd loads it; listen is a free port.
func startFromIni(t *testing.T, ini string, userlist ...string) *instance {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	for i := 0; i+1 < len(userlist); i += 2 {
		b.WriteString(q(userlist[i]) + " " + q(userlist[i+1]) + "\n")
	}
	lcWrite(t, filepath.Join(dir, "userlist.txt"), b.String())
	lcWrite(t, filepath.Join(dir, "pgbouncer.ini"), ini)
	l, err := config.NewLoader([]string{"--config", filepath.Join(dir, "pgbouncer.ini")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l.Translate = pgbini.Translate
	loaded, err := l.Load()
	if err != nil {
		t.Fatalf("loading the ini: %v", err)
	}
	return startPoolerd(t, func(c *config.Config) {
		*c = *loaded
		c.Listen, c.HTTPListen, c.LogLevel = "127.0.0.1:0", "", "debug"
	})
}

// currentUser logs in with dsn and returns current_user.
func currentUser(t *testing.T, dsn string) string {
	t.Helper()
	c, err := pgx.Connect(ctxTimeout(t, 15*time.Second), dsn)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	defer c.Close(context.Background())
	return scalarText(t, c, "SELECT current_user")
}

// TestPgbouncerIniForcedUserSecrets: a database entry's user without a
// password logs in with its auth_file secret of any kind where PostgreSQL's
// method allows it: an md5 hash for an md5 role; a SCRAM secret only by
// pass-through, with the key of a client that logged in as that user (not
// another client's), and otherwise a clear refusal.
func TestPgbouncerIniForcedUserSecrets(t *testing.T) {
	t.Parallel()
	sum := md5.Sum([]byte(pgtest.Password + pgtest.RoleMD5))
	ini := fmt.Sprintf(`[databases]
forcedmd5 = host=%[1]s port=%[2]d dbname=%[3]s user=%[4]s
forcedscram = host=%[1]s port=%[2]d dbname=%[3]s user=%[5]s
forcedscram2 = host=%[1]s port=%[2]d dbname=%[3]s user=%[5]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
auth_type = md5
auth_file = userlist.txt
`, pg.Host, pg.Port, pgtest.DBApp, pgtest.RoleMD5, pgtest.RoleSCRAM)
	p := startFromIni(t, ini,
		pgtest.RoleApp, pgtest.Password,
		pgtest.RoleMD5, "md5"+hex.EncodeToString(sum[:]),
		pgtest.RoleSCRAM, scramSecretOf(t, pgtest.RoleSCRAM),
		pgtest.RoleClear, scramSecretOf(t, pgtest.RoleClear))

	if got := currentUser(t, p.dsn(pgtest.RoleApp, pgtest.Password, "forcedmd5")); got != pgtest.RoleMD5 {
		t.Fatalf("md5 secret: current_user %q, want %q", got, pgtest.RoleMD5)
	}

	// No client has logged in as scram_user: its SCRAM secret alone cannot
	// log in to PostgreSQL.
	pe := loginPgError(t, p.dsn(pgtest.RoleApp, pgtest.Password, "forcedscram2"))
	if pe.Code != "28000" || !strings.Contains(pe.Hint, "auth_file") || !strings.Contains(pe.Hint, pgtest.RoleSCRAM) {
		t.Fatalf("SCRAM secret without a key: got %s %q (hint %q), want 28000 with a hint naming auth_file and %s", pe.Code, pe.Message, pe.Hint, pgtest.RoleSCRAM)
	}

	// scram_user logs in (SCRAM, its secret is a verifier): pass-through
	// opens its session's server connection (session mode: held).
	ctx := ctxTimeout(t, 15*time.Second)
	first, err := pgx.Connect(ctx, p.dsn(pgtest.RoleSCRAM, pgtest.Password, "forcedscram"))
	if err != nil {
		t.Fatalf("%s with pass-through: %v", pgtest.RoleSCRAM, err)
	}
	defer first.Close(context.Background())
	if got := scalarText(t, first, "SELECT current_user"); got != pgtest.RoleSCRAM {
		t.Fatalf("current_user %q", got)
	}
	// clear_user's own SCRAM login gives a key for clear_user, not for
	// scram_user: the next server connection still opens with
	// scram_user's.
	if got := currentUser(t, p.dsn(pgtest.RoleClear, pgtest.Password, "forcedscram")); got != pgtest.RoleSCRAM {
		t.Fatalf("second client: current_user %q, want %q", got, pgtest.RoleSCRAM)
	}
}
