package integration

// The "Done when" of seed 004's connection management: PostgreSQL stops for
// 10 s under load and starts again; poolerd stays up, its pool is healthy
// again within 2 s of PostgreSQL accepting connections, and only requests
// made while PostgreSQL was away failed.
//
// This test stops the shared server, so it must not overlap any other test:
// it does not call t.Parallel. Go runs the top-level tests that call
// t.Parallel only after every sequential top-level test has returned (they
// are paused in t.Parallel until the loop over the tests ends), and every
// parallel test of this package calls t.Parallel before it touches
// PostgreSQL. A sequential test runs alone.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pool"
)

// lcOutcome is one transaction (or login) of the outage load generator.
type lcOutcome struct {
	worker     int
	start, end time.Time
	err        error
	login      bool
}

// lcLoad runs short transactions through poolerd from several clients, each
// reconnecting after any error, and records every outcome.
type lcLoad struct {
	mu       sync.Mutex
	outcomes []lcOutcome
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func lcStartLoad(p *instance, workers int) *lcLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &lcLoad{cancel: cancel}
	dsn := p.appDSN(txExecMode, "application_name=lc-outage")
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var c *pgx.Conn
			defer func() {
				if c != nil {
					_ = c.Close(context.Background())
				}
			}()
			for i := 0; ctx.Err() == nil; i++ {
				if c == nil {
					start := time.Now()
					cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
					nc, err := pgx.Connect(cctx, dsn)
					ccancel()
					if ctx.Err() != nil {
						if nc != nil {
							_ = nc.Close(context.Background())
						}
						return
					}
					if err != nil {
						l.record(lcOutcome{worker: w, start: start, end: time.Now(), err: err, login: true})
						time.Sleep(50 * time.Millisecond)
						continue
					}
					c = nc
				}
				start := time.Now()
				tctx, tcancel := context.WithTimeout(ctx, 8*time.Second)
				err := pgx.BeginFunc(tctx, c, func(tx pgx.Tx) error {
					var n, s int
					if err := tx.QueryRow(tctx, "SELECT $1::int", i).Scan(&n); err != nil {
						return err
					}
					if n != i {
						return fmt.Errorf("got %d, want %d", n, i)
					}
					return tx.QueryRow(tctx, "SELECT count(*) FROM pg_class WHERE oid > $1::int", n%1000).Scan(&s)
				})
				tcancel()
				if ctx.Err() != nil {
					return
				}
				l.record(lcOutcome{worker: w, start: start, end: time.Now(), err: err})
				if err != nil {
					_ = c.Close(context.Background())
					c = nil
					time.Sleep(50 * time.Millisecond)
					continue
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *lcLoad) record(o lcOutcome) {
	l.mu.Lock()
	l.outcomes = append(l.outcomes, o)
	l.mu.Unlock()
}

func (l *lcLoad) stop() []lcOutcome {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lcOutcome(nil), l.outcomes...)
}

func (l *lcLoad) snapshot() []lcOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lcOutcome(nil), l.outcomes...)
}

