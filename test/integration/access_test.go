package integration

// Access rules (auth_type hba), auth_query, client_tls_protocols and
// client_tls_ciphers, and PostgreSQL 17's direct TLS (issue 14).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/hba"
	"github.com/poolerd/poolerd/test/pgtest"
)

// withReloader lets p.srv.Reload() validate p's configuration again (which
// reads its files again), as a SIGHUP would re-read the file.
func withReloader(p *instance) {
	p.srv.SetReloader(func() (*config.Config, error) {
		c := *p.cfg
		if err := c.Validate(); err != nil {
			return nil, err
		}
		return &c, nil
	}, nil)
}

// loginFrom connects with dsn from a local address (127.0.0.x), returning
// the error of the login or of SELECT current_user, and the user.
func loginFrom(t *testing.T, from, dsn string) (string, error) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	cfg.DialFunc = d.DialContext
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	res, err := c.Exec(ctx, "SELECT current_user").ReadAll()
	if err != nil {
		return "", err
	}
	return string(res[0].Rows[0][0]), nil
}

// TestHBA: auth_type hba with an auth_hba_file decides each login by its
// first matching line, as PostgreSQL would: trust, reject, password,
// scram-sha-256 and cert rules, @file includes, addresses, hostssl, no
// matching line; a reload reads the file again and connected clients keep
// their session.
func TestHBA(t *testing.T) {
	t.Parallel()
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hbaFile := filepath.Join(dir, "hba.conf")
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("trusted", "# users let in without a password\n"+pgtest.RoleTrust+"\n")
	write("ident.conf", "certs  "+pgtest.RoleApp+"  "+pgtest.RoleMD5+"\n")
	const rules = `
hostssl all          app           127.0.0.1/32  cert
hostssl all          md5_user,trust_user  127.0.0.1/32  cert map=certs
host    all          all           127.0.0.2/32  reject
host    app          scram_user    127.0.0.0 255.0.0.0  scram-sha-256
host    all          @trusted      127.0.0.1/32  trust
host    all          clear_user    127.0.0.1/32  password
`
	write("hba.conf", rules)
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthHBA
		c.AuthHBAFile = hbaFile
		c.AuthIdentFile = filepath.Join(dir, "ident.conf")
		c.ClientTLSSSLMode = "prefer"
		c.ClientTLSCertFile, c.ClientTLSKeyFile, c.ClientTLSCAFile = files.ServerCert, files.ServerKey, files.CA
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password}, {Name: pgtest.RoleClear, Password: pgtest.Password},
			{Name: pgtest.RoleTrust}, {Name: pgtest.RoleMD5, Password: pgtest.Password}}
	})
	withReloader(p)
	withCert := "sslmode=verify-full&sslrootcert=" + files.CA + "&sslcert=" + files.ClientCert + "&sslkey=" + files.ClientKey
	tlsDSN := func(user, password, db, params string) string {
		return strings.Replace(p.dsn(user, password, db), "sslmode=disable", params, 1)
	}
	for _, tc := range []struct {
		name, from, dsn string
		want            string // the user, or the refusal's text
	}{
		{"cert rule, certificate for the user", "127.0.0.1", tlsDSN(pgtest.RoleApp, "not-asked", pgtest.DBApp, withCert), pgtest.RoleApp},
		{"cert rule, no certificate", "127.0.0.1", tlsDSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp, "sslmode=require"), "certificate authentication failed"},
		{"cert rule with an ident map: app's certificate as md5_user", "127.0.0.1", tlsDSN(pgtest.RoleMD5, "not-asked", pgtest.DBApp, withCert), pgtest.RoleMD5},
		{"cert rule with an ident map that does not allow it", "127.0.0.1", tlsDSN(pgtest.RoleTrust, "not-asked", pgtest.DBApp, withCert), `ident map "certs" does not let the certificate's common name "app" log in as "trust_user"`},
		{"no line for a plain app", "127.0.0.1", p.appDSN(), `no pg_hba.conf entry for host "127.0.0.1", user "app", database "app", SSL off`},
		{"scram rule", "127.0.0.1", p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp), pgtest.RoleSCRAM},
		{"scram rule, wrong password", "127.0.0.1", p.dsn(pgtest.RoleSCRAM, "wrong", pgtest.DBApp), "password authentication failed"},
		{"scram rule is for database app only", "127.0.0.1", p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBOther), `database "other", SSL off`},
		{"reject from 127.0.0.2", "127.0.0.2", p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp), `pg_hba.conf rejects connection for host "127.0.0.2"`},
		{"trust through an @file", "127.0.0.1", p.dsn(pgtest.RoleTrust, "", pgtest.DBApp), pgtest.RoleTrust},
		{"password rule", "127.0.0.1", p.dsn(pgtest.RoleClear, pgtest.Password, pgtest.DBApp), pgtest.RoleClear},
		{"password rule, wrong password", "127.0.0.1", p.dsn(pgtest.RoleClear, "wrong", pgtest.DBApp), "password authentication failed"},
		{"host matches TLS connections too", "127.0.0.1", tlsDSN(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp, "sslmode=require"), pgtest.RoleSCRAM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, err := loginFrom(t, tc.from, tc.dsn)
			if err != nil {
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || !strings.Contains(pe.Message+" "+pe.Detail, tc.want) {
					t.Fatalf("got %v, want %q", err, tc.want)
				}
				if strings.Contains(pe.Message, "pg_hba.conf") && (pe.Code != "28000" || !strings.Contains(pe.Hint, "auth_hba_file")) {
					t.Fatalf("refusal %s %q, hint %q: want 28000 and a hint naming auth_hba_file", pe.Code, pe.Message, pe.Hint)
				}
				return
			}
			if user != tc.want {
				t.Fatalf("logged in as %q, want %q", user, tc.want)
			}
		})
	}

	// Reload: scram_user is now rejected and plain app let in; the
	// scram_user connected before keeps its session.
	held := connectDSN(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp))
	write("hba.conf", "host all scram_user 127.0.0.1/32 reject\nhost all app 127.0.0.1/32 scram-sha-256\n")
	if err := p.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := scalarText(t, held, "SELECT current_user"); got != pgtest.RoleSCRAM {
		t.Fatalf("the connected client after the reload: %q", got)
	}
	if _, err := loginFrom(t, "127.0.0.1", p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp)); err == nil || !strings.Contains(err.Error(), "rejects connection") {
		t.Fatalf("scram_user after the reload: %v, want rejected", err)
	}
	if user, err := loginFrom(t, "127.0.0.1", p.appDSN()); err != nil || user != pgtest.RoleApp {
		t.Fatalf("app after the reload: %v", err)
	}
	// A broken file fails the reload and keeps the running rules.
	write("hba.conf", "host all all all ident\n")
	if err := p.srv.Reload(); err == nil || !strings.Contains(err.Error(), "ident is not supported") {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if _, err := loginFrom(t, "127.0.0.1", p.appDSN()); err != nil {
		t.Fatalf("app after a failed reload: %v", err)
	}
}

