package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// scalarText runs sql (simple protocol) and returns its single value as
// text.
func scalarText(t *testing.T, c *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := c.QueryRow(ctxTimeout(t, 10*time.Second), sql, pgx.QueryExecModeSimpleProtocol).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// loginPgError connects with dsn, which must fail with a PostgreSQL error;
// it returns that error.
func loginPgError(t *testing.T, dsn string) *pgconn.PgError {
	t.Helper()
	c, err := pgx.Connect(ctxTimeout(t, 15*time.Second), dsn)
	if err == nil {
		c.Close(context.Background())
		t.Fatalf("login succeeded, want it refused")
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("login failed without a PostgreSQL error: %v", err)
	}
	return pe
}

// scramSecretOf returns the SCRAM verifier PostgreSQL stores for role.
func scramSecretOf(t *testing.T, role string) string {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	conn, err := pgx.Connect(ctx, pg.SuperDSN("postgres"))
	if err != nil {
		t.Fatalf("connect as superuser: %v", err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&s); err != nil {
		t.Fatalf("pg_authid of %s: %v", role, err)
	}
	if !strings.HasPrefix(s, "SCRAM-SHA-256$") {
		t.Fatalf("%s has no SCRAM secret in pg_authid", role)
	}
	return s
}

// writeUserlist writes a PgBouncer auth_file with the given user and secret
// pairs and returns its path.
func writeUserlist(t *testing.T, pairs ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("; written by the poolerd integration tests\n")
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	for i := 0; i+1 < len(pairs); i += 2 {
		b.WriteString(q(pairs[i]) + " " + q(pairs[i+1]) + "\n")
	}
	path := filepath.Join(t.TempDir(), "userlist.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAuthServerLoginMethods has poolerd log in to PostgreSQL with each
// method pg_hba.conf asks for: SCRAM, md5 (from a plain password and from
// an md5 secret), cleartext and trust.
func TestAuthServerLoginMethods(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.Users = []config.User{
			{Name: pgtest.RoleSCRAM, Password: pgtest.Password},
			{Name: pgtest.RoleMD5, Password: pgtest.Password},
			{Name: pgtest.RoleClear, Password: pgtest.Password},
		}
		c.Databases = []config.Database{
			// trust_user: no password for the server login at all.
			{Name: "as_trust", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, User: pgtest.RoleTrust},
			// md5 login from a stored md5 secret (no plain password known).
			{Name: "as_md5hash", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, User: pgtest.RoleMD5,
				Password: auth.MD5Hash(pgtest.RoleMD5, pgtest.Password)},
			// A SCRAM role with only an md5 secret: no way to log in.
			{Name: "as_scram_md5", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, User: pgtest.RoleSCRAM,
				Password: auth.MD5Hash(pgtest.RoleSCRAM, pgtest.Password)},
		}
	})
	// PgBouncer's words for it, which tools and its suite look for.
	if pe := loginPgError(t, p.dsn(pgtest.RoleApp, pgtest.Password, "as_scram_md5")); !strings.Contains(pe.Message, "server login failed: wrong password type: server asks") {
		t.Errorf("SCRAM server login with an md5 secret: %s %q, want server login failed: wrong password type", pe.Code, pe.Message)
	}
	for _, tc := range []struct {
		name, user, db, want string
	}{
		{"scram", pgtest.RoleSCRAM, pgtest.DBApp, pgtest.RoleSCRAM},
		{"md5", pgtest.RoleMD5, pgtest.DBApp, pgtest.RoleMD5},
		{"cleartext", pgtest.RoleClear, pgtest.DBApp, pgtest.RoleClear},
		{"trust", pgtest.RoleApp, "as_trust", pgtest.RoleTrust},
		{"md5 secret", pgtest.RoleApp, "as_md5hash", pgtest.RoleMD5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := connectDSN(t, p.dsn(tc.user, pgtest.Password, tc.db))
			if got := scalarText(t, c, "SELECT current_user"); got != tc.want {
				t.Fatalf("current_user %q, want %q", got, tc.want)
			}
			if got := scalarText(t, c, "SELECT current_database()"); got != pgtest.DBApp {
				t.Fatalf("current_database %q, want %q", got, pgtest.DBApp)
			}
		})
	}
}

func TestAuthClientMD5(t *testing.T) {
	t.Parallel()
	verifier := scramSecretOf(t, pgtest.RoleSCRAM)
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthMD5
		// As in PostgreSQL, a user whose secret is a SCRAM verifier is
		// asked for SCRAM even with md5.
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: verifier}}
	})

	t.Run("md5 is asked for", func(t *testing.T) {
		c := dialFE(t, p.addr)
		c.startup(pgtest.RoleApp)
		m := c.recv()
		md5, ok := m.(*pgproto3.AuthenticationMD5Password)
		if !ok {
			t.Fatalf("got %T, want AuthenticationMD5Password", m)
		}
		c.send(&pgproto3.PasswordMessage{Password: auth.MD5Response(auth.MD5Hash(pgtest.RoleApp, pgtest.Password), md5.Salt)})
		c.authenticate(pgtest.Password)
		c.mustQuery("SELECT 1")
	})
	t.Run("right password", func(t *testing.T) {
		c := connectDSN(t, p.appDSN())
		if got := scalarText(t, c, "SELECT current_user"); got != pgtest.RoleApp {
			t.Fatalf("current_user %q", got)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		if pe := loginPgError(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("got %s %s, want 28P01", pe.Code, pe.Message)
		}
	})
	t.Run("unknown user", func(t *testing.T) {
		if pe := loginPgError(t, p.dsn("nobody", pgtest.Password, pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("got %s %s, want 28P01", pe.Code, pe.Message)
		}
	})
	t.Run("SCRAM secret uses SCRAM", func(t *testing.T) {
		c := dialFE(t, p.addr)
		c.startup(pgtest.RoleSCRAM)
		if m := c.recv(); !isSASL(m) {
			t.Fatalf("got %T, want AuthenticationSASL", m)
		}
		pc := connectDSN(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp))
		if got := scalarText(t, pc, "SELECT current_user"); got != pgtest.RoleSCRAM {
			t.Fatalf("current_user %q", got)
		}
	})
}

