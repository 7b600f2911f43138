package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions configures NewRedis.
type RedisOptions struct {
	// Prefix starts every Redis key the limiter writes; "" means
	// DefaultRedisPrefix. Limiters that share a Redis and a Prefix share
	// their limits.
	Prefix string
	// Timeout bounds each call to Redis, so that a slow or unreachable
	// Redis never stalls the caller for longer; 0 means
	// DefaultRedisTimeout.
	Timeout time.Duration
}

// Defaults of RedisOptions.
const (
	DefaultRedisPrefix  = "poolerd:rl:"
	DefaultRedisTimeout = 50 * time.Millisecond
)

// allowScript is the whole Redis decision: GCRA over every bucket of a
// request, debiting all of them or none, on the Redis server's clock so
// that every poolerd instance sees the same time. Times are microseconds
// since the Unix epoch, as Lua numbers (doubles: exact integers up to
// 2^53, about 0.25µs of resolution at today's dates); a TAT is stored with
// 17 significant digits so that it reads back exactly. Redis 5 and later
// replicate scripts by their effects, so reading TIME before writing is
// allowed.
//
// KEYS[i] is bucket i's state key. ARGV[2i-1] is its increment
// cost·Per/Limit and ARGV[2i] its period Per, both in nanoseconds. The
// reply is {1, 0, 0} when allowed, or {0, i, retry_µs} naming the bucket i
// (1-based) with the longest retry, the first one on ties.
var allowScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats = {}
local worst, worstRetry = 0, 0
for i = 1, #KEYS do
  local inc = tonumber(ARGV[2 * i - 1]) / 1000
  local per = tonumber(ARGV[2 * i]) / 1000
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if not tat or tat < now then
    tat = now
  end
  tats[i] = tat + inc
  local retry = tats[i] - per - now
  if retry > worstRetry then
    worst, worstRetry = i, retry
  end
end
if worst > 0 then
  return {0, worst, math.ceil(worstRetry)}
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%.17g', tats[i]),
    'PX', math.floor((tats[i] - now) / 1000) + 1)
end
return {1, 0, 0}
`)

// Redis is a Limiter whose state lives in Redis, so that every poolerd
// instance using the same Redis and key prefix shares the limits. Create
// one with NewRedis.
//
// Each decision is one EVALSHA of a Lua script (EVAL the first time the
// server lacks it) that reads the server's clock, computes every bucket's
// GCRA state and writes all of them or none, so the decision is atomic
// across buckets and instances. A bucket's state is one string key,
// Prefix + "{" + Request.Key + "}:" + Bucket.Name, holding its TAT and
// expiring just after it: a key exists only while its bucket is not full.
// The braces are a Redis Cluster hash tag: all keys of a request live in
// one slot, as a multi-key script requires.
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	// detach runs each call in its own goroutine and abandons it when the
	// timeout passes, for clients that do not apply context deadlines to
	// their network I/O (see NewRedis).
	detach bool
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a limiter that keeps its state in Redis through client,
// which remains the caller's to close.
//
// The Timeout of opts is enforced in either case, but it is cheapest with
// a *redis.Client, *redis.ClusterClient or *redis.Ring created with
// ContextTimeoutEnabled: the context deadline then reaches the socket.
// With any other client, each call runs in a goroutine that is abandoned
// (left to finish on the client's own ReadTimeout) when Timeout passes.
// Setting MaxRetries to -1 on the client is advisable too, since a script
// retried after a timeout may have run already and would debit twice, and
// DialerRetries to 1, so that a refused connection fails at once instead
// of using up the Timeout in dial retries.
func NewRedis(client redis.UniversalClient, opts RedisOptions) *Redis {
	r := &Redis{client: client, prefix: opts.Prefix, timeout: opts.Timeout, detach: !honoursContext(client)}
	if r.prefix == "" {
		r.prefix = DefaultRedisPrefix
	}
	if r.timeout <= 0 {
		r.timeout = DefaultRedisTimeout
	}
	return r
}

// honoursContext reports whether client applies context deadlines to its
// network I/O.
func honoursContext(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Allow implements Limiter. A call that does not complete within the
// Timeout returns an error wrapping context.DeadlineExceeded; any Redis
// failure is returned as an error, leaving the caller to decide whether to
// fail open or closed. After a timeout the script may still have run, so
// the buckets may or may not have been debited.
func (r *Redis) Allow(ctx context.Context, req Request) (Decision, error) {
	n := len(req.Buckets)
	var incBuf [inlineBuckets]int64
	incs := incBuf[:]
	if n > inlineBuckets {
		incs = make([]int64, n)
	}
	incs = incs[:n]
	if err := prepare(req, incs); err != nil {
		return Decision{}, err
	}
	if n == 0 {
		return Decision{Allowed: true}, nil
	}
	keys := make([]string, n)
	args := make([]any, 2*n)
	tag := r.prefix + "{" + req.Key + "}:"
	for i := range req.Buckets {
		keys[i] = tag + req.Buckets[i].Name
		args[2*i] = incs[i]
		args[2*i+1] = int64(req.Buckets[i].Per)
	}

	res, err := r.call(ctx, "allow", func(ctx context.Context) (any, error) {
		return allowScript.Run(ctx, r.client, keys, args...).Result()
	})
	if err != nil {
		return Decision{}, err
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != 3 {
		return Decision{}, fmt.Errorf("limiter: redis allow: unexpected script reply %v", res)
	}
	allowed, ok1 := vals[0].(int64)
	idx, ok2 := vals[1].(int64)
	retry, ok3 := vals[2].(int64)
	switch {
	case !ok1 || !ok2 || !ok3:
		return Decision{}, fmt.Errorf("limiter: redis allow: unexpected script reply %v", res)
	case allowed == 1:
		return Decision{Allowed: true}, nil
	case idx < 1 || idx > int64(n) || retry <= 0:
		return Decision{}, fmt.Errorf("limiter: redis allow: unexpected script reply %v", res)
	}
	return Decision{Bucket: req.Buckets[idx-1].Name, RetryAfter: time.Duration(retry) * time.Microsecond}, nil
}

// Ping checks that Redis answers within the Timeout, for health checks.
func (r *Redis) Ping(ctx context.Context) error {
	_, err := r.call(ctx, "ping", func(ctx context.Context) (any, error) {
		return r.client.Ping(ctx).Result()
	})
	return err
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

type callResult struct {
	v   any
	err error
}

// call runs fn with a context bounded by the Timeout and wraps its error.
func (r *Redis) call(parent context.Context, op string, fn func(context.Context) (any, error)) (any, error) {
	ctx, cancel := context.WithTimeout(parent, r.timeout)
	defer cancel()
	var v any
	var err error
	if r.detach {
		done := make(chan callResult, 1)
		go func() {
			v, err := fn(ctx)
			done <- callResult{v, err}
		}()
		select {
		case res := <-done:
			v, err = res.v, res.err
		case <-ctx.Done():
			err = ctx.Err()
		}
	} else {
		v, err = fn(ctx)
	}
	if err == nil {
		return v, nil
	}
	if parent.Err() == nil && (ctx.Err() != nil || isTimeout(err)) {
		// A timeout, not the caller's context ending: say so, and make
		// the error match context.DeadlineExceeded whatever the client
		// returned (an i/o timeout when the socket deadline fires before
		// the context's timer).
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("limiter: redis %s: no answer within %v: %w", op, r.timeout, err)
		}
		return nil, fmt.Errorf("limiter: redis %s: no answer within %v: %w: %w", op, r.timeout, context.DeadlineExceeded, err)
	}
	return nil, fmt.Errorf("limiter: redis %s: %w", op, err)
}