// TestHBARulesYAML: the same rules given as auth_hba_rules.
func TestHBARulesYAML(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthType = config.AuthHBA
		c.AuthHBARules = []hba.RuleSpec{
			{Type: "host", Database: "all", User: pgtest.RoleApp, Address: "127.0.0.2", Method: "reject"},
			{Type: "host", Database: pgtest.DBApp, User: "all", Address: "127.0.0.0/8", Method: "md5"},
		}
	})
	if user, err := loginFrom(t, "127.0.0.1", p.appDSN()); err != nil || user != pgtest.RoleApp {
		t.Fatalf("app from 127.0.0.1: %v", err)
	}
	_, err := loginFrom(t, "127.0.0.2", p.appDSN())
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "28000" || !strings.Contains(pe.Hint, "auth_hba_rules[0]") {
		t.Fatalf("app from 127.0.0.2: %v, want rejected by auth_hba_rules[0]", err)
	}
	_, err = loginFrom(t, "127.0.0.1", p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther))
	if !errors.As(err, &pe) || !strings.Contains(pe.Message, "no pg_hba.conf entry") || !strings.Contains(pe.Hint, "auth_hba_rules") {
		t.Fatalf("database other: %v, want no entry", err)
	}
}

// TestAuthQuery: a role that exists only in PostgreSQL logs in through
// poolerd with auth_user and auth_query, and poolerd logs in to PostgreSQL
// as that role by SCRAM pass-through with the secret from pg_authid; a
// role whose VALID UNTIL has passed, a wrong password and an unknown role
// are refused.
func TestAuthQuery(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	const userPW, authPW = "aq-user-pw", "aq-auth-pw"
	authQueryRoles(ctx, t, "aq_auth", authPW, userPW, "aq_user", "aq_expired")
	su, err := pgx.Connect(ctx, pg.SuperDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	if _, err := su.Exec(ctx, "ALTER ROLE aq_expired VALID UNTIL '2001-01-01'"); err != nil {
		t.Fatal(err)
	}
	p := startPoolerd(t, func(c *config.Config) {
		c.AuthUser = "aq_auth"
		c.Users = []config.User{{Name: "aq_auth", Password: authPW}}
	})
	c := connectDSN(t, p.dsn("aq_user", userPW, pgtest.DBApp))
	if got := scalarText(t, c, "SELECT current_user"); got != "aq_user" {
		t.Fatalf("current_user %q", got)
	}
	// A second login comes from the cache, and a second server connection
	// logs in with the ClientKey again.
	c2 := connectDSN(t, p.dsn("aq_user", userPW, pgtest.DBApp))
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if got := scalarText(t, c2, "SELECT current_user"); got != "aq_user" {
		t.Fatalf("second client: current_user %q", got)
	}
	for _, tc := range []struct{ name, user, pw string }{
		{"wrong password", "aq_user", "wrong"},
		{"expired", "aq_expired", userPW},
		{"unknown role", "aq_nobody", userPW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pe := loginPgError(t, p.dsn(tc.user, tc.pw, pgtest.DBApp))
			if pe.Code != "28P01" {
				t.Fatalf("got %v, want 28P01", pe)
			}
		})
	}
	// auth_user that cannot read pg_authid: a refusal naming auth_query.
	t.Run("auth_user without the right", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			c.AuthUser = pgtest.RoleSCRAM
			c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password}}
		})
		pe := loginPgError(t, p.dsn("aq_user", userPW, pgtest.DBApp))
		if pe.Code != "28000" || !strings.Contains(pe.Hint, "auth_query") || !strings.Contains(pe.Message, "(bouncer config error)") {
			t.Fatalf("got %v (hint %q), want 28000 (bouncer config error) naming auth_query", pe, pe.Hint)
		}
	})
	// A database the wildcard entry serves but the server does not have:
	// auth_query cannot log in there, and the client is told what a
	// direct login would tell it.
	t.Run("no such database", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			c.AuthUser = "aq_auth"
			c.Users = []config.User{{Name: "aq_auth", Password: authPW}}
			c.Databases = []config.Database{{Name: "*", Host: pg.Host, Port: pg.Port}}
		})
		pe := loginPgError(t, p.dsn("aq_user", userPW, "aq_nosuchdb"))
		if pe.Code != "3D000" || pe.Message != `database "aq_nosuchdb" does not exist` {
			t.Fatalf("got %s %q, want 3D000 database \"aq_nosuchdb\" does not exist", pe.Code, pe.Message)
		}
	})
}

