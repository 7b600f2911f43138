package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// EnvPrefix prefixes every environment variable poolerd reads.
const EnvPrefix = "POOLERD_"

// Key describes one top-level configuration key.
type Key struct {
	// Name is the key in the YAML file.
	Name string
	// Flag is the command-line flag that sets it, if any.
	Flag string
	// Help is one line for --help and the docs.
	Help string
}

// Env is the environment variable bound to the key.
func (k Key) Env() string { return EnvPrefix + strings.ToUpper(k.Name) }

// Keys lists every top-level scalar key, in documentation order. Each is
// bound explicitly to its environment variable (viper's AutomaticEnv is not
// used, so a stray POOLERD_ variable never changes anything unannounced).
func Keys() []Key {
	return []Key{
		{Name: "listen", Flag: "listen", Help: "address clients connect to (host:port), or several, comma-separated; a host of * (or none) is every address"},
		{Name: "unix_socket_dir", Help: "directory of a Unix-socket listener, .s.PGSQL.<port> (the first listen address's port); empty: none"},
		{Name: "unix_socket_mode", Help: "file mode of the Unix socket, octal"},
		{Name: "unix_socket_group", Help: "group of the Unix socket; empty: the process's"},
		{Name: "so_reuseport", Help: "open the listener with SO_REUSEPORT, so that a new poolerd can bind the same address while this one drains"},
		{Name: "peer_id", Help: "this poolerd's id in a peering group (PgBouncer's peer_id), whose members forward cancel requests to the one that issued the key (peers); 0: no peering"},
		{Name: "tcp_keepalive", Help: "TCP keepalive on client and server sockets"},
		{Name: "tcp_keepidle", Help: "idle time before the first keepalive probe (0 = poolerd's: 15s to clients, 30s to servers)"},
		{Name: "tcp_keepintvl", Help: "time between keepalive probes (0 = as tcp_keepidle's default)"},
		{Name: "tcp_keepcnt", Help: "unanswered keepalive probes before the connection is dropped (0 = the system's)"},
		{Name: "tcp_user_timeout", Help: "drop a connection whose sent data stays unacknowledged this long (Linux TCP_USER_TIMEOUT; 0 = off)"},
		{Name: "event_loops", Help: "event loops reading client and server connections: off (a goroutine per connection), auto (one per 2 CPUs), or a number"},
		{Name: "takeover_socket", Help: "Unix socket on which this poolerd hands its listening socket to one started with --takeover; empty turns it off"},
		{Name: "http_listen", Flag: "http-listen", Help: "address of the HTTP health and metrics server; empty disables it"},
		{Name: "http_web_config_file", Flag: "http-web-config-file", Help: "Prometheus web configuration file (TLS, basic auth) for http_listen; empty serves plain HTTP without auth"},
		{Name: "http_probe_listen", Flag: "http-probe-listen", Help: "extra address serving only /healthz and /readyz, without auth or TLS; empty serves them on http_listen only"},
		{Name: "upstream", Flag: "upstream", Help: "sidecar shorthand: postgres://user:password@host:port/db of the upstream server"},
		{Name: "auth_type", Flag: "auth-type", Help: "client authentication: scram-sha-256, md5, plain (a clear-text password), cert (a TLS client certificate naming the user), trust, any, ldap, pam or hba (access rules decide)"},
		{Name: "auth_file", Flag: "auth-file", Help: "PgBouncer-format userlist file with client secrets"},
		{Name: "auth_hba_file", Help: "access rules in pg_hba.conf format, for auth_type hba"},
		{Name: "auth_ldap_options", Help: "LDAP options of auth_type ldap, as on a pg_hba.conf ldap line (ldapurl=\"ldap://host/basedn?uid?sub\", or ldapserver, ldapprefix/ldapsuffix or ldapbasedn, ...)"},
		{Name: "auth_pam_service", Help: "PAM service of auth_type pam"},
		{Name: "auth_ident_file", Help: "user-name maps in pg_ident.conf format, for access rules with map= (peer, cert)"},
		{Name: "auth_user", Help: "role that runs auth_query for users without a configured secret; empty disables auth_query"},
		{Name: "auth_query", Help: "query returning (name, secret) of the user $1, run as auth_user"},
		{Name: "auth_dbname", Help: "database entry whose server and database auth_query runs in; empty: the client's database"},
		{Name: "auth_cache_ttl", Help: "how long a secret from auth_query is reused (0 = query every login)"},
		{Name: "auth_failure_delay", Help: "delay before answering a failed login; doubles per failure in a row from the address (0 = off)"},
		{Name: "auth_failure_delay_max", Help: "longest auth_failure_delay"},
		{Name: "max_packet_size", Help: "longest message a logged-in client may send, in bytes"},
		{Name: "client_tls_sslmode", Help: "TLS from clients: disable, allow, prefer, require, verify-ca or verify-full"},
		{Name: "client_tls_cert_file", Help: "certificate poolerd presents to clients"},
		{Name: "client_tls_key_file", Help: "private key of client_tls_cert_file"},
		{Name: "client_tls_ca_file", Help: "CA of client certificates (verify-ca, verify-full)"},
		{Name: "client_tls_protocols", Help: "TLS versions for clients: secure (1.2, 1.3), all, legacy, or tlsv1.0 ... tlsv1.3"},
		{Name: "client_tls_ciphers", Help: "TLS 1.2 cipher suites for clients: default, secure, fast, normal, all, or OpenSSL names"},
		{Name: "client_tls_ecdhcurve", Help: "key-exchange curves offered to clients: auto, or a list like x25519,prime256v1"},
		{Name: "server_tls_protocols", Help: "TLS versions towards PostgreSQL: secure (1.2 and 1.3), all, or a list like tlsv1.2,tlsv1.3"},
		{Name: "server_tls_ciphers", Help: "TLS 1.2 cipher suites towards PostgreSQL: default, secure (fast), all, or OpenSSL names"},
		{Name: "server_tls_sslmode", Help: "TLS to PostgreSQL: disable, allow, prefer, require, verify-ca or verify-full"},
		{Name: "server_tls_ca_file", Help: "CA that signed PostgreSQL's certificate (verify-ca, verify-full)"},
		{Name: "server_tls_cert_file", Help: "client certificate poolerd presents to PostgreSQL (cert authentication)"},
		{Name: "server_tls_key_file", Help: "private key of server_tls_cert_file"},
		{Name: "pool_mode", Flag: "pool-mode", Help: "session, transaction or statement"},
		{Name: "max_prepared_statements", Help: "protocol-level prepared statements kept per server connection in transaction/statement mode (0 = pass names through)"},
		{Name: "session_state", Help: "pin or refuse a transaction-mode client that creates session state (temp table, LISTEN, advisory lock, ...)"},
		{Name: "max_pinned_clients", Help: "most clients of one pool pinned at once: a number, or a share of max_size like 50%"},
		{Name: "pinned_idle_timeout", Help: "end a pinned client idle outside a transaction this long (0 = off)"},
		{Name: "max_size", Flag: "pool-size", Help: "most server connections per (database, user) pool"},
		{Name: "min_size", Flag: "min-pool-size", Help: "server connections a pool keeps open"},
		{Name: "reserve_pool_size", Help: "connections a pool may open beyond max_size for requests that waited reserve_pool_timeout (0 = none)"},
		{Name: "reserve_pool_timeout", Help: "how long a request waits before a reserve connection is opened for it (0 = never)"},
		{Name: "checkout_timeout", Flag: "checkout-timeout", Help: "how long a client waits for a server connection (0 = no limit)"},
		{Name: "server_reset_query", Help: "query run before a session-mode server connection is reused; empty disables"},
		{Name: "server_connect_timeout", Help: "limit on dialing and logging in to PostgreSQL"},
		{Name: "validation_interval", Help: "check a connection idle longer than this before use (0 = never)"},
		{Name: "validation_query", Help: "the check; empty sends an empty query"},
		{Name: "validation_timeout", Help: "limit on one validation"},
		{Name: "max_lifetime", Help: "recycle idle connections older than this, ±10 % (0 = never)"},
		{Name: "max_queries", Help: "recycle idle connections that ran this many queries (0 = never)"},
		{Name: "max_uses", Help: "close a connection when it comes back from this many checkouts (0 = never; 1: single use)"},
		{Name: "idle_timeout", Help: "close connections idle this long, above min_size (0 = never)"},
		{Name: "recycle_rate", Help: "most connections one pool recycles per second"},
		{Name: "startup_mode", Flag: "startup-mode", Help: "wait (retry an unreachable upstream, stay unready) or fail-fast (exit after 3 attempts)"},
		{Name: "warm_pools", Help: "open a connection of each configured pool at start (readiness waits for them); false: when the first client comes, or min_size at start"},
		{Name: "reconnect_backoff_base", Help: "first pause after a failed connect; doubles per failure"},
		{Name: "reconnect_backoff_max", Help: "longest pause between connect attempts"},
		{Name: "leak_detection_threshold", Help: "warn about a client keeping a server busy this long (0 = off)"},
		{Name: "wait_warning", Help: "warn (once per pool per 10s) when a request has waited this long for a server connection (0 = off)"},
		{Name: "query_timeout", Help: "cancel a query running longer than this (0 = off)"},
		{Name: "transaction_timeout", Help: "end a client whose transaction lasts longer than this (0 = off)"},
		{Name: "lease_timeout", Help: "one deadline for a whole lease: the checkout wait and the work after it (0 = off)"},
		{Name: "idle_transaction_timeout", Help: "end a client idle in a transaction this long (0 = off)"},
		{Name: "client_idle_timeout", Help: "end a client idle outside a transaction this long (0 = off)"},
		{Name: "server_response_timeout", Help: "declare a server hung after this long without a byte while requests are pending (0 = off)"},
		{Name: "client_login_timeout", Help: "limit on a client's startup and authentication (0 = no limit)"},
		{Name: "shutdown_timeout", Help: "how long SIGINT lets transactions finish before closing everything"},
		{Name: "max_client_conn", Help: "most client connections poolerd accepts (0 = no limit)"},
		{Name: "max_db_connections", Help: "most server connections per database, over all its pools (0 = no limit)"},
		{Name: "max_user_connections", Help: "most server connections per user, over all its pools (0 = no limit)"},
		{Name: "max_db_client_connections", Help: "most client connections per database (0 = no limit)"},
		{Name: "max_user_client_connections", Help: "most client connections per user (0 = no limit)"},
		{Name: "rate_limit_backend", Help: "where rate-limit budgets live: memory (this process) or redis (shared)"},
		{Name: "redis_url", Help: "redis://[:password@]host:port/db for rate_limit_backend redis"},
		{Name: "redis_timeout", Help: "limit on one Redis rate-limit check"},
		{Name: "on_redis_error", Help: "allow or deny when Redis fails or times out"},
		{Name: "fleet_max_server_connections", Help: "most server connections of every poolerd sharing redis_url together (0 = no limit)"},
		{Name: "fleet_lease_ttl", Help: "lifetime of an unrenewed fleet lease: a dead poolerd's leases return within it"},
		{Name: "verify_handoff", Help: "check a transaction-mode server connection with one fingerprint query before another client gets it: off, sample or always"},
		{Name: "verify_handoff_sample_rate", Help: "share of hand-offs verify_handoff sample checks, e.g. 0.001 (every 1,000th per pool)"},
		{Name: "admin_users", Help: "users who may run every admin console command (comma-separated in the environment)"},
		{Name: "stats_users", Help: "users who may run the admin console's SHOW commands (comma-separated in the environment)"},
		{Name: "on_server_unavailable", Help: "while connects fail and a pool has nothing open: fail requests at once (08006) or wait within checkout_timeout, as PgBouncer"},
		{Name: "pool_idle_timeout", Help: "remove a pool that has had no client and no server connection this long (0 = never)"},
		{Name: "stats_period", Help: "period of SHOW STATS averages and of the stats log line"},
		{Name: "log_stats", Help: "log a stats line every stats_period"},
		{Name: "http_pprof", Help: "serve /debug/pprof/ on the HTTP server"},
		{Name: "log_format", Flag: "log-format", Help: "console, json or pgbouncer (PgBouncer's log lines)"},
		{Name: "log_file", Help: "file that gets a copy of the log (appended; opened again on SIGHUP); empty: stderr only"},
		{Name: "disable_pqexec", Help: "refuse the simple query protocol: a client's Query message ends its session (only extended-protocol statements run)"},
		{Name: "application_name_add_host", Help: "append ' - host:port' of the client to the application_name it logs in with"},
		{Name: "server_round_robin", Help: "hand out the idle server connection unused longest instead of the one used last, as PgBouncer's key: uniform load over servers behind a round-robin address"},
		{Name: "ignore_startup_parameters", Help: "startup parameters dropped instead of applied, as PgBouncer's key; options: every setting in options (comma-separated in the environment)"},
		{Name: "query_wait_notify", Help: "send a client whose request has waited this long for a server connection one NOTICE saying so (0: never)"},
		{Name: "login_notify_message", Help: "a NOTICE sent to every client when it has logged in to a database (before its first ReadyForQuery); empty: none"},
		{Name: "server_fast_close", Help: "after RECONNECT or a reload that changes a database's server, end each client holding one of its server connections (session mode, pinned) at its next idle point outside a transaction, instead of at the end of its session"},
		{Name: "pidfile", Help: "file poolerd writes its pid to while it runs; empty: none"},
		{Name: "syslog", Help: "send the log to the local syslog daemon as well"},
		{Name: "syslog_ident", Help: "the name syslog lines carry"},
		{Name: "syslog_facility", Help: "syslog facility: auth, authpriv, daemon, user, local0 to local7"},
		{Name: "log_level", Flag: "log-level", Help: "debug, info, warn or error"},
		{Name: "log_connections", Help: "log every client login"},
		{Name: "log_disconnections", Help: "log every client disconnection"},
	}
}

