package integration

// Security at the edges (issue 14): TLS on both sides, max_packet_size,
// the delay after failed logins, and the scan of every log for secrets.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TLS to PostgreSQL (issue 14, item 2): a PostgreSQL that accepts TCP
// connections over SSL only (hostssl rules), and poolerd in front of it
// with each server_tls_sslmode.
func TestServerTLS(t *testing.T) {
	t.Parallel()
	sslPG, err := pgtest.Start(pgtest.Options{Logf: t.Logf, SSL: true})
	if err != nil {
		t.Fatalf("start PostgreSQL with ssl: %v", err)
	}
	t.Cleanup(func() { _ = sslPG.Cleanup() })
	other, err := pgtest.MakeTLSFiles(t.TempDir()) // a CA that signed nothing of this server's
	if err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, mode, ca string) *instance {
		return startPoolerd(t, func(c *config.Config) {
			// The URL's own sslmode would win over server_tls_sslmode.
			c.Upstream = strings.TrimSuffix(sslPG.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp), "?sslmode=require")
			c.ServerTLSSSLMode = mode
			c.ServerTLSCAFile = ca
			c.MaxSize = 2
			c.ReconnectBackoffBase = 50 * time.Millisecond
			c.AdminUsers = []string{pgtest.RoleApp}
			// The pool's connections are counted: one in a hand-off
			// check is not idle, so the next query would open another.
			c.VerifyHandoff = config.VerifyHandoffOff
		})
	}
	for _, tc := range []struct{ mode, ca string }{
		{"prefer", ""}, {"require", ""}, {"allow", ""},
		{"verify-ca", sslPG.TLS.CA}, {"verify-full", sslPG.TLS.CA},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			p := start(t, tc.mode, tc.ca)
			c := p.connect(t)
			if got := scalarText(t, c, "SELECT ssl::text || ' ' || version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"); !strings.HasPrefix(got, "true TLSv1.") {
				t.Fatalf("the server connection's pg_stat_ssl: %q, want TLS", got)
			}
			// Hold the server connection while the console looks at it.
			if _, err := c.Exec(context.Background(), "BEGIN"); err != nil {
				t.Fatal(err)
			}
			adm := obAdmin(t, p, pgtest.RoleApp)
			defer adm.Close(context.Background())
			tb := obShow(t, adm, "SHOW SERVERS")
			if len(tb.Rows) == 0 || !strings.HasPrefix(tb.val(0, "tls"), "TLSv1.") {
				t.Fatalf("SHOW SERVERS tls column: %v", tb)
			}
			var tlsConns int
			for _, n := range p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).TLSConnections {
				tlsConns += n
			}
			if tlsConns != 1 {
				t.Fatalf("TLS server connections in the pool's snapshot (poolerd_server_tls_connections): %d, want 1", tlsConns)
			}
		})
	}
	// server_tls_protocols and server_tls_ciphers: the version and suite
	// PostgreSQL reports for the server connection.
	t.Run("server_tls_protocols and ciphers", func(t *testing.T) {
		for _, tc := range []struct{ protocols, ciphers, want string }{
			{"tlsv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "TLSv1.2 ECDHE-ECDSA-AES128-GCM-SHA256"},
			{"tlsv1.2", "ECDHE-ECDSA-CHACHA20-POLY1305", "TLSv1.2 ECDHE-ECDSA-CHACHA20-POLY1305"},
			{"tlsv1.3", "default", "TLSv1.3 "},
		} {
			p := startPoolerd(t, func(c *config.Config) {
				c.Upstream = strings.TrimSuffix(sslPG.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp), "?sslmode=require")
				c.ServerTLSSSLMode = "require"
				c.ServerTLSProtocols, c.ServerTLSCiphers = tc.protocols, tc.ciphers
			})
			c := p.connect(t)
			if got := scalarText(t, c, "SELECT version || ' ' || cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()"); !strings.HasPrefix(got, tc.want) {
				t.Errorf("%s, %s: pg_stat_ssl %q, want %q", tc.protocols, tc.ciphers, got, tc.want)
			}
		}
	})
	for _, tc := range []struct{ name, mode, ca, want string }{
		{"disable", "disable", "", "no encryption"},
		{"verify-ca with another CA", "verify-ca", other.CA, "certificate"},
		{"verify-full with another CA", "verify-full", other.CA, "certificate"},
		// No CA file: the system's CAs (as PgBouncer), which did not sign
		// the test server's certificate.
		{"verify-full with the system's CAs", "verify-full", "", "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, tc.mode, tc.ca)
			err := selectOne(p.appDSN())
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || !strings.Contains(pe.Detail+pe.Message, tc.want) {
				t.Fatalf("got %v, want an error whose detail mentions %q", err, tc.want)
			}
			if tc.mode == "disable" && !strings.Contains(pe.Hint, "server_tls_sslmode") {
				t.Errorf("hint %q does not name server_tls_sslmode", pe.Hint)
			}
			t.Logf("%s: %s: %s", tc.name, pe.Message, pe.Detail)
		})
	}
	// Issue 14's "done when": the real psql with sslmode=verify-full and
	// host=localhost (the name in the certificate poolerd presents)
	// through poolerd, which itself verifies PostgreSQL's certificate
	// (server_tls_sslmode verify-full). Each side has its own CA.
	t.Run("psql verify-full on both sides", func(t *testing.T) {
		psql := needTool(t, "psql")
		p := startPoolerd(t, func(c *config.Config) {
			c.Upstream = strings.TrimSuffix(sslPG.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp), "?sslmode=require")
			c.ServerTLSSSLMode = "verify-full"
			c.ServerTLSCAFile = sslPG.TLS.CA
			c.ClientTLSSSLMode = "require"
			c.ClientTLSCertFile, c.ClientTLSKeyFile = other.ServerCert, other.ServerKey
			c.MaxSize = 2
		})
		_, port, err := net.SplitHostPort(p.addr)
		if err != nil {
			t.Fatal(err)
		}
		conninfo := func(ca string) string {
			return fmt.Sprintf("sslmode=verify-full sslrootcert=%s host=localhost port=%s user=%s dbname=%s",
				ca, port, pgtest.RoleApp, pgtest.DBApp)
		}
		dir := t.TempDir()
		out, _ := p.runTool(t, 30*time.Second, pgtest.DBApp, dir, psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo(other.CA),
			"-c", "SELECT 40 + 2",
			"-c", "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
			"-c", `\conninfo`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) < 3 || lines[0] != "42" {
			t.Fatalf("psql output %q: want 42 first", out)
		}
		if lines[1] != "t" {
			t.Fatalf("pg_stat_ssl.ssl of poolerd's server connection: %q, want t (psql output %q)", lines[1], out)
		}
		if !strings.Contains(out, `on host "localhost"`) || !strings.Contains(out, "SSL connection (protocol: TLSv1.") {
			t.Fatalf(`psql's \conninfo does not show a TLS connection to localhost: %q`, out)
		}
		// verify-full is a real check: the CA of PostgreSQL's certificate
		// did not sign poolerd's, and psql refuses it. (Both CAs are named
		// "pgtest CA", so OpenSSL checks the signature with the wrong key
		// and may report "EVP lib" rather than "certificate verify
		// failed".)
		_, stderr, err := p.runToolErr(t, 30*time.Second, pgtest.DBApp, dir, psql, "-X", "-At", "-d", conninfo(sslPG.TLS.CA), "-c", "SELECT 1")
		if err == nil || !strings.Contains(stderr, "SSL error") && !strings.Contains(stderr, "certificate verify failed") {
			t.Fatalf("psql with another CA: %v, stderr %q; want an SSL error", err, stderr)
		}
		t.Logf("psql with another CA: %s", strings.TrimSpace(stderr))
	})
	// The plain test server refuses nothing: require fails there, prefer
	// falls back to plain TCP.
	t.Run("require without TLS on the server", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			c.Upstream = strings.TrimSuffix(c.Upstream, "?sslmode=disable")
			c.ServerTLSSSLMode = "require"
			c.ReconnectBackoffBase = 50 * time.Millisecond
		})
		err := selectOne(p.appDSN())
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || !strings.Contains(pe.Detail, "does not accept TLS") {
			t.Fatalf("got %v, want a refusal saying the server does not accept TLS", err)
		}
	})
}

