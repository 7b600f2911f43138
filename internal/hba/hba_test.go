package hba

import (
	"errors"
	"github.com/poolerd/poolerd/internal/ldapauth"
	"net"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	files := map[string]string{"/etc/poolerd/admins": "# admins\nalice, bob\n\"carol\"\n"}
	read := FileReader("/etc/poolerd", func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, errors.New("no such file")
	})
	rules, err := Parse("hba.conf", []byte(`
# comment
local   all  all                     trust
hostssl all  @admins  0.0.0.0/0      cert
host    "all" app     10.0.0.0 255.0.0.0   md5  # a quoted all is a database named all
host    app,"other db"  app, report   10.0.0.0/8 scram-sha-256
hostnossl sameuser all  192.168.1.0/24  password
host    all  evil    all             reject
host    all  all     ::1/128         trust
host    app  all     127.0.0.1/32 \
        scram-sha-256 clientcert=verify-ca
host    replication,app  repl  10.0.0.0/8  md5
`), read)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 9 {
		t.Fatalf("%d rules: %+v", len(rules), rules)
	}
	for _, tc := range []struct {
		c      Client
		method string // "" = no match
		source string
	}{
		{Client{Local: true, Database: "x", User: "y"}, Trust, "hba.conf:3"},
		{Client{TLS: true, Addr: net.ParseIP("1.2.3.4"), Database: "x", User: "carol"}, Cert, "hba.conf:4"},
		{Client{TLS: false, Addr: net.ParseIP("1.2.3.4"), Database: "x", User: "carol"}, "", ""},
		{Client{Addr: net.ParseIP("10.1.2.3"), Database: "all", User: "app"}, MD5, "hba.conf:5"},
		{Client{Addr: net.ParseIP("10.1.2.3"), Database: "other db", User: "report"}, SCRAM, "hba.conf:6"},
		{Client{Addr: net.ParseIP("11.1.2.3"), Database: "app", User: "report"}, "", ""},
		{Client{Addr: net.ParseIP("192.168.1.7"), Database: "u", User: "u"}, Password, "hba.conf:7"},
		{Client{TLS: true, Addr: net.ParseIP("192.168.1.7"), Database: "u", User: "u"}, "", ""},
		{Client{Addr: net.ParseIP("8.8.8.8"), Database: "app", User: "evil"}, Reject, "hba.conf:8"},
		{Client{Addr: net.ParseIP("::1"), Database: "app", User: "x"}, Trust, "hba.conf:9"},
		{Client{Addr: net.ParseIP("127.0.0.1"), Database: "app", User: "x"}, SCRAM, "hba.conf:10"},
		{Client{Addr: net.ParseIP("127.0.0.1"), Database: "other", User: "x"}, "", ""},
		// A physical replication connection matches the replication
		// keyword only (not all, not its database name); a logical one
		// matches as any connection to its database.
		{Client{Local: true, Database: "x", User: "y", Replication: true}, "", ""},
		{Client{Addr: net.ParseIP("::1"), Database: "app", User: "x", Replication: true}, "", ""},
		{Client{Addr: net.ParseIP("10.1.2.3"), Database: "replication", User: "app"}, "", ""},
		{Client{Addr: net.ParseIP("10.1.2.3"), Database: "anything", User: "repl", Replication: true}, MD5, "hba.conf:12"},
		{Client{Addr: net.ParseIP("10.1.2.3"), Database: "app", User: "repl"}, MD5, "hba.conf:12"},
	} {
		r, ok := rules.Match(tc.c)
		if ok != (tc.method != "") || r.Method != tc.method || r.Source != tc.source {
			t.Errorf("%+v: got %v %q %s, want %q %s", tc.c, ok, r.Method, r.Source, tc.method, tc.source)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"host all all 10.0.0.0/8", "too few fields"},
		{"host all all 10.0.0.0 255.0.0.0", "no authentication method"},
		{"host all all", "too few fields"},
		{"hostx all all all trust", "not local, host"},
		{"hostgssenc all all all trust", "GSSAPI"},
		{"host all +admins all trust", "group membership"},
		{"host samerole all all trust", "samerole"},
		{"host all all 10.0.0.1 trust", "has no mask"},
		{"host all all 10.0.0.1 255.0.255.0 trust", "not a valid netmask"},
		{"host all all db.example.com trust", "host names are not supported"},
		{"host all all samenet trust", "samenet"},
		{"host all all all ident", "not supported by poolerd"},
		{"host all all all magic", "unknown authentication method"},
		{"local all all cert", "not available on local"},
		{"host all all all md5 clientcert", "name=value"},
		{`host "all all all md5`, "unterminated"},
		{"host @list all all md5", "only read from auth_hba_file"},
		{"host all all all peer", "only supported on local sockets"},
		{"local all all md5 map=m", "only valid for the peer and cert methods"},
	} {
		_, err := Parse("f", []byte(tc.line), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "f:1") {
			t.Errorf("%q: got %v, want an error with %q and the line", tc.line, err, tc.want)
		}
	}
}

