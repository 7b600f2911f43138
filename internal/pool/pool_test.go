package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
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
	mu      sync.Mutex
	n       int
	open    int
	maxOpen int
	fail    error
	delay   time.Duration
}

func (d *dialer) connect(ctx context.Context) (*fakeConn, error) {
	if d.delay > 0 {
		select {
		case <-time.After(d.delay):
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

func newPool(d *dialer, max, min int) *Pool[*fakeConn] {
	return New(Config[*fakeConn]{MaxSize: max, MinSize: min, Connect: d.connect, ConnectTimeout: time.Second, RetryDelay: time.Second}, new(atomic.Uint64))
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

func TestConnectFailureReachesTheWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("connection refused")
		p := newPool(&dialer{fail: boom}, 2, 0)
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		_, err := p.Get(ctx)
		var ce *ConnectError
		if !errors.As(err, &ce) || !errors.Is(err, boom) {
			t.Fatalf("want ConnectError wrapping the cause, got %v", err)
		}
		if time.Since(start) != 0 {
			t.Fatalf("waited %s for a failed connect", time.Since(start))
		}
		if st := p.Stats(); st.Total != 0 || st.ConnectFailures != 1 {
			t.Fatalf("stats %+v", st)
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
		if c == a || !a.closed.Load() {
			t.Fatal("discarded connection reused or not closed")
		}
		if st := p.Stats(); st.Total != 1 || st.Active != 1 {
			t.Fatalf("stats %+v", st)
		}
		p.Put(c)
	})
}

func TestDiscardIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPool(&dialer{}, 2, 0)
		defer p.Close()
		a, _ := p.Get(context.Background())
		p.Put(a)
		p.Discard(a, "server closed")
		if st := p.Stats(); st.Total != 0 || st.Idle != 0 {
			t.Fatalf("stats %+v", st)
		}
		if b, _ := p.Get(context.Background()); b == a {
			t.Fatal("got the discarded connection")
		}
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

func TestMinSizeRetriesAfterFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dialer{fail: errors.New("down")}
		p := newPool(d, 5, 1)
		defer p.Close()
		synctest.Wait()
		if p.Stats().Total != 0 {
			t.Fatal("connection counted after failure")
		}
		d.mu.Lock()
		d.fail = nil
		d.mu.Unlock()
		time.Sleep(time.Second) // RetryDelay
		synctest.Wait()
		if st := p.Stats(); st.Idle != 1 {
			t.Fatalf("not retried: %+v", st)
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
	})
}

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
	if peak.Load() > 4 || st.Total > 4 || st.Active != 0 || st.PeakActive > 4 {
		t.Fatalf("peak %d, stats %+v", peak.Load(), st)
	}
}
