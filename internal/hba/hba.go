// Package hba parses host-based access rules, in PostgreSQL's pg_hba.conf
// format as PgBouncer reads it (auth_hba_file) or as a YAML list, and finds
// the rule that decides a client's login: the first line whose connection
// type, database, user and address match.
package hba

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"

	"github.com/poolerd/poolerd/internal/ldapauth"
)

// Connection types (the first column).
const (
	Local     = "local"
	Host      = "host"
	HostSSL   = "hostssl"
	HostNoSSL = "hostnossl"
)

// Methods (the last column).
const (
	Trust    = "trust"
	Reject   = "reject"
	MD5      = "md5"
	SCRAM    = "scram-sha-256"
	Password = "password"
	Cert     = "cert"
	// Peer: the operating-system user of a Unix-socket client (its
	// SO_PEERCRED), which must be the user it logs in as, or be mapped to
	// it (Rule.Map, auth_ident_file).
	Peer = "peer"
	// LDAP: the client's password checked against an LDAP server, with
	// the rule's ldap* options (Rule.LDAP).
	LDAP = "ldap"
	// PAM: the client's password checked by the system's PAM library,
	// service pamservice (Rule.PAMService; default pgbouncer).
	PAM = "pam"
)

// Rule is one line of access rules.
type Rule struct {
	// Source says where the rule comes from, for messages: "file:line"
	// or "auth_hba_rules[i]".
	Source string
	// Type is local, host, hostssl or hostnossl.
	Type string
	// Databases and Users match a client's names (see Name).
	Databases []Name
	Users     []Name
	// Net is the client address range; nil matches every address (all).
	Net *net.IPNet
	// Method is how a client the rule matches authenticates.
	Method string
	// Map is the option map=NAME of a peer or cert rule: the ident map
	// (auth_ident_file) that says which database users the client's
	// operating-system user (or certificate name) may log in as; empty:
	// only the one of the same name.
	Map string
	// LDAP are the options of an ldap rule.
	LDAP *ldapauth.Options
	// PAMService is the pamservice option of a pam rule ("" for the
	// default).
	PAMService string
}

// Name is one entry of a database or user column: a name, or (when
// Keyword) all, sameuser or replication. A quoted "all" is a name.
type Name struct {
	Value   string
	Keyword bool
}

// Rules is an ordered list of rules: the first match decides.
type Rules []Rule

// Client is what a rule is matched against.
type Client struct {
	// Local is true for a Unix-socket connection.
	Local bool
	// TLS is true when the connection is encrypted.
	TLS bool
	// Addr is the client's address (unused when Local).
	Addr     net.IP
	Database string
	User     string
	// Replication is true for a physical replication connection
	// (replication=true): as in PostgreSQL, only the replication keyword
	// matches its database. A logical one (replication=database) is
	// matched by its database like any connection.
	Replication bool
}

// Match returns the first rule that matches c, and false if none does (the
// login is then refused, as in PostgreSQL).
func (rs Rules) Match(c Client) (Rule, bool) {
	for _, r := range rs {
		if r.matches(c) {
			return r, true
		}
	}
	return Rule{}, false
}

func (r Rule) matches(c Client) bool {
	switch r.Type {
	case Local:
		if !c.Local {
			return false
		}
	case Host, HostSSL, HostNoSSL:
		if c.Local || r.Type == HostSSL && !c.TLS || r.Type == HostNoSSL && c.TLS {
			return false
		}
		if r.Net != nil && (c.Addr == nil || !r.Net.Contains(c.Addr)) {
			return false
		}
	default:
		return false
	}
	if c.Replication {
		return slices.Contains(r.Databases, Name{Value: "replication", Keyword: true}) && matchName(r.Users, c.User, c.User, false)
	}
	return matchName(r.Databases, c.Database, c.User, true) && matchName(r.Users, c.User, c.User, false)
}

func matchName(names []Name, value, user string, database bool) bool {
	for _, n := range names {
		switch {
		case !n.Keyword:
			if n.Value == value {
				return true
			}
		case n.Value == "all":
			return true
		case n.Value == "sameuser" && database:
			if value == user {
				return true
			}
		}
		// The replication keyword matches only physical replication
		// connections (matches).
	}
	return false
}

// Reader reads an @file included by a rule; path is as written, resolved
// by the reader.
type Reader func(path string) ([]byte, error)

// Parse reads rules in pg_hba.conf format. name labels the rules' Source;
// read resolves @file includes in the database and user columns (nil
// refuses them).
func Parse(name string, data []byte, read Reader) (Rules, error) {
	var rules Rules
	var errs []error
	for _, line := range logicalLines(string(data)) {
		if line.text == "" {
			continue
		}
		src := fmt.Sprintf("%s:%d", name, line.no)
		fields, err := tokenize(line.text)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		if len(fields) == 0 {
			continue
		}
		r, err := parseFields(src, fields, read)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		rules = append(rules, r)
	}
	return rules, errors.Join(errs...)
}

