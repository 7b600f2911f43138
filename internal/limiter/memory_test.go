package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// one returns a request for a single bucket.
func one(key string, limit int64, per time.Duration, cost int64) Request {
	return Request{Key: key, Buckets: []Bucket{{Name: "b", Limit: limit, Per: per, Cost: cost}}}
}

func mustAllow(t *testing.T, l Limiter, req Request) Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), req)
	if err != nil {
		t.Fatalf("Allow(%+v): %v", req, err)
	}
	return d
}

// warmAllow is mustAllow for a first call with a short timeout, which may
// miss it on a loaded machine while the connection is dialled and the script
// loaded: it tries a few times.
func warmAllow(t *testing.T, l Limiter, req Request) Decision {
	t.Helper()
	var err error
	for range 20 {
		var d Decision
		if d, err = l.Allow(context.Background(), req); err == nil {
			return d
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("Allow(%+v): %v", req, err)
	return Decision{}
}

// countAllowed calls Allow n times at the current instant and returns how
// many were allowed.
func countAllowed(t *testing.T, l Limiter, req Request, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		if mustAllow(t, l, req).Allowed {
			allowed++
		}
	}
	return allowed
}

// TestGCRASequences replays sequences of requests on fake time and checks
// every decision exactly.
func TestGCRASequences(t *testing.T) {
	type step struct {
		after time.Duration // fake time to let pass before the request
		cost  int64
		allow bool
		retry time.Duration // expected RetryAfter when denied
	}
	allow := func(cost int64) step { return step{cost: cost, allow: true} }
	deny := func(cost int64, retry time.Duration) step { return step{cost: cost, retry: retry} }
	at := func(after time.Duration, s step) step { s.after = after; return s }
	repeat := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name  string
		limit int64
		per   time.Duration
		steps []step
	}{
		{
			name: "burst of limit, then one per interval", limit: 10, per: time.Second,
			steps: cat(repeat(10, allow(1)), []step{
				deny(1, 100*time.Millisecond),
				at(99*time.Millisecond, deny(1, time.Millisecond)),
				at(time.Millisecond, allow(1)),
				deny(1, 100*time.Millisecond),
				at(100*time.Millisecond, allow(1)),
			}),
		},
		{
			name: "cost debits several units", limit: 10, per: time.Second,
			steps: []step{
				allow(3), allow(3), allow(3),
				deny(3, 200*time.Millisecond), // 9 used, needs 2 more units
				allow(1),                      // the denied request took nothing
				deny(1, 100*time.Millisecond),
				at(300*time.Millisecond, allow(3)),
				deny(1, 100*time.Millisecond),
			},
		},
		{
			name: "cost 0 means 1", limit: 2, per: time.Second,
			steps: []step{allow(0), allow(0), deny(0, 500*time.Millisecond)},
		},
		{
			name: "cost equal to limit needs a full bucket", limit: 5, per: time.Second,
			steps: []step{
				allow(5), deny(1, 200*time.Millisecond),
				at(600*time.Millisecond, deny(5, 400*time.Millisecond)),
				at(400*time.Millisecond, allow(5)),
			},
		},
		{
			name: "partial refill", limit: 10, per: time.Second,
			steps: cat(repeat(10, allow(1)), []step{at(350*time.Millisecond, allow(1))}, repeat(2, allow(1)),
				[]step{deny(1, 50*time.Millisecond)}),
		},
		{
			name: "idle time refills no more than the burst", limit: 10, per: time.Second,
			steps: cat([]step{at(time.Hour, allow(1))}, repeat(9, allow(1)), []step{deny(1, 100*time.Millisecond)}),
		},
		{
			name: "period not divisible by limit", limit: 3, per: time.Second,
			steps: cat(repeat(3, allow(1)), []step{
				// Increments round down: 3 units take 999999999ns, so the
				// 4th fits 1ns earlier than P/L.
				deny(1, 333333332*time.Nanosecond),
				at(333333331*time.Nanosecond, deny(1, time.Nanosecond)),
				at(time.Nanosecond, allow(1)),
				deny(3, time.Second), // 3·P/L is exactly P: needs a full bucket
			}),
		},
		{
			name: "one per hour", limit: 1, per: time.Hour,
			steps: []step{allow(1), deny(1, time.Hour), at(59*time.Minute, deny(1, time.Minute)), at(time.Minute, allow(1))},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := NewMemory(MemoryOptions{})
				for i, s := range tc.steps {
					time.Sleep(s.after)
					req := Request{Key: "k", Buckets: []Bucket{{Name: "queries", Limit: tc.limit, Per: tc.per, Cost: s.cost}}}
					d := mustAllow(t, m, req)
					want := Decision{Allowed: s.allow}
					if !s.allow {
						want = Decision{Bucket: "queries", RetryAfter: s.retry}
					}
					if d != want {
						t.Fatalf("step %d (cost %d at +%v): got %+v, want %+v", i, s.cost, s.after, d, want)
					}
				}
			})
		})
	}
}