// Loader reads the configuration from its sources. It keeps the command line
// so that a reload sees the same flags and file.
type Loader struct {
	flags *pflag.FlagSet
	// File is the YAML file given with --config, if any.
	File string
	// CheckOnly is set by --check-config.
	CheckOnly bool
	// Version is set by --version.
	Version bool
	// Takeover is set by --takeover: take the listening socket over from
	// the poolerd serving takeover_socket instead of binding listen.
	Takeover bool
	// Translate, when set, reads a --config file written in another
	// format (cmd/poolerd sets internal/pgbini's, for pgbouncer.ini): it
	// returns the tree of keys a YAML file would hold and true, or false
	// for a file it does not recognise, which is then read as YAML.
	Translate func(path string, data []byte) (tree map[string]any, ok bool, err error)
}

// ErrHelp is returned by NewLoader when -h or --help was given; the usage
// has been written to the output.
var ErrHelp = pflag.ErrHelp

// NewLoader parses the command-line arguments (without the program name).
// Usage and flag errors are written to out.
func NewLoader(args []string, out io.Writer) (*Loader, error) {
	fs := pflag.NewFlagSet("poolerd", pflag.ContinueOnError)
	fs.SetOutput(out)
	l := &Loader{flags: fs}
	fs.StringVar(&l.File, "config", "", "YAML configuration file")
	fs.BoolVar(&l.CheckOnly, "check-config", false, "validate the configuration and exit")
	fs.BoolVar(&l.Version, "version", false, "print the version and exit")
	fs.BoolVar(&l.Takeover, "takeover", false, "take the listening socket over from the poolerd serving takeover_socket, which then drains and exits")
	def := Defaults()
	for _, k := range Keys() {
		if k.Flag == "" {
			continue
		}
		switch v := defaultValue(&def, k.Name).(type) {
		case string:
			fs.String(k.Flag, v, k.Help)
		case int:
			fs.Int(k.Flag, v, k.Help)
		case time.Duration:
			fs.Duration(k.Flag, v, k.Help)
		case bool:
			fs.Bool(k.Flag, v, k.Help)
		default:
			return nil, fmt.Errorf("config: key %s has no flag type", k.Name)
		}
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: poolerd [flags]\n\nEvery key can also be set in the --config file or with its POOLERD_<KEY> environment variable.\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: poolerd takes only flags (see --help)", fs.Arg(0))
	}
	return l, nil
}

