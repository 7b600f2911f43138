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

	"github.com/poolerd/poolerd/test/redistest"
)

// allowAll calls l.AllowAll and fails the test on an error.
func allowAll(t *testing.T, l Limiter, reqs ...Request) (bool, []Decision) {
	t.Helper()
	ds := make([]Decision, len(reqs))
	ok, err := l.AllowAll(context.Background(), reqs, ds)
	if err != nil {
		t.Fatalf("AllowAll: %v", err)
	}
	return ok, ds
}

// checkAllOrNone runs the same scenario on any backend, with periods of an
// hour so that the real time Redis sees pass changes nothing: two rules'
// requests, "wide" with room for 5 and "narrow" with room for 1. Once
// narrow is spent, AllowAll of both is denied with narrow named, wide
// reported as having room, and wide not debited.
func checkAllOrNone(t *testing.T, l Limiter) {
	wide := Request{Key: "wide|user=alice", Buckets: []Bucket{{Name: "queries", Limit: 5, Per: time.Hour}}}
	narrow := Request{Key: "narrow|app=x", Buckets: []Bucket{
		{Name: "queries", Limit: 1, Per: time.Hour},
		{Name: "transactions", Limit: 10, Per: time.Hour},
	}}
	if ok, ds := allowAll(t, l, wide, narrow); !ok || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("first: %v %+v, want both allowed", ok, ds)
	}
	for i := range 3 {
		ok, ds := allowAll(t, l, wide, narrow)
		if ok || !ds[0].Allowed || ds[1].Allowed || ds[1].Bucket != "queries" {
			t.Fatalf("denied %d: %v %+v, want narrow denying by queries and wide with room", i, ok, ds)
		}
		if ds[1].RetryAfter < 59*time.Minute || ds[1].RetryAfter > time.Hour {
			t.Fatalf("denied %d: narrow's retry %v, want about 1h", i, ds[1].RetryAfter)
		}
	}
	// Neither wide nor narrow's transactions were debited by the denials.
	if got := countAllowed(t, l, wide, 10); got != 4 {
		t.Fatalf("wide allowed %d after the denials, want 4 (5 - the one allowed with narrow)", got)
	}
	xacts := Request{Key: narrow.Key, Buckets: narrow.Buckets[1:]}
	if got := countAllowed(t, l, xacts, 20); got != 9 {
		t.Fatalf("narrow's transactions allowed %d after the denials, want 9", got)
	}
	// Now wide is spent too: both deny, each naming its own longest
	// retry (narrow's queries, 1h, not its transactions, 6m).
	ok, ds := allowAll(t, l, narrow, wide)
	if ok || ds[0].Allowed || ds[1].Allowed || ds[0].Bucket != "queries" || ds[0].RetryAfter < 59*time.Minute ||
		ds[1].Bucket != "queries" || ds[1].RetryAfter > 13*time.Minute {
		t.Fatalf("both spent: %v %+v", ok, ds)
	}
	// No requests: allowed.
	if ok, _ := allowAll(t, l); !ok {
		t.Fatal("AllowAll of no requests denied")
	}
}

func TestAllowAllMemory(t *testing.T) {
	frozen := time.Now()
	checkAllOrNone(t, NewMemory(MemoryOptions{Now: func() time.Time { return frozen }}))
}

func TestAllowAllRedis(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Prefix: "all:", Timeout: time.Second})
	checkAllOrNone(t, l)
	c := srv.Client()
	defer c.Close()
	// One state key per bucket of each request, as for Allow.
	for _, k := range []string{"all:{wide|user=alice}:queries", "all:{narrow|app=x}:queries", "all:{narrow|app=x}:transactions"} {
		if n, err := c.Exists(context.Background(), k).Result(); err != nil || n != 1 {
			t.Errorf("key %s: exists %d, %v", k, n, err)
		}
	}
}

