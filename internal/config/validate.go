package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"github.com/redis/go-redis/v9"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/backend"
)

// WildcardDatabase is the database entry name that matches any database.
const WildcardDatabase = "*"

// UpstreamURL is the parsed form of the upstream key.
type UpstreamURL struct {
	Host     string
	Port     int
	Database string
	User     string
	Password string
	// HasPassword distinguishes an empty password from none.
	HasPassword bool
	// SSLMode is the URL's sslmode, if any: the server_tls_sslmode of the
	// upstream server (a database entry's own setting still wins).
	SSLMode string
	// Hosts are the servers of a libpq-style host list
	// (postgres://u@a:5432,b:5433/db); Host and Port are its first. Attrs
	// and Balance are the URL's target_session_attrs and
	// load_balance_hosts.
	Hosts          []HostPort
	Attrs, Balance string
}

// String gives the URL without its password, safe for logs.
func (u *UpstreamURL) String() string {
	hosts := net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
	if len(u.Hosts) > 1 {
		names := make([]string, len(u.Hosts))
		for i, h := range u.Hosts {
			names[i] = h.String()
		}
		hosts = strings.Join(names, ",")
	}
	return fmt.Sprintf("postgres://%s@%s/%s", u.User, hosts, u.Database)
}

// splitHostList takes a libpq-style host list (a,b:5433,[::1]) out of a
// URL's authority, for url.Parse, which reads one host only. It returns
// the URL with the list replaced by a placeholder, and the list ("" when
// the URL names one host).
func splitHostList(raw string) (string, string) {
	i := strings.Index(raw, "://")
	if i < 0 {
		return raw, ""
	}
	rest := raw[i+3:]
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	at := strings.LastIndex(authority, "@")
	hosts := authority[at+1:]
	if !strings.Contains(hosts, ",") {
		return raw, ""
	}
	return raw[:i+3] + authority[:at+1] + "multihost" + rest[end:], hosts
}

