package proxy

import (
	"time"

	"go.uber.org/zap"
)

// reapEvery is how often the idle-pool reaper looks at the pools while
// pool_idle_timeout is set.
const reapEvery = time.Second

// scheduleReap arms the idle-pool reaper's next round, reapEvery from now,
// if pool_idle_timeout is set and no round is due yet; each round arms the
// next while it stays set, and a reload that sets it arms the first. A
// timer, not a goroutine: nothing runs while the setting is 0.
func (srv *Server) scheduleReap() {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.reapArmed || srv.cfg().PoolIdleTimeout <= 0 || srv.ctx.Err() != nil {
		return
	}
	srv.reapArmed = true
	time.AfterFunc(reapEvery, func() {
		srv.mu.Lock()
		srv.reapArmed = false
		srv.mu.Unlock()
		srv.reapIdlePools(time.Now())
		srv.scheduleReap()
	})
}

// reapIdlePools removes every pool that has had no client, no login or
// hand-over under way, no server connection (open, opening or lent) and no
// queued checkout for longer than pool_idle_timeout, as PgBouncer's
// pool_idle_timeout frees a database/user pair's pool: its SHOW POOLS row,
// SHOW STATS totals and metrics go with it, and the next client creates it
// anew. A pool that keeps min_size connections is kept: it would open them
// again at once (and, while its server is down, be removed and created
// every round).
func (srv *Server) reapIdlePools(now time.Time) {
	limit := srv.cfg().PoolIdleTimeout
	pools := srv.poolList()
	// The pool's own lock is taken outside srv.mu, which the pool's
	// callbacks may need; the use counts are checked again under srv.mu.
	used := make(map[*dbPool]bool, len(pools))
	for _, p := range pools {
		st := p.pool.Stats()
		used[p] = st.Total > 0 || st.Waiting > 0 || st.MinSize > 0
	}
	var gone []*dbPool
	var ages []time.Duration
	srv.mu.Lock()
	for _, p := range pools {
		if srv.pools[p.key] != p {
			continue // killed, retired or reaped meanwhile
		}
		if used[p] || p.clients.Load() > 0 || p.joining.Load() > 0 {
			p.activeAt = now
			continue
		}
		if limit <= 0 || now.Sub(p.activeAt) <= limit {
			continue
		}
		delete(srv.pools, p.key)
		srv.warm = removePools(srv.warm, []*dbPool{p})
		gone = append(gone, p)
		ages = append(ages, now.Sub(p.activeAt))
	}
	srv.mu.Unlock()
	for i, p := range gone {
		srv.log.Info("idle pool removed", zap.String("database", p.key.database), zap.String("user", p.key.user),
			zap.Duration("age", ages[i]), zap.String("reason", "pool_idle_timeout"))
		p.retired.Store(true)
		p.closeIfUnused()
	}
}
