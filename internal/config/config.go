// Package config holds poolerd's typed configuration: defaults, loading from a
// YAML file, POOLERD_* environment variables and command-line flags (through
// viper), and validation with messages that say what to change. It does not
// apply a configuration: the proxy decides what a reload changes in a running
// poolerd, and cmd/poolerd what needs a restart.
package config

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/hba"
	"github.com/poolerd/poolerd/internal/ldapauth"
)

// Pool modes.
const (
	// PoolSession holds a server connection for the client's whole session.
	PoolSession = "session"
	// PoolStatement holds a server connection for one statement (one
	// simple query, or one extended-protocol request up to its Sync) and
	// refuses transactions of more than one statement.
	PoolStatement = "statement"
	// PoolTransaction holds a server connection from the first message of a
	// transaction until ReadyForQuery reports the session idle.
	PoolTransaction = "transaction"
)

// Startup modes.
const (
	// StartupWait keeps retrying an unreachable upstream and stays unready.
	StartupWait = "wait"
	// StartupFailFast exits non-zero after 3 failed attempts.
	StartupFailFast = "fail-fast"
)

// Client authentication methods.
const (
	AuthSCRAM = "scram-sha-256"
	AuthMD5   = "md5"
	// AuthPlain asks for the password in clear text (PgBouncer's plain,
	// pg_hba.conf's password) and checks it against any kind of secret.
	AuthPlain = "plain"
	// AuthCert admits a TLS client whose certificate (verified against
	// client_tls_ca_file) names the user as its common name, without a
	// password (PgBouncer's cert, pg_hba.conf's cert).
	AuthCert  = "cert"
	AuthTrust = "trust"
	// AuthAny admits every user name without a password, listed or not
	// (PgBouncer's auth_type any; trust with auth_file admits only the
	// users it lists).
	AuthAny = "any"
	// AuthHBA picks the method per client from the access rules
	// (auth_hba_file or auth_hba_rules), as PgBouncer's auth_type hba.
	AuthHBA = "hba"
	// AuthLDAP checks the client's password against an LDAP server
	// (auth_ldap_options), as PgBouncer's and PostgreSQL's ldap.
	AuthLDAP = "ldap"
	// AuthPAM checks the client's password with the system's PAM
	// library, service auth_pam_service.
	AuthPAM = "pam"
)

// DefaultAuthQuery is auth_query's default: PgBouncer's, with every name
// qualified with pg_catalog (so that a search_path set on auth_user
// cannot redirect it) and an expired password (VALID UNTIL in the past)
// returned as NULL, which never logs in.
const DefaultAuthQuery = "SELECT rolname, CASE WHEN rolvaliduntil OPERATOR(pg_catalog.<) pg_catalog.now() THEN NULL ELSE rolpassword END FROM pg_catalog.pg_authid WHERE rolname OPERATOR(pg_catalog.=) $1"

