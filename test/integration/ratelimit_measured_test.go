package integration

// Measured rate-limit buckets (server_time, rows, bytes): what a
// transaction cost the database is charged when it ends, and a key in debt
// waits (or is refused) at its next transaction.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
	"github.com/poolerd/poolerd/test/redistest"
)

// rmShare is the fair-share rule of the tests: each application_name may
// use 1000 ms of server time per 2 s (half a server), waiting up to 30 s
// when it has used more.
func rmShare() config.RateLimitRule {
	return config.RateLimitRule{Name: "share", KeyBy: []string{"application_name"},
		ServerTime: &config.RateBucket{Limit: 1000, Per: 2 * time.Second}, Mode: "wait", MaxWait: 30 * time.Second}
}

// rmResult is what rmLoad saw.
type rmResult struct {
	heavy int             // heavy queries answered within the run
	light []time.Duration // each light query's latency
	errs  []error
}

// rmLoad runs, for d, heavy clients that run SELECT pg_sleep(0.2) back to
// back and light clients that run SELECT 1 every 10 ms. Only the heavy
// queries answered within d count: one waiting at the end is not.
func rmLoad(heavy, light []*pgx.Conn, d time.Duration) rmResult {
	var res rmResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), d+40*time.Second)
	defer cancel()
	end := time.Now().Add(d)
	for _, c := range heavy {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				_, err := c.Exec(ctx, "SELECT pg_sleep(0.2)")
				mu.Lock()
				if err != nil {
					res.errs = append(res.errs, err)
				} else if time.Now().Before(end) {
					res.heavy++
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	for _, c := range light {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				start := time.Now()
				_, err := c.Exec(ctx, "SELECT 1")
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					res.errs = append(res.errs, err)
				} else {
					res.light = append(res.light, took)
				}
				mu.Unlock()
				if err != nil {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return res
}

// p99 returns the 99th percentile of ds.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}

// rmCheckShare checks a run of rmLoad under rmShare: the heavy tenant got
// about its share of server time, the light one all its queries, quickly.
// Four heavy clients alone would run 4 × d / 200 ms queries; the share
// lets through the burst (1000 ms) and 500 ms a second, plus one query
// per heavy client started before the charges put it into debt.
func rmCheckShare(t *testing.T, res rmResult, heavyClients, lightClients int, d time.Duration) {
	t.Helper()
	if len(res.errs) > 0 {
		t.Fatalf("errors: %v", res.errs)
	}
	share := int((time.Second + d/2) / (200 * time.Millisecond))
	unthrottled := heavyClients * int(d/(200*time.Millisecond))
	t.Logf("heavy: %d queries of 200 ms in %s (share about %d, +%d in flight; %d without the limit); light: %d queries, p99 %s",
		res.heavy, d, share, heavyClients, unthrottled, len(res.light), p99(res.light))
	if res.heavy > share+heavyClients+2 {
		t.Errorf("the heavy tenant ran %d queries of 200 ms, more than its share of server time allows (about %d + %d)", res.heavy, share, heavyClients)
	}
	if res.heavy < share/2 {
		t.Errorf("the heavy tenant ran only %d queries, under half its share (%d)", res.heavy, share)
	}
	// A light query every 10 ms per client (plus its own time): at least
	// half of them on a loaded machine, none held back for seconds.
	if want := lightClients * int(d/(10*time.Millisecond)) / 4; len(res.light) < want {
		t.Errorf("the light tenant ran %d queries, fewer than %d: it was held back", len(res.light), want)
	}
	if p := p99(res.light); p > 250*time.Millisecond {
		t.Errorf("the light tenant's p99 is %s: held back with the heavy one", p)
	}
}

// Two tenants on one pool, one running 200 ms queries, the other 1 ms
// ones, each held to 1000 ms of server time per 2 s: the heavy one waits
// for its share, the light one is not affected. The charges and the debt
// show in the metrics.
func TestRateLimitServerTimeShare(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		c.MaxSize = 8
		c.RateLimits = []config.RateLimitRule{rmShare()}
	}})
	heavy := rlConns(t, p.instance, 4, rlSimple, "application_name=heavy")
	light := rlConns(t, p.instance, 2, rlSimple, "application_name=light")
	const d = 4 * time.Second
	res := rmLoad(heavy, light, d)
	rmCheckShare(t, res, 4, 2, d)

	charged := rlMetric(t, p, "poolerd_ratelimit_charged_total", "rule=share", "bucket=server_time")
	if min := float64(res.heavy) * 200; charged < min {
		t.Errorf("poolerd_ratelimit_charged_total{server_time} = %.0f ms, want at least %.0f (the heavy queries alone)", charged, min)
	}
	if n := rlMetric(t, p, "poolerd_ratelimit_debt_total", "rule=share", "bucket=server_time", "outcome=waited"); n < 1 {
		t.Errorf("poolerd_ratelimit_debt_total{waited} = %.0f: no transaction waited for a debt", n)
	}
	// SHOW RATE_LIMITS shows the measured bucket with the same figures.
	tb := obShow(t, obAdmin(t, p.instance, pgtest.RoleApp), "SHOW RATE_LIMITS")
	i := tb.must(t, "the server_time bucket", "rule", "share", "bucket", "server_time")
	if tb.val(i, "kind") != "measured" || tb.val(i, "limit") != "1000" || tb.val(i, "unit") != "ms" || tb.val(i, "per_seconds") != "2" {
		t.Errorf("SHOW RATE_LIMITS row: %s", tb)
	}
	if got, err := strconv.ParseFloat(tb.val(i, "charged"), 64); err != nil || got < float64(res.heavy)*200 {
		t.Errorf("SHOW RATE_LIMITS charged %q, want at least %d ms", tb.val(i, "charged"), res.heavy*200)
	}
	if got, err := strconv.ParseFloat(tb.val(i, "debt_waits"), 64); err != nil || got < 1 {
		t.Errorf("SHOW RATE_LIMITS debt_waits %q, want at least 1", tb.val(i, "debt_waits"))
	}
}

