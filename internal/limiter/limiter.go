// Package limiter implements poolerd's rate limits: several buckets checked
// and debited in one atomic decision, a waiting variant that applies
// backpressure, Prometheus metrics, an in-memory backend for one process and
// a Redis backend for limits shared by a fleet of poolerd instances.
//
// # Model
//
// A Bucket allows at most Limit units per Per, with a burst of Limit: a full
// bucket allows Limit units at once, then one unit every Per/Limit. Every
// backend implements it as GCRA (the generic cell rate algorithm), which
// keeps a single number per bucket, the theoretical arrival time (TAT).
// For a request of cost c on a bucket (Limit L, Per P):
//
//	inc     = c·P/L                // emission interval times cost
//	newTAT  = max(TAT, now) + inc
//	allowAt = newTAT − P           // earliest time the request fits the burst
//	allowed = now ≥ allowAt        // then TAT := newTAT
//	retry   = allowAt − now        // when denied
//
// A Deferred bucket takes part in a decision with an increment of 0: it
// allows when TAT ≤ now + P, that is when it is not in debt, and its
// retry is how long until the debt is paid off. Charge then adds a cost
// measured afterwards to it unconditionally (newTAT = max(TAT, now) +
// c·P/L), so a bucket may go into debt by any amount, up to MaxPer at a
// time: the requests of its key wait, or are refused, until the debt has
// been paid off at L per P.
//
// A Request names several buckets under one key. Allow computes every
// bucket's newTAT from the same state and the same instant; if all allow,
// all TATs are stored, otherwise none is, and the Decision names the
// bucket with the longest retry (the first one on ties): the whole request
// is allowed after that retry, as long as nobody else takes the capacity in
// between. A bucket whose TAT is in the past is indistinguishable from a
// full bucket, so backends drop such state (lazily in memory, by key expiry
// in Redis).
//
// AllowAll extends the same rule to several requests under different keys
// (the budgets of several rules a client matches): every bucket of every
// request is computed from one state at one instant, and all are debited
// or none is. Each request's own Decision says whether its buckets had room
// and, if not, which bucket denied and when it would have room.
//
// # Backends
//
// Memory (NewMemory) keeps the TATs in a sharded map: one mutex per shard,
// one lock per request (AllowAll holds the locks of all its requests'
// shards at once, taken in shard order), no allocation per decision in
// steady state. Redis (NewRedis) runs one Lua script per decision, Allow's
// or AllowAll's, that reads the server clock, checks every bucket and
// debits all or none, so every poolerd instance sharing the Redis shares
// the limits; each call is bounded by a timeout and a Redis failure is
// returned as an error for the caller to fail open or closed.
//
// Wait retries a denied request after its RetryAfter until it is allowed,
// ctx ends or a maximum wait would be exceeded; WaitAll does the same for
// an AllowAll of several requests, each with its own maximum wait.
//
// It does not know clients, rules or SQL: the proxy compiles the configured
// rate_limits into keys and buckets, asks for decisions, and turns a denial
// into the client's error.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// Bucket is one limit: at most Limit units per Per, as GCRA with a burst of
// Limit (a full bucket allows Limit units at once, then one unit every
// Per/Limit).
type Bucket struct {
	// Name identifies the bucket within a Request's key ("queries",
	// "transactions", "connections", ...). It must not be empty and must
	// be unique within a Request; it is reported in Decision.Bucket.
	Name string
	// Limit is the number of units allowed per Per, and the burst. > 0.
	Limit int64
	// Per is the period of Limit: > 0 and at most MaxPer.
	Per time.Duration
	// Cost is the number of units this request takes, usually 1; 0 means
	// 1. A cost above Limit can never be allowed and is rejected with
	// ErrInvalidRequest. In a Charge, it is the cost measured: any
	// non-negative number, 0 charging nothing.
	Cost int64
	// Deferred marks a bucket whose cost is known only once the request
	// is over (the time it held a server, the rows it returned): Allow
	// and AllowAll do not debit it, they only check that it is not in
	// debt, and the cost is debited afterwards with Charge. Its Cost is
	// ignored by Allow.
	Deferred bool
}