// TestAuthClientPlain: auth_type plain (PgBouncer's) asks for the password
// in clear text and checks it against every kind of secret; a SCRAM
// verifier then logs the user in to PostgreSQL by pass-through.
func TestAuthClientPlain(t *testing.T) {
	t.Parallel()
	verifier := scramSecretOf(t, pgtest.RoleSCRAM)
	// A password as long as PostgreSQL takes (its 65535-byte limit on an
	// authentication message) logs in too.
	longPW := strings.Repeat("p", 60000)
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthPlain
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: verifier}, {Name: pgtest.RoleMD5, Password: auth.MD5Hash(pgtest.RoleMD5, pgtest.Password)},
			{Name: "long_pw_user", Password: longPW}}
		c.Databases = []config.Database{{Name: "forced", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, User: pgtest.RoleApp, Password: pgtest.Password}}
	})
	if got := currentUser(t, p.dsn("long_pw_user", longPW, "forced")); got != pgtest.RoleApp {
		t.Fatalf("a 60000-byte password: current_user %q, want the forced %q", got, pgtest.RoleApp)
	}
	c := dialFE(t, p.addr)
	c.startup(pgtest.RoleApp)
	if m := c.recv(); func() bool { _, ok := m.(*pgproto3.AuthenticationCleartextPassword); return !ok }() {
		t.Fatalf("got %T, want AuthenticationCleartextPassword", m)
	}
	c.send(&pgproto3.PasswordMessage{Password: pgtest.Password})
	c.authenticate(pgtest.Password)
	c.mustQuery("SELECT 1")
	for _, user := range []string{pgtest.RoleApp, pgtest.RoleSCRAM, pgtest.RoleMD5} {
		if got := currentUser(t, p.dsn(user, pgtest.Password, pgtest.DBApp)); got != user {
			t.Fatalf("current_user %q, want %q", got, user)
		}
		if pe := loginPgError(t, p.dsn(user, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("%s with a wrong password: got %s %s, want 28P01", user, pe.Code, pe.Message)
		}
	}
}

