// Snapshots: plain copies of the proxy's state, built here
// under the proxy's own locks, that the caller owns, for the admin console
// (internal/console) and observability (internal/observe). Each one is
// consistent in itself; two snapshots taken one after the other may
// disagree a little. Nothing outside this package locks the proxy's
// internals.

package proxy

import (
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/reactor"
)

// ClientInfo describes one logged-in client: a pool's client or an admin
// console connection.
type ClientInfo struct {
	// ID numbers the connection among clients and server connections.
	ID             uint64
	User, Database string
	// Console: an admin console connection (it holds no pool).
	Console bool
	// Replication is "physical" or "logical" for a replication connection
	// (replication.go), "" otherwise.
	Replication           string
	RemoteAddr, LocalAddr net.Addr
	ConnectedAt           time.Time
	// LastRequest is when the client last sent a request; zero if never.
	LastRequest time.Time
	// Ptr identifies the connection as PgBouncer's ptr column does (%p);
	// Link is the Ptr of the server connection it holds, "" if none.
	Ptr, Link string
	// Waiting: a request waits for a server connection, for Wait.
	Waiting bool
	Wait    time.Duration
	AppName string
	// PreparedStatements counts the client's mapped prepared statements;
	// Pinned is why it keeps its server connection ("" if it does not),
	// since PinnedFor.
	PreparedStatements int
	Pinned             string
	PinnedFor          time.Duration
	// ServerPID is the backend process of the server connection it holds
	// (0 if none).
	ServerPID uint32
}

// ServerInfo describes one open server connection.
type ServerInfo struct {
	pool.ConnInfo
	// Database and User name its pool; ServerUser is the role it logged
	// in as.
	Database, User, ServerUser string
	RemoteAddr, LocalAddr      net.Addr
	// PID is the backend's process id.
	PID uint32
	// Ptr identifies the connection (%p); Link is the Ptr of the client
	// holding it, "" if none, and AppName that client's application_name.
	Ptr, Link, AppName string
	// Cancelling: a cancel request for its backend is in flight.
	Cancelling bool
	// TLS is the connection's TLS version and cipher
	// ("TLSv1.3/TLS_AES_128_GCM_SHA256"), "" for plain TCP.
	TLS string
	// Replication is "physical" or "logical" for the server side of a
	// replication connection, "" otherwise.
	Replication string
}

// DatabaseState is what the console set for one database.
type DatabaseState struct {
	Paused   bool // PAUSE db, or KILL db until RESUME db
	Disabled bool // DISABLE db
}

// PauseState is the global pause and the databases the console paused,
// killed or disabled.
type PauseState struct {
	Paused    bool
	Suspended bool // SUSPEND until RESUME
	Databases map[string]DatabaseState
}

func ptr(v any) string { return fmt.Sprintf("%p", v) }

