package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Result labels of the metrics.
const (
	resultAllowed  = "allowed"
	resultDenied   = "denied"
	resultCanceled = "canceled"
	resultError    = "error"
)

// Metrics records limiter outcomes for Prometheus. It is a
// prometheus.Collector: register it once, then pass it to Instrument. A
// nil *Metrics records nothing.
//
// Metrics exported:
//
//	poolerd_ratelimit_decisions_total{result}  requests decided: allowed, denied (after any wait),
//	                                          canceled (ctx ended while waiting) or error (backend failure)
//	poolerd_ratelimit_denied_total{bucket}     denied requests, by the bucket that denied them
//	poolerd_ratelimit_wait_seconds{result}     time spent in Wait, by the same results
//
// Labels never include request keys, whose number is unbounded.
type Metrics struct {
	decisions *prometheus.CounterVec
	denied    *prometheus.CounterVec
	waits     *prometheus.HistogramVec
	// Children resolved once, so that recording an outcome is an atomic
	// add without a label lookup.
	allowed, deniedAll, canceled, errored prometheus.Counter
	waitAllowed, waitDenied, waitCanceled prometheus.Observer
	waitError                             prometheus.Observer
}

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns unregistered limiter metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_decisions_total",
			Help: "Rate-limited requests by result: allowed, denied (after any wait), canceled (while waiting) or error (limiter backend failure).",
		}, []string{"result"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_ratelimit_denied_total",
			Help: "Rate-limited requests denied, by the bucket that denied them (the one with the longest retry).",
		}, []string{"bucket"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "poolerd_ratelimit_wait_seconds",
			Help:    "Time requests waited for rate-limit capacity (backpressure), by result; 0 when allowed at once.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"result"}),
	}
	m.allowed = m.decisions.WithLabelValues(resultAllowed)
	m.deniedAll = m.decisions.WithLabelValues(resultDenied)
	m.canceled = m.decisions.WithLabelValues(resultCanceled)
	m.errored = m.decisions.WithLabelValues(resultError)
	m.waitAllowed = m.waits.WithLabelValues(resultAllowed)
	m.waitDenied = m.waits.WithLabelValues(resultDenied)
	m.waitCanceled = m.waits.WithLabelValues(resultCanceled)
	m.waitError = m.waits.WithLabelValues(resultError)
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.decisions.Describe(ch)
	m.denied.Describe(ch)
	m.waits.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.decisions.Collect(ch)
	m.denied.Collect(ch)
	m.waits.Collect(ch)
}

// result classifies an outcome; ctx is the caller's context.
func result(ctx context.Context, d Decision, err error) string {
	switch {
	case err == nil && d.Allowed:
		return resultAllowed
	case err == nil:
		return resultDenied
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return resultCanceled
	}
	return resultError
}

// ObserveDecision records the final outcome of one request.
func (m *Metrics) ObserveDecision(ctx context.Context, d Decision, err error) {
	if m == nil {
		return
	}
	switch result(ctx, d, err) {
	case resultAllowed:
		m.allowed.Inc()
	case resultDenied:
		m.deniedAll.Inc()
		m.denied.WithLabelValues(d.Bucket).Inc()
	case resultCanceled:
		m.canceled.Inc()
	default:
		m.errored.Inc()
	}
}

// ObserveWait records the duration of one Wait by its outcome.
func (m *Metrics) ObserveWait(ctx context.Context, d Decision, waited time.Duration, err error) {
	if m == nil {
		return
	}
	var o prometheus.Observer
	switch result(ctx, d, err) {
	case resultAllowed:
		o = m.waitAllowed
	case resultDenied:
		o = m.waitDenied
	case resultCanceled:
		o = m.waitCanceled
	default:
		o = m.waitError
	}
	o.Observe(waited.Seconds())
}

// Instrumented is a Limiter that records each request's outcome in
// Metrics. Create one with Instrument.
type Instrumented struct {
	l Limiter
	m *Metrics
}

// Instrument returns l recording its outcomes in m (which may be nil).
func Instrument(l Limiter, m *Metrics) *Instrumented {
	return &Instrumented{l: l, m: m}
}

// Allow implements Limiter, recording the decision.
func (i *Instrumented) Allow(ctx context.Context, req Request) (Decision, error) {
	d, err := i.l.Allow(ctx, req)
	i.m.ObserveDecision(ctx, d, err)
	return d, err
}

// Wait is the package's Wait on the wrapped limiter, recording its final
// decision once (the attempts made while waiting are not counted) and how
// long it waited. Use it rather than Wait(ctx, i, ...), which would count
// every attempt.
func (i *Instrumented) Wait(ctx context.Context, req Request, maxWait time.Duration) (Decision, time.Duration, error) {
	d, waited, err := Wait(ctx, i.l, req, maxWait)
	i.m.ObserveDecision(ctx, d, err)
	i.m.ObserveWait(ctx, d, waited, err)
	return d, waited, err
}

// Unwrap returns the instrumented limiter.
func (i *Instrumented) Unwrap() Limiter { return i.l }