// clientTLSInstance starts poolerd with client TLS and the given protocol
// and cipher settings.
func clientTLSInstance(t *testing.T, protocols, ciphers string, more ...func(c *config.Config)) (*instance, pgtest.TLSFiles) {
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := startPoolerd(t, func(c *config.Config) {
		c.ClientTLSSSLMode = "require"
		c.ClientTLSCertFile, c.ClientTLSKeyFile = files.ServerCert, files.ServerKey
		c.ClientTLSProtocols, c.ClientTLSCiphers = protocols, ciphers
		for _, m := range more {
			m(c)
		}
	})
	return p, files
}

// tlsDial opens a TLS connection to poolerd, with an SSLRequest first
// unless direct, and returns it after the handshake.
func tlsDial(t *testing.T, addr string, cfg *tls.Config, direct bool) (*tls.Conn, error) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if !direct {
		if _, err := nc.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := nc.Read(b[:]); err != nil || b[0] != 'S' {
			t.Fatalf("SSLRequest answered %q, %v", b[0], err)
		}
	}
	tc := tls.Client(nc, cfg)
	return tc, tc.Handshake()
}

// TestClientTLSProtocolsAndCiphers: client_tls_protocols and
// client_tls_ciphers limit what a client may negotiate.
func TestClientTLSProtocolsAndCiphers(t *testing.T) {
	t.Parallel()
	t.Run("tlsv1.3 only", func(t *testing.T) {
		p, _ := clientTLSInstance(t, "tlsv1.3", "default")
		if _, err := tlsDial(t, p.addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}, false); err == nil {
			t.Fatal("a TLS 1.2 client was accepted with client_tls_protocols tlsv1.3")
		}
		c, err := tlsDial(t, p.addr, &tls.Config{InsecureSkipVerify: true}, false)
		if err != nil || c.ConnectionState().Version != tls.VersionTLS13 {
			t.Fatalf("TLS 1.3 client: %v", err)
		}
	})
	t.Run("secure refuses TLS 1.1", func(t *testing.T) {
		p, _ := clientTLSInstance(t, "secure", "default")
		if _, err := tlsDial(t, p.addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, false); err == nil {
			t.Fatal("a TLS 1.1 client was accepted with client_tls_protocols secure")
		}
	})
	t.Run("one cipher", func(t *testing.T) {
		p, _ := clientTLSInstance(t, "tlsv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384")
		base := &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12}
		other := base.Clone()
		other.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
		if _, err := tlsDial(t, p.addr, other, false); err == nil {
			t.Fatal("a client without the configured cipher was accepted")
		}
		c, err := tlsDial(t, p.addr, base, false)
		if err != nil || c.ConnectionState().CipherSuite != tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 {
			t.Fatalf("got %v", err)
		}
		// And a real client logs in over it.
		dsn := strings.Replace(p.appDSN(), "sslmode=disable", "sslmode=require", 1)
		if err := selectOne(dsn); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("client_tls_ecdhcurve", func(t *testing.T) {
		p, _ := clientTLSInstance(t, "secure", "default", func(c *config.Config) { c.ClientTLSECDHCurve = "secp384r1" })
		if _, err := tlsDial(t, p.addr, &tls.Config{InsecureSkipVerify: true, CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP256}}, false); err == nil {
			t.Fatal("a client offering X25519 and P-256 only was accepted with client_tls_ecdhcurve secp384r1")
		}
		c, err := tlsDial(t, p.addr, &tls.Config{InsecureSkipVerify: true, CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP384}}, false)
		if err != nil {
			t.Fatalf("a client offering P-384: %v", err)
		}
		if cs := c.ConnectionState(); cs.CurveID != tls.CurveP384 {
			t.Errorf("negotiated curve %v, want P-384", cs.CurveID)
		}
	})
}

