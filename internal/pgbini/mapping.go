package pgbini

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/config"
)

// kind is how a PgBouncer value becomes a poolerd one.
type kind int

const (
	kindNone         kind = iota // not honoured
	kindString                   // as written
	kindPath                     // a file name, relative ones as resolvePath takes them
	kindInt                      // an integer
	kindSeconds                  // PgBouncer's seconds (possibly fractional) to a duration
	kindMillis                   // PgBouncer's milliseconds to a duration
	kindBool                     // 0/1, yes/no, on/off, true/false
	kindList                     // comma-separated names
	kindSpecial                  // translated by code in translate
	kindServerParam              // a [databases] startup parameter: an entry of server_parameters
	kindConnectQuery             // connect_query: its SET statements become server_parameters
)

// Rule is how one PgBouncer setting maps to poolerd.
type Rule struct {
	// Section is pgbouncer, databases (a connection-string parameter of a
	// [databases] entry) or users (a parameter of a [users] entry).
	Section string
	// Key is PgBouncer's name.
	Key string
	// To is poolerd's key (for databases and users, the field of the
	// entry); empty when poolerd has no equivalent.
	To   string
	kind kind
	// ifKey: To is honoured only once poolerd has that key (one being
	// added); until then the setting is reported like one without an
	// equivalent.
	ifKey bool
	// Default is PgBouncer's default, written when the file does not set
	// the key, for the keys whose poolerd default differs.
	Default string
	// Note says what differs (honoured keys) or what to do instead.
	Note string
}

// Honoured reports whether poolerd applies the setting.
func (r Rule) Honoured() bool {
	if r.kind == kindNone {
		return false
	}
	return !r.ifKey || hasKey(r.To)
}

func hasKey(name string) bool {
	return slices.ContainsFunc(config.Keys(), func(k config.Key) bool { return k.Name == name })
}

const (
	adviceTCPAlso     = "poolerd always has a TCP listener (listen): the Unix socket (unix_socket_dir) comes in addition, at the listen port"
	adviceDNS         = "poolerd resolves host names with the system resolver at each connect: nothing to set"
	adviceServerParam = "sent when the entry's server connections open, as in PgBouncer: the default its clients see unless they set their own"
	adviceAuthQuery   = "as in PgBouncer: users not in auth_file are looked up with auth_query as auth_user, whose password comes from auth_file (docs/security.md)"
	adviceHBA         = "as in PgBouncer, with auth_type hba (docs/security.md)"
	adviceNotNeeded   = "not needed by poolerd: remove it"
)

