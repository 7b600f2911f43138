package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/poolerd/poolerd/test/redistest"
)

// newRedis returns a limiter on a client of srv, closed at the end of
// the test.
func newRedis(t testing.TB, srv *redistest.Server, opts RedisOptions) *Redis {
	t.Helper()
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	return NewRedis(c, opts)
}

// TestRedisMatchesMemory replays request sequences on both backends. With
// periods of an hour, the few milliseconds of real time Redis sees pass
// change no decision, and RetryAfter only by those milliseconds.
func TestRedisMatchesMemory(t *testing.T) {
	srv := redistest.StartTB(t)
	type step struct {
		key  string
		cost [2]int64 // costs on buckets a and b; 0 = bucket absent
	}
	a := Bucket{Name: "a", Limit: 10, Per: time.Hour}
	b := Bucket{Name: "b", Limit: 3, Per: 2 * time.Hour}
	tests := []struct {
		name  string
		steps []step
	}{
		{"single bucket burst", []step{
			{"k", [2]int64{1, 0}}, {"k", [2]int64{4, 0}}, {"k", [2]int64{5, 0}}, {"k", [2]int64{1, 0}}, {"k", [2]int64{1, 0}},
		}},
		{"costs", []step{
			{"k", [2]int64{3, 0}}, {"k", [2]int64{3, 0}}, {"k", [2]int64{3, 0}}, {"k", [2]int64{3, 0}}, {"k", [2]int64{1, 0}}, {"k", [2]int64{1, 0}},
		}},
		{"two buckets", []step{
			{"k", [2]int64{1, 1}}, {"k", [2]int64{1, 1}}, {"k", [2]int64{1, 1}}, {"k", [2]int64{1, 1}},
			{"k", [2]int64{1, 0}}, {"k", [2]int64{0, 1}}, {"k", [2]int64{8, 0}}, {"k", [2]int64{7, 0}},
			{"k", [2]int64{10, 3}},
		}},
		{"two keys", []step{
			{"x", [2]int64{10, 0}}, {"y", [2]int64{10, 0}}, {"x", [2]int64{1, 0}}, {"y", [2]int64{0, 3}}, {"y", [2]int64{0, 1}},
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			frozen := time.Now()
			mem := NewMemory(MemoryOptions{Now: func() time.Time { return frozen }})
			red := newRedis(t, srv, RedisOptions{Prefix: fmt.Sprintf("match%d:", i), Timeout: time.Second})
			for j, s := range tc.steps {
				req := Request{Key: s.key}
				for k, bk := range []Bucket{a, b} {
					if s.cost[k] > 0 {
						bk.Cost = s.cost[k]
						req.Buckets = append(req.Buckets, bk)
					}
				}
				dm := mustAllow(t, mem, req)
				dr := mustAllow(t, red, req)
				diff := dm.RetryAfter - dr.RetryAfter
				if dm.Allowed != dr.Allowed || dm.Bucket != dr.Bucket || diff < 0 || diff > 5*time.Second {
					t.Fatalf("step %d %+v: memory %+v, redis %+v", j, req, dm, dr)
				}
			}
		})
	}
}

// TestRedisTiming checks GCRA on the server's real clock: 10/s allows 10,
// denies the 11th for about 100ms, then allows one more.
func TestRedisTiming(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	req := one("k", 10, time.Second, 1)
	start := time.Now()
	if got := countAllowed(t, l, req, 10); got != 10 {
		t.Fatalf("burst: allowed %d, want 10", got)
	}
	d := mustAllow(t, l, req)
	elapsed := time.Since(start)
	if d.Allowed || d.Bucket != "b" || d.RetryAfter > 100*time.Millisecond || d.RetryAfter < 100*time.Millisecond-elapsed-time.Millisecond {
		t.Fatalf("11th after %v: %+v, want denied for about 100ms", elapsed, d)
	}
	time.Sleep(d.RetryAfter)
	if d := mustAllow(t, l, req); !d.Allowed {
		t.Fatalf("after RetryAfter: %+v", d)
	}
	if d := mustAllow(t, l, req); d.Allowed {
		t.Fatalf("two allowed after one interval")
	}
}