// ParseUpstream parses a postgres:// or postgresql:// URL. A Unix socket
// directory is given URL-escaped as the host (postgres://u@%2Fvar%2Frun%2Fpostgresql/db).
func ParseUpstream(raw string) (*UpstreamURL, error) {
	raw, hostList := splitHostList(raw)
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse echoes the input, which holds the password.
		return nil, errors.New("upstream is not a valid URL: write it as postgres://user:password@host:5432/dbname")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("upstream scheme %q is not supported: write it as postgres://user:password@host:5432/dbname", u.Scheme)
	}
	out := &UpstreamURL{Host: u.Hostname(), Port: 5432}
	if out.Host == "" {
		return nil, errors.New("upstream has no host: write it as postgres://user:password@host:5432/dbname")
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("upstream port %q is not a port number (1-65535)", p)
		}
		out.Port = n
	}
	if u.User == nil || u.User.Username() == "" {
		return nil, errors.New("upstream has no user: write it as postgres://user:password@host:5432/dbname")
	}
	out.User = u.User.Username()
	out.Password, out.HasPassword = u.User.Password()
	out.Database = strings.TrimPrefix(u.Path, "/")
	if out.Database == "" {
		out.Database = out.User
	}
	if hostList != "" {
		for _, s := range strings.Split(hostList, ",") {
			h, err := ParseHostPort(s, 5432)
			if err != nil {
				return nil, fmt.Errorf("upstream hosts: %w", err)
			}
			out.Hosts = append(out.Hosts, h)
		}
		out.Host, out.Port = out.Hosts[0].Host, out.Hosts[0].Port
	}
	for k, vals := range u.Query() {
		switch k {
		case "sslmode":
			switch vals[0] {
			case backend.TLSDisable, backend.TLSAllow, backend.TLSPrefer, backend.TLSRequire, backend.TLSVerifyCA, backend.TLSVerifyFull:
				out.SSLMode = vals[0]
			default:
				return nil, fmt.Errorf("upstream sslmode=%s is not disable, allow, prefer, require, verify-ca or verify-full", vals[0])
			}
		case "target_session_attrs":
			out.Attrs = vals[0]
			validateHosts(Database{TargetSessionAttrs: out.Attrs, Host: "x"}, "upstream", func(f string, a ...any) { err = fmt.Errorf(f, a...) })
		case "load_balance_hosts":
			out.Balance = vals[0]
			validateHosts(Database{LoadBalanceHosts: out.Balance, Host: "x"}, "upstream", func(f string, a ...any) { err = fmt.Errorf(f, a...) })
		default:
			return nil, fmt.Errorf("upstream parameter %q is not supported: only sslmode, target_session_attrs and load_balance_hosts are read from the URL; set other options as configuration keys", k)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

type userSecret struct {
	secret auth.Secret
	source string
}

// Validate checks every key and resolves derived state (the parsed upstream,
// the client secrets). Each error says what to change.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	c.validate(bad, bad)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// ValidateApartFromTLS is Validate with the TLS settings that do not load
// (a file missing, a key that does not match its certificate, a mode that
// needs a certificate not yet set) apart, in tlsErr: the console's SET
// applies the rest and keeps the running TLS settings, as PgBouncer does
// while certificate and key are set one at a time.
func (c *Config) ValidateApartFromTLS() (tlsErr, err error) {
	var errs, tlsErrs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	tlsBad := func(format string, args ...any) { tlsErrs = append(tlsErrs, fmt.Errorf(format, args...)) }
	c.validate(bad, tlsBad)
	return errors.Join(tlsErrs...), errors.Join(errs...)
}

// validate checks c, telling bad what is wrong, and tlsBad what is wrong
// with TLS files and the settings that need them.
func (c *Config) validate(bad, tlsBad func(string, ...any)) {
	c.comboWarnings = nil
	// entriesBad: an entry on its own failed (the combinations of
	// database and user entries are checked only when none did).
	entriesBad := false
	bad0 := bad
	bad = func(format string, args ...any) { entriesBad = true; bad0(format, args...) }

	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"tcp_keepidle", c.TCPKeepIdle}, {"tcp_keepintvl", c.TCPKeepInterval}, {"tcp_user_timeout", c.TCPUserTimeout}} {
		if d.v < 0 {
			bad("%s %s is negative: use 0 for the default", d.key, d.v)
		}
	}
	if c.TCPKeepCount < 0 {
		bad("tcp_keepcnt %d is negative: use 0 for the system's", c.TCPKeepCount)
	}
	if addrs := c.ListenAddrs(); len(addrs) == 0 {
		bad("listen is empty (POOLERD_LISTEN / --listen): give host:port, or several comma-separated, e.g. 127.0.0.1:6432,[::1]:6432")
	} else {
		seen := map[string]bool{}
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				bad("listen address %q is not host:port (POOLERD_LISTEN / --listen), e.g. 127.0.0.1:6432; several are comma-separated", a)
			} else if seen[a] {
				bad("listen names %q twice (POOLERD_LISTEN / --listen)", a)
			}
			seen[a] = true
		}
	}
	if m, err := strconv.ParseUint(strings.TrimPrefix(c.UnixSocketMode, "0o"), 8, 32); err != nil || m > 0o777 {
		bad("unix_socket_mode %q is not an octal file mode (POOLERD_UNIX_SOCKET_MODE), e.g. 0777 or 0770", c.UnixSocketMode)
	}
	if c.UnixSocketDir != "" && !filepath.IsAbs(c.UnixSocketDir) {
		bad("unix_socket_dir %q is not an absolute path (POOLERD_UNIX_SOCKET_DIR), e.g. /var/run/poolerd; empty: no Unix socket", c.UnixSocketDir)
	}
	if c.UnixSocketGroup != "" && c.UnixSocketDir == "" {
		bad("unix_socket_group %q is set without unix_socket_dir: set the directory for the Unix socket, or drop the group", c.UnixSocketGroup)
	}
	c.validatePeers(bad)
	if c.HTTPListen != "" {
		if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
			bad("http_listen %q is not host:port (POOLERD_HTTP_LISTEN / --http-listen), e.g. 127.0.0.1:9930; empty disables HTTP", c.HTTPListen)
		}
	}
	if c.HTTPProbeListen != "" {
		if _, _, err := net.SplitHostPort(c.HTTPProbeListen); err != nil {
			bad("http_probe_listen %q is not host:port (POOLERD_HTTP_PROBE_LISTEN / --http-probe-listen), e.g. 0.0.0.0:9931; empty serves the probes on http_listen only", c.HTTPProbeListen)
		} else if c.HTTPProbeListen == c.HTTPListen {
			bad("http_probe_listen %q is the same address as http_listen: give the probes their own port, or leave http_probe_listen empty", c.HTTPProbeListen)
		}
	}
	if c.HTTPWebConfigFile != "" {
		// The same check every Prometheus exporter makes at startup: the
		// YAML, the bcrypt hashes, and the certificate and key (loaded).
		if err := web.Validate(c.HTTPWebConfigFile); err != nil {
			bad("http_web_config_file %s (POOLERD_HTTP_WEB_CONFIG_FILE / --http-web-config-file) is not a valid Prometheus web configuration: %v (see configs/web-config.yml)",
				c.HTTPWebConfigFile, strings.TrimSpace(err.Error()))
		}
	}
	switch c.AuthType {
	case AuthSCRAM, AuthMD5, AuthPlain, AuthTrust, AuthAny, AuthHBA, AuthLDAP, AuthPAM:
	case AuthCert:
		if c.ClientTLSSSLMode == "disable" || c.ClientTLSCAFile == "" {
			bad("auth_type cert needs TLS from clients with their certificates checked: set client_tls_sslmode (verify-ca or verify-full) and client_tls_ca_file")
		}
	default:
		bad("auth_type %q is not one of scram-sha-256, md5, plain, cert, trust, any, ldap, pam, hba (POOLERD_AUTH_TYPE / --auth-type)", c.AuthType)
	}
	c.validateHBA(bad)
	c.validateExternalAuth(bad)
	if _, ok := SyslogFacility(c.SyslogFacility); !ok {
		bad("syslog_facility %q is not auth, authpriv, daemon, user or local0 to local7 (POOLERD_SYSLOG_FACILITY)", c.SyslogFacility)
	}
	if c.Syslog && c.SyslogIdent == "" {
		bad("syslog needs syslog_ident (POOLERD_SYSLOG_IDENT), the name its lines carry")
	}
	c.PoolSettings.validate("", bad)
	if c.ClientLoginTimeout < 0 {
		bad("client_login_timeout must not be negative (0 disables it)")
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown_timeout must not be negative")
	}
	for _, lim := range []struct {
		key string
		v   int
	}{{"max_client_conn", c.MaxClientConn}, {"max_db_connections", c.MaxDBConnections}, {"max_user_connections", c.MaxUserConnections},
		{"max_db_client_connections", c.MaxDBClientConnections}, {"max_user_client_connections", c.MaxUserClientConnections}} {
		if lim.v < 0 {
			bad("%s must not be negative (0 means no limit)", lim.key)
		}
	}
	c.validateRateLimits(bad)
	c.validateFleet(bad)
	if _, err := c.EventLoopCount(1); err != nil {
		bad("%v", err)
	}
	if c.PoolIdleTimeout < 0 {
		bad("pool_idle_timeout must not be negative (0 means pools are never removed)")
	}
	if c.StatsPeriod <= 0 {
		bad("stats_period must be positive, e.g. 60s")
	}
	for _, list := range []struct {
		key   string
		names []string
	}{{"admin_users", c.AdminUsers}, {"stats_users", c.StatsUsers}} {
		for i, n := range list.names {
			// POOLERD_ADMIN_USERS="ops, alice" must mean "alice".
			if list.names[i] = strings.TrimSpace(n); list.names[i] == "" {
				bad("%s has an empty name", list.key)
			}
		}
	}
	switch c.StartupMode {
	case StartupWait, StartupFailFast:
	default:
		bad("startup_mode %q is not wait or fail-fast (POOLERD_STARTUP_MODE / --startup-mode)", c.StartupMode)
	}
	if c.ReconnectBackoffBase <= 0 {
		bad("reconnect_backoff_base must be positive, e.g. 1s")
	}
	if c.ReconnectBackoffMax < c.ReconnectBackoffBase {
		bad("reconnect_backoff_max (%s) is below reconnect_backoff_base (%s): raise it to at least %s", c.ReconnectBackoffMax, c.ReconnectBackoffBase, c.ReconnectBackoffBase)
	}
	if c.RecycleRate < 1 {
		bad("recycle_rate %d must be at least 1 (connections recycled per second per pool)", c.RecycleRate)
	}
	switch c.LogFormat {
	case "console", "json", "pgbouncer":
	default:
		bad("log_format %q is not console, json or pgbouncer (POOLERD_LOG_FORMAT / --log-format)", c.LogFormat)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level %q is not debug, info, warn or error (POOLERD_LOG_LEVEL / --log-level)", c.LogLevel)
	}

	c.upstream = nil
	if c.Upstream != "" {
		u, err := ParseUpstream(c.Upstream)
		if err != nil {
			bad("%w", err)
		} else {
			c.upstream = u
		}
	}
	c.validateAuthQuery(bad)

	seenDB := map[string]bool{}
	if c.AuthFailureDelay < 0 || c.AuthFailureDelayMax < c.AuthFailureDelay {
		bad("auth_failure_delay %s and auth_failure_delay_max %s: the delay must not be negative (0 disables it) and its maximum not below it", c.AuthFailureDelay, c.AuthFailureDelayMax)
	}
	if c.MaxPacketSize < 1024 || c.MaxPacketSize > 1<<30-1 {
		bad("max_packet_size %d must be from 1024 to 1073741823 bytes (PostgreSQL's own limit)", c.MaxPacketSize)
	}
	if _, err := ClientTLS(c); err != nil {
		tlsBad("%v", err)
	} else if c.ClientTLSSSLMode == "disable" {
		// Checked even while unused, so that turning TLS on later does
		// not reveal a typo.
		if _, _, err := TLSProtocols(c.ClientTLSProtocols); err != nil {
			bad("client_tls_protocols: %v", err)
		}
		if _, err := TLSCiphers(c.ClientTLSCiphers); err != nil {
			bad("client_tls_ciphers: %v", err)
		}
		if _, err := TLSCurves(c.ClientTLSECDHCurve); err != nil {
			bad("client_tls_ecdhcurve: %v", err)
		}
	}
	if _, _, err := TLSProtocols(c.ServerTLSProtocols); err != nil {
		bad("server_tls_protocols: %v", err)
	}
	if _, err := TLSCiphers(c.ServerTLSCiphers); err != nil {
		bad("server_tls_ciphers: %v", err)
	}
	for _, mode := range c.ServerTLSModes() {
		if _, err := backend.NewTLS(mode, c.ServerTLSCAFile, c.ServerTLSCertFile, c.ServerTLSKeyFile); err != nil {
			tlsBad("%v", err)
		}
	}
	for i, d := range c.Databases {
		where := fmt.Sprintf("databases[%d]", i)
		if d.Name == "" {
			bad("%s has no name: every database entry needs name", where)
			continue
		}
		where = fmt.Sprintf("database %q", d.Name)
		if seenDB[d.Name] {
			bad("%s is listed twice: names are case-sensitive; remove one entry", where)
		}
		seenDB[d.Name] = true
		if d.Host == "" && len(d.Hosts) == 0 && c.upstream == nil {
			bad("%s has no host: set host (and port), or set upstream to give every database its host", where)
		}
		validateHosts(d, where, bad)
		for name := range d.ServerParameters {
			switch lower := strings.ToLower(name); {
			case lower == "user", lower == "database", lower == "replication", strings.HasPrefix(lower, "_pq_."):
				bad("%s server_parameters: %s is set by poolerd itself: remove it (user and dbname are keys of the entry)", where, name)
			case !serverParamName.MatchString(name):
				bad("%s server_parameters: %q is not a PostgreSQL parameter name", where, name)
			}
		}
		if d.Port != 0 && (d.Port < 1 || d.Port > 65535) {
			bad("%s port %d is not a port number (1-65535)", where, d.Port)
		}
		if d.Password != "" && d.User == "" {
			bad("%s has a password but no user: the password belongs to user; set user or remove password", where)
		}
		if d.Password != "" {
			if _, err := auth.ParseSecret(d.Password); err != nil {
				bad("%s password: %w", where, err)
			}
		}
		c.PoolSettings.Effective(d.Overrides).validate(where+" ", bad)
	}

	c.secrets = map[string]userSecret{}
	var md5Users []string // md5 secrets that auth_type scram-sha-256 cannot check
	addSecret := func(name, raw, source string) {
		if prev, ok := c.secrets[name]; ok {
			bad("user %q has a password in %s and in %s: keep one", name, prev.source, source)
			return
		}
		s, err := auth.ParseSecret(raw)
		if err != nil {
			bad("user %q in %s: %w", name, source, err)
			return
		}
		md5Users = checkSecretKind(c.AuthType, name, s, md5Users)
		c.secrets[name] = userSecret{secret: s, source: source}
	}
	seenUser := map[string]bool{}
	for i, u := range c.Users {
		if u.Name == "" {
			bad("users[%d] has no name: every user entry needs name", i)
			continue
		}
		if seenUser[u.Name] {
			bad("user %q is listed twice: names are case-sensitive; remove one entry", u.Name)
		}
		seenUser[u.Name] = true
		if u.Password != "" {
			addSecret(u.Name, u.Password, "users")
		}
		c.PoolSettings.Effective(u.Overrides).validate(fmt.Sprintf("user %q ", u.Name), bad)
	}
	if c.AuthFile != "" {
		f, err := os.Open(c.AuthFile)
		if err != nil {
			bad("auth_file: %w", err)
		} else {
			entries, err := auth.ParseUserlist(f)
			f.Close()
			if err != nil {
				bad("auth_file %s: %w", c.AuthFile, err)
			}
			for _, e := range entries {
				if prev, ok := c.secrets[e.Name]; ok {
					bad("user %q has a password in %s and in auth_file line %d: keep one", e.Name, prev.source, e.Line)
					continue
				}
				md5Users = checkSecretKind(c.AuthType, e.Name, e.Secret, md5Users)
				c.secrets[e.Name] = userSecret{secret: e.Secret, source: "auth_file"}
			}
		}
	}
	if len(md5Users) > 0 {
		// PgBouncer's md5-to-SCRAM migration: the switch is accepted and
		// only those users fail to log in until their secret changes.
		who, verb := fmt.Sprintf("user %q has an md5 secret", md5Users[0]), "it fails"
		if len(md5Users) > 1 {
			q := make([]string, len(md5Users))
			for k, u := range md5Users {
				q[k] = strconv.Quote(u)
			}
			who, verb = "users "+strings.Join(q, ", ")+" have md5 secrets", "they fail"
		}
		c.comboWarnings = append(c.comboWarnings, fmt.Sprintf("auth_type scram-sha-256: %s, which SCRAM cannot check: %s to log in (password authentication failed) until given the plain password or a SCRAM secret, or use auth_type md5", who, verb))
	}
	if u := c.upstream; u != nil && u.HasPassword && u.Password != "" {
		addSecret(u.User, u.Password, "upstream")
	}

	// Each database entry combined with each user entry must make sense
	// too (a database's min_size above a user's max_size, say); checked
	// once the entries are valid on their own.
	for _, d := range c.Databases {
		if entriesBad {
			break
		}
		for _, u := range c.Users {
			if d.Name == "" || u.Name == "" {
				continue
			}
			var combo []error
			eff := c.PoolSettings.Effective(d.Overrides, u.Overrides)
			if eff.MaxSize >= 1 && eff.MinSize > eff.MaxSize {
				// As PgBouncer: the pair's pool is simply capped (Route
				// clamps min_size); often a pair no client uses.
				c.comboWarnings = append(c.comboWarnings, fmt.Sprintf("database %q with user %q: min_size (%d) exceeds max_size (%d); that pool keeps at most %d",
					d.Name, u.Name, eff.MinSize, eff.MaxSize, eff.MaxSize))
				eff.MinSize = eff.MaxSize
			}
			eff.validate("", func(f string, a ...any) { combo = append(combo, fmt.Errorf(f, a...)) })
			for _, e := range combo {
				bad("database %q with user %q: %w", d.Name, u.Name, e)
			}
		}
	}
}

