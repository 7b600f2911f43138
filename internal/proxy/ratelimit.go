package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/limiter"
	"github.com/poolerd/poolerd/internal/wire"
)

// rateLimits is the compiled rate-limit configuration: rules and the
// limiter holding their budgets.
type rateLimits struct {
	rules      []*rateRule
	lim        limiter.Limiter
	redis      *redis.Client // nil for the memory backend
	onErrAllow bool
	backend    string
	closeOnce  sync.Once
	// charges sends measured costs to Redis off the servers' readers;
	// nil with the memory backend (charged in place) or without
	// measured buckets.
	charges *charger
	// asks queues the Redis decisions of reads waiting on their loops
	// for the askers (rateDecision.ask), askers counts them, batcher
	// makes several in one round trip; done, closed by close, ends the
	// askers once the queue is empty.
	asks    chan *rateDecision
	askers  atomic.Int32
	batcher *limiter.Redis
	timeout time.Duration // redis_timeout
	done    chan struct{}
}

// rateRule is one compiled rule.
type rateRule struct {
	cfg    config.RateLimitRule
	subnet *net.IPNet
	addr   net.IP
	wait   bool
	// preAuth: the rule depends on nothing the client claims (it matches
	// and keys by the client's address only), so its connections bucket
	// is checked before authentication; any other rule's, after it.
	preAuth bool
	// The buckets a request takes (request[1] when it starts a
	// transaction, request[0] otherwise) and a login takes, named as in
	// the configuration; empty when the rule has none for it. Shared by
	// every decision, never changed.
	request [2][]limiter.Bucket
	login   []limiter.Bucket
	// measured are the rule's measured buckets (server_time, rows,
	// bytes): Deferred copies of them end request[1], so that a key in
	// debt waits or is refused at its next transaction; chargeCosts
	// charges each what a transaction cost.
	measured []measuredBucket
}

// costKind is what a measured bucket counts.
type costKind uint8

const (
	costServerTime costKind = iota // microseconds of server connection time
	costRows                       // DataRows returned
	costBytes                      // bytes returned
)

// measuredBucket is one measured bucket of a rule: what it counts, and the
// bucket, in microseconds for server_time (its limit in milliseconds
// times 1000), so that a short statement costs what it took.
type measuredBucket struct {
	kind   costKind
	bucket limiter.Bucket
}

// requestCost is what one transaction (or statement outside one) cost the
// database, measured by its server connection's reader.
type requestCost struct {
	serverMicros, rows, bytes int64
}

func (c requestCost) of(k costKind) int64 {
	switch k {
	case costServerTime:
		return c.serverMicros
	case costRows:
		return c.rows
	}
	return c.bytes
}

// appendMeasured appends the measured bucket name of the configuration b,
// if set, counting kind.
func appendMeasured(to []measuredBucket, kind costKind, name string, b *config.RateBucket) []measuredBucket {
	if b == nil {
		return to
	}
	limit := b.Limit
	if kind == costServerTime {
		limit *= 1000 // configured in milliseconds, counted in microseconds
	}
	return append(to, measuredBucket{kind: kind, bucket: limiter.Bucket{Name: name, Limit: limit, Per: b.Per}})
}

// sessionRate is a rule that applies to a session, with the session's key.
type sessionRate struct {
	rule *rateRule
	key  string
}

// appendBucket appends the bucket name of the configuration b, if set.
func appendBucket(to []limiter.Bucket, name string, b *config.RateBucket) []limiter.Bucket {
	if b == nil {
		return to
	}
	return append(to, limiter.Bucket{Name: name, Limit: b.Limit, Per: b.Per, Cost: 1})
}