// Config is the whole configuration of one poolerd process. Field tags name
// the configuration keys; every top-level scalar key can also be set with the
// environment variable POOLERD_<KEY> (upper case).
type Config struct {
	// Listen is the address clients connect to (host:port), or several,
	// comma-separated (ListenAddrs); a host of * or none listens on every
	// address, IPv4 and IPv6.
	Listen string `mapstructure:"listen"`
	// UnixSocketDir, when set, adds a Unix-socket listener there, at
	// .s.PGSQL.<port> as PostgreSQL names its own (the port of the first
	// listen address), created with mode UnixSocketMode (octal) and, if
	// set, group UnixSocketGroup.
	UnixSocketDir   string `mapstructure:"unix_socket_dir"`
	UnixSocketMode  string `mapstructure:"unix_socket_mode"`
	UnixSocketGroup string `mapstructure:"unix_socket_group"`
	// SOReusePort opens the listener with SO_REUSEPORT, so that a new
	// poolerd can bind the same address while the old one drains.
	SOReusePort bool `mapstructure:"so_reuseport"`
	// PeerID, when not 0, names this poolerd within a group of poolers
	// that share a port (so_reuseport) and forward each other's cancel
	// requests (PgBouncer's peer_id and [peers]): the pid of every
	// BackendKeyData poolerd issues carries it, and a cancel request whose
	// key names another peer of Peers is sent on to that peer.
	PeerID int    `mapstructure:"peer_id"`
	Peers  []Peer `mapstructure:"peers"`
	// TCP options of client and server sockets (PgBouncer's tcp_*):
	// TCPKeepalive false turns keepalive off; a TCPKeepIdle or
	// TCPKeepInterval of 0 keeps poolerd's period (15 s to clients, 30 s
	// to PostgreSQL), a TCPKeepCount of 0 the system's; TCPUserTimeout 0
	// leaves TCP_USER_TIMEOUT unset.
	TCPKeepalive    bool          `mapstructure:"tcp_keepalive"`
	TCPKeepIdle     time.Duration `mapstructure:"tcp_keepidle"`
	TCPKeepInterval time.Duration `mapstructure:"tcp_keepintvl"`
	TCPKeepCount    int           `mapstructure:"tcp_keepcnt"`
	TCPUserTimeout  time.Duration `mapstructure:"tcp_user_timeout"`
	// TakeoverSocket is the Unix socket on which a running poolerd hands
	// its listening socket to a new one started with --takeover; empty
	// turns the hand-over off.
	TakeoverSocket string `mapstructure:"takeover_socket"`
	// EventLoops is how many event loops read the plain client and server
	// connections: "auto" (the default), "off" (a goroutine per
	// connection) or a number (EventLoopCount).
	EventLoops string `mapstructure:"event_loops"`
	// HTTPListen is the address of the HTTP server (health, metrics); empty disables it.
	HTTPListen string `mapstructure:"http_listen"`
	// HTTPProbeListen, when set, is a second HTTP address serving only
	// /healthz and /readyz, never behind HTTPWebConfigFile's basic auth or
	// TLS: for the kubelet's probes, which cannot easily send credentials.
	HTTPProbeListen string `mapstructure:"http_probe_listen"`
	// HTTPWebConfigFile is a Prometheus web configuration file (TLS and
	// basic auth, as every Prometheus exporter takes it) applied to
	// HTTPListen; empty serves plain HTTP without authentication.
	HTTPWebConfigFile string `mapstructure:"http_web_config_file"`
	// Upstream is the sidecar shorthand: a postgres:// URL whose host is the
	// upstream server for every database name a client asks for, and whose
	// user and password are both what poolerd logs in with and what clients
	// must present.
	Upstream string `mapstructure:"upstream"`

	// AuthType is how clients authenticate: scram-sha-256, md5, plain, trust, any or
	// hba (the access rules decide).
	AuthType string `mapstructure:"auth_type"`
	// AuthFile is a PgBouncer-format userlist file ("user" "secret" per line).
	AuthFile string `mapstructure:"auth_file"`
	// AuthHBAFile is an access-rule file in pg_hba.conf format; it applies
	// when AuthType is hba.
	AuthHBAFile string `mapstructure:"auth_hba_file"`
	// AuthHBARules are access rules given in the configuration instead of
	// AuthHBAFile (one or the other).
	AuthHBARules []hba.RuleSpec `mapstructure:"auth_hba_rules"`
	// DisablePQExec refuses the simple query protocol (PgBouncer's
	// disable_pqexec): a client's Query message ends its session, so that
	// only parameterized (extended-protocol) statements run, none of them
	// several statements in one.
	DisablePQExec bool `mapstructure:"disable_pqexec"`
	// ApplicationNameAddHost appends " - host:port" of the client to the
	// application_name it logs in with (PgBouncer's key), "app" if none.
	ApplicationNameAddHost bool `mapstructure:"application_name_add_host"`
	// IgnoreStartupParameters are startup parameters dropped instead of
	// applied (PgBouncer's ignore_startup_parameters; txstate.Ignored says
	// which). Empty, the default: every parameter a client sends is
	// applied.
	IgnoreStartupParameters []string `mapstructure:"ignore_startup_parameters"`
	// ServerRoundRobin hands out the idle server connection unused longest
	// instead of the one used last (PgBouncer's server_round_robin).
	ServerRoundRobin bool `mapstructure:"server_round_robin"`
	// ServerFastClose ends a client that holds a server connection
	// (session mode, or pinned) as soon as it is idle outside a
	// transaction once RECONNECT or a reload asked for that connection
	// to close, instead of at the end of its session (PgBouncer's key).
	ServerFastClose bool `mapstructure:"server_fast_close"`
	// LoginNotifyMessage, if set, is sent to every client that logs in to
	// a database, as a NOTICE before its first ReadyForQuery (PgBouncer's
	// key): a way to tell users they reach a pooler.
	LoginNotifyMessage string `mapstructure:"login_notify_message"`
	// QueryWaitNotify, if not zero, sends a client whose request has
	// waited this long for a server connection one NOTICE saying so
	// (PgBouncer's query_wait_notify).
	QueryWaitNotify time.Duration `mapstructure:"query_wait_notify"`
	// PIDFile is where poolerd writes its pid while it runs (PgBouncer's
	// pidfile); empty: nowhere.
	PIDFile string `mapstructure:"pidfile"`
	// Syslog sends the log to the local syslog daemon as well, as
	// SyslogIdent with SyslogFacility (PgBouncer's keys).
	Syslog         bool   `mapstructure:"syslog"`
	SyslogIdent    string `mapstructure:"syslog_ident"`
	SyslogFacility string `mapstructure:"syslog_facility"`
	// AuthLDAPOptions are the LDAP options of auth_type ldap, as on a
	// pg_hba.conf ldap line (ldapurl="…" or ldapserver=… ldapbasedn=…).
	AuthLDAPOptions string `mapstructure:"auth_ldap_options"`
	// AuthPAMService is the PAM service of auth_type pam.
	AuthPAMService string `mapstructure:"auth_pam_service"`
	// AuthIdentFile holds the user-name maps (pg_ident.conf format) that
	// access rules with map=NAME use for peer and cert.
	AuthIdentFile string `mapstructure:"auth_ident_file"`
	// AuthUser, when set, is the role poolerd logs in to PostgreSQL as to
	// run AuthQuery for a client whose user has no secret in the
	// configuration; its own secret comes from users, auth_file or
	// upstream.
	AuthUser string `mapstructure:"auth_user"`
	// AuthQuery returns (name, secret) for the user given as $1.
	AuthQuery string `mapstructure:"auth_query"`
	// AuthDBName, when set, is the database entry whose server and
	// database auth_query runs in; empty: the client's database.
	AuthDBName string `mapstructure:"auth_dbname"`
	// AuthCacheTTL is how long a secret AuthQuery returned is used
	// before the query runs again; 0 runs it for every login.
	AuthCacheTTL time.Duration `mapstructure:"auth_cache_ttl"`

	// AuthFailureDelay delays the answer to a failed authentication from
	// an address that failed before: it starts at this and doubles with
	// each failure in a row, up to AuthFailureDelayMax; 0 disables.
	AuthFailureDelay    time.Duration `mapstructure:"auth_failure_delay"`
	AuthFailureDelayMax time.Duration `mapstructure:"auth_failure_delay_max"`

	// MaxPacketSize is the longest message a logged-in client may send,
	// in bytes (length field included); longer ones end the connection
	// with 08P01. PostgreSQL's own limit is 1 GB - 1.
	MaxPacketSize int `mapstructure:"max_packet_size"`

	// ClientTLSSSLMode is what poolerd accepts from clients: disable (no
	// TLS), allow or prefer (TLS when the client asks), require (TLS
	// only), verify-ca (TLS with a client certificate signed by
	// ClientTLSCAFile), verify-full (and its common name is the user).
	ClientTLSSSLMode string `mapstructure:"client_tls_sslmode"`
	// ClientTLSCertFile and ClientTLSKeyFile are poolerd's certificate
	// for clients; ClientTLSCAFile the CA of client certificates.
	ClientTLSCertFile string `mapstructure:"client_tls_cert_file"`
	ClientTLSKeyFile  string `mapstructure:"client_tls_key_file"`
	ClientTLSCAFile   string `mapstructure:"client_tls_ca_file"`
	// ClientTLSProtocols are the TLS versions clients may use, as
	// PgBouncer's key: tlsv1.0 ... tlsv1.3, secure (1.2 and 1.3), all,
	// legacy.
	ClientTLSProtocols string `mapstructure:"client_tls_protocols"`
	// ClientTLSCiphers are the TLS 1.2 cipher suites offered to clients:
	// default, secure, fast, normal, all, or a list of OpenSSL names.
	ClientTLSCiphers string `mapstructure:"client_tls_ciphers"`
	// ClientTLSECDHCurve is the key-exchange curves offered to clients
	// (TLSCurves): auto, or a list.
	ClientTLSECDHCurve string `mapstructure:"client_tls_ecdhcurve"`
	// ServerTLSProtocols and ServerTLSCiphers are the same towards
	// PostgreSQL (server_tls_protocols, server_tls_ciphers).
	ServerTLSProtocols string `mapstructure:"server_tls_protocols"`
	ServerTLSCiphers   string `mapstructure:"server_tls_ciphers"`

	// ServerTLSSSLMode is how connections to PostgreSQL use TLS: disable,
	// allow, prefer, require, verify-ca or verify-full (PgBouncer's
	// server_tls_sslmode); a database entry may override it.
	ServerTLSSSLMode string `mapstructure:"server_tls_sslmode"`
	// ServerTLSCAFile is the CA that signed PostgreSQL's certificate
	// (verify-ca, verify-full).
	ServerTLSCAFile string `mapstructure:"server_tls_ca_file"`
	// ServerTLSCertFile and ServerTLSKeyFile are poolerd's client
	// certificate, for PostgreSQL's cert authentication.
	ServerTLSCertFile string `mapstructure:"server_tls_cert_file"`
	ServerTLSKeyFile  string `mapstructure:"server_tls_key_file"`

	// Pool settings; databases and users may override them.
	PoolSettings `mapstructure:",squash"`

	// StartupMode is what happens when the upstream cannot be reached at
	// start: wait (keep retrying, stay unready) or fail-fast (exit after 3
	// attempts).
	StartupMode string `mapstructure:"startup_mode"`
	// WarmPools opens one connection of each configured pool (upstream,
	// database entries with a user) at start, and /readyz waits for them;
	// false: a configured pool opens connections when its first client
	// comes, or min_size of them at start (PgBouncer's lazy pools).
	WarmPools bool `mapstructure:"warm_pools"`
	// ReconnectBackoffBase and ReconnectBackoffMax shape the exponential
	// backoff between failed connects: base, 2×base, 4×base ... up to max.
	ReconnectBackoffBase time.Duration `mapstructure:"reconnect_backoff_base"`
	ReconnectBackoffMax  time.Duration `mapstructure:"reconnect_backoff_max"`
	// RecycleRate is the most connections one pool recycles per second.
	RecycleRate int `mapstructure:"recycle_rate"`
	// ClientLoginTimeout bounds a client's startup and authentication.
	ClientLoginTimeout time.Duration `mapstructure:"client_login_timeout"`
	// ShutdownTimeout is how long SIGINT waits for transactions to finish.
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout"`
	// PoolIdleTimeout removes a pool (one database and user pair) that
	// has had no client and no server connection this long; 0 never.
	PoolIdleTimeout time.Duration `mapstructure:"pool_idle_timeout"`
	// OnServerUnavailable is fail or wait: what a request does while
	// connects to its server fail and its pool has no usable connection:
	// refused at once (08006, seed 004's fast failure), or queued within
	// checkout_timeout for the server to come back, as in PgBouncer.
	OnServerUnavailable string `mapstructure:"on_server_unavailable"`

	// AdminUsers may run every admin console command; StatsUsers only SHOW.
	AdminUsers []string `mapstructure:"admin_users"`
	StatsUsers []string `mapstructure:"stats_users"`
	// StatsPeriod is how often the averages of SHOW STATS are computed and,
	// with LogStats, the stats line is logged.
	StatsPeriod time.Duration `mapstructure:"stats_period"`
	LogStats    bool          `mapstructure:"log_stats"`
	// HTTPPprof serves /debug/pprof/ on the HTTP server.
	HTTPPprof bool `mapstructure:"http_pprof"`

	// LogFormat is console, json or pgbouncer (PgBouncer's lines:
	// internal/pgblog).
	LogFormat string `mapstructure:"log_format"`
	// LogFile, when set, gets a copy of the log (appended; opened again on
	// SIGHUP, for rotation), as PgBouncer's logfile.
	LogFile string `mapstructure:"log_file"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `mapstructure:"log_level"`
	// LogConnections logs every successful client login.
	LogConnections bool `mapstructure:"log_connections"`
	// LogDisconnections logs every client disconnection with its reason.
	LogDisconnections bool `mapstructure:"log_disconnections"`

	// Connection limits, as in PgBouncer; 0 means no limit. Databases and
	// users may set their own.
	MaxClientConn            int `mapstructure:"max_client_conn"`
	MaxDBConnections         int `mapstructure:"max_db_connections"`
	MaxUserConnections       int `mapstructure:"max_user_connections"`
	MaxDBClientConnections   int `mapstructure:"max_db_client_connections"`
	MaxUserClientConnections int `mapstructure:"max_user_client_connections"`

	// RateLimits are the rate-limit rules; RateLimitBackend is memory (per
	// process) or redis (shared by every poolerd using RedisURL).
	RateLimits       []RateLimitRule `mapstructure:"rate_limits"`
	RateLimitBackend string          `mapstructure:"rate_limit_backend"`
	RedisURL         string          `mapstructure:"redis_url"`
	RedisTimeout     time.Duration   `mapstructure:"redis_timeout"`
	// OnRedisError is allow or deny: what a rate-limit check does when
	// Redis fails or is slower than RedisTimeout.
	OnRedisError string `mapstructure:"on_redis_error"`

	// The fleet-wide server connection budget (see fleet.go).
	FleetSettings `mapstructure:",squash"`

	// VerifyHandoff is when a transaction- or statement-mode server
	// connection is checked with one fingerprint query before it passes
	// from one client to another: off, sample (a share of hand-offs,
	// VerifyHandoffSampleRate) or always.
	VerifyHandoff string `mapstructure:"verify_handoff"`
	// VerifyHandoffSampleRate is the share of hand-offs checked with
	// VerifyHandoff sample: every round(1/rate)-th of each pool.
	VerifyHandoffSampleRate float64 `mapstructure:"verify_handoff_sample_rate"`

	// Databases lists the databases clients may connect to. A database named
	// "*" is the fallback for names not listed.
	Databases []Database `mapstructure:"databases"`
	// Users lists per-user passwords and settings.
	Users []User `mapstructure:"users"`

	// upstream is Upstream parsed during validation.
	upstream *UpstreamURL
	// secrets are the client secrets, from users and auth_file, by user name.
	secrets map[string]userSecret
	// hbaRules are the access rules, from AuthHBAFile or AuthHBARules.
	hbaRules hba.Rules
	// identMaps are AuthIdentFile's maps.
	identMaps hba.IdentMaps
	// ldapOptions are AuthLDAPOptions parsed (auth_type ldap).
	ldapOptions *ldapauth.Options
	// httpOptional: http_listen is the default of a configuration read
	// from a pgbouncer.ini (HTTPListenOptional).
	httpOptional bool
	// comboWarnings are what validation accepted but Warnings reports (a
	// database's min_size above a user's max_size).
	comboWarnings []string
}

// MaxPeerID is the largest peer_id: PgBouncer's, whose keys carry it in
// 16 bits of the pid, of which it keeps the top ones clear.
const MaxPeerID = 16383

// Peer is another pooler of a peering group (PgBouncer's [peers] entry):
// where cancel requests for the clients it issued keys to are sent.
type Peer struct {
	// ID is the peer's peer_id.
	ID int `mapstructure:"id"`
	// Host is a host name or address, or a directory (starting with /)
	// holding the peer's Unix socket .s.PGSQL.<Port>.
	Host string `mapstructure:"host"`
	// Port is the peer's port (default 6432).
	Port int `mapstructure:"port"`
	// PoolSize bounds the cancel requests in flight to the peer at once;
	// more wait their turn (0: the global max_size, as PgBouncer's
	// default_pool_size).
	PoolSize int `mapstructure:"pool_size"`
}

// Values of verify_handoff.
const (
	VerifyHandoffOff    = "off"
	VerifyHandoffSample = "sample"
	VerifyHandoffAlways = "always"
)

// HandoffEvery is how often a pool checks a hand-off under these
// settings: 0 never, 1 always, n every n-th (verify_handoff sample).
func (c *Config) HandoffEvery() uint64 {
	switch c.VerifyHandoff {
	case VerifyHandoffAlways:
		return 1
	case VerifyHandoffSample:
		if c.VerifyHandoffSampleRate <= 0 {
			return 0
		}
		return uint64(math.Max(1, math.Round(1/c.VerifyHandoffSampleRate)))
	}
	return 0
}

// Values of session_state.
const (
	SessionStatePin    = "pin"
	SessionStateRefuse = "refuse"
)

// PoolSettings are the settings that can be given globally and overridden
// per database and per user (see Overrides).
type PoolSettings struct {
	// PoolMode is session, transaction or statement.
	PoolMode string `mapstructure:"pool_mode"`
	// MaxPreparedStatements is how many protocol-level prepared statements
	// poolerd keeps prepared on one server connection in transaction and
	// statement mode (least recently used closed first); 0 passes named
	// statements through unchanged, as PgBouncer before 1.21 did.
	MaxPreparedStatements int `mapstructure:"max_prepared_statements"`
	// SessionState is what a transaction- or statement-mode client that
	// creates session state (a temp table, LISTEN, a session advisory lock,
	// SQL PREPARE, DECLARE WITH HOLD, SET ROLE) gets: pin (it keeps its server
	// connection until it leaves) or refuse (an error).
	SessionState string `mapstructure:"session_state"`
	// MaxPinnedClients caps how many clients of one pool may be pinned to
	// their server connection at once: a number, or a share of MaxSize
	// ("50%"). A statement that would pin one more is refused (53400).
	MaxPinnedClients string `mapstructure:"max_pinned_clients"`
	// PinnedIdleTimeout ends a pinned client that stays idle outside a
	// transaction this long, so that its server connection is freed; 0
	// disables.
	PinnedIdleTimeout time.Duration `mapstructure:"pinned_idle_timeout"`
	// MaxSize is the most server connections one (database, user) pool opens.
	MaxSize int `mapstructure:"max_size"`
	// MinSize is how many server connections a pool keeps open.
	MinSize int `mapstructure:"min_size"`
	// ReservePoolSize more connections (beyond MaxSize) a pool may open
	// for requests that have waited ReservePoolTimeout, closed again when
	// they come back with nobody waiting (PgBouncer's reserve pool); 0,
	// or a ReservePoolTimeout of 0, disables it.
	ReservePoolSize    int           `mapstructure:"reserve_pool_size"`
	ReservePoolTimeout time.Duration `mapstructure:"reserve_pool_timeout"`
	// CheckoutTimeout is how long a client waits in the queue for a server
	// connection before it gets SQLSTATE 53300.
	CheckoutTimeout time.Duration `mapstructure:"checkout_timeout"`
	// ServerResetQuery runs before a server connection used in session mode
	// is given to another client.
	ServerResetQuery string `mapstructure:"server_reset_query"`
	// ServerConnectTimeout bounds dialing and logging in to PostgreSQL.
	ServerConnectTimeout time.Duration `mapstructure:"server_connect_timeout"`

	// ValidationInterval: a connection idle longer than this is checked
	// with ValidationQuery before use; 0 disables validation.
	ValidationInterval time.Duration `mapstructure:"validation_interval"`
	// ValidationQuery is the check; the empty query is a valid (cheapest)
	// round trip.
	ValidationQuery string `mapstructure:"validation_query"`
	// ValidationTimeout bounds one validation.
	ValidationTimeout time.Duration `mapstructure:"validation_timeout"`

	// MaxLifetime recycles idle connections older than this (±10 % jitter);
	// 0 disables.
	MaxLifetime time.Duration `mapstructure:"max_lifetime"`
	// MaxQueries recycles idle connections that ran this many queries; 0
	// disables.
	MaxQueries int `mapstructure:"max_queries"`
	// MaxUses closes a connection when it comes back from its this-many'th
	// checkout, whoever waits; 0 disables (PgBouncer's server_lifetime =
	// 0 is 1: each connection serves one client once).
	MaxUses int `mapstructure:"max_uses"`
	// IdleTimeout closes connections idle this long while the pool holds
	// more than MinSize; 0 disables.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`

	// LeakDetectionThreshold warns about a client that keeps a server
	// connection busy (in a transaction or a query) this long; 0 disables.
	LeakDetectionThreshold time.Duration `mapstructure:"leak_detection_threshold"`
	// WaitWarning logs one warning with the pool's state when a checkout
	// has waited this long for a server connection (at most one per pool
	// per 10 s); 0 disables.
	WaitWarning time.Duration `mapstructure:"wait_warning"`

	// QueryTimeout cancels one query running longer than this; 0 disables.
	QueryTimeout time.Duration `mapstructure:"query_timeout"`
	// TransactionTimeout ends a client whose transaction (the whole lease of
	// its server connection) lasts longer than this; 0 disables.
	TransactionTimeout time.Duration `mapstructure:"transaction_timeout"`
	// LeaseTimeout is one deadline for a whole lease: from the moment a
	// request (in transaction mode, a transaction) starts waiting for a
	// server connection until its connection is idle outside a
	// transaction again; the checkout wait gets what is left of it, the
	// work what is left after the wait. 0 disables.
	LeaseTimeout time.Duration `mapstructure:"lease_timeout"`
	// IdleTransactionTimeout ends a client idle inside a transaction this
	// long; 0 disables.
	IdleTransactionTimeout time.Duration `mapstructure:"idle_transaction_timeout"`
	// ClientIdleTimeout ends a client idle outside a transaction this long;
	// 0 disables.
	ClientIdleTimeout time.Duration `mapstructure:"client_idle_timeout"`
	// ServerResponseTimeout declares a server hung when requests are pending
	// and it sent nothing for this long; 0 disables.
	ServerResponseTimeout time.Duration `mapstructure:"server_response_timeout"`
}