// PostgreSQL is stopped for 10 s under load from 16 clients and started
// again. pgbench is not used: in PostgreSQL 15 it aborts a client at its
// first connection or query error (it retries only serialization failures
// and deadlocks), so it cannot go on through an outage; the load generator
// here reconnects after every error instead.
func TestOutagePostgresRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("stops PostgreSQL for 10 s")
	}
	const workers, outage = 16, 10 * time.Second
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 8
		c.CheckoutTimeout = 10 * time.Second
		// Production defaults for the backoff: recovery within 2 s must
		// come from the probe, not from a short backoff.
		c.ReconnectBackoffBase = time.Second
		c.ReconnectBackoffMax = 16 * time.Second
		c.LogLevel = "info"
	})
	lcWaitState(t, p, 5*time.Second, pool.Healthy)

	load := lcStartLoad(p, workers)
	defer load.stop()
	time.Sleep(2 * time.Second)
	for _, o := range load.snapshot() {
		if o.err != nil {
			t.Fatalf("worker %d failed before the outage: %v", o.worker, o.err)
		}
	}
	if n := len(load.snapshot()); n < workers {
		t.Fatalf("only %d transactions in 2 s before the outage", n)
	}

	// Stop PostgreSQL; make sure it runs again whatever happens.
	stopAt := time.Now()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := pg.StartAgain(); err != nil {
				t.Errorf("restarting PostgreSQL after a failed test: %v", err)
			}
		}
	})
	if err := pg.Stop(); err != nil {
		t.Fatalf("stop PostgreSQL: %v", err)
	}
	stopped := time.Now()
	t.Logf("PostgreSQL stopped in %s", stopped.Sub(stopAt).Round(time.Millisecond))

	// While it is away: the pool becomes unhealthy, poolerd is not ready
	// but still answers, and requests fail fast with 08006 and a retry
	// hint (asked in the middle of the outage, when PostgreSQL has been
	// gone for seconds).
	lcWaitState(t, p, 5*time.Second, pool.Unhealthy)
	probe := p.connect(t, txExecMode)
	time.Sleep(time.Until(stopAt.Add(outage / 2)))
	if ok, reason := p.srv.Ready(); ok {
		t.Errorf("Ready() true while PostgreSQL is down")
	} else {
		t.Logf("during the outage: Ready() false: %s", reason)
	}
	t0 := time.Now()
	_, err := probe.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
	if err == nil {
		t.Fatal("query through poolerd succeeded while PostgreSQL is down")
	}
	if pe := lcPgError(t, err); pe.Code != "08006" || !strings.HasPrefix(pe.Message, "upstream unavailable, next retry in") {
		t.Errorf("query %s after PostgreSQL stopped: %s %q, want 08006 \"upstream unavailable, next retry in …\"",
			time.Since(stopAt).Round(time.Millisecond), pe.Code, pe.Message)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("query during the outage failed only after %s", d)
	}
	t.Logf("during the outage: %v", err)
	if st := lcStats(t, p); st.State != pool.Unhealthy {
		t.Errorf("pool %s during the outage", st.State)
	}

	time.Sleep(time.Until(stopAt.Add(outage)))
	if err := pg.StartAgain(); err != nil {
		t.Fatalf("start PostgreSQL again: %v", err)
	}
	restarted = true
	started := time.Now() // PostgreSQL accepts connections (StartAgain waited for it)
	var healthyAfter time.Duration
	for {
		if lcStats(t, p).State == pool.Healthy {
			healthyAfter = time.Since(started)
			break
		}
		if time.Since(started) > 10*time.Second {
			t.Fatalf("pool not healthy 10 s after PostgreSQL came back: %+v", lcStats(t, p).Stats)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("pool healthy %s after PostgreSQL accepts connections", healthyAfter.Round(time.Millisecond))
	if healthyAfter > 2*time.Second {
		t.Errorf("pool healthy only %s after PostgreSQL accepts connections, want ≤ 2 s", healthyAfter)
	}

	// Keep the load going after the recovery, then look at what failed.
	time.Sleep(3 * time.Second)
	outcomes := load.stop()
	windowStart, windowEnd := stopAt.Add(-100*time.Millisecond), started.Add(2*time.Second)
	var ok, failed, logins, inFlight, outside int
	codes := map[string]int{}
	okAfter := map[int]int{}
	var longest time.Duration
	for _, o := range outcomes {
		if o.err == nil {
			ok++
			if o.start.After(windowEnd) {
				okAfter[o.worker]++
			}
			continue
		}
		failed++
		if o.login {
			logins++
		}
		if o.start.Before(stopped) {
			inFlight++ // started before PostgreSQL had finished stopping
		}
		code := pgCode(o.err)
		if code == "" {
			code = "no SQLSTATE"
		}
		codes[code]++
		longest = max(longest, o.end.Sub(o.start))
		if o.end.Before(windowStart) || o.start.After(windowEnd) {
			outside++
			if outside <= 5 {
				t.Errorf("worker %d: request from %s to %s failed outside the outage [%s, %s]: %v",
					o.worker, o.start.Format("15:04:05.000"), o.end.Format("15:04:05.000"),
					windowStart.Format("15:04:05.000"), windowEnd.Format("15:04:05.000"), o.err)
			}
		}
	}
	if outside > 0 {
		t.Errorf("%d requests failed outside the outage window", outside)
	}
	var kinds []string
	for c, n := range codes {
		kinds = append(kinds, fmt.Sprintf("%s×%d", c, n))
	}
	sort.Strings(kinds)
	t.Logf("%d transactions succeeded, %d requests failed (%d logins, %d started while PostgreSQL was stopping); failures by SQLSTATE: %v; longest failure %s",
		ok, failed, logins, inFlight, kinds, longest.Round(time.Millisecond))
	if failed == 0 {
		t.Errorf("no request failed during a 10 s outage: the load did not reach PostgreSQL")
	}
	// Failing requests fail fast instead of waiting out checkout_timeout.
	if longest > 5*time.Second {
		t.Errorf("a failing request took %s", longest)
	}
	for w := range workers {
		if okAfter[w] == 0 {
			t.Errorf("worker %d had no successful transaction after the recovery", w)
		}
	}

	// poolerd is still up and serving, its pool consistent.
	c := p.connect(t, txExecMode)
	var one int
	if err := c.QueryRow(ctxTimeout(t, 10*time.Second), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query after the outage: %v", err)
	}
	if _, err := probe.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
		t.Errorf("the client that saw 08006 during the outage cannot query after it: %v", err)
	}
	eventually(t, 5*time.Second, "all server connections released", func() bool {
		st := lcStats(t, p)
		return st.Active == 0 && st.Acquisitions == st.Releases
	})
	st := lcStats(t, p)
	if st.State != pool.Healthy || st.Total > 8 || st.PeakActive > 8 {
		t.Errorf("pool after the outage: %+v", st.Stats)
	}
	if ok, reason := p.srv.Ready(); !ok {
		t.Errorf("Ready() false after the outage: %s", reason)
	}
}

