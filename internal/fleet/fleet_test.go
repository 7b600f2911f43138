package fleet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/poolerd/poolerd/test/redistest"
)

func newClient(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = -1
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newLeaser(t *testing.T, c redis.UniversalClient, ttl time.Duration) *Leaser {
	t.Helper()
	return New(Options{Client: c, TTL: ttl, Timeout: time.Second, Prefix: "t:" + t.Name() + ":"})
}

func zcard(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLeaseAcquireRelease: leases are taken up to the limit of every
// budget, refused beyond it naming the full budget, and given back.
func TestLeaseAcquireRelease(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	a, b := newLeaser(t, c, 0), newLeaser(t, c, 0)
	global := Budget{Key: "global", Limit: 3}
	db := Budget{Key: "db:app", Limit: 2}

	l1, r, err := a.Acquire(ctx, []Budget{global, db})
	if err != nil || r != nil {
		t.Fatalf("first lease: %v %v", r, err)
	}
	l2, r, err := b.Acquire(ctx, []Budget{global, db})
	if err != nil || r != nil {
		t.Fatalf("second lease: %v %v", r, err)
	}
	// The database's budget is full, the global one is not.
	if _, r, err := a.Acquire(ctx, []Budget{global, db}); err != nil || r == nil || r.Budget.Key != "db:app" || r.Held != 2 {
		t.Fatalf("third lease on db:app: refusal %+v, err %v; want db:app full with 2", r, err)
	}
	// Nothing was added to the global budget by the refusal.
	if n := zcard(t, c, a.prefix+"global"); n != 2 {
		t.Fatalf("global holds %d leases, want 2", n)
	}
	// Another database still has room under the global budget, once.
	if _, r, err := b.Acquire(ctx, []Budget{global, {Key: "db:other", Limit: 5}}); err != nil || r != nil {
		t.Fatalf("lease for db:other: %v %v", r, err)
	}
	if _, r, err := b.Acquire(ctx, []Budget{global, {Key: "db:other", Limit: 5}}); err != nil || r == nil || r.Budget.Key != "global" {
		t.Fatalf("global budget should be full: %+v %v", r, err)
	}
	if err := a.Release(ctx, l1); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, l1); err != nil { // twice: nothing
		t.Fatal(err)
	}
	if n := zcard(t, c, a.prefix+"db:app"); n != 1 {
		t.Fatalf("db:app holds %d leases after a release, want 1", n)
	}
	if _, r, err := a.Acquire(ctx, []Budget{global, db}); err != nil || r != nil {
		t.Fatalf("lease after release: %v %v", r, err)
	}
	st := a.Stats()
	if st.Acquired != 2 || st.Refused["db:app"] != 1 || st.Released != 1 || st.Held["global"] != 1 || st.Held["db:app"] != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !b.Held(l2) {
		t.Fatal("l2 not held")
	}
	if _, _, err := a.Acquire(ctx, nil); !errors.Is(err, ErrNoBudget) {
		t.Fatalf("no budget: %v", err)
	}
	if _, _, err := a.Acquire(ctx, []Budget{global, global}); err == nil {
		t.Fatal("a budget twice was accepted")
	}
}

// TestLeaseConcurrentNeverExceeds: many goroutines of several leasers
// taking and giving back leases never hold more than the limit.
func TestLeaseConcurrentNeverExceeds(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	const limit = 5
	budgets := []Budget{{Key: "global", Limit: limit}}
	leasers := []*Leaser{newLeaser(t, c, 0), newLeaser(t, c, 0), newLeaser(t, c, 0)}
	var held, peak, granted atomic.Int64
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := leasers[g%len(leasers)]
			for range 40 {
				lease, r, err := l.Acquire(ctx, budgets)
				if err != nil {
					t.Error(err)
					return
				}
				if r != nil {
					continue
				}
				granted.Add(1)
				n := held.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				time.Sleep(time.Millisecond)
				held.Add(-1)
				if err := l.Release(ctx, lease); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("%d leases held at once, limit %d", p, limit)
	}
	if granted.Load() == 0 {
		t.Fatal("no lease was ever granted")
	}
	if n := zcard(t, c, leasers[0].prefix+"global"); n != 0 {
		t.Fatalf("%d leases left after every release", n)
	}
}

// TestLeaseExpiresWithoutRenewal: a leaser that stops renewing (a dead
// poolerd) frees its leases within the TTL; one that renews keeps them.
func TestLeaseExpiresWithoutRenewal(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	const ttl = time.Second
	budgets := []Budget{{Key: "global", Limit: 2}}
	dead, alive, other := newLeaser(t, c, ttl), newLeaser(t, c, ttl), newLeaser(t, c, ttl)
	taken := time.Now()
	if _, r, err := dead.Acquire(ctx, budgets); err != nil || r != nil {
		t.Fatal(r, err)
	}
	if _, r, err := alive.Acquire(ctx, budgets); err != nil || r != nil {
		t.Fatal(r, err)
	}
	if _, r, _ := other.Acquire(ctx, budgets); r == nil {
		t.Fatal("budget of 2 gave a third lease")
	}
	// alive renews, dead does not.
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, l := range []*Leaser{alive, other} {
		go l.Run(runCtx, func(*Lease) { t.Error("a lease was lost") }, func(err error) { t.Error(err) })
	}
	var got *Lease
	for got == nil {
		if time.Since(start) > ttl+time.Second {
			t.Fatalf("the dead leaser's lease did not expire within the TTL %v", ttl)
		}
		time.Sleep(50 * time.Millisecond)
		lease, r, err := other.Acquire(ctx, budgets)
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			got = lease
		}
	}
	t.Logf("the dead leaser's lease came back %v after it was taken (TTL %v)", time.Since(taken).Round(time.Millisecond), ttl)
	if time.Since(taken) < ttl-50*time.Millisecond {
		t.Fatalf("lease came back after %v, before it could have expired", time.Since(taken))
	}
	// The renewed leases outlive several TTLs.
	time.Sleep(2 * ttl)
	if _, r, _ := dead.Acquire(ctx, budgets); r == nil {
		t.Fatal("a renewed lease expired")
	}
	if st := alive.Stats(); st.Renewed == 0 || st.Held["global"] != 1 {
		t.Fatalf("alive stats %+v", st)
	}
}

