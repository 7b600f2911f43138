package limiter

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// MemoryOptions configures NewMemory.
type MemoryOptions struct {
	// Now is the time source; nil means the system clock, read as
	// time.Since(creation) (monotonic: immune to wall-clock steps, and the
	// fake clock inside a testing/synctest bubble). Decisions use only
	// differences between its readings.
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
	// decisions as the shard holds keys, so sweeping costs O(1) amortized
	// per decision.
	sweepMinOps = 64
	// shrinkMinPeak: after a sweep, a shard whose map has fallen below a
	// quarter of its peak size (of at least shrinkMinPeak keys) is copied
	// into a fresh map, since Go maps never release their memory.
	shrinkMinPeak = 1024
)

// bucketTAT is the state of one bucket of a key. name is the caller's
// Bucket.Name, not copied.
type bucketTAT struct {
	name string
	tat  int64 // TAT, in nanoseconds since Memory.epoch
}

// shardState is the content of a shard.
type shardState struct {
	mu sync.Mutex
	// keys maps a Request.Key (the caller's string, not copied) to the
	// states of its buckets, usually in the order requests name them. A
	// decision hashes its key once, finds each bucket by a short linear
	// scan and updates the TATs in place through the slice.
	keys map[string][]bucketTAT
	ops  int // decisions since the last sweep
	peak int // largest len(keys) since the map was made
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
// Key, so a decision locks one mutex and looks up one map entry, whatever
// the number of buckets, and requests for different keys rarely contend.
// A decision allocates nothing once its key and buckets have state.
type Memory struct {
	now    func() time.Time // nil: time.Since(epoch), one monotonic clock read
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
	if m.sleep == nil {
		m.sleep = sleepCtx
	}
	m.epoch = m.Now()
	for i := range m.shards {
		m.shards[i].keys = make(map[string][]bucketTAT)
	}
	return m
}

// Now returns the current time of the limiter's clock.
func (m *Memory) Now() time.Time {
	if m.now == nil {
		return time.Now()
	}
	return m.now()
}

// nanos returns the current time in nanoseconds since m.epoch.
func (m *Memory) nanos() int64 {
	if m.now == nil {
		return int64(time.Since(m.epoch))
	}
	return int64(m.now().Sub(m.epoch))
}

// Sleep blocks for d on the limiter's clock or until ctx is done.
func (m *Memory) Sleep(ctx context.Context, d time.Duration) error { return m.sleep(ctx, d) }

// Allow implements Limiter. It ignores ctx: the decision never blocks
// beyond a shard's mutex.
func (m *Memory) Allow(_ context.Context, req Request) (Decision, error) {
	n := len(req.Buckets)
	var incBuf, tatBuf [inlineBuckets]int64
	var slotBuf [inlineBuckets]int
	incs, tats, slots := incBuf[:], tatBuf[:], slotBuf[:]
	if n > inlineBuckets {
		incs, tats, slots = make([]int64, n), make([]int64, n), make([]int, n)
	}
	incs, tats, slots = incs[:n], tats[:n], slots[:n]
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
	now := m.nanos()
	sh := &m.shards[m.shardOf(req.Key)]
	sh.mu.Lock()
	state, worst, worstRetry := sh.check(&req, incs, tats, slots, now)
	if worst < 0 {
		sh.debit(&req, state, tats, slots)
	}
	sh.decided(now)
	sh.mu.Unlock()

	if worst >= 0 {
		return Decision{Bucket: req.Buckets[worst].Name, RetryAfter: time.Duration(worstRetry)}, nil
	}
	return Decision{Allowed: true}, nil
}

// AllowAll implements Limiter. It ignores ctx, as Allow does. It locks
// the shards of all the requests' keys at once, in shard order (so that
// two AllowAll calls cannot deadlock), decides every request at the same
// instant, and debits all of them or none before unlocking.
func (m *Memory) AllowAll(ctx context.Context, reqs []Request, ds []Decision) (bool, error) {
	if len(reqs) == 1 && len(ds) >= 1 {
		d, err := m.Allow(ctx, reqs[0])
		ds[0] = d
		return d.Allowed, err
	}
	n := bucketCount(reqs)
	var incBuf, tatBuf [2 * inlineBuckets]int64
	var slotBuf [2 * inlineBuckets]int
	incs, tats, slots := incBuf[:], tatBuf[:], slotBuf[:]
	if n > len(incBuf) {
		incs, tats, slots = make([]int64, n), make([]int64, n), make([]int, n)
	}
	incs, tats, slots = incs[:n], tats[:n], slots[:n]
	if err := prepareAll(reqs, ds, incs); err != nil {
		clear(ds[:min(len(ds), len(reqs))])
		return false, err
	}
	// The shards to lock, ascending and each once; shardIdx[i] is
	// request i's.
	var idxBuf, lockBuf [inlineBuckets]int
	shardIdx, locks := idxBuf[:0], lockBuf[:0]
	var states [inlineBuckets][]bucketTAT
	stateOf := states[:0]
	for i := range reqs {
		k := m.shardOf(reqs[i].Key)
		shardIdx = append(shardIdx, k)
		if j, found := slices.BinarySearch(locks, k); !found {
			locks = slices.Insert(locks, j, k)
		}
		stateOf = append(stateOf, nil)
	}

	now := m.nanos()
	for _, k := range locks {
		m.shards[k].mu.Lock()
	}
	allowed := true
	off := 0
	for i := range reqs {
		req := &reqs[i]
		b := len(req.Buckets)
		var worst int
		var retry int64
		stateOf[i], worst, retry = m.shards[shardIdx[i]].check(req, incs[off:off+b], tats[off:off+b], slots[off:off+b], now)
		if worst >= 0 {
			ds[i] = Decision{Bucket: req.Buckets[worst].Name, RetryAfter: time.Duration(retry)}
			allowed = false
		} else {
			ds[i] = Decision{Allowed: true}
		}
		off += b
	}
	if allowed {
		off = 0
		for i := range reqs {
			b := len(reqs[i].Buckets)
			m.shards[shardIdx[i]].debit(&reqs[i], stateOf[i], tats[off:off+b], slots[off:off+b])
			off += b
		}
	}
	for i := len(locks) - 1; i >= 0; i-- {
		sh := &m.shards[locks[i]]
		sh.decided(now)
		sh.mu.Unlock()
	}
	return allowed, nil
}

// Charge implements Limiter. It ignores ctx, as Allow does. It locks the
// shards of all the requests' keys, in shard order, and adds every
// bucket's cost.
func (m *Memory) Charge(_ context.Context, reqs []Request) error {
	n := bucketCount(reqs)
	var incBuf [2 * inlineBuckets]int64
	incs := incBuf[:]
	if n > len(incBuf) {
		incs = make([]int64, n)
	}
	incs = incs[:n]
	if err := prepareCharge(reqs, incs); err != nil {
		return err
	}
	var lockBuf [inlineBuckets]int
	locks := lockBuf[:0]
	for i := range reqs {
		k := m.shardOf(reqs[i].Key)
		if j, found := slices.BinarySearch(locks, k); !found {
			locks = slices.Insert(locks, j, k)
		}
	}
	now := m.nanos()
	for _, k := range locks {
		m.shards[k].mu.Lock()
	}
	off := 0
	for i := range reqs {
		req := &reqs[i]
		m.shards[m.shardOf(req.Key)].charge(req, incs[off:off+len(req.Buckets)], now)
		off += len(req.Buckets)
	}
	for i := len(locks) - 1; i >= 0; i-- {
		sh := &m.shards[locks[i]]
		sh.decided(now)
		sh.mu.Unlock()
	}
	return nil
}

// charge adds incs to the TATs of req's buckets in sh (locked) at now.
func (sh *shard) charge(req *Request, incs []int64, now int64) {
	state := sh.keys[req.Key]
	grown := false
	for i := range req.Buckets {
		if incs[i] == 0 {
			continue
		}
		slot := find(state, req.Buckets[i].Name, i)
		tat := now
		if slot >= 0 && state[slot].tat > now {
			tat = state[slot].tat
		}
		tat = min(tat+incs[i], now+maxDebt)
		if slot >= 0 {
			state[slot].tat = tat
		} else {
			state = append(state, bucketTAT{req.Buckets[i].Name, tat})
			grown = true
		}
	}
	if grown {
		sh.keys[req.Key] = state
		sh.peak = max(sh.peak, len(sh.keys))
	}
}

// check computes, in sh (locked) at now, the TAT every bucket of req would
// have once debited (into tats, with each bucket's index in the key's
// state, or -1, into slots). It returns the key's state and the index of
// the bucket with the longest retry with that retry, or -1 when all allow.
func (sh *shard) check(req *Request, incs, tats []int64, slots []int, now int64) (state []bucketTAT, worst int, worstRetry int64) {
	state = sh.keys[req.Key]
	worst = -1
	for i := range req.Buckets {
		tat := now
		slots[i] = find(state, req.Buckets[i].Name, i)
		if slots[i] >= 0 && state[slots[i]].tat > now {
			tat = state[slots[i]].tat
		}
		tats[i] = tat + incs[i]
		if retry := tats[i] - int64(req.Buckets[i].Per) - now; retry > worstRetry {
			worst, worstRetry = i, retry
		}
	}
	return state, worst, worstRetry
}

// debit stores the TATs check computed for req (sh locked).
func (sh *shard) debit(req *Request, state []bucketTAT, tats []int64, slots []int) {
	if state == nil {
		state = make([]bucketTAT, 0, len(req.Buckets))
	}
	grown := false
	for i := range req.Buckets {
		if slots[i] >= 0 {
			state[slots[i]].tat = tats[i] // in place: no map write
		} else {
			state = append(state, bucketTAT{req.Buckets[i].Name, tats[i]})
			grown = true
		}
	}
	if grown {
		sh.keys[req.Key] = state
		sh.peak = max(sh.peak, len(sh.keys))
	}
}

// decided counts a decision on sh (locked) and sweeps it when due.
func (sh *shard) decided(now int64) {
	sh.ops++
	if sh.ops >= sweepMinOps && sh.ops >= len(sh.keys) {
		sh.sweep(now)
	}
}

// find returns the index of bucket name in state, or -1. It tries hint
// first: requests usually name a key's buckets in the same order.
func find(state []bucketTAT, name string, hint int) int {
	if hint < len(state) && state[hint].name == name {
		return hint
	}
	for i := range state {
		if state[i].name == name {
			return i
		}
	}
	return -1
}

// shardOf returns the index of the shard holding key's state.
func (m *Memory) shardOf(key string) int {
	return int(maphash.String(m.seed, key) & (numShards - 1))
}

// sweep drops the bucket states whose TAT is not after now, and the keys
// left without any: such a bucket is full, exactly as if it had no state.
// sh.mu must be held.
func (sh *shard) sweep(now int64) {
	sh.ops = 0
	for key, state := range sh.keys {
		live := state[:0]
		for _, b := range state {
			if b.tat > now {
				live = append(live, b)
			}
		}
		switch {
		case len(live) == 0:
			delete(sh.keys, key)
		case len(live) < len(state):
			clear(state[len(live):]) // drop the names' references
			sh.keys[key] = live
		}
	}
	if sh.peak >= shrinkMinPeak && len(sh.keys) < sh.peak/4 {
		fresh := make(map[string][]bucketTAT, len(sh.keys))
		for key, state := range sh.keys {
			fresh[key] = state
		}
		sh.keys = fresh
		sh.peak = len(fresh)
	}
}

// Len returns the number of keys with state, stale state not yet evicted
// included.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}