// Clients returns every logged-in client, console connections included,
// by ID.
func (srv *Server) Clients() []ClientInfo {
	srv.mu.Lock()
	sessions := make([]*session, 0, len(srv.sessions))
	for _, s := range srv.sessions {
		sessions = append(sessions, s)
	}
	consoles := make([]*ConsoleConn, 0, len(srv.consoles))
	for _, c := range srv.consoles {
		consoles = append(consoles, c)
	}
	srv.mu.Unlock()
	out := make([]ClientInfo, 0, len(sessions)+len(consoles))
	for _, s := range sessions {
		ci := ClientInfo{ID: s.id, User: s.user, Database: s.database, RemoteAddr: s.conn.RemoteAddr(),
			LocalAddr: s.conn.LocalAddr(), ConnectedAt: s.connectedAt, LastRequest: srv.wallTime(s.lastReq.Load()),
			Ptr: ptr(s), AppName: s.appName(), PreparedStatements: s.preparedCount(), Pinned: s.pinnedReason()}
		if since := s.pinnedSince.Load(); ci.Pinned != "" && since != 0 {
			ci.PinnedFor = time.Duration(srv.nanotime() - since)
		}
		if sc := s.server.Load(); sc != nil {
			ci.Link, ci.ServerPID = ptr(sc), sc.PID
		} else if since := s.waitSince.Load(); since != 0 {
			ci.Waiting, ci.Wait = true, time.Duration(srv.nanotime()-since)
		}
		out = append(out, ci)
	}
	for _, c := range consoles {
		out = append(out, ClientInfo{ID: c.ID, User: c.User, Database: c.Database, Console: true,
			RemoteAddr: c.Conn.RemoteAddr(), LocalAddr: c.Conn.LocalAddr(), ConnectedAt: c.ConnectedAt,
			LastRequest: srv.wallTime(c.lastReq.Load()), Ptr: ptr(c)})
	}
	for _, p := range srv.replPairs("") {
		out = append(out, ClientInfo{ID: p.id, User: p.user, Database: p.database, Replication: p.mode.String(),
			RemoteAddr: p.client.RemoteAddr(), LocalAddr: p.client.LocalAddr(), ConnectedAt: p.connectedAt,
			Ptr: ptr(p), Link: ptr(p.server), AppName: p.appName, ServerPID: p.server.PID})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Servers returns every open server connection, by pool (database, user)
// and ID.
func (srv *Server) Servers() []ServerInfo {
	var out []ServerInfo
	for _, p := range srv.sortedPools() {
		route := p.route()
		conns := p.pool.All()
		sort.Slice(conns, func(i, j int) bool { return conns[i].ID() < conns[j].ID() })
		for _, sc := range conns {
			si := ServerInfo{ConnInfo: p.pool.Info(sc), Database: p.key.database, User: p.key.user,
				ServerUser: route.ServerUser, RemoteAddr: sc.Conn.RemoteAddr(), LocalAddr: sc.Conn.LocalAddr(),
				PID: sc.PID, Ptr: ptr(sc), TLS: backend.TLSState(sc.Conn.Conn)}
			sc.mu.Lock()
			si.Cancelling = sc.cancelling
			sc.mu.Unlock()
			if own := sc.owner.Load(); own != nil {
				si.Link, si.AppName = ptr(own), own.appName()
			}
			out = append(out, si)
		}
	}
	for _, p := range srv.replPairs("") {
		out = append(out, ServerInfo{ConnInfo: pool.ConnInfo{ID: p.serverID, Created: p.connectedAt, LastUsed: p.connectedAt},
			Database: p.database, User: p.user, ServerUser: p.serverUser, RemoteAddr: p.server.RemoteAddr(),
			LocalAddr: p.server.LocalAddr(), PID: p.server.PID, Ptr: ptr(p.server), Link: ptr(p), AppName: p.appName,
			TLS: backend.TLSState(p.server.Conn), Replication: p.mode.String()})
	}
	return out
}

// PauseState returns the global pause and the databases' console flags.
func (srv *Server) PauseState() PauseState {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	ps := PauseState{Paused: srv.paused, Suspended: srv.suspended, Databases: make(map[string]DatabaseState, len(srv.dbs))}
	for name, st := range srv.dbs {
		ps.Databases[name] = DatabaseState{Paused: st.paused, Disabled: st.disabled}
	}
	return ps
}

// LoginCount returns the number of connections still logging in.
func (srv *Server) LoginCount() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return len(srv.logins)
}

// sortedPools returns the pools by database and user, for stable output.
func (srv *Server) sortedPools() []*dbPool {
	ps := srv.poolList()
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].key.database != ps[j].key.database {
			return ps[i].key.database < ps[j].key.database
		}
		return ps[i].key.user < ps[j].key.user
	})
	return ps
}

// wallTime converts the session clock to wall time (zero stays zero).
func (srv *Server) wallTime(nanotime int64) time.Time {
	if nanotime == 0 {
		return time.Time{}
	}
	return srv.started.Add(time.Duration(nanotime))
}

// pinnedReason is why a transaction-mode client keeps its server
// connection ("" when it does not).
func (s *session) pinnedReason() string {
	if r := s.pinReason.Load(); r != nil {
		return *r
	}
	return ""
}

func (s *session) appName() string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.params["application_name"]
}