// TestGCRARate checks the long-run rate: 50/s attempted every millisecond
// for 2s allows the burst of 50 plus one per 20ms.
func TestGCRARate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		req := one("k", 50, time.Second, 1)
		allowed := 0
		for i := 0; i <= 2000; i++ { // instants 0, 1ms, ..., 2000ms
			if mustAllow(t, m, req).Allowed {
				allowed++
			}
			time.Sleep(time.Millisecond)
		}
		if want := 50 + 100; allowed != want {
			t.Fatalf("allowed %d in 2s at 50/s, want %d (burst 50 + 100)", allowed, want)
		}
	})
}

func TestMultiBucketAtomic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		queries := Bucket{Name: "queries", Limit: 100, Per: time.Second}
		xacts := Bucket{Name: "transactions", Limit: 2, Per: time.Second}
		both := Request{Key: "rule|user=alice", Buckets: []Bucket{queries, xacts}}
		onlyQueries := Request{Key: both.Key, Buckets: []Bucket{queries}}

		for i := range 2 {
			if d := mustAllow(t, m, both); !d.Allowed {
				t.Fatalf("request %d denied: %+v", i, d)
			}
		}
		d := mustAllow(t, m, both)
		if want := (Decision{Bucket: "transactions", RetryAfter: 500 * time.Millisecond}); d != want {
			t.Fatalf("3rd request: got %+v, want %+v", d, want)
		}
		// The denied request must not have debited queries: 100 - 2 remain.
		if got := countAllowed(t, m, onlyQueries, 200); got != 98 {
			t.Fatalf("queries allowed after the denial: %d, want 98 (the denied request debited queries?)", got)
		}
		// And queries denying must not debit transactions either.
		time.Sleep(500 * time.Millisecond) // transactions: 1 unit back; queries: 50 back
		if got := countAllowed(t, m, onlyQueries, 50); got != 50 {
			t.Fatalf("queries allowed after 500ms: %d, want 50", got)
		}
		d = mustAllow(t, m, both)
		if want := (Decision{Bucket: "queries", RetryAfter: 10 * time.Millisecond}); d != want {
			t.Fatalf("request with queries exhausted: got %+v, want %+v", d, want)
		}
		xactOnly := Request{Key: both.Key, Buckets: []Bucket{xacts}}
		if d := mustAllow(t, m, xactOnly); !d.Allowed {
			t.Fatalf("transactions denied after a request denied by queries: %+v (it was debited)", d)
		}
	})
}

