package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/wire"
)

// warnLongWait logs wait_warning's line: a request of this pool has waited
// wait_warning for a server connection. It says how full the pool is and
// who has held a connection longest, and with what, so that the operator
// sees at once whether the pool is too small or one client hogs it. The
// pool calls it from its maintainer at most once per pool.LongWaitEvery.
func (d *dbPool) warnLongWait(st pool.Stats) {
	fields := []zap.Field{
		zap.Duration("waited", st.OldestWait.Round(time.Millisecond)),
		zap.Duration("wait_warning", d.route().Settings.WaitWarning),
		zap.Int("max_size", st.MaxSize), zap.Int("open", st.Total), zap.Int("idle", st.Idle),
		zap.Int("active", st.Active), zap.Int("waiting", st.Waiting),
	}
	if h, ok := d.oldestHolder(); ok {
		fields = append(fields, zap.Uint64("holder_session", h.s.id), zap.String("holder_client", h.s.addr),
			zap.String("holder_application_name", h.app), zap.Uint64("holder_conn_id", h.sc.ID()),
			zap.String("holder_state", h.state), zap.String("holder_query", h.s.queryText()))
		if h.busyFor > 0 {
			fields = append(fields, zap.Duration("holder_busy_for", h.busyFor.Round(time.Millisecond)))
		}
	}
	d.log.Warn("a request has waited wait_warning for a server connection", fields...)
}

// holder is a client holding one of the pool's server connections.
type holder struct {
	s       *session
	sc      *serverConn
	app     string
	state   string
	busyFor time.Duration // 0: not timed (no session timeout is set)
}

// oldestHolder finds the client that has kept a server connection busy the
// longest (busySince, kept when the client has any session timeout or
// leak_detection_threshold), or else any client holding one.
func (d *dbPool) oldestHolder() (holder, bool) {
	var best holder
	var bestSince int64
	found := false
	for _, sc := range d.pool.All() {
		sc.mu.Lock()
		s := sc.owner.Load()
		since, pending, tx := sc.busySince, sc.pending, sc.txStatus
		sc.mu.Unlock()
		if s == nil {
			continue
		}
		better := !found || since != 0 && (bestSince == 0 || since < bestSince)
		if !better {
			continue
		}
		found, bestSince = true, since
		best = holder{s: s, sc: sc, state: "idle"}
		switch {
		case pending > 0:
			best.state = "active query"
		case tx != wire.TxIdle:
			best.state = "idle in transaction"
		}
	}
	if !found {
		return holder{}, false
	}
	if bestSince != 0 {
		best.busyFor = time.Duration(d.srv.nanotime() - bestSince)
	}
	best.s.pmu.Lock()
	best.app = best.s.params["application_name"]
	best.s.pmu.Unlock()
	return best, true
}
