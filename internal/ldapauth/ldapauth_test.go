package ldapauth

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/ldaptest"
)

// Both of PostgreSQL's modes against a real slapd: simple bind and
// search+bind (attribute, filter, URL), a wrong, an empty and a right
// password, unknown and ambiguous users, a server that is not there.
func TestAuthenticate(t *testing.T) {
	srv := ldaptest.Start(t)
	srv.AddUser(t, "alice", "alice-pw", "alice@example.net")
	srv.AddUser(t, "bob", "bob-pw", "shared@example.net")
	srv.AddUser(t, "carol", "carol-pw", "shared@example.net")
	port := strconv.Itoa(srv.Port)
	people := "ou=people," + ldaptest.BaseDN
	modes := map[string]string{
		"simple bind":             `ldapserver=127.0.0.1 ldapport=` + port + ` ldapprefix="uid=" ldapsuffix=",` + people + `"`,
		"search+bind":             `ldapserver=127.0.0.1 ldapport=` + port + ` ldapbasedn="` + ldaptest.BaseDN + `"`,
		"search+bind as bind DN":  `ldapserver=127.0.0.1 ldapport=` + port + ` ldapbasedn="` + ldaptest.BaseDN + `" ldapbinddn="` + ldaptest.RootDN + `" ldapbindpasswd=` + ldaptest.RootPassword,
		"search+bind with filter": `ldapserver=127.0.0.1 ldapport=` + port + ` ldapbasedn="` + people + `" ldapsearchfilter="(|(uid=$username)(mail=$username))"`,
		// Without its outer parentheses, as libldap takes it.
		"search+bind with a bare filter": `ldapserver=127.0.0.1 ldapport=` + port + ` ldapbasedn="` + people + `" ldapsearchfilter="uid=$username"`,
		"ldapurl":                        `ldapurl="ldap://127.0.0.1:` + port + `/` + people + `?uid?sub"`,
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, s := range modes {
		t.Run(name, func(t *testing.T) {
			o, err := ParseString(s)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Authenticate(ctx, "alice", "alice-pw"); err != nil {
				t.Errorf("the right password: %v", err)
			}
			for _, tc := range []struct{ user, pw string }{{"alice", "wrong"}, {"alice", ""}, {"nobody", "x"}, {"al*", "alice-pw"}} {
				if err := o.Authenticate(ctx, tc.user, tc.pw); !errors.Is(err, ErrBadCredentials) {
					t.Errorf("%s with %q: %v, want ErrBadCredentials", tc.user, tc.pw, err)
				}
			}
		})
	}
	// A filter that finds two entries refuses, whatever the password.
	o, err := ParseString(modes["search+bind with filter"])
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Authenticate(ctx, "shared@example.net", "bob-pw"); !errors.Is(err, ErrBadCredentials) || !strings.Contains(err.Error(), "not unique") {
		t.Errorf("an ambiguous user: %v", err)
	}
	if err := o.Authenticate(ctx, "alice@example.net", "alice-pw"); err != nil {
		t.Errorf("found by mail: %v", err)
	}
	// ldaptls with ldaps is accepted in the file (as PostgreSQL and
	// PgBouncer do) and fails every login, saying why.
	both, err := ParseString(`ldapurl="ldaps://127.0.0.1:` + port + `/` + people + `?uid?sub" ldaptls=1`)
	if err != nil {
		t.Fatalf("ldaptls with an ldaps URL: %v", err)
	}
	if err := both.Authenticate(ctx, "alice", "alice-pw"); err == nil || errors.Is(err, ErrBadCredentials) || !strings.Contains(err.Error(), "StartTLS over a connection that is TLS already") {
		t.Errorf("ldaptls with ldaps: %v", err)
	}
	// TLS settings that do not load (a missing TLS_CACERT) stop only TLS
	// connections: plain ldap:// logins go on.
	t.Setenv("LDAPTLS_CACERT", filepath.Join(t.TempDir(), "missing.pem"))
	plain, err := ParseString(modes["simple bind"])
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Authenticate(ctx, "alice", "alice-pw"); err != nil {
		t.Errorf("plain LDAP with a TLS_CACERT that does not load: %v", err)
	}
	// A server that does not answer is not a wrong password.
	down, err := ParseString(`ldapserver=127.0.0.1 ldapport=1 ldapprefix="uid=" ldapsuffix=",` + people + `"`)
	if err != nil {
		t.Fatal(err)
	}
	if err := down.Authenticate(ctx, "alice", "alice-pw"); err == nil || errors.Is(err, ErrBadCredentials) {
		t.Errorf("an unreachable server: %v", err)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{`ldapserver=h ldapprefix="uid=" ldapbasedn="dc=x"`, "cannot be used together"},
		{`ldapserver=h`, "needs ldapbasedn"},
		{`ldapprefix="uid="`, "needs ldapserver"},
		{`ldapserver=h ldapbinddn="cn=a"`, "needs ldapbasedn"},
		{`ldapserver=h ldapbasedn=x ldapsearchattribute=uid ldapsearchfilter="(uid=$username)"`, "cannot be used together"},
		{`ldapserver=h ldapbasedn=x ldapfoo=1`, "unknown LDAP option"},
		{`ldapserver=h ldapbasedn=x ldapport=99999`, "out of range"},
		{`ldapserver=h ldapbasedn="x`, "no closing quote"},
		{`ldapurl="http://h/x"`, "unsupported LDAP URL scheme"},
		{`ldapurl="ldap://h/x?uid?subtree"`, "unsupported LDAP URL scope"},
	} {
		if _, err := ParseString(tc.in); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.err)
		}
	}
	o, err := ParseString(`ldapurl="ldaps://ldap.example.net:1636/ou=a%20b,dc=x?cn?one" `)
	if err != nil {
		t.Fatal(err)
	}
	if o.Scheme != "ldaps" || o.Servers[0] != "ldap.example.net" || o.Port != 1636 || o.BaseDN != "ou=a b,dc=x" ||
		o.SearchAttribute != "cn" || !o.SearchMode() {
		t.Errorf("ldapurl: %+v", o)
	}
	if o, err = ParseString(`ldapurl="ldap://h/dc=x??sub?(uid=$username)"`); err != nil || o.SearchFilter != "(uid=$username)" {
		t.Errorf("ldapurl with a filter: %+v %v", o, err)
	}
	o, err = ParseString(`ldapserver="a b" ldapprefix="cn=""x""," ldapsuffix=",dc=x"`)
	if err != nil || len(o.Servers) != 2 || o.Prefix != `cn="x",` {
		t.Errorf("quoted values: %+v %v", o, err)
	}
}
