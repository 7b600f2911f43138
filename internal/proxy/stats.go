package proxy

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

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
func (d *dbPool) totals() Totals {
	st := d.pool.Stats()
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