// TestDenyingBucket checks that the Decision names the bucket with the
// longest retry, whatever the order, the first one on ties, and that its
// RetryAfter makes the whole request pass.
func TestDenyingBucket(t *testing.T) {
	a := Bucket{Name: "a", Limit: 2, Per: time.Second}     // retry 500ms when empty
	b := Bucket{Name: "b", Limit: 1, Per: time.Second}     // retry 1s
	c := Bucket{Name: "c", Limit: 4, Per: 2 * time.Second} // retry 500ms
	free := Bucket{Name: "free", Limit: 1000, Per: time.Second}
	tests := []struct {
		name    string
		buckets []Bucket
		want    Decision
	}{
		{"longest last", []Bucket{free, a, b}, Decision{Bucket: "b", RetryAfter: time.Second}},
		{"longest first", []Bucket{b, a, free}, Decision{Bucket: "b", RetryAfter: time.Second}},
		{"tie goes to the first", []Bucket{c, a}, Decision{Bucket: "c", RetryAfter: 500 * time.Millisecond}},
		{"tie goes to the first, reversed", []Bucket{a, c}, Decision{Bucket: "a", RetryAfter: 500 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := NewMemory(MemoryOptions{})
				// Exhaust every limited bucket (free keeps capacity).
				for _, bk := range tc.buckets {
					if bk.Name == "free" {
						continue
					}
					exhaust := Request{Key: "k", Buckets: []Bucket{{Name: bk.Name, Limit: bk.Limit, Per: bk.Per, Cost: bk.Limit}}}
					if d := mustAllow(t, m, exhaust); !d.Allowed {
						t.Fatalf("exhausting %s: %+v", bk.Name, d)
					}
				}
				req := Request{Key: "k", Buckets: tc.buckets}
				d := mustAllow(t, m, req)
				if d != tc.want {
					t.Fatalf("got %+v, want %+v", d, tc.want)
				}
				time.Sleep(d.RetryAfter - time.Nanosecond)
				if d := mustAllow(t, m, req); d.Allowed {
					t.Fatalf("allowed before RetryAfter")
				}
				time.Sleep(time.Nanosecond)
				if d := mustAllow(t, m, req); !d.Allowed {
					t.Fatalf("denied at RetryAfter: %+v", d)
				}
			})
		})
	}
}

func TestKeysAreIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		for _, key := range []string{"r|user=alice", "r|user=bob"} {
			if got := countAllowed(t, m, one(key, 3, time.Second, 1), 5); got != 3 {
				t.Fatalf("%s: allowed %d, want 3", key, got)
			}
		}
		// Same key, other bucket name: another limit.
		other := Request{Key: "r|user=alice", Buckets: []Bucket{{Name: "other", Limit: 3, Per: time.Second}}}
		if got := countAllowed(t, m, other, 5); got != 3 {
			t.Fatalf("other bucket: allowed %d, want 3", got)
		}
	})
}

func TestInvalidRequests(t *testing.T) {
	ok := Bucket{Name: "q", Limit: 10, Per: time.Second}
	with := func(f func(*Bucket)) []Bucket { b := ok; f(&b); return []Bucket{b} }
	tests := []struct {
		name string
		req  Request
	}{
		{"empty key", Request{Buckets: []Bucket{ok}}},
		{"no name", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Name = "" })}},
		{"duplicate name", Request{Key: "k", Buckets: []Bucket{ok, {Name: "x", Limit: 1, Per: time.Second}, ok}}},
		{"zero limit", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Limit = 0 })}},
		{"negative limit", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Limit = -1 })}},
		{"zero period", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Per = 0 })}},
		{"period too long", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Per = MaxPer + 1 })}},
		{"negative cost", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Cost = -1 })}},
		{"cost above limit", Request{Key: "k", Buckets: with(func(b *Bucket) { b.Cost = 11 })}},
	}
	m := NewMemory(MemoryOptions{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := m.Allow(context.Background(), tc.req)
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("err = %v, want ErrInvalidRequest", err)
			}
			if d != (Decision{}) {
				t.Fatalf("decision %+v with an error", d)
			}
		})
	}
	if m.Len() != 0 {
		t.Fatalf("invalid requests stored %d states", m.Len())
	}
	t.Run("no buckets is allowed", func(t *testing.T) {
		if d := mustAllow(t, m, Request{Key: "k"}); !d.Allowed {
			t.Fatalf("got %+v", d)
		}
	})
	t.Run("many buckets", func(t *testing.T) {
		synctest.Test(t, manyBuckets)
	})
}

// manyBuckets checks a request with more buckets than fit the inline
// scratch arrays.
func manyBuckets(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	var bs []Bucket
	for i := range 2 * inlineBuckets {
		bs = append(bs, Bucket{Name: fmt.Sprint("b", i), Limit: int64(i + 1), Per: time.Hour})
	}
	req := Request{Key: "k", Buckets: bs}
	if d := mustAllow(t, m, req); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	if d := mustAllow(t, m, req); d.Allowed || d.Bucket != "b0" || d.RetryAfter != time.Hour {
		t.Fatalf("second: %+v, want denied by b0 for 1h", d)
	}
}

