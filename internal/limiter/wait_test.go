package limiter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestWaitSequential(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		req := one("k", 5, time.Second, 1)
		start := time.Now()
		for i := range 20 {
			before := time.Now()
			d, waited, err := Wait(context.Background(), m, req, time.Minute)
			if err != nil || !d.Allowed {
				t.Fatalf("Wait %d: %+v, %v", i, d, err)
			}
			want := time.Duration(0)
			if i >= 5 { // burst of 5, then one per 200ms
				want = 200 * time.Millisecond
			}
			if waited != want || time.Since(before) != want {
				t.Fatalf("Wait %d: waited %v (reported %v), want %v", i, time.Since(before), waited, want)
			}
		}
		if got := time.Since(start); got != 3*time.Second {
			t.Fatalf("20 Waits at 5/s took %v, want 3s", got)
		}
	})
}

func TestWaitMaxWait(t *testing.T) {
	tests := []struct {
		name    string
		maxWait time.Duration
		allowed bool
		waited  time.Duration
	}{
		{"shorter than needed: denial at once", 199 * time.Millisecond, false, 0},
		{"zero: a single Allow", 0, false, 0},
		{"negative: a single Allow", -time.Second, false, 0},
		{"exactly what is needed", 200 * time.Millisecond, true, 200 * time.Millisecond},
		{"longer", time.Second, true, 200 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := NewMemory(MemoryOptions{})
				req := one("k", 5, time.Second, 5)
				mustAllow(t, m, req) // empty the bucket: the next unit is 200ms away
				start := time.Now()
				d, waited, err := Wait(context.Background(), m, Request{Key: "k", Buckets: []Bucket{{Name: "b", Limit: 5, Per: time.Second, Cost: 1}}}, tc.maxWait)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != tc.allowed || waited != tc.waited || time.Since(start) != tc.waited {
					t.Fatalf("got %+v after %v (reported %v), want allowed=%v after %v", d, time.Since(start), waited, tc.allowed, tc.waited)
				}
				if !tc.allowed {
					if want := (Decision{Bucket: "b", RetryAfter: 200 * time.Millisecond}); d != want {
						t.Fatalf("got %+v, want %+v", d, want)
					}
					// Nothing was debited: one unit comes back after 200ms.
					time.Sleep(200 * time.Millisecond)
					if d := mustAllow(t, m, one("k", 5, time.Second, 1)); !d.Allowed {
						t.Fatalf("the refused Wait debited the bucket: %+v", d)
					}
				}
			})
		})
	}
}

func TestWaitContext(t *testing.T) {
	req := one("k", 1, time.Second, 1)
	// bubble runs f in a synctest bubble with req's bucket empty: the
	// next unit is 1s away.
	bubble := func(f func(t *testing.T, m *Memory)) func(t *testing.T) {
		return func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := NewMemory(MemoryOptions{})
				mustAllow(t, m, req)
				f(t, m)
			})
		}
	}
	t.Run("cancel while waiting", bubble(func(t *testing.T, m *Memory) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		d, waited, err := Wait(ctx, m, req, time.Minute)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d.Allowed || waited != 300*time.Millisecond || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("got %+v, waited %v (reported %v), want a denial after 300ms", d, time.Since(start), waited)
		}
	}))
	t.Run("already canceled", bubble(func(t *testing.T, m *Memory) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		free := one("other", 1, time.Second, 1)
		if _, _, err := Wait(ctx, m, free, time.Minute); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := mustAllow(t, m, free); !d.Allowed {
			t.Fatalf("a canceled Wait consumed capacity: %+v", d)
		}
	}))
	t.Run("deadline sooner than the retry: denial at once", bubble(func(t *testing.T, m *Memory) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		d, waited, err := Wait(ctx, m, req, time.Minute)
		if err != nil || d.Allowed || waited != 0 || time.Since(start) != 0 {
			t.Fatalf("got %+v, %v after %v (reported %v), want an immediate denial", d, err, time.Since(start), waited)
		}
	}))
	t.Run("deadline later than the retry", bubble(func(t *testing.T, m *Memory) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, waited, err := Wait(ctx, m, req, time.Minute)
		if err != nil || !d.Allowed || waited != time.Second {
			t.Fatalf("got %+v, %v after %v", d, err, waited)
		}
	}))
}

