// Package console is poolerd's admin console: the virtual database
// "pgbouncer" (alias "poolerd"), compatible with PgBouncer 1.25's console so
// that its tools work unchanged (column names, order and types of every
// SHOW; command tags; error texts). It reads console commands, answers SHOW
// with result sets built from the proxy's snapshots, applies SET, and runs
// the control commands (PAUSE, RESUME, KILL, ...) through the proxy. See
// docs/observability.md and docs/admin-console-reference.md.
//
// It does not listen, read startup packets or authenticate: the proxy does
// that and hands each authenticated console login over (proxy.Console); the
// console decides who may use it (admin_users, stats_users) and sends the
// welcome. It keeps no state about pools, clients or servers and never
// locks or reads the proxy's internals: what it shows are the copies its
// Proxy returns, and what it changes it changes through Proxy's methods.
package console

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/observe"
	"github.com/poolerd/poolerd/internal/proxy"
)

// pgbouncerVersion is the PgBouncer release whose console poolerd mimics;
// tools read it from SHOW VERSION to pick a column layout.
const pgbouncerVersion = "1.25.2"

// adminDatabase is the name the console reports itself as.
const adminDatabase = "pgbouncer"

// Proxy is what the console reads and drives; *proxy.Server implements it.
// Every method is safe for concurrent use, and what it returns is the
// caller's (a copy, or a configuration that is never changed in place).
type Proxy interface {
	Snapshots
	Controls
}

// Snapshots is the read side: what SHOW shows.
type Snapshots interface {
	// Config is the running configuration (it changes with reloads).
	Config() *config.Config
	Version() string
	PauseState() proxy.PauseState
	Pools() []proxy.PoolStats
	// Clients lists the logged-in clients by ID, console connections
	// included; Servers the open server connections by pool and ID.
	Clients() []proxy.ClientInfo
	Servers() []proxy.ServerInfo
	// ClientCount counts the logged-in clients (console connections
	// included); LoginCount the connections still logging in.
	ClientCount() int
	LoginCount() int
	// DatabaseTotals are the traffic totals since start by database.
	DatabaseTotals() map[string]proxy.Totals
	// RateLimits lists every bucket of every rate-limit rule.
	RateLimits() []proxy.RateLimitInfo
	// PeerPools lists the peers (peer_id) with the cancel requests being
	// forwarded to each.
	PeerPools() []proxy.PeerPoolStats
}

// Averager gives the last stats period's rates and mean times by database
// (observe.Stats computes them).
type Averager interface {
	DatabaseAverages() map[string]observe.Averages
}

// Controls is the control side: what RELOAD, SET, SHUTDOWN and the
// database commands do (see proxy's control.go for each).
type Controls interface {
	Reload() error
	Set(key, value string) (notice string, err error)
	RequestShutdown(mode string)
	DatabaseKnown(database string) bool
	Pause(ctx context.Context, database string) error
	CancelPause(database string)
	Suspend() error
	Resume(database string) error
	SetDisabled(database string, disabled bool)
	Reconnect(database string)
	Kill(database string) error
	KillClient(id uint64) bool
	WaitClose(ctx context.Context, database string) error
}

// Console serves admin console connections for one proxy. It implements
// proxy.Console; create it with New.
type Console struct {
	p   Proxy
	avg Averager // nil: the averages show as zeros
	// sessions counts the logged-in console connections (the admin rows
	// of SHOW POOLS and SHOW DATABASES).
	sessions atomic.Int64
}

// New returns a console that reads and drives p, and shows avg's stats
// period averages (nil: zeros).
func New(p Proxy, avg Averager) *Console { return &Console{p: p, avg: avg} }

var _ proxy.Console = (*Console)(nil)

// The causes of a wait's end (see session.waitCancel).
var (
	errCancelRequest = errors.New("cancel request from the client")
	errTerminated    = errors.New("console connection ended")
)
