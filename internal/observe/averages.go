// The stats_period averages of SHOW STATS and the periodic stats log line,
// computed from the proxy's cumulative totals.

package observe

import (
	"context"
	"maps"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/proxy"
)

// Averages are rates and mean durations over the last stats period, as
// SHOW STATS reports them. The type is declared in proxy, next to Totals,
// only because the admin console that shows them is still part of proxy,
// which cannot import observe; observe is what computes them.
type Averages struct {
	ServerAssignments, Xacts, Queries, Received, Sent uint64
	XactTimeUs, QueryTimeUs, WaitTimeUs               uint64
	ClientParses, ServerParses, Binds                 uint64
}

// Stats keeps each database's averages over the last stats_period, and
// logs the stats line every period when log_stats is on. Create it with
// NewStats and run Run; DatabaseAverages may be called concurrently.
type Stats struct {
	src Source
	log *zap.Logger

	mu      sync.Mutex
	prev    map[string]proxy.Totals // by database, at the last period's end
	avg     map[string]Averages
	prevAll proxy.Totals
	last    time.Time // when prev was taken
}

// NewStats returns the averages of src's databases, all zero until Run has
// completed a period; log is where the stats line goes.
func NewStats(src Source, log *zap.Logger) *Stats {
	return &Stats{src: src, log: log}
}

// DatabaseAverages returns the averages of the last stats period, by
// database.
func (s *Stats) DatabaseAverages() map[string]Averages {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.avg)
}

// Run computes the averages every stats_period and, with log_stats, logs a
// line like PgBouncer's. It returns when ctx ends.
func (s *Stats) Run(ctx context.Context) {
	period := s.src.Config().StatsPeriod
	t := time.NewTicker(period)
	defer t.Stop()
	s.tick(period, false)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cfg := s.src.Config()
			if p := cfg.StatsPeriod; p != period {
				period = p
				t.Reset(period)
			}
			s.tick(period, cfg.LogStats)
		}
	}
}

// tick ends a period: it takes the totals, computes the averages since the
// previous tick and, if log, logs them summed over all databases.
func (s *Stats) tick(period time.Duration, log bool) {
	cur := s.src.DatabaseTotals()
	var all proxy.Totals
	for _, t := range cur {
		all.Add(t)
	}
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
		s.log.Info("stats",
			zap.Uint64("xacts_per_s", a.Xacts), zap.Uint64("queries_per_s", a.Queries),
			zap.Uint64("in_bytes_per_s", a.Received), zap.Uint64("out_bytes_per_s", a.Sent),
			zap.Uint64("xact_us", a.XactTimeUs), zap.Uint64("query_us", a.QueryTimeUs),
			zap.Uint64("wait_us", a.WaitTimeUs), zap.Int("clients", s.src.ClientCount()))
	}
}

// averages are the rates and mean times between two totals period apart.
func averages(prev, cur proxy.Totals, period time.Duration) Averages {
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