// Rules is the whole mapping, in the order of the migration guide.
func Rules() []Rule {
	return []Rule{
		// [pgbouncer]: where clients connect, authentication.
		{Section: "pgbouncer", Key: "listen_addr", To: "listen", kind: kindSpecial, Note: "with listen_port: every address of the list, `*` every address (IPv4 and IPv6); unset (Unix socket only) becomes 127.0.0.1 (poolerd always has a TCP listener)"},
		{Section: "pgbouncer", Key: "listen_port", To: "listen", kind: kindSpecial, Default: "6432"},
		{Section: "pgbouncer", Key: "unix_socket_dir", To: "unix_socket_dir", kind: kindPath, Default: "/tmp", Note: "the socket is `.s.PGSQL.<listen_port>` there; empty: none."},
		{Section: "pgbouncer", Key: "unix_socket_mode", To: "unix_socket_mode", kind: kindString, Default: "0777"},
		{Section: "pgbouncer", Key: "unix_socket_group", To: "unix_socket_group", kind: kindString},
		{Section: "pgbouncer", Key: "auth_type", To: "auth_type", kind: kindSpecial, Default: "md5", Note: "`md5`, `scram-sha-256`, `plain`, `cert`, `trust`, `any`, `ldap`, `pam` and `hba` as in PgBouncer (`trust` admits only users of `auth_file` or `auth_query`; `any` every user name, reported: poolerd does not ignore it; `pam` with the service `pgbouncer`)"},
		{Section: "pgbouncer", Key: "auth_file", To: "auth_file", kind: kindPath, Note: "same format (userlist.txt)"},
		{Section: "pgbouncer", Key: "auth_hba_file", To: "auth_hba_file", kind: kindPath, ifKey: true, Note: adviceHBA},
		{Section: "pgbouncer", Key: "auth_ident_file", To: "auth_ident_file", kind: kindPath, Note: "user-name maps (pg_ident.conf format) for `peer` and `cert` rules with `map=`"},
		{Section: "pgbouncer", Key: "auth_query", To: "auth_query", kind: kindString, ifKey: true, Note: adviceAuthQuery},
		{Section: "pgbouncer", Key: "auth_user", To: "auth_user", kind: kindString, ifKey: true, Note: adviceAuthQuery},
		{Section: "pgbouncer", Key: "auth_dbname", To: "auth_dbname", kind: kindString, Note: "the [databases] entry whose server and database auth_query runs in"},
		{Section: "pgbouncer", Key: "auth_ldap_options", To: "auth_ldap_options", kind: kindString, Note: "the LDAP options of `auth_type = ldap`, as in PgBouncer"},
		{Section: "pgbouncer", Key: "admin_users", To: "admin_users", kind: kindList},
		{Section: "pgbouncer", Key: "stats_users", To: "stats_users", kind: kindList},
		// Pools.
		{Section: "pgbouncer", Key: "pool_mode", To: "pool_mode", kind: kindString, Default: "session"},
		{Section: "pgbouncer", Key: "default_pool_size", To: "max_size", kind: kindInt},
		{Section: "pgbouncer", Key: "min_pool_size", To: "min_size", kind: kindInt},
		{Section: "pgbouncer", Key: "reserve_pool_size", To: "reserve_pool_size", kind: kindInt},
		{Section: "pgbouncer", Key: "reserve_pool_timeout", To: "reserve_pool_timeout", kind: kindSeconds, Note: "0 never opens the reserve, as in PgBouncer"},
		{Section: "pgbouncer", Key: "max_client_conn", To: "max_client_conn", kind: kindInt, Default: "100"},
		{Section: "pgbouncer", Key: "max_db_connections", To: "max_db_connections", kind: kindInt},
		{Section: "pgbouncer", Key: "max_user_connections", To: "max_user_connections", kind: kindInt},
		{Section: "pgbouncer", Key: "max_db_client_connections", To: "max_db_client_connections", kind: kindInt},
		{Section: "pgbouncer", Key: "max_user_client_connections", To: "max_user_client_connections", kind: kindInt},
		{Section: "pgbouncer", Key: "max_prepared_statements", To: "max_prepared_statements", kind: kindInt},
		{Section: "pgbouncer", Key: "server_reset_query", To: "server_reset_query", kind: kindString},
		{Section: "pgbouncer", Key: "server_reset_query_always", Note: "poolerd runs server_reset_query in session mode only; in transaction mode it tracks session state itself (session_state)"},
		{Section: "pgbouncer", Key: "server_check_query", To: "validation_query", kind: kindSpecial, Default: "<empty>", Note: "`<empty>` (PgBouncer's default) is an empty query, `validation_query: \"\"`; empty turns the check off (validation_interval 0)."},
		{Section: "pgbouncer", Key: "server_check_delay", To: "validation_interval", kind: kindSpecial, Default: "30", Note: "0 (check at every reuse) becomes 1ns."},
		{Section: "pgbouncer", Key: "server_fast_close", To: "server_fast_close", kind: kindBool},
		{Section: "pgbouncer", Key: "login_notify_message", To: "login_notify_message", kind: kindString},
		{Section: "pgbouncer", Key: "query_wait_notify", To: "query_wait_notify", kind: kindSeconds},
		{Section: "pgbouncer", Key: "server_round_robin", To: "server_round_robin", kind: kindBool},
		{Section: "pgbouncer", Key: "server_lifetime", To: "max_lifetime", kind: kindSpecial, Note: "poolerd adds ±10 % jitter per connection; 0 (PgBouncer: each connection is used once) becomes `max_uses: 1`"},
		{Section: "pgbouncer", Key: "server_idle_timeout", To: "idle_timeout", kind: kindSeconds, Default: "600"},
		{Section: "pgbouncer", Key: "server_connect_timeout", To: "server_connect_timeout", kind: kindSeconds},
		{Section: "pgbouncer", Key: "server_login_retry", To: "reconnect_backoff_max", kind: kindSpecial, Note: "poolerd backs off exponentially from reconnect_backoff_base (1s) up to this"},
		{Section: "pgbouncer", Key: "autodb_idle_timeout", Note: "pools of the `*` entry are kept; idle_timeout closes their connections"},
		{Section: "pgbouncer", Key: "suspend_timeout", Note: "not needed: poolerd's SUSPEND flushes no buffers (it answers at once), and its online restart (--takeover for -R) passes no sockets that would need flushing"},
		{Section: "pgbouncer", Key: "track_extra_parameters", Note: "poolerd tracks every parameter the server reports: nothing to set"},
		{Section: "pgbouncer", Key: "ignore_startup_parameters", To: "ignore_startup_parameters", kind: kindList, Note: "the listed parameters are dropped, as PgBouncer drops them; without it poolerd applies every parameter a client sends"},
		{Section: "pgbouncer", Key: "disable_pqexec", To: "disable_pqexec", kind: kindBool},
		{Section: "pgbouncer", Key: "application_name_add_host", To: "application_name_add_host", kind: kindBool},
		{Section: "pgbouncer", Key: "max_packet_size", To: "max_packet_size", kind: kindSpecial, Note: "capped at PostgreSQL's own limit, 1073741823"},
		{Section: "pgbouncer", Key: "pkt_buf", Note: "poolerd sizes its buffers itself: remove it"},
		{Section: "pgbouncer", Key: "sbuf_loopcnt", Note: "poolerd sizes its buffers itself: remove it"},
		{Section: "pgbouncer", Key: "listen_backlog", Note: "poolerd uses the kernel's somaxconn: remove it"},
		{Section: "pgbouncer", Key: "so_reuseport", To: "so_reuseport", kind: kindBool, ifKey: true, Note: "as in PgBouncer: a new poolerd binds the port while the old one drains (docs/operations.md)"},
		{Section: "pgbouncer", Key: "peer_id", To: "peer_id", kind: kindInt, Note: "as in PgBouncer, with the [peers] section: the poolers of a group sharing a port (so_reuseport) pass each cancel request on to the one that issued its key, poolerd and PgBouncer alike (the same key layout)"},
		// Timeouts.
		{Section: "pgbouncer", Key: "query_timeout", To: "query_timeout", kind: kindSeconds},
		{Section: "pgbouncer", Key: "query_wait_timeout", To: "checkout_timeout", kind: kindSeconds, Default: "120"},
		{Section: "pgbouncer", Key: "cancel_wait_timeout", Note: "poolerd forwards a cancel request at once: nothing to set"},
		{Section: "pgbouncer", Key: "client_idle_timeout", To: "client_idle_timeout", kind: kindSeconds},
		{Section: "pgbouncer", Key: "client_login_timeout", To: "client_login_timeout", kind: kindSeconds},
		{Section: "pgbouncer", Key: "idle_transaction_timeout", To: "idle_transaction_timeout", kind: kindSeconds},
		{Section: "pgbouncer", Key: "transaction_timeout", To: "transaction_timeout", kind: kindSeconds},
		// TLS.
		{Section: "pgbouncer", Key: "client_tls_sslmode", To: "client_tls_sslmode", kind: kindString},
		{Section: "pgbouncer", Key: "client_tls_cert_file", To: "client_tls_cert_file", kind: kindPath},
		{Section: "pgbouncer", Key: "client_tls_key_file", To: "client_tls_key_file", kind: kindPath},
		{Section: "pgbouncer", Key: "client_tls_ca_file", To: "client_tls_ca_file", kind: kindPath},
		{Section: "pgbouncer", Key: "client_tls_protocols", To: "client_tls_protocols", kind: kindString, ifKey: true, Note: "as in PgBouncer (docs/security.md)"},
		{Section: "pgbouncer", Key: "client_tls_ciphers", To: "client_tls_ciphers", kind: kindString, ifKey: true, Note: "as in PgBouncer, except that TLS 1.3 suites cannot be chosen (Go's)"},
		{Section: "pgbouncer", Key: "client_tls_ecdhcurve", To: "client_tls_ecdhcurve", kind: kindString, Note: "`auto` or curve names (`prime256v1`, `secp384r1`, `x25519`, …)"},
		{Section: "pgbouncer", Key: "client_tls_dheparams", Note: "not needed: Go's TLS has no finite-field DHE suites, so there are no DH parameters to set (key exchange is always ECDHE, see client_tls_ecdhcurve)"},
		{Section: "pgbouncer", Key: "server_tls_sslmode", To: "server_tls_sslmode", kind: kindString},
		{Section: "pgbouncer", Key: "server_tls_ca_file", To: "server_tls_ca_file", kind: kindPath},
		{Section: "pgbouncer", Key: "server_tls_cert_file", To: "server_tls_cert_file", kind: kindPath},
		{Section: "pgbouncer", Key: "server_tls_key_file", To: "server_tls_key_file", kind: kindPath},
		{Section: "pgbouncer", Key: "server_tls_protocols", To: "server_tls_protocols", kind: kindString, Note: "as `client_tls_protocols`, towards PostgreSQL"},
		{Section: "pgbouncer", Key: "server_tls_ciphers", To: "server_tls_ciphers", kind: kindString, Note: "as `client_tls_ciphers`, towards PostgreSQL"},
		// Network.
		{Section: "pgbouncer", Key: "tcp_defer_accept", Note: "not needed by poolerd: it reads a new client's startup packet when it arrives, bounded by client_login_timeout; remove it"},
		{Section: "pgbouncer", Key: "tcp_socket_buffer", Note: "not needed by poolerd: it keeps the kernel's self-tuning socket buffers; remove it"},
		{Section: "pgbouncer", Key: "tcp_keepalive", To: "tcp_keepalive", kind: kindBool},
		{Section: "pgbouncer", Key: "tcp_keepcnt", To: "tcp_keepcnt", kind: kindInt, Note: "0 keeps the system's"},
		{Section: "pgbouncer", Key: "tcp_keepidle", To: "tcp_keepidle", kind: kindSeconds, Note: "0 keeps poolerd's 15 s to clients and 30 s to servers (PgBouncer's: the system's, 2 hours on Linux)"},
		{Section: "pgbouncer", Key: "tcp_keepintvl", To: "tcp_keepintvl", kind: kindSeconds, Note: "0 keeps poolerd's, as tcp_keepidle"},
		{Section: "pgbouncer", Key: "tcp_user_timeout", To: "tcp_user_timeout", kind: kindMillis},
		{Section: "pgbouncer", Key: "dns_max_ttl", Note: adviceDNS},
		{Section: "pgbouncer", Key: "dns_nxdomain_ttl", Note: adviceDNS},
		{Section: "pgbouncer", Key: "dns_zone_check_period", Note: adviceDNS},
		{Section: "pgbouncer", Key: "resolv_conf", Note: adviceDNS},
		// Logging and the process.
		{Section: "pgbouncer", Key: "stats_period", To: "stats_period", kind: kindSeconds},
		{Section: "pgbouncer", Key: "pool_idle_timeout", To: "pool_idle_timeout", kind: kindSeconds},
		{Section: "pgbouncer", Key: "log_connections", To: "log_connections", kind: kindBool},
		{Section: "pgbouncer", Key: "log_disconnections", To: "log_disconnections", kind: kindBool},
		{Section: "pgbouncer", Key: "log_stats", To: "log_stats", kind: kindBool},
		{Section: "pgbouncer", Key: "log_pooler_errors", Note: "poolerd logs every refusal with its reason (log_disconnections): nothing to set"},
		{Section: "pgbouncer", Key: "verbose", To: "log_level", kind: kindSpecial, Note: "1 or more becomes `debug`"},
		{Section: "pgbouncer", Key: "logfile", To: "log_file", kind: kindPath, Note: "the log goes to the file as well as to stderr; SIGHUP opens it again"},
		{Section: "pgbouncer", Key: "syslog", To: "syslog", kind: kindBool},
		{Section: "pgbouncer", Key: "syslog_ident", To: "syslog_ident", kind: kindString, Default: "pgbouncer"},
		{Section: "pgbouncer", Key: "syslog_facility", To: "syslog_facility", kind: kindString},
		{Section: "pgbouncer", Key: "pidfile", To: "pidfile", kind: kindPath, Note: "a running process's pid in it refuses the start, as PgBouncer's"},
		{Section: "pgbouncer", Key: "user", Note: "poolerd does not switch users: start it as the user it should run as (systemd User=)"},
		{Section: "pgbouncer", Key: "conffile", Note: adviceNotNeeded},
		{Section: "pgbouncer", Key: "service_name", Note: adviceNotNeeded},
		{Section: "pgbouncer", Key: "job_name", Note: adviceNotNeeded},

		// [databases] connection-string parameters.
		{Section: "databases", Key: "host", To: "host", kind: kindSpecial, Note: "unset (PgBouncer's Unix socket) becomes /var/run/postgresql, or /tmp where that does not exist; a comma-separated list becomes `hosts` (each new server connection to the next, as PgBouncer's `load_balance_hosts`)"},
		{Section: "databases", Key: "port", To: "port", kind: kindSpecial, Note: "with a host list, one port for all or one per host"},
		{Section: "databases", Key: "dbname", To: "dbname", kind: kindString},
		{Section: "databases", Key: "user", To: "user", kind: kindString},
		{Section: "databases", Key: "password", To: "password", kind: kindString, Note: "without it the password of user in auth_file is used, as in PgBouncer"},
		{Section: "databases", Key: "auth_user", To: "auth_user", kind: kindString, Note: "this database's clients are looked up as this user"},
		{Section: "databases", Key: "auth_query", To: "auth_query", kind: kindString},
		{Section: "databases", Key: "auth_dbname", To: "auth_dbname", kind: kindString},
		{Section: "databases", Key: "pool_size", To: "max_size", kind: kindInt},
		{Section: "databases", Key: "min_pool_size", To: "min_size", kind: kindInt},
		{Section: "databases", Key: "reserve_pool", To: "reserve_pool_size", kind: kindInt, Note: "PgBouncer's name before 1.24"},
		{Section: "databases", Key: "reserve_pool_size", To: "reserve_pool_size", kind: kindInt},
		{Section: "databases", Key: "pool_mode", To: "pool_mode", kind: kindString},
		{Section: "databases", Key: "max_db_connections", To: "max_db_connections", kind: kindInt},
		{Section: "databases", Key: "max_db_client_connections", To: "max_db_client_connections", kind: kindInt},
		{Section: "databases", Key: "server_lifetime", To: "max_lifetime", kind: kindSeconds, Note: "0 is the global server_lifetime, as in PgBouncer"},
		{Section: "databases", Key: "query_wait_timeout", To: "checkout_timeout", kind: kindSeconds},
		{Section: "databases", Key: "client_encoding", To: "server_parameters", kind: kindServerParam, Note: adviceServerParam},
		{Section: "databases", Key: "datestyle", To: "server_parameters", kind: kindServerParam, Note: adviceServerParam},
		{Section: "databases", Key: "timezone", To: "server_parameters", kind: kindServerParam, Note: adviceServerParam},
		{Section: "databases", Key: "application_name", To: "server_parameters", kind: kindServerParam, Note: adviceServerParam},
		{Section: "databases", Key: "connect_query", To: "server_parameters", kind: kindConnectQuery, Note: "a query of SET statements only (`SET name = value; SET TIME ZONE …`) becomes the entry's `server_parameters`, sent as startup parameters of each server connection (which, unlike the query's SETs, RESET ALL and DISCARD ALL keep); any other query is reported: poolerd runs no query on new connections, set what it does in PostgreSQL (ALTER ROLE … SET, ALTER DATABASE … SET)"},
		{Section: "databases", Key: "load_balance_hosts", To: "load_balance_hosts", kind: kindSpecial, Note: "`round-robin` (PgBouncer's default with a host list) or `disable` (the first host that answers)"},

		// [users] parameters.
		{Section: "users", Key: "pool_mode", To: "pool_mode", kind: kindString},
		{Section: "users", Key: "pool_size", To: "max_size", kind: kindInt},
		{Section: "users", Key: "reserve_pool_size", To: "reserve_pool_size", kind: kindInt},
		{Section: "users", Key: "max_user_connections", To: "max_user_connections", kind: kindInt},
		{Section: "users", Key: "max_user_client_connections", To: "max_user_client_connections", kind: kindInt},
		{Section: "users", Key: "query_timeout", To: "query_timeout", kind: kindSeconds},
		{Section: "users", Key: "idle_transaction_timeout", To: "idle_transaction_timeout", kind: kindSeconds},
		{Section: "users", Key: "client_idle_timeout", To: "client_idle_timeout", kind: kindSeconds},
		{Section: "users", Key: "transaction_timeout", To: "transaction_timeout", kind: kindSeconds},
		{Section: "users", Key: "query_wait_timeout", To: "checkout_timeout", kind: kindSeconds},

		// [peers] entries: id = host=… port=… pool_size=….
		{Section: "peers", Key: "host", To: "host", kind: kindString, Note: "an address, or the directory of the peer's Unix socket"},
		{Section: "peers", Key: "port", To: "port", kind: kindInt, Note: "6432 if unset, as in PgBouncer"},
		{Section: "peers", Key: "pool_size", To: "pool_size", kind: kindInt, Note: "the cancel requests in flight to the peer at once; unset: default_pool_size"},
	}
}

