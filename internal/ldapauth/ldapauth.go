// Package ldapauth checks a user's password against an LDAP server, with
// PostgreSQL's options and its two modes (see PostgreSQL's "LDAP
// Authentication"): simple bind, where the user's DN is ldapprefix + user
// name + ldapsuffix, and search+bind, where poolerd binds as ldapbinddn (or
// anonymously), searches ldapbasedn for the one entry whose
// ldapsearchattribute (default uid) is the user name, or that
// ldapsearchfilter finds, and binds as that entry with the password. It is
// what auth_type ldap (with auth_ldap_options) and ldap lines of
// auth_hba_file use.
package ldapauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/poolerd/poolerd/internal/certcheck"
)

// Options are the LDAP settings of PostgreSQL's ldap method.
type Options struct {
	// Scheme is ldap or ldaps (TLS from the first byte).
	Scheme string
	// Servers are tried in order until one answers.
	Servers []string
	// Port is the servers' port; 0: 389 (ldap) or 636 (ldaps).
	Port int
	// StartTLS: ldaptls=1, TLS negotiated over an ldap connection.
	StartTLS bool
	// Prefix and Suffix make the DN of simple-bind mode.
	Prefix, Suffix string
	// Search+bind mode: BaseDN (set), BindDN and BindPasswd for the
	// search (empty: anonymous), SearchAttribute or SearchFilter (with
	// $username), and Scope (from ldapurl; sub otherwise).
	BaseDN, BindDN, BindPasswd    string
	SearchAttribute, SearchFilter string
	Scope                         int
}

// Parse reads the options of an ldap line of pg_hba.conf (name=value
// pairs), checked as PostgreSQL checks them.
func Parse(opts map[string]string) (Options, error) {
	o := Options{Scheme: "ldap", Scope: ldap.ScopeWholeSubtree}
	for name, v := range opts {
		var err error
		switch name {
		case "ldapserver":
			o.Servers = strings.Fields(strings.ReplaceAll(v, ",", " "))
		case "ldapport":
			o.Port, err = strconv.Atoi(v)
			if err == nil && (o.Port < 1 || o.Port > 65535) {
				err = errors.New("out of range")
			}
		case "ldapscheme":
			if v != "ldap" && v != "ldaps" {
				err = errors.New("must be ldap or ldaps")
			}
			o.Scheme = v
		case "ldaptls":
			o.StartTLS = v == "1"
		case "ldapprefix":
			o.Prefix = v
		case "ldapsuffix":
			o.Suffix = v
		case "ldapbasedn":
			o.BaseDN = v
		case "ldapbinddn":
			o.BindDN = v
		case "ldapbindpasswd":
			o.BindPasswd = v
		case "ldapsearchattribute":
			o.SearchAttribute = v
		case "ldapsearchfilter":
			o.SearchFilter = v
		case "ldapurl":
			err = o.parseURL(v)
		default:
			err = errors.New("unknown LDAP option (poolerd takes PostgreSQL's: ldapserver, ldapport, ldapscheme, ldaptls, ldapprefix, ldapsuffix, ldapbasedn, ldapbinddn, ldapbindpasswd, ldapsearchattribute, ldapsearchfilter, ldapurl)")
		}
		if err != nil {
			return Options{}, fmt.Errorf("LDAP option %s: %w", name, err)
		}
	}
	search := o.BaseDN != "" || o.BindDN != "" || o.BindPasswd != "" || o.SearchAttribute != "" || o.SearchFilter != ""
	switch {
	case len(o.Servers) == 0:
		return Options{}, errors.New("LDAP authentication needs ldapserver (or ldapurl)")
	case search && (o.Prefix != "" || o.Suffix != ""):
		return Options{}, errors.New("LDAP options ldapbasedn, ldapbinddn, ldapbindpasswd, ldapsearchattribute, ldapsearchfilter and ldapurl cannot be used together with ldapprefix or ldapsuffix")
	case search && o.BaseDN == "":
		return Options{}, errors.New("LDAP search+bind mode needs ldapbasedn")
	case o.SearchAttribute != "" && o.SearchFilter != "":
		return Options{}, errors.New("LDAP options ldapsearchattribute and ldapsearchfilter cannot be used together")
	case !search && o.Prefix == "" && o.Suffix == "":
		return Options{}, errors.New("LDAP authentication needs ldapbasedn (search+bind mode) or ldapprefix and ldapsuffix (simple bind mode)")
	}
	return o, nil
}

