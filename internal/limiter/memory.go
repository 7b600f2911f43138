package limiter

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
	"unsafe"
)

// MemoryOptions configures NewMemory.
type MemoryOptions struct {
	// Now is the time source; nil means time.Now. Decisions use only
	// differences between its readings, so a time.Now clock is immune to
	// wall-clock steps (it carries a monotonic reading).
	Now func() time.Time
	// Sleep is how Wait sleeps for this limiter: it must block for d on
	// the same clock as Now, or until ctx is done and then return
	// ctx.Err(). nil means a time.Timer, which is right for time.Now and
	// inside testing/synctest bubbles.
	Sleep func(ctx context.Context, d time.Duration) error
}

const (
	// numShards is the number of independently locked parts of the state
	// map (a power of two).
	numShards = 64
	// sweepMinOps is the minimum number of decisions a shard makes between
	// two sweeps for stale state. A sweep also waits for at least as many
	// decisions as the shard holds entries, so sweeping costs O(1)
	// amortized per decision.
	sweepMinOps = 64
	// shrinkMinPeak: after a sweep, a shard whose map has fallen below a
	// quarter of its peak size (of at least shrinkMinPeak entries) is
	// copied into a fresh map, since Go maps never release their buckets.
	shrinkMinPeak = 1024
)

// stateKey identifies one bucket's state. Both strings come from the
// caller's Request and are not copied, so looking up a key allocates
// nothing.
type stateKey struct {
	key, bucket string
}

// shardState is the content of a shard.
type shardState struct {
	mu   sync.Mutex
	tats map[stateKey]int64 // TAT, in nanoseconds since Memory.epoch
	ops  int                // decisions since the last sweep
	peak int                // largest len(tats) since the map was made
}

// shard is one locked part of the state map, padded to a multiple of 128
// bytes (two cache lines, the unit of adjacent-line prefetch) so that
// shards locked by different CPUs do not share cache lines.
type shard struct {
	shardState
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

// Memory is an in-process Limiter. Its zero value is not usable; create
// one with NewMemory. It needs no Close: stale state is evicted lazily by
// the decisions themselves.
//
// A request's state lives in one of 64 shards chosen by a hash of its
// Key, so a decision locks one mutex once, whatever the number of
// buckets, and requests for different keys rarely contend. A decision
// allocates nothing once its (key, bucket) entries exist.
type Memory struct {
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	epoch  time.Time
	seed   maphash.Seed
	shards [numShards]shard
}

var _ interface {
	Limiter
	Clock
} = (*Memory)(nil)

// NewMemory returns an in-memory limiter.
func NewMemory(opts MemoryOptions) *Memory {
	m := &Memory{now: opts.Now, sleep: opts.Sleep, seed: maphash.MakeSeed()}
	if m.now == nil {
		m.now = time.Now
	}
	if m.sleep == nil {
		m.sleep = sleepCtx
	}
	m.epoch = m.now()
	for i := range m.shards {
		m.shards[i].tats = make(map[stateKey]int64)
	}
	return m
}

// Now returns the current time of the limiter's clock.
func (m *Memory) Now() time.Time { return m.now() }

// Sleep blocks for d on the limiter's clock or until ctx is done.
func (m *Memory) Sleep(ctx context.Context, d time.Duration) error { return m.sleep(ctx, d) }

// Allow implements Limiter. It ignores ctx: the decision never blocks
// beyond a shard's mutex.
func (m *Memory) Allow(_ context.Context, req Request) (Decision, error) {
	n := len(req.Buckets)
	var incBuf, tatBuf [inlineBuckets]int64
	incs, tats := incBuf[:], tatBuf[:]
	if n > inlineBuckets {
		incs, tats = make([]int64, n), make([]int64, n)
	}
	incs, tats = incs[:n], tats[:n]
	if err := prepare(req, incs); err != nil {
		return Decision{}, err
	}
	if n == 0 {
		return Decision{Allowed: true}, nil
	}

	// The clock is read before locking, to keep the critical section
	// short. Decisions on a shard may then see instants out of order,
	// which GCRA tolerates: the number of requests allowed with instants
	// in any window [a, b] stays at most Limit + (b−a)/(Per/Limit).
	now := int64(m.now().Sub(m.epoch))
	sh := &m.shards[m.shardOf(req.Key)]
	sh.mu.Lock()
	worst, worstRetry := -1, int64(0)
	for i := range req.Buckets {
		tat, ok := sh.tats[stateKey{req.Key, req.Buckets[i].Name}]
		if !ok || tat < now {
			tat = now
		}
		tats[i] = tat + incs[i]
		if retry := tats[i] - int64(req.Buckets[i].Per) - now; retry > worstRetry {
			worst, worstRetry = i, retry
		}
	}
	if worst < 0 {
		for i := range req.Buckets {
			sh.tats[stateKey{req.Key, req.Buckets[i].Name}] = tats[i]
		}
		if l := len(sh.tats); l > sh.peak {
			sh.peak = l
		}
	}
	sh.ops++
	if sh.ops >= sweepMinOps && sh.ops >= len(sh.tats) {
		sh.sweep(now)
	}
	sh.mu.Unlock()

	if worst >= 0 {
		return Decision{Bucket: req.Buckets[worst].Name, RetryAfter: time.Duration(worstRetry)}, nil
	}
	return Decision{Allowed: true}, nil
}

// shardOf returns the index of the shard holding key's state.
func (m *Memory) shardOf(key string) int {
	return int(maphash.String(m.seed, key) & (numShards - 1))
}

// sweep deletes the entries whose TAT is not after now: such a bucket is
// full, exactly as if it had no state. sh.mu must be held.
func (sh *shard) sweep(now int64) {
	sh.ops = 0
	for k, tat := range sh.tats {
		if tat <= now {
			delete(sh.tats, k)
		}
	}
	if sh.peak >= shrinkMinPeak && len(sh.tats) < sh.peak/4 {
		fresh := make(map[stateKey]int64, len(sh.tats))
		for k, tat := range sh.tats {
			fresh[k] = tat
		}
		sh.tats = fresh
		sh.peak = len(fresh)
	}
}

// Len returns the number of (key, bucket) states held, stale ones not yet
// evicted included.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.tats)
		sh.mu.Unlock()
	}
	return n
}