func isSASL(m pgproto3.BackendMessage) bool {
	s, ok := m.(*pgproto3.AuthenticationSASL)
	if !ok {
		return false
	}
	for _, mech := range s.AuthMechanisms {
		if mech == auth.SCRAMMechanism {
			return true
		}
	}
	return false
}

func TestAuthClientTrust(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.AuthType = config.AuthTrust })

	t.Run("no password request", func(t *testing.T) {
		c := dialFE(t, p.addr)
		c.startup(pgtest.RoleApp)
		if m, ok := c.recv().(*pgproto3.AuthenticationOk); !ok {
			t.Fatalf("got %T, want AuthenticationOk at once", m)
		}
		c.authenticate("")
		c.mustQuery("SELECT 1")
	})
	for _, role := range []string{pgtest.RoleApp, pgtest.RoleTrust} {
		t.Run(role, func(t *testing.T) {
			c := connectDSN(t, p.dsn(role, "", pgtest.DBApp))
			if got := scalarText(t, c, "SELECT current_user"); got != role {
				t.Fatalf("current_user %q, want %q", got, role)
			}
		})
	}
}

// TestAuthFile reads client secrets from a PgBouncer userlist: a plain
// password, an md5 secret, a SCRAM secret from pg_authid (SCRAM
// pass-through to PostgreSQL) and a SCRAM secret that does not match the
// server's.
func TestAuthFile(t *testing.T) {
	t.Parallel()
	verifier := scramSecretOf(t, pgtest.RoleSCRAM)

	t.Run("plain and SCRAM pass-through", func(t *testing.T) {
		t.Parallel()
		p := startPoolerd(t, func(c *config.Config) {
			c.AuthFile = writeUserlist(t,
				pgtest.RoleSCRAM, verifier,
				pgtest.RoleClear, pgtest.Password)
		})
		// Plain password: client SCRAM against a derived verifier, server
		// login with the cleartext method.
		c := connectDSN(t, p.dsn(pgtest.RoleClear, pgtest.Password, pgtest.DBApp))
		if got := scalarText(t, c, "SELECT current_user"); got != pgtest.RoleClear {
			t.Fatalf("current_user %q", got)
		}
		if pe := loginPgError(t, p.dsn(pgtest.RoleClear, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("wrong password: got %s %s", pe.Code, pe.Message)
		}

		// SCRAM pass-through: two clients in a transaction each need a
		// server connection, both opened with the recovered ClientKey.
		ctx := ctxTimeout(t, 15*time.Second)
		var pids [2]string
		for i := range pids {
			c := connectDSN(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp))
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if got := scalarText(t, c, "SELECT current_user"); got != pgtest.RoleSCRAM {
				t.Fatalf("current_user %q", got)
			}
			pids[i] = scalarText(t, c, "SELECT pg_backend_pid()::text")
		}
		if pids[0] == pids[1] {
			t.Fatalf("both transactions on backend %s", pids[0])
		}
		if pe := loginPgError(t, p.dsn(pgtest.RoleSCRAM, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("wrong password: got %s %s", pe.Code, pe.Message)
		}
	})

	t.Run("md5 secret", func(t *testing.T) {
		t.Parallel()
		p := startPoolerd(t, func(c *config.Config) {
			c.AuthType = config.AuthMD5
			c.AuthFile = writeUserlist(t, pgtest.RoleMD5, auth.MD5Hash(pgtest.RoleMD5, pgtest.Password))
		})
		c := connectDSN(t, p.dsn(pgtest.RoleMD5, pgtest.Password, pgtest.DBApp))
		if got := scalarText(t, c, "SELECT current_user"); got != pgtest.RoleMD5 {
			t.Fatalf("current_user %q", got)
		}
		if pe := loginPgError(t, p.dsn(pgtest.RoleMD5, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("wrong password: got %s %s", pe.Code, pe.Message)
		}
	})

	t.Run("SCRAM secret with another salt", func(t *testing.T) {
		t.Parallel()
		salt := make([]byte, 16)
		_, _ = rand.Read(salt)
		other := auth.NewSCRAMVerifier(pgtest.Password, salt, 4096).String()
		p := startPoolerd(t, func(c *config.Config) {
			c.Upstream = ""
			c.Databases = []config.Database{{Name: "*", Host: pg.Host, Port: pg.Port}}
			c.AuthFile = writeUserlist(t, pgtest.RoleSCRAM, other)
		})
		// The client's password is right, so the client is authenticated;
		// poolerd's own login fails and the client is told why.
		pe := loginPgError(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp))
		text := pe.Message + "\n" + pe.Detail + "\n" + pe.Hint
		t.Logf("client got: %s %s: %s", pe.Severity, pe.Code, strings.ReplaceAll(text, "\n", " | "))
		if !strings.Contains(text, "server login failed") || !strings.Contains(text, auth.ErrStoredSCRAMMismatch.Error()) {
			t.Fatalf("error does not say what to fix: %s", text)
		}
		// Not 28P01 (the client's password is right) and not 08006 (nothing
		// is down): poolerd's own configuration is wrong.
		if pe.Code != "28000" {
			t.Errorf("code %s (%s), want 28000", pe.Code, pe.Message)
		}
		if pe.Severity != "FATAL" {
			t.Errorf("severity %s, want FATAL", pe.Severity)
		}
		// A wrong password is still refused as such.
		if pe := loginPgError(t, p.dsn(pgtest.RoleSCRAM, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("wrong password: got %s %s", pe.Code, pe.Message)
		}
	})
}

// scramAttempt runs a SCRAM exchange with poolerd as user and returns the
// salt and iteration count of the server-first-message and the final error.
func scramAttempt(t *testing.T, addr, user, password string) (salt, iter string, e *pgproto3.ErrorResponse) {
	t.Helper()
	c := dialFE(t, addr)
	c.startup(user)
	if m := c.recv(); !isSASL(m) {
		t.Fatalf("got %T, want AuthenticationSASL", m)
	}
	sc := auth.NewSCRAMClient(password, rand.Reader)
	c.send(&pgproto3.SASLInitialResponse{AuthMechanism: auth.SCRAMMechanism, Data: sc.ClientFirst()})
	m := c.recv()
	cont, ok := m.(*pgproto3.AuthenticationSASLContinue)
	if !ok {
		t.Fatalf("got %T, want AuthenticationSASLContinue", m)
	}
	for _, attr := range strings.Split(string(cont.Data), ",") {
		switch {
		case strings.HasPrefix(attr, "s="):
			salt = attr[2:]
		case strings.HasPrefix(attr, "i="):
			iter = attr[2:]
		}
	}
	final, err := sc.HandleServerFirst(cont.Data)
	if err != nil {
		t.Fatalf("server-first-message: %v", err)
	}
	c.send(&pgproto3.SASLResponse{Data: final})
	e = c.expectError()
	c.expectClosed(3 * time.Second)
	return salt, iter, e
}

func TestAuthUnknownUserSCRAM(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)

	unknown := loginPgError(t, p.dsn("nobody", pgtest.Password, pgtest.DBApp))
	wrong := loginPgError(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp))
	if unknown.Code != "28P01" || wrong.Code != "28P01" {
		t.Fatalf("unknown user: %s %s; wrong password: %s %s; want 28P01 for both",
			unknown.Code, unknown.Message, wrong.Code, wrong.Message)
	}
	if a, b := strings.ReplaceAll(unknown.Message, "nobody", "X"), strings.ReplaceAll(wrong.Message, pgtest.RoleApp, "X"); a != b {
		t.Errorf("messages differ: %q vs %q", unknown.Message, wrong.Message)
	}
	if unknown.Severity != wrong.Severity || unknown.Detail != wrong.Detail || unknown.Hint != wrong.Hint {
		t.Errorf("errors differ: %+v vs %+v", unknown, wrong)
	}
	if unknown.Detail != "SASL authentication failed" {
		t.Errorf("detail %q, want PgBouncer's SASL authentication failed", unknown.Detail)
	}

	// An unknown user goes through the whole exchange, with a salt that
	// stays the same from one attempt to the next, as a real user's.
	salt1, iter1, e1 := scramAttempt(t, p.addr, "nobody", pgtest.Password)
	salt2, _, e2 := scramAttempt(t, p.addr, "nobody", pgtest.Password)
	_, iterApp, eApp := scramAttempt(t, p.addr, pgtest.RoleApp, "wrong")
	for _, e := range []*pgproto3.ErrorResponse{e1, e2, eApp} {
		if e.Code != "28P01" || e.Severity != "FATAL" {
			t.Errorf("got %s %s %s, want FATAL 28P01", e.Severity, e.Code, e.Message)
		}
	}
	if salt1 == "" || salt1 != salt2 {
		t.Errorf("unknown user's salt changes between attempts: %q, %q", salt1, salt2)
	}
	if raw, err := base64.StdEncoding.DecodeString(salt1); err != nil || len(raw) == 0 {
		t.Errorf("unknown user's salt %q is not base64: %v", salt1, err)
	}
	if iter1 != iterApp {
		t.Errorf("iteration count %s for an unknown user, %s for a real one", iter1, iterApp)
	}
}