// Database is one entry of the databases list.
type Database struct {
	// Name is the database name clients ask for (case-sensitive); "*" matches any.
	Name string `mapstructure:"name"`
	// Host is the PostgreSQL host name, IP address, or a directory holding
	// its Unix socket (starting with "/").
	Host string `mapstructure:"host"`
	// Port is PostgreSQL's port (the default port of Hosts).
	Port int `mapstructure:"port"`
	// Hosts lists several servers for this database instead of Host
	// ("host", "host:port", "[v6addr]:port"): a primary and its replicas.
	// Each server connection goes to one that suits TargetSessionAttrs,
	// tried in the order LoadBalanceHosts gives.
	Hosts []string `mapstructure:"hosts"`
	// TargetSessionAttrs is which servers suit (libpq's values): any,
	// read-write, read-only, primary, standby or prefer-standby.
	TargetSessionAttrs string `mapstructure:"target_session_attrs"`
	// LoadBalanceHosts orders the servers for each new connection:
	// round-robin, random, least-connections or disable (as listed).
	LoadBalanceHosts string `mapstructure:"load_balance_hosts"`
	// MaxReplicaLag skips a standby whose replay is further behind than
	// this when a connection is opened to it; 0 disables.
	MaxReplicaLag time.Duration `mapstructure:"max_replica_lag"`
	// MaxSizePerHost caps each server's connections of a pool (max_size
	// caps them all together); 0: no cap of its own.
	MaxSizePerHost int `mapstructure:"max_size_per_host"`
	// HostSettings gives servers of Hosts settings of their own.
	HostSettings []HostSetting `mapstructure:"host_settings"`
	// DBName is the database name on the server; empty means Name (for "*",
	// the name the client asked for).
	DBName string `mapstructure:"dbname"`
	// User, when set, is the role every client of this database is logged in
	// to PostgreSQL as (one pool for all clients), with Password.
	User string `mapstructure:"user"`
	// Password is User's password (plain text, md5 or SCRAM secret).
	Password string `mapstructure:"password"`
	// ServerTLSSSLMode overrides the global server_tls_sslmode for this
	// database's server.
	ServerTLSSSLMode string `mapstructure:"server_tls_sslmode"`
	// AuthUser, AuthQuery and AuthDBName override the global auth_user,
	// auth_query and auth_dbname for this database's clients (AuthLookup).
	AuthUser   string `mapstructure:"auth_user"`
	AuthQuery  string `mapstructure:"auth_query"`
	AuthDBName string `mapstructure:"auth_dbname"`
	// ServerParameters are startup parameters poolerd sends when it
	// opens this database's server connections (PgBouncer's per-database
	// client_encoding, datestyle, timezone, application_name): the
	// defaults its clients see and keep unless they set their own.
	ServerParameters map[string]string `mapstructure:"server_parameters"`

	// MaxDBConnections and MaxDBClientConnections override the global
	// limits for this database (server and client connections).
	MaxDBConnections       *int `mapstructure:"max_db_connections"`
	MaxDBClientConnections *int `mapstructure:"max_db_client_connections"`
	// FleetMaxServerConnections is this database's fleet-wide budget.
	FleetMaxServerConnections *int `mapstructure:"fleet_max_server_connections"`

	Overrides `mapstructure:",squash"`
}