func TestAllowAllInvalid(t *testing.T) {
	srv := redistest.StartTB(t)
	ok := Request{Key: "a", Buckets: []Bucket{{Name: "q", Limit: 1, Per: time.Second}}}
	other := Request{Key: "b", Buckets: ok.Buckets}
	tests := []struct {
		name string
		reqs []Request
		nds  int
	}{
		{"key twice", []Request{ok, other, ok}, 3},
		{"invalid bucket", []Request{ok, {Key: "b", Buckets: []Bucket{{Name: "q", Limit: 0, Per: time.Second}}}}, 2},
		{"too few decisions", []Request{ok, other}, 1},
	}
	for _, l := range []Limiter{NewMemory(MemoryOptions{}), newRedis(t, srv, RedisOptions{Prefix: "inv:", Timeout: time.Second})} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%T/%s", l, tc.name), func(t *testing.T) {
				ds := make([]Decision, tc.nds)
				for i := range ds {
					ds[i] = Decision{Bucket: "stale"}
				}
				allowed, err := l.AllowAll(context.Background(), tc.reqs, ds)
				if !errors.Is(err, ErrInvalidRequest) || allowed {
					t.Fatalf("got %v, %v; want ErrInvalidRequest", allowed, err)
				}
				for i, d := range ds {
					if d != (Decision{}) {
						t.Fatalf("decision %d %+v with an error, want zero", i, d)
					}
				}
			})
		}
		// Nothing was debited.
		if got := countAllowed(t, l, ok, 2); got != 1 {
			t.Fatalf("%T: allowed %d of a fresh bucket of 1 after invalid requests, want 1", l, got)
		}
	}
}

// TestAllowAllConcurrent has goroutines race AllowAll over two keys in
// both orders (and over keys in one shard and in different shards) on a
// frozen clock: no deadlock, and exactly the smaller limit is allowed,
// debited from both keys alike.
func TestAllowAllConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		keys := []string{"x", "y"}
		// A third key in x's shard, so that one AllowAll locks one shard
		// for two requests.
		for i := 0; ; i++ {
			if k := fmt.Sprint("z", i); m.shardOf(k) == m.shardOf("x") {
				keys = append(keys, k)
				break
			}
		}
		limits := map[string]int64{keys[0]: 200, keys[1]: 100, keys[2]: 300}
		req := func(key string) Request {
			return Request{Key: key, Buckets: []Bucket{{Name: "b", Limit: limits[key], Per: time.Hour}}}
		}
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ds := make([]Decision, 3)
				for range 100 {
					reqs := []Request{req(keys[0]), req(keys[1]), req(keys[2])}
					if g%2 == 1 {
						reqs[0], reqs[2] = reqs[2], reqs[0]
					}
					ok, err := m.AllowAll(context.Background(), reqs, ds)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := allowed.Load(); n != 100 {
			t.Fatalf("allowed %d, want 100 (the smallest limit)", n)
		}
		for key, left := range map[string]int{keys[0]: 100, keys[1]: 0, keys[2]: 200} {
			if got := countAllowed(t, m, req(key), 400); got != left {
				t.Errorf("key %s: %d left, want %d", key, got, left)
			}
		}
	})
}