// ServesNoDatabase reports whether no database entry and no upstream are
// configured: every client but the admin console's is refused.
func (c *Config) ServesNoDatabase() bool {
	return len(c.Databases) == 0 && c.upstream == nil
}

// Warnings names what a valid configuration leaves unusable, to be logged
// at start: PgBouncer starts with its packaged sample, which lists no
// database and has an empty userlist, and so does poolerd; it says so.
func (c *Config) Warnings() []string {
	w := slices.Clone(c.comboWarnings)
	if c.ServesNoDatabase() {
		w = append(w, "no databases: every client but the admin console's is refused (3D000 no such database); set upstream (e.g. --upstream postgres://user:password@127.0.0.1:5432/db) or list entries under databases ([databases] in a pgbouncer.ini)")
	}
	external := c.AuthType == AuthLDAP || c.AuthType == AuthPAM // the password is checked elsewhere
	if c.AuthType != AuthTrust && c.AuthType != AuthAny && c.AuthType != AuthHBA && !external && !c.AnyAuthUser() && len(c.secrets) == 0 {
		w = append(w, fmt.Sprintf("auth_type %s needs client passwords, and none are configured: no client can log in, the admin console's included; put the password in upstream, in users[].password or in auth_file, set auth_user to look them up in PostgreSQL (or set auth_type trust on a trusted network)", c.AuthType))
	}
	return w
}