// TestLeaseRenewLost: a lease that expired while its budget filled up is
// reported lost by the next renewal; one whose budget has room is taken
// again (as after a Redis restart).
func TestLeaseRenewLost(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	budgets := []Budget{{Key: "global", Limit: 1}}
	a, b := newLeaser(t, c, 0), newLeaser(t, c, 0)
	la, _, err := a.Acquire(ctx, budgets)
	if err != nil || la == nil {
		t.Fatal(err)
	}
	// Redis forgets everything: the renewal takes the lease again.
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if lost, err := a.Renew(ctx); err != nil || len(lost) != 0 {
		t.Fatalf("renew after flush: lost %v, err %v", lost, err)
	}
	if n := zcard(t, c, a.prefix+"global"); n != 1 {
		t.Fatalf("after renewal the budget holds %d, want 1", n)
	}
	// Forgotten again, and another instance takes the place meanwhile.
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, r, err := b.Acquire(ctx, budgets); err != nil || r != nil {
		t.Fatal(r, err)
	}
	lost, err := a.Renew(ctx)
	if err != nil || len(lost) != 1 || lost[0] != la {
		t.Fatalf("renew: lost %v, err %v; want the lease lost", lost, err)
	}
	if a.Held(la) {
		t.Fatal("a lost lease is still held")
	}
	if st := a.Stats(); st.Lost != 1 {
		t.Fatalf("stats %+v", st)
	}
	if n := zcard(t, c, a.prefix+"global"); n != 1 {
		t.Fatalf("the budget holds %d, want b's 1", n)
	}
}

// TestLeaseRedisDown: with Redis gone, every call fails within the
// timeout with an error, counted by operation; leases stay held.
func TestLeaseRedisDown(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	l := New(Options{Client: c, Timeout: 200 * time.Millisecond, Prefix: "t:"})
	lease, _, err := l.Acquire(ctx, []Budget{{Key: "global", Limit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, _, err := l.Acquire(ctx, []Budget{{Key: "global", Limit: 1}}); err == nil {
		t.Fatal("acquire with Redis down succeeded")
	}
	if _, err := l.Renew(ctx); err == nil {
		t.Fatal("renew with Redis down succeeded")
	}
	if !l.Held(lease) {
		t.Fatal("a failed renewal dropped the lease")
	}
	if err := l.Release(ctx, lease); err == nil {
		t.Fatal("release with Redis down succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("three failed calls took %v", d)
	}
	st := l.Stats()
	if st.Errors["acquire"] != 1 || st.Errors["renew"] != 1 || st.Errors["release"] != 1 {
		t.Fatalf("errors %v", st.Errors)
	}
}

// TestLeaseWanted: a refused Acquire leaves a demand on the full budget for
// WantTTL, seen by other leasers' Wanted but not by the refused one's.
func TestLeaseWanted(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	holder, waiter := newLeaser(t, c, 0), newLeaser(t, c, 0)
	budgets := []Budget{{Key: "global", Limit: 5}, {Key: "db:app", Limit: 1}}
	if _, r, err := holder.Acquire(ctx, budgets); err != nil || r != nil {
		t.Fatal(r, err)
	}
	if w, err := holder.Wanted(ctx, []string{"global", "db:app"}); err != nil || len(w) != 0 {
		t.Fatalf("wanted before any refusal: %v %v", w, err)
	}
	if _, r, err := waiter.Acquire(ctx, budgets); err != nil || r == nil {
		t.Fatal(r, err)
	}
	if w, err := holder.Wanted(ctx, []string{"global", "db:app"}); err != nil || len(w) != 1 || w[0] != "db:app" {
		t.Fatalf("holder sees wanted %v, err %v; want [db:app]", w, err)
	}
	if w, err := waiter.Wanted(ctx, []string{"global", "db:app"}); err != nil || len(w) != 0 {
		t.Fatalf("the waiter sees its own demand: %v %v", w, err)
	}
	time.Sleep(WantTTL + 100*time.Millisecond)
	if w, err := holder.Wanted(ctx, []string{"db:app"}); err != nil || len(w) != 0 {
		t.Fatalf("demand outlived WantTTL: %v %v", w, err)
	}
}

// TestLeaseReleaseAll: ReleaseAll gives back every lease, those taken by
// Acquire calls under way included, and Acquire takes none after it.
func TestLeaseReleaseAll(t *testing.T) {
	srv := redistest.StartTB(t)
	c := newClient(t, srv)
	ctx := context.Background()
	l := newLeaser(t, c, 0)
	budgets := []Budget{{Key: "global", Limit: 100}}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				if _, _, err := l.Acquire(ctx, budgets); err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Error(err)
					}
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if err := l.ReleaseAll(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := zcard(t, c, l.prefix+"global"); n != 0 {
		t.Fatalf("%d leases left in Redis after ReleaseAll", n)
	}
	if st := l.Stats(); st.Acquired == 0 || st.Held["global"] != 0 || st.Released != st.Acquired {
		t.Fatalf("stats %+v", st)
	}
}