// User is one entry of the users list.
type User struct {
	// Name is the role name (case-sensitive).
	Name string `mapstructure:"name"`
	// Password is the secret clients must prove and poolerd logs in with:
	// plain text, "md5..." or "SCRAM-SHA-256$...".
	Password string `mapstructure:"password"`

	// MaxUserConnections and MaxUserClientConnections override the
	// global limits for this user (server and client connections).
	MaxUserConnections       *int `mapstructure:"max_user_connections"`
	MaxUserClientConnections *int `mapstructure:"max_user_client_connections"`
	// FleetMaxServerConnections is this user's fleet-wide budget.
	FleetMaxServerConnections *int `mapstructure:"fleet_max_server_connections"`

	Overrides `mapstructure:",squash"`
}

// HostSetting is what one server of a database entry's hosts sets for
// itself; 0 inherits the entry's (or the pool's) value.
type HostSetting struct {
	// Host names the server as in the entry's hosts ("host" or
	// "host:port").
	Host string `mapstructure:"host"`
	// IdleTimeout closes this server's idle connections sooner (or
	// later) than the pool's idle_timeout.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// MaxSizePerHost caps the pool's connections to this server, in
	// place of the entry's max_size_per_host.
	MaxSizePerHost int `mapstructure:"max_size_per_host"`
}