// FileReader reads @file includes relative to the directory of the file
// that names them, as PostgreSQL does.
func FileReader(dir string, readFile func(string) ([]byte, error)) Reader {
	return func(path string) ([]byte, error) {
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		return readFile(path)
	}
}

// RuleSpec is one rule given as a YAML entry (auth_hba_rules): the columns
// of a pg_hba.conf line, each in the same syntax.
type RuleSpec struct {
	Type     string `mapstructure:"type"`
	Database string `mapstructure:"database"`
	User     string `mapstructure:"user"`
	// Address is a CIDR range, a single address or all; empty for local.
	Address string `mapstructure:"address"`
	Method  string `mapstructure:"method"`
	// Map is the method's map option (peer, cert): an ident map name.
	Map string `mapstructure:"map"`
	// Options are the method's other options, as on a pg_hba.conf line
	// (ldap: ldapserver=… ldapbasedn=…; pam: pamservice=…).
	Options string `mapstructure:"options"`
}

// FromSpecs turns YAML entries into rules; where names the list in
// messages (auth_hba_rules).
func FromSpecs(where string, specs []RuleSpec) (Rules, error) {
	var rules Rules
	var errs []error
	for i, s := range specs {
		src := fmt.Sprintf("%s[%d]", where, i)
		var fields []field
		for _, col := range []struct{ key, v string }{{"type", s.Type}, {"database", s.Database}, {"user", s.User}, {"address", s.Address}, {"method", s.Method}} {
			if col.key == "address" && col.v == "" && s.Type == Local {
				continue
			}
			if col.key == "address" && !strings.ContainsAny(col.v, "/ ") && net.ParseIP(col.v) != nil {
				// One host: PgBouncer's bare address.
				col.v += map[bool]string{true: "/32", false: "/128"}[net.ParseIP(col.v).To4() != nil]
			}
			if strings.TrimSpace(col.v) == "" {
				errs = append(errs, fmt.Errorf("%s has no %s", src, col.key))
				fields = nil
				break
			}
			f, err := tokenize(col.v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", src, col.key, err))
				fields = nil
				break
			}
			fields = append(fields, f...)
		}
		if fields == nil {
			continue
		}
		if s.Map != "" {
			f, err := tokenize("map=" + s.Map)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s map: %w", src, err))
				continue
			}
			fields = append(fields, f...)
		}
		if strings.TrimSpace(s.Options) != "" {
			f, err := tokenize(s.Options)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s options: %w", src, err))
				continue
			}
			fields = append(fields, f...)
		}
		r, err := parseFields(src, fields, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		rules = append(rules, r)
	}
	return rules, errors.Join(errs...)
}

type logicalLine struct {
	no   int
	text string
}

