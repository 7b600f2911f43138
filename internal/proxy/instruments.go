// Instruments written on the relay's path: per-pool atomic counters and the
// Prometheus histograms and counters observed inline, with their registration.

package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolerd/poolerd/internal/sqlscan"
	"github.com/poolerd/poolerd/internal/txstate"
)

// counters are a pool's traffic totals since start, kept with atomics on
// the relay's path (one add per event, no lock). SHOW STATS, the metrics and
// the periodic stats line read them through the snapshots of stats.go.
type counters struct {
	xacts     atomic.Uint64 // transactions completed
	xactNanos atomic.Uint64 // time spent in them
	queries   atomic.Uint64 // requests answered (Query, Sync, FunctionCall)
	queryNano atomic.Uint64 // time from sending a request to its ReadyForQuery
	received  atomic.Uint64 // bytes from clients
	sent      atomic.Uint64 // bytes to clients
	logins    atomic.Uint64 // successful client logins
	errors    sync.Map      // SQLSTATE class (string) -> *atomic.Uint64

	// Transaction-mode prepared statements and session state.
	clientParses, serverParses, cacheHits, stmtEvictions, binds atomic.Uint64
	pinnedNow                                                   [len(pinReasons)]atomic.Int64
	pinsTotal, unpinsTotal                                      [len(pinReasons)]atomic.Uint64
}

// pinReasons are the reasons a client is pinned, as metric labels.
var pinReasons = [...]string{sqlscan.PinTempTable, sqlscan.PinPrepare, sqlscan.PinListen,
	sqlscan.PinAdvisoryLock, sqlscan.PinCursorOnHold, sqlscan.PinRole}

// pinned counts a client pinned (delta 1) or unpinned (-1) for reason.
func (c *counters) pinned(reason string, delta int64) {
	if i := pinIndex(reason); i >= 0 {
		c.pinnedNow[i].Add(delta)
		if delta > 0 {
			c.pinsTotal[i].Add(1)
		}
	}
}

// repinned moves a pinned client from one reason to another (a pin check
// found the state of from gone, but that of to left).
func (c *counters) repinned(from, to string) {
	c.pinned(from, -1)
	if i := pinIndex(to); i >= 0 {
		c.pinnedNow[i].Add(1)
	}
}

// unpinned counts a client unpinned because a pin check found its session
// state gone (before unpin, which counts it out of pinnedNow).
func (c *counters) unpinned(reason string) {
	if i := pinIndex(reason); i >= 0 {
		c.unpinsTotal[i].Add(1)
	}
}

func pinIndex(reason string) int {
	for i, r := range pinReasons {
		if r == reason {
			return i
		}
	}
	return -1
}

// countError counts an error sent to a client by its SQLSTATE class.
func (c *counters) countError(code string) {
	class := "??"
	if len(code) >= 2 {
		class = code[:2]
	}
	v, ok := c.errors.Load(class)
	if !ok {
		v, _ = c.errors.LoadOrStore(class, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
}

// errorCounts returns the errors sent to clients by SQLSTATE class.
func (c *counters) errorCounts() map[string]uint64 {
	out := map[string]uint64{}
	c.errors.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

// metrics are the histograms observed on the relay's path. Everything
// else is read from the pools' snapshots at scrape time by internal/observe,
// so the relay pays for none of it.
type metrics struct {
	checkoutWait, queryDur, xactDur *prometheus.HistogramVec
	// handoffDirtyVec counts the hand-off checks that found a dirty
	// connection, by kind (handoff.go); handoffDirty are its children,
	// in txstate.HandoffKinds' order.
	handoffDirtyVec *prometheus.CounterVec
	handoffDirty    [len(txstate.HandoffKinds)]prometheus.Counter
}

// poolMetrics are one pool's histogram children, resolved once when the
// pool is created: observing is a few atomic adds, no label lookup.
type poolMetrics struct {
	checkoutWait, queryDur, xactDur prometheus.Observer
}

type noopObserver struct{}

func (noopObserver) Observe(float64) {}

func newMetrics() *metrics {
	l := []string{"database", "user"}
	m := &metrics{
		checkoutWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "poolerd_checkout_wait_seconds",
			Help:    "Time a request waited for a server connection (0 when one was idle).",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 10, 30},
		}, l),
		queryDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "poolerd_query_duration_seconds",
			Help:    "Time from sending a request (Query, Sync, FunctionCall) to its ReadyForQuery.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, l),
		xactDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "poolerd_transaction_duration_seconds",
			Help:    "Time a server connection was busy for a client: a transaction, or a single statement outside one.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, l),
		handoffDirtyVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_handoff_dirty_total",
			Help: "Server connections the hand-off check (verify_handoff) closed, by kind of session state found (a connection with several kinds counts once per kind; check_failed: the check itself failed).",
		}, []string{"kind"}),
	}
	for i, k := range txstate.HandoffKinds {
		m.handoffDirty[i] = m.handoffDirtyVec.WithLabelValues(k)
	}
	return m
}