// newRateLimits compiles cfg's rules. With no rules it returns nil.
func newRateLimits(cfg *config.Config) (*rateLimits, error) {
	if len(cfg.RateLimits) == 0 {
		return nil, nil
	}
	rl := &rateLimits{onErrAllow: cfg.OnRedisError == "allow", backend: cfg.RateLimitBackend}
	for _, r := range cfg.RateLimits {
		cr := &rateRule{cfg: r, wait: r.Mode == "wait"}
		cr.request[0] = appendBucket(nil, "queries", r.Queries)
		cr.request[1] = appendBucket(appendBucket(nil, "queries", r.Queries), "transactions", r.Transactions)
		cr.login = appendBucket(nil, "connections", r.Connections)
		cr.measured = appendMeasured(nil, costServerTime, "server_time", r.ServerTime)
		cr.measured = appendMeasured(cr.measured, costRows, "rows", r.Rows)
		cr.measured = appendMeasured(cr.measured, costBytes, "bytes", r.Bytes)
		for _, m := range cr.measured {
			b := m.bucket
			b.Deferred = true
			cr.request[1] = append(cr.request[1], b)
		}
		cr.preAuth = r.Match.Database == "" && r.Match.User == "" && r.Match.ApplicationName == "" &&
			!slices.ContainsFunc(r.KeyBy, func(k string) bool { return k != "client" })
		if m := r.Match.Client; m != "" {
			if _, n, err := net.ParseCIDR(m); err == nil {
				cr.subnet = n
			} else {
				cr.addr = net.ParseIP(m)
			}
		}
		rl.rules = append(rl.rules, cr)
	}
	switch cfg.RateLimitBackend {
	case "redis":
		opts, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, errors.New("redis_url is not a valid Redis URL")
		}
		// A retried script could debit twice; a slow dial must fail within
		// the timeout rather than retry.
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries = -1
		opts.DialerRetries = 1
		opts.DisableIdentity = true
		opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		rl.redis = redis.NewClient(opts)
		rl.asks, rl.done = make(chan *rateDecision, askerQueue), make(chan struct{})
		rl.batcher = limiter.NewRedis(rl.redis, limiter.RedisOptions{Timeout: cfg.RedisTimeout})
		rl.timeout = rl.batcher.Timeout()
		rl.lim = rl.batcher
		if slices.ContainsFunc(rl.rules, func(r *rateRule) bool { return len(r.measured) > 0 }) {
			rl.charges = newCharger(rl.lim)
		}
	default:
		rl.lim = limiter.NewMemory(limiter.MemoryOptions{})
	}
	return rl, nil
}

func (rl *rateLimits) close() {
	if rl != nil && rl.redis != nil {
		rl.closeOnce.Do(func() {
			if rl.charges != nil {
				rl.charges.stop()
			}
			close(rl.done)
			_ = rl.redis.Close()
		})
	}
}

// forSession returns the rules that apply to a client and their keys.
func (rl *rateLimits) forSession(database, user, app string, addr net.Addr) []sessionRate {
	if rl == nil {
		return nil
	}
	var ip net.IP
	if ta, ok := addr.(*net.TCPAddr); ok {
		ip = ta.IP
	}
	var out []sessionRate
	for _, r := range rl.rules {
		m := r.cfg.Match
		switch {
		case m.Database != "" && m.Database != database,
			m.User != "" && m.User != user,
			m.ApplicationName != "" && m.ApplicationName != app,
			r.subnet != nil && (ip == nil || !r.subnet.Contains(ip)),
			r.addr != nil && (ip == nil || !r.addr.Equal(ip)):
			continue
		}
		var key strings.Builder
		key.WriteString(r.cfg.Name)
		for _, k := range r.cfg.KeyBy {
			key.WriteByte('|')
			key.WriteString(k)
			key.WriteByte('=')
			switch k {
			case "user":
				key.WriteString(user)
			case "database":
				key.WriteString(database)
			case "client":
				if ip != nil {
					key.WriteString(ip.String())
				}
			case "application_name":
				key.WriteString(app)
			}
		}
		out = append(out, sessionRate{rule: r, key: key.String()})
	}
	return out
}

// warnLogger is what checkRate logs with (a session's logger).
type warnLogger interface {
	Warn(msg string, fields ...zap.Field)
}