// checkSecretKind adds user to md5Users if its secret is one the client
// authentication method cannot check. As in PostgreSQL, md5
// authentication of a user whose secret is a SCRAM verifier runs SCRAM
// instead; SCRAM cannot use an md5 hash, and that user's logins fail.
func checkSecretKind(authType, user string, s auth.Secret, md5Users []string) []string {
	// With auth_type hba the rule decides per client; an md5 rule can
	// check an md5 secret, a scram-sha-256 rule refuses it at login.
	if authType == AuthSCRAM && s.Kind() == auth.SecretMD5 {
		return append(md5Users, user)
	}
	return md5Users
}

// validateRateLimits checks the rate-limit rules and backend.
func (c *Config) validateRateLimits(bad func(string, ...any)) {
	switch c.RateLimitBackend {
	case "memory":
	case "redis":
		if !strings.HasPrefix(c.RedisURL, "redis://") && !strings.HasPrefix(c.RedisURL, "rediss://") {
			bad("rate_limit_backend redis needs redis_url, e.g. redis://127.0.0.1:6379/0")
		} else if _, err := redis.ParseURL(c.RedisURL); err != nil {
			bad("redis_url is not a valid Redis URL: write it as redis://[:password@]host:port/db")
		}
	default:
		bad("rate_limit_backend %q is not memory or redis", c.RateLimitBackend)
	}
	c.validateHandoff(bad)
	switch c.OnRedisError {
	case "allow", "deny":
	default:
		bad("on_redis_error %q is not allow or deny", c.OnRedisError)
	}
	switch c.OnServerUnavailable {
	case "fail", "wait":
	default:
		bad("on_server_unavailable %q is not fail or wait", c.OnServerUnavailable)
	}
	if c.RedisTimeout <= 0 {
		bad("redis_timeout must be positive, e.g. 50ms: a slow Redis must not stall clients")
	}
	seen := map[string]bool{}
	for i, r := range c.RateLimits {
		where := fmt.Sprintf("rate_limits[%d]", i)
		if r.Name == "" {
			bad("%s has no name: every rule needs one (it appears in errors and metrics)", where)
		} else {
			where = fmt.Sprintf("rate limit %q", r.Name)
			if seen[r.Name] {
				bad("%s is listed twice: names must be unique", where)
			}
			seen[r.Name] = true
		}
		buckets := r.Buckets()
		for _, b := range buckets {
			if b.Limit <= 0 || b.Per <= 0 {
				bad("%s %s needs a positive limit and per, e.g. {limit: 50, per: 1s}", where, b.Name)
			}
			if b.Name == "server_time" && b.Limit > maxServerTimeMillis {
				bad("%s server_time limit %d is above %d (milliseconds)", where, b.Limit, int64(maxServerTimeMillis))
			}
		}
		if len(buckets) == 0 {
			bad("%s has no bucket: set queries, transactions, connections, server_time, rows or bytes", where)
		}
		switch r.Mode {
		case "reject":
		case "wait":
			if r.MaxWait <= 0 {
				bad("%s is mode wait and needs max_wait, e.g. 5s (how long a request may be delayed)", where)
			}
		default:
			bad("%s mode %q is not reject or wait", where, r.Mode)
		}
		for _, k := range r.KeyBy {
			switch k {
			case "user", "database", "client", "application_name":
			default:
				bad("%s key_by %q is not user, database, client or application_name", where, k)
			}
		}
		if m := r.Match.Client; m != "" {
			if _, _, err := net.ParseCIDR(m); err != nil && net.ParseIP(m) == nil {
				bad("%s match.client %q is not an address or CIDR like 10.0.0.0/8", where, m)
			}
		}
	}
	for _, d := range c.Databases {
		for _, v := range []*int{d.MaxDBConnections, d.MaxDBClientConnections} {
			if v != nil && *v < 0 {
				bad("database %q: connection limits must not be negative (0 means no limit)", d.Name)
			}
		}
	}
	for _, u := range c.Users {
		for _, v := range []*int{u.MaxUserConnections, u.MaxUserClientConnections} {
			if v != nil && *v < 0 {
				bad("user %q: connection limits must not be negative (0 means no limit)", u.Name)
			}
		}
	}
}

