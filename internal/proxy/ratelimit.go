package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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
}

// rateRule is one compiled rule.
type rateRule struct {
	cfg    config.RateLimitRule
	subnet *net.IPNet
	addr   net.IP
	wait   bool
	// Buckets, named as in the configuration.
	queries, transactions, connections *limiter.Bucket
}

// sessionRate is a rule that applies to a session, with the session's key.
type sessionRate struct {
	rule *rateRule
	key  string
}

func bucketOf(name string, b *config.RateBucket) *limiter.Bucket {
	if b == nil {
		return nil
	}
	return &limiter.Bucket{Name: name, Limit: b.Limit, Per: b.Per, Cost: 1}
}

// newRateLimits compiles cfg's rules. With no rules it returns nil.
func newRateLimits(cfg *config.Config) (*rateLimits, error) {
	if len(cfg.RateLimits) == 0 {
		return nil, nil
	}
	rl := &rateLimits{onErrAllow: cfg.OnRedisError == "allow", backend: cfg.RateLimitBackend}
	for _, r := range cfg.RateLimits {
		cr := &rateRule{cfg: r, wait: r.Mode == "wait",
			queries: bucketOf("queries", r.Queries), transactions: bucketOf("transactions", r.Transactions),
			connections: bucketOf("connections", r.Connections)}
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
		rl.lim = limiter.NewRedis(rl.redis, limiter.RedisOptions{Timeout: cfg.RedisTimeout})
	default:
		rl.lim = limiter.NewMemory(limiter.MemoryOptions{})
	}
	return rl, nil
}

func (rl *rateLimits) close() {
	if rl != nil && rl.redis != nil {
		rl.closeOnce.Do(func() { _ = rl.redis.Close() })
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

// errRateLimited builds the 53400 refusal naming the rule and bucket.
func errRateLimited(severity string, r *rateRule, d limiter.Decision) *wire.Error {
	// Rounded up: a retry under half a millisecond must not read "retry
	// in 0s", and retrying at the announced time must succeed.
	retry := max(d.RetryAfter.Truncate(time.Millisecond), time.Millisecond)
	if retry < d.RetryAfter {
		retry += time.Millisecond
	}
	return &wire.Error{Severity: severity, Code: "53400",
		Message: fmt.Sprintf("rate limit exceeded: rule %q, bucket %s", r.cfg.Name, d.Bucket),
		Detail:  fmt.Sprintf("retry in %s", retry),
		Hint:    "slow down, or ask the operator to raise the rule's limit (rate_limits in the poolerd configuration)"}
}

// checkRate asks every applicable rule for the buckets a request takes
// (queries, transactions or connections, as picked by which). A reject
// rule refuses at once; a wait rule delays up to its max_wait. It returns
// the refusal, or nil to go on.
func (srv *Server) checkRate(ctx context.Context, log warnLogger, rates []sessionRate, which func(*rateRule) []limiter.Bucket, severity string) error {
	rl := srv.rates.Load()
	if rl == nil {
		return nil
	}
	var buf [3]limiter.Bucket
	for _, sr := range rates {
		r := sr.rule
		buckets := which(r)
		if len(buckets) == 0 {
			continue
		}
		req := limiter.Request{Key: sr.key, Buckets: append(buf[:0], buckets...)}
		start := time.Now()
		var d limiter.Decision
		var err error
		waited := time.Duration(0)
		if r.wait {
			d, waited, err = limiter.Wait(ctx, rl.lim, req, r.cfg.MaxWait)
		} else {
			d, err = rl.lim.Allow(ctx, req)
		}
		if rl.redis != nil {
			srv.rateMet.redisLatency.Observe(time.Since(start).Seconds() - waited.Seconds())
		}
		if err != nil && ctx.Err() != nil {
			return errShuttingDown()
		}
		if err != nil {
			srv.rateMet.redisErrors.Inc()
			if rl.onErrAllow {
				srv.rateMet.decisions.WithLabelValues(r.cfg.Name, "all", "error_allowed").Inc()
				log.Warn("rate limit check failed; allowing (on_redis_error allow)", zap.String("rule", r.cfg.Name), zap.Error(err))
				continue
			}
			srv.rateMet.decisions.WithLabelValues(r.cfg.Name, "all", "error_denied").Inc()
			log.Warn("rate limit check failed; denying (on_redis_error deny)", zap.String("rule", r.cfg.Name), zap.Error(err))
			return &wire.Error{Severity: severity, Code: "53400", Message: fmt.Sprintf("rate limit check unavailable: rule %q", r.cfg.Name),
				Detail: "the rate-limit store (Redis) failed and on_redis_error is deny",
				Hint:   "retry shortly; the operator can set on_redis_error allow"}
		}
		if !d.Allowed {
			srv.rateMet.decisions.WithLabelValues(r.cfg.Name, d.Bucket, "rejected").Inc()
			if r.wait {
				srv.rateMet.wait.WithLabelValues(r.cfg.Name).Observe(waited.Seconds())
			}
			return errRateLimited(severity, r, d)
		}
		outcome := "allowed"
		if waited > 0 {
			outcome = "waited"
			srv.rateMet.wait.WithLabelValues(r.cfg.Name).Observe(waited.Seconds())
		}
		srv.rateMet.decisions.WithLabelValues(r.cfg.Name, "all", outcome).Inc()
	}
	return nil
}

func connectionsBucket(r *rateRule) []limiter.Bucket {
	if r.connections == nil {
		return nil
	}
	return []limiter.Bucket{*r.connections}
}

// requestBuckets returns the buckets a request takes: a query, and a
// transaction when it starts one.
func requestBuckets(startsTx bool) func(r *rateRule) []limiter.Bucket {
	return func(r *rateRule) []limiter.Bucket {
		var out []limiter.Bucket
		if r.queries != nil {
			out = append(out, *r.queries)
		}
		if startsTx && r.transactions != nil {
			out = append(out, *r.transactions)
		}
		return out
	}
}