// ParseString reads auth_ldap_options: name=value pairs separated by
// blanks, values optionally double-quoted (a doubled quote inside quotes is
// a quote), as the options of a pg_hba.conf line.
func ParseString(s string) (Options, error) {
	opts := map[string]string{}
	for i := 0; i < len(s); {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			break
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return Options{}, fmt.Errorf("auth_ldap_options: %q is not name=value", strings.Fields(s[i:])[0])
		}
		name := s[i : i+eq]
		if strings.ContainsAny(name, " \t\"") {
			return Options{}, fmt.Errorf("auth_ldap_options: %q is not name=value", name)
		}
		i += eq + 1
		var v strings.Builder
		if i < len(s) && s[i] == '"' {
			i++
			for {
				if i >= len(s) {
					return Options{}, fmt.Errorf("auth_ldap_options: the value of %s has no closing quote", name)
				}
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						v.WriteByte('"')
						i += 2
						continue
					}
					i++
					break
				}
				v.WriteByte(s[i])
				i++
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' {
				v.WriteByte(s[i])
				i++
			}
		}
		opts[name] = v.String()
	}
	return Parse(opts)
}

// parseURL reads ldapurl, RFC 4516:
// scheme://host[:port]/basedn[?[attribute][?[scope][?[filter]]]].
func (o *Options) parseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a valid LDAP URL")
	}
	if u.Scheme != "ldap" && u.Scheme != "ldaps" {
		return fmt.Errorf("unsupported LDAP URL scheme %q: use ldap or ldaps", u.Scheme)
	}
	o.Scheme = u.Scheme
	if h := u.Hostname(); h != "" {
		o.Servers = []string{h}
	}
	if p := u.Port(); p != "" {
		if o.Port, err = strconv.Atoi(p); err != nil {
			return errors.New("not a valid port in the LDAP URL")
		}
	}
	o.BaseDN, _ = url.PathUnescape(strings.TrimPrefix(u.EscapedPath(), "/"))
	parts := strings.SplitN(u.RawQuery, "?", 4)
	get := func(i int) string {
		if i >= len(parts) {
			return ""
		}
		v, _ := url.QueryUnescape(parts[i])
		return v
	}
	if a := get(0); a != "" {
		if strings.Contains(a, ",") {
			return errors.New("the LDAP URL names several attributes: give one")
		}
		o.SearchAttribute = a
	}
	// As libldap's URL parser, which PostgreSQL uses: without a scope,
	// the search is of the base DN only.
	switch get(1) {
	case "", "base":
		o.Scope = ldap.ScopeBaseObject
	case "one":
		o.Scope = ldap.ScopeSingleLevel
	case "sub":
		o.Scope = ldap.ScopeWholeSubtree
	default:
		return fmt.Errorf("unsupported LDAP URL scope %q: use base, one or sub", get(1))
	}
	if f := get(2); f != "" {
		o.SearchFilter = f
	}
	return nil
}

// SearchMode reports whether the options are of search+bind mode.
func (o Options) SearchMode() bool { return o.BaseDN != "" }

// ErrBadCredentials is a password the LDAP server refused (or an unknown
// user, or one the search found more than once).
var ErrBadCredentials = errors.New("LDAP authentication failed")

