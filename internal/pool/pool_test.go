package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

type fakeConn struct {
	Entry
	n      int
	closed atomic.Bool
}

func (c *fakeConn) PoolEntry() *Entry { return &c.Entry }
func (c *fakeConn) Close() error      { c.closed.Store(true); return nil }

// dialer counts connects and can be told to fail or block.
type dialer struct {
	mu       sync.Mutex
	n        int
	fail     error
	delay    time.Duration
	attempts []time.Time
}

func (d *dialer) connect(ctx context.Context) (*fakeConn, error) {
	d.mu.Lock()
	d.attempts = append(d.attempts, time.Now())
	delay := d.delay
	d.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	d.n++
	return &fakeConn{n: d.n}, nil
}

func (d *dialer) setFail(err error) {
	d.mu.Lock()
	d.fail = err
	d.mu.Unlock()
}

func baseConfig(d *dialer, max, min int) Config[*fakeConn] {
	return Config[*fakeConn]{
		Settings: Settings{MaxSize: max, MinSize: min, ConnectTimeout: time.Second,
			BackoffBase: time.Second, BackoffMax: 16 * time.Second},
		Connect: d.connect,
		Rand:    func() float64 { return 0.5 }, // no jitter: exact schedules
	}
}

func newPool(d *dialer, max, min int) *Pool[*fakeConn] {
	return New(baseConfig(d, max, min), new(atomic.Uint64))
}

func TestReusesMostRecentlyUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 3, 0)
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		b, _ := p.Get(ctx)
		p.Put(a)
		p.Put(b)
		c, err := p.Get(ctx)
		if err != nil || c != b {
			t.Fatalf("got conn %d, want the most recently returned %d", c.n, b.n)
		}
		st := p.Stats()
		if st.Hits != 1 || st.Misses != 2 || st.Acquisitions != 3 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestTryGetNear: an idle connection of the asker's share is preferred to
// a more recently used one of another share; without one, the most
// recently used of any share is taken; the idle list keeps its order.
func TestTryGetNear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 3, 0)
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		b, _ := p.Get(ctx)
		c, _ := p.Get(ctx)
		a.SetShare(1)
		b.SetShare(2)
		c.SetShare(2)
		for _, x := range []*fakeConn{a, b, c} {
			p.Put(x) // idle, most recently used last: a b c
		}
		if got, ok := p.TryGetNear(1); !ok || got != a {
			t.Fatalf("share 1: got %v, want conn %d (share 1, least recently used)", got, a.n)
		}
		if got, ok := p.TryGetNear(3); !ok || got != c {
			t.Fatalf("share 3: got %v, want the most recently used, conn %d", got, c.n)
		}
		if got, ok := p.TryGetNear(1); !ok || got != b {
			t.Fatalf("share 1, none left: got %v, want conn %d", got, b.n)
		}
		if _, ok := p.TryGetNear(1); ok {
			t.Fatal("got a connection from an empty idle list")
		}
		if st := p.Stats(); st.Hits != 3 || st.Idle != 0 || st.Active != 3 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestGetWithPrefersShare: a connection of the asker's share idle past the
// validation interval, which TryGetNear declines, is the one GetWith takes
// (validated) for a waiter that prefers that share, not the most recently
// used of another share: else the other share's connection would serve
// both for as long as this one stays idle and declined (the proxy's
// TestLoopAffinity on a loaded machine).
func TestGetWithPrefersShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := baseConfig(&dialer{}, 2, 0)
		cfg.ValidationInterval = 5 * time.Second
		cfg.ValidationTimeout = time.Second
		var validated []*fakeConn
		cfg.Validate = func(ctx context.Context, c *fakeConn) error {
			validated = append(validated, c)
			return nil
		}
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		b, _ := p.Get(ctx)
		a.SetShare(0)
		b.SetShare(1)
		p.Put(a)
		p.Put(b) // most recently used
		time.Sleep(6 * time.Second)
		if _, ok := p.TryGetNear(0); ok {
			t.Fatal("TryGetNear took a connection that must be validated")
		}
		w := NewWaiter[*fakeConn]()
		w.Prefer(0)
		got, err := p.GetWith(w, time.Second, nil)
		if err != nil || got != a {
			t.Fatalf("got %v, %v; want conn %d of share 0", got, err, a.n)
		}
		if len(validated) != 1 || validated[0] != a {
			t.Fatalf("validated %v, want conn %d once", validated, a.n)
		}
		p.Put(got)
		// No preference: the most recently used, whatever its share.
		w.Prefer(-1)
		time.Sleep(6 * time.Second)
		if got, err := p.GetWith(w, time.Second, nil); err != nil || got != a {
			t.Fatalf("no preference: got %v, %v; want the most recently used, conn %d", got, err, a.n)
		}
	})
}

func TestWaitersAreServedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 1, 0)
		defer p.Close()
		ctx := context.Background()
		held, _ := p.Get(ctx)
		var order []int
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := p.Get(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				p.Put(c)
			}()
			synctest.Wait() // waiter i is queued before i+1 starts
		}
		p.Put(held)
		wg.Wait()
		for i, v := range order {
			if v != i {
				t.Fatalf("served in order %v, want FIFO", order)
			}
		}
		if st := p.Stats(); st.Total != 1 {
			t.Fatalf("opened %d connections, max 1", st.Total)
		}
	})
}

func TestCheckoutTimeoutReportsState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 1, 0)
		defer p.Close()
		held, _ := p.Get(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := p.Get(ctx)
		var te *CheckoutTimeoutError
		if !errors.As(err, &te) {
			t.Fatalf("want CheckoutTimeoutError, got %v", err)
		}
		if te.Waited != 2*time.Second || time.Since(start) != 2*time.Second {
			t.Fatalf("waited %s", te.Waited)
		}
		if te.Stats.Total != 1 || te.Stats.Active != 1 || te.Stats.MaxSize != 1 || te.Stats.Waiting != 0 {
			t.Fatalf("stats in error: %+v", te.Stats)
		}
		if p.Stats().Timeouts != 1 {
			t.Fatal("timeout not counted")
		}
		p.Put(held)
	})
}

func TestConnectFailureReachesTheWaiterAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("connection refused")
		p := newPool(&dialer{fail: boom}, 2, 0)
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		_, err := p.Get(ctx)
		var ue *UnavailableError
		if !errors.As(err, &ue) || !errors.Is(err, boom) || ue.RetryIn != time.Second || ue.Attempts != 1 {
			t.Fatalf("want UnavailableError wrapping the cause, retry in 1s, got %v", err)
		}
		if time.Since(start) != 0 {
			t.Fatalf("waited %s for a failed connect", time.Since(start))
		}
		// Within the backoff: refused at once without a new attempt.
		time.Sleep(500 * time.Millisecond)
		_, err = p.Get(ctx)
		if !errors.As(err, &ue) || ue.RetryIn != 500*time.Millisecond {
			t.Fatalf("second checkout: %v", err)
		}
		if st := p.Stats(); st.Total != 0 || st.ConnectFailures != 1 || st.FastFailures != 1 || st.State != Healthy && st.State != Unhealthy {
			t.Fatalf("stats %+v", st)
		}
	})
}

// Reconnect (RECONNECT, a changed server or TLS setting) ends a backoff:
// the failures were with what is replaced, and the next checkout connects
// at once instead of being refused until the retry.
func TestReconnectEndsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{fail: errors.New("no pg_hba.conf entry, SSL encryption")}
		p := newPool(d, 2, 0)
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var ue *UnavailableError
		if _, err := p.Get(ctx); !errors.As(err, &ue) {
			t.Fatalf("first checkout: %v", err)
		}
		d.mu.Lock()
		d.fail = nil // the new setting works
		d.mu.Unlock()
		if _, err := p.Get(ctx); !errors.As(err, &ue) {
			t.Fatalf("within the backoff: %v, want it refused", err)
		}
		p.Reconnect()
		start := time.Now()
		c, err := p.Get(ctx)
		if err != nil || time.Since(start) != 0 {
			t.Fatalf("after Reconnect: %v after %s, want a connection at once", err, time.Since(start))
		}
		p.Put(c)
	})
}

// FR-003: 1, 2, 4, 8, 16, 16 ... seconds between attempts; a success ends it.
func TestBackoffSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{fail: errors.New("too many connections")}
		cfg := baseConfig(d, 5, 0)
		cfg.Warm = true
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		start := time.Now()
		time.Sleep(50 * time.Second)
		synctest.Wait()
		d.mu.Lock()
		var gaps []time.Duration
		for i := 1; i < len(d.attempts); i++ {
			gaps = append(gaps, d.attempts[i].Sub(d.attempts[i-1]))
		}
		first := d.attempts[0].Sub(start)
		d.mu.Unlock()
		want := []time.Duration{1, 2, 4, 8, 16, 16}
		if first != 0 || len(gaps) < len(want) {
			t.Fatalf("first attempt at %s, gaps %v", first, gaps)
		}
		for i, w := range want {
			if gaps[i] != w*time.Second {
				t.Fatalf("gaps %v, want %v seconds", gaps, want)
			}
		}
		if st := p.Stats(); st.State != Unhealthy || st.Failures != len(gaps)+1 {
			t.Fatalf("stats %+v", st)
		}
		d.setFail(nil)
		time.Sleep(16 * time.Second)
		synctest.Wait()
		if st := p.Stats(); st.State != Healthy || st.Failures != 0 || st.Idle != 1 {
			t.Fatalf("after recovery: %+v", st)
		}
	})
}

// FR-003: while the server refuses TCP connections the pool probes, and
// retries as soon as it accepts them again instead of waiting out the
// backoff.
func TestProbeEndsBackoffEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := errors.New("connection refused")
		d := &dialer{fail: refused}
		var up atomic.Bool
		cfg := baseConfig(d, 5, 0)
		cfg.Warm = true
		cfg.Unreachable = func(err error) bool { return errors.Is(err, refused) }
		cfg.Probe = func(context.Context) error {
			if up.Load() {
				return nil
			}
			return refused
		}
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		time.Sleep(20 * time.Second) // backoff has grown to 8-16s
		synctest.Wait()
		if p.State() != Unhealthy {
			t.Fatalf("state %s", p.State())
		}
		up.Store(true)
		d.setFail(nil)
		back := time.Now()
		for p.State() != Healthy {
			time.Sleep(50 * time.Millisecond)
			if time.Since(back) > 2*time.Second {
				t.Fatalf("not healthy %s after the server came back: %+v", time.Since(back), p.Stats())
			}
		}
		if d := time.Since(back); d > 500*time.Millisecond {
			t.Fatalf("recovered after %s; the probe should notice within its interval", d)
		}
	})
}

func TestHealthStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		cfg := baseConfig(d, 2, 0)
		cfg.Warm = true
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		if st := p.State(); st != Initializing && st != Healthy {
			t.Fatalf("start: %s", st)
		}
		synctest.Wait()
		if p.State() != Healthy {
			t.Fatalf("after warm-up: %s", p.State())
		}
		// One of two connections open and connects failing: degraded.
		a, _ := p.Get(context.Background())
		d.setFail(errors.New("down"))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, _ = p.Get(ctx)
		cancel()
		synctest.Wait()
		if p.State() != Degraded {
			t.Fatalf("one of two open, connects failing: %s", p.State())
		}
		p.Discard(a, "server closed")
		synctest.Wait()
		if p.State() != Unhealthy {
			t.Fatalf("nothing open, connects failing: %s", p.State())
		}
		d.setFail(nil)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if p.State() != Healthy {
			t.Fatalf("after recovery: %s", p.State())
		}
	})
}

func TestRecoveringUntilMinSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{fail: errors.New("down")}
		cfg := baseConfig(d, 5, 3)
		cfg.Warm = true
		d.delay = 100 * time.Millisecond
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		time.Sleep(3 * time.Second)
		if p.State() != Unhealthy {
			t.Fatalf("state %s", p.State())
		}
		d.setFail(nil)
		var seen []State
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && p.State() != Healthy {
			ch := p.Changed()
			select {
			case <-ch:
				seen = append(seen, p.State())
			case <-time.After(time.Second):
			}
		}
		// The dialer runs on its own goroutines: the last change may land
		// between reading the state for seen and the loop's own check.
		if st := p.State(); len(seen) == 0 || seen[len(seen)-1] != st {
			seen = append(seen, st)
		}
		if len(seen) < 2 || seen[0] != Recovering || seen[len(seen)-1] != Healthy {
			t.Fatalf("transitions %v, want recovering then healthy", seen)
		}
	})
}

func TestWaitWarm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{fail: errors.New("refused")}
		cfg := baseConfig(d, 5, 2)
		cfg.Warm = true
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		start := time.Now()
		err := p.WaitWarm(context.Background(), 3)
		if err == nil || time.Since(start) != 3*time.Second { // attempts at 0, 1, 3
			t.Fatalf("fail-fast: %v after %s", err, time.Since(start))
		}

		ok := New(baseConfig(&dialer{}, 5, 2), new(atomic.Uint64))
		defer ok.Close()
		if err := ok.WaitWarm(context.Background(), 3); err != nil {
			t.Fatal(err)
		}
		if st := ok.Stats(); st.Idle != 2 {
			t.Fatalf("warm-up opened %d", st.Idle)
		}
	})
}

// FR-002: a connection idle longer than the interval is validated; one
// that fails is closed and another used; two failures give an error.
func TestValidationBeforeUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		var bad sync.Map // conn n -> true
		var validated atomic.Int32
		cfg := baseConfig(d, 3, 0)
		cfg.ValidationInterval = 5 * time.Second
		cfg.ValidationTimeout = time.Second
		cfg.Validate = func(ctx context.Context, c *fakeConn) error {
			validated.Add(1)
			if _, ok := bad.Load(c.n); ok {
				return errors.New("server closed the connection")
			}
			return nil
		}
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		p.Put(a)
		b, _ := p.Get(ctx) // idle 0s: no validation
		if b != a || validated.Load() != 0 {
			t.Fatalf("fresh reuse validated %d times", validated.Load())
		}
		p.Put(b)
		time.Sleep(6 * time.Second)
		bad.Store(a.n, true)
		c, err := p.Get(ctx) // a is stale and bad: closed, a new one used
		synctest.Wait()
		if err != nil || c == a || !a.closed.Load() || validated.Load() != 1 {
			t.Fatalf("got %v %v, a closed %v, validations %d", c, err, a.closed.Load(), validated.Load())
		}
		if st := p.Stats(); st.ValidationFailures != 1 {
			t.Fatalf("stats %+v", st)
		}
		// Two stale bad connections in a row: an error.
		e, _ := p.Get(ctx)
		p.Put(c)
		p.Put(e)
		time.Sleep(6 * time.Second)
		bad.Store(c.n, true)
		bad.Store(e.n, true)
		_, err = p.Get(ctx)
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("want ValidationError, got %v", err)
		}
	})
}

// FR-009: lifetime (with jitter), query count and idle time, only idle
// connections, at most recycle_rate per second, min_size kept.
func TestRecycling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		cfg := baseConfig(d, 5, 1)
		cfg.MaxLifetime = time.Hour
		cfg.MaxQueries = 100
		cfg.IdleTimeout = time.Minute
		cfg.RecycleRate = 1
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		synctest.Wait()
		// max_queries: recycled when it comes back.
		a, _ := p.Get(ctx)
		a.AddQueries(100)
		p.Put(a)
		synctest.Wait()
		if !a.closed.Load() || p.Stats().RecycledQueries != 1 {
			t.Fatalf("max_queries: closed %v stats %+v", a.closed.Load(), p.Stats())
		}
		synctest.Wait() // min_size refilled
		// idle_timeout: three idle connections, min_size 1 -> two closed, one per second.
		conns := make([]*fakeConn, 3)
		for i := range conns {
			conns[i], _ = p.Get(ctx)
		}
		for _, c := range conns {
			p.Put(c)
		}
		time.Sleep(60*time.Second + 500*time.Millisecond) // idle since t=0; the janitor ticks each second
		synctest.Wait()
		if st := p.Stats(); st.RecycledIdle != 1 {
			t.Fatalf("rate limit: recycled %d in the first second", st.RecycledIdle)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if st := p.Stats(); st.RecycledIdle < 2 || st.Total < 1 {
			t.Fatalf("idle recycling: %+v", st)
		}
		// A checked-out connection is never recycled, however old.
		held, _ := p.Get(ctx)
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if held.closed.Load() {
			t.Fatal("active connection recycled")
		}
		before := p.Stats().RecycledLifetime
		p.Put(held)
		synctest.Wait()
		if p.Stats().RecycledLifetime != before+1 || !held.closed.Load() {
			t.Fatal("expired connection not recycled when returned")
		}
	})
}

func TestDiscardFreesCapacityForWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		p := newPool(d, 1, 0)
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		got := make(chan *fakeConn)
		go func() {
			c, err := p.Get(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- c
		}()
		synctest.Wait()
		p.Discard(a, "test")
		p.Discard(a, "twice is harmless")
		c := <-got
		synctest.Wait()
		if c == a || !a.closed.Load() {
			t.Fatal("discarded connection reused or not closed")
		}
		if st := p.Stats(); st.Total != 1 || st.Active != 1 {
			t.Fatalf("stats %+v", st)
		}
		p.Put(c)
	})
}

func TestMinSizeIsKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 5, 2)
		defer p.Close()
		synctest.Wait()
		if st := p.Stats(); st.Idle != 2 || st.Total != 2 {
			t.Fatalf("after start: %+v", st)
		}
		idle := p.Idle()
		p.Discard(idle[0], "test")
		synctest.Wait()
		if st := p.Stats(); st.Idle != 2 {
			t.Fatalf("min_size not restored: %+v", st)
		}
	})
}

func TestCloseFailsWaitersAndClosesConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 1, 0)
		a, _ := p.Get(context.Background())
		errc := make(chan error)
		go func() {
			_, err := p.Get(context.Background())
			errc <- err
		}()
		synctest.Wait()
		p.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter got %v", err)
		}
		p.Put(a)
		synctest.Wait()
		if !a.closed.Load() {
			t.Fatal("connection returned after Close was not closed")
		}
		if _, err := p.Get(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Get after Close: %v", err)
		}
		if p.State() != Terminated {
			t.Fatalf("state %s", p.State())
		}
	})
}

// FR-010: concurrent checkouts never exceed max_size and keep counts true.
func TestNeverExceedsMaxUnderContention(t *testing.T) {
	d := &dialer{delay: time.Millisecond}
	p := newPool(d, 4, 0)
	defer p.Close()
	var active, peak atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c, err := p.Get(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				n := active.Add(1)
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				active.Add(-1)
				if c.n%7 == 0 {
					p.Discard(c, "test")
				} else {
					p.Put(c)
				}
			}
		}()
	}
	wg.Wait()
	st := p.Stats()
	if peak.Load() > 4 || st.Total > 4 || st.Active != 0 || st.PeakActive > 4 || st.Acquisitions != 5000 {
		t.Fatalf("peak %d, stats %+v", peak.Load(), st)
	}
}

// Connects in flight together when the server goes away fail together:
// one round of backoff, not one per connect.
func TestConcurrentFailuresAreOneRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{delay: 100 * time.Millisecond}
		p := newPool(d, 5, 0)
		defer p.Close()
		ctx := context.Background()
		first, _ := p.Get(ctx) // the pool has connected once: parallel connects allowed
		d.setFail(errors.New("the database system is shutting down"))
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := p.Get(ctx)
				if err == nil {
					p.Put(c)
				}
			}()
		}
		synctest.Wait()
		if st := p.Stats(); st.Opening != 3 {
			t.Fatalf("want 3 connects in flight, got %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		st := p.Stats()
		if st.Failures != 1 || st.ConnectFailures != 3 {
			t.Fatalf("failures in a row %d (want 1), connect failures %d (want 3)", st.Failures, st.ConnectFailures)
		}
		if retry := st.NextRetry.Sub(time.Now()); retry > time.Second {
			t.Fatalf("next retry in %s: the backoff grew per concurrent failure", retry)
		}
		p.Put(first)
	})
}

// TestGetWith covers the reusable waiter: a hand-over, the timeout, done,
// CancelWait, and reuse of the same Waiter after each of them.
func TestGetWith(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 1, 0)
		defer p.Close()
		w := NewWaiter[*fakeConn]()
		a, err := p.GetWith(w, time.Second, nil) // opens the only connection
		if err != nil {
			t.Fatal(err)
		}

		// Timeout: the pool is exhausted.
		start := time.Now()
		_, err = p.GetWith(w, 250*time.Millisecond, nil)
		var te *CheckoutTimeoutError
		if !errors.As(err, &te) || time.Since(start) != 250*time.Millisecond {
			t.Fatalf("timeout: %v after %v", err, time.Since(start))
		}

		// Hand-over: a Put while waiting serves the waiter.
		go func() {
			time.Sleep(100 * time.Millisecond)
			p.Put(a)
		}()
		b, err := p.GetWith(w, time.Second, nil)
		if err != nil || b != a {
			t.Fatalf("hand-over: %v %v", b, err)
		}

		// done closes.
		done := make(chan struct{})
		go func() {
			time.Sleep(100 * time.Millisecond)
			close(done)
		}()
		if _, err := p.GetWith(w, 0, done); !ErrDone(err) {
			t.Fatalf("done: %v", err)
		}

		// CancelWait withdraws the waiter with the given error.
		cause := errors.New("cancelled by the client")
		go func() {
			time.Sleep(100 * time.Millisecond)
			p.CancelWait(w, cause)
		}()
		if _, err := p.GetWith(w, time.Second, nil); !errors.Is(err, cause) {
			t.Fatalf("cancel: %v", err)
		}
		p.CancelWait(w, cause) // not waiting: nothing happens
		if st := p.Stats(); st.Waiting != 0 {
			t.Fatalf("%d still waiting", st.Waiting)
		}

		// Still usable afterwards, and the stale cancel above did not stick.
		p.Put(b)
		c, err := p.GetWith(w, time.Second, nil)
		if err != nil || c != a {
			t.Fatalf("reuse: %v %v", c, err)
		}
		p.Put(c)
	})
}