// Load reads the file (if any), the environment and the flags, in increasing
// order of precedence, and validates the result.
// InvalidError is a configuration that was read but does not validate,
// with where its log goes, so that the refusal can be written there too
// (as PgBouncer writes it to its logfile).
type InvalidError struct {
	Err error
	// LogFile and LogFormat are the configuration's log_file and
	// log_format, as read.
	LogFile, LogFormat string
}

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

func (l *Loader) Load() (*Config, error) {
	v := viper.New()
	def := Defaults()
	for _, k := range Keys() {
		v.SetDefault(k.Name, defaultValue(&def, k.Name))
		if err := v.BindEnv(k.Name, k.Env()); err != nil {
			return nil, fmt.Errorf("config: bind %s: %w", k.Env(), err)
		}
		if k.Flag != "" {
			if f := l.flags.Lookup(k.Flag); f != nil && f.Changed {
				if err := v.BindPFlag(k.Name, f); err != nil {
					return nil, fmt.Errorf("config: bind --%s: %w", k.Flag, err)
				}
			}
		}
	}
	translated := false
	if l.File != "" {
		var err error
		if translated, err = l.readFile(v); err != nil {
			return nil, err
		}
	}
	cfg := Defaults()
	err := v.UnmarshalExact(&cfg, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		durationHook,
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToSliceHookFunc(","),
	)))
	if err != nil {
		return nil, fmt.Errorf("config%s: %w", fileSuffix(l.File), cleanDecodeError(err))
	}
	if err := cfg.Validate(); err != nil {
		return nil, &InvalidError{Err: fmt.Errorf("config%s: %w", fileSuffix(l.File), err), LogFile: cfg.LogFile, LogFormat: cfg.LogFormat}
	}
	// A pgbouncer.ini names no HTTP endpoint (PgBouncer has none): the
	// default one is served if its port is free (two bouncers on one host
	// both start, as PgBouncer's do).
	_, env := os.LookupEnv(EnvPrefix + "HTTP_LISTEN")
	flag := l.flags.Lookup("http-listen")
	cfg.httpOptional = translated && !env && (flag == nil || !flag.Changed)
	return &cfg, nil
}