// The same across two poolerd processes sharing Redis: the heavy tenant's
// share is one for the fleet, not one per instance.
func TestRateLimitServerTimeShareRedis(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTB(t)
	mutate := func(c *config.Config) {
		c.MaxSize = 8
		rlRedis(c, rs, "deny", 2*time.Second)
		c.RateLimits = []config.RateLimitRule{rmShare()}
	}
	a := obStart(t, obOpts{metrics: true, http: true, mutate: mutate})
	b := obStart(t, obOpts{metrics: true, http: true, mutate: mutate})
	heavy := append(rlConns(t, a.instance, 2, rlSimple, "application_name=heavy"), rlConns(t, b.instance, 2, rlSimple, "application_name=heavy")...)
	light := append(rlConns(t, a.instance, 1, rlSimple, "application_name=light"), rlConns(t, b.instance, 1, rlSimple, "application_name=light")...)
	const d = 4 * time.Second
	res := rmLoad(heavy, light, d)
	rmCheckShare(t, res, 4, 2, d)
	for _, p := range []*obInst{a, b} {
		if n := rlMetric(t, p, "poolerd_ratelimit_charged_total", "rule=share", "bucket=server_time"); n < 200 {
			t.Errorf("an instance charged %.0f ms of server time: its heavy clients' queries were not charged", n)
		}
		if n := rlMetric(t, p, "poolerd_ratelimit_charge_errors_total"); n != 0 {
			t.Errorf("%.0f charges failed", n)
		}
	}
	rc := rs.Client()
	defer rc.Close()
	keys, err := rc.Keys(ctxTimeout(t, 5*time.Second), "poolerd:rl:*server_time").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, "application_name=heavy") }) {
		t.Errorf("no server_time state for the heavy tenant in Redis: %v", keys)
	}
}

// A reject rule on each measured bucket: the transaction that puts a
// bucket into debt runs (its cost is known only at its end), a statement
// inside a transaction is never refused for it, and the next transaction is
// refused with 53400 naming the bucket, its limit and when to retry.
func TestRateLimitMeasuredReject(t *testing.T) {
	t.Parallel()
	bucket := func(limit int64) *config.RateBucket { return &config.RateBucket{Limit: limit, Per: time.Minute} }
	p := startPoolerd(t, func(c *config.Config) {
		c.RateLimits = []config.RateLimitRule{
			{Name: "time", Match: config.RuleMatch{ApplicationName: "time"}, ServerTime: bucket(100), Mode: "reject"},
			{Name: "rows", Match: config.RuleMatch{ApplicationName: "rows"}, Rows: bucket(10), Mode: "reject"},
			{Name: "bytes", Match: config.RuleMatch{ApplicationName: "bytes"}, Bytes: bucket(1000), Mode: "reject"},
		}
	})
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct{ rule, costly, unit string }{
		{"time", "SELECT pg_sleep(0.3)", "ms of server time"},
		{"rows", "SELECT generate_series(1, 50)", "rows"},
		{"bytes", "SELECT repeat('x', 5000)", "bytes"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c := connectDSN(t, p.appDSN(rlSimple, "application_name="+tc.rule))
			bucket := map[string]string{"time": "server_time", "rows": "rows", "bytes": "bytes"}[tc.rule]
			for _, q := range []string{"BEGIN", tc.costly, "SELECT 1", tc.costly, "COMMIT"} {
				if _, err := c.Exec(ctx, q); err != nil {
					t.Fatalf("%s, inside the transaction that runs up the debt: %v", q, err)
				}
			}
			// The charge lands just after COMMIT's ReadyForQuery went out
			// (it needs the transaction's end): a client that sends its
			// next transaction at once may be ahead of it.
			time.Sleep(100 * time.Millisecond)
			_, err := c.Exec(ctx, "SELECT 1")
			pe, ok := rlLimited(err)
			if !ok {
				t.Fatalf("the transaction after the debt: %v, want 53400", err)
			}
			// Twice the costly statement, over five times the limit: a debt
			// of minutes, paid off at the limit per minute.
			if retry := rlRetryAfter(t, pe, "ERROR", tc.rule, bucket); retry < 3*time.Minute || retry > 20*time.Minute {
				t.Errorf("retry in %s, want the minutes until the debt is paid off", retry)
			}
			if !strings.Contains(pe.Detail, tc.unit) || !strings.Contains(pe.Detail, "per 1m0s") {
				t.Errorf("DETAIL %q does not give the limit in %s per 1m0s", pe.Detail, tc.unit)
			}
			// The session goes on; a client of another rule is not held back.
			if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
				t.Error("a second query in debt was allowed")
			}
			other := connectDSN(t, p.appDSN(rlSimple, "application_name=none"))
			if _, err := other.Exec(ctx, tc.costly); err != nil {
				t.Errorf("a client no rule matches: %v", err)
			}
		})
	}
}