// TestGetWithWaitsWithoutAllocating: a checkout that queues and is handed a
// connection allocates nothing.
func TestGetWithWaitsWithoutAllocating(t *testing.T) {
	p := newPool(&dialer{}, 1, 0)
	defer p.Close()
	holder, waiter := NewWaiter[*fakeConn](), NewWaiter[*fakeConn]()
	c, err := p.GetWith(holder, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan *fakeConn)
	go func() {
		for c := range release {
			for p.Stats().Waiting == 0 {
				time.Sleep(10 * time.Microsecond)
			}
			p.Put(c)
		}
	}()
	allocs := testing.AllocsPerRun(100, func() {
		release <- c
		var err error
		c, err = p.GetWith(waiter, time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
	})
	close(release)
	if allocs > 0 {
		t.Fatalf("%.1f allocations per queued checkout", allocs)
	}
	p.Put(c)
}

// A pool closed (retired by a reload, or at shutdown) while its connects
// fail, after the next attempt was due, must not log a negative
// next_retry_in (issue 22): the retry is due now, or not at all.
func TestNextRetryInNeverNegative(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		core, logs := observer.New(zap.DebugLevel)
		// Each attempt fails after 5s: the next one is due 1s later, and is
		// in flight (so overdue from the pool's point of view) for 5s.
		d := &dialer{fail: errors.New("down"), delay: 5 * time.Second}
		cfg := baseConfig(d, 5, 0)
		cfg.Warm = true
		cfg.Logger = zap.New(core)
		cfg.ConnectTimeout = time.Minute
		p := New(cfg, new(atomic.Uint64))
		time.Sleep(8 * time.Second) // attempt 2 started at 6s, still in flight
		synctest.Wait()
		p.Close()
		time.Sleep(10 * time.Second) // the attempt in flight ends
		synctest.Wait()
		seen := 0
		for _, e := range logs.All() {
			for _, f := range e.Context {
				if f.Key != "next_retry_in" {
					continue
				}
				seen++
				if d := time.Duration(f.Integer); d < 0 {
					t.Errorf("%q logged next_retry_in %s", e.Message, d)
				}
			}
		}
		if seen == 0 {
			t.Fatal("no next_retry_in logged at all")
		}
	})
}

// TestLongWait: LongWait is told once the first queued checkout has waited
// WaitWarning, with the pool's state, and at most once per LongWaitEvery
// however long the wait goes on; never without a waiter.
func TestLongWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		cfg := baseConfig(d, 1, 0)
		cfg.WaitWarning = 2 * time.Second
		var mu sync.Mutex
		var calls []Stats
		cfg.LongWait = func(st Stats) {
			mu.Lock()
			calls = append(calls, st)
			mu.Unlock()
		}
		count := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(calls)
		}
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		held, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := count(); n != 0 {
			t.Fatalf("%d calls with nobody waiting", n)
		}
		got := make(chan error, 1)
		go func() {
			c, err := p.GetWith(NewWaiter[*fakeConn](), time.Minute, nil)
			if err == nil {
				p.Put(c)
			}
			got <- err
		}()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if n := count(); n != 0 {
			t.Fatalf("%d calls before the wait reached WaitWarning", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := count(); n != 1 {
			t.Fatalf("%d calls after the wait passed WaitWarning, want 1", n)
		}
		if st := calls[0]; st.Waiting != 1 || st.Active != 1 || st.MaxSize != 1 || st.OldestWait < 2*time.Second {
			t.Fatalf("LongWait's snapshot: %+v", st)
		}
		time.Sleep(8 * time.Second) // some 8.5 s after the first call
		synctest.Wait()
		if n := count(); n != 1 {
			t.Fatalf("%d calls within LongWaitEvery of the first, want 1", n)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := count(); n != 2 {
			t.Fatalf("%d calls once LongWaitEvery had passed with the wait going on, want 2", n)
		}
		p.Put(held)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if n := count(); n != 2 {
			t.Fatalf("%d calls after the wait ended, want 2", n)
		}
	})
}

// TestFloorLoweredWhenServerFull: a min_size the server cannot give (its
// connection slots run out after two) lowers the pool's effective floor to
// what is open, without a failure, backoff or unhealthy state; every
// BackoffMax one more is tried; once the server has room again the
// floor climbs back to min_size.
func TestFloorLoweredWhenServerFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errFull := errors.New("too many connections")
		var mu sync.Mutex
		room, opened := 2, 0
		cfg := baseConfig(&dialer{}, 6, 4)
		cfg.Connect = func(ctx context.Context) (*fakeConn, error) {
			mu.Lock()
			defer mu.Unlock()
			if opened >= room {
				return nil, errFull
			}
			opened++
			return &fakeConn{n: opened}, nil
		}
		cfg.Capacity = func(err error) (string, bool) { return "max_connections", errors.Is(err, errFull) }
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		st := p.Stats()
		if st.Total != 2 || st.EffectiveMinSize != 2 || st.MinSize != 4 || st.Failures != 0 || st.State != Healthy {
			t.Fatalf("with room for two: total %d, effective min %d (min %d), failures %d, state %s; want 2, 2 (4), 0, healthy",
				st.Total, st.EffectiveMinSize, st.MinSize, st.Failures, st.State)
		}
		attempts := st.ConnectAttempts
		time.Sleep(cfg.BackoffMax + time.Second) // one more tried, refused again
		synctest.Wait()
		st = p.Stats()
		if st.ConnectAttempts != attempts+1 || st.EffectiveMinSize != 2 || st.Failures != 0 {
			t.Fatalf("after one retry period: %d attempts (was %d), effective min %d, failures %d; want one attempt more, 2, 0",
				st.ConnectAttempts, attempts, st.EffectiveMinSize, st.Failures)
		}
		mu.Lock()
		room = 10
		mu.Unlock()
		time.Sleep(2 * cfg.BackoffMax)
		synctest.Wait()
		st = p.Stats()
		if st.Total != 4 || st.EffectiveMinSize != 4 {
			t.Fatalf("with room again: total %d, effective min %d; want 4, 4", st.Total, st.EffectiveMinSize)
		}
	})
}