// translatePeer turns a [peers] entry (id = connection string) into an
// entry of poolerd's peers.
func translatePeer(e entry, rules map[string]Rule, ignore func(string, entry, string)) (map[string]any, error) {
	id, err := strconv.Atoi(strings.TrimSpace(e.key))
	if err != nil || id < 1 || id > config.MaxPeerID {
		return nil, fmt.Errorf("%s: [peers] %s: a peer's key is its peer_id, a number from 1 to %d", e.where(), e.key, config.MaxPeerID)
	}
	params, err := parseConnString(e.value)
	if err != nil {
		return nil, fmt.Errorf("%s: [peers] %s: %w", e.where(), e.key, err)
	}
	out := map[string]any{"id": id}
	for _, p := range params {
		r, ok := rules[p.key]
		if !ok {
			return nil, fmt.Errorf("%s: [peers] %s: unrecognized connection parameter %s: a peer takes host, port and pool_size", e.where(), e.key, p.key)
		}
		v, err := convert(r.kind, p.value, e.file)
		if err != nil {
			return nil, fmt.Errorf("%s: [peers] %s: %s: %w", e.where(), e.key, p.key, err)
		}
		out[r.To] = v
	}
	if _, ok := out["host"]; !ok {
		return nil, fmt.Errorf("%s: [peers] %s: host was not provided for peer %d", e.where(), e.key, id)
	}
	return out, nil
}