// logicalLines splits data into lines without comments, joining lines
// that end with a backslash (PostgreSQL 16's continuation).
func logicalLines(data string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	start := 0
	for no, raw := range strings.Split(data, "\n") {
		raw = strings.TrimRight(raw, "\r")
		raw = stripComment(raw)
		if cur.Len() == 0 {
			start = no + 1
		}
		if strings.HasSuffix(raw, `\`) {
			cur.WriteString(strings.TrimSuffix(raw, `\`))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(raw)
		out = append(out, logicalLine{no: start, text: strings.TrimSpace(cur.String())})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, logicalLine{no: start, text: strings.TrimSpace(cur.String())})
	}
	return out
}

// stripComment removes a # comment outside double quotes.
func stripComment(s string) string {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case '#':
			if !quoted {
				return s[:i]
			}
		}
	}
	return s
}

// token is one comma-separated item of a field.
type token struct {
	text   string
	quoted bool
}

// field is one column: its items.
type field []token

// tokenize splits a line into fields separated by blanks; within a field
// items are separated by commas, and a field ending with a comma goes on
// in the next word ("a, b" is one field). Double quotes keep blanks,
// commas and keywords literal ("" is a quote inside quotes). As
// PostgreSQL's tokenizer, a comma with nothing before it is skipped
// ("a,,b" is a and b; ",b" after a blank starts a field b) and one at the
// end of the line ends its field; but after the database and user fields
// a comma after a blank continues the list, as PgBouncer's parser reads
// "u1,u2 , u3".
func tokenize(line string) ([]field, error) {
	var fields []field
	var cur field
	var tok strings.Builder
	quoted, inQuote, has, cont := false, false, false, false
	flushTok := func() {
		if has {
			cur = append(cur, token{text: tok.String(), quoted: quoted})
		}
		tok.Reset()
		quoted, has = false, false
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '"':
			if i+1 < len(line) && line[i+1] == '"' {
				tok.WriteByte('"')
				i++
				continue
			}
			inQuote = false
		case inQuote:
			tok.WriteByte(c)
		case c == '"':
			inQuote, quoted, has = true, true, true
		case c == ',':
			if !has {
				if len(cur) == 0 && (len(fields) == 2 || len(fields) == 3) {
					// After the database or user list, as
					// PgBouncer's parser: blanks around a comma do
					// not end a list ("u1,u2 , u3").
					cur, fields = fields[len(fields)-1], fields[:len(fields)-1]
					cont = true
				}
				continue
			}
			flushTok()
			cont = true
		case c == ' ' || c == '\t':
			if has {
				flushTok()
				cont = false
			}
			if !cont && len(cur) > 0 {
				fields = append(fields, cur)
				cur = nil
			}
		default:
			tok.WriteByte(c)
			has = true
			cont = false
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quoted string")
	}
	flushTok()
	if len(cur) > 0 {
		fields = append(fields, cur)
	}
	return fields, nil
}

// maxIncludeDepth bounds @file includes naming @files.
const maxIncludeDepth = 10

func parseFields(src string, fields []field, read Reader) (Rule, error) {
	r := Rule{Source: src}
	if len(fields[0]) != 1 || fields[0][0].quoted {
		return r, errors.New("the connection type must be one word: local, host, hostssl or hostnossl")
	}
	r.Type = fields[0][0].text
	switch r.Type {
	case Local, Host, HostSSL, HostNoSSL:
	case "hostgssenc", "hostnogssenc":
		return r, fmt.Errorf("connection type %s is not supported: poolerd has no GSSAPI encryption; use host, hostssl or hostnossl", r.Type)
	default:
		return r, fmt.Errorf("connection type %q is not local, host, hostssl or hostnossl", r.Type)
	}
	need := 4
	if r.Type != Local {
		need = 5
	}
	if len(fields) < need {
		return r, fmt.Errorf("too few fields: a %s line has type, database, user%s and method", r.Type, map[bool]string{true: ", address"}[r.Type != Local])
	}
	var err error
	if r.Databases, err = names(fields[1], "database", read, 0); err != nil {
		return r, err
	}
	if r.Users, err = names(fields[2], "user", read, 0); err != nil {
		return r, err
	}
	rest := fields[3:]
	if r.Type != Local {
		r.Net, rest, err = address(rest)
		if err != nil {
			return r, err
		}
	}
	if len(rest) == 0 {
		return r, errors.New("no authentication method")
	}
	if len(rest[0]) != 1 {
		return r, errors.New("the authentication method must be one word")
	}
	r.Method = rest[0][0].text
	switch r.Method {
	case Trust, Reject, MD5, SCRAM, Password, Cert, Peer, LDAP, PAM:
	case "ident", "gss", "sspi", "radius", "bsd":
		return r, fmt.Errorf("authentication method %s is not supported by poolerd: use trust, reject, md5, scram-sha-256, password, cert, peer, ldap or pam", r.Method)
	default:
		return r, fmt.Errorf("unknown authentication method %q: use trust, reject, md5, scram-sha-256, password, cert, peer, ldap or pam", r.Method)
	}
	if r.Method == Cert && r.Type == Local {
		// PostgreSQL takes cert on hostssl lines only; PgBouncer on
		// host lines too, where a client without TLS fails it.
		return r, errors.New("cert authentication is not available on local (Unix socket) connections: use hostssl")
	}
	if r.Method == Peer && r.Type != Local {
		return r, errors.New("peer authentication is only supported on local sockets (a local line: clients of unix_socket_dir)")
	}
	ldapOpts := map[string]string{}
	for _, opt := range rest[1:] {
		for _, t := range opt {
			name, value, ok := strings.Cut(t.text, "=")
			if !ok {
				return r, fmt.Errorf("authentication option %q is not name=value", t.text)
			}
			switch {
			case name == "map":
				if r.Method != Peer && r.Method != Cert {
					return r, fmt.Errorf("authentication option map is only valid for the peer and cert methods, not %s", r.Method)
				}
				r.Map = value
			case strings.HasPrefix(name, "ldap"):
				if r.Method != LDAP {
					return r, fmt.Errorf("authentication option %s is only valid for the ldap method, not %s", name, r.Method)
				}
				ldapOpts[name] = value
			case name == "pamservice":
				if r.Method != PAM {
					return r, fmt.Errorf("authentication option pamservice is only valid for the pam method, not %s", r.Method)
				}
				r.PAMService = value
			}
		}
	}
	if r.Method == LDAP {
		o, err := ldapauth.Parse(ldapOpts)
		if err != nil {
			return r, err
		}
		r.LDAP = &o
	}
	return r, nil
}

// names reads a database or user column.
func names(f field, what string, read Reader, depth int) ([]Name, error) {
	var out []Name
	for _, t := range f {
		switch {
		case t.quoted:
			out = append(out, Name{Value: t.text})
		case strings.HasPrefix(t.text, "@"):
			inc, err := include(t.text[1:], what, read, depth)
			if err != nil {
				return nil, err
			}
			out = append(out, inc...)
		case strings.HasPrefix(t.text, "+") && what == "user":
			return nil, fmt.Errorf("group membership (%s) is not supported by poolerd: list the users, or put them in an @file", t.text)
		case t.text == "all", what == "database" && (t.text == "sameuser" || t.text == "replication"):
			out = append(out, Name{Value: t.text, Keyword: true})
		case what == "database" && t.text == "samerole", what == "database" && t.text == "samegroup":
			return nil, fmt.Errorf("database keyword %s is not supported by poolerd (it needs role membership): list the databases", t.text)
		default:
			out = append(out, Name{Value: t.text})
		}
	}
	return out, nil
}

// include reads the names of an @file: separated by blanks, commas or
// lines, with comments.
func include(path, what string, read Reader, depth int) ([]Name, error) {
	if read == nil {
		return nil, fmt.Errorf("@%s: @file includes are only read from auth_hba_file", path)
	}
	if depth >= maxIncludeDepth {
		return nil, fmt.Errorf("@%s: @file includes nested more than %d deep", path, maxIncludeDepth)
	}
	data, err := read(path)
	if err != nil {
		return nil, fmt.Errorf("%s list @%s: %w", what, path, err)
	}
	var out []Name
	for _, line := range logicalLines(string(data)) {
		fields, err := tokenize(line.text)
		if err != nil {
			return nil, fmt.Errorf("@%s line %d: %w", path, line.no, err)
		}
		for _, f := range fields {
			n, err := names(f, what, read, depth+1)
			if err != nil {
				return nil, fmt.Errorf("@%s line %d: %w", path, line.no, err)
			}
			out = append(out, n...)
		}
	}
	return out, nil
}

// address reads the address column (CIDR, address and mask, or all) and
// returns the fields after it.
func address(fields []field) (*net.IPNet, []field, error) {
	f := fields[0]
	if len(f) != 1 {
		return nil, nil, errors.New("the address must be one value, not a list")
	}
	a := f[0].text
	switch {
	case a == "all" && !f[0].quoted:
		return nil, fields[1:], nil
	case a == "samehost" || a == "samenet":
		return nil, nil, fmt.Errorf("address %s is not supported by poolerd: give a CIDR range such as 10.0.0.0/8", a)
	case strings.Contains(a, "/"):
		_, n, err := net.ParseCIDR(a)
		if err != nil {
			return nil, nil, fmt.Errorf("address %q is not a CIDR range such as 10.0.0.0/8 or fd00::/8", a)
		}
		return n, fields[1:], nil
	}
	ip := net.ParseIP(a)
	if ip == nil {
		return nil, nil, fmt.Errorf("address %q is not an IP address or CIDR range (host names are not supported)", a)
	}
	if len(fields) < 2 || len(fields[1]) != 1 {
		return nil, nil, fmt.Errorf("address %s needs a mask: write %s/32 (or /128), or give the mask as the next column", a, a)
	}
	maskIP := net.ParseIP(fields[1][0].text)
	if maskIP == nil {
		// The next column is the method: a bare address is a single host
		// in PgBouncer (and an error in PostgreSQL); be explicit instead.
		return nil, nil, fmt.Errorf("address %s has no mask: write %s/32 (or /128 for IPv6)", a, a)
	}
	if (ip.To4() == nil) != (maskIP.To4() == nil) {
		return nil, nil, fmt.Errorf("address %s and mask %s are not the same IP family", a, maskIP)
	}
	m := net.IPMask(maskIP)
	if ip.To4() != nil {
		m = net.IPMask(maskIP.To4())
		ip = ip.To4()
	}
	if ones, bits := m.Size(); ones == 0 && bits == 0 {
		return nil, nil, fmt.Errorf("mask %s is not a valid netmask", maskIP)
	}
	return &net.IPNet{IP: ip.Mask(m), Mask: m}, fields[2:], nil
}

// Methods lists the methods the rules use.
func (rs Rules) Methods() map[string]bool {
	out := map[string]bool{}
	for _, r := range rs {
		out[r.Method] = true
	}
	return out
}