// CheckedOut is told of each checkout, fresh for a connection opened for
// it; Closed of each discard and recycle with its reason. A connection's
// own idle timeout replaces the pool's.
func TestCheckoutAndCloseHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		cfg := baseConfig(d, 5, 0)
		cfg.IdleTimeout = time.Hour
		var mu sync.Mutex
		var events []string
		cfg.CheckedOut = func(c *fakeConn, fresh bool) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, fmt.Sprintf("out %d fresh=%v", c.n, fresh))
		}
		cfg.Closed = func(c *fakeConn, reason string) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, fmt.Sprintf("closed %d %s", c.n, reason))
		}
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx) // opened for this checkout
		p.Put(a)
		a, _ = p.Get(ctx) // the idle one
		b, _ := p.Get(ctx)
		p.Discard(b, "broken")
		a.SetIdleTimeout(10 * time.Second)
		p.Put(a)
		time.Sleep(11 * time.Second) // a's own idle timeout, not the pool's hour
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		want := []string{"out 1 fresh=true", "out 1 fresh=false", "out 2 fresh=true", "closed 2 broken", "closed 1 idle_timeout"}
		if !slices.Equal(events, want) {
			t.Fatalf("events %q, want %q", events, want)
		}
	})
}

// The reserve: a checkout that has waited ReserveTimeout on a full pool
// gets a connection beyond MaxSize (at most ReserveSize of them), which is
// closed when it comes back with nobody waiting. A checkout served sooner
// opens none.
func TestReservePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		cfg := baseConfig(d, 2, 0)
		cfg.ReserveSize, cfg.ReserveTimeout = 1, 5*time.Second
		var closed []string
		var mu sync.Mutex
		cfg.Closed = func(c *fakeConn, reason string) {
			mu.Lock()
			defer mu.Unlock()
			closed = append(closed, reason)
		}
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		b, _ := p.Get(ctx)

		// Served by a Put before the reserve timeout: no reserve.
		got := make(chan *fakeConn, 2)
		go func() {
			c, _ := p.GetWith(NewWaiter[*fakeConn](), time.Minute, nil)
			got <- c
		}()
		time.Sleep(4 * time.Second)
		p.Put(a)
		a = <-got
		if st := p.Stats(); st.ReserveOpened != 0 || st.Total != 2 {
			t.Fatalf("served before the timeout: %+v", st)
		}

		// Two waiters past the timeout: one reserve connection (ReserveSize 1).
		start := time.Now()
		for range 2 {
			go func() {
				c, _ := p.GetWith(NewWaiter[*fakeConn](), time.Minute, nil)
				got <- c
			}()
		}
		synctest.Wait()
		time.Sleep(4900 * time.Millisecond)
		synctest.Wait()
		if st := p.Stats(); st.Total != 2 || st.Waiting != 2 {
			t.Fatalf("before reserve_pool_timeout: %+v", st)
		}
		c := <-got
		if waited := time.Since(start); waited < 5*time.Second || waited > 5*time.Second+100*time.Millisecond {
			t.Errorf("the reserve connection came after %s, want reserve_pool_timeout (5s)", waited)
		}
		synctest.Wait()
		if st := p.Stats(); st.Total != 3 || st.ReserveOpened != 1 || st.Waiting != 1 {
			t.Fatalf("after reserve_pool_timeout: %+v, want 3 open (one reserve), one still waiting", st)
		}
		// A connection coming back goes to the waiter, even the reserve
		// one; with nobody waiting, the reserve one closes.
		p.Put(c)
		c = <-got
		p.Put(c)
		synctest.Wait()
		mu.Lock()
		reasons := slices.Clone(closed)
		mu.Unlock()
		if st := p.Stats(); st.Total != 2 || !slices.Equal(reasons, []string{"reserve_idle"}) {
			t.Fatalf("after the burst: %+v, closed %v; want back at max_size, the reserve closed", st, reasons)
		}
		p.Put(a)
		p.Put(b)
		synctest.Wait()
		if st := p.Stats(); st.Total != 2 || st.Idle != 2 {
			t.Fatalf("the pool's own connections: %+v", st)
		}
	})
}

// TakeSlot: a replication connection's place counts in the pool's size. A
// free place is taken at once; with the pool full, an idle connection is
// evicted for it; with every connection busy, it waits in FIFO order and
// takes the first one freed (closing it); its release lets a waiting
// checkout open a connection; PAUSE does not wait for it.
func TestTakeSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		p := newPool(d, 2, 0)
		defer p.Close()
		ctx := context.Background()

		rel1, err := p.TakeSlot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Total != 1 || st.Lent != 1 || d.n != 0 {
			t.Fatalf("a free place: total %d lent %d, %d connects; want 1, 1, 0", st.Total, st.Lent, d.n)
		}
		c1, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.Put(c1) // idle, the pool now full (one connection, one place lent)
		rel2, err := p.TakeSlot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := p.Stats(); st.Total != 2 || st.Lent != 2 || st.Idle != 0 || !c1.closed.Load() || st.Evictions["evicted"] != 1 {
			t.Fatalf("the idle connection evicted: total %d lent %d idle %d closed %v evictions %v", st.Total, st.Lent, st.Idle, c1.closed.Load(), st.Evictions)
		}

		// Full of places: a checkout waits until a release lets it open.
		got := getAsync(t, ctx, p)
		synctest.Wait()
		if st := p.Stats(); st.Waiting != 1 {
			t.Fatalf("waiting %d, want 1", st.Waiting)
		}
		rel1()
		rel1() // once only
		c2 := <-got
		if st := p.Stats(); st.Total != 2 || st.Lent != 1 || st.Active != 1 {
			t.Fatalf("after a release: total %d lent %d active %d; want 2, 1, 1", st.Total, st.Lent, st.Active)
		}

		// Every place busy: TakeSlot waits for the connection freed first,
		// within its context.
		short, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := p.TakeSlot(short); err == nil {
			t.Fatal("TakeSlot with every place busy returned before its context ended")
		}
		cancel()
		done := make(chan func(), 1)
		go func() {
			rel, err := p.TakeSlot(ctx)
			if err != nil {
				t.Error(err)
			}
			done <- rel
		}()
		synctest.Wait()
		p.Put(c2)
		rel3 := <-done
		synctest.Wait()
		if st := p.Stats(); st.Total != 2 || st.Lent != 2 || st.Active != 0 || !c2.closed.Load() {
			t.Fatalf("the freed connection's place: total %d lent %d active %d closed %v", st.Total, st.Lent, st.Active, c2.closed.Load())
		}

		// PAUSE waits for pooled connections only.
		p.Pause()
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		if err := p.WaitEmpty(wctx); err != nil {
			t.Errorf("WaitEmpty with only places lent: %v", err)
		}
		wcancel()
		p.Resume()
		rel2()
		rel3()
		if st := p.Stats(); st.Total != 0 || st.Lent != 0 {
			t.Fatalf("after every release: total %d lent %d", st.Total, st.Lent)
		}
	})
}