// Authenticate checks user's password, within ctx. It returns nil when the
// server accepted it, an error wrapping ErrBadCredentials when it refused
// it, another error when it could not be asked.
func (o Options) Authenticate(ctx context.Context, user, password string) error {
	if password == "" {
		// An empty password is an anonymous bind, which servers accept.
		return fmt.Errorf("%w: empty password", ErrBadCredentials)
	}
	conn, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	dn := o.Prefix + user + o.Suffix
	if o.SearchMode() {
		if dn, err = o.search(conn, user); err != nil {
			return err
		}
	}
	if err := conn.Bind(dn, password); err != nil {
		if ldap.IsErrorWithCode(err, ldap.LDAPResultInvalidCredentials) {
			return fmt.Errorf("%w: the server refused the password for %q", ErrBadCredentials, dn)
		}
		return fmt.Errorf("LDAP bind as %q: %w", dn, err)
	}
	return nil
}

// search finds the DN of user's entry (search+bind mode).
func (o Options) search(conn *ldap.Conn, user string) (string, error) {
	// As PostgreSQL: characters a filter would need escaped are refused.
	if strings.ContainsAny(user, "*()\\/") {
		return "", fmt.Errorf("%w: invalid character in user name for LDAP authentication", ErrBadCredentials)
	}
	if o.BindDN != "" || o.BindPasswd != "" {
		if err := conn.Bind(o.BindDN, o.BindPasswd); err != nil {
			return "", fmt.Errorf("LDAP bind as ldapbinddn %q for the search: %w", o.BindDN, err)
		}
	}
	filter := strings.ReplaceAll(o.SearchFilter, "$username", user)
	if filter == "" {
		attr := o.SearchAttribute
		if attr == "" {
			attr = "uid"
		}
		filter = "(" + attr + "=" + user + ")"
	} else if !strings.HasPrefix(filter, "(") {
		// libldap, which PostgreSQL and PgBouncer use, takes a filter
		// without its outer parentheses (uid=$username); so does poolerd.
		filter = "(" + filter + ")"
	}
	req := ldap.NewSearchRequest(o.BaseDN, o.Scope, ldap.NeverDerefAliases, 2, 0, false, filter, []string{"1.1"}, nil)
	res, err := conn.Search(req)
	if err != nil && (res == nil || !ldap.IsErrorWithCode(err, ldap.LDAPResultSizeLimitExceeded)) {
		return "", fmt.Errorf("LDAP search of %q for %s: %w", o.BaseDN, filter, err)
	}
	switch n := len(res.Entries); {
	case n == 0:
		return "", fmt.Errorf("%w: LDAP user %q does not exist (search of %q for %s found nothing)", ErrBadCredentials, user, o.BaseDN, filter)
	case n > 1:
		return "", fmt.Errorf("%w: LDAP user %q is not unique (search of %q for %s found several entries)", ErrBadCredentials, user, o.BaseDN, filter)
	}
	return res.Entries[0].DN, nil
}

// dialTimeout bounds a connect to one LDAP server when ctx has no
// earlier deadline.
const dialTimeout = 10 * time.Second

