// Read-only snapshots of the server's statistics (copies; nothing returned
// aliases the proxy's state), for internal/observe and the admin console.

package proxy

import (
	"time"

	"github.com/poolerd/poolerd/internal/pool"
)

// PoolStats is a snapshot of one pool for metrics, the health endpoint,
// the admin console and tests.
type PoolStats struct {
	Database, User string
	Mode           string
	// ServerUser is the role its server connections log in as.
	ServerUser string
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
		Stats: st, SessionTimeouts: make(map[string]uint64, numTimeoutKinds), Leaks: p.leaks.Load(),
		Clients: p.clients.Load(), Traffic: p.traffic(st),
		PreparedCacheHits: p.ctr.cacheHits.Load(), PreparedEvictions: p.ctr.stmtEvictions.Load(),
		Pins: make([]PinStats, len(pinReasons)), ClientErrors: p.ctr.errorCounts()}
	for k := range numTimeoutKinds {
		ps.SessionTimeouts[k.String()] = p.timeoutCounts[k].Load()
	}
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
	return len(srv.sessions) + len(srv.consoles)
}

// ParkedClients returns the number of idle client sessions held without a
// goroutine.
func (srv *Server) ParkedClients() int { return srv.parker.parkedCount() }

// LoginTimeouts counts clients dropped by client_login_timeout.
func (srv *Server) LoginTimeouts() uint64 { return srv.loginTimeouts.Load() }

// AuthFailures counts client logins refused for a wrong password or an
// unknown user (28P01).
func (srv *Server) AuthFailures() uint64 { return srv.authFailures.Load() }

// ShuttingDown reports whether the server is shutting down (a signal, or
// SHUTDOWN on the console).
func (srv *Server) ShuttingDown() bool { return srv.shuttingDown() }

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