// TLS from clients (issue 14, item 1): each client_tls_sslmode, with pgx
// clients in sslmode disable, require and verify-full, with and without a
// client certificate.
func TestClientTLS(t *testing.T) {
	t.Parallel()
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, mode string) *instance {
		return startPoolerd(t, func(c *config.Config) {
			c.ClientTLSSSLMode = mode
			c.ClientTLSCertFile, c.ClientTLSKeyFile = files.ServerCert, files.ServerKey
			c.ClientTLSCAFile = files.CA
		})
	}
	verifyFull := "sslmode=verify-full&sslrootcert=" + files.CA
	withCert := verifyFull + "&sslcert=" + files.ClientCert + "&sslkey=" + files.ClientKey
	type attempt struct {
		params string
		ok     bool
		want   string // in the error, when refused
	}
	for _, tc := range []struct {
		mode     string
		attempts []attempt
	}{
		{"disable", []attempt{{"sslmode=disable", true, ""}, {"sslmode=require", false, "refused TLS"}}},
		{"prefer", []attempt{{"sslmode=disable", true, ""}, {"sslmode=require", true, ""}, {verifyFull, true, ""}}},
		{"require", []attempt{{"sslmode=disable", false, "SSL required"}, {"sslmode=require", true, ""}, {verifyFull, true, ""}}},
		{"verify-ca", []attempt{{verifyFull, false, "certificate"}, {withCert, true, ""}}},
		{"verify-full", []attempt{{withCert, true, ""}}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			p := start(t, tc.mode)
			for _, a := range tc.attempts {
				dsn := strings.Replace(p.appDSN(), "sslmode=disable", a.params, 1)
				if !strings.Contains(dsn, a.params) {
					dsn += "&" + a.params
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				c, err := pgconn.Connect(ctx, dsn)
				var ssl string
				if err == nil {
					var res []*pgconn.Result
					res, err = c.Exec(ctx, "SELECT 1").ReadAll()
					_ = res
					ssl = fmt.Sprint(c.Conn() != nil && isTLS(c))
					c.Close(ctx)
				}
				cancel()
				switch {
				case a.ok && err != nil:
					t.Errorf("%s: %v", a.params, err)
				case !a.ok && (err == nil || !strings.Contains(err.Error(), a.want)):
					t.Errorf("%s: got %v, want a refusal mentioning %q", a.params, err, a.want)
				case a.ok && strings.Contains(a.params, "require") != (ssl == "true") && !strings.Contains(a.params, "verify"):
					t.Errorf("%s: TLS %s", a.params, ssl)
				}
			}
		})
	}
	// A TLS client is never parked (its socket's readiness says nothing of
	// the TLS records buffered above it): it stays usable across idle
	// periods longer than the parker's sweep, and a large result arrives
	// whole.
	// SET of the certificate and key one at a time (as PgBouncer's tests
	// and operators do): a key that does not match the running certificate
	// is kept as a value, with a NOTICE, and the running TLS settings stay
	// in use until the pair loads together.
	t.Run("SET certificate and key one at a time", func(t *testing.T) {
		next, err := pgtest.MakeTLSFiles(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		p := startPoolerd(t, func(c *config.Config) {
			c.ClientTLSSSLMode = "require"
			c.ClientTLSCertFile, c.ClientTLSKeyFile = files.ServerCert, files.ServerKey
			c.AdminUsers = []string{pgtest.RoleApp}
		})
		cfg, err := pgconn.ParseConfig(strings.Replace(p.dsn(pgtest.RoleApp, pgtest.Password, "pgbouncer"), "sslmode=disable", "sslmode=require", 1))
		if err != nil {
			t.Fatal(err)
		}
		var notices []string
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
		adm, err := pgconn.ConnectConfig(ctxTimeout(t, 10*time.Second), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer adm.Close(context.Background())
		set := func(key, file string) {
			t.Helper()
			notices = nil
			if _, err := adm.Exec(ctxTimeout(t, 10*time.Second), fmt.Sprintf("SET %s = '%s'", key, file)).ReadAll(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
		}
		verified := func(ca string) error {
			dsn := strings.Replace(p.appDSN(), "sslmode=disable", "sslmode=verify-full&sslrootcert="+ca, 1)
			return selectOne(dsn)
		}
		set("client_tls_key_file", next.ServerKey)
		if len(notices) != 1 || !strings.Contains(notices[0], "TLS settings could not be applied, still using old configuration") {
			t.Fatalf("SET of a key that does not match the certificate: notices %q", notices)
		}
		if err := verified(files.CA); err != nil {
			t.Fatalf("the running certificate after the half-done change: %v", err)
		}
		set("client_tls_cert_file", next.ServerCert)
		if len(notices) != 0 {
			t.Fatalf("SET of the matching certificate: notices %q", notices)
		}
		if err := verified(next.CA); err != nil {
			t.Fatalf("the new certificate: %v", err)
		}
		if err := verified(files.CA); err == nil {
			t.Fatal("the old CA still verifies the new certificate")
		}
	})
	// auth_type cert (PgBouncer's): the certificate's common name is the
	// user, and no password is asked.
	t.Run("auth_type cert", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			// verify-ca: the common name is auth_type cert's to check.
			c.ClientTLSSSLMode = "verify-ca"
			c.ClientTLSCertFile, c.ClientTLSKeyFile = files.ServerCert, files.ServerKey
			c.ClientTLSCAFile = files.CA
			c.AuthType = config.AuthCert
		})
		dsn := func(user string) string {
			return fmt.Sprintf("postgres://%s@%s/%s?%s", user, p.addr, pgtest.DBApp, withCert)
		}
		if got := currentUser(t, dsn(pgtest.RoleApp)); got != pgtest.RoleApp {
			t.Fatalf("current_user %q", got)
		}
		if pe := loginPgError(t, dsn(pgtest.RoleSCRAM)); pe.Code != "28000" || !strings.Contains(pe.Message, "certificate authentication failed") {
			t.Errorf("a certificate for another user: %s %s, want 28000", pe.Code, pe.Message)
		}
	})
	t.Run("idle and large over TLS", func(t *testing.T) {
		p := start(t, "require")
		dsn := strings.Replace(p.appDSN(), "sslmode=disable", "sslmode=require", 1)
		c := connectDSN(t, dsn)
		for range 3 {
			time.Sleep(1200 * time.Millisecond)
			if got := scalarText(t, c, "SELECT length(repeat('x', 3000000))::text"); got != "3000000" {
				t.Fatalf("got %q", got)
			}
			if got := scalarText(t, c, "SELECT length(string_agg(md5(g::text), '')) FROM generate_series(1, 100000) g"); got != "3200000" {
				t.Fatalf("got %q", got)
			}
		}
	})
	// verify-full refuses a certificate that names another user.
	t.Run("verify-full wrong user", func(t *testing.T) {
		p := start(t, "verify-full")
		dsn := strings.Replace(p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp), "sslmode=disable", withCert, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := pgconn.Connect(ctx, dsn)
		if err == nil {
			c.Close(ctx)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "28000" || !strings.Contains(pe.Detail, pgtest.RoleApp) {
			t.Fatalf("got %v, want 28000 naming the certificate's common name", err)
		}
	})
}