// TestEnqueue covers the non-blocking checkout of an event loop: an idle
// connection at once, a queued one served by a Put in FIFO order with
// GetWith's waiters, the timeout, CancelWait, the pool closing, and reuse
// of the Waiter by GetWith afterwards (ready is not called again).
func TestEnqueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 1, 0)
		defer p.Close()
		a, err := p.Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.Put(a)
		w := NewWaiter[*fakeConn]()
		var readies atomic.Int32
		ready := func() { readies.Add(1) }
		if c, ok, err := p.Enqueue(w, time.Second, ready); !ok || err != nil || c != a {
			t.Fatalf("idle at once: %v %v %v", c, ok, err)
		}

		// Queued behind a GetWith waiter: the first Put serves that one.
		sync := NewWaiter[*fakeConn]()
		got := make(chan *fakeConn)
		go func() {
			c, _ := p.GetWith(sync, time.Second, nil)
			got <- c
		}()
		synctest.Wait()
		if _, ok, err := p.Enqueue(w, time.Second, ready); ok || err != nil {
			t.Fatalf("should queue: %v %v", ok, err)
		}
		if _, _, ok, _ := p.Collect(w); ok {
			t.Fatal("Collect before anything was delivered: ok")
		}
		p.Put(a)
		if c := <-got; c != a || readies.Load() != 0 {
			t.Fatalf("FIFO: GetWith got %v, ready called %d times", c, readies.Load())
		}
		p.Put(a)
		if readies.Load() != 1 {
			t.Fatalf("ready called %d times after the hand-over", readies.Load())
		}
		if c, fresh, ok, err := p.Collect(w); c != a || fresh || err != nil || !ok {
			t.Fatalf("collect: %v %v %v", c, fresh, err)
		}

		// Timeout, with the real (bubble) clock: the caller's timer calls
		// Expire; one that comes early is told how long is left.
		start := time.Now()
		if _, ok, err := p.Enqueue(w, 250*time.Millisecond, ready); ok || err != nil {
			t.Fatalf("should queue: %v %v", ok, err)
		}
		time.Sleep(100 * time.Millisecond)
		if expired, left := p.Expire(w); expired || left != 150*time.Millisecond || readies.Load() != 1 {
			t.Fatalf("early Expire: %v, %v left, ready %d", expired, left, readies.Load())
		}
		time.Sleep(900 * time.Millisecond)
		if readies.Load() != 1 {
			t.Fatal("the wait timed out without Expire")
		}
		if expired, _ := p.Expire(w); !expired {
			t.Fatal("Expire after the deadline did not time the wait out")
		}
		var te *CheckoutTimeoutError
		if _, _, _, err := p.Collect(w); readies.Load() != 2 || !errors.As(err, &te) || te.Waited != time.Second {
			t.Fatalf("timeout: ready %d, %v (waited from %v)", readies.Load(), err, start)
		}

		// CancelWait, then a stale timer does nothing to the next wait.
		cause := errors.New("cancelled")
		if _, ok, _ := p.Enqueue(w, 100*time.Millisecond, ready); ok {
			t.Fatal("should queue")
		}
		p.CancelWait(w, cause)
		if _, _, _, err := p.Collect(w); readies.Load() != 3 || !errors.Is(err, cause) {
			t.Fatalf("cancel: ready %d, %v", readies.Load(), err)
		}
		time.Sleep(time.Second)
		if expired, left := p.Expire(w); expired || left != 0 || readies.Load() != 3 {
			t.Fatalf("a stale Expire after the wait ended: %v, %v left, ready %d", expired, left, readies.Load())
		}

		// GetWith with the same Waiter: ready is not called.
		p.Put(a)
		if c, err := p.GetWith(w, time.Second, nil); c != a || err != nil || readies.Load() != 3 {
			t.Fatalf("GetWith after Enqueue: %v %v ready %d", c, err, readies.Load())
		}

		// Closing the pool ends a queued wait.
		if _, ok, _ := p.Enqueue(w, 0, ready); ok {
			t.Fatal("should queue")
		}
		p.Close()
		if _, _, _, err := p.Collect(w); readies.Load() != 4 || !errors.Is(err, ErrClosed) {
			t.Fatalf("close: ready %d, %v", readies.Load(), err)
		}
	})
}

// TestMaxUses: a connection that served max_uses checkouts is closed when
// it comes back, even with a request waiting (which gets a new
// connection) and beyond recycle_rate.
func TestMaxUses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		cfg := baseConfig(d, 1, 0)
		cfg.MaxUses = 1
		cfg.RecycleRate = 1
		p := New(cfg, new(atomic.Uint64))
		defer p.Close()
		ctx := context.Background()
		a, _ := p.Get(ctx)
		got := getAsync(t, ctx, p)
		synctest.Wait() // the second checkout waits: max_size 1
		p.Put(a)
		b := <-got
		synctest.Wait() // the pool closes a on a goroutine of its own
		if !a.closed.Load() || b == a || b.closed.Load() {
			t.Fatalf("used once: a closed %v, the waiter got a again %v", a.closed.Load(), b == a)
		}
		p.Put(b) // a second one within the same second: not rate limited
		synctest.Wait()
		if st := p.Stats(); !b.closed.Load() || st.RecycledUses != 2 || st.Total != 0 {
			t.Fatalf("b closed %v, stats %+v", b.closed.Load(), st)
		}
	})
}