// RateLimitRule is one rate limit: clients matching Match share budgets
// keyed by KeyBy; every matching rule must allow a request.
type RateLimitRule struct {
	// Name identifies the rule in errors, logs and metrics.
	Name  string    `mapstructure:"name"`
	Match RuleMatch `mapstructure:"match"`
	// KeyBy splits the budget: user, database, client (address) and
	// application_name, in any combination; empty means one budget for
	// every matching client.
	KeyBy []string `mapstructure:"key_by"`
	// Buckets: at most Limit per Per each.
	Queries      *RateBucket `mapstructure:"queries"`
	Transactions *RateBucket `mapstructure:"transactions"`
	Connections  *RateBucket `mapstructure:"connections"`
	// Measured buckets: what requests cost the database, charged when
	// each transaction (or statement outside one) ends: ServerTime in
	// milliseconds of server connection time, Rows in DataRows returned,
	// Bytes in bytes returned. A key in debt waits or is refused at its
	// next transaction.
	ServerTime *RateBucket `mapstructure:"server_time"`
	Rows       *RateBucket `mapstructure:"rows"`
	Bytes      *RateBucket `mapstructure:"bytes"`
	// Mode is reject (error 53400) or wait (delay, up to MaxWait).
	Mode    string        `mapstructure:"mode"`
	MaxWait time.Duration `mapstructure:"max_wait"`
}