// DBLimits returns the server and client connection limits of a database
// (0 means none).
func (c *Config) DBLimits(database string) (servers, clients int) {
	servers, clients = c.MaxDBConnections, c.MaxDBClientConnections
	if d, ok := c.database(database); ok {
		if d.MaxDBConnections != nil {
			servers = *d.MaxDBConnections
		}
		if d.MaxDBClientConnections != nil {
			clients = *d.MaxDBClientConnections
		}
	}
	return servers, clients
}

// UserLimits returns the server and client connection limits of a user.
func (c *Config) UserLimits(user string) (servers, clients int) {
	servers, clients = c.MaxUserConnections, c.MaxUserClientConnections
	for _, u := range c.Users {
		if u.Name == user {
			if u.MaxUserConnections != nil {
				servers = *u.MaxUserConnections
			}
			if u.MaxUserClientConnections != nil {
				clients = *u.MaxUserClientConnections
			}
		}
	}
	return servers, clients
}

func (p PoolSettings) validate(where string, bad func(string, ...any)) {
	switch p.PoolMode {
	case PoolSession, PoolTransaction, PoolStatement:
	default:
		bad("%spool_mode %q is not session, transaction or statement", where, p.PoolMode)
	}
	switch p.SessionState {
	case SessionStatePin, SessionStateRefuse:
	default:
		bad("%ssession_state %q is not pin or refuse", where, p.SessionState)
	}
	if _, err := p.PinnedCap(); err != nil {
		bad("%s%v", where, err)
	}
	if p.MaxPreparedStatements < 0 {
		bad("%smax_prepared_statements %d must not be negative (0 passes statement names through)", where, p.MaxPreparedStatements)
	}
	if p.MaxSize < 1 {
		bad("%smax_size %d must be at least 1 (POOLERD_MAX_SIZE / --pool-size)", where, p.MaxSize)
	}
	if p.MinSize < 0 {
		bad("%smin_size %d must not be negative", where, p.MinSize)
	}
	if p.ReservePoolSize < 0 {
		bad("%sreserve_pool_size %d must not be negative (0: no reserve)", where, p.ReservePoolSize)
	}
	if p.MaxSize >= 1 && p.MinSize > p.MaxSize {
		bad("%smin_size (%d) exceeds max_size (%d): reduce min_size to %d or raise max_size to %d", where, p.MinSize, p.MaxSize, p.MaxSize, p.MinSize)
	}
	rv := reflect.ValueOf(p)
	for i := range rv.NumField() {
		if d, ok := rv.Field(i).Interface().(time.Duration); ok && d < 0 {
			bad("%s%s must not be negative (0 disables it)", where, rv.Type().Field(i).Tag.Get("mapstructure"))
		}
	}
	if p.ServerConnectTimeout == 0 {
		bad("%sserver_connect_timeout must be positive (e.g. 15s): a connect with no limit can hang a pool forever", where)
	}
	if p.ValidationInterval > 0 && p.ValidationTimeout == 0 {
		bad("%svalidation_timeout must be positive when validation_interval is set (e.g. 5s)", where)
	}
	if p.MaxQueries < 0 {
		bad("%smax_queries must not be negative (0 disables it)", where)
	}
	if p.MaxUses < 0 {
		bad("%smax_uses must not be negative (0 disables it)", where)
	}
}