// checkRate decides a request (or a login) against every applicable rule
// at once, for the buckets which picks (queries, transactions or
// connections): either every rule allows and all are debited, or none is.
// A denial by a reject-mode rule refuses at once; when only wait-mode rules
// deny, the request waits for the longest of their retries, as long as the
// total wait fits in the max_wait of each denying rule (limiter.WaitAll),
// and is debited only when all allow. w, when not nil, ends such a wait
// when the client leaves or its session ends (clientWatch); its zero value
// watches nothing. It returns the refusal, or nil to go on.
func (srv *Server) checkRate(ctx context.Context, log warnLogger, rates []sessionRate, which func(*rateRule) []limiter.Bucket, severity string, rw rateWait) error {
	lw := rw.loop
	var taken *rateDecision // a Redis decision made while the read waited on its loop
	if lw != nil && lw.decision != nil {
		taken, lw.decision = lw.decision, nil
	}
	rl := srv.rates.Load()
	if taken != nil {
		rl = taken.rl
	}
	if rl == nil {
		return nil
	}
	// On the stack: the decision's own slices are copied (decide) where
	// they would escape.
	var ruleBuf [4]*rateRule
	var reqBuf [4]limiter.Request
	var dBuf [4]limiter.Decision
	var rules []*rateRule
	var reqs []limiter.Request
	var ds []limiter.Decision
	var start time.Time
	var allowed bool
	var err error
	waits := false
	if taken != nil {
		rules, reqs, ds, start = taken.rules, taken.reqs, taken.ds, taken.start
		allowed, err = taken.allowed, taken.err
		for _, r := range rules {
			waits = waits || r.wait
		}
	} else {
		rules, reqs = ruleBuf[:0], reqBuf[:0]
		for _, sr := range rates {
			buckets := which(sr.rule)
			if len(buckets) == 0 {
				continue
			}
			waits = waits || sr.rule.wait
			rules = append(rules, sr.rule)
			reqs = append(reqs, limiter.Request{Key: sr.key, Buckets: buckets})
		}
		if len(reqs) == 0 {
			return nil
		}
		start = time.Now()
		if rl.redis != nil && lw != nil {
			// A round trip to Redis: the read waits on its loop for the
			// answer (rateDecision.ask), and this runs again then.
			lw.decision = &rateDecision{rl: rl, rules: slices.Clone(rules), reqs: slices.Clone(reqs),
				ds: make([]limiter.Decision, len(reqs)), start: start}
			return errRateDecideOnLoop
		}
		ds = dBuf[:]
		if len(reqs) > len(dBuf) {
			ds = make([]limiter.Decision, len(reqs))
		}
		ds = ds[:len(reqs)]
		if rl.redis != nil {
			rw.block() // a round trip to Redis
		}
		allowed, err = decide(ctx, rl.lim, reqs, ds)
	}
	var waited time.Duration
	var debts []debtSeen // measured buckets in debt at the first decision
	switch {
	case lw != nil && !lw.start.IsZero():
		// Decided again after a wait on the loop: the first denial's
		// debts are this request's.
		waited, debts = start.Sub(lw.start), lw.debts
	case !allowed && err == nil:
		debts = inDebt(rules, ds)
	}
	parked := false
	if len(debts) > 0 {
		defer func() {
			if parked {
				return // decided when the wait ends
			}
			outcome := "rejected"
			if allowed {
				outcome = "waited"
			}
			for _, d := range debts {
				srv.rateMet.debt.WithLabelValues(d.rule, d.bucket, outcome).Inc()
			}
		}()
	}
	var w *clientWatch // made only for a wait
	if !allowed && err == nil && waits && lw != nil {
		// On the session's event loop: it waits there, woken to decide
		// again (rateLoopWait).
		if sleep, ok := loopSleep(rules, ds, waited); ok {
			if lw.start.IsZero() {
				lw.start, lw.debts = start, debts
			}
			lw.sleep = sleep
			parked = true
			return errRateWaitOnLoop
		}
	} else if !allowed && err == nil && waits && waitable(rules, ds) {
		// The slow path: wait, deciding again until every rule allows.
		maxWaits := make([]time.Duration, len(rules))
		for i, r := range rules {
			if r.wait {
				maxWaits[i] = r.cfg.MaxWait
			}
		}
		opts := limiter.WaitOptions{MaxWait: maxWaits}
		if rw.conn != nil {
			w = &clientWatch{rateWait: rw}
			opts.Watch = w.watch
		}
		wds := make([]limiter.Decision, len(reqs))
		rw.block()
		allowed, waited, err = limiter.WaitAll(ctx, rl.lim, slices.Clone(reqs), wds, opts)
		copy(ds, wds)
	}
	if rl.redis != nil && taken == nil {
		// (A decision made while the read waited on its loop was
		// observed by its asker.)
		srv.rateMet.redisLatency.Observe(time.Since(start).Seconds() - waited.Seconds())
	}
	if err != nil {
		if ended := w.ended(); ended != nil {
			return ended // the client left, or its session ended, while it waited
		}
		if ctx.Err() != nil {
			return errShuttingDown()
		}
		return srv.rateCheckFailed(rl, log, rules, err, severity)
	}
	if !allowed {
		// The refusal names the rule that needs the longest to have room:
		// after its retry every rule would allow the request.
		worst := -1
		for i, d := range ds {
			if d.Allowed {
				continue
			}
			srv.rateMet.decisions.WithLabelValues(rules[i].cfg.Name, d.Bucket, "rejected").Inc()
			if rules[i].wait {
				srv.rateMet.wait.WithLabelValues(rules[i].cfg.Name).Observe(waited.Seconds())
			}
			if worst < 0 || d.RetryAfter > ds[worst].RetryAfter {
				worst = i
			}
		}
		return errRateLimited(severity, rules[worst], ds[worst])
	}
	for _, r := range rules {
		outcome := "allowed"
		if waited > 0 && r.wait {
			outcome = "waited"
			srv.rateMet.wait.WithLabelValues(r.cfg.Name).Observe(waited.Seconds())
		}
		srv.rateMet.decisions.WithLabelValues(r.cfg.Name, "all", outcome).Inc()
	}
	return nil
}