// TestRedisShared checks that two limiters on two clients with the same
// prefix share one limit, under concurrency, and that another prefix is
// another limit.
func TestRedisShared(t *testing.T) {
	srv := redistest.StartTB(t)
	l1 := newRedis(t, srv, RedisOptions{Prefix: "shared:", Timeout: time.Second})
	l2 := newRedis(t, srv, RedisOptions{Prefix: "shared:", Timeout: time.Second})
	l3 := newRedis(t, srv, RedisOptions{Prefix: "other:", Timeout: time.Second})
	req := Request{Key: "rule|user=alice", Buckets: []Bucket{
		{Name: "queries", Limit: 1000, Per: time.Hour},
		{Name: "transactions", Limit: 30, Per: time.Hour},
	}}
	var allowed [2]atomic.Int64
	// Alternate first, so that both instances surely get some, then race.
	for i := range 10 {
		if mustAllow(t, []*Redis{l1, l2}[i%2], req).Allowed {
			allowed[i%2].Add(1)
		}
	}
	var wg sync.WaitGroup
	for g := range 20 {
		l := []*Redis{l1, l2}[g%2]
		wg.Go(func() {
			for range 10 {
				d, err := l.Allow(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed[g%2].Add(1)
				}
			}
		})
	}
	wg.Wait()
	a1, a2 := allowed[0].Load(), allowed[1].Load()
	if a1+a2 != 30 || a1 < 5 || a2 < 5 {
		t.Fatalf("allowed %d + %d, want 30 in total from both instances", a1, a2)
	}
	if got := countAllowed(t, l3, req, 40); got != 30 {
		t.Fatalf("another prefix: allowed %d, want 30", got)
	}
}

func TestRedisMultiBucketAtomic(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Prefix: "atomic:", Timeout: time.Second})
	queries := Bucket{Name: "queries", Limit: 100, Per: time.Hour}
	xacts := Bucket{Name: "transactions", Limit: 2, Per: time.Hour}
	both := Request{Key: "rule|user=alice", Buckets: []Bucket{queries, xacts}}
	for i := range 2 {
		if d := mustAllow(t, l, both); !d.Allowed {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d := mustAllow(t, l, both)
	if d.Allowed || d.Bucket != "transactions" || d.RetryAfter < 29*time.Minute || d.RetryAfter > 30*time.Minute {
		t.Fatalf("3rd: %+v, want denied by transactions for 30m", d)
	}
	onlyQueries := Request{Key: both.Key, Buckets: []Bucket{queries}}
	if got := countAllowed(t, l, onlyQueries, 100); got != 98 {
		t.Fatalf("queries allowed after the denial: %d, want 98 (the denied request debited queries?)", got)
	}
	d = mustAllow(t, l, both)
	if d.Allowed || d.Bucket != "transactions" {
		t.Fatalf("both exhausted: %+v, want transactions (the longest retry)", d)
	}

	// State keys: prefix, hash tag, bucket name; TTL just past the TAT.
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		key string
		max time.Duration
	}{
		{"atomic:{rule|user=alice}:queries", time.Hour},
		{"atomic:{rule|user=alice}:transactions", time.Hour},
	} {
		ttl, err := c.PTTL(ctx, tc.key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl < tc.max-time.Minute || ttl > tc.max+time.Millisecond {
			t.Errorf("PTTL %s = %v, want about %v", tc.key, ttl, tc.max)
		}
	}
}

func TestRedisKeysExpire(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Prefix: "exp:", Timeout: time.Second})
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	req := one("k", 10, 200*time.Millisecond, 3) // TAT = now + 60ms
	if d := mustAllow(t, l, req); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	ttl, err := c.PTTL(ctx, "exp:{k}:b").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 || ttl > 61*time.Millisecond {
		t.Fatalf("PTTL = %v, want in (0, 61ms]", ttl)
	}
	time.Sleep(100 * time.Millisecond)
	if n, err := c.Exists(ctx, "exp:{k}:b").Result(); err != nil || n != 0 {
		t.Fatalf("key still exists after its TAT: %d, %v", n, err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE = %d, %v; want 0", n, err)
	}
}