// UpstreamInfo returns the parsed upstream URL, or nil without one.
func (c *Config) UpstreamInfo() *UpstreamURL { return c.upstream }

// TrustListsUsers reports whether trust (auth_type trust, or an access
// rule's) admits only the users the configuration lists, as PgBouncer's
// trust does ("the user name must still exist in auth_file"): a user with
// an entry in auth_file (an empty password will do), users[].password or
// upstream, or one auth_query finds. That is so once auth_file or
// auth_user is set; without either, trust admits every user name, and
// auth_type any always does.
func (c *Config) TrustListsUsers() bool {
	return c.AuthFile != "" || c.AnyAuthUser()
}

// ClientSecret returns the secret a client logging in as user must prove.
func (c *Config) ClientSecret(user string) (auth.Secret, bool) {
	s, ok := c.secrets[user]
	return s.secret, ok
}

// Route says how clients of one (database, user) pair reach PostgreSQL.
type Route struct {
	// Database is the name the client asked for.
	Database string
	// Host, Port and DBName locate the server database.
	Host   string
	Port   int
	DBName string
	// ServerUser is the role poolerd logs in as.
	ServerUser string
	// ServerSecret is ServerUser's secret (a forced user's: the entry's
	// password, or else the user's own from auth_file, users or
	// upstream); the zero Secret means none is known (trust, or SCRAM
	// pass-through with the client's proof).
	ServerSecret auth.Secret
	// ForcedUser is true when the database entry names the server user, so
	// all clients share one pool.
	ForcedUser bool
	// Settings are the effective pool settings.
	Settings PoolSettings
	// ServerTLSMode is the server_tls_sslmode for this database.
	ServerTLSMode string
	// Hosts are the servers (at least one: Host and Port); Attrs and
	// Balance their target_session_attrs and load_balance_hosts.
	Hosts   []HostPort
	Attrs   string
	Balance string
	// MaxLag is max_replica_lag (0: not checked); PerHost is
	// max_size_per_host (0: none).
	MaxLag  time.Duration
	PerHost int
	// HostSettings are the servers' own settings (host_settings), by
	// server; nil without any.
	HostSettings map[HostPort]HostSetting
	// ServerParams are the entry's server_parameters (nil without any).
	ServerParams map[string]string
}

