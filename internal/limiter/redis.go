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

// allowScript is the whole Redis decision: GCRA over every bucket of one
// or several requests, debiting all of them or none, on the Redis server's
// clock so that every poolerd instance sees the same time. Times are
// microseconds since the Unix epoch, as Lua numbers (doubles: exact
// integers up to 2^53, about 0.25µs of resolution at today's dates); a TAT
// is stored with 17 significant digits so that it reads back exactly.
// Redis 5 and later replicate scripts by their effects, so reading TIME
// before writing is allowed.
//
// KEYS are the state keys of every bucket, request after request. ARGV[1]
// is the number of requests; then, for each request, its number of
// buckets m followed by m pairs: the bucket's increment cost·Per/Limit and
// its period Per, both in nanoseconds. The reply is {allowed, then for
// each request i: the bucket (1-based within the request) with the longest
// retry, the first one on ties, or 0 when the request's buckets had room,
// and that retry in µs}; allowed is 1 when every request had room, and
// only then is any key written (not those of Deferred buckets, whose
// increment is 0: they are only checked).
var allowScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats, incs = {}, {}
local reply = {1}
local k, a = 1, 2
for r = 1, tonumber(ARGV[1]) do
  local m = tonumber(ARGV[a])
  a = a + 1
  local worst, worstRetry = 0, 0
  for j = 1, m do
    local inc = tonumber(ARGV[a]) / 1000
    local per = tonumber(ARGV[a + 1]) / 1000
    a = a + 2
    local tat = tonumber(redis.call('GET', KEYS[k]))
    if not tat or tat < now then
      tat = now
    end
    tats[k] = tat + inc
    incs[k] = inc
    local retry = tats[k] - per - now
    if retry > worstRetry then
      worst, worstRetry = j, retry
    end
    k = k + 1
  end
  reply[2 * r] = worst
  reply[2 * r + 1] = math.ceil(worstRetry)
  if worst > 0 then
    reply[1] = 0
  end
end
if reply[1] == 1 then
  for i = 1, #KEYS do
    if incs[i] > 0 then
      redis.call('SET', KEYS[i], string.format('%.17g', tats[i]),
        'PX', math.floor((tats[i] - now) / 1000) + 1)
    end
  end
end
return reply
`)

// chargeScript adds costs measured after the fact: for every key, TAT :=
// max(TAT, now) + inc, on the server's clock, whatever the result (a
// bucket may go into debt, by at most 2·MaxPer). KEYS are the buckets'
// state keys, ARGV their increments in nanoseconds, in the same order; a
// bucket's period does not matter here (its expiry is its TAT). It
// returns the number of keys written.
var chargeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[#KEYS + 1]) / 1000
local n = 0
for i = 1, #KEYS do
  local inc = tonumber(ARGV[i]) / 1000
  if inc > 0 then
    local tat = tonumber(redis.call('GET', KEYS[i]))
    if not tat or tat < now then
      tat = now
    end
    tat = math.min(tat + inc, now + cap)
    redis.call('SET', KEYS[i], string.format('%.17g', tat),
      'PX', math.floor((tat - now) / 1000) + 1)
    n = n + 1
  end
end
return n
`)

// Redis is a Limiter whose state lives in Redis, so that every poolerd
// instance using the same Redis and key prefix shares the limits. Create
// one with NewRedis.
//
// Each decision (Allow, or AllowAll of several requests) is one EVALSHA of
// a Lua script (EVAL the first time the server lacks it) that reads the
// server's clock, computes every bucket's GCRA state and writes all of
// them or none, so the decision is atomic across buckets, requests and
// instances. A bucket's state is one string key,
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

// Timeout is the limit on each call (RedisOptions.Timeout, or its default).
func (r *Redis) Timeout() time.Duration { return r.timeout }

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
	reqs := [1]Request{req}
	var ds [1]Decision
	_, err := r.AllowAll(ctx, reqs[:], ds[:])
	return ds[0], err
}

// AllowAll implements Limiter, in one script call over the keys of every
// request; errors and timeouts are as for Allow. On a Redis Cluster a
// multi-key script must stay within one hash slot, and the keys of two
// requests are in two slots (each request's Key is its own hash tag): use
// AllowAll with several requests on a single Redis only.
func (r *Redis) AllowAll(ctx context.Context, reqs []Request, ds []Decision) (bool, error) {
	keys, args, done, err := r.allowCall(reqs, ds)
	if done || err != nil {
		return err == nil, err
	}
	res, err := r.call(ctx, "allow", func(ctx context.Context) (any, error) {
		return allowScript.Run(ctx, r.client, keys, args...).Result()
	})
	return finishAllow(res, err, reqs, ds)
}

// allowCall prepares allowScript's keys and arguments for reqs. done: there
// was nothing to ask (no buckets: ds say allowed), or err (invalid
// requests: ds cleared).
func (r *Redis) allowCall(reqs []Request, ds []Decision) (keys []string, args []any, done bool, err error) {
	n := bucketCount(reqs)
	var incBuf [inlineBuckets]int64
	incs := incBuf[:]
	if n > inlineBuckets {
		incs = make([]int64, n)
	}
	incs = incs[:n]
	if err := prepareAll(reqs, ds, incs); err != nil {
		clear(ds[:min(len(ds), len(reqs))])
		return nil, nil, true, err
	}
	if n == 0 {
		for i := range reqs {
			ds[i] = Decision{Allowed: true}
		}
		return nil, nil, true, nil
	}
	keys = make([]string, 0, n)
	args = make([]any, 0, 1+len(reqs)+2*n)
	args = append(args, len(reqs))
	k := 0
	for _, req := range reqs {
		tag := r.prefix + "{" + req.Key + "}:"
		args = append(args, len(req.Buckets))
		for _, b := range req.Buckets {
			keys = append(keys, tag+b.Name)
			args = append(args, incs[k], int64(b.Per))
			k++
		}
	}
	return keys, args, false, nil
}