// Ignored is a setting of the ini that poolerd does not honour. It names
// the setting, never its value (which may be a password).
type Ignored struct {
	// Setting is the key, with its section and entry for [databases] and
	// [users] ("[databases] app: client_encoding").
	Setting string
	// Where is file:line.
	Where string
	// Advice says what to do instead.
	Advice string
}

func (ig Ignored) String() string {
	return fmt.Sprintf("%s (%s): %s", ig.Setting, ig.Where, ig.Advice)
}

// Result is a translated pgbouncer.ini.
type Result struct {
	// Tree holds the poolerd keys, as a YAML file would: scalars, the
	// databases and users lists of maps.
	Tree map[string]any
	// Ignored lists the settings poolerd does not honour, in file order.
	Ignored []Ignored
	// Defaulted lists the poolerd keys set to PgBouncer's default because
	// the file does not set them and poolerd's own default differs.
	Defaulted []string
	// File is the ini's path.
	File string
}

// Load reads and translates the pgbouncer.ini at path.
func Load(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer.ini: %w", err)
	}
	return translate(path, data)
}

// Translate is config.Loader's hook: it translates data read from path
// when it is a pgbouncer.ini, and reports false for anything else.
func Translate(path string, data []byte) (map[string]any, bool, error) {
	if !Detect(data) {
		return nil, false, nil
	}
	r, err := translate(path, data)
	if err != nil {
		return nil, true, err
	}
	return r.Tree, true, nil
}

