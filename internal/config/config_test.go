package config

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/pgtest"
)

func load(t *testing.T, yaml string, args ...string) (*Config, error) {
	t.Helper()
	if yaml != "" {
		path := filepath.Join(t.TempDir(), "poolerd.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	l, err := NewLoader(args, io.Discard)
	if err != nil {
		return nil, err
	}
	return l.Load()
}

func TestQuickStartFlags(t *testing.T) {
	c, err := load(t, "", "--upstream", "postgres://app:secret@127.0.0.1:5432/app", "--listen", "127.0.0.1:6432",
		"--pool-mode", "session", "--pool-size", "7")
	if err != nil {
		t.Fatal(err)
	}
	if c.PoolMode != PoolSession || c.MaxSize != 7 || c.Listen != "127.0.0.1:6432" {
		t.Fatalf("flags not applied: %+v", c.PoolSettings)
	}
	r, err := c.Route("anydb", "app")
	if err != nil {
		t.Fatal(err)
	}
	if r.Host != "127.0.0.1" || r.Port != 5432 || r.DBName != "anydb" || r.ServerUser != "app" {
		t.Fatalf("route %+v", r)
	}
	if pw, ok := r.ServerSecret.Plain(); !ok || pw != "secret" {
		t.Fatal("upstream password is not the server secret")
	}
	if s, ok := c.ClientSecret("app"); !ok || s.Kind() == 0 {
		t.Fatal("upstream user has no client secret")
	}
}

func TestPrecedenceFlagOverEnvOverFile(t *testing.T) {
	yaml := "upstream: postgres://app:secret@db:5432/app\nmax_size: 3\nmin_size: 1\ncheckout_timeout: 5s\n"
	t.Setenv("POOLERD_MAX_SIZE", "9")
	t.Setenv("POOLERD_CHECKOUT_TIMEOUT", "7s")
	c, err := load(t, yaml, "--pool-size", "11")
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxSize != 11 || c.CheckoutTimeout != 7*time.Second || c.MinSize != 1 {
		t.Fatalf("max %d checkout %s min %d", c.MaxSize, c.CheckoutTimeout, c.MinSize)
	}
}

func TestEveryKeyHasAnEnvVar(t *testing.T) {
	for _, k := range Keys() {
		t.Run(k.Name, func(t *testing.T) {
			def := Defaults()
			var val string
			switch defaultValue(&def, k.Name).(type) {
			case string:
				val = map[string]string{"listen": "127.0.0.1:7000", "http_listen": "127.0.0.1:7001",
					"upstream": "postgres://u:p@h:1/d", "auth_type": "md5", "auth_file": "",
					"pool_mode": "session", "server_reset_query": "SELECT 2", "log_format": "json", "log_level": "warn",
					"startup_mode": "fail-fast", "validation_query": "SELECT 2",
					"rate_limit_backend": "redis", "redis_url": "redis://h:1/0", "on_redis_error": "deny", "on_server_unavailable": "wait",
					"session_state": "refuse", "http_probe_listen": "127.0.0.1:7002", "max_pinned_clients": "50%", "server_tls_sslmode": "require", "client_tls_sslmode": "require",
					"client_tls_protocols": "tlsv1.3", "client_tls_ciphers": "fast", "auth_user": "app",
					"auth_query": "SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = $1", "takeover_socket": "/run/poolerd/takeover.sock",
					"event_loops": "off", "verify_handoff": "always",
					"unix_socket_dir": "/run/poolerd", "unix_socket_mode": "0770", "auth_dbname": "app", "server_tls_protocols": "tlsv1.3", "server_tls_ciphers": "fast", "client_tls_ecdhcurve": "secp384r1", "log_file": "/tmp/poolerd-test.log",
					"auth_ldap_options": `ldapurl="ldap://ldap.example.net/dc=example,dc=net?uid?sub"`, "auth_pam_service": "poolerd",
					"pidfile": "/run/poolerd.pid", "syslog_ident": "pgb", "syslog_facility": "local0", "login_notify_message": "you reach poolerd"}[k.Name]
				if k.Name == "unix_socket_group" {
					t.Setenv("POOLERD_UNIX_SOCKET_DIR", "/run/poolerd") // a group needs the socket
					val = "postgres"
				}
				if k.Name == "auth_ident_file" {
					val = filepath.Join(t.TempDir(), "ident.conf")
					if err := os.WriteFile(val, []byte("m root app\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				if k.Name == "auth_hba_file" {
					val = filepath.Join(t.TempDir(), "hba.conf")
					if err := os.WriteFile(val, []byte("host all all 0.0.0.0/0 scram-sha-256\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				if strings.HasPrefix(k.Name, "client_tls_") {
					files, err := pgtest.MakeTLSFiles(t.TempDir())
					if err != nil {
						t.Fatal(err)
					}
					if v, ok := map[string]string{"client_tls_ca_file": files.CA, "client_tls_cert_file": files.ServerCert, "client_tls_key_file": files.ServerKey}[k.Name]; ok {
						val = v
					}
					// TLS for clients needs its certificate and key.
					t.Setenv("POOLERD_CLIENT_TLS_SSLMODE", "require")
					t.Setenv("POOLERD_CLIENT_TLS_CERT_FILE", files.ServerCert)
					t.Setenv("POOLERD_CLIENT_TLS_KEY_FILE", files.ServerKey)
				}
				if strings.HasPrefix(k.Name, "server_tls_") && strings.HasSuffix(k.Name, "_file") {
					files, err := pgtest.MakeTLSFiles(t.TempDir())
					if err != nil {
						t.Fatal(err)
					}
					val = map[string]string{"server_tls_ca_file": files.CA, "server_tls_cert_file": files.ClientCert, "server_tls_key_file": files.ClientKey}[k.Name]
					// A certificate and its key go together.
					t.Setenv("POOLERD_SERVER_TLS_CERT_FILE", files.ClientCert)
					t.Setenv("POOLERD_SERVER_TLS_KEY_FILE", files.ClientKey)
				}
				if k.Name == "rate_limit_backend" {
					t.Setenv("POOLERD_REDIS_URL", "redis://h:1/0")
				}
				if k.Name == "http_web_config_file" {
					val = filepath.Join(t.TempDir(), "web.yml")
					if err := os.WriteFile(val, []byte("basic_auth_users: {}\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			case int:
				val = "2"
				if k.Name == "max_packet_size" {
					val = "4096"
				}
				if k.Name == "fleet_max_server_connections" {
					t.Setenv("POOLERD_REDIS_URL", "redis://h:1/0") // a budget needs Redis
				}
			case time.Duration:
				val = "3s"
			case float64:
				val = "0.5"
			case bool:
				val = map[bool]string{true: "false", false: "true"}[defaultValue(&def, k.Name).(bool)]
			case []string:
				val = "alice,bob"
			}
			t.Setenv(k.Env(), val)
			c, err := load(t, "upstream: postgres://app:secret@db/app\n")
			if err != nil {
				t.Fatal(err)
			}
			got := defaultValue(c, k.Name)
			want := defaultValue(&def, k.Name)
			if k.Name != "auth_file" && reflect.DeepEqual(got, want) {
				t.Fatalf("%s=%s did not change %s (still %v)", k.Env(), val, k.Name, got)
			}
		})
	}
}

// A configuration with no database and no client password is valid, as
// PgBouncer's packaged sample is: it starts, serves its refusals and says
// what is missing in its start warnings.
func TestStartsWithNothingToServe(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"no databases", "auth_type: trust\n", []string{"no databases"}},
		{"no passwords", "databases:\n  - name: a\n    host: h\n", []string{"needs client passwords"}},
		{"neither", "auth_type: md5\n", []string{"no databases", "needs client passwords"}},
		{"both", "upstream: postgres://app:secret@db/app\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.yaml)
			if err != nil {
				t.Fatal(err)
			}
			w := c.Warnings()
			if len(w) != len(tc.want) {
				t.Fatalf("warnings %q, want %q", w, tc.want)
			}
			for i := range w {
				if !strings.Contains(w[i], tc.want[i]) {
					t.Errorf("warning %q, want %q", w[i], tc.want[i])
				}
			}
			if got, want := c.ServesNoDatabase(), slices.Contains(tc.want, "no databases"); got != want {
				t.Errorf("ServesNoDatabase %v, want %v", got, want)
			}
		})
	}
}

func TestRejects(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key", up + "max_sise: 3\n", "max_sise"},
		{"unknown key in a list", up + "databases:\n  - name: a\n    hots: x\n", "hots"},
		{"duration without unit", up + "checkout_timeout: 30\n", "has no unit"},
		{"min above max", up + "max_size: 2\nmin_size: 5\n", "min_size (5) exceeds max_size (2): reduce min_size to 2 or raise max_size to 5"},
		{"bad pool mode", up + "pool_mode: statement-ish\n", "pool_mode"},
		{"duplicate database", up + "databases:\n  - name: a\n  - name: a\n", "listed twice"},
		{"db override", up + "databases:\n  - name: a\n    max_size: 0\n", "database \"a\" max_size 0"},
		{"password without user", up + "databases:\n  - name: a\n    password: x\n", "no user"},
		{"bad upstream", "upstream: mysql://x\n", "scheme"},
		{"bad upstream sslmode", "upstream: postgres://a:b@h/d?sslmode=bogus\n", "sslmode=bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

// auth_type scram-sha-256 with md5 secrets present is accepted, as
// PgBouncer's md5-to-SCRAM migration: a warning names those users, whose
// logins fail (TestScramWithMD5Secrets in test/integration).
func TestScramWithMD5SecretsWarns(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	md5 := "md5" + strings.Repeat("a", 32)
	c, err := load(t, up+"auth_type: scram-sha-256\nusers:\n  - name: bob\n    password: "+md5+"\n  - name: carol\n    password: "+md5+"\n  - name: dave\n    password: plain\n")
	if err != nil {
		t.Fatal(err)
	}
	want := `auth_type scram-sha-256: users "bob", "carol" have md5 secrets, which SCRAM cannot check: they fail to log in`
	if w := strings.Join(c.Warnings(), "\n"); !strings.Contains(w, want) {
		t.Errorf("warnings %q, want %q", w, want)
	}
	c, err = load(t, up+"auth_type: md5\nusers:\n  - name: bob\n    password: "+md5+"\n")
	if err != nil || strings.Contains(strings.Join(c.Warnings(), "\n"), "md5 secret") {
		t.Errorf("auth_type md5: %v %q", err, c.Warnings())
	}
}

// A database's min_size above a user's max_size is accepted, as PgBouncer
// accepts it (its own test.ini has one): a warning, and that pair's pool
// is capped.
func TestMinAboveMaxOfAPairWarns(t *testing.T) {
	c, err := load(t, "upstream: postgres://app:secret@db/app\ndatabases:\n  - name: a\n    min_size: 5\nusers:\n  - name: bob\n    password: pw\n    max_size: 3\n")
	if err != nil {
		t.Fatal(err)
	}
	want := `database "a" with user "bob": min_size (5) exceeds max_size (3); that pool keeps at most 3`
	if w := c.Warnings(); !slices.Contains(w, want) {
		t.Errorf("warnings %q, want %q", w, want)
	}
	r, err := c.Route("a", "bob")
	if err != nil || r.Settings.MinSize != 3 || r.Settings.MaxSize != 3 {
		t.Errorf("route a/bob: %v, min %d max %d; want min_size capped at 3", err, r.Settings.MinSize, r.Settings.MaxSize)
	}
	if r, _ := c.Route("a", "alice"); r.Settings.MinSize != 5 {
		t.Errorf("route a/alice: min %d, want 5", r.Settings.MinSize)
	}
	// Validating again (SET, reload) does not repeat the warning.
	if err := c.Validate(); err != nil || len(c.Warnings()) != 1 {
		t.Errorf("after a second Validate: %v, warnings %q", err, c.Warnings())
	}
}

func TestUpstreamErrorHidesPassword(t *testing.T) {
	_, err := load(t, "upstream: \"postgres://app:hunter2@db:99999/app\"\n")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v", err)
	}
	_, err = load(t, "upstream: \"postgres://app:hunter2@db/%zz\"\n")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v", err)
	}
}

func TestRoutesAreCaseSensitiveAndOverridesLayer(t *testing.T) {
	yaml := `
auth_type: scram-sha-256
pool_mode: transaction
max_size: 10
databases:
  - name: Sales
    host: 10.0.0.1
    port: 5433
    dbname: sales_prod
    pool_mode: session
    max_size: 4
  - name: reports
    host: 10.0.0.2
    user: reporter
    password: r3p
    min_size: 0
  - name: "*"
    host: 10.0.0.3
users:
  - name: Alice
    password: pw
    max_size: 2
  - name: bob
    password: pw
`
	c, err := load(t, yaml)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Route("Sales", "bob")
	if r.Host != "10.0.0.1" || r.Port != 5433 || r.DBName != "sales_prod" || r.Settings.PoolMode != PoolSession || r.Settings.MaxSize != 4 {
		t.Fatalf("Sales/bob %+v", r)
	}
	r, _ = c.Route("Sales", "Alice")
	if r.Settings.MaxSize != 2 || r.Settings.PoolMode != PoolSession {
		t.Fatalf("user override should win over database: %+v", r.Settings)
	}
	r, _ = c.Route("sales", "bob") // different case: the wildcard
	if r.Host != "10.0.0.3" || r.DBName != "sales" {
		t.Fatalf("sales/bob %+v", r)
	}
	r, _ = c.Route("reports", "bob")
	if !r.ForcedUser || r.ServerUser != "reporter" {
		t.Fatalf("forced user %+v", r)
	}
	if _, ok := c.ClientSecret("alice"); ok {
		t.Fatal("user names must be case-sensitive")
	}
}

func TestAuthFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(path, []byte("\"carol\" \"pw\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, "upstream: postgres://app:secret@db/app\nauth_file: "+path+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.ClientSecret("carol"); !ok {
		t.Fatal("auth_file user missing")
	}
	_, err = load(t, "upstream: postgres://app:secret@db/app\nauth_file: "+path+"\nusers:\n  - name: carol\n    password: x\n")
	if err == nil || !strings.Contains(err.Error(), "keep one") {
		t.Fatalf("duplicate secret: %v", err)
	}
}

// A database entry's user without a password logs in with that user's
// password from auth_file, as in PgBouncer; the entry's own password
// comes first.
func TestForcedUserSecretFromAuthFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(path, []byte("\"carol\" \"pw\"\n\"dave\" \"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, "auth_file: "+path+"\ndatabases:\n"+
		"  - {name: forced, host: db, user: carol}\n"+
		"  - {name: own, host: db, user: carol, password: other}\n"+
		"  - {name: unlisted, host: db, user: erin}\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ db, want string }{{"forced", "pw"}, {"own", "other"}, {"unlisted", ""}} {
		r, err := c.Route(tc.db, "dave")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := r.ServerSecret.Plain()
		if !r.ForcedUser || r.ServerUser == "dave" || got != tc.want {
			t.Errorf("%s: server user %q, secret %q, want %q", tc.db, r.ServerUser, got, tc.want)
		}
	}
}

// trust admits only listed users once auth_file or auth_user is set;
// any admits every user name.
func TestTrustListsUsers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(path, []byte("\"carol\" \"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		yaml string
		want bool
	}{
		{"auth_type: trust\n", false},
		{"auth_type: trust\nauth_file: " + path + "\n", true},
		{"auth_type: trust\nauth_user: carol\n", true},
		{"auth_type: any\nauth_file: " + path + "\n", true}, // any ignores it
	} {
		c, err := load(t, "upstream: postgres://app:secret@db/app\n"+tc.yaml)
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := c.TrustListsUsers(); got != tc.want {
			t.Errorf("%q: TrustListsUsers %v, want %v", tc.yaml, got, tc.want)
		}
	}
	if _, err := load(t, "upstream: postgres://app:secret@db/app\nauth_type: anyone\n"); err == nil || !strings.Contains(err.Error(), "trust, any, ldap, pam, hba") {
		t.Errorf("bad auth_type: %v", err)
	}
}

func TestSetValueAndFormat(t *testing.T) {
	c, err := load(t, "upstream: postgres://app:hunter2@db/app\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"max_size", "7"}, {"query_timeout", "1500ms"}, {"log_connections", "false"}, {"admin_users", "a, b"}} {
		if err := SetValue(c, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if c.MaxSize != 7 || c.QueryTimeout != 1500*time.Millisecond || c.LogConnections || len(c.AdminUsers) != 2 {
		t.Fatalf("%+v", c.PoolSettings)
	}
	for _, bad := range [][2]string{{"max_size", "x"}, {"query_timeout", "30"}, {"no_such_key", "1"}, {"databases", "x"}} {
		if err := SetValue(c, bad[0], bad[1]); err == nil {
			t.Errorf("SET %s=%s accepted", bad[0], bad[1])
		}
	}
	if got := FormatValue(c, "query_timeout"); got != "1.5s" {
		t.Errorf("format duration: %s", got)
	}
	if got := FormatValue(c, "upstream"); strings.Contains(got, "hunter2") || !strings.Contains(got, "app@db") {
		t.Errorf("format upstream: %s", got)
	}
	if names := c.UserNames(); len(names) != 1 || names[0] != "app" {
		t.Errorf("users %v", names)
	}
}

func TestListsFromEnvAreTrimmed(t *testing.T) {
	t.Setenv("POOLERD_ADMIN_USERS", "ops, alice")
	c, err := load(t, "upstream: postgres://app:secret@db/app\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.AdminUsers) != 2 || c.AdminUsers[1] != "alice" {
		t.Fatalf("admin_users %q", c.AdminUsers)
	}
}

func TestPinnedCap(t *testing.T) {
	for _, c := range []struct {
		v    string
		size int
		want int
		ok   bool
	}{
		{"100%", 4, 4, true}, {"50%", 4, 2, true}, {"10%", 4, 1, true}, {" 3 ", 4, 3, true}, {"30", 4, 30, true},
		{"0", 4, 0, false}, {"-1", 4, 0, false}, {"0%", 4, 0, false}, {"101%", 4, 0, false}, {"half", 4, 0, false}, {"", 4, 0, false},
	} {
		got, err := PoolSettings{MaxPinnedClients: c.v, MaxSize: c.size}.PinnedCap()
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("max_pinned_clients %q, max_size %d: got %d, %v; want %d (ok %v)", c.v, c.size, got, err, c.want, c.ok)
		}
	}
	cfg := Defaults()
	cfg.Upstream = "postgres://app:secret@db/app"
	cfg.MaxPinnedClients = "half"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "max_pinned_clients") {
		t.Fatalf("validation: %v", err)
	}
}