// TestDirectTLS: PostgreSQL 17's direct TLS negotiation (the client starts
// with a ClientHello, ALPN "postgresql"), with pgx's
// sslnegotiation=direct and by hand; a client without ALPN is refused
// with an ErrorResponse, one with another protocol fails the handshake.
func TestDirectTLS(t *testing.T) {
	t.Parallel()
	p, files := clientTLSInstance(t, "secure", "default")
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	t.Run("pgx sslnegotiation=direct", func(t *testing.T) {
		dsn := strings.Replace(p.appDSN(), "sslmode=disable", "sslmode=verify-full&sslnegotiation=direct&sslrootcert="+files.CA, 1)
		c := connectDSN(t, dsn)
		if got := scalarText(t, c, "SELECT 'direct'"); got != "direct" {
			t.Fatal(got)
		}
		if _, ok := c.PgConn().Conn().(*tls.Conn); !ok {
			t.Fatal("not TLS")
		}
	})
	startup := func(c *tls.Conn) *pgproto3.Frontend {
		fe := pgproto3.NewFrontend(c, c)
		fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
			Parameters: map[string]string{"user": pgtest.RoleApp, "database": pgtest.DBApp}})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		return fe
	}
	t.Run("by hand", func(t *testing.T) {
		c, err := tlsDial(t, p.addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", NextProtos: []string{"postgresql"}}, true)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := startup(c).Receive()
		if _, ok := msg.(*pgproto3.AuthenticationSASL); err != nil || !ok {
			t.Fatalf("after the startup message: %T %v, want AuthenticationSASL", msg, err)
		}
	})
	t.Run("no ALPN", func(t *testing.T) {
		c, err := tlsDial(t, p.addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}, true)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := startup(c).Receive()
		e, ok := msg.(*pgproto3.ErrorResponse)
		if err != nil || !ok || e.Code != "08P01" || !strings.Contains(e.Message, "ALPN") {
			t.Fatalf("got %T %+v %v, want 08P01 about ALPN", msg, msg, err)
		}
	})
	t.Run("another ALPN protocol", func(t *testing.T) {
		if _, err := tlsDial(t, p.addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", NextProtos: []string{"h2"}}, true); err == nil {
			t.Fatal("the handshake succeeded")
		}
	})
	t.Run("TLS off: a ClientHello is a bad startup packet", func(t *testing.T) {
		p := startPoolerd(t, nil)
		nc, err := net.DialTimeout("tcp", p.addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		hello := []byte{0x16, 0x03, 0x01, 0x00, 0x10}
		hello = binary.BigEndian.AppendUint32(hello, 0)
		if _, err := nc.Write(hello); err != nil {
			t.Fatal(err)
		}
		fe := pgproto3.NewFrontend(nc, nc)
		msg, err := fe.Receive()
		if _, ok := msg.(*pgproto3.ErrorResponse); err != nil || !ok {
			t.Fatalf("got %T %v, want an ErrorResponse", msg, err)
		}
	})
}