// TestWaitAll checks WaitAll's schedule: it sleeps for the longest retry
// of the denying requests, only while that fits in each denying request's
// MaxWait, and debits nothing until all have room.
func TestWaitAll(t *testing.T) {
	a := func() Request { return one("a", 5, time.Second, 1) } // 200ms per unit
	b := func() Request { return one("b", 2, time.Second, 1) } // 500ms per unit
	run := func(name string, f func(t *testing.T, m *Memory)) {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := NewMemory(MemoryOptions{})
				f(t, m)
			})
		})
	}
	spend := func(t *testing.T, m *Memory, req Request, n int) {
		t.Helper()
		if got := countAllowed(t, m, req, n); got != n {
			t.Fatalf("spent %d of %d", got, n)
		}
	}
	run("longest retry", func(t *testing.T, m *Memory) {
		spend(t, m, a(), 5)
		spend(t, m, b(), 2)
		ds := make([]Decision, 2)
		start := time.Now()
		ok, waited, err := WaitAll(context.Background(), m, []Request{a(), b()}, ds, WaitOptions{MaxWait: []time.Duration{time.Second, time.Second}})
		if err != nil || !ok || waited != 500*time.Millisecond || time.Since(start) != 500*time.Millisecond {
			t.Fatalf("got %v %v after %v (reported %v), want allowed after 500ms", ok, err, time.Since(start), waited)
		}
		// a had 2 units back after 500ms and gave one.
		if got := countAllowed(t, m, a(), 5); got != 1 {
			t.Fatalf("a: %d left, want 1", got)
		}
	})
	run("a denying request without MaxWait ends the wait at once", func(t *testing.T, m *Memory) {
		spend(t, m, a(), 5)
		spend(t, m, b(), 2)
		ds := make([]Decision, 2)
		ok, waited, err := WaitAll(context.Background(), m, []Request{a(), b()}, ds, WaitOptions{MaxWait: []time.Duration{time.Second}})
		if err != nil || ok || waited != 0 || ds[0].Allowed || ds[1].Allowed {
			t.Fatalf("got %v %v %+v after %v, want an immediate denial", ok, err, ds, waited)
		}
	})
	run("only denying requests bound the wait", func(t *testing.T, m *Memory) {
		spend(t, m, b(), 2)
		ds := make([]Decision, 2)
		// a has room: its MaxWait of 0 does not matter.
		ok, waited, err := WaitAll(context.Background(), m, []Request{a(), b()}, ds, WaitOptions{MaxWait: []time.Duration{0, time.Second}})
		if err != nil || !ok || waited != 500*time.Millisecond {
			t.Fatalf("got %v %v after %v, want allowed after 500ms", ok, err, waited)
		}
	})
	run("over MaxWait: nothing debited", func(t *testing.T, m *Memory) {
		spend(t, m, b(), 2)
		ds := make([]Decision, 2)
		ok, waited, err := WaitAll(context.Background(), m, []Request{a(), b()}, ds, WaitOptions{MaxWait: []time.Duration{time.Second, 400 * time.Millisecond}})
		if err != nil || ok || waited != 0 {
			t.Fatalf("got %v %v after %v, want an immediate denial", ok, err, waited)
		}
		if got := countAllowed(t, m, a(), 10); got != 5 {
			t.Fatalf("a: %d left after the refused wait, want all 5", got)
		}
	})
	run("watch", func(t *testing.T, m *Memory) {
		var watched, stopped int
		leave := errors.New("client left")
		watch := func(ctx context.Context) (context.Context, func()) {
			watched++
			ctx, cancel := context.WithCancelCause(ctx)
			timer := time.AfterFunc(300*time.Millisecond, func() { cancel(leave) })
			return ctx, func() { stopped++; timer.Stop(); cancel(nil) }
		}
		ds := make([]Decision, 1)
		// Allowed at once: no watch.
		if ok, _, err := WaitAll(context.Background(), m, []Request{b()}, ds, WaitOptions{MaxWait: []time.Duration{time.Hour}, Watch: watch}); !ok || err != nil || watched != 0 {
			t.Fatalf("got %v %v, watched %d times; want allowed without watching", ok, err, watched)
		}
		spend(t, m, b(), 1)
		start := time.Now()
		ok, waited, err := WaitAll(context.Background(), m, []Request{b()}, ds, WaitOptions{MaxWait: []time.Duration{time.Hour}, Watch: watch})
		if ok || !errors.Is(err, context.Canceled) || waited != 300*time.Millisecond || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("got %v %v after %v, want the wait ended by the watch after 300ms", ok, err, waited)
		}
		if watched != 1 || stopped != 1 {
			t.Fatalf("watched %d, stopped %d times; want once each", watched, stopped)
		}
	})
}
