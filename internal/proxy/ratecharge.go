package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/limiter"
)

// Measured rate limits: what a transaction cost the database (server time,
// rows, bytes; measured by its server connection's reader, see
// serverConn.noteTimesLocked) is charged to the measured buckets of the
// client's rules when the transaction ends. A key whose bucket the charges
// put into debt waits, or is refused, at its next transaction (the
// Deferred buckets of rateRule.request[1]).

// chargeCosts charges c to the measured buckets of the session's rules.
// With the memory backend it charges in place (one shard lock); with Redis
// it hands the charge to the charger, so that a server connection's reader
// never waits for Redis.
func (s *session) chargeCosts(c requestCost) {
	rates := s.sessionRates()
	if len(rates) == 0 {
		return
	}
	rl := s.srv.rates.Load()
	if rl == nil {
		return
	}
	var reqs []limiter.Request
	for _, sr := range rates {
		if len(sr.rule.measured) == 0 {
			continue
		}
		buckets := make([]limiter.Bucket, 0, len(sr.rule.measured))
		for _, m := range sr.rule.measured {
			cost := c.of(m.kind)
			if cost <= 0 {
				continue
			}
			b := m.bucket
			b.Cost = cost
			buckets = append(buckets, b)
			units := float64(cost)
			if m.kind == costServerTime {
				units /= 1000 // reported in milliseconds, as configured
			}
			s.srv.rateMet.charged.WithLabelValues(sr.rule.cfg.Name, b.Name).Add(units)
		}
		if len(buckets) > 0 {
			reqs = append(reqs, limiter.Request{Key: sr.key, Buckets: buckets})
		}
	}
	if len(reqs) == 0 {
		return
	}
	if rl.charges != nil {
		if !rl.charges.add(reqs) {
			s.srv.chargeFailed(len(reqs), errChargeQueueFull)
		}
		return
	}
	if err := rl.lim.Charge(s.srv.ctx, reqs); err != nil {
		s.srv.chargeFailed(len(reqs), err)
	}
}

// chargeFailed counts charges that were lost and logs it, at most once
// every 10 s.
func (srv *Server) chargeFailed(n int, err error) {
	srv.rateMet.chargeErrors.Add(float64(n))
	now := time.Now().UnixNano()
	last := srv.chargeWarned.Load()
	if now-last < int64(10*time.Second) || !srv.chargeWarned.CompareAndSwap(last, now) {
		return
	}
	srv.log.Warn("rate limit: measured costs not charged (server_time, rows, bytes); those keys were not held back for them",
		zap.Int("charges", n), zap.Error(err))
}

// chargeQueue is how many charges may wait for Redis; more are dropped
// (counted in poolerd_ratelimit_charge_errors_total) rather than stall a
// server connection's reader.
const chargeQueue = 4096

// chargeBatch is the most charges sent to Redis in one script call.
const chargeBatch = 128

// charger sends measured costs to Redis from one goroutine, several
// charges per script call.
type charger struct {
	lim     limiter.Limiter
	in      chan []limiter.Request
	done    chan struct{}
	stopped chan struct{}
	// onErr is told of charges that failed (the Server's chargeFailed);
	// set before the first add.
	onErr atomic.Pointer[func(n int, err error)]
}

func newCharger(lim limiter.Limiter) *charger {
	c := &charger{lim: lim, in: make(chan []limiter.Request, chargeQueue), done: make(chan struct{}), stopped: make(chan struct{})}
	go c.run()
	return c
}

// add queues reqs; false when the queue is full.
func (c *charger) add(reqs []limiter.Request) bool {
	select {
	case c.in <- reqs:
		return true
	default:
		return false
	}
}

func (c *charger) run() {
	defer close(c.stopped)
	batch := make([]limiter.Request, 0, chargeBatch)
	for {
		select {
		case reqs := <-c.in:
			batch = append(batch[:0], reqs...)
		more:
			for len(batch) < chargeBatch {
				select {
				case reqs := <-c.in:
					batch = append(batch, reqs...)
				default:
					break more
				}
			}
			if err := c.lim.Charge(context.Background(), batch); err != nil {
				if f := c.onErr.Load(); f != nil {
					(*f)(len(batch), err)
				}
			}
			clear(batch)
		case <-c.done:
			return
		}
	}
}

// stop ends the charger; charges still queued are dropped.
func (c *charger) stop() {
	close(c.done)
	<-c.stopped
}

// RateLimitInfo is one bucket of one rate-limit rule, for SHOW RATE_LIMITS:
// its configuration and what it has done since the rules were last
// compiled (start or reload; the counters are the metrics').
type RateLimitInfo struct {
	Rule, Mode, KeyBy, Bucket string
	// Measured: charged when a transaction ends (server_time, rows,
	// bytes); else counted when a request, transaction or login starts.
	Measured bool
	Limit    int64
	Per      time.Duration
	MaxWait  time.Duration
	// Unit is what Limit counts: requests, transactions, logins, ms,
	// rows or bytes.
	Unit string
	// Charged is what the measured bucket was charged, in Unit; Refused
	// the requests this bucket denied and that were refused; DebtWaits
	// the transactions a measured bucket in debt delayed.
	Charged   float64
	Refused   float64
	DebtWaits float64
	Backend   string
}

// RateLimits lists every bucket of every rate-limit rule, in the order of
// the configuration.
func (srv *Server) RateLimits() []RateLimitInfo {
	rl := srv.rates.Load()
	if rl == nil {
		return nil
	}
	m := srv.rateMet
	var out []RateLimitInfo
	for _, r := range rl.rules {
		c := &r.cfg
		for _, b := range c.Buckets() {
			info := RateLimitInfo{Rule: c.Name, Mode: c.Mode, KeyBy: strings.Join(c.KeyBy, ","), Bucket: b.Name,
				Measured: b.Measured, Limit: b.Limit, Per: b.Per, Unit: b.Unit, Backend: rl.backend,
				Refused: counterValue(m.decisions, "rule", c.Name, "bucket", b.Name, "outcome", "rejected")}
			if c.Mode == "wait" {
				info.MaxWait = c.MaxWait
			}
			if b.Measured {
				info.Charged = counterValue(m.charged, "rule", c.Name, "bucket", b.Name)
				info.DebtWaits = counterValue(m.debt, "rule", c.Name, "bucket", b.Name, "outcome", "waited")
			}
			out = append(out, info)
		}
	}
	return out
}

// counterValue reads the counter of vec with the labels kv (name, value,
// name, value, ...: all of the vec's labels), 0 if it has none yet. It
// reads the vec's series instead of asking for the counter, which would
// create it.
func counterValue(vec *prometheus.CounterVec, kv ...string) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() {
		vec.Collect(ch)
		close(ch)
	}()
	total := 0.0
	for metric := range ch {
		var m dto.Metric
		if metric.Write(&m) != nil || 2*len(m.GetLabel()) != len(kv) {
			continue
		}
		match := true
		for _, l := range m.GetLabel() {
			found := false
			for i := 0; i+1 < len(kv); i += 2 {
				found = found || kv[i] == l.GetName() && kv[i+1] == l.GetValue()
			}
			match = match && found
		}
		if match {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}
