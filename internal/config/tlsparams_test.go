package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTLSProtocols(t *testing.T) {
	for _, tc := range []struct {
		in       string
		min, max uint16
		err      string
	}{
		{"secure", tls.VersionTLS12, tls.VersionTLS13, ""},
		{"all", tls.VersionTLS10, tls.VersionTLS13, ""},
		{"legacy", tls.VersionTLS10, tls.VersionTLS13, ""},
		{"tlsv1.3", tls.VersionTLS13, tls.VersionTLS13, ""},
		{"TLSv1.2, tlsv1.1", tls.VersionTLS11, tls.VersionTLS12, ""},
		{"tlsv1.1,tlsv1.3", 0, 0, "leaves out tlsv1.2"},
		{"sslv3", 0, 0, "not tlsv1.0"},
		{"", 0, 0, "empty"},
	} {
		lo, hi, err := TLSProtocols(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || lo != tc.min || hi != tc.max {
			t.Errorf("%q: got %x-%x %v", tc.in, lo, hi, err)
		}
	}
}

func TestTLSCiphers(t *testing.T) {
	if s, err := TLSCiphers("default"); err != nil || s != nil {
		t.Errorf("default: %v %v", s, err)
	}
	if s, err := TLSCiphers("secure"); err != nil || len(s) != 6 {
		t.Errorf("secure: %v %v", s, err)
	}
	s, err := TLSCiphers("ECDHE-RSA-AES128-GCM-SHA256:ecdhe-rsa-chacha20-poly1305,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384")
	if err != nil || len(s) != 3 || s[0] != tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 {
		t.Errorf("list: %v %v", s, err)
	}
	for in, want := range map[string]string{"HIGH:!aNULL": "HIGH", "TLS_AES_128_GCM_SHA256": "TLS 1.3"} {
		if _, err := TLSCiphers(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", in, err, want)
		}
	}
}

func TestHBAConfig(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	identFile := filepath.Join(t.TempDir(), "ident.conf")
	if err := os.WriteFile(identFile, []byte("m alice app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, up+"auth_type: hba\nauth_ident_file: "+identFile+"\nauth_hba_rules:\n  - {type: local, database: all, user: all, method: peer, map: m}\n")
	if err != nil || !c.IdentMaps().Allows("m", "alice", "app") {
		t.Fatalf("peer with an ident map: %v", err)
	}
	c, err = load(t, up+"auth_type: hba\nauth_hba_rules:\n  - {type: host, database: all, user: app, address: 127.0.0.1, method: md5}\n")
	if err != nil {
		t.Fatal(err)
	}
	if rs := c.HBARules(); len(rs) != 1 || rs[0].Method != "md5" {
		t.Fatalf("rules %+v", rs)
	}
	// A cert rule without client_tls_ca_file loads, as in PgBouncer,
	// with a warning: the clients it matches fail.
	c, err = load(t, up+"auth_type: hba\nauth_hba_rules:\n  - {type: host, database: all, user: all, address: all, method: cert}\n")
	if err != nil || !slices.ContainsFunc(c.Warnings(), func(w string) bool { return strings.Contains(w, "uses cert") }) {
		t.Fatalf("cert rule without client_tls_ca_file: %v, warnings %q", err, c.Warnings())
	}
	for cfg, want := range map[string]string{
		"auth_type: hba\n": "auth_type hba needs access rules",
		"auth_type: hba\nauth_hba_file: /nonexistent/hba.conf\n":                                                                                   "auth_hba_file",
		"auth_type: hba\nauth_hba_rules:\n  - {type: host, database: all, user: +g, address: all, method: md5}\n":                                  "group membership",
		"client_tls_protocols: tlsv1.4\n":                                                                                                          "client_tls_protocols",
		"auth_type: hba\nauth_hba_rules:\n  - {type: local, database: all, user: all, method: peer, map: m}\n":                                     "uses map=m: set auth_ident_file",
		"auth_type: hba\nauth_ident_file: " + identFile + "\nauth_hba_rules:\n  - {type: local, database: all, user: all, method: peer, map: x}\n": "uses map=x, which auth_ident_file",
		"auth_ident_file: /nonexistent/ident.conf\n":                                                                                               "auth_ident_file",
	} {
		if _, err := load(t, up+cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", cfg, err, want)
		}
	}
}

// Per-database auth_user, auth_query and auth_dbname fall back to the
// global ones; auth_dbname names an entry (or upstream's database, or one
// the wildcard serves). A lookup that cannot work is a warning, as
// PgBouncer starts with it and refuses the logins that need it.
func TestAuthLookupPerDatabase(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	c, err := load(t, up+`auth_user: glob
auth_dbname: app
databases:
  - {name: a, host: h, auth_user: au, auth_query: "SELECT n, s FROM t WHERE n = $1"}
  - {name: b, host: h, auth_dbname: a}
  - {name: "*", host: h, auth_user: wild}
`)
	if err != nil {
		t.Fatal(err)
	}
	for db, want := range map[string]AuthLookupSettings{
		"a":     {User: "au", Query: "SELECT n, s FROM t WHERE n = $1", DBName: "app"},
		"b":     {User: "glob", Query: DefaultAuthQuery, DBName: "a"},
		"other": {User: "wild", Query: DefaultAuthQuery, DBName: "app"},
	} {
		if got := c.AuthLookup(db); got != want {
			t.Errorf("AuthLookup(%q) = %+v, want %+v", db, got, want)
		}
	}
	if !c.AnyAuthUser() || !c.TrustListsUsers() {
		t.Error("auth_user set: AnyAuthUser and TrustListsUsers should say so")
	}
	if _, err := load(t, up+"auth_dbname: '*'\ndatabases:\n  - {name: '*', host: h}\n"); err == nil || !strings.Contains(err.Error(), `auth_dbname "*": name a database entry, not the wildcard`) {
		t.Errorf("auth_dbname '*': got %v", err)
	}
	// The global auth_dbname naming the console stops the start, as in
	// PgBouncer; a database entry's is a warning (its logins are refused).
	if _, err := load(t, up+"auth_dbname: pgbouncer\n"); err == nil || !strings.Contains(err.Error(), `cannot use the reserved "pgbouncer" database as an auth_dbname`) {
		t.Errorf("auth_dbname pgbouncer: got %v", err)
	}
	for yaml, want := range map[string]string{
		"auth_user: app\nauth_query: SELECT 1\n":                                            `auth_query "SELECT 1" has no $1`,
		"databases:\n  - {name: a, host: h, auth_user: u, auth_query: 'SELECT 1'}\n":        `database "a" auth_query "SELECT 1" has no $1`,
		"databases:\n  - {name: a, host: h, auth_dbname: nope}\n":                           `database "a" auth_dbname "nope" is not a database entry`,
		"databases:\n  - {name: a, host: h, auth_dbname: pgbouncer}\n":                      `database "a" auth_dbname "pgbouncer" is the admin console's database`,
		"databases:\n  - {name: a, host: h, auth_dbname: nope}\n  - {name: '*', host: h}\n": "",
	} {
		c, err := load(t, up+yaml)
		if err != nil {
			t.Errorf("%q: %v, want it to start", yaml, err)
			continue
		}
		got := strings.Join(c.Warnings(), "\n")
		if want == "" && strings.Contains(got, "auth_") || want != "" && !strings.Contains(got, want) {
			t.Errorf("%q: warnings %q, want %q", yaml, got, want)
		}
	}
}