// Request asks for every bucket at once, under one key. The caller builds
// keys such as "rule-name|user=alice"; a bucket's state is identified by
// (Key, Bucket.Name), so the same bucket name under two keys is two
// independent limits.
type Request struct {
	// Key identifies whose limits these are. It must not be empty.
	Key string
	// Buckets are checked and debited atomically. A request without
	// buckets is always allowed.
	Buckets []Bucket
}

// Decision is the outcome of a request.
type Decision struct {
	// Allowed reports whether every bucket allowed the request (and was
	// debited).
	Allowed bool
	// Bucket is the name of the bucket that denied the request, the one
	// with the longest RetryAfter; "" when allowed.
	Bucket string
	// RetryAfter is how long until the whole request would be allowed if
	// nobody else consumed capacity meanwhile; 0 when allowed.
	RetryAfter time.Duration
}

// Limiter checks requests. Implementations are safe for concurrent use.
type Limiter interface {
	// Allow checks all buckets of req atomically: either all are debited
	// (Allowed) or none is. A non-nil error means no decision was made
	// (invalid request, backend failure); the Decision is then zero.
	Allow(ctx context.Context, req Request) (Decision, error)
	// AllowAll checks every bucket of every request of reqs as one
	// decision: either all are debited (it returns true) or none is. The
	// requests' keys must differ. ds must have at least len(reqs)
	// elements: ds[i] receives request i's own Decision, Allowed when its
	// buckets had room (debited only if AllowAll returns true), otherwise
	// naming its denying bucket and retry. A non-nil error means no
	// decision was made; ds is then zeroed.
	AllowAll(ctx context.Context, reqs []Request, ds []Decision) (bool, error)
	// Charge debits costs measured after the fact: every bucket of every
	// request of reqs by its Cost, unconditionally (it may put the
	// bucket into debt), as one atomic update. Buckets need not be
	// Deferred; their Cost may exceed Limit. A non-nil error means
	// nothing was charged, or, after a Redis timeout, that it is unknown
	// whether it was.
	Charge(ctx context.Context, reqs []Request) error
}

// Clock is implemented by limiters whose decisions follow their own clock,
// such as a Memory with an injected time source. Wait measures and sleeps
// with a limiter's Clock when it has one, and with the time package
// otherwise.
type Clock interface {
	// Now returns the current time of the limiter's clock.
	Now() time.Time
	// Sleep blocks for d or until ctx is done, in which case it returns
	// ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
}

// MaxPer is the longest Bucket.Per accepted.
const MaxPer = 366 * 24 * time.Hour

// maxDebt bounds how far ahead of now a charged bucket's TAT may go, so
// that charges cannot overflow it.
const maxDebt = 2 * int64(MaxPer)

// ErrInvalidRequest is wrapped by the errors Allow returns for a malformed
// Request: an empty key, a bucket without a name or with a duplicate name,
// a non-positive Limit or Per, a Per above MaxPer, a negative Cost or a
// Cost above Limit.
var ErrInvalidRequest = errors.New("limiter: invalid request")

// inlineBuckets is the number of buckets a request can have before a
// decision needs heap scratch space.
const inlineBuckets = 8

// prepareAll validates reqs for AllowAll (each request as prepare does, no
// key twice, room in ds) and stores every bucket's increment in incs, the
// requests' buckets one after the other; incs has as many elements as
// there are buckets in all.
func prepareAll(reqs []Request, ds []Decision, incs []int64) error {
	if len(ds) < len(reqs) {
		return fmt.Errorf("%w: %d requests but room for %d decisions", ErrInvalidRequest, len(reqs), len(ds))
	}
	off := 0
	for i := range reqs {
		n := len(reqs[i].Buckets)
		if err := prepare(reqs[i], incs[off:off+n]); err != nil {
			return err
		}
		off += n
		for j := 0; j < i; j++ {
			if reqs[j].Key == reqs[i].Key {
				return fmt.Errorf("%w: key %q appears in two requests; merge their buckets into one", ErrInvalidRequest, reqs[i].Key)
			}
		}
	}
	return nil
}