// HostCap is server h's connection cap: its own max_size_per_host, or the
// entry's (0: none).
func (r *Route) HostCap(h HostPort) int {
	if hs, ok := r.HostSettings[h]; ok && hs.MaxSizePerHost > 0 {
		return hs.MaxSizePerHost
	}
	return r.PerHost
}

// HostCapped reports whether any server of the route has a cap.
func (r *Route) HostCapped() bool {
	if r.PerHost > 0 {
		return true
	}
	for _, hs := range r.HostSettings {
		if hs.MaxSizePerHost > 0 {
			return true
		}
	}
	return false
}

// HostIdleTimeout is server h's own idle_timeout (0: the pool's).
func (r *Route) HostIdleTimeout(h HostPort) time.Duration {
	return r.HostSettings[h].IdleTimeout
}

// MultiHost reports whether the route chooses among servers or by role.
func (r *Route) MultiHost() bool { return len(r.Hosts) > 1 || r.Attrs != TargetAny }

// serverParamName is the form of a PostgreSQL parameter name (custom ones
// have a dot).
var serverParamName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$.]*$`)

// ErrUnknownDatabase is returned by Route for a database with no entry.
var ErrUnknownDatabase = errors.New("unknown database")

// Route resolves the database entry for a client's database and user.
func (c *Config) Route(database, user string) (Route, error) {
	d, ok := c.database(database)
	if !ok {
		return Route{}, fmt.Errorf("%w %q", ErrUnknownDatabase, database)
	}
	r := Route{Database: database, Host: d.Host, Port: d.Port, DBName: d.DBName, ServerTLSMode: c.ServerTLSSSLMode}
	if d.ServerTLSSSLMode != "" {
		r.ServerTLSMode = d.ServerTLSSSLMode
	}
	if r.Host == "" && c.upstream != nil {
		r.Host = c.upstream.Host
		if c.upstream.SSLMode != "" && d.ServerTLSSSLMode == "" {
			r.ServerTLSMode = c.upstream.SSLMode
		}
		if r.Port == 0 {
			r.Port = c.upstream.Port
		}
	}
	if r.Port == 0 {
		r.Port = 5432
	}
	if r.DBName == "" {
		r.DBName = database
	}
	r.Hosts, _ = hostList(Database{Host: r.Host, Port: r.Port, Hosts: d.Hosts}, r.Host, r.Port) // validated
	r.Attrs, r.Balance, r.MaxLag, r.PerHost = d.TargetSessionAttrs, d.LoadBalanceHosts, d.MaxReplicaLag, d.MaxSizePerHost
	r.HostSettings = hostSettingsOf(d, r.Port)
	r.ServerParams = d.ServerParameters
	if u := c.upstream; u != nil && d.Host == "" && len(d.Hosts) == 0 && len(u.Hosts) > 0 {
		r.Hosts = u.Hosts // the upstream URL's host list
	}
	if u := c.upstream; u != nil && d.Host == "" && len(d.Hosts) == 0 {
		r.Attrs, r.Balance = cmp.Or(r.Attrs, u.Attrs), cmp.Or(r.Balance, u.Balance)
	}
	if len(r.Hosts) > 0 {
		r.Host, r.Port = r.Hosts[0].Host, r.Hosts[0].Port
	}
	if r.Attrs == "" {
		r.Attrs = TargetAny
	}
	if r.Balance == "" {
		r.Balance = BalanceRoundRobin
	}
	overrides := []Overrides{d.Overrides}
	if d.User != "" {
		r.ServerUser = d.User
		r.ForcedUser = true
		if d.Password != "" {
			r.ServerSecret, _ = auth.ParseSecret(d.Password) // validated
		} else {
			// As PgBouncer: a forced user without a password logs in
			// with its own (auth_file's, or users' or upstream's).
			r.ServerSecret = c.secrets[d.User].secret
		}
	} else {
		r.ServerUser = user
		r.ServerSecret = c.secrets[user].secret
	}
	for _, u := range c.Users {
		if u.Name == user {
			overrides = append(overrides, u.Overrides)
		}
	}
	r.Settings = c.PoolSettings.Effective(overrides...)
	// A database's min_size above a user's max_size (a warning, as
	// PgBouncer accepts it): the pool is capped.
	r.Settings.MinSize = min(r.Settings.MinSize, r.Settings.MaxSize)
	return r, nil
}

func (c *Config) database(name string) (Database, bool) {
	var wildcard *Database
	for i := range c.Databases {
		switch c.Databases[i].Name {
		case name:
			return c.Databases[i], true
		case WildcardDatabase:
			wildcard = &c.Databases[i]
		}
	}
	if wildcard != nil {
		return *wildcard, true
	}
	if c.upstream != nil {
		return Database{Name: WildcardDatabase}, true
	}
	return Database{}, false
}

// ServerTLSModes lists the server_tls_sslmode values in use: the global
// one and those of the database entries.
func (c *Config) ServerTLSModes() []string {
	modes := []string{c.ServerTLSSSLMode}
	if c.upstream != nil && c.upstream.SSLMode != "" && !slices.Contains(modes, c.upstream.SSLMode) {
		modes = append(modes, c.upstream.SSLMode)
	}
	for _, d := range c.Databases {
		if d.ServerTLSSSLMode != "" && !slices.Contains(modes, d.ServerTLSSSLMode) {
			modes = append(modes, d.ServerTLSSSLMode)
		}
	}
	return modes
}

// validateHandoff checks verify_handoff and its sample rate.
func (c *Config) validateHandoff(bad func(string, ...any)) {
	switch c.VerifyHandoff {
	case VerifyHandoffOff, VerifyHandoffSample, VerifyHandoffAlways:
	default:
		bad("verify_handoff %q is not off, sample or always", c.VerifyHandoff)
	}
	if !(c.VerifyHandoffSampleRate >= 0 && c.VerifyHandoffSampleRate <= 1) {
		bad("verify_handoff_sample_rate %v is not a share from 0 to 1, e.g. 0.01 to check every 100th hand-off", c.VerifyHandoffSampleRate)
	}
}

// maxServerTimeMillis bounds a server_time bucket's limit, which the proxy
// counts in microseconds: about 292 years, far above any useful budget.
const maxServerTimeMillis = math.MaxInt64 / 1000

// validatePeers checks peer_id and the peers list.
func (c *Config) validatePeers(bad func(string, ...any)) {
	if c.PeerID < 0 || c.PeerID > MaxPeerID {
		bad("peer_id %d is out of range (POOLERD_PEER_ID): give 1 to %d, unique in the peering group, or 0 for no peering", c.PeerID, MaxPeerID)
	}
	if len(c.Peers) > 0 && c.PeerID == 0 {
		bad("peers is set but peer_id is 0: give this poolerd its own peer_id (1 to %d), or drop peers", MaxPeerID)
	}
	seen := map[int]bool{}
	for i := range c.Peers {
		p := &c.Peers[i]
		where := fmt.Sprintf("peers[%d]", i)
		switch {
		case p.ID < 1 || p.ID > MaxPeerID:
			bad("%s: id %d is out of range: give the peer's peer_id, 1 to %d", where, p.ID, MaxPeerID)
		case seen[p.ID]:
			bad("%s: id %d is listed twice: each peer once", where, p.ID)
		}
		seen[p.ID] = true
		if p.Host == "" {
			bad("%s (id %d): host is empty: give the peer's address, or the directory of its Unix socket", where, p.ID)
		}
		if p.Port == 0 {
			p.Port = 6432
		}
		if p.Port < 0 || p.Port > 65535 {
			bad("%s (id %d): port %d is not a TCP port", where, p.ID, p.Port)
		}
		if p.PoolSize < 0 {
			bad("%s (id %d): pool_size %d is negative: use 0 for max_size", where, p.ID, p.PoolSize)
		}
	}
}