func rulesBySection() map[string]map[string]Rule {
	out := map[string]map[string]Rule{}
	for _, r := range Rules() {
		if out[r.Section] == nil {
			out[r.Section] = map[string]Rule{}
		}
		out[r.Section][r.Key] = r
	}
	return out
}

// translate does the work of Load on data read from path.
func translate(path string, data []byte) (*Result, error) {
	var entries []entry
	if _, err := parseFile(path, data, 0, "", &entries); err != nil {
		return nil, err
	}
	res := &Result{Tree: map[string]any{}, File: path}
	rules := rulesBySection()
	ignore := func(setting string, e entry, advice string) {
		res.Ignored = append(res.Ignored, Ignored{Setting: setting, Where: e.where(), Advice: advice})
	}
	set := map[string]entry{} // [pgbouncer] keys, last one wins as in PgBouncer
	var setOrder []string
	var dbs, users, peers []any
	for _, e := range entries {
		switch e.section {
		case "pgbouncer":
			if _, dup := set[e.key]; !dup {
				setOrder = append(setOrder, e.key)
			}
			set[e.key] = e
		case "databases":
			d, err := translateEntry(e, "databases", rules["databases"], ignore)
			if err != nil {
				return nil, err
			}
			dbs = append(dbs, d)
		case "users":
			u, err := translateEntry(e, "users", rules["users"], ignore)
			if err != nil {
				return nil, err
			}
			users = append(users, u)
		case "peers":
			p, err := translatePeer(e, rules["peers"], ignore)
			if err != nil {
				return nil, err
			}
			peers = append(peers, p)
		default:
			ignore(fmt.Sprintf("[%s] %s", e.section, e.key), e, "unknown section: PgBouncer reads [databases], [users], [peers] and [pgbouncer]")
		}
	}
	for _, key := range setOrder {
		e := set[key]
		r, ok := rules["pgbouncer"][key]
		if !ok {
			ignore(key, e, "unknown to poolerd (and to PgBouncer 1.25): check the spelling, or remove it")
			continue
		}
		if !r.Honoured() {
			ignore(key, e, r.Note)
			continue
		}
		if err := res.setPgbouncer(r, e, set, ignore); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", e.where(), key, err)
		}
	}
	// PgBouncer's defaults where poolerd's differ.
	for _, r := range rules["pgbouncer"] {
		if r.Default == "" || r.To == "" {
			continue
		}
		if _, ok := set[r.Key]; ok {
			continue
		}
		if _, ok := res.Tree[r.To]; ok {
			continue
		}
		e := entry{key: r.Key, value: r.Default, file: path}
		if err := res.setPgbouncer(r, e, set, ignore); err != nil {
			return nil, err
		}
		res.Defaulted = append(res.Defaulted, r.To)
	}
	// PgBouncer opens a pool's connections when its first client comes
	// (or min_pool_size of them): no warm-up connection per entry.
	res.Tree["warm_pools"] = false
	res.Defaulted = append(res.Defaulted, "warm_pools")
	// PgBouncer's log lines, for what was built on them (alerts on
	// "closing because:", pgbadger).
	res.Tree["log_format"] = "pgbouncer"
	res.Defaulted = append(res.Defaulted, "log_format")
	// PgBouncer keeps a request waiting (query_wait_timeout) while its
	// server cannot be reached: a restart of PostgreSQL is a pause, not
	// errors.
	res.Tree["on_server_unavailable"] = "wait"
	res.Defaulted = append(res.Defaulted, "on_server_unavailable")
	// PgBouncer's online restart (-R; poolerd's --takeover) goes through
	// the Unix socket directory: the hand-over socket lies beside the
	// listening one, so that --takeover needs nothing more than -R does.
	if dir, _ := res.Tree["unix_socket_dir"].(string); dir != "" {
		port := "6432"
		if p, ok := set["listen_port"]; ok {
			port = strings.TrimSpace(p.value)
		}
		res.Tree["takeover_socket"] = filepath.Join(dir, ".s.PGSQL."+port+".takeover")
		res.Defaulted = append(res.Defaulted, "takeover_socket")
	}
	slices.Sort(res.Defaulted)
	if len(dbs) > 0 {
		res.Tree["databases"] = dbs
	}
	if len(users) > 0 {
		res.Tree["users"] = users
	}
	if len(peers) > 0 {
		res.Tree["peers"] = peers
	}
	return res, nil
}