// authQueryRoles creates, afresh, an auth_user role that may read
// pg_authid and login roles with password userPW, all with SCRAM secrets
// and CONNECT on the app database (where auth_query runs: a shared
// catalog's rights are per database).
func authQueryRoles(ctx context.Context, t *testing.T, authRole, authPW, userPW string, users ...string) {
	t.Helper()
	su, err := pgx.Connect(ctx, pg.SuperDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	all := append([]string{authRole}, users...)
	qs := []string{
		// From an earlier run in this process (-count): DROP OWNED takes
		// their rights away first.
		`DO $$ DECLARE r text; BEGIN
			FOR r IN SELECT rolname FROM pg_catalog.pg_roles WHERE rolname = ANY('{` + strings.Join(all, ",") + `}') LOOP
				EXECUTE format('DROP OWNED BY %I', r); EXECUTE format('DROP ROLE %I', r);
			END LOOP; END $$`,
		"SET password_encryption = 'scram-sha-256'",
		"CREATE ROLE " + authRole + " LOGIN PASSWORD '" + authPW + "'",
		"GRANT SELECT ON pg_catalog.pg_authid TO " + authRole,
	}
	for _, u := range users {
		qs = append(qs, "CREATE ROLE "+u+" LOGIN PASSWORD '"+userPW+"'")
	}
	qs = append(qs, "GRANT CONNECT ON DATABASE "+pgtest.DBApp+" TO "+strings.Join(all, ", "))
	for _, q := range qs {
		// Tests running side by side GRANT on the same catalog rows
		// (pg_authid, the database): PostgreSQL refuses one of two
		// concurrent updates of a row's ACL; it succeeds when tried again.
		for try := 0; ; try++ {
			_, err := su.Exec(ctx, q)
			var pe *pgconn.PgError
			if err != nil && errors.As(err, &pe) && pe.Code == "XX000" && strings.Contains(pe.Message, "tuple concurrently updated") && try < 20 {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			break
		}
	}
}

// TestAuthQueryConsole: a console login of a user poolerd has no secret
// for is looked up with auth_query in the global auth_dbname, as PgBouncer
// does for its admin database; without auth_dbname there is no server to
// run it on, and the login is refused as PgBouncer refuses it, a
// configuration error.
func TestAuthQueryConsole(t *testing.T) {
	t.Parallel()
	const userPW, authPW = "aqc-user-pw", "aqc-auth-pw"
	authQueryRoles(ctxTimeout(t, 30*time.Second), t, "aqc_auth", authPW, userPW, "aqc_stats")
	start := func(dbname string) *instance {
		return startPoolerd(t, func(c *config.Config) {
			c.AuthUser, c.AuthDBName = "aqc_auth", dbname
			c.Users = []config.User{{Name: "aqc_auth", Password: authPW}}
			c.StatsUsers = []string{"aqc_stats"}
			// The wildcard's own auth_dbname is not the console's.
			c.Databases = []config.Database{{Name: "*", AuthDBName: "nowhere"}}
		})
	}
	p := start(pgtest.DBApp)
	c := connectDSN(t, p.dsn("aqc_stats", userPW, "pgbouncer"))
	if _, err := c.Exec(ctxTimeout(t, 10*time.Second), "SHOW STATS", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("SHOW STATS as a stats user found by auth_query: %v", err)
	}
	if pe := loginPgError(t, p.dsn("aqc_stats", "wrong", "pgbouncer")); pe.Code != "28P01" {
		t.Errorf("wrong password: %s %s", pe.Code, pe.Message)
	}
	if pe := loginPgError(t, start("").dsn("aqc_stats", userPW, "pgbouncer")); pe.Code != "08P01" ||
		pe.Message != "bouncer config error" || pe.Detail != `cannot use the reserved "pgbouncer" database as an auth_dbname` {
		t.Errorf("no auth_dbname: %s %s, want 08P01 cannot use the reserved database", pe.Code, pe.Message)
	}
}

// TestAuthQueryPerDatabase: auth_user, auth_query and auth_dbname of a
// database entry (PgBouncer's per-database auth_user). Entry a looks its
// unknown users up as pdq_auth with the default query; entry b (database
// other) with its own query, which reads a table only database app has,
// in entry a's database (auth_dbname); entry c has no auth_user, so an
// unknown user is refused there; entry d is b without auth_dbname: its
// query runs in database other and fails.
func TestAuthQueryPerDatabase(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	const userPW, authPW = "pdq-user-pw", "pdq-auth-pw"
	authQueryRoles(ctx, t, "pdq_auth", authPW, userPW, "pdq_user")
	su, err := pgx.Connect(ctx, pg.SuperDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
	for _, q := range []string{
		"DROP TABLE IF EXISTS pdq_secrets",
		"CREATE TABLE pdq_secrets AS SELECT rolname::text AS name, rolpassword AS secret FROM pg_catalog.pg_authid WHERE rolname = 'pdq_user'",
		"GRANT SELECT ON pdq_secrets TO pdq_auth",
		"GRANT CONNECT ON DATABASE " + pgtest.DBOther + " TO pdq_user, pdq_auth",
	} {
		if _, err := su.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	const ownQuery = "SELECT name, secret FROM pdq_secrets WHERE name = $1"
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = ""
		c.Users = []config.User{{Name: "pdq_auth", Password: authPW}}
		c.AdminUsers = []string{"pdq_auth"}
		c.Databases = []config.Database{
			{Name: "a", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, AuthUser: "pdq_auth"},
			{Name: "b", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBOther, AuthUser: "pdq_auth", AuthQuery: ownQuery, AuthDBName: "a"},
			{Name: "c", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp},
			{Name: "d", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBOther, AuthUser: "pdq_auth", AuthQuery: ownQuery},
			// auth_dbname that cannot run the query: refused at login,
			// as PgBouncer does (the configuration starts with a warning).
			{Name: "e", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, AuthUser: "pdq_auth", AuthDBName: "nowhere"},
			{Name: "f", Host: pg.Host, Port: pg.Port, DBName: pgtest.DBApp, AuthUser: "pdq_auth", AuthDBName: "pgbouncer"},
		}
	})
	for db, want := range map[string]string{"a": pgtest.DBApp, "b": pgtest.DBOther} {
		c := connectDSN(t, p.dsn("pdq_user", userPW, db))
		if got := scalarText(t, c, "SELECT current_user || ' ' || current_database()"); got != "pdq_user "+want {
			t.Errorf("entry %s: %q, want pdq_user in %s", db, got, want)
		}
	}
	// SHOW USERS lists a user only auth_query knows, with its clients, as
	// PgBouncer lists every user it has met.
	adm := connectDSN(t, p.dsn("pdq_auth", authPW, "pgbouncer"))
	rows, err := adm.Query(ctx, "SHOW USERS", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	clients := ""
	for rows.Next() {
		if v := rows.RawValues(); string(v[0]) == "pdq_user" {
			clients = string(v[7]) // current_client_connections
		}
	}
	rows.Close()
	if clients != "2" {
		t.Errorf("SHOW USERS: pdq_user's current_client_connections %q, want 2 (a row for the user auth_query found)", clients)
	}
	if pe := loginPgError(t, p.dsn("pdq_user", userPW, "c")); pe.Code != "28P01" {
		t.Errorf("entry c (no auth_user): %s %s, want 28P01", pe.Code, pe.Message)
	}
	if pe := loginPgError(t, p.dsn("pdq_user", userPW, "d")); pe.Code != "28000" || !strings.Contains(pe.Hint, "auth_query") {
		t.Errorf("entry d (its query in database other, which has no pdq_secrets): %s %s (hint %q), want 28000 naming auth_query", pe.Code, pe.Message, pe.Hint)
	}
	for db, want := range map[string]string{
		"e": `authentication database "nowhere" is not configured`,
		"f": `cannot use the reserved "pgbouncer" database as an auth_dbname`,
	} {
		// PgBouncer's message, and why in DETAIL.
		if pe := loginPgError(t, p.dsn("pdq_user", userPW, db)); pe.Code != "08P01" || pe.Message != "bouncer config error" || pe.Detail != want || pe.Hint == "" {
			t.Errorf("entry %s: %s %q (detail %q), want 08P01 bouncer config error, detail %q, with a hint", db, pe.Code, pe.Message, pe.Detail, want)
		}
	}
	// A DISABLEd auth_dbname refuses the lookups that run there.
	if _, err := adm.Exec(ctx, "DISABLE a", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if pe := loginPgError(t, p.dsn("pdq_user", userPW, "b")); pe.Code != "08P01" || pe.Message != `authentication database "a" is disabled` {
		t.Errorf("entry b with a disabled: %s %q", pe.Code, pe.Message)
	}
	if _, err := adm.Exec(ctx, "ENABLE a", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	connectDSN(t, p.dsn("pdq_user", userPW, "b"))
}