// TestWaitContended runs Waits concurrently: each retries after losing a
// race for the capacity it waited for, and all end exactly on schedule.
func TestWaitContended(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMemory(MemoryOptions{})
		req := one("k", 5, time.Second, 1)
		start := time.Now()
		var wg sync.WaitGroup
		for range 15 {
			wg.Go(func() {
				if d, _, err := Wait(context.Background(), m, req, time.Minute); err != nil || !d.Allowed {
					t.Errorf("Wait: %+v, %v", d, err)
				}
			})
		}
		wg.Wait()
		// 5 at once, then 10 more at 200ms intervals.
		if got := time.Since(start); got != 2*time.Second {
			t.Fatalf("15 concurrent Waits took %v, want 2s", got)
		}
		if d := mustAllow(t, m, req); d.Allowed {
			t.Fatalf("more than 15 were allowed")
		}
	})
}

// scripted is a Limiter replaying fixed answers.
type scripted struct {
	answers []Decision
	err     error
	calls   int
}

func (s *scripted) Allow(context.Context, Request) (Decision, error) {
	s.calls++
	if s.err != nil && s.calls > len(s.answers) {
		return Decision{}, s.err
	}
	return s.answers[min(s.calls, len(s.answers))-1], nil
}

func (s *scripted) AllowAll(ctx context.Context, reqs []Request, ds []Decision) (bool, error) {
	d, err := s.Allow(ctx, reqs[0])
	ds[0] = d
	return d.Allowed, err
}

func (s *scripted) Charge(context.Context, []Request) error { return nil }

func TestWaitLimiterError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		l := &scripted{answers: []Decision{{Bucket: "b", RetryAfter: time.Second}}, err: boom}
		d, waited, err := Wait(context.Background(), l, one("k", 1, time.Second, 1), time.Minute)
		if !errors.Is(err, boom) || waited != time.Second || l.calls != 2 || d != (Decision{}) {
			t.Fatalf("got %+v, waited %v, %v after %d calls; want the error after 1s and 2 calls", d, waited, err, l.calls)
		}
	})
}

// TestWaitNoSpin checks that a denial without RetryAfter does not make
// Wait spin.
func TestWaitNoSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &scripted{answers: []Decision{{Bucket: "b"}, {Bucket: "b"}, {Allowed: true}}}
		d, waited, err := Wait(context.Background(), l, one("k", 1, time.Second, 1), time.Minute)
		if err != nil || !d.Allowed || waited != 2*minRetry || l.calls != 3 {
			t.Fatalf("got %+v, waited %v, %v after %d calls", d, waited, err, l.calls)
		}
	})
}

// manualClock is a fake clock whose Sleep advances it at once.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps int
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.sleeps++
	return ctx.Err()
}

// TestWaitUsesLimiterClock checks that Wait measures and sleeps on the
// limiter's clock (outside any synctest bubble, in no real time).
func TestWaitUsesLimiterClock(t *testing.T) {
	clk := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := NewMemory(MemoryOptions{Now: clk.Now, Sleep: clk.Sleep})
	req := one("k", 5, time.Second, 1)
	realStart := time.Now()
	var total time.Duration
	for range 20 {
		d, waited, err := Wait(context.Background(), m, req, time.Minute)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		total += waited
	}
	if total != 3*time.Second || clk.sleeps != 15 {
		t.Fatalf("waited %v in %d sleeps, want 3s in 15", total, clk.sleeps)
	}
	if real := time.Since(realStart); real > time.Second {
		t.Fatalf("Wait slept %v of real time", real)
	}
}