// TestRedisDown checks that a stopped Redis makes Allow and Ping fail
// quickly instead of hanging.
func TestRedisDown(t *testing.T) {
	srv := redistest.StartTB(t)
	const timeout = 100 * time.Millisecond
	l := newRedis(t, srv, RedisOptions{Timeout: timeout})
	req := one("k", 10, time.Second, 1)
	if d := warmAllow(t, l, req); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		start := time.Now()
		d, err := l.Allow(context.Background(), req)
		if err == nil {
			t.Fatalf("Allow on a stopped Redis: %+v, no error", d)
		}
		el := time.Since(start)
		t.Logf("Allow failed after %v: %v", el, err)
		if el > timeout+200*time.Millisecond {
			t.Fatalf("Allow took %v to fail (timeout %v)", el, timeout)
		}
		if d != (Decision{}) {
			t.Fatalf("decision %+v with an error", d)
		}
	}
	if err := l.Ping(context.Background()); err == nil {
		t.Fatal("Ping on a stopped Redis: no error")
	}
}

// TestRedisSlow makes the server sleep with DEBUG SLEEP: Allow must give
// up after its Timeout, with a client that honours contexts and with one
// that does not (the call is then detached).
func TestRedisSlow(t *testing.T) {
	srv := redistest.StartTB(t)
	tests := []struct {
		name   string
		client func() *redis.Client
		detach bool
	}{
		{"context-aware client", srv.Client, false},
		{"client without ContextTimeoutEnabled", func() *redis.Client {
			return redis.NewClient(&redis.Options{
				Addr:                     srv.Addr(),
				DisableIdentity:          true,
				MaxRetries:               -1,
				MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
			})
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client()
			defer c.Close()
			const timeout = 50 * time.Millisecond
			l := NewRedis(c, RedisOptions{Prefix: "slow:", Timeout: timeout})
			if l.detach != tc.detach {
				t.Fatalf("detach = %v, want %v", l.detach, tc.detach)
			}
			req := one(tc.name, 1000, time.Second, 1)
			if d := warmAllow(t, l, req); !d.Allowed { // connection and script ready
				t.Fatalf("%+v", d)
			}

			slept := make(chan error, 1)
			go func() {
				_, err := srv.Do(context.Background(), "DEBUG", "SLEEP", "1")
				slept <- err
			}()
			sleepDone := false
			defer func() {
				if !sleepDone { // failed midway: leave no goroutine behind
					<-slept
				}
			}()
			waitBusy(t, srv)
			start := time.Now()
			_, err := l.Allow(context.Background(), req)
			el := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Allow on a sleeping Redis: err = %v, want DeadlineExceeded", err)
			}
			// Well before the server wakes up (≥ 700ms from now).
			if el > timeout+250*time.Millisecond {
				t.Fatalf("Allow took %v to give up (timeout %v)", el, timeout)
			}
			start = time.Now()
			if err := l.Ping(context.Background()); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > timeout+250*time.Millisecond {
				t.Fatalf("Ping on a sleeping Redis: %v after %v", err, time.Since(start))
			}
			sleepDone = true
			if err := <-slept; err != nil {
				t.Fatal(err)
			}
			// Redis is back: the limiter recovers.
			var d Decision
			for range 50 { // a detached call may still hold the connection
				if d, err = l.Allow(context.Background(), req); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil || !d.Allowed {
				t.Fatalf("after the sleep: %+v, %v", d, err)
			}
		})
	}
}

// waitBusy returns once srv stops answering PING within 20ms: the DEBUG
// SLEEP sent concurrently has started.
func waitBusy(t *testing.T, srv *redistest.Server) {
	t.Helper()
	c := srv.Client()
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err != nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the server never became busy")
}