// limitText says what the rule's bucket name allows, for a refusal's
// DETAIL: "50 per 1s", or for a measured bucket "5000 ms of server time
// per 1m0s, used up by earlier transactions".
func (r *rateRule) limitText(name string) string {
	for _, b := range r.cfg.Buckets() {
		switch {
		case b.Name != name:
		case b.Name == "server_time":
			return fmt.Sprintf("%d ms of server time per %s, used up by earlier transactions", b.Limit, b.Per)
		case b.Measured:
			return fmt.Sprintf("%d %s per %s, used up by earlier transactions", b.Limit, b.Unit, b.Per)
		default:
			return fmt.Sprintf("%d per %s", b.Limit, b.Per)
		}
	}
	return "of bucket " + name
}

// debtSeen is a measured bucket a decision found in debt.
type debtSeen struct{ rule, bucket string }

// inDebt returns the measured buckets that denied a decision (ds).
func inDebt(rules []*rateRule, ds []limiter.Decision) []debtSeen {
	var out []debtSeen
	for i, d := range ds {
		if d.Allowed {
			continue
		}
		for _, m := range rules[i].measured {
			if m.bucket.Name == d.Bucket {
				out = append(out, debtSeen{rules[i].cfg.Name, d.Bucket})
			}
		}
	}
	return out
}

// errRateWaitOnLoop is checkRate's answer when a request of a session on
// its event loop must wait for its rate limits (rateWait.loop): the
// session parks on the loop for rateLoopWait.sleep and decides again.
var errRateWaitOnLoop = errors.New("rate-limit wait on the event loop")

// errRateDecideOnLoop is checkRate's answer when a request of a session on
// its event loop needs a decision of the Redis backend: the decision is
// made off the loop (rateDecision.ask) while the read waits
// on the loop, and checkRate runs again with its answer.
var errRateDecideOnLoop = errors.New("rate-limit decision of Redis for a request on the event loop")

// rateLoopWait is a rate-limit wait of a session on its event loop: where
// limiter.WaitAll sleeps, the session parks (reactor.Item.Sleep) and checkRate
// runs again when it wakes, with the time waited since the first denial
// counted against each rule's max_wait as WaitAll counts it. A decision of
// the Redis backend is waited for on the loop too (decision).
type rateLoopWait struct {
	start time.Time // the first denial; zero: not waiting
	debts []debtSeen
	sleep time.Duration // how long to park, set by checkRate
	// until is when the current sleep ends: a wake before it (an event
	// on the client's socket, the session's end) is not the timer's.
	until time.Time
	// decision is the Redis decision the read waits for (set by
	// checkRate with errRateDecideOnLoop, taken by checkRate when the
	// read is woken); nil when none.
	decision *rateDecision
}

// rateDecision is a decision of the Redis backend made for a request whose
// read waits on its event loop: what checkRate had gathered, and the
// answer. The asker that asks Redis writes the answer and then sets done
// before it wakes the read; the loop reads the answer only after seeing
// done, and drops a decision whose session ended meanwhile (its asker
// finishes it on its own, within redis_timeout).
type rateDecision struct {
	rl    *rateLimits // the rules the decision was asked under (a reload may replace them)
	rules []*rateRule
	reqs  []limiter.Request
	ds    []limiter.Decision
	start time.Time

	// Set by ask for the asker.
	ctx   context.Context
	met   *rateMetrics
	ready func()

	allowed bool
	err     error
	done    atomic.Bool
}

// Askers: the Redis decisions of reads waiting on their loops are queued
// (rateLimits.asks) for a few askers, each of which takes every decision
// queued when it is free and makes them in one round trip (a pipeline:
// limiter.Redis.AllowBatch), so that under load many sessions' decisions
// share a round trip (the loop's waits make that possible: a session on a
// goroutine of its own asked alone). An asker is started when none is
// free, up to maxAskers, and ends after askerIdle without a decision.
const (
	maxAskers  = 4
	askerIdle  = 2 * time.Second
	maxBatch   = 64   // decisions in one round trip
	askerQueue = 4096 // decisions queued; beyond, one is asked on a goroutine of its own
)