func TestAuthNoSecretsInLogs(t *testing.T) {
	t.Parallel()
	verifier := scramSecretOf(t, pgtest.RoleSCRAM)
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthFile = writeUserlist(t, pgtest.RoleSCRAM, verifier)
		// A database whose server login fails: its (wrong) password must
		// not be logged either.
		c.Databases = []config.Database{{Name: "badlogin", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp,
			User: pgtest.RoleApp, Password: "wrong-server-password"}}
	})
	c := p.connect(t)
	scalarText(t, c, "SELECT 1")
	c.Close(context.Background())
	if pe := loginPgError(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
		t.Fatalf("got %s", pe.Code)
	}
	c = connectDSN(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp))
	scalarText(t, c, "SELECT 1")
	c.Close(context.Background())
	if pe := loginPgError(t, p.dsn(pgtest.RoleSCRAM, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
		t.Fatalf("got %s", pe.Code)
	}
	if pe := loginPgError(t, p.dsn(pgtest.RoleApp, pgtest.Password, "badlogin")); !strings.Contains(pe.Message, "server login failed") {
		t.Errorf("bad server password: got %s %s", pe.Code, pe.Message)
	}
	// A raw exchange, so that the SCRAM messages with a wrong proof are
	// covered too.
	scramAttempt(t, p.addr, pgtest.RoleApp, "wrong")

	var logs string
	eventually(t, 5*time.Second, "disconnections logged", func() bool {
		logs = p.logs.String()
		return strings.Count(logs, "client disconnected") >= 2
	})
	if !strings.Contains(logs, "client authentication failed") {
		t.Fatalf("the failed logins were not logged; the check below would prove nothing:\n%s", logs)
	}
	forbidden := []string{pgtest.Password, "wrong", verifier}
	// The parts of the verifier, in case they are logged separately.
	if _, rest, ok := strings.Cut(verifier, ":"); ok {
		salt, keys, _ := strings.Cut(rest, "$")
		stored, server, _ := strings.Cut(keys, ":")
		forbidden = append(forbidden, salt, stored, server)
	}
	for _, s := range forbidden {
		if i := strings.Index(logs, s); i >= 0 {
			lo, hi := max(0, i-200), min(len(logs), i+len(s)+50)
			t.Errorf("the log contains a secret (%d bytes) near: %q", len(s), logs[lo:hi])
		}
	}
}