// TestIncrementExact checks the 128-bit cost·Per/Limit.
func TestIncrementExact(t *testing.T) {
	tests := []struct {
		b    Bucket
		want int64
	}{
		{Bucket{Limit: 10, Per: time.Second, Cost: 1}, 100e6},
		{Bucket{Limit: 3, Per: time.Second, Cost: 1}, 333333333},
		{Bucket{Limit: 3, Per: time.Second, Cost: 3}, 1e9},
		{Bucket{Limit: 3, Per: time.Second}, 333333333},
		{Bucket{Limit: 2_000_000, Per: time.Minute, Cost: 1500}, 45e6},
		{Bucket{Limit: 1 << 40, Per: MaxPer, Cost: 1 << 40}, int64(MaxPer)}, // cost·Per overflows 64 bits
		{Bucket{Limit: 1 << 40, Per: MaxPer, Cost: 1<<40 - 1}, int64(MaxPer) - int64(MaxPer)/(1<<40) - 1},
	}
	for _, tc := range tests {
		if got := increment(&tc.b); got != tc.want {
			t.Errorf("increment(%+v) = %d, want %d", tc.b, got, tc.want)
		}
	}
}

// TestConcurrentExactBound hammers one request from 50 goroutines on fake
// time: the number allowed in the window is exactly the GCRA bound.
func TestConcurrentExactBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		req := Request{Key: "k", Buckets: []Bucket{
			{Name: "queries", Limit: 1000, Per: time.Second},
			{Name: "transactions", Limit: 50, Per: time.Second},
		}}
		const window = 2 * time.Second
		start := time.Now()
		var allowed, denied atomic.Int64
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				for time.Since(start) <= window {
					d, err := m.Allow(context.Background(), req)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						allowed.Add(1)
						continue
					}
					denied.Add(1)
					time.Sleep(d.RetryAfter)
				}
			})
		}
		wg.Wait()
		// Burst of 50 at 0, then one per 20ms up to and including 2s.
		if got, want := allowed.Load(), int64(50+100); got != want {
			t.Fatalf("allowed %d, want exactly %d (denied %d)", got, want, denied.Load())
		}
	})
}

// TestConcurrentFrozenClock runs goroutines in parallel on a frozen clock
// (real scheduling, for the race detector): exactly Limit are allowed per
// key, and the multi-bucket debit is consistent.
func TestConcurrentFrozenClock(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewMemory(MemoryOptions{Now: func() time.Time { return now }})
	keys := []string{"a", "b", "c", "d"}
	mk := func(key string) Request {
		return Request{Key: key, Buckets: []Bucket{
			{Name: "queries", Limit: 1000, Per: time.Second},
			{Name: "transactions", Limit: 100, Per: time.Second},
		}}
	}
	var allowed [4]atomic.Int64
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % len(keys)
				d, err := m.Allow(context.Background(), mk(keys[k]))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				} else if d.Bucket != "transactions" || d.RetryAfter != 10*time.Millisecond {
					t.Errorf("denial %+v, want transactions for 10ms", d)
					return
				}
			}
		})
	}
	wg.Wait()
	for k, key := range keys {
		if got := allowed[k].Load(); got != 100 {
			t.Errorf("key %s: allowed %d, want exactly 100", key, got)
		}
		onlyQueries := Request{Key: key, Buckets: mk(key).Buckets[:1]}
		if got := countAllowed(t, m, onlyQueries, 1000); got != 900 {
			t.Errorf("key %s: queries left %d, want 900", key, got)
		}
	}
}

// probeShards calls Allow on a key of every shard n times, with a bucket
// whose state expires within nanoseconds, to trigger lazy sweeps.
func probeShards(t *testing.T, m *Memory, n int) {
	t.Helper()
	probes := make(map[int]string)
	for i := 0; len(probes) < numShards; i++ {
		k := fmt.Sprint("probe-", i)
		if _, ok := probes[m.shardOf(k)]; !ok {
			probes[m.shardOf(k)] = k
		}
	}
	for _, k := range probes {
		req := Request{Key: k, Buckets: []Bucket{{Name: "p", Limit: 1e9, Per: time.Second}}}
		for range n {
			mustAllow(t, m, req)
		}
	}
}

func TestStaleStateEvicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		const keys = 1000
		for i := range keys {
			req := Request{Key: fmt.Sprint("user-", i), Buckets: []Bucket{
				{Name: "queries", Limit: 10, Per: time.Second},
				{Name: "transactions", Limit: 5, Per: time.Second},
			}}
			mustAllow(t, m, req)
		}
		// A state that stays live: 1 per hour, used.
		live := one("live", 1, time.Hour, 1)
		mustAllow(t, m, live)
		if got := m.Len(); got != keys+1 {
			t.Fatalf("Len = %d, want %d", got, keys+1)
		}

		// Before the TATs pass, sweeps keep everything.
		probeShards(t, m, sweepMinOps+keys/numShards)
		if got := m.Len(); got < keys+1 {
			t.Fatalf("Len = %d after sweeping live states, want ≥ %d", got, keys+1)
		}

		time.Sleep(200 * time.Millisecond) // every TAT but live's has passed
		probeShards(t, m, sweepMinOps+keys/numShards)
		if got := m.Len(); got > numShards+1 {
			t.Fatalf("Len = %d after all TATs passed and every shard swept, want ≤ %d", got, numShards+1)
		}
		if d := mustAllow(t, m, live); d.Allowed {
			t.Fatalf("the live state was evicted: %+v", d)
		}
	})
}

// TestSweepKeepsLiveBuckets checks that a sweep drops the stale buckets of
// a key whose other buckets are live, and keeps those.
func TestSweepKeepsLiveBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		short := Bucket{Name: "short", Limit: 10, Per: time.Second}
		long := Bucket{Name: "long", Limit: 1, Per: time.Hour}
		req := Request{Key: "k", Buckets: []Bucket{short, long}}
		mustAllow(t, m, req)
		time.Sleep(200 * time.Millisecond)
		probeShards(t, m, sweepMinOps+1)
		sh := &m.shards[m.shardOf("k")]
		sh.mu.Lock()
		state := sh.keys["k"]
		sh.mu.Unlock()
		if len(state) != 1 || state[0].name != "long" {
			t.Fatalf("state after the sweep: %+v, want only long", state)
		}
		if d := mustAllow(t, m, req); d.Allowed || d.Bucket != "long" {
			t.Fatalf("%+v, want denied by long", d)
		}
		if got := countAllowed(t, m, Request{Key: "k", Buckets: []Bucket{short}}, 20); got != 10 {
			t.Fatalf("short allowed %d, want a full burst of 10", got)
		}
	})
}

// TestShardMapShrinks checks that a shard's map is rebuilt once most of
// its entries are gone, since Go maps keep their peak memory.
func TestShardMapShrinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		var keys []string
		for i := 0; len(keys) < 2*shrinkMinPeak; i++ {
			if k := fmt.Sprint("k", i); m.shardOf(k) == 0 {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			mustAllow(t, m, one(k, 1, time.Second, 1))
		}
		sh := &m.shards[0]
		if sh.peak < len(keys) {
			t.Fatalf("peak %d, want ≥ %d", sh.peak, len(keys))
		}
		time.Sleep(time.Second)
		for range len(keys) { // enough decisions to trigger a sweep
			mustAllow(t, m, one(keys[0], 1e9, time.Second, 1))
		}
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if len(sh.keys) > 1 || sh.peak > 1 {
			t.Fatalf("after the sweep: len %d, peak %d; want ≤ 1 (map rebuilt)", len(sh.keys), sh.peak)
		}
	})
}

// TestMemoryAllowNoAlloc guards the zero-allocation steady state.
func TestMemoryAllowNoAlloc(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	ctx := context.Background()
	req := Request{Key: "rule|user=alice", Buckets: []Bucket{
		{Name: "queries", Limit: 1 << 40, Per: time.Second},
		{Name: "transactions", Limit: 1 << 40, Per: time.Second},
		{Name: "bytes", Limit: 1 << 40, Per: time.Second, Cost: 512},
	}}
	denied := one("denied", 1, time.Hour, 1)
	mustAllow(t, m, req)
	mustAllow(t, m, denied)
	if n := testing.AllocsPerRun(1000, func() {
		_, _ = m.Allow(ctx, req)
		_, _ = m.Allow(ctx, denied)
	}); n != 0 {
		t.Fatalf("Allow allocates %v times per decision pair, want 0", n)
	}
}