// bucketCount returns the number of buckets of all of reqs.
func bucketCount(reqs []Request) int {
	n := 0
	for i := range reqs {
		n += len(reqs[i].Buckets)
	}
	return n
}

// prepare validates req and stores each bucket's increment (cost·Per/Limit,
// in nanoseconds) in incs, which has len(req.Buckets) elements.
func prepare(req Request, incs []int64) error {
	if req.Key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidRequest)
	}
	for i := range req.Buckets {
		b := &req.Buckets[i]
		if err := checkBucket(req.Key, b); err != nil {
			return err
		}
		for j := 0; j < i; j++ {
			if req.Buckets[j].Name == b.Name {
				return fmt.Errorf("%w: key %q: bucket %q appears twice", ErrInvalidRequest, req.Key, b.Name)
			}
		}
		if !b.Deferred {
			incs[i] = increment(b)
		}
	}
	return nil
}

// prepareCharge validates reqs for Charge and stores every bucket's
// increment in incs, as prepareAll does, except that a cost may exceed
// the bucket's limit (its increment is then capped at MaxPer) and is
// never taken as 1.
func prepareCharge(reqs []Request, incs []int64) error {
	off := 0
	for i := range reqs {
		req := &reqs[i]
		if req.Key == "" {
			return fmt.Errorf("%w: empty key", ErrInvalidRequest)
		}
		for j := range req.Buckets {
			b := req.Buckets[j]
			c := b.Cost
			b.Cost = 0
			if err := checkBucket(req.Key, &b); err != nil {
				return err
			}
			if c < 0 {
				return fmt.Errorf("%w: key %q: bucket %q: charged cost %d is negative", ErrInvalidRequest, req.Key, b.Name, c)
			}
			incs[off] = chargeIncrement(c, b.Limit, b.Per)
			off++
		}
	}
	return nil
}

// chargeIncrement returns cost·per/limit in nanoseconds, rounded down and
// capped at MaxPer.
func chargeIncrement(cost, limit int64, per time.Duration) int64 {
	hi, lo := bits.Mul64(uint64(cost), uint64(per))
	if hi >= uint64(limit) {
		return int64(MaxPer) // the quotient would not fit in 64 bits
	}
	q, _ := bits.Div64(hi, lo, uint64(limit))
	return int64(min(q, uint64(MaxPer)))
}

func checkBucket(key string, b *Bucket) error {
	switch {
	case b.Name == "":
		return fmt.Errorf("%w: key %q: bucket without a name", ErrInvalidRequest, key)
	case b.Limit <= 0:
		return fmt.Errorf("%w: key %q: bucket %q: limit %d is not positive", ErrInvalidRequest, key, b.Name, b.Limit)
	case b.Per <= 0 || b.Per > MaxPer:
		return fmt.Errorf("%w: key %q: bucket %q: period %v is not in (0, %v]", ErrInvalidRequest, key, b.Name, b.Per, MaxPer)
	case b.Deferred:
		return nil // its cost is not Allow's
	case b.Cost < 0:
		return fmt.Errorf("%w: key %q: bucket %q: cost %d is negative", ErrInvalidRequest, key, b.Name, b.Cost)
	case b.Cost > b.Limit:
		return fmt.Errorf("%w: key %q: bucket %q: cost %d exceeds the limit %d, the request could never be allowed",
			ErrInvalidRequest, key, b.Name, b.Cost, b.Limit)
	}
	return nil
}

// increment returns cost·Per/Limit in nanoseconds, rounded down, computed
// in 128 bits: it cannot overflow because cost ≤ Limit makes it ≤ Per.
// b must have passed checkBucket.
func increment(b *Bucket) int64 {
	cost := b.Cost
	if cost == 0 {
		cost = 1
	}
	hi, lo := bits.Mul64(uint64(cost), uint64(b.Per))
	q, _ := bits.Div64(hi, lo, uint64(b.Limit))
	return int64(q)
}

// systemClock is the Clock of limiters that have none.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error { return sleepCtx(ctx, d) }

// sleepCtx sleeps for d on a timer, returning ctx.Err() if ctx ends first.
// Inside a testing/synctest bubble the timer runs on the bubble's fake
// clock.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