func TestAuthClientLoginTimeout(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ClientLoginTimeout = 300 * time.Millisecond })
	sm := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": pgtest.RoleApp, "database": pgtest.DBApp}}
	pkt, err := sm.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		stall func(c *feConn)
	}{
		{"silent", func(c *feConn) {}},
		{"half a length", func(c *feConn) { c.write(pkt[:2]) }},
		{"half a startup packet", func(c *feConn) { c.write(pkt[:len(pkt)/2]) }},
		{"after SSLRequest", func(c *feConn) {
			c.write(startupPacket(codeSSLRequest, nil))
			var b [1]byte
			if _, err := c.nc.Read(b[:]); err != nil || b[0] != 'N' {
				c.t.Fatalf("SSLRequest answer %q, %v", b[0], err)
			}
		}},
		{"during SCRAM", func(c *feConn) {
			c.write(pkt)
			if m := c.recv(); !isSASL(m) {
				c.t.Fatalf("got %T, want AuthenticationSASL", m)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			c := dialFE(t, p.addr)
			tc.stall(c)
			errs := c.expectClosed(2 * time.Second)
			elapsed := time.Since(start)
			if elapsed < 250*time.Millisecond {
				t.Errorf("closed after %s, before client_login_timeout", elapsed)
			}
			for _, e := range errs {
				if e.Code != "08006" && e.Code != "57014" && e.Code != "08P01" {
					t.Errorf("got %s %s %s", e.Severity, e.Code, e.Message)
				}
				t.Logf("after %s: %s %s %s", elapsed.Round(time.Millisecond), e.Severity, e.Code, e.Message)
			}
		})
	}
}