// PoolStats is a snapshot of one pool for metrics, the health endpoint,
// the admin console and tests.
type PoolStats struct {
	Database, User string
	Mode           string
	// ServerUser is the role its server connections log in as.
	ServerUser string
	// TLSConnections counts its open server connections that use TLS,
	// by TLS version ("TLSv1.3").
	TLSConnections map[string]int
	// Hosts are its servers (one, or the entry's hosts), with their role
	// and connections.
	Hosts []HostInfo
	pool.Stats
	// SessionTimeouts counts sessions' timeouts by kind: query,
	// transaction, idle_transaction, client_idle, server_response (the
	// checkout timeout is pool.Stats.Timeouts).
	SessionTimeouts map[string]uint64
	// Leaks counts leak warnings.
	Leaks uint64
	// Clients is the number of clients logged in to this pool.
	Clients int64
	// Traffic is what the relay counted for this pool since it was
	// created, in SHOW STATS units.
	Traffic Totals
	// PreparedCacheHits counts clients' Parse of a named statement already
	// prepared on their server connection; PreparedEvictions counts
	// statements closed on a server connection to stay within
	// max_prepared_statements.
	PreparedCacheHits, PreparedEvictions uint64
	// Pins are the pool's clients pinned to their server connection by
	// session state, one entry per reason, always in the same order.
	Pins []PinStats
	// ClientErrors counts the errors sent to clients by SQLSTATE class
	// (the code's first two characters).
	ClientErrors map[string]uint64
}

// PinStats are a pool's clients pinned for one reason.
type PinStats struct {
	Reason string // a sqlscan.Pin* constant
	Now    int64  // clients pinned at this moment
	Total  uint64 // pins since the pool was created
	// Unpins counts clients unpinned because their session state was
	// found gone (not counting those that left pinned).
	Unpins uint64
	// Oldest is how long the client pinned longest for this reason has
	// been pinned; 0 when none is.
	Oldest time.Duration
}

func (p *dbPool) snapshot(oldest *[len(pinReasons)]time.Duration) PoolStats {
	st := p.pool.Stats()
	route := p.route()
	ps := PoolStats{Database: p.key.database, User: p.key.user, Mode: route.Settings.PoolMode, ServerUser: route.ServerUser,
		TLSConnections: p.tlsConnections(), Hosts: p.hosts.snapshot(route, p.idleByHost()),
		Stats: st, SessionTimeouts: make(map[string]uint64, numTimeoutKinds), Leaks: p.leaks.Load(),
		Clients: p.clients.Load(), Traffic: p.traffic(st),
		PreparedCacheHits: p.ctr.cacheHits.Load(), PreparedEvictions: p.ctr.stmtEvictions.Load(),
		Pins: make([]PinStats, len(pinReasons)), ClientErrors: p.ctr.errorCounts()}
	for k := range numTimeoutKinds {
		ps.SessionTimeouts[k.String()] = p.timeoutCounts[k].Load()
	}
	// The pool counts a checkout that ran out of lease_timeout as a
	// checkout timeout too: it is counted apart (lease_checkout).
	ps.Timeouts -= min(ps.Timeouts, ps.SessionTimeouts[timeoutLeaseCheckout.String()])
	for i, r := range pinReasons {
		ps.Pins[i] = PinStats{Reason: r, Now: p.ctr.pinnedNow[i].Load(), Total: p.ctr.pinsTotal[i].Load(),
			Unpins: p.ctr.unpinsTotal[i].Load()}
		if oldest != nil {
			ps.Pins[i].Oldest = oldest[i]
		}
	}
	return ps
}

// Pools returns a snapshot of every pool.
func (srv *Server) Pools() []PoolStats {
	return srv.snapshots(srv.poolList())
}

// snapshots returns a snapshot of each of pools.
func (srv *Server) snapshots(pools []*dbPool) []PoolStats {
	oldest := srv.oldestPins()
	out := make([]PoolStats, 0, len(pools))
	for _, p := range pools {
		out = append(out, p.snapshot(oldest[p]))
	}
	return out
}

// oldestPins finds, per pool and pin reason, how long its longest-pinned
// client has been pinned.
func (srv *Server) oldestPins() map[*dbPool]*[len(pinReasons)]time.Duration {
	now := srv.nanotime()
	out := map[*dbPool]*[len(pinReasons)]time.Duration{}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, s := range srv.sessions {
		r, since := s.pinReason.Load(), s.pinnedSince.Load()
		if r == nil || since == 0 || s.dbp == nil {
			continue
		}
		i := pinIndex(*r)
		if i < 0 {
			continue
		}
		ages := out[s.dbp]
		if ages == nil {
			ages = new([len(pinReasons)]time.Duration)
			out[s.dbp] = ages
		}
		ages[i] = max(ages[i], time.Duration(now-since))
	}
	return out
}

// ConfiguredPools returns a snapshot of the pools the configuration names
// completely (see Warm), in the configuration's order: the upstream URL's
// first.
func (srv *Server) ConfiguredPools() []PoolStats {
	srv.mu.Lock()
	warm := append([]*dbPool(nil), srv.warm...)
	srv.mu.Unlock()
	return srv.snapshots(warm)
}