func fileSuffix(file string) string {
	if file == "" {
		return ""
	}
	return " " + file
}

// durationHook refuses bare numbers for durations: "30" would silently mean
// 30 nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || from == reflect.TypeFor[time.Duration]() {
		return data, nil
	}
	switch from.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Float64, reflect.Uint64, reflect.Uint:
		if reflect.ValueOf(data).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("duration %v has no unit: write it like \"30s\", \"500ms\" or \"2m\"", data)
	}
	return data, nil
}

// cleanDecodeError turns mapstructure's wording into one a user can act on.
func cleanDecodeError(err error) error {
	msg := err.Error()
	msg = strings.ReplaceAll(msg, "decoding failed due to the following error(s):\n\n", "")
	if strings.Contains(msg, "has invalid keys") {
		msg += " (unknown keys are errors: check the spelling against docs/configuration.md)"
	}
	return errors.New(msg)
}

// defaultValue returns the value of a top-level key in cfg.
func defaultValue(cfg *Config, name string) any {
	rv := reflect.ValueOf(cfg).Elem()
	if f, ok := fieldByTag(rv, name); ok {
		return f.Interface()
	}
	return nil
}

func fieldByTag(rv reflect.Value, name string) (reflect.Value, bool) {
	rt := rv.Type()
	for i := range rt.NumField() {
		tag := rt.Field(i).Tag.Get("mapstructure")
		if tag == ",squash" {
			if f, ok := fieldByTag(rv.Field(i), name); ok {
				return f, true
			}
			continue
		}
		if tag == name {
			return rv.Field(i), true
		}
	}
	return reflect.Value{}, false
}