// dial connects to the first server that answers, with TLS as the options
// say.
func (o Options) dial(ctx context.Context) (*ldap.Conn, error) {
	if o.StartTLS && o.Scheme == "ldaps" {
		// Accepted in the file, as PostgreSQL and PgBouncer accept it;
		// every login through it fails, as theirs do.
		return nil, errors.New("ldaptls=1 with ldapscheme ldaps (or an ldaps:// URL): StartTLS over a connection that is TLS already; remove one of them")
	}
	port := o.Port
	if port == 0 {
		port = 389
		if o.Scheme == "ldaps" {
			port = 636
		}
	}
	deadline := time.Now().Add(dialTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	var errs []error
	useTLS := o.Scheme == "ldaps" || o.StartTLS
	for _, host := range o.Servers {
		// The TLS settings are read only for a connection that uses TLS:
		// a TLS_CACERT that does not load must not stop plain ldap://.
		var tc *tls.Config
		if useTLS {
			var err error
			if tc, err = tlsConfig(host); err != nil {
				return nil, err
			}
		}
		addr := o.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port))
		opts := []ldap.DialOpt{ldap.DialWithDialer(&net.Dialer{Deadline: deadline})}
		if tc != nil {
			opts = append(opts, ldap.DialWithTLSConfig(tc))
		}
		conn, err := ldap.DialURL(addr, opts...)
		if err == nil && o.StartTLS {
			if err = conn.StartTLS(tc); err != nil {
				conn.Close()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		conn.SetTimeout(max(time.Until(deadline), time.Millisecond))
		return conn, nil
	}
	return nil, fmt.Errorf("no LDAP server answered: %w", errors.Join(errs...))
}

// tlsConfig verifies the LDAP server's certificate as OpenLDAP's client
// library (which PostgreSQL's and PgBouncer's LDAP authentication use) is
// configured to (ldapTLSSettings): against the system's roots, or the CA
// file of TLS_CACERT, and not at all with TLS_REQCERT never or allow. As
// that library, a certificate with no subject alternative name may name the
// host in its common name (Go's own check no longer looks there).
func tlsConfig(host string) (*tls.Config, error) {
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	st := ldapTLSSettings()
	if st.caFile != "" {
		pem, err := os.ReadFile(st.caFile)
		if err != nil {
			return nil, fmt.Errorf("TLS_CACERT (%s): %w", st.from, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS_CACERT %s (%s) holds no PEM certificate", st.caFile, st.from)
		}
		tc.RootCAs = pool
	}
	switch strings.ToLower(st.reqCert) {
	case "never", "allow":
		// allow: a bad certificate does not end the session either.
		tc.InsecureSkipVerify = true
		return tc, nil
	}
	// The common name counts when the certificate has no subject
	// alternative name, as OpenLDAP's client library allows.
	certcheck.Config(tc, host)
	return tc, nil
}

// ldapTLS is OpenLDAP's client TLS configuration: what poolerd honours of
// it.
type ldapTLS struct {
	caFile  string // TLS_CACERT
	reqCert string // TLS_REQCERT: never, allow, try, demand, hard
	from    string // where caFile was set, for errors
}

// ldapTLSSettings reads the TLS settings of OpenLDAP's client library as it
// does: the system's ldap.conf (/etc/ldap/ldap.conf, or
// /etc/openldap/ldap.conf), then the file $LDAPCONF names, then the
// environment (LDAPTLS_CACERT, LDAPTLS_REQCERT), each over the one before;
// nothing when LDAPNOINIT is set. ldaprc files in the user's home are not
// read: poolerd is a daemon.
func ldapTLSSettings() ldapTLS {
	var st ldapTLS
	if _, ok := os.LookupEnv("LDAPNOINIT"); ok {
		return st
	}
	files := []string{"/etc/ldap/ldap.conf"}
	if _, err := os.Stat(files[0]); err != nil {
		files[0] = "/etc/openldap/ldap.conf"
	}
	if f := os.Getenv("LDAPCONF"); f != "" {
		files = append(files, f)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			key, value, ok := strings.Cut(strings.TrimSpace(line), " ")
			if !ok {
				key, value, ok = strings.Cut(strings.TrimSpace(line), "\t")
			}
			if !ok || strings.HasPrefix(key, "#") {
				continue
			}
			value = strings.TrimSpace(value)
			switch strings.ToUpper(key) {
			case "TLS_CACERT":
				st.caFile, st.from = value, f
			case "TLS_REQCERT":
				st.reqCert = value
			}
		}
	}
	if v := os.Getenv("LDAPTLS_CACERT"); v != "" {
		st.caFile, st.from = v, "LDAPTLS_CACERT"
	}
	if v := os.Getenv("LDAPTLS_REQCERT"); v != "" {
		st.reqCert = v
	}
	return st
}
