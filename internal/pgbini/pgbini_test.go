package pgbini

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
)

// loadWith loads path through config.Loader, with the ini hook as
// cmd/poolerd installs it.
func loadWith(t *testing.T, path string) (*config.Config, error) {
	t.Helper()
	l, err := config.NewLoader([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l.Translate = Translate
	return l.Load()
}

func settings(res *Result) []string {
	var out []string
	for _, ig := range res.Ignored {
		out = append(out, ig.Setting)
	}
	return out
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       bool
	}{
		{"section", "[databases]\nfoo = host=x\n", true},
		{"comments first", ";; comment\n# other\n\n  [pgbouncer]\n", true},
		{"include", "%include /etc/pgbouncer/common.ini\n", true},
		{"yaml", "listen: 127.0.0.1:6432\nupstream: postgres://a@b/c\n", false},
		{"yaml comment", "# poolerd\nlisten: x\n", false},
		{"yaml flow list", "[a, b]\n", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Detect([]byte(tc.text)); got != tc.want {
				t.Errorf("Detect = %v, want %v", got, tc.want)
			}
		})
	}
}

// The sample Debian's pgbouncer package installs as
// /etc/pgbouncer/pgbouncer.ini, unchanged.
func TestDebianSample(t *testing.T) {
	res, err := Load("testdata/debian-pgbouncer.ini")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"listen":                "localhost:6432",
		"auth_type":             "md5",
		"auth_file":             "/etc/pgbouncer/userlist.txt",
		"pool_mode":             "session",
		"max_client_conn":       100,
		"idle_timeout":          "10m",
		"checkout_timeout":      "2m",
		"validation_interval":   "30s",
		"validation_query":      "", // PgBouncer's <empty>: an empty query
		"unix_socket_dir":       "/var/run/postgresql",
		"unix_socket_mode":      "0777",
		"warm_pools":            false,
		"log_format":            "pgbouncer", // PgBouncer's log lines
		"log_file":              "/var/log/postgresql/pgbouncer.log",
		"pidfile":               "/var/run/postgresql/pgbouncer.pid",
		"syslog_ident":          "pgbouncer",
		"on_server_unavailable": "wait", // PgBouncer's: requests wait for the server
		// -R's hand-over, beside the Unix socket.
		"takeover_socket": "/var/run/postgresql/.s.PGSQL.6432.takeover",
	}
	if !reflect.DeepEqual(res.Tree, want) {
		t.Errorf("tree\n got %#v\nwant %#v", res.Tree, want)
	}
	// Every setting of Debian's sample is honoured.
	if got := settings(res); len(got) != 0 {
		t.Errorf("not honoured %q, want none", got)
	}
	for _, ig := range res.Ignored {
		if ig.Advice == "" || !strings.HasPrefix(ig.Where, "debian-pgbouncer.ini:") {
			t.Errorf("ignored setting without advice or line: %+v", ig)
		}
	}
	// As shipped it lists no database, and its userlist is empty: poolerd
	// starts, as PgBouncer does, and its warnings say what to add.
	dir := t.TempDir()
	ini, _ := os.ReadFile("testdata/debian-pgbouncer.ini")
	text := strings.Replace(string(ini), "/etc/pgbouncer/userlist.txt", "userlist.txt", 1)
	writeFile(t, filepath.Join(dir, "pgbouncer.ini"), text)
	writeFile(t, filepath.Join(dir, "userlist.txt"), "")
	cfg, err := loadWith(t, filepath.Join(dir, "pgbouncer.ini"))
	if err != nil {
		t.Fatalf("Debian sample as shipped: %v", err)
	}
	if w := cfg.Warnings(); len(w) != 2 || !strings.Contains(w[0], "no databases") || !strings.Contains(w[1], "needs client passwords") {
		t.Errorf("Debian sample as shipped: warnings %q", w)
	}
	// With one database line and one user, as an operator fills it in.
	text = strings.Replace(text, ";foodb =\n", "foodb = host=127.0.0.1\n", 1)
	writeFile(t, filepath.Join(dir, "pgbouncer.ini"), text)
	writeFile(t, filepath.Join(dir, "userlist.txt"), `"app" "secret"`+"\n")
	cfg, err = loadWith(t, filepath.Join(dir, "pgbouncer.ini"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "localhost:6432" || cfg.PoolMode != config.PoolSession || cfg.AuthType != config.AuthMD5 ||
		len(cfg.Databases) != 1 || cfg.Databases[0].Host != "127.0.0.1" || cfg.IdleTimeout != 10*time.Minute {
		t.Errorf("config %+v", cfg)
	}
}

// auth_type any stays any; trust without auth_file (or auth_user) is
// reported: PgBouncer admits no one with it.
func TestAuthTypeTrustAndAny(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		text, want, report string
	}{
		{"auth_type = any\n", config.AuthAny, "auth_type any"},
		{"auth_type = trust\n", config.AuthTrust, "auth_type trust without auth_file"},
		{"auth_type = trust\nauth_file = users.txt\n", config.AuthTrust, ""},
		{"auth_type = trust\nauth_user = pgbouncer\n", config.AuthTrust, ""},
		{"auth_type = ldap\nauth_ldap_options = ldapurl=\"ldap://h/dc=x?uid?sub\"\n", config.AuthLDAP, ""},
		{"auth_type = pam\n", config.AuthPAM, ""},
		{"auth_type = plain\n", config.AuthPlain, ""},
	} {
		writeFile(t, filepath.Join(dir, "p.ini"), "[pgbouncer]\n"+tc.text)
		res, err := Load(filepath.Join(dir, "p.ini"))
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Tree["auth_type"]; got != tc.want {
			t.Errorf("%q: auth_type %v, want %s", tc.text, got, tc.want)
		}
		var got []string
		for _, s := range settings(res) {
			if strings.HasPrefix(s, "auth_type") {
				got = append(got, s)
			}
		}
		if want := []string{tc.report}; tc.report == "" && len(got) != 0 || tc.report != "" && !reflect.DeepEqual(got, want) {
			t.Errorf("%q: reported %q, want %q", tc.text, got, tc.report)
		}
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A multi-database ini with a userlist, as PgBouncer's documentation
// writes them, with a %include.
func TestMultiDatabase(t *testing.T) {
	res, err := Load("testdata/multi/pgbouncer.ini")
	if err != nil {
		t.Fatal(err)
	}
	wantTop := map[string]any{
		"listen":                    ":6543",
		"auth_type":                 "md5",
		"auth_file":                 "testdata/multi/userlist.txt",
		"admin_users":               []string{"admin", "someuser"},
		"stats_users":               []string{"stats"},
		"pool_mode":                 "transaction",
		"max_size":                  20,
		"min_size":                  2,
		"max_client_conn":           500,
		"max_lifetime":              "30m",
		"idle_timeout":              "5m",
		"query_timeout":             "0s",
		"checkout_timeout":          "1m",
		"idle_transaction_timeout":  "500ms",
		"client_idle_timeout":       "10m",
		"server_reset_query":        "DISCARD ALL",
		"server_connect_timeout":    "5s",
		"client_login_timeout":      "30s",
		"stats_period":              "30s",
		"log_connections":           false,
		"validation_interval":       "30s",
		"reserve_pool_size":         5,
		"tcp_keepalive":             true,
		"ignore_startup_parameters": []string{"extra_float_digits"},
	}
	for k, v := range wantTop {
		if !reflect.DeepEqual(res.Tree[k], v) {
			t.Errorf("%s = %#v, want %#v", k, res.Tree[k], v)
		}
	}
	dbs := res.Tree["databases"].([]any)
	wantDBs := []any{
		map[string]any{"name": "foodb", "host": defaultSocketDir()},
		map[string]any{"name": "bardb", "host": "localhost", "dbname": "bazdb"},
		map[string]any{"name": "forcedb", "host": "localhost", "port": 300, "user": "baz", "password": "foo",
			"server_parameters": map[string]any{"client_encoding": "UNICODE", "datestyle": "ISO"}},
		map[string]any{"name": "nondefaultdb", "host": defaultSocketDir(), "max_size": 50, "reserve_pool_size": 10, "pool_mode": "session", "max_db_connections": 60, "checkout_timeout": "7s"},
		map[string]any{"name": "my-db", "host": "10.0.0.5", "dbname": "my db", "server_parameters": map[string]any{"application_name": "it's"}},
		map[string]any{"name": "*", "host": "testserver"},
	}
	if !reflect.DeepEqual(dbs, wantDBs) {
		t.Errorf("databases\n got %#v\nwant %#v", dbs, wantDBs)
	}
	wantUsers := []any{map[string]any{"name": "user1", "pool_mode": "transaction", "max_user_connections": 10, "checkout_timeout": "3s"}}
	if !reflect.DeepEqual(res.Tree["users"], wantUsers) {
		t.Errorf("users %#v", res.Tree["users"])
	}
	wantIgnored := []string{
		"[databases] forcedb: connect_query",
	}
	if got := settings(res); !reflect.DeepEqual(got, wantIgnored) {
		t.Errorf("not honoured\n got %q\nwant %q", got, wantIgnored)
	}
	// The included file's lines are reported with its name.
	for _, ig := range res.Ignored {
		if ig.Setting == "tcp_keepalive" && ig.Where != "timeouts.ini:4" {
			t.Errorf("tcp_keepalive reported at %s, want timeouts.ini:4", ig.Where)
		}
	}

	cfg, err := loadWith(t, "testdata/multi/pgbouncer.ini")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IdleTransactionTimeout != 500*time.Millisecond || len(cfg.Databases) != 6 || cfg.Databases[2].Port != 300 ||
		*cfg.Databases[3].MaxSize != 50 || cfg.Listen != ":6543" || len(cfg.UserNames()) != 4 {
		t.Errorf("config %+v", cfg)
	}
	if _, err := cfg.Route("forcedb", "someone"); err != nil {
		t.Errorf("route forcedb: %v", err)
	}
}

// poolerd convert's YAML loads back to the same configuration as the ini.
func TestConvertRoundTrip(t *testing.T) {
	for _, ini := range []string{"testdata/multi/pgbouncer.ini", "testdata/debian-filled.ini"} {
		t.Run(filepath.Base(ini), func(t *testing.T) {
			if ini == "testdata/debian-filled.ini" {
				dir := t.TempDir()
				b, _ := os.ReadFile("testdata/debian-pgbouncer.ini")
				text := strings.Replace(string(b), "/etc/pgbouncer/userlist.txt", "userlist.txt", 1)
				text = strings.Replace(text, ";* = host=testserver\n", "* = host=db.internal port=5433 pool_size=7\n", 1)
				ini = filepath.Join(dir, "pgbouncer.ini")
				writeFile(t, ini, text)
				writeFile(t, filepath.Join(dir, "userlist.txt"), `"app" "md5d7d880f96044b72d0bba108ace96d1e4"`+"\n")
			}
			fromIni, err := loadWith(t, ini)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Load(ini)
			if err != nil {
				t.Fatal(err)
			}
			out, err := res.YAML()
			if err != nil {
				t.Fatal(err)
			}
			yml := filepath.Join(t.TempDir(), "poolerd.yaml")
			writeFile(t, yml, string(out))
			l, err := config.NewLoader([]string{"--config", yml}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			fromYAML, err := l.Load() // no Translate: plain YAML
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if diff := configDiff(fromIni, fromYAML); diff != "" {
				t.Errorf("the YAML loads to another configuration: %s\n%s", diff, out)
			}
			if len(res.Ignored) > 0 && !strings.Contains(string(out), "# Settings poolerd does not honour:") {
				t.Errorf("no list of settings not honoured:\n%s", out)
			}
		})
	}
}

// configDiff names what differs between a and b: a top-level key, the
// databases or users lists, or the users with secrets.
func configDiff(a, b *config.Config) string {
	var diff []string
	for _, k := range config.Keys() {
		if va, vb := config.FormatValue(a, k.Name), config.FormatValue(b, k.Name); va != vb {
			diff = append(diff, fmt.Sprintf("%s: %q vs %q", k.Name, va, vb))
		}
	}
	if !reflect.DeepEqual(a.Databases, b.Databases) {
		diff = append(diff, fmt.Sprintf("databases: %+v vs %+v", a.Databases, b.Databases))
	}
	if !reflect.DeepEqual(a.Users, b.Users) {
		diff = append(diff, fmt.Sprintf("users: %+v vs %+v", a.Users, b.Users))
	}
	if !reflect.DeepEqual(a.UserNames(), b.UserNames()) {
		diff = append(diff, fmt.Sprintf("user names: %q vs %q", a.UserNames(), b.UserNames()))
	}
	if !reflect.DeepEqual(a.RateLimits, b.RateLimits) {
		diff = append(diff, "rate_limits")
	}
	if !reflect.DeepEqual(a.Peers, b.Peers) {
		diff = append(diff, fmt.Sprintf("peers: %+v vs %+v", a.Peers, b.Peers))
	}
	return strings.Join(diff, "; ")
}

// Nothing that reports settings carries their values: a password in a
// connection string must not reach the log.
func TestWarningHasNoSecrets(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "p.ini"), "[databases]\napp = host=x user=u password=Hunter2Secret connect_query=Hunter2Secret auth_user=Hunter2Secret\n"+
		"[pgbouncer]\nauth_query = SELECT Hunter2Secret\nbogus = Hunter2Secret\n")
	res, err := Load(filepath.Join(dir, "p.ini"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ignored) < 3 {
		t.Fatalf("ignored %q", settings(res))
	}
	for _, line := range res.Warning() {
		if strings.Contains(line, "Hunter2Secret") {
			t.Errorf("warning shows a value: %s", line)
		}
	}
}

func TestSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"0", "0s"}, {"30", "30s"}, {"0.5", "500ms"}, {"600", "10m"}, {"3600", "1h"}, {"1.25", "1.25s"}, {"90", "90s"}, {"2m", "2m"},
	} {
		d, err := seconds(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if got := fmtDuration(d); got != tc.want {
			t.Errorf("%s = %s, want %s", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"-1", "abc", ""} {
		if _, err := seconds(bad); err == nil {
			t.Errorf("seconds(%q) accepted", bad)
		}
	}
}

func TestParseConnString(t *testing.T) {
	got, err := parseConnString(`host=a  port = 5 dbname='x y' password='it''s \'q\''`)
	if err != nil {
		t.Fatal(err)
	}
	want := []param{{"host", "a"}, {"port", "5"}, {"dbname", "x y"}, {"password", "it's 'q'"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q", got)
	}
	for _, bad := range []string{"host", "host='a"} {
		if _, err := parseConnString(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestIniErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, text, want string }{
		{"outside", "foo = 1\n[pgbouncer]\n", "outside any section"},
		{"bad int", "[pgbouncer]\ndefault_pool_size = many\n", "p.ini:2: default_pool_size"},
		{"bad seconds", "[pgbouncer]\nquery_timeout = soon\n", "not a time in seconds"},
		{"missing include", "[pgbouncer]\n%include nothere.ini\n", "nothere.ini"},
		{"self include", "[pgbouncer]\n%include p.ini\n", "nested more than"},
		{"ports for hosts", "[databases]\nd = host=a,b,c port=1,2\n", "2 ports for 3 hosts"},
		{"bad port", "[databases]\nd = host=a port=x\n", `port "x" is not a port number`},
		{"bad balance", "[databases]\nd = host=a,b load_balance_hosts=random\n", "not round-robin or disable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, filepath.Join(dir, "p.ini"), tc.text)
			_, err := Load(filepath.Join(dir, "p.ini"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// Every [pgbouncer] key PgBouncer's own sample documents (commented or not)
// has a rule: a key left out would be reported as unknown.
func TestDebianSampleKeysHaveRules(t *testing.T) {
	b, err := os.ReadFile("testdata/debian-pgbouncer.ini")
	if err != nil {
		t.Fatal(err)
	}
	rules := rulesBySection()["pgbouncer"]
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
			continue
		}
		line = strings.TrimLeft(line, ";")
		k, _, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if section != "pgbouncer" || !ok || k == "" || strings.ContainsAny(k, " .") {
			continue
		}
		if _, ok := rules[k]; !ok {
			t.Errorf("no rule for %s", k)
		}
	}
}

// The table of docs/migrating-from-pgbouncer.md is MarkdownTable's output
// (run with POOLERD_UPDATE_DOCS=1 to rewrite it).
func TestMigrationGuideTable(t *testing.T) {
	const path = "../../docs/migrating-from-pgbouncer.md"
	const begin, end = "<!-- mapping:begin (generated by internal/pgbini: POOLERD_UPDATE_DOCS=1 go test ./internal/pgbini) -->\n", "<!-- mapping:end -->"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q section", path, begin, end)
	}
	want := "\n" + MarkdownTable() + "\n"
	if got := doc[i+len(begin) : j]; got != want {
		if os.Getenv("POOLERD_UPDATE_DOCS") == "1" {
			writeFile(t, path, doc[:i+len(begin)]+want+doc[j:])
			return
		}
		t.Errorf("the mapping table of %s is not what the code does; rerun with POOLERD_UPDATE_DOCS=1", path)
	}
}

// A [databases] host list becomes hosts, with one port for all or one
// each, balanced round-robin (PgBouncer's default) unless
// load_balance_hosts says disable; the result loads.
func TestHostLists(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "p.ini"), `[databases]
rr = host=db1,db2 port=5433 dbname=app
each = host=10.0.0.1,10.0.0.2,::1 port=5432,5433,5434 load_balance_hosts=disable
one = host=db1 port=6000 load_balance_hosts=disable
twice = host=db1,DB1 port=7000 load_balance_hosts=round-robin
[pgbouncer]
listen_port = 6432
`)
	res, err := Load(filepath.Join(dir, "p.ini"))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		map[string]any{"name": "rr", "hosts": []any{"db1:5433", "db2:5433"}, "load_balance_hosts": "round-robin", "dbname": "app"},
		map[string]any{"name": "each", "hosts": []any{"10.0.0.1:5432", "10.0.0.2:5433", "[::1]:5434"}, "load_balance_hosts": "disable"},
		map[string]any{"name": "one", "host": "db1", "port": 6000},
		map[string]any{"name": "twice", "host": "db1", "port": 7000},
	}
	if got := res.Tree["databases"]; !reflect.DeepEqual(got, want) {
		t.Errorf("databases\n got %#v\nwant %#v", got, want)
	}
	cfg, err := loadWith(t, filepath.Join(dir, "p.ini"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := cfg.Route("each", "u")
	if err != nil || len(r.Hosts) != 3 || r.Hosts[1].Port != 5433 || r.Balance != "disable" {
		t.Errorf("route each: %+v %v", r, err)
	}
}

// TestRelativePaths: a relative file name is taken from the working
// directory, as PgBouncer takes it; one found only beside the ini is taken
// from there; one that is nowhere yet (a log file) from the working
// directory.
func TestRelativePaths(t *testing.T) {
	iniDir, cwd := t.TempDir(), t.TempDir()
	t.Chdir(cwd)
	writeFile(t, filepath.Join(cwd, "hba.rules"), "local all all trust\n")
	writeFile(t, filepath.Join(iniDir, "hba.rules"), "local all all trust\n")
	writeFile(t, filepath.Join(iniDir, "users.txt"), `"u" "p"`+"\n")
	writeFile(t, filepath.Join(iniDir, "p.ini"),
		"[pgbouncer]\nauth_type = hba\nauth_hba_file = hba.rules\nauth_file = users.txt\nlogfile = new.log\n")
	res, err := Load(filepath.Join(iniDir, "p.ini"))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"auth_hba_file": filepath.Join(cwd, "hba.rules"),
		"auth_file":     filepath.Join(iniDir, "users.txt"),
		"log_file":      filepath.Join(cwd, "new.log"),
	} {
		if got := res.Tree[key]; got != want {
			t.Errorf("%s = %v, want %s", key, got, want)
		}
	}
}

// TestServerLifetimeZero: PgBouncer's server_lifetime = 0 (each connection
// is used once) is max_uses 1; in a [databases] entry 0 means the global
// value, so the entry sets nothing.
func TestServerLifetimeZero(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "p.ini"), "[databases]\nd = host=h server_lifetime=0\ne = host=h server_lifetime=30\n[pgbouncer]\nserver_lifetime = 0\n")
	res, err := Load(filepath.Join(dir, "p.ini"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Tree["max_uses"] != 1 || res.Tree["max_lifetime"] != "0s" {
		t.Errorf("max_uses %v, max_lifetime %v; want 1, 0s", res.Tree["max_uses"], res.Tree["max_lifetime"])
	}
	if got, want := fmt.Sprint(res.Tree["databases"]), "[map[host:h name:d] map[host:h max_lifetime:30s name:e]]"; got != want {
		t.Errorf("databases %s, want %s", got, want)
	}
}

// TestServerCheck: PgBouncer's server_check_query default <empty> is an
// empty query, an empty value turns the check off, and server_check_delay
// 0 checks at every reuse (validation_interval 1ns; 0 would be never).
func TestServerCheck(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ text, query, interval string }{
		{"", "", "30s"},
		{"server_check_delay = 0\n", "", "1ns"},
		{"server_check_query = SELECT 2\nserver_check_delay = 0\n", "SELECT 2", "1ns"},
		{"server_check_query = <empty>\n", "", "30s"},
		{"server_check_query =\nserver_check_delay = 0\n", "<none>", "0s"},
		{"server_check_delay = 0\nserver_check_query =\n", "<none>", "0s"},
	} {
		writeFile(t, filepath.Join(dir, "p.ini"), "[pgbouncer]\n"+tc.text)
		res, err := Load(filepath.Join(dir, "p.ini"))
		if err != nil {
			t.Fatal(err)
		}
		q, ok := res.Tree["validation_query"]
		if !ok {
			q = "<none>"
		}
		if q != tc.query || res.Tree["validation_interval"] != tc.interval {
			t.Errorf("%q: validation_query %q, validation_interval %v; want %q, %s", tc.text, q, res.Tree["validation_interval"], tc.query, tc.interval)
		}
	}
	if kv, err := SetKeys("server_check_delay", "0"); err != nil || fmt.Sprint(kv) != "[{validation_interval 1ns}]" {
		t.Errorf("SET server_check_delay = 0: %v %v", kv, err)
	}
}

// TestPeers: peer_id and the [peers] section become poolerd's peer_id and
// peers (port 6432 when unset, as in PgBouncer), and the conversion keeps
// them; a peer without a host, with an id that is not one, or with an
// unknown parameter is refused as PgBouncer refuses it.
func TestPeers(t *testing.T) {
	dir := t.TempDir()
	ini := filepath.Join(dir, "p.ini")
	writeFile(t, ini, "[databases]\nd = host=h\n[pgbouncer]\nlisten_addr = 127.0.0.1\nso_reuseport = 1\npeer_id = 2\n[peers]\n1 = host=/run/pgb-1\n2 = host=/run/pgb-2 port=6433\n3 = host=10.0.0.3 port=7000 pool_size=4\n")
	res, err := Load(ini)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ignored) > 0 {
		t.Errorf("ignored: %v", res.Warning())
	}
	cfg, err := loadWith(t, ini)
	if err != nil {
		t.Fatal(err)
	}
	want := []config.Peer{{ID: 1, Host: "/run/pgb-1", Port: 6432}, {ID: 2, Host: "/run/pgb-2", Port: 6433}, {ID: 3, Host: "10.0.0.3", Port: 7000, PoolSize: 4}}
	if cfg.PeerID != 2 || !reflect.DeepEqual(cfg.Peers, want) {
		t.Errorf("peer_id %d, peers %+v; want 2, %+v", cfg.PeerID, cfg.Peers, want)
	}
	out, err := res.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "peers:\n  - {id: 1, host: /run/pgb-1}") {
		t.Errorf("converted:\n%s", out)
	}
	yml := filepath.Join(dir, "poolerd.yaml")
	writeFile(t, yml, string(out))
	l, err := config.NewLoader([]string{"--config", yml}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := l.Load()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if diff := configDiff(cfg, fromYAML); diff != "" {
		t.Errorf("the YAML loads to another configuration: %s\n%s", diff, out)
	}
	for text, msg := range map[string]string{
		"[peers]\n1 = port=6432\n":             "host was not provided for peer 1",
		"[peers]\nx = host=h\n":                "a peer's key is its peer_id",
		"[peers]\n0 = host=h\n":                "a peer's key is its peer_id",
		"[peers]\n1 = host=h dbname=d\n":       "unrecognized connection parameter dbname",
		"[peers]\n1 = host=h pool_size=many\n": "pool_size",
	} {
		writeFile(t, ini, "[databases]\nd = host=h\n[pgbouncer]\npeer_id = 2\n"+text)
		if _, err := Load(ini); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", text, err, msg)
		}
	}
}
