// Read-only snapshots of the server's statistics (copies; nothing returned
// aliases the proxy's state), for internal/observe and the admin console.

package proxy

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/pool"
)

// PoolStats is a snapshot of one pool for metrics, the health endpoint,
// the admin console and tests.
type PoolStats struct {
	Database, User string
	Mode           string
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
}

func (p *dbPool) snapshot() PoolStats {
	st := p.pool.Stats()
	ps := PoolStats{Database: p.key.database, User: p.key.user, Mode: p.route().Settings.PoolMode,
		Stats: st, SessionTimeouts: make(map[string]uint64, numTimeoutKinds), Leaks: p.leaks.Load(),
		Clients: p.clients.Load(), Traffic: p.traffic(st),
		PreparedCacheHits: p.ctr.cacheHits.Load(), PreparedEvictions: p.ctr.stmtEvictions.Load(),
		Pins: make([]PinStats, len(pinReasons)), ClientErrors: p.ctr.errorCounts()}
	for k := range numTimeoutKinds {
		ps.SessionTimeouts[k.String()] = p.timeouts[k].Load()
	}
	for i, r := range pinReasons {
		ps.Pins[i] = PinStats{Reason: r, Now: p.ctr.pinnedNow[i].Load(), Total: p.ctr.pinsTotal[i].Load()}
	}
	return ps
}

// Pools returns a snapshot of every pool.
func (srv *Server) Pools() []PoolStats {
	pools := srv.poolList()
	out := make([]PoolStats, 0, len(pools))
	for _, p := range pools {
		out = append(out, p.snapshot())
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
	out := make([]PoolStats, 0, len(warm))
	for _, p := range warm {
		out = append(out, p.snapshot())
	}
	return out
}

// ClientCount returns the number of logged-in clients.
func (srv *Server) ClientCount() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return len(srv.sessions)
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

func (t *Totals) add(o Totals) {
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

// Averages are rates and mean durations over the last stats period, as
// SHOW STATS reports them: counts and bytes per second, times in
// microseconds per transaction, query and assignment.
type Averages struct {
	ServerAssignments, Xacts, Queries, Received, Sent uint64
	XactTimeUs, QueryTimeUs, WaitTimeUs               uint64
	ClientParses, ServerParses, Binds                 uint64
}

func averages(prev, cur Totals, period time.Duration) Averages {
	sec := period.Seconds()
	if sec <= 0 {
		return Averages{}
	}
	per := func(a, b uint64) uint64 {
		if b < a {
			return 0
		}
		return uint64(float64(b-a) / sec)
	}
	mean := func(t0, t1, n0, n1 uint64) uint64 {
		if n1 <= n0 || t1 < t0 {
			return 0
		}
		return (t1 - t0) / (n1 - n0)
	}
	return Averages{
		ServerAssignments: per(prev.ServerAssignments, cur.ServerAssignments),
		Xacts:             per(prev.Xacts, cur.Xacts),
		Queries:           per(prev.Queries, cur.Queries),
		Received:          per(prev.Received, cur.Received),
		Sent:              per(prev.Sent, cur.Sent),
		XactTimeUs:        mean(prev.XactTimeUs, cur.XactTimeUs, prev.Xacts, cur.Xacts),
		QueryTimeUs:       mean(prev.QueryTimeUs, cur.QueryTimeUs, prev.Queries, cur.Queries),
		WaitTimeUs:        mean(prev.WaitTimeUs, cur.WaitTimeUs, prev.ServerAssignments, cur.ServerAssignments),
		ClientParses:      per(prev.ClientParses, cur.ClientParses),
		ServerParses:      per(prev.ServerParses, cur.ServerParses),
		Binds:             per(prev.Binds, cur.Binds),
	}
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

// statsState holds the per-database averages of the last period.
type statsState struct {
	mu      sync.Mutex
	prev    map[string]Totals // by database, at the last period's end
	avg     map[string]Averages
	prevAll Totals
	last    time.Time // when prev was taken
}

// DatabaseTotals sums the totals of each database's pools.
func (srv *Server) DatabaseTotals() map[string]Totals {
	out := map[string]Totals{}
	for _, p := range srv.poolList() {
		t := out[p.key.database]
		t.add(p.totals())
		out[p.key.database] = t
	}
	return out
}

// DatabaseAverages returns the averages of the last stats period.
func (srv *Server) DatabaseAverages() map[string]Averages {
	srv.stats.mu.Lock()
	defer srv.stats.mu.Unlock()
	out := make(map[string]Averages, len(srv.stats.avg))
	for k, v := range srv.stats.avg {
		out[k] = v
	}
	return out
}

// RunStats computes the averages every stats_period and, with log_stats,
// logs a line like PgBouncer's. It returns when ctx ends.
func (srv *Server) RunStats(ctx context.Context) {
	period := srv.cfg().StatsPeriod
	t := time.NewTicker(period)
	defer t.Stop()
	srv.statsTick(period, false)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if p := srv.cfg().StatsPeriod; p != period {
				period = p
				t.Reset(period)
			}
			srv.statsTick(period, srv.cfg().LogStats)
		}
	}
}

func (srv *Server) statsTick(period time.Duration, log bool) {
	cur := srv.DatabaseTotals()
	var all Totals
	for _, t := range cur {
		all.add(t)
	}
	s := &srv.stats
	s.mu.Lock()
	now := time.Now()
	if !s.last.IsZero() {
		period = now.Sub(s.last) // what really passed (stats_period may have changed)
	}
	s.last = now
	avg := make(map[string]Averages, len(cur))
	for db, t := range cur {
		avg[db] = averages(s.prev[db], t, period)
	}
	s.avg, s.prev = avg, cur
	a := averages(s.prevAll, all, period)
	s.prevAll = all
	s.mu.Unlock()
	if log {
		srv.log.Info("stats",
			zap.Uint64("xacts_per_s", a.Xacts), zap.Uint64("queries_per_s", a.Queries),
			zap.Uint64("in_bytes_per_s", a.Received), zap.Uint64("out_bytes_per_s", a.Sent),
			zap.Uint64("xact_us", a.XactTimeUs), zap.Uint64("query_us", a.QueryTimeUs),
			zap.Uint64("wait_us", a.WaitTimeUs), zap.Int("clients", srv.ClientCount()))
	}
}