func TestRedisCallerContext(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, one("k", 1, time.Second, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestRedisInvalidRequest(t *testing.T) {
	// No server: an invalid request never reaches Redis.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	l := NewRedis(c, RedisOptions{})
	if _, err := l.Allow(context.Background(), one("k", 1, time.Second, 2)); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("err = %v, want ErrInvalidRequest", err)
	}
	if d, err := l.Allow(context.Background(), Request{Key: "k"}); err != nil || !d.Allowed {
		t.Fatalf("no buckets: %+v, %v", d, err)
	}
}

// TestRedisScriptFlushed checks the EVAL fallback when the server lost
// the script (restart, SCRIPT FLUSH).
func TestRedisScriptFlushed(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	req := one("k", 2, time.Hour, 1)
	mustAllow(t, l, req)
	if _, err := srv.Do(context.Background(), "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if d := mustAllow(t, l, req); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if d := mustAllow(t, l, req); d.Allowed {
		t.Fatalf("3rd of 2 allowed")
	}
}

func TestRedisWait(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	req := one("k", 20, time.Second, 1)
	start := time.Now()
	for i := range 25 {
		d, _, err := Wait(context.Background(), l, req, time.Second)
		if err != nil || !d.Allowed {
			t.Fatalf("Wait %d: %+v, %v", i, d, err)
		}
	}
	// 20 at once, then 5 at 50ms intervals.
	if el := time.Since(start); el < 240*time.Millisecond || el > time.Second {
		t.Fatalf("25 Waits at 20/s took %v, want about 250ms", el)
	}
}

// TestRedisAllowBatch: the decisions of one AllowBatch are independent
// (one's denial or invalid request is its own), each atomic across its
// own requests, made in order (two on one bucket of 1: the first is
// allowed, the second denied), and the same as Allow's; after SCRIPT FLUSH
// the batch loads the script and asks again; with Redis stopped every
// decision fails within the Timeout.
func TestRedisAllowBatch(t *testing.T) {
	srv := redistest.StartTB(t)
	l := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	mem := NewMemory(MemoryOptions{})
	batch := func() []Batched {
		return []Batched{
			{Reqs: []Request{one("a", 1, time.Hour, 1)}},
			{Reqs: []Request{one("a", 1, time.Hour, 1)}},
			{Reqs: []Request{one("b", 5, time.Hour, 1)}},
			{Reqs: []Request{one("c", 1, time.Hour, 2)}},                            // invalid: a cost over the limit
			{Reqs: []Request{one("d", 3, time.Hour, 1), one("a", 1, time.Hour, 1)}}, // "a" is used up by the first
			{Reqs: []Request{{Key: "e"}}},                                           // no buckets
		}
	}
	run := func(round string) []Batched {
		t.Helper()
		b := batch()
		for i := range b {
			b[i].Ds = make([]Decision, len(b[i].Reqs))
		}
		l.AllowBatch(context.Background(), b)
		for i := range b {
			want := make([]Decision, len(b[i].Reqs))
			allowed, err := mem.AllowAll(context.Background(), b[i].Reqs, want)
			if (err == nil) != (b[i].Err == nil) || allowed != b[i].Allowed {
				t.Fatalf("%s: decision %d: allowed %v, %v; the memory backend: %v, %v", round, i, b[i].Allowed, b[i].Err, allowed, err)
			}
			for j := range want {
				if b[i].Ds[j].Allowed != want[j].Allowed || b[i].Ds[j].Bucket != want[j].Bucket {
					t.Fatalf("%s: decision %d, request %d: %+v; the memory backend: %+v", round, i, j, b[i].Ds[j], want[j])
				}
			}
		}
		return b
	}
	b := run("first")
	if !b[0].Allowed || b[1].Allowed || !b[2].Allowed || !errors.Is(b[3].Err, ErrInvalidRequest) || b[4].Allowed || !b[4].Ds[0].Allowed || b[4].Ds[1].Allowed || !b[5].Allowed {
		t.Fatalf("first batch: %+v", b)
	}
	if b[1].Ds[0].RetryAfter <= 0 {
		t.Fatalf("denied without a retry: %+v", b[1].Ds[0])
	}
	if _, err := srv.Do(context.Background(), "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	b = run("after SCRIPT FLUSH")
	if b[0].Allowed || !b[2].Allowed || b[4].Allowed {
		t.Fatalf("second batch: %+v", b)
	}
	// "d" was asked twice, in decisions denied by "a": never debited.
	for i := range 3 {
		if d := mustAllow(t, l, one("d", 3, time.Hour, 1)); !d.Allowed {
			t.Fatalf("d's unit %d of 3: %+v: a denied decision debited it", i+1, d)
		}
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	l2 := NewRedis(srv.Client(), RedisOptions{Timeout: 100 * time.Millisecond})
	b = []Batched{{Reqs: []Request{one("a", 1, time.Hour, 1)}}, {Reqs: []Request{one("b", 1, time.Hour, 1)}}}
	for i := range b {
		b[i].Ds = make([]Decision, 1)
	}
	start := time.Now()
	l2.AllowBatch(context.Background(), b)
	if el := time.Since(start); el > 300*time.Millisecond {
		t.Fatalf("a batch on a stopped Redis took %v (timeout 100ms)", el)
	}
	for i := range b {
		if b[i].Err == nil || b[i].Allowed || b[i].Ds[0] != (Decision{}) {
			t.Fatalf("decision %d on a stopped Redis: %+v", i, b[i])
		}
	}
}