// RuleMatch selects clients; an empty field matches any.
type RuleMatch struct {
	Database        string `mapstructure:"database"`
	User            string `mapstructure:"user"`
	Client          string `mapstructure:"client"` // CIDR or address
	ApplicationName string `mapstructure:"application_name"`
}

// NamedBucket is one bucket a rule sets, with its key and what it counts.
type NamedBucket struct {
	Name string
	// Unit is what Limit counts: requests, transactions, logins, ms, rows
	// or bytes.
	Unit string
	// Measured: charged when a transaction ends (server_time, rows,
	// bytes), not counted when a request starts.
	Measured bool
	*RateBucket
}

// Buckets lists the buckets the rule sets, in the order of the keys.
func (r *RateLimitRule) Buckets() []NamedBucket {
	var out []NamedBucket
	for _, b := range []NamedBucket{{"queries", "requests", false, r.Queries}, {"transactions", "transactions", false, r.Transactions},
		{"connections", "logins", false, r.Connections}, {"server_time", "ms", true, r.ServerTime},
		{"rows", "rows", true, r.Rows}, {"bytes", "bytes", true, r.Bytes}} {
		if b.RateBucket != nil {
			out = append(out, b)
		}
	}
	return out
}

// RateBucket is one budget of a rule.
type RateBucket struct {
	Limit int64         `mapstructure:"limit"`
	Per   time.Duration `mapstructure:"per"`
}