func isTLS(c *pgconn.PgConn) bool {
	_, ok := c.Conn().(*tls.Conn)
	return ok
}

// TestMaxPacketSize: a logged-in client's message longer than
// max_packet_size ends its connection with 08P01 naming the setting, and
// nothing of it reaches PostgreSQL; messages up to the limit go through.
func TestMaxPacketSize(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MaxPacketSize = 64 << 10 })
	c := p.connect(t)
	ctx := ctxTimeout(t, 20*time.Second)
	if got := scalarText(t, c, "SELECT length('"+strings.Repeat("x", 60<<10)+"')::text"); got != "61440" {
		t.Fatalf("a message under the limit: %q", got)
	}
	_, err := c.Exec(ctx, "SELECT length('"+strings.Repeat("y", 70<<10)+"')")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08P01" || !strings.Contains(pe.Message, "max_packet_size (65536)") ||
		!strings.Contains(pe.Hint, "POOLERD_MAX_PACKET_SIZE") {
		t.Fatalf("a message over the limit: %v, want FATAL 08P01 naming max_packet_size", err)
	}
}

// TestAuthFailureDelay: failed logins from one address are answered more
// and more slowly (auth_failure_delay doubling up to its maximum), while a
// login from another address is not slowed, and a successful login from
// the guessing address starts it over.
func TestAuthFailureDelay(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		// Delays far above what a login costs on a loaded machine under
		// -race (a SCRAM exchange took 0.4 s in a full make test), so that
		// "no delay" and "the first delay again" are told apart from the
		// doubled ones by the delay, not by the machine's speed.
		c.AuthFailureDelay = time.Second
		c.AuthFailureDelayMax = 2 * time.Second
	})
	login := func(from, password string) (time.Duration, error) {
		cfg, err := pgconn.ParseConfig(p.dsn(pgtest.RoleApp, password, pgtest.DBApp))
		if err != nil {
			t.Fatal(err)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		cfg.DialFunc = d.DialContext
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		c, err := pgconn.ConnectConfig(ctx, cfg)
		took := time.Since(start)
		if err == nil {
			c.Close(ctx)
		}
		return took, err
	}
	var took []time.Duration
	for range 4 {
		d, err := login("127.0.0.1", "wrong")
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "28P01" {
			t.Fatalf("wrong password: %v", err)
		}
		took = append(took, d)
	}
	t.Logf("failed logins from one address took %v", took)
	if took[0] < 950*time.Millisecond || took[1] < 1950*time.Millisecond || took[2] < 1950*time.Millisecond || took[3] < 1950*time.Millisecond || took[3] > 3500*time.Millisecond {
		t.Fatalf("failed logins took %v, want about 1, 2, 2, 2 s (doubling up to auth_failure_delay_max)", took)
	}
	if d, err := login("127.0.0.2", pgtest.Password); err != nil || d > 900*time.Millisecond {
		t.Fatalf("a login from another address: %v after %v, want no delay", err, d)
	}
	if _, err := login("127.0.0.1", pgtest.Password); err != nil {
		t.Fatalf("the right password from the guessing address: %v", err)
	}
	if d, err := login("127.0.0.1", "wrong"); err == nil || d < 950*time.Millisecond || d > 1900*time.Millisecond {
		t.Fatalf("a failure after a success: %v after %v, want the first delay again", err, d)
	}
}

// TestSecretsScanner: the scan TestMain runs over every poolerd log finds
// each kind of secret it looks for (and the suite fails if one is there).
func TestSecretsScanner(t *testing.T) {
	for _, line := range []string{
		`INFO	x	{"password": "` + pgtest.Password + `"}`,
		"upstream postgres://app:" + pgtest.Password + "@127.0.0.1/app",
		"secret SCRAM-SHA-256$4096:abc",
		"-----BEGIN EC PRIVATE KEY-----",
		strings.TrimPrefix(strings.SplitN(strings.SplitN(pg.SuperDSN("postgres"), "@", 2)[0], ":", 3)[2], ""),
	} {
		if len(secretsIn(line)) == 0 {
			t.Errorf("not found in %q", line)
		}
	}
	if got := secretsIn("client authentication failed: the SCRAM secret is not the server's"); len(got) != 0 {
		t.Errorf("false positive: %v", got)
	}
}

// selectOne connects to dsn and runs SELECT 1: the error of the first step
// that fails.
func selectOne(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "SELECT 1").ReadAll()
	return err
}