// TestConnectFailureWithOnlyStaleConnections: a connection Reconnect marked
// for closing cannot serve the queue, so a failed connect tells the waiters
// at once (as with nothing open) instead of letting them wait for their
// timeout; so does a new checkout within the backoff.
func TestConnectFailureWithOnlyStaleConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("password authentication failed")
		d := &dialer{}
		p := newPool(d, 2, 0)
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		held, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d.setFail(boom)
		p.Reconnect() // held closes when it comes back
		start := time.Now()
		_, err = p.Get(ctx)
		var ue *UnavailableError
		if !errors.As(err, &ue) || !errors.Is(err, boom) || time.Since(start) != 0 {
			t.Fatalf("with only a connection marked for closing: %v after %s, want UnavailableError at once", err, time.Since(start))
		}
		if _, err := p.Get(ctx); !errors.As(err, &ue) {
			t.Fatalf("within the backoff: %v", err)
		}
		p.Put(held)
		synctest.Wait()
		if !held.closed.Load() {
			t.Fatal("the connection marked for closing was kept")
		}
	})
}

// TestWaitUnavailableButRefused: with WaitUnavailable a checkout waits
// through failing connects, but not through a login the server refuses
// for good (Refused): that one is told at once.
func TestWaitUnavailableButRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refusal := errors.New("password authentication failed")
		for _, tc := range []struct {
			err     error
			waits   bool
			elapsed time.Duration
		}{{errors.New("connection refused"), true, 5 * time.Second}, {refusal, false, 0}} {
			cfg := baseConfig(&dialer{fail: tc.err}, 2, 0)
			cfg.WaitUnavailable = true
			cfg.Refused = func(err error) bool { return errors.Is(err, refusal) }
			p := New(cfg, new(atomic.Uint64))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			start := time.Now()
			_, err := p.Get(ctx)
			cancel()
			var ue *UnavailableError
			if got := time.Since(start); got != tc.elapsed || tc.waits == errors.As(err, &ue) {
				t.Errorf("%v: %v after %s; want waiting %v (for %s)", tc.err, err, got, tc.waits, tc.elapsed)
			}
			p.Close()
		}
	})
}

// getAsync checks a connection out of p on a goroutine of its own; the
// channel delivers it (nil after an error, which fails the test).
func getAsync(t *testing.T, ctx context.Context, p *Pool[*fakeConn]) <-chan *fakeConn {
	got := make(chan *fakeConn, 1)
	go func() {
		c, err := p.Get(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	return got
}

// TestSuspend: while suspended the pool hands out nothing and opens
// nothing, but keeps its connections, idle and returned ones alike (a
// pause closes them); Unsuspend gives them to the waiting checkouts in
// their order, without a new connect. A checkout that waits past its
// deadline says the pool was suspended.
func TestSuspend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{}
		p := newPool(d, 3, 0) // room for a third: still no connect
		defer p.Close()
		ctx := context.Background()
		a, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := p.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.Put(b) // idle
		p.Suspend()
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err = p.Get(short)
		cancel()
		var te *CheckoutTimeoutError
		if !errors.As(err, &te) || !te.Stats.Suspended {
			t.Fatalf("checkout while suspended: %v, want a timeout that says suspended", err)
		}
		first := getAsync(t, ctx, p)
		synctest.Wait()
		second := getAsync(t, ctx, p)
		synctest.Wait()
		p.Put(a) // returned while suspended: kept, not handed out
		synctest.Wait()
		if st := p.Stats(); st.Total != 2 || st.Idle != 2 || st.Waiting != 2 || !st.Suspended || a.closed.Load() || b.closed.Load() {
			t.Fatalf("suspended: %+v", st)
		}
		p.Unsuspend()
		got := []*fakeConn{<-first, <-second}
		if !(got[0] == a && got[1] == b || got[0] == b && got[1] == a) {
			t.Fatalf("after Unsuspend the waiters got %p %p, want the two kept connections", got[0], got[1])
		}
		d.mu.Lock()
		dials := d.n
		d.mu.Unlock()
		if dials != 2 {
			t.Errorf("%d connects, want 2 (none while suspended or after)", dials)
		}
		if st := p.Stats(); st.Suspended || st.Active != 2 || st.Waiting != 0 {
			t.Fatalf("after Unsuspend: %+v", st)
		}
		p.Put(got[0])
		p.Put(got[1])
	})
}

// TestRoundRobin: by default the idle connection used last is handed out
// again (the others idle out); with RoundRobin the one unused longest, so
// that every connection gets its share. A Reconfigure switches it.
func TestRoundRobin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 3, 0)
		defer p.Close()
		ctx := context.Background()
		var conns []*fakeConn
		for range 3 {
			c, err := p.Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			p.Put(c) // conns[0] unused longest, conns[2] used last
		}
		take := func() *fakeConn {
			t.Helper()
			c, err := p.Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Put(c)
			return c
		}
		if c := take(); c != conns[2] {
			t.Errorf("default: got connection %d, want the one used last", slices.Index(conns, c))
		}
		set := *p.set()
		set.RoundRobin = true
		p.Reconfigure(set)
		// Idle now: 0, 1, 2 (2 used last again). Round robin: 0, 1, 2, 0.
		for i, want := range []int{0, 1, 2, 0} {
			if c := take(); c != conns[want] {
				t.Errorf("round robin, checkout %d: got connection %d, want %d", i, slices.Index(conns, c), want)
			}
		}
	})
}