// setPgbouncer translates one [pgbouncer] setting into res.Tree.
func (res *Result) setPgbouncer(r Rule, e entry, set map[string]entry, ignore func(string, entry, string)) error {
	if r.kind != kindSpecial {
		v, err := convert(r.kind, e.value, e.file)
		if err != nil {
			return err
		}
		res.Tree[r.To] = v
		return nil
	}
	switch r.Key {
	case "listen_addr", "listen_port":
		if _, done := res.Tree["listen"]; done {
			return nil
		}
		port := "6432"
		if p, ok := set["listen_port"]; ok {
			if _, err := strconv.ParseUint(p.value, 10, 16); err != nil {
				return fmt.Errorf("listen_port %q is not a port number", p.value)
			}
			port = p.value
		}
		hosts := []string{"127.0.0.1"}
		a, ok := set["listen_addr"]
		switch {
		case !ok || strings.TrimSpace(a.value) == "":
			ignore("listen_addr (unset: Unix socket only)", e, adviceTCPAlso+"; poolerd listens on 127.0.0.1")
		default:
			hosts = hosts[:0]
			for _, h := range strings.Split(a.value, ",") {
				if h = strings.TrimSpace(h); h != "" {
					hosts = append(hosts, h)
				}
			}
		}
		var listen []string
		for _, h := range hosts {
			if h == "*" {
				h = ""
			}
			listen = append(listen, joinHostPort(h, port))
		}
		res.Tree["listen"] = strings.Join(listen, ",")
	case "auth_type":
		switch v := strings.ToLower(e.value); v {
		case config.AuthMD5, config.AuthSCRAM, config.AuthPlain, config.AuthCert, config.AuthTrust, config.AuthHBA, config.AuthLDAP, config.AuthPAM:
			res.Tree["auth_type"] = v
			_, file := set["auth_file"]
			_, user := set["auth_user"]
			if v == config.AuthTrust && !file && !user {
				// PgBouncer's trust admits only users of auth_file (or
				// auth_query's): with neither, no one.
				ignore("auth_type trust without auth_file", e, "PgBouncer admits no one (a user must exist in auth_file), poolerd every user name: set auth_file to admit only its users")
			}
		case config.AuthAny:
			res.Tree["auth_type"] = config.AuthAny
			ignore("auth_type any", e, "any user name is accepted without a password, as with any, but poolerd logs in to PostgreSQL as the client's user where a database entry sets no user")
		default:
			res.Tree["auth_type"] = config.AuthMD5
			ignore("auth_type "+v, e, "not supported: md5 is used (every client needs its password in auth_file)")
		}
	case "server_lifetime":
		kv, err := lifetime(e.value)
		if err != nil {
			return err
		}
		for _, s := range kv {
			res.Tree[s.Key] = s.Value
		}
	case "server_check_query":
		switch strings.TrimSpace(e.value) {
		case "":
			res.Tree["validation_interval"] = "0s"
			return nil
		case "<empty>":
			res.Tree["validation_query"] = "" // an empty query
			return nil
		}
		res.Tree["validation_query"] = e.value
	case "server_check_delay":
		if q, ok := set["server_check_query"]; ok && strings.TrimSpace(q.value) == "" {
			return nil // server_check_query = "" turns the check off, whatever the delay
		}
		v, err := checkDelay(e.value)
		if err != nil {
			return err
		}
		res.Tree["validation_interval"] = v
	case "server_login_retry":
		d, err := seconds(e.value)
		if err != nil {
			return err
		}
		if d <= 0 {
			ignore("server_login_retry 0", e, "poolerd always waits between attempts: reconnect_backoff_base (1s) doubling up to reconnect_backoff_max (16s)")
			return nil
		}
		res.Tree["reconnect_backoff_max"] = fmtDuration(d)
		if d < config.Defaults().ReconnectBackoffBase {
			res.Tree["reconnect_backoff_base"] = fmtDuration(d)
		}
	case "max_packet_size":
		n, err := strconv.ParseInt(e.value, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", e.value)
		}
		res.Tree["max_packet_size"] = int(min(max(n, 1024), 1<<30-1))
	case "verbose":
		n, err := strconv.Atoi(e.value)
		if err != nil {
			return fmt.Errorf("%q is not a number", e.value)
		}
		if n > 0 {
			res.Tree["log_level"] = "debug"
		}
	}
	return nil
}