// ask has the decision made off the loop by an asker, which calls ready
// (the read's wake-up on its loop) when the answer is in.
func (d *rateDecision) ask(ctx context.Context, met *rateMetrics, ready func()) {
	d.ctx, d.met, d.ready = ctx, met, ready
	rl := d.rl
	select {
	case rl.asks <- d:
	default:
		go rl.answer([]*rateDecision{d})
		return
	}
	// An asker free to take it now, or one more (each asker's last look
	// at the queue comes after it stops counting itself: askerDone).
	if n := rl.askers.Load(); n == 0 || n < maxAskers && len(rl.asks) > 1 {
		rl.startAsker(n)
	}
}

// startAsker starts an asker if n are still running.
func (rl *rateLimits) startAsker(n int32) {
	if rl.askers.CompareAndSwap(n, n+1) {
		go rl.asker()
	}
}

// asker makes the queued decisions, every one queued at once in a round
// trip, until the queue has been empty for askerIdle, or is empty once the
// rules are closed.
func (rl *rateLimits) asker() {
	idle := time.NewTimer(askerIdle)
	defer idle.Stop()
	batch := make([]*rateDecision, 0, maxBatch)
	for {
		var d *rateDecision
		select {
		case d = <-rl.asks:
		case <-idle.C:
		case <-rl.done:
			select {
			case d = <-rl.asks:
			default:
			}
		}
		if d == nil {
			rl.askerDone()
			return
		}
		batch = append(batch[:0], d)
	gather:
		for len(batch) < maxBatch {
			select {
			case d = <-rl.asks:
				batch = append(batch, d)
			default:
				break gather
			}
		}
		rl.answer(batch)
		clear(batch)
		idle.Reset(askerIdle)
	}
}

// askerDone is an asker's end: a decision queued after its last look and
// before it stopped counting itself gets another.
func (rl *rateLimits) askerDone() {
	n := rl.askers.Add(-1)
	if len(rl.asks) > 0 {
		rl.startAsker(n)
	}
}

// answer makes the decisions of batch in one round trip and wakes their
// reads. redis_timeout counts from the oldest decision's start (the first:
// the queue is FIFO), so that the time a decision was queued for a free
// asker is part of it.
func (rl *rateLimits) answer(batch []*rateDecision) {
	ctx, cancel := context.WithDeadline(batch[0].ctx, batch[0].start.Add(rl.timeout))
	if len(batch) == 1 {
		for _, d := range batch {
			d.allowed, d.err = decide(ctx, rl.lim, d.reqs, d.ds)
		}
	} else {
		bs := make([]limiter.Batched, len(batch))
		for i, d := range batch {
			bs[i] = limiter.Batched{Reqs: d.reqs, Ds: d.ds}
		}
		rl.batcher.AllowBatch(ctx, bs)
		for i, d := range batch {
			d.allowed, d.err = bs[i].Allowed, bs[i].Err
		}
	}
	cancel()
	for _, d := range batch {
		d.met.redisLatency.Observe(time.Since(d.start).Seconds())
		ready := d.ready
		d.ctx, d.met, d.ready = nil, nil, nil
		d.done.Store(true)
		ready()
	}
}

// loopSleep is WaitAll's step for a wait on the loop: how long to sleep
// before deciding again (the longest retry among the denials), and whether
// the wait may go on, every denying rule a wait rule whose max_wait leaves
// room for waited plus that sleep.
func loopSleep(rules []*rateRule, ds []limiter.Decision, waited time.Duration) (time.Duration, bool) {
	var sleep time.Duration
	for _, d := range ds {
		if !d.Allowed {
			sleep = max(sleep, d.RetryAfter)
		}
	}
	if sleep <= 0 {
		sleep = time.Millisecond // as WaitAll: a denial without a retry cannot spin
	}
	for i, d := range ds {
		if !d.Allowed && (!rules[i].wait || waited+sleep > rules[i].cfg.MaxWait) {
			return 0, false
		}
	}
	return sleep, true
}