// ClientCount returns the number of logged-in clients, console
// connections included.
func (srv *Server) ClientCount() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return len(srv.sessions) + len(srv.consoles) + len(srv.repl)
}

// ParkedClients returns the number of idle client sessions held without a
// goroutine: parked, or on an event loop holding no server connection.
func (srv *Server) ParkedClients() int {
	return srv.parker.parkedCount() + srv.engine.CountIdle(idleSession)
}

// idleSession says whether a client socket on a loop is a session that
// holds no server connection (ParkedClients).
func idleSession(h reactor.Handler) bool {
	s, ok := h.(*session)
	return ok && s.server.Load() == nil
}

// LoginTimeouts counts clients dropped by client_login_timeout.
func (srv *Server) LoginTimeouts() uint64 { return srv.loginTimeouts.Load() }

// AuthFailures counts client logins refused for a wrong password or an
// unknown user (28P01).
func (srv *Server) AuthFailures() uint64 { return srv.authFailures.Load() }

// ShuttingDown reports whether the server is shutting down (a signal, or
// SHUTDOWN on the console), or draining (SHUTDOWN WAIT_FOR_CLIENTS).
func (srv *Server) ShuttingDown() bool {
	if srv.shuttingDown() {
		return true
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.draining
}

// Paused reports whether every database is paused (PAUSE without a
// database on the console; RESUME ends it).
func (srv *Server) Paused() bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.paused
}

// Totals are a database's or pool's cumulative traffic, in PgBouncer's
// SHOW STATS units (microseconds, bytes).
type Totals struct {
	ServerAssignments uint64
	Xacts, Queries    uint64
	Received, Sent    uint64
	XactTimeUs        uint64
	QueryTimeUs       uint64
	WaitTimeUs        uint64
	// Prepared statements in transaction and statement mode: Parse from
	// clients, Parse sent to PostgreSQL, Bind from clients.
	ClientParses, ServerParses, Binds uint64
	// ClientLogins counts successful client logins.
	ClientLogins uint64
}

// Add adds o to t.
func (t *Totals) Add(o Totals) {
	t.ClientParses += o.ClientParses
	t.ServerParses += o.ServerParses
	t.Binds += o.Binds
	t.ServerAssignments += o.ServerAssignments
	t.Xacts += o.Xacts
	t.Queries += o.Queries
	t.Received += o.Received
	t.Sent += o.Sent
	t.XactTimeUs += o.XactTimeUs
	t.QueryTimeUs += o.QueryTimeUs
	t.WaitTimeUs += o.WaitTimeUs
	t.ClientLogins += o.ClientLogins
}

// totals reads a pool's counters.
func (d *dbPool) totals() Totals { return d.traffic(d.pool.Stats()) }

// traffic reads a pool's counters, with st its pool's statistics.
func (d *dbPool) traffic(st pool.Stats) Totals {
	return Totals{
		ServerAssignments: st.Acquisitions,
		Xacts:             d.ctr.xacts.Load(),
		Queries:           d.ctr.queries.Load(),
		Received:          d.ctr.received.Load(),
		Sent:              d.ctr.sent.Load(),
		XactTimeUs:        d.ctr.xactNanos.Load() / 1000,
		QueryTimeUs:       d.ctr.queryNano.Load() / 1000,
		ClientParses:      d.ctr.clientParses.Load(),
		ServerParses:      d.ctr.serverParses.Load(),
		Binds:             d.ctr.binds.Load(),
		ClientLogins:      d.ctr.logins.Load(),
		WaitTimeUs:        uint64(st.WaitTotal / time.Microsecond),
	}
}

// DatabaseTotals sums the totals of each database's pools.
func (srv *Server) DatabaseTotals() map[string]Totals {
	out := map[string]Totals{}
	for _, p := range srv.poolList() {
		t := out[p.key.database]
		t.Add(p.totals())
		out[p.key.database] = t
	}
	return out
}

// tlsConnections counts the pool's open server connections by TLS version.
func (p *dbPool) tlsConnections() map[string]int {
	out := map[string]int{}
	for _, sc := range p.pool.All() {
		if st := backend.TLSState(sc.Conn.Conn); st != "" {
			version, _, _ := strings.Cut(st, "/")
			out[version]++
		}
	}
	return out
}