// translateEntry turns one [databases] or [users] line into an entry of
// poolerd's databases or users list.
func translateEntry(e entry, section string, rules map[string]Rule, ignore func(string, entry, string)) (map[string]any, error) {
	params, err := parseConnString(e.value)
	if err != nil {
		return nil, fmt.Errorf("%s: [%s] %s: %w", e.where(), section, e.key, err)
	}
	out := map[string]any{"name": e.key}
	label := fmt.Sprintf("[%s] %s", section, e.key)
	special := map[string]string{}
	for _, p := range params {
		r, ok := rules[p.key]
		if !ok {
			ignore(label+": "+p.key, e, "unknown parameter: check the spelling, or remove it")
			continue
		}
		if !r.Honoured() {
			ignore(label+": "+p.key, e, r.Note)
			continue
		}
		if r.kind == kindSpecial { // host, port, load_balance_hosts: below
			special[p.key] = p.value
			continue
		}
		if r.kind == kindServerParam || r.kind == kindConnectQuery {
			set := map[string]string{p.key: p.value}
			if r.kind == kindConnectQuery {
				var ok bool
				if set, ok = connectQuerySettings(p.value); !ok {
					ignore(label+": "+p.key, e, "poolerd runs no query on new connections, and this one is not only SET statements (which it would send as server_parameters): set what it does in PostgreSQL with ALTER ROLE … SET or ALTER DATABASE … SET")
					continue
				}
			}
			sp, _ := out["server_parameters"].(map[string]any)
			if sp == nil {
				sp = map[string]any{}
				out["server_parameters"] = sp
			}
			for k, v := range set {
				sp[k] = v
			}
			continue
		}
		v, err := convert(r.kind, p.value, e.file)
		if err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", e.where(), label, p.key, err)
		}
		if p.key == "server_lifetime" && v == fmtDuration(0) {
			continue // PgBouncer: the global server_lifetime
		}
		out[r.To] = v
	}
	if section == "databases" {
		if err := hostsOf(special, out); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", e.where(), label, err)
		}
	}
	return out, nil
}