// forPool resolves a pool's children; m may be nil (no registry).
func (m *metrics) forPool(database, user string) poolMetrics {
	if m == nil {
		return poolMetrics{noopObserver{}, noopObserver{}, noopObserver{}}
	}
	return poolMetrics{
		checkoutWait: m.checkoutWait.WithLabelValues(database, user),
		queryDur:     m.queryDur.WithLabelValues(database, user),
		xactDur:      m.xactDur.WithLabelValues(database, user),
	}
}

// forget deletes a removed pool's children.
func (m *metrics) forget(database, user string) {
	if m == nil {
		return
	}
	m.checkoutWait.DeleteLabelValues(database, user)
	m.queryDur.DeleteLabelValues(database, user)
	m.xactDur.DeleteLabelValues(database, user)
}

// Instrument registers the metrics the relay observes inline (the
// histograms above and the rate-limit metrics) on reg; internal/observe
// registers the rest, read at scrape time. Call it before Warm and Serve:
// pools created earlier have no histograms.
func (srv *Server) Instrument(reg prometheus.Registerer) error {
	m := newMetrics()
	for _, c := range append([]prometheus.Collector{m.checkoutWait, m.queryDur, m.xactDur, m.handoffDirtyVec, srv.peering.forwarded}, srv.rateMet.collectors()...) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	srv.metrics = m
	return nil
}

// rateMetrics are the rate limiter's metrics.
type rateMetrics struct {
	decisions    *prometheus.CounterVec   // rule, bucket, outcome
	wait         *prometheus.HistogramVec // rule
	redisErrors  prometheus.Counter
	redisLatency prometheus.Histogram
	refusals     *prometheus.CounterVec // limit
	charged      *prometheus.CounterVec // rule, bucket: units of measured buckets
	debt         *prometheus.CounterVec // rule, bucket, outcome: requests held back by a measured bucket in debt
	chargeErrors prometheus.Counter
}

func newRateMetrics() *rateMetrics {
	return &rateMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_decisions_total",
			Help: "Rate-limit decisions by rule, bucket (the denying one; \"all\" when allowed) and outcome: allowed, rejected, waited (allowed after backpressure), error_allowed, error_denied (Redis failed; on_redis_error).",
		}, []string{"rule", "bucket", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "poolerd_ratelimit_wait_seconds",
			Help:    "Backpressure: how long requests of wait-mode rules were delayed (seed 003 backpressure_wait).",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"rule"}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_redis_errors_total",
			Help: "Rate-limit checks whose Redis call failed or timed out.",
		}),
		redisLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "poolerd_ratelimit_redis_seconds",
			Help:    "Latency of Redis rate-limit checks.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}),
		charged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_charged_total",
			Help: "What transactions cost, charged to measured buckets, by rule and bucket: server_time in milliseconds, rows, bytes.",
		}, []string{"rule", "bucket"}),
		debt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_debt_total",
			Help: "Transactions that found a measured bucket (server_time, rows, bytes) in debt, by rule, bucket and outcome: waited (then allowed) or rejected.",
		}, []string{"rule", "bucket", "outcome"}),
		chargeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_charge_errors_total",
			Help: "Measured costs that could not be charged (Redis failed or was too slow); their keys were not held back for them.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_connection_limit_refusals_total",
			Help: "Client connections refused by a connection limit: max_client_conn, max_db_client_connections, max_user_client_connections.",
		}, []string{"limit"}),
	}
}

func (m *rateMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.decisions, m.wait, m.redisErrors, m.redisLatency, m.refusals, m.charged, m.debt, m.chargeErrors}
}
