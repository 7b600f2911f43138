package limiter

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/poolerd/poolerd/test/redistest"
)

// measured returns a request with a count bucket and a Deferred one, the
// shape of a rule with queries and server_time.
func measured(key string) Request {
	return Request{Key: key, Buckets: []Bucket{
		{Name: "queries", Limit: 100, Per: time.Second, Cost: 1},
		{Name: "server_time", Limit: 1000, Per: time.Second, Deferred: true},
	}}
}

// charge returns the Charge of cost units on measured's Deferred bucket.
func charge(key string, cost int64) []Request {
	return []Request{{Key: key, Buckets: []Bucket{{Name: "server_time", Limit: 1000, Per: time.Second, Cost: cost}}}}
}

// A Deferred bucket is only checked: it allows while not in debt, a
// Charge puts it into debt by any amount, and the next request waits
// until that debt is paid off at Limit per Per.
func TestChargeDebt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		m := NewMemory(MemoryOptions{})
		for range 3 {
			if d := mustAllow(t, m, measured("k")); !d.Allowed {
				t.Fatalf("a Deferred bucket with nothing charged denied: %+v", d)
			}
		}
		// 1000 units of 1000 per second: the bucket is used up, not in
		// debt.
		if err := m.Charge(ctx, charge("k", 1000)); err != nil {
			t.Fatal(err)
		}
		if d := mustAllow(t, m, measured("k")); !d.Allowed {
			t.Fatalf("a bucket used up but not in debt denied: %+v", d)
		}
		// 3000 more, three times the limit: in debt for 3 s.
		if err := m.Charge(ctx, charge("k", 3000)); err != nil {
			t.Fatal(err)
		}
		d := mustAllow(t, m, measured("k"))
		if d.Allowed || d.Bucket != "server_time" || d.RetryAfter != 3*time.Second {
			t.Fatalf("in debt by 3 s: got %+v, want server_time denying for 3s", d)
		}
		// Another key is not affected.
		if d := mustAllow(t, m, measured("other")); !d.Allowed {
			t.Fatalf("another key denied: %+v", d)
		}
		// The denial debited nothing: the queries bucket still has 100 -
		// 4 units, so the request is allowed as soon as the debt is paid.
		time.Sleep(3 * time.Second)
		if d := mustAllow(t, m, measured("k")); !d.Allowed {
			t.Fatalf("after the debt was paid: %+v", d)
		}
		// Wait sleeps for the debt: the bucket is still used up (1 s
		// ahead), so 2500 more are 2.5 s of debt.
		if err := m.Charge(ctx, charge("k", 2500)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, waited, err := Wait(ctx, m, measured("k"), 10*time.Second)
		if err != nil || !d.Allowed || waited != 2500*time.Millisecond || time.Since(start) != waited {
			t.Fatalf("Wait: %+v after %v, %v; want allowed after 2.5s", d, waited, err)
		}
	})
}

// Charge takes costs above the limit and caps them, rejects negative
// ones, and charges nothing for 0.
func TestChargeBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		m := NewMemory(MemoryOptions{})
		if err := m.Charge(ctx, charge("k", -1)); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("negative cost: %v, want ErrInvalidRequest", err)
		}
		if err := m.Charge(ctx, []Request{{Key: "", Buckets: charge("k", 1)[0].Buckets}}); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("empty key: %v, want ErrInvalidRequest", err)
		}
		if err := m.Charge(ctx, charge("k", 0)); err != nil || m.Len() != 0 {
			t.Fatalf("cost 0: %v, %d keys with state; want nothing charged", err, m.Len())
		}
		for range 3 {
			if err := m.Charge(ctx, charge("k", 1<<62)); err != nil {
				t.Fatal(err)
			}
		}
		d := mustAllow(t, m, measured("k"))
		if d.Allowed || d.RetryAfter != time.Duration(maxDebt)-time.Second {
			t.Fatalf("after huge charges: %+v, want a retry of maxDebt - per", d)
		}
	})
}

// Redis keeps the same debt as Memory, shared by every limiter on it.
func TestRedisCharge(t *testing.T) {
	srv := redistest.StartTB(t)
	ctx := context.Background()
	a := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	b := newRedis(t, srv, RedisOptions{Timeout: time.Second})
	if d := warmAllow(t, a, measured("r")); !d.Allowed {
		t.Fatalf("nothing charged: %+v", d)
	}
	// A Deferred bucket's check writes no key.
	if n := len(srv.Client().Keys(ctx, "*server_time*").Val()); n != 0 {
		t.Fatalf("%d server_time keys after a check, want 0", n)
	}
	if err := a.Charge(ctx, charge("r", 1000)); err != nil {
		t.Fatal(err)
	}
	if d := mustAllow(t, b, measured("r")); !d.Allowed {
		t.Fatalf("used up, not in debt: %+v", d)
	}
	if err := a.Charge(ctx, charge("r", 3000)); err != nil {
		t.Fatal(err)
	}
	d := mustAllow(t, b, measured("r"))
	if d.Allowed || d.Bucket != "server_time" || d.RetryAfter < 2500*time.Millisecond || d.RetryAfter > 3*time.Second {
		t.Fatalf("in debt by 3 s, seen by the other limiter: %+v", d)
	}
	if err := a.Charge(ctx, charge("r", -5)); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("negative cost: %v", err)
	}
	if err := a.Charge(ctx, charge("r", 0)); err != nil {
		t.Fatalf("cost 0: %v", err)
	}
}