// TestOnServerUnavailableWait: with on_server_unavailable wait (a
// pgbouncer.ini's default), a request that comes while PostgreSQL cannot be
// reached waits within checkout_timeout and is served once it is back, as
// in PgBouncer; with fail (the default) it is refused at once with 08006.
func TestOnServerUnavailableWait(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"wait", "fail"} {
		t.Run(mode, func(t *testing.T) {
			px := lcProxy(t)
			p := lcStartVia(t, px, func(c *config.Config) {
				c.PoolMode = config.PoolTransaction
				c.MinSize = 0
				c.WarmPools = false
				c.CheckoutTimeout = 20 * time.Second
				c.ReconnectBackoffBase = 200 * time.Millisecond
				c.ReconnectBackoffMax = 400 * time.Millisecond
				c.OnServerUnavailable = mode
			})
			c := p.connect(t, txExecMode)
			ctx := ctxTimeout(t, 30*time.Second)
			lcBackendPID(t, ctx, c)
			if err := px.Pause(); err != nil { // new connects refused
				t.Fatal(err)
			}
			p.srv.Reconnect("") // the open connection goes when it comes back
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := c.Exec(ctx, "SELECT 1")
				done <- err
			}()
			if mode == "fail" {
				err := <-done
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "08006" || time.Since(start) > 5*time.Second {
					t.Fatalf("fail: %v after %s, want 08006 at once", err, time.Since(start))
				}
				return
			}
			select {
			case err := <-done:
				t.Fatalf("wait: answered while PostgreSQL was unreachable: %v", err)
			case <-time.After(1500 * time.Millisecond):
			}
			if err := px.Resume(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("wait: %v after %s, want it served once PostgreSQL is back", err, time.Since(start))
			}
		})
	}
}
