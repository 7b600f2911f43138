package integration

// Authentication from a pgbouncer.ini as PgBouncer does it (issue #31,
// hole 9): trust admits only users of auth_file, and a [databases] entry's
// user without a password logs in with that user's password from
// auth_file.

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

// TestPgbouncerIniTrust: with auth_type trust, a user absent from auth_file
// is refused (28000, where PgBouncer says "trust" authentication failed),
// one listed there is admitted (an empty password will do), and a
// database entry's user without a password logs in to PostgreSQL
// (scram-sha-256 for that role) with its password from auth_file.
// auth_type any admits every user name.
func TestPgbouncerIniTrust(t *testing.T) {
	t.Parallel()
	ini := fmt.Sprintf(`[databases]
appdb = host=%[1]s port=%[2]d dbname=%[3]s
forced = host=%[1]s port=%[2]d dbname=%[3]s user=%[4]s
forcedpw = host=%[1]s port=%[2]d dbname=%[3]s user=%[5]s password=%[6]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
auth_type = trust
auth_file = userlist.txt
pool_mode = transaction
`, pg.Host, pg.Port, pgtest.DBApp, pgtest.RoleSCRAM, pgtest.RoleClear, pgtest.Password)
	p := startFromIni(t, ini,
		pgtest.RoleApp, pgtest.Password,
		pgtest.RoleSCRAM, pgtest.Password,
		pgtest.RoleMD5, "")

	for _, tc := range []struct{ name, user, db, want string }{
		{"listed user", pgtest.RoleApp, "appdb", pgtest.RoleApp},
		{"listed user with an empty password, forced user", pgtest.RoleMD5, "forcedpw", pgtest.RoleClear},
		{"forced user without password takes auth_file's", pgtest.RoleApp, "forced", pgtest.RoleSCRAM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := currentUser(t, p.dsn(tc.user, "", tc.db)); got != tc.want {
				t.Fatalf("current_user %q, want %q", got, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, user, db string }{
		{"unlisted user, PostgreSQL would trust it", pgtest.RoleTrust, "appdb"},
		{"unlisted user of a forced user's entry", "nobody", "forcedpw"},
		{"unlisted user, admin console", "nobody", "pgbouncer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pe := loginPgError(t, p.dsn(tc.user, "", tc.db))
			if pe.Code != "28000" || !strings.Contains(pe.Message, `"trust" authentication failed`) || !strings.Contains(pe.Hint, "auth_file") {
				t.Fatalf("got %s %q (hint %q), want 28000 \"trust\" authentication failed with a hint naming auth_file", pe.Code, pe.Message, pe.Hint)
			}
		})
	}

	// auth_type any admits the users trust refuses.
	t.Run("any", func(t *testing.T) {
		p := startFromIni(t, strings.Replace(ini, "auth_type = trust", "auth_type = any", 1), pgtest.RoleApp, pgtest.Password)
		if got := currentUser(t, p.dsn("nobody", "", "forcedpw")); got != pgtest.RoleClear {
			t.Fatalf("current_user %q, want %q", got, pgtest.RoleClear)
		}
	})
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

// TestTrustAuthQuery: with auth_type trust and auth_user (no auth_file), a
// user auth_query finds is admitted, with the secret it found for the
// server login (here PostgreSQL trusts the role); one it does not find is
// refused, as in PgBouncer.
func TestTrustAuthQuery(t *testing.T) {
	t.Parallel()
	const authPW = "aqt-auth-pw"
	authQueryRoles(ctxTimeout(t, 30*time.Second), t, "aqt_auth", authPW, "")
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthTrust
		c.AuthUser = "aqt_auth"
		c.Users = []config.User{{Name: "aqt_auth", Password: authPW}}
	})
	if got := currentUser(t, p.dsn(pgtest.RoleTrust, "", pgtest.DBApp)); got != pgtest.RoleTrust {
		t.Fatalf("current_user %q, want %q", got, pgtest.RoleTrust)
	}
	pe := loginPgError(t, p.dsn("aqt_nobody", "", pgtest.DBApp))
	// PgBouncer's "no such user" too, which its tools and suite look for.
	if pe.Code != "28000" || !strings.Contains(pe.Message, `"trust" authentication failed`) || !strings.Contains(pe.Message, "no such user") ||
		!strings.Contains(pe.Detail, "auth_query") {
		t.Fatalf("got %s %q (detail %q), want 28000 \"trust\" authentication failed: no such user, naming auth_query", pe.Code, pe.Message, pe.Detail)
	}

	// A user auth_query finds without a password (NULL: no password, or
	// expired) is admitted by trust, as by PgBouncer's and PostgreSQL's
	// trust; the server login goes without one. A password method
	// admits no password against it.
	nullQuery := "SELECT rolname, NULL::text FROM pg_catalog.pg_authid WHERE rolname = $1"
	p = startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthTrust
		c.AuthUser = "aqt_auth"
		c.AuthQuery = nullQuery
		c.Users = []config.User{{Name: "aqt_auth", Password: authPW}}
	})
	if got := currentUser(t, p.dsn(pgtest.RoleTrust, "", pgtest.DBApp)); got != pgtest.RoleTrust {
		t.Fatalf("found without a password: current_user %q, want %q", got, pgtest.RoleTrust)
	}
	p = startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthMD5
		c.AuthUser = "aqt_auth"
		c.AuthQuery = nullQuery
		c.Users = []config.User{{Name: "aqt_auth", Password: authPW}}
	})
	if pe := loginPgError(t, p.dsn(pgtest.RoleTrust, pgtest.Password, pgtest.DBApp)); pe.Code != "28P01" {
		t.Fatalf("md5 against a NULL secret: got %s %q, want 28P01", pe.Code, pe.Message)
	}
}