// Commas as PostgreSQL's tokenizer takes them: an empty item is skipped,
// a comma opening a field (after a blank) is too, and one at the end of
// the line ends its field; a quoted option name is its text
// (PgBouncer's suite writes such lines).
func TestCommasAndQuotes(t *testing.T) {
	for _, tc := range []struct {
		line string
		dbs  string
		ldap func(o *ldapauth.Options) bool
	}{
		{"host a,,b all all md5", "a,b", nil},
		{"host a, ,b all all md5", "a,b", nil},
		{"host a,b, c all all md5", "a,b,c", nil},
		{"host a all all md5,", "a", nil},
		{"host a,b , c all 10.0.0.0/8 md5", "a,b,c", nil},
		{"host a ,b all 10.0.0.0/8 md5", "a,b", nil},
		{`host all all 0.0.0.0/0 ldap ldapserver=127.0.0.1 "ldapport"=1389 ldapbasedn="dc=example,dc=net" ,ldapsearchfilter="uid=$username"`,
			"all", func(o *ldapauth.Options) bool {
				return o.Port == 1389 && o.BaseDN == "dc=example,dc=net" && o.SearchFilter == "uid=$username"
			}},
	} {
		rules, err := Parse("f", []byte(tc.line), nil)
		if err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		r := rules[0]
		var dbs []string
		for _, n := range r.Databases {
			dbs = append(dbs, n.Value)
		}
		if strings.Join(dbs, ",") != tc.dbs {
			t.Errorf("%q: databases %q, want %s", tc.line, dbs, tc.dbs)
		}
		if tc.ldap != nil && (r.LDAP == nil || !tc.ldap(r.LDAP)) {
			t.Errorf("%q: LDAP options %+v", tc.line, r.LDAP)
		}
	}
}