// Overrides are the pool settings a database or user entry may set; nil
// inherits. A user's setting wins over its database's, which wins over the
// global one (PgBouncer's order). Each field has the name and key of its
// PoolSettings field.
type Overrides struct {
	PoolMode               *string        `mapstructure:"pool_mode"`
	MaxPreparedStatements  *int           `mapstructure:"max_prepared_statements"`
	SessionState           *string        `mapstructure:"session_state"`
	MaxPinnedClients       *string        `mapstructure:"max_pinned_clients"`
	PinnedIdleTimeout      *time.Duration `mapstructure:"pinned_idle_timeout"`
	MaxSize                *int           `mapstructure:"max_size"`
	MinSize                *int           `mapstructure:"min_size"`
	ReservePoolSize        *int           `mapstructure:"reserve_pool_size"`
	ReservePoolTimeout     *time.Duration `mapstructure:"reserve_pool_timeout"`
	CheckoutTimeout        *time.Duration `mapstructure:"checkout_timeout"`
	ServerResetQuery       *string        `mapstructure:"server_reset_query"`
	ServerConnectTimeout   *time.Duration `mapstructure:"server_connect_timeout"`
	ValidationInterval     *time.Duration `mapstructure:"validation_interval"`
	ValidationQuery        *string        `mapstructure:"validation_query"`
	ValidationTimeout      *time.Duration `mapstructure:"validation_timeout"`
	MaxLifetime            *time.Duration `mapstructure:"max_lifetime"`
	MaxQueries             *int           `mapstructure:"max_queries"`
	MaxUses                *int           `mapstructure:"max_uses"`
	IdleTimeout            *time.Duration `mapstructure:"idle_timeout"`
	LeakDetectionThreshold *time.Duration `mapstructure:"leak_detection_threshold"`
	WaitWarning            *time.Duration `mapstructure:"wait_warning"`
	QueryTimeout           *time.Duration `mapstructure:"query_timeout"`
	TransactionTimeout     *time.Duration `mapstructure:"transaction_timeout"`
	LeaseTimeout           *time.Duration `mapstructure:"lease_timeout"`
	IdleTransactionTimeout *time.Duration `mapstructure:"idle_transaction_timeout"`
	ClientIdleTimeout      *time.Duration `mapstructure:"client_idle_timeout"`
	ServerResponseTimeout  *time.Duration `mapstructure:"server_response_timeout"`
}