// TestScramWithMD5Secrets: auth_type scram-sha-256 while some users still
// have md5 secrets (PgBouncer's md5-to-SCRAM migration) starts, with a
// warning naming them; those users' logins fail with 28P01 (SCRAM cannot
// check an md5 hash), every other user logs in. The admin console's SET
// auth_type makes the same switch at run time.
func TestScramWithMD5Secrets(t *testing.T) {
	t.Parallel()
	md5Secret := auth.MD5Hash(pgtest.RoleMD5, pgtest.Password)
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthSCRAM
		c.Users = []config.User{{Name: pgtest.RoleMD5, Password: md5Secret}, {Name: pgtest.RoleSCRAM, Password: pgtest.Password}}
	})
	if w := strings.Join(p.cfg.Warnings(), "\n"); !strings.Contains(w, `user "md5_user" has an md5 secret, which SCRAM cannot check`) {
		t.Errorf("warnings %q", w)
	}
	if pe := loginPgError(t, p.dsn(pgtest.RoleMD5, pgtest.Password, pgtest.DBApp)); pe.Code != "28P01" {
		t.Errorf("md5_user: got %s %s, want 28P01", pe.Code, pe.Message)
	}
	pc := connectDSN(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp))
	if got := scalarText(t, pc, "SELECT current_user"); got != pgtest.RoleSCRAM {
		t.Fatalf("current_user %q", got)
	}
	// Back to md5 and to scram-sha-256 at run time (the console's SET).
	if _, err := p.srv.Set("auth_type", "md5"); err != nil {
		t.Fatal(err)
	}
	_ = connectDSN(t, p.dsn(pgtest.RoleMD5, pgtest.Password, pgtest.DBApp))
	if _, err := p.srv.Set("auth_type", "scram-sha-256"); err != nil {
		t.Fatalf("SET auth_type scram-sha-256 with an md5 secret present: %v", err)
	}
	if pe := loginPgError(t, p.dsn(pgtest.RoleMD5, pgtest.Password, pgtest.DBApp)); pe.Code != "28P01" {
		t.Errorf("md5_user after SET: got %s %s, want 28P01", pe.Code, pe.Message)
	}
}