func TestFromSpecs(t *testing.T) {
	rules, err := FromSpecs("auth_hba_rules", []RuleSpec{
		{Type: "hostssl", Database: "app", User: "alice, bob", Address: "10.0.0.0/8", Method: "scram-sha-256"},
		{Type: "host", Database: "all", User: "all", Address: "192.168.0.5", Method: "md5"},
		{Type: "local", Database: "all", User: "all", Method: "trust"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := rules.Match(Client{TLS: true, Addr: net.ParseIP("10.9.9.9"), Database: "app", User: "bob"}); !ok || r.Method != SCRAM {
		t.Errorf("got %+v", r)
	}
	if r, ok := rules.Match(Client{Addr: net.ParseIP("192.168.0.5"), Database: "x", User: "y"}); !ok || r.Source != "auth_hba_rules[1]" {
		t.Errorf("got %+v", r)
	}
	if _, ok := rules.Match(Client{Addr: net.ParseIP("192.168.0.6"), Database: "x", User: "y"}); ok {
		t.Error("a bare address matched another host")
	}
	_, err = FromSpecs("auth_hba_rules", []RuleSpec{{Type: "host", Database: "all", User: "all", Method: "md5"}})
	if err == nil || !strings.Contains(err.Error(), "auth_hba_rules[0] has no address") {
		t.Errorf("got %v", err)
	}
}

// peer on local lines, with its map option, from a file and from YAML.
func TestPeerRules(t *testing.T) {
	rules, err := Parse("f", []byte("local all alice peer\nlocal all all peer map=staff\nhostssl all all all cert map=certs clientcert=verify-full\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rules[0].Method != Peer || rules[0].Map != "" || rules[1].Map != "staff" || rules[2].Map != "certs" {
		t.Fatalf("rules %+v", rules)
	}
	r, ok := rules.Match(Client{Local: true, Database: "app", User: "bob"})
	if !ok || r.Source != "f:2" {
		t.Fatalf("bob on the socket matched %+v %v, want f:2", r, ok)
	}
	specs, err := FromSpecs("auth_hba_rules", []RuleSpec{{Type: "local", Database: "all", User: "all", Method: "peer", Map: "staff"}})
	if err != nil || specs[0].Map != "staff" || specs[0].Method != Peer {
		t.Fatalf("from YAML: %+v %v", specs, err)
	}
}

// Ident maps: plain names, a regular expression with \1, all, quoted
// names; errors name the line.
func TestIdentMaps(t *testing.T) {
	m, err := ParseIdent("ident.conf", []byte(`# comment
staff  alice      app      # trailing comment
staff  /^(.*)@corp$  \1
staff  "bob smith"  bob
admins root       all
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mp, system, user string
		want             bool
	}{
		{"staff", "alice", "app", true},
		{"staff", "alice", "alice", false},
		{"staff", "carol@corp", "carol", true},
		{"staff", "carol@corp", "dave", false},
		{"staff", "carol@corp.com", "carol", false},
		{"staff", "bob smith", "bob", true},
		{"admins", "root", "anyone", true},
		{"admins", "alice", "app", false},
		{"nomap", "alice", "app", false},
	} {
		if got := m.Allows(tc.mp, tc.system, tc.user); got != tc.want {
			t.Errorf("Allows(%q, %q, %q) = %v, want %v", tc.mp, tc.system, tc.user, got, tc.want)
		}
	}
	for data, want := range map[string]string{
		"staff alice":         "three fields",
		"staff alice app x":   "three fields",
		"staff /(  app":       "regular expression",
		"staff alice +admins": "group membership",
		`staff "alice app`:    "unterminated",
	} {
		if _, err := ParseIdent("ident.conf", []byte("\n"+data)); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "ident.conf:2") {
			t.Errorf("%q: %v, want an error with %q at ident.conf:2", data, err, want)
		}
	}
}

// TestListWithBlanks: PgBouncer's hba_test.rules writes a user list with
// blanks around a comma; the list goes on and the address follows it.
func TestListWithBlanks(t *testing.T) {
	rules, err := Parse("f", []byte("host\t\ttmp1,all\tuser1,user2 , user3\t\t\t16.0.0.0/8\tmd5\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, n := range rules[0].Users {
		users = append(users, n.Value)
	}
	if strings.Join(users, ",") != "user1,user2,user3" || rules[0].Net == nil || rules[0].Net.String() != "16.0.0.0/8" || rules[0].Method != MD5 {
		t.Errorf("users %q, address %v, method %s", users, rules[0].Net, rules[0].Method)
	}
}

// TestCertOnHostLines: PgBouncer (unlike PostgreSQL) takes cert on host
// lines (its hba_test.rules has them); a client without TLS then fails it
// at login. On a local line it is refused.
func TestCertOnHostLines(t *testing.T) {
	if _, err := Parse("f", []byte("host all all 10.0.0.0/8 cert\nhostnossl all all 11.0.0.0/8 cert\n"), nil); err != nil {
		t.Errorf("cert on host lines: %v", err)
	}
	if _, err := Parse("f", []byte("local all all cert\n"), nil); err == nil {
		t.Error("cert on a local line: no error")
	}
}