// Defaults returns the configuration every key starts from.
func Defaults() Config {
	return Config{
		Listen:         "127.0.0.1:6432",
		UnixSocketMode: "0777",
		HTTPListen:     "127.0.0.1:9930",
		// Level with or better than a goroutine per connection on 2
		// cores (docs/benchmarks.md, "Event loops").
		EventLoops: "auto",
		AuthType:   AuthSCRAM,
		// PgBouncer's service name.
		AuthPAMService: "pgbouncer",
		SyslogIdent:    "poolerd",
		SyslogFacility: "daemon",
		// prefer, as PgBouncer 1.20+: encrypted when the server offers it.
		ServerTLSSSLMode: "prefer",
		ClientTLSSSLMode: "disable",
		// PgBouncer's defaults.
		ClientTLSProtocols: "secure",
		ClientTLSCiphers:   "default",
		ClientTLSECDHCurve: "auto",
		ServerTLSProtocols: "secure",
		ServerTLSCiphers:   "default",
		AuthQuery:          DefaultAuthQuery,
		// A password changed or expired in PostgreSQL is seen within a
		// minute; a login burst of one user runs the query once.
		AuthCacheTTL:  time.Minute,
		MaxPacketSize: 1<<30 - 1,
		// A mistyped password costs 0.1 s; a guessing address soon waits
		// 5 s per attempt.
		AuthFailureDelay:    100 * time.Millisecond,
		AuthFailureDelayMax: 5 * time.Second,
		PoolSettings: PoolSettings{
			PoolMode:               PoolTransaction,
			MaxPreparedStatements:  200,
			SessionState:           SessionStatePin,
			MaxPinnedClients:       "100%",
			MaxSize:                20,
			MinSize:                0,
			CheckoutTimeout:        30 * time.Second,
			ServerResetQuery:       "DISCARD ALL",
			ServerConnectTimeout:   15 * time.Second,
			ValidationInterval:     5 * time.Second,
			ValidationQuery:        "SELECT 1",
			ValidationTimeout:      5 * time.Second,
			MaxLifetime:            time.Hour,
			MaxQueries:             50000,
			IdleTimeout:            60 * time.Second,
			LeakDetectionThreshold: 30 * time.Second,
			WaitWarning:            10 * time.Second,
			ReservePoolTimeout:     5 * time.Second,
		},
		StartupMode:          StartupWait,
		WarmPools:            true,
		ReconnectBackoffBase: time.Second,
		ReconnectBackoffMax:  16 * time.Second,
		RecycleRate:          1,
		ClientLoginTimeout:   60 * time.Second,
		TCPKeepalive:         true,
		ShutdownTimeout:      30 * time.Second,
		MaxClientConn:        10000,
		RateLimitBackend:     "memory",
		RedisTimeout:         50 * time.Millisecond,
		OnRedisError:         "allow",
		OnServerUnavailable:  "fail",
		FleetSettings:        FleetSettings{FleetLeaseTTL: DefaultFleetLeaseTTL},
		// See docs/benchmarks.md, "Hand-off check".
		VerifyHandoff:           VerifyHandoffSample,
		VerifyHandoffSampleRate: 0.001,
		StatsPeriod:             60 * time.Second,
		LogStats:                true,
		LogFormat:               "console",
		LogLevel:                "info",
		LogConnections:          true,
		LogDisconnections:       true,
	}
}

// Effective applies overrides to base in order; a later override wins.
func (base PoolSettings) Effective(over ...Overrides) PoolSettings {
	out := base
	dst := reflect.ValueOf(&out).Elem()
	for _, o := range over {
		src := reflect.ValueOf(o)
		for i := range src.NumField() {
			if f := src.Field(i); !f.IsNil() {
				dst.FieldByName(src.Type().Field(i).Name).Set(f.Elem())
			}
		}
	}
	return out
}

// String describes a database entry without its password.
func (d Database) String() string {
	return fmt.Sprintf("database %q (host %s port %d)", d.Name, d.Host, d.Port)
}

// PinnedCap is how many clients of a pool with these settings may be
// pinned at once: MaxPinnedClients as a number, or as a share of MaxSize
// (rounded down, at least 1).
func (p PoolSettings) PinnedCap() (int, error) {
	v := strings.TrimSpace(p.MaxPinnedClients)
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		n, err := strconv.Atoi(strings.TrimSpace(pct))
		if err != nil || n < 1 || n > 100 {
			return 0, fmt.Errorf("max_pinned_clients %q: a share must be 1%% to 100%% of max_size", p.MaxPinnedClients)
		}
		return max(1, p.MaxSize*n/100), nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("max_pinned_clients %q is not a number of clients (at least 1) or a share of max_size like 50%%; session_state: refuse forbids pinning altogether", p.MaxPinnedClients)
	}
	return n, nil
}

// maxEventLoops bounds event_loops.
const maxEventLoops = 256

// EventLoopCount is how many event loops event_loops asks for on a machine
// that runs procs goroutines at once (GOMAXPROCS): 0 for "off"; "auto" is
// one loop per 2 processors, at least one (the best of 2, 4 and 8 loops on
// 16 cores: docs/benchmarks.md).
func (c *Config) EventLoopCount(procs int) (int, error) {
	switch v := strings.TrimSpace(strings.ToLower(c.EventLoops)); v {
	case "", "auto":
		return max(1, procs/2), nil
	case "off", "0":
		return 0, nil
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxEventLoops {
			return 0, fmt.Errorf("event_loops %q: want auto, off or a number from 1 to %d", c.EventLoops, maxEventLoops)
		}
		return n, nil
	}
}

// ListenAddrs is Listen's addresses, in order; a host of * becomes the
// empty host (every address).
func (c *Config) ListenAddrs() []string {
	var out []string
	for _, a := range strings.Split(c.Listen, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if strings.HasPrefix(a, "*:") {
			a = a[1:]
		}
		out = append(out, a)
	}
	return out
}

// UnixSocketPerm is unix_socket_mode as a file mode (0777 if it does not
// parse; Validate refuses that).
func (c *Config) UnixSocketPerm() os.FileMode {
	m, err := strconv.ParseUint(strings.TrimPrefix(c.UnixSocketMode, "0o"), 8, 32)
	if err != nil || m > 0o777 {
		return 0o777
	}
	return os.FileMode(m)
}

// UnixSocketPath is the Unix socket's path for a listener on port, or ""
// without unix_socket_dir.
func (c *Config) UnixSocketPath(port int) string {
	if c.UnixSocketDir == "" {
		return ""
	}
	return filepath.Join(c.UnixSocketDir, ".s.PGSQL."+strconv.Itoa(port))
}

// HTTPListenOptional reports whether http_listen is only the default of a
// configuration read from a pgbouncer.ini (set neither by the environment
// nor by a flag): poolerd then starts without the HTTP endpoint when that
// address is in use, as a second PgBouncer on the host would start.
func (c *Config) HTTPListenOptional() bool { return c.httpOptional }