// decide is one decision over reqs, into ds: Allow for a single request,
// AllowAll for several (on copies, so that reqs and ds can live on the
// caller's stack).
func decide(ctx context.Context, lim limiter.Limiter, reqs []limiter.Request, ds []limiter.Decision) (bool, error) {
	if len(reqs) == 1 {
		d, err := lim.Allow(ctx, reqs[0])
		ds[0] = d
		return d.Allowed, err
	}
	out := make([]limiter.Decision, len(reqs))
	allowed, err := lim.AllowAll(ctx, slices.Clone(reqs), out)
	copy(ds, out)
	return allowed, err
}

// waitable reports whether a denied request may wait: every rule that
// denied it is a wait rule whose max_wait leaves room for the first sleep.
func waitable(rules []*rateRule, ds []limiter.Decision) bool {
	var sleep time.Duration
	for _, d := range ds {
		sleep = max(sleep, d.RetryAfter)
	}
	for i, d := range ds {
		if !d.Allowed && (!rules[i].wait || sleep > rules[i].cfg.MaxWait) {
			return false
		}
	}
	return true
}

// rateCheckFailed handles a decision that failed (Redis unreachable, an
// error, a timeout) as on_redis_error says: every rule of the request
// allows it, or it is refused.
func (srv *Server) rateCheckFailed(rl *rateLimits, log warnLogger, rules []*rateRule, err error, severity string) error {
	srv.rateMet.redisErrors.Inc()
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.cfg.Name
	}
	outcome := "error_denied"
	if rl.onErrAllow {
		outcome = "error_allowed"
	}
	for _, name := range names {
		srv.rateMet.decisions.WithLabelValues(name, "all", outcome).Inc()
	}
	if rl.onErrAllow {
		log.Warn("rate limit check failed; allowing (on_redis_error allow)", zap.String("rule", strings.Join(names, ", ")), zap.Error(err))
		return nil
	}
	log.Warn("rate limit check failed; denying (on_redis_error deny)", zap.String("rule", strings.Join(names, ", ")), zap.Error(err))
	return errRateCheckUnavailable(severity, names)
}

// loginBuckets returns the buckets a login takes from the rules checked
// before authentication (preAuth), or from those checked after it.
func loginBuckets(preAuth bool) func(r *rateRule) []limiter.Bucket {
	return func(r *rateRule) []limiter.Bucket {
		if r.preAuth != preAuth {
			return nil
		}
		return r.login
	}
}

// loginRate checks a login against the connections buckets of the rules
// of rates checked before authentication (preAuth) or after it. A wait is
// bounded by client_login_timeout, and ends if the client leaves.
func (s *session) loginRate(rates []sessionRate, preAuth bool) error {
	if len(rates) == 0 {
		return nil
	}
	deadline := s.login.deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(time.Hour)
	}
	ctx, cancel := context.WithDeadline(s.srv.ctx, deadline)
	defer cancel()
	return s.srv.checkRate(ctx, s.log, rates, loginBuckets(preAuth), "FATAL",
		rateWait{conn: s.conn, deadline: s.login.deadline, owner: loginWait{s}})
}

// loginWait is the owner of a login's rate-limit wait.
type loginWait struct{ s *session }

// leaveLoop implements waitOwner: a login is on a goroutine of its own.
func (loginWait) leaveLoop() {}

// waitEnded implements waitOwner: a login ends with a shutdown
// (stopAccepting wakes it) or at its deadline.
func (l loginWait) waitEnded() *wire.Error {
	switch {
	case l.s.srv.shuttingDown():
		return errShuttingDown()
	case !l.s.login.deadline.IsZero() && !time.Now().Before(l.s.login.deadline):
		return errLoginTimeout()
	}
	return nil
}

// leaveLoop implements waitOwner for a session's requests.
func (s *session) leaveLoop() { s.yieldLoop() }

// waitEnded implements waitOwner for a session's requests: the session
// ends with its final message (finishLocked wakes it), or closed. A
// hand-over claim (errHandedOver) is no end: a wait is inside a read, whose
// attach takes the claim back (bindServer), and the claim comes again at
// the next idle point (handover.go).
func (s *session) waitEnded() *wire.Error {
	if werr := s.endErr.Load(); werr != nil && werr != errHandedOver {
		return werr
	}
	if s.closed.Load() {
		return errShuttingDown()
	}
	return nil
}

// requestBuckets returns the buckets a request takes: a query, and a
// transaction when it starts one.
func requestBuckets(startsTx bool) func(r *rateRule) []limiter.Bucket {
	if startsTx {
		return func(r *rateRule) []limiter.Bucket { return r.request[1] }
	}
	return func(r *rateRule) []limiter.Bucket { return r.request[0] }
}