// hostsOf sets a [databases] entry's servers from its host, port and
// load_balance_hosts parameters (in special): one host becomes host and
// port; a list (host=a,b with one port for all or one each) becomes hosts,
// each "host:port", balanced round-robin unless load_balance_hosts says
// disable, as PgBouncer connects to them.
func hostsOf(special map[string]string, out map[string]any) error {
	var hosts, ports []string
	for _, h := range strings.Split(special["host"], ",") {
		hosts = append(hosts, strings.TrimSpace(h))
	}
	if p, ok := special["port"]; ok {
		for _, v := range strings.Split(p, ",") {
			v = strings.TrimSpace(v)
			if _, err := strconv.ParseUint(v, 10, 16); err != nil {
				return fmt.Errorf("port %q is not a port number", v)
			}
			ports = append(ports, v)
		}
	}
	if len(ports) > 1 && len(ports) != len(hosts) {
		return fmt.Errorf("%d ports for %d hosts: give one port for all, or one per host", len(ports), len(hosts))
	}
	lb, lbSet := special["load_balance_hosts"]
	switch lb = strings.TrimSpace(lb); {
	case !lbSet:
	case lb == "round-robin", lb == "disable":
		if len(hosts) > 1 {
			out["load_balance_hosts"] = lb
		}
	default:
		return fmt.Errorf("load_balance_hosts %q is not round-robin or disable", lb)
	}
	if len(hosts) == 1 {
		out["host"] = hosts[0]
		if out["host"] == "" {
			out["host"] = defaultSocketDir()
		}
		if len(ports) == 1 {
			n, _ := strconv.Atoi(ports[0])
			out["port"] = n
		}
		return nil
	}
	var list []any
	seen := map[string]bool{}
	for i, h := range hosts {
		if h == "" {
			return errors.New("an empty name in the host list")
		}
		port := "5432"
		switch {
		case len(ports) == 1:
			port = ports[0]
		case len(ports) > 1:
			port = ports[i]
		}
		// A server listed twice (PgBouncer takes host=a,a) is one
		// server: connections round-robin over the same one either way.
		if hp := strings.ToLower(joinHostPort(h, port)); !seen[hp] {
			seen[hp] = true
			list = append(list, joinHostPort(h, port))
		}
	}
	if len(list) == 1 {
		h, p, _ := net.SplitHostPort(list[0].(string))
		out["host"] = h
		out["port"], _ = strconv.Atoi(p)
		delete(out, "load_balance_hosts")
		return nil
	}
	out["hosts"] = list
	if !lbSet {
		out["load_balance_hosts"] = "round-robin"
	}
	return nil
}

// defaultSocketDir is where PgBouncer (as Debian builds it) looks for
// PostgreSQL's Unix socket when a database has no host.
func defaultSocketDir() string {
	if fi, err := os.Stat("/var/run/postgresql"); err == nil && fi.IsDir() {
		return "/var/run/postgresql"
	}
	return "/tmp"
}

// checkDelay translates PgBouncer's server_check_delay: seconds, where 0
// checks a connection at every reuse, which poolerd's validation_interval
// (0: never) says as 1ns.
func checkDelay(v string) (string, error) {
	d, err := seconds(v)
	if err != nil {
		return "", err
	}
	if d <= 0 {
		d = time.Nanosecond
	}
	return fmtDuration(d), nil
}

// Setting is one poolerd key and its value, as a YAML file writes it.
type Setting struct {
	Key   string
	Value any
}

// lifetime translates PgBouncer's server_lifetime: a number of seconds is
// max_lifetime (and no max_uses); 0, which makes PgBouncer close each
// connection when its client releases it, is max_uses 1.
func lifetime(v string) ([]Setting, error) {
	d, err := seconds(v)
	if err != nil {
		return nil, err
	}
	if d <= 0 {
		return []Setting{{"max_lifetime", fmtDuration(0)}, {"max_uses", 1}}, nil
	}
	return []Setting{{"max_lifetime", fmtDuration(d)}, {"max_uses", 0}}, nil
}

// resolvePath makes the file name v of the ini file absolute. A relative
// name is taken from the working directory, as PgBouncer takes it; if
// nothing of that name is there but the ini's directory has it, from there
// (an ini whose files sit beside it, started from elsewhere).
func resolvePath(v, file string) string {
	if v == "" || filepath.IsAbs(v) {
		return v
	}
	if _, err := os.Stat(v); err != nil {
		beside := filepath.Join(filepath.Dir(file), v)
		if _, err := os.Stat(beside); err == nil {
			return beside
		}
	}
	if abs, err := filepath.Abs(v); err == nil {
		return abs
	}
	return v
}

// convert turns a PgBouncer value into the value of a poolerd key.
func convert(k kind, v, file string) (any, error) {
	switch k {
	case kindString:
		return v, nil
	case kindPath:
		return resolvePath(v, file), nil
	case kindInt:
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", v)
		}
		return n, nil
	case kindSeconds:
		d, err := seconds(v)
		if err != nil {
			return nil, err
		}
		return fmtDuration(d), nil
	case kindMillis:
		ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
			return nil, fmt.Errorf("%q is not a time in milliseconds", v)
		}
		return fmtDuration(time.Duration(ms) * time.Millisecond), nil
	case kindBool:
		switch strings.ToLower(v) {
		case "1", "yes", "on", "true":
			return true, nil
		case "0", "no", "off", "false":
			return false, nil
		}
		return nil, fmt.Errorf("%q is not a boolean (0 or 1)", v)
	case kindList:
		list := []string{}
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				list = append(list, s)
			}
		}
		return list, nil
	}
	return nil, fmt.Errorf("no conversion")
}

// seconds parses a PgBouncer time: seconds, possibly fractional ("0.5");
// a value with a unit ("30s", "500ms") is accepted too.
func seconds(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || math.IsNaN(f) || f > math.MaxInt64/float64(time.Second) {
			return 0, fmt.Errorf("%q is not a time in seconds", v)
		}
		return time.Duration(math.Round(f * float64(time.Second))), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a time in seconds", v)
	}
	return d, nil
}

// fmtDuration writes d the way a person would in YAML: 10m, 30s, 1h, 500ms.
func fmtDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}
