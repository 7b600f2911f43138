// Package config holds poolerd's typed configuration: defaults, loading from a
// YAML file, POOLERD_* environment variables and command-line flags (through
// viper), and validation with messages that say what to change.
package config

import (
	"fmt"
	"time"
)

// Pool modes.
const (
	// PoolSession holds a server connection for the client's whole session.
	PoolSession = "session"
	// PoolTransaction holds a server connection from the first message of a
	// transaction until ReadyForQuery reports the session idle.
	PoolTransaction = "transaction"
)

// Client authentication methods.
const (
	AuthSCRAM = "scram-sha-256"
	AuthMD5   = "md5"
	AuthTrust = "trust"
)

// Config is the whole configuration of one poolerd process. Field tags name
// the configuration keys; every top-level scalar key can also be set with the
// environment variable POOLERD_<KEY> (upper case).
type Config struct {
	// Listen is the address clients connect to.
	Listen string `mapstructure:"listen"`
	// HTTPListen is the address of the HTTP server (health, metrics); empty disables it.
	HTTPListen string `mapstructure:"http_listen"`
	// Upstream is the sidecar shorthand: a postgres:// URL whose host is the
	// upstream server for every database name a client asks for, and whose
	// user and password are both what poolerd logs in with and what clients
	// must present.
	Upstream string `mapstructure:"upstream"`

	// AuthType is how clients authenticate: scram-sha-256, md5 or trust.
	AuthType string `mapstructure:"auth_type"`
	// AuthFile is a PgBouncer-format userlist file ("user" "secret" per line).
	AuthFile string `mapstructure:"auth_file"`

	// Pool settings; databases and users may override them.
	PoolSettings `mapstructure:",squash"`

	// ServerConnectTimeout bounds dialing and logging in to PostgreSQL.
	ServerConnectTimeout time.Duration `mapstructure:"server_connect_timeout"`
	// ClientLoginTimeout bounds a client's startup and authentication.
	ClientLoginTimeout time.Duration `mapstructure:"client_login_timeout"`
	// ShutdownTimeout is how long SIGTERM waits for transactions to finish.
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout"`

	// LogFormat is console or json.
	LogFormat string `mapstructure:"log_format"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `mapstructure:"log_level"`
	// LogConnections logs every successful client login.
	LogConnections bool `mapstructure:"log_connections"`
	// LogDisconnections logs every client disconnection with its reason.
	LogDisconnections bool `mapstructure:"log_disconnections"`

	// Databases lists the databases clients may connect to. A database named
	// "*" is the fallback for names not listed.
	Databases []Database `mapstructure:"databases"`
	// Users lists per-user passwords and settings.
	Users []User `mapstructure:"users"`

	// upstream is Upstream parsed during validation.
	upstream *UpstreamURL
	// secrets are the client secrets, from users and auth_file, by user name.
	secrets map[string]userSecret
}

// PoolSettings are the settings that can be given globally and overridden
// per database and per user (see Overrides).
type PoolSettings struct {
	// PoolMode is session or transaction.
	PoolMode string `mapstructure:"pool_mode"`
	// MaxSize is the most server connections one (database, user) pool opens.
	MaxSize int `mapstructure:"max_size"`
	// MinSize is how many server connections a pool keeps open.
	MinSize int `mapstructure:"min_size"`
	// CheckoutTimeout is how long a client waits in the queue for a server
	// connection before it gets SQLSTATE 53300.
	CheckoutTimeout time.Duration `mapstructure:"checkout_timeout"`
	// ServerResetQuery runs before a server connection used in session mode
	// is given to another client.
	ServerResetQuery string `mapstructure:"server_reset_query"`
}

// Database is one entry of the databases list.
type Database struct {
	// Name is the database name clients ask for (case-sensitive); "*" matches any.
	Name string `mapstructure:"name"`
	// Host is the PostgreSQL host name, IP address, or a directory holding
	// its Unix socket (starting with "/").
	Host string `mapstructure:"host"`
	// Port is PostgreSQL's port.
	Port int `mapstructure:"port"`
	// DBName is the database name on the server; empty means Name (for "*",
	// the name the client asked for).
	DBName string `mapstructure:"dbname"`
	// User, when set, is the role every client of this database is logged in
	// to PostgreSQL as (one pool for all clients), with Password.
	User string `mapstructure:"user"`
	// Password is User's password (plain text, md5 or SCRAM secret).
	Password string `mapstructure:"password"`

	Overrides `mapstructure:",squash"`
}

// User is one entry of the users list.
type User struct {
	// Name is the role name (case-sensitive).
	Name string `mapstructure:"name"`
	// Password is the secret clients must prove and poolerd logs in with:
	// plain text, "md5..." or "SCRAM-SHA-256$...".
	Password string `mapstructure:"password"`

	Overrides `mapstructure:",squash"`
}

// Overrides are the pool settings a database or user entry may set; nil
// inherits. A user's setting wins over its database's, which wins over the
// global one (PgBouncer's order).
type Overrides struct {
	PoolMode         *string        `mapstructure:"pool_mode"`
	MaxSize          *int           `mapstructure:"max_size"`
	MinSize          *int           `mapstructure:"min_size"`
	CheckoutTimeout  *time.Duration `mapstructure:"checkout_timeout"`
	ServerResetQuery *string        `mapstructure:"server_reset_query"`
}

// Defaults returns the configuration every key starts from.
func Defaults() Config {
	return Config{
		Listen:     "127.0.0.1:6432",
		HTTPListen: "0.0.0.0:9930",
		AuthType:   AuthSCRAM,
		PoolSettings: PoolSettings{
			PoolMode:         PoolTransaction,
			MaxSize:          20,
			MinSize:          0,
			CheckoutTimeout:  30 * time.Second,
			ServerResetQuery: "DISCARD ALL",
		},
		ServerConnectTimeout: 15 * time.Second,
		ClientLoginTimeout:   60 * time.Second,
		ShutdownTimeout:      30 * time.Second,
		LogFormat:            "console",
		LogLevel:             "info",
		LogConnections:       true,
		LogDisconnections:    true,
	}
}

// Effective applies overrides to base in order; a later override wins.
func (base PoolSettings) Effective(over ...Overrides) PoolSettings {
	out := base
	for _, o := range over {
		if o.PoolMode != nil {
			out.PoolMode = *o.PoolMode
		}
		if o.MaxSize != nil {
			out.MaxSize = *o.MaxSize
		}
		if o.MinSize != nil {
			out.MinSize = *o.MinSize
		}
		if o.CheckoutTimeout != nil {
			out.CheckoutTimeout = *o.CheckoutTimeout
		}
		if o.ServerResetQuery != nil {
			out.ServerResetQuery = *o.ServerResetQuery
		}
	}
	return out
}

// String describes a database entry without its password.
func (d Database) String() string {
	return fmt.Sprintf("database %q (host %s port %d)", d.Name, d.Host, d.Port)
}