// finishAllow decodes allowScript's reply res (or its error) into ds and
// says whether every request was allowed.
func finishAllow(res any, err error, reqs []Request, ds []Decision) (bool, error) {
	if err == nil {
		err = decodeReply(res, reqs, ds)
	}
	if err != nil {
		clear(ds[:len(reqs)])
		return false, err
	}
	for i := range reqs {
		if !ds[i].Allowed {
			return false, nil
		}
	}
	return true, nil
}

// A Batched is one decision of AllowBatch: AllowAll of Reqs into Ds, its
// outcome in Allowed and Err.
type Batched struct {
	Reqs    []Request
	Ds      []Decision
	Allowed bool
	Err     error
}

// AllowBatch makes several independent decisions in one round trip: each
// is AllowAll of its own requests (atomic across them), in one pipeline of
// script calls, so that one decision's denial or error is its own. The
// Timeout bounds the whole round trip, and errors and timeouts are as for
// Allow, for every decision the round trip did not answer. The Redis
// Cluster caveat of AllowAll applies within a decision.
func (r *Redis) AllowBatch(ctx context.Context, batch []Batched) {
	type call struct {
		b        *Batched
		keys     []string
		args     []any
		cmd      *redis.Cmd
		noScript bool
	}
	calls := make([]call, 0, len(batch))
	for i := range batch {
		b := &batch[i]
		keys, args, done, err := r.allowCall(b.Reqs, b.Ds)
		if done || err != nil {
			b.Allowed, b.Err = err == nil, err
			continue
		}
		calls = append(calls, call{b: b, keys: keys, args: args})
	}
	if len(calls) == 0 {
		return
	}
	_, err := r.call(ctx, "allow", func(ctx context.Context) (any, error) {
		// run sends the calls not sent yet or refused with NOSCRIPT.
		run := func() error {
			pipe := r.client.Pipeline()
			n := 0
			for i := range calls {
				c := &calls[i]
				if c.cmd != nil && !c.noScript {
					continue
				}
				c.cmd, c.noScript = allowScript.EvalSha(ctx, pipe, c.keys, c.args...), false
				n++
			}
			if n == 0 {
				return nil
			}
			_, err := pipe.Exec(ctx)
			if err != nil && !isRedisReply(err) {
				return err // the round trip failed: no answers
			}
			return nil
		}
		if err := run(); err != nil {
			return nil, err
		}
		// Redis lost the script (a restart, SCRIPT FLUSH): load it and
		// ask again for the decisions it refused with NOSCRIPT.
		again := false
		for i := range calls {
			if err := calls[i].cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				calls[i].noScript, again = true, true
			}
		}
		if again {
			if err := allowScript.Load(ctx, r.client).Err(); err != nil {
				return nil, err
			}
			if err := run(); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	for i := range calls {
		c := &calls[i]
		if err != nil {
			c.b.Allowed, c.b.Err = finishAllow(nil, err, c.b.Reqs, c.b.Ds)
			continue
		}
		res, cerr := c.cmd.Result()
		if cerr != nil {
			cerr = fmt.Errorf("limiter: redis allow: %w", cerr)
		}
		c.b.Allowed, c.b.Err = finishAllow(res, cerr, c.b.Reqs, c.b.Ds)
	}
}

// isRedisReply reports whether err is an error Redis answered a command
// with (each command's own, as opposed to the round trip failing).
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// Charge implements Limiter, in one script call over the keys of every
// bucket of reqs that has a cost; errors and timeouts are as for Allow
// (after a timeout the charge may or may not have been made), and the
// Redis Cluster caveat of AllowAll applies to several requests.
func (r *Redis) Charge(ctx context.Context, reqs []Request) error {
	n := bucketCount(reqs)
	incs := make([]int64, n)
	if err := prepareCharge(reqs, incs); err != nil {
		return err
	}
	keys := make([]string, 0, n)
	args := make([]any, 0, n+1)
	k := 0
	for _, req := range reqs {
		tag := r.prefix + "{" + req.Key + "}:"
		for _, b := range req.Buckets {
			if incs[k] > 0 {
				keys = append(keys, tag+b.Name)
				args = append(args, incs[k])
			}
			k++
		}
	}
	if len(keys) == 0 {
		return nil
	}
	args = append(args, maxDebt)
	_, err := r.call(ctx, "charge", func(ctx context.Context) (any, error) {
		return chargeScript.Run(ctx, r.client, keys, args...).Result()
	})
	return err
}

// decodeReply fills ds from allowScript's reply.
func decodeReply(res any, reqs []Request, ds []Decision) error {
	bad := fmt.Errorf("limiter: redis allow: unexpected script reply %v", res)
	vals, ok := res.([]any)
	if !ok || len(vals) != 1+2*len(reqs) {
		return bad
	}
	allowed, ok := vals[0].(int64)
	if !ok {
		return bad
	}
	for i := range reqs {
		idx, ok1 := vals[1+2*i].(int64)
		retry, ok2 := vals[2+2*i].(int64)
		switch {
		case !ok1 || !ok2 || idx < 0 || idx > int64(len(reqs[i].Buckets)):
			return bad
		case idx == 0:
			ds[i] = Decision{Allowed: true}
		case retry <= 0 || allowed == 1:
			return bad
		default:
			ds[i] = Decision{Bucket: reqs[i].Buckets[idx-1].Name, RetryAfter: time.Duration(retry) * time.Microsecond}
		}
	}
	return nil
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
