package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/ldaptest"
	"github.com/poolerd/poolerd/test/pamtest"
	"github.com/poolerd/poolerd/test/pgtest"
)

// loginAs logs in through poolerd and returns the role the session runs
// as in PostgreSQL, or the refusal.
func loginAs(t *testing.T, p *instance, user, password string) (string, error) {
	t.Helper()
	return loginFrom(t, "127.0.0.1", p.dsn(user, password, pgtest.DBApp))
}

// wantRefused checks a login refused with PostgreSQL's 28P01 message.
func wantRefused(t *testing.T, err error, text string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "28P01" || pe.Message != text {
		t.Errorf("got %v, want 28P01 %q", err, text)
	}
}

// auth_type ldap against a real slapd: the LDAP password logs the client in
// to poolerd; PostgreSQL gets the configured secret where there is one
// (app: upstream's), else the password the client gave (scram_user, whose
// LDAP password is its PostgreSQL one). An ldap access rule in search+bind
// mode does the same per rule.
func TestLDAPAuth(t *testing.T) {
	t.Parallel()
	ldap := ldaptest.Start(t)
	ldap.AddUser(t, pgtest.RoleApp, "app-ldap-pw", "app@example.net")
	ldap.AddUser(t, pgtest.RoleSCRAM, pgtest.Password, "scram@example.net")
	people := "ou=people," + ldaptest.BaseDN
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthLDAP
		c.AuthLDAPOptions = fmt.Sprintf(`ldapserver=127.0.0.1 ldapport=%d ldapprefix="uid=" ldapsuffix=",%s"`, ldap.Port, people)
	})
	for user, pw := range map[string]string{pgtest.RoleApp: "app-ldap-pw", pgtest.RoleSCRAM: pgtest.Password} {
		if got, err := loginAs(t, p, user, pw); err != nil || got != user {
			t.Errorf("%s with its LDAP password: %q %v", user, got, err)
		}
	}
	_, err := loginAs(t, p, pgtest.RoleApp, pgtest.Password) // PostgreSQL's, not LDAP's
	wantRefused(t, err, `LDAP authentication failed for user "app"`)
	_, err = loginAs(t, p, "nobody", "x")
	wantRefused(t, err, `LDAP authentication failed for user "nobody"`)
	if !strings.Contains(p.logs.String(), "the server refused the password") {
		t.Error("the log does not say why LDAP refused")
	}

	dir := t.TempDir()
	hbaFile := filepath.Join(dir, "hba.conf")
	rules := fmt.Sprintf("host all all 127.0.0.1/32 ldap ldapurl=\"ldap://127.0.0.1:%d/%s?mail?sub\"\n", ldap.Port, people)
	if err := os.WriteFile(hbaFile, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	q := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthHBA
		c.AuthHBAFile = hbaFile
		c.Databases = []config.Database{{Name: "bymail", DBName: pgtest.DBApp, User: pgtest.RoleApp, Password: pgtest.Password}}
	})
	// Search+bind by mail: the client's name is its mail address; the
	// entry's forced user logs in to PostgreSQL.
	ctx := ctxTimeout(t, 30*time.Second)
	c, err := pgconn.Connect(ctx, q.dsn("app@example.net", "app-ldap-pw", "bymail"))
	if err != nil {
		t.Fatalf("search+bind by mail: %v", err)
	}
	c.Close(ctx)
	_, err = pgconn.Connect(ctx, q.dsn("app@example.net", "wrong", "bymail"))
	wantRefused(t, err, `LDAP authentication failed for user "app@example.net"`)
}

// auth_type pam with a service of the test's (pam_exec checking one user
// and password): accepted, the password logs the user in to PostgreSQL
// too; refused with PostgreSQL's message.
func TestPAMAuth(t *testing.T) {
	t.Parallel()
	service := pamtest.Service(t, pgtest.RoleSCRAM, pgtest.Password)
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthPAM
		c.AuthPAMService = service
	})
	if got, err := loginAs(t, p, pgtest.RoleSCRAM, pgtest.Password); err != nil || got != pgtest.RoleSCRAM {
		t.Fatalf("PAM login: %q %v", got, err)
	}
	_, err := loginAs(t, p, pgtest.RoleSCRAM, "wrong")
	wantRefused(t, err, `PAM authentication failed for user "scram_user"`)
	_, err = loginAs(t, p, pgtest.RoleApp, pgtest.Password)
	wantRefused(t, err, `PAM authentication failed for user "app"`)
}
