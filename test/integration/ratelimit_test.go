package integration

// Tests of rate limits and backpressure (rate_limits, rate_limit_backend,
// on_redis_error) against the real PostgreSQL of the harness and real
// redis-server processes (test/redistest): reject mode lets about the limit
// through and refuses the rest with 53400, wait mode spreads requests
// without holding a server connection, the transactions and connections
// buckets, a budget shared by two poolerd instances through Redis, Redis
// failures and stalls following on_redis_error, and the metrics.
//
// Every bucket is GCRA with a burst of its limit (internal/limiter): a full
// bucket of {limit: L, per: P} allows L requests at once, then one every
// P/L, so over any window of length T at most L + T·L/P requests pass.
//
// The helpers of this file are prefixed rl.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
	"github.com/poolerd/poolerd/test/redistest"
)

// rlSimple makes pgx use the simple query protocol: one Query message, so
// one rate-limit decision, per Exec.
const rlSimple = "default_query_exec_mode=simple_protocol"

// rlQueries is a rule with a queries bucket of limit per per.
func rlQueries(name string, limit int64, per time.Duration, mode string, maxWait time.Duration) config.RateLimitRule {
	return config.RateLimitRule{Name: name, Queries: &config.RateBucket{Limit: limit, Per: per}, Mode: mode, MaxWait: maxWait}
}

// rlRedis points c's rate limits at rs.
func rlRedis(c *config.Config, rs *redistest.Server, onError string, timeout time.Duration) {
	c.RateLimitBackend = "redis"
	c.RedisURL = fmt.Sprintf("redis://%s/0", rs.Addr())
	c.OnRedisError = onError
	c.RedisTimeout = timeout
}

// rlConns opens n connections through p (as app to app) with the given
// query parameters.
func rlConns(t *testing.T, p *instance, n int, extra ...string) []*pgx.Conn {
	t.Helper()
	out := make([]*pgx.Conn, n)
	for i := range out {
		out[i] = connectDSN(t, p.appDSN(extra...))
	}
	return out
}

// rlLimited reports whether err is a "rate limit exceeded" refusal.
func rlLimited(err error) (*pgconn.PgError, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "53400" && strings.HasPrefix(pe.Message, "rate limit exceeded") {
		return pe, true
	}
	return nil, false
}

// rlResult is what a hammering run saw.
type rlResult struct {
	allowed []int // per connection
	limited int
	elapsed time.Duration
	// refusal is one of the refusals.
	refusal *pgconn.PgError
	// other are unexpected errors.
	other []error
}

func (r rlResult) total() int {
	n := 0
	for _, a := range r.allowed {
		n += a
	}
	return n
}

// rlHammer has every connection run SELECT 1 back to back for d, counting
// what was allowed and what was refused with 53400. After a refusal a
// connection pauses 3 ms, which keeps the CPU for the other tests and
// still takes any capacity (one unit every 20 ms at 50/s) within
// milliseconds of it freeing up.
func rlHammer(conns []*pgx.Conn, d time.Duration) rlResult {
	res := rlResult{allowed: make([]int, len(conns))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	stopAt := start.Add(d)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
			defer cancel()
			allowed, limited := 0, 0
			defer func() {
				mu.Lock()
				res.allowed[i] += allowed
				res.limited += limited
				mu.Unlock()
			}()
			for time.Now().Before(stopAt) {
				_, err := c.Exec(ctx, "SELECT 1")
				if err == nil {
					allowed++
					continue
				}
				if pe, ok := rlLimited(err); ok {
					limited++
					mu.Lock()
					if res.refusal == nil {
						res.refusal = pe
					}
					mu.Unlock()
					time.Sleep(3 * time.Millisecond)
					continue
				}
				mu.Lock()
				res.other = append(res.other, err)
				mu.Unlock()
				return
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// rlRetryRE is the DETAIL of a rate-limit refusal.
var rlRetryRE = regexp.MustCompile(`^limit \d+[a-z ]* per \S+(, used up by earlier transactions)?; retry in (\S+)$`)

// rlRetryAfter checks a refusal's fields against the rule and bucket and
// returns the wait its DETAIL announces.
func rlRetryAfter(t *testing.T, pe *pgconn.PgError, severity, rule, bucket string) time.Duration {
	t.Helper()
	if pe.Code != "53400" || pe.Severity != severity {
		t.Fatalf("refusal %s %s %q, want %s 53400", pe.Severity, pe.Code, pe.Message, severity)
	}
	if want := fmt.Sprintf("rate limit exceeded: rule %q, bucket %s", rule, bucket); pe.Message != want {
		t.Fatalf("refusal message %q, want %q", pe.Message, want)
	}
	m := rlRetryRE.FindStringSubmatch(pe.Detail)
	if m == nil {
		t.Fatalf("refusal DETAIL %q does not say when to retry", pe.Detail)
	}
	d, err := time.ParseDuration(m[2])
	if err != nil || d <= 0 {
		t.Fatalf("refusal DETAIL %q: retry %q is not a positive duration (%v)", pe.Detail, m[2], err)
	}
	if !strings.Contains(pe.Hint, "rate_limits") {
		t.Fatalf("refusal HINT %q does not name the setting", pe.Hint)
	}
	return d
}

// rlCheckWindow checks that allowed requests over elapsed fit a bucket of
// limit per second with a burst of limit: at most limit + limit·elapsed
// (plus a little slack), and at least the burst plus half the steady rate.
func rlCheckWindow(t *testing.T, what string, allowed int, limit float64, elapsed time.Duration) {
	t.Helper()
	sec := elapsed.Seconds()
	upper := limit + limit*sec + 10
	lower := limit + 0.5*limit*sec
	t.Logf("%s: %d allowed in %v (bounds [%.0f, %.0f])", what, allowed, elapsed.Round(time.Millisecond), lower, upper)
	if float64(allowed) > upper {
		t.Errorf("%s: %d requests allowed in %v, more than the limit allows (%.0f = burst %.0f + %.0f/s)", what, allowed, elapsed, upper, limit, limit)
	}
	if float64(allowed) < lower {
		t.Errorf("%s: only %d requests allowed in %v, want at least %.0f (burst %.0f + half the rate)", what, allowed, elapsed, lower, limit)
	}
}

// rlMetric scrapes p and returns one sample's value (0 if absent).
func rlMetric(t *testing.T, p *obInst, name string, kv ...string) float64 {
	t.Helper()
	_, m := obScrape(t, p)
	v, _ := m.get(name, kv...)
	return v
}

// ---------------------------------------------------------------------------
// In memory.

// 50 queries/s in reject mode: over 2 s of hammering from several clients
// (simple and extended protocol) about burst + 50/s pass, the rest get
// 53400 naming the rule and bucket with a DETAIL that says when to retry,
// and a refused session goes on: after waiting that long its next query
// works.
func TestRateLimitRejectQueries(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.RateLimits = []config.RateLimitRule{rlQueries("q50", 50, time.Second, "reject", 0)}
	})
	conns := append(rlConns(t, p, 2, rlSimple), rlConns(t, p, 2, txExecMode)...)

	res := rlHammer(conns, 2*time.Second)
	if len(res.other) > 0 {
		t.Fatalf("unexpected errors while hammering: %v", res.other)
	}
	rlCheckWindow(t, "q50 reject", res.total(), 50, res.elapsed)
	if res.limited < 50 || res.refusal == nil {
		t.Fatalf("only %d requests refused: the clients never outran the limit", res.limited)
	}
	if retry := rlRetryAfter(t, res.refusal, "ERROR", "q50", "queries"); retry > time.Second {
		t.Fatalf("retry %v for one query of a 50/s bucket, want at most 20ms (1s tolerated)", retry)
	}
	for i, a := range res.allowed {
		if a == 0 {
			t.Errorf("connection %d got nothing through", i)
		}
	}

	// Each refused session survives: drain the bucket, then wait as long as
	// the refusal says, and the next query passes.
	for i, c := range conns {
		var refusal *pgconn.PgError
		for range 500 {
			_, err := c.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
			if err == nil {
				continue
			}
			pe, ok := rlLimited(err)
			if !ok {
				t.Fatalf("connection %d: %v", i, err)
			}
			refusal = pe
			break
		}
		if refusal == nil {
			t.Fatalf("connection %d: 500 queries in a row passed a 50/s limit", i)
		}
		retry := rlRetryAfter(t, refusal, "ERROR", "q50", "queries")
		time.Sleep(2*retry + 10*time.Millisecond)
		var v int
		if err := c.QueryRow(ctxTimeout(t, 10*time.Second), "SELECT 7").Scan(&v); err != nil || v != 7 {
			t.Fatalf("connection %d after waiting %v as told: %v, %d", i, retry, err, v)
		}
	}
}

// The same rule in wait mode answers every query, later: N queries from
// several clients take at least (N - burst)/50 s, with no error.
func TestRateLimitWaitSpreadsQueries(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.RateLimits = []config.RateLimitRule{rlQueries("q50w", 50, time.Second, "wait", 10*time.Second)}
	})
	conns := append(rlConns(t, p, 2, rlSimple), rlConns(t, p, 2, txExecMode)...)
	const perConn = 40
	n := perConn * len(conns)

	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := range perConn {
				var v int
				if err := c.QueryRow(ctx, "SELECT $1::int", i).Scan(&v); err != nil || v != i {
					errs <- fmt.Errorf("query %d: %v (got %d)", i, err, v)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	least := time.Duration(float64(n-50) / 50 * 0.8 * float64(time.Second))
	t.Logf("%d queries at 50/s (burst 50) in wait mode took %v (at least %v)", n, elapsed.Round(time.Millisecond), least)
	if elapsed < least {
		t.Fatalf("%d queries took %v, want at least %v: wait mode did not spread them at 50/s", n, elapsed, least)
	}
	if elapsed > 15*time.Second {
		t.Fatalf("%d queries took %v, want about %v: waiting clients stall", n, elapsed, time.Duration(float64(n-50)/50*float64(time.Second)))
	}
}

// A client delayed by a wait-mode rule holds no server connection while it
// waits: with a pool of one connection, another client gets that
// connection promptly, again and again, during the whole wait, and the
// pool shows it idle. Waiting after checkout would block the other client
// for the rest of the wait (seconds) and show the connection active.
func TestRateLimitWaitHoldsNoServer(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		r := rlQueries("slow", 1, 3*time.Second, "wait", 10*time.Second)
		r.Match.ApplicationName = "rl-slow"
		c.RateLimits = []config.RateLimitRule{r}
	})
	slow := connectDSN(t, p.appDSN(rlSimple, "application_name=rl-slow"))
	free := connectDSN(t, p.appDSN(rlSimple, "application_name=rl-free"))
	obExec(t, slow, "SELECT 1") // takes the bucket's only unit
	obExec(t, free, "SELECT 1")

	start := time.Now()
	slowDone := obAsync(func() error {
		var v int
		if err := slow.QueryRow(ctxTimeout(t, 20*time.Second), "SELECT 2").Scan(&v); err != nil || v != 2 {
			return fmt.Errorf("throttled query: %v (got %d)", err, v)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond) // let it reach the limiter

	// The other client queries again and again while the throttled one
	// waits. A failure is reported only after the throttled query is
	// done, so that no connection is closed under it.
	var worst time.Duration
	var failure string
	runs := 0
	var slowErr error
	for slowErr == nil {
		select {
		case slowErr = <-slowDone:
			if slowErr == nil {
				slowErr = rlDone
			}
			continue
		default:
		}
		if failure != "" {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		t0 := time.Now()
		if _, err := free.Exec(ctxTimeout(t, 20*time.Second), "SELECT 1"); err != nil {
			failure = fmt.Sprintf("the other client's query: %v", err)
			continue
		}
		lat := time.Since(t0)
		worst = max(worst, lat)
		if lat > time.Second {
			failure = fmt.Sprintf("the other client waited %v for the pool's only connection: the throttled client holds it while waiting", lat)
			continue
		}
		runs++
		// Released at once in transaction mode; the throttled client must
		// not have taken it.
		idle := false
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if ps := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); ps.Active == 0 && ps.Waiting == 0 {
				idle = true
				break
			}
		}
		if !idle {
			ps := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
			failure = fmt.Sprintf("the pool's connection stays in use (active %d, waiting %d) while the throttled client waits", ps.Active, ps.Waiting)
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
	waited := time.Since(start)
	if !errors.Is(slowErr, rlDone) {
		t.Fatal(slowErr)
	}
	if failure != "" {
		t.Fatal(failure)
	}
	t.Logf("throttled query answered after %v; %d queries of the other client meanwhile, slowest %v", waited.Round(time.Millisecond), runs, worst)
	if waited < 2*time.Second {
		t.Fatalf("throttled query answered after %v, want about 3s: the wait rule did not delay it", waited)
	}
	if runs < 5 {
		t.Fatalf("only %d queries of the other client ran during the wait", runs)
	}
}

// rlDone marks a background query that ended well.
var rlDone = errors.New("done")

// The transactions bucket counts transactions, not the statements in them
// (a statement outside a transaction is one); at its limit BEGIN is refused
// with 53400 naming the bucket.
func TestRateLimitTransactions(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.RateLimits = []config.RateLimitRule{{Name: "tx3", Transactions: &config.RateBucket{Limit: 3, Per: time.Minute}, Mode: "reject"}}
	})
	c := connectDSN(t, p.appDSN(rlSimple))
	for i := range 2 {
		for _, sql := range []string{"BEGIN", "SELECT 1", "SELECT 2", "SELECT 3", "COMMIT"} {
			if _, err := c.Exec(ctxTimeout(t, 10*time.Second), sql); err != nil {
				t.Fatalf("transaction %d, %s: %v", i+1, sql, err)
			}
		}
	}
	obExec(t, c, "SELECT 4") // the third transaction, implicit
	_, err := c.Exec(ctxTimeout(t, 10*time.Second), "BEGIN")
	pe, ok := rlLimited(err)
	if !ok {
		t.Fatalf("fourth transaction: %v, want 53400", err)
	}
	rlRetryAfter(t, pe, "ERROR", "tx3", "transactions")
	// The refusal left the session usable and outside a transaction.
	if st := c.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("transaction status %c after the refused BEGIN, want I", st)
	}
	_, err = c.Exec(ctxTimeout(t, 10*time.Second), "SELECT 5")
	if _, ok := rlLimited(err); !ok {
		t.Fatalf("a statement outside a transaction after the limit: %v, want 53400", err)
	}
}

// The connections bucket refuses a login over the limit with a FATAL 53400
// before any authentication: the refusal is the first answer to the
// startup message, and a wrong password gets it too.
func TestRateLimitConnections(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.RateLimits = []config.RateLimitRule{{Name: "login2", Connections: &config.RateBucket{Limit: 2, Per: time.Minute}, Mode: "reject"}}
	})
	c1 := p.connect(t)
	c2 := p.connect(t)

	nc, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": pgtest.RoleApp, "database": pgtest.DBApp}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := fe.Receive()
	if err != nil {
		t.Fatalf("third login: %v", err)
	}
	er, ok := m.(*pgproto3.ErrorResponse)
	if !ok {
		t.Fatalf("third login: first answer %s, want the 53400 refusal before any authentication request", describeMsg(m))
	}
	rlRetryAfter(t, &pgconn.PgError{Severity: er.Severity, Code: er.Code, Message: er.Message, Detail: er.Detail, Hint: er.Hint},
		"FATAL", "login2", "connections")
	if m, err := fe.Receive(); err == nil {
		t.Fatalf("after the refusal: %s, want the connection closed", describeMsg(m))
	}

	pe := obLoginErr(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp))
	if pe.Code != "53400" {
		t.Fatalf("login with a wrong password over the limit: %s %s, want 53400 before authentication", pe.Code, pe.Message)
	}
	// The sessions already in are not affected.
	obExec(t, c1, "SELECT 1")
	obExec(t, c2, "SELECT 1")
}

// Decisions by rule, bucket and outcome and the backpressure wait
// histogram are on /metrics with their labels, and grow with traffic.
func TestRateLimitMetrics(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		w := rlQueries("m-wait", 5, time.Second, "wait", 10*time.Second)
		w.Match.ApplicationName = "m-wait"
		r := rlQueries("m-reject", 3, time.Minute, "reject", 0)
		r.Match.ApplicationName = "m-reject"
		c.RateLimits = []config.RateLimitRule{w, r}
	}})
	wc := connectDSN(t, p.appDSN(rlSimple, "application_name=m-wait"))
	rc := connectDSN(t, p.appDSN(rlSimple, "application_name=m-reject"))
	// A client no rule matches opens the server connection, so that the
	// first counted queries are quick and the wait rule must delay some.
	obExec(t, connectDSN(t, p.appDSN(rlSimple, "application_name=m-none")), "SELECT 1")

	const dec = "poolerd_ratelimit_decisions_total"
	for range 10 {
		obExec(t, wc, "SELECT 1")
	}
	refused := 0
	for range 5 {
		if _, err := rc.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
			if _, ok := rlLimited(err); !ok {
				t.Fatal(err)
			}
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("%d of 5 queries refused by a 3/min rule, want 2", refused)
	}

	text, m := obScrape(t, p)
	if typ := m.types[dec]; typ != "counter" {
		t.Fatalf("%s has type %q, want counter\n%s", dec, typ, text)
	}
	if typ := m.types["poolerd_ratelimit_wait_seconds"]; typ != "histogram" {
		t.Fatalf("poolerd_ratelimit_wait_seconds has type %q, want histogram", typ)
	}
	get := func(kv ...string) float64 {
		v, _ := m.get(dec, kv...)
		return v
	}
	allowed := get("rule=m-wait", "bucket=all", "outcome=allowed")
	waited := get("rule=m-wait", "bucket=all", "outcome=waited")
	if allowed+waited != 10 || allowed < 5 || waited < 1 {
		t.Fatalf("m-wait: allowed %v, waited %v; want 10 in all, the burst of 5 allowed and some of the rest waited (5/s)", allowed, waited)
	}
	if v := get("rule=m-reject", "bucket=all", "outcome=allowed"); v != 3 {
		t.Fatalf("m-reject allowed = %v, want 3", v)
	}
	if v := get("rule=m-reject", "bucket=queries", "outcome=rejected"); v != 2 {
		t.Fatalf("m-reject rejected (bucket queries) = %v, want 2", v)
	}
	if got := m.labelValues(dec, "outcome"); strings.Join(got, ",") != "allowed,rejected,waited" {
		t.Fatalf("outcomes %v, want allowed, rejected, waited", got)
	}
	cnt, _ := m.get("poolerd_ratelimit_wait_seconds_count", "rule=m-wait")
	sum, _ := m.get("poolerd_ratelimit_wait_seconds_sum", "rule=m-wait")
	if cnt != waited || sum <= 0 || sum > 10*cnt {
		t.Fatalf("wait histogram of m-wait: count %v (want %v), sum %vs (want the waits, each under max_wait 10s)", cnt, waited, sum)
	}
	if inf, _ := m.get("poolerd_ratelimit_wait_seconds_bucket", "rule=m-wait", "le=+Inf"); inf != cnt {
		t.Fatalf("wait histogram +Inf bucket %v, count %v", inf, cnt)
	}

	// More traffic, higher counts.
	if _, err := rc.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err == nil {
		t.Fatal("a fourth query within the minute passed a 3/min rule")
	}
	for range 3 {
		obExec(t, wc, "SELECT 1")
	}
	_, m2 := obScrape(t, p)
	if v, _ := m2.get(dec, "rule=m-reject", "bucket=queries", "outcome=rejected"); v != 3 {
		t.Fatalf("m-reject rejected after one more refusal = %v, want 3", v)
	}
	a2, _ := m2.get(dec, "rule=m-wait", "bucket=all", "outcome=allowed")
	w2, _ := m2.get(dec, "rule=m-wait", "bucket=all", "outcome=waited")
	c2, _ := m2.get("poolerd_ratelimit_wait_seconds_count", "rule=m-wait")
	if a2+w2 != 13 || w2 < waited || c2 != w2 {
		t.Fatalf("after 3 more m-wait queries: allowed %v, waited %v, histogram count %v; want 13 in all", a2, w2, c2)
	}
}

// ---------------------------------------------------------------------------
// With Redis.

// Two poolerd instances sharing one Redis stay within one fleet-wide
// limit: hammered together, both get queries through and the total fits
// one 50/s budget, far below two.
func TestRateLimitRedisFleetWide(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTB(t)
	mutate := func(c *config.Config) {
		// deny: a slow Redis must not let extra queries through and
		// inflate the count; such refusals would show as unexpected
		// errors.
		rlRedis(c, rs, "deny", 2*time.Second)
		c.RateLimits = []config.RateLimitRule{rlQueries("fleet", 50, time.Second, "reject", 0)}
	}
	a := startPoolerd(t, mutate)
	b := startPoolerd(t, mutate)
	conns := append(rlConns(t, a, 2, rlSimple), rlConns(t, b, 2, rlSimple)...)

	res := rlHammer(conns, 2*time.Second)
	if len(res.other) > 0 {
		t.Fatalf("unexpected errors while hammering: %v", res.other)
	}
	fromA, fromB := res.allowed[0]+res.allowed[1], res.allowed[2]+res.allowed[3]
	t.Logf("instance A allowed %d, instance B %d, %d refused", fromA, fromB, res.limited)
	rlCheckWindow(t, "fleet total", fromA+fromB, 50, res.elapsed)
	if fromA < 10 || fromB < 10 {
		t.Fatalf("instance A allowed %d, B %d: both should share the budget", fromA, fromB)
	}
	if res.refusal == nil {
		t.Fatal("nothing refused")
	}
	rlRetryAfter(t, res.refusal, "ERROR", "fleet", "queries")

	// The state is in Redis, under the default prefix (a drained bucket's
	// key lives about a second).
	rc := rs.Client()
	defer rc.Close()
	keys, err := rc.Keys(ctxTimeout(t, 5*time.Second), "poolerd:rl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no rate-limit state in Redis")
	}
}

// rlRedisDown starts Redis and poolerd (with metrics) using it with
// on_redis_error onError, checks that decisions go through Redis, and
// stops Redis.
func rlRedisDown(t *testing.T, onError string) (*obInst, *pgx.Conn) {
	t.Helper()
	rs := redistest.StartTB(t)
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		rlRedis(c, rs, onError, 500*time.Millisecond)
		c.RateLimits = []config.RateLimitRule{rlQueries("rd", 1000, time.Second, "reject", 0)}
	}})
	c := connectDSN(t, p.appDSN(rlSimple))
	for range 3 {
		obExec(t, c, "SELECT 1")
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_decisions_total", "rule=rd", "bucket=all", "outcome=allowed"); v != 3 {
		t.Fatalf("allowed decisions %v, want 3", v)
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_redis_seconds_count"); v < 3 {
		t.Fatalf("Redis latency observations %v, want at least 3", v)
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_redis_errors_total"); v != 0 {
		t.Fatalf("Redis errors %v while Redis is up", v)
	}
	if err := rs.Stop(); err != nil {
		t.Fatal(err)
	}
	return p, c
}

// on_redis_error allow: with Redis gone, queries pass, promptly, and the
// Redis error counter and the error_allowed decisions grow.
func TestRateLimitRedisDownAllow(t *testing.T) {
	t.Parallel()
	p, c := rlRedisDown(t, "allow")
	for i := range 5 {
		t0 := time.Now()
		obExec(t, c, "SELECT 1")
		if d := time.Since(t0); d > 3*time.Second {
			t.Fatalf("query %d took %v with Redis gone", i, d)
		}
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_redis_errors_total"); v < 5 {
		t.Fatalf("Redis errors %v after 5 queries with Redis gone, want at least 5", v)
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_decisions_total", "rule=rd", "bucket=all", "outcome=error_allowed"); v < 5 {
		t.Fatalf("error_allowed decisions %v, want at least 5", v)
	}
	if !strings.Contains(p.logs.String(), "on_redis_error allow") {
		t.Fatal("no warning logged for the Redis failure")
	}
}

// on_redis_error deny: with Redis gone, queries are refused with 53400
// that says why, promptly, and the session survives each refusal.
func TestRateLimitRedisDownDeny(t *testing.T) {
	t.Parallel()
	p, c := rlRedisDown(t, "deny")
	for i := range 3 {
		t0 := time.Now()
		_, err := c.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
		if d := time.Since(t0); d > 3*time.Second {
			t.Fatalf("query %d took %v with Redis gone", i, d)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53400" || pe.Severity != "ERROR" {
			t.Fatalf("query %d with Redis gone and on_redis_error deny: %v, want ERROR 53400", i, err)
		}
		if !strings.Contains(pe.Message, `rule "rd"`) || !strings.Contains(pe.Detail, "on_redis_error") || pe.Hint == "" {
			t.Fatalf("refusal %q / %q / %q does not explain itself", pe.Message, pe.Detail, pe.Hint)
		}
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_redis_errors_total"); v < 3 {
		t.Fatalf("Redis errors %v, want at least 3", v)
	}
	if v := rlMetric(t, p, "poolerd_ratelimit_decisions_total", "rule=rd", "bucket=all", "outcome=error_denied"); v < 3 {
		t.Fatalf("error_denied decisions %v, want at least 3", v)
	}
}

// A Redis that stops answering (DEBUG SLEEP) does not stall the proxy:
// within redis_timeout, a query passes under on_redis_error allow and is
// refused under deny, long before Redis answers again; afterwards the
// limits work again.
func TestRateLimitRedisStallBounded(t *testing.T) {
	t.Parallel()
	rs := redistest.StartTB(t)
	start := func(onError string) *instance {
		return startPoolerd(t, func(c *config.Config) {
			rlRedis(c, rs, onError, 100*time.Millisecond)
			c.RateLimits = []config.RateLimitRule{rlQueries("stall", 1000, time.Second, "reject", 0)}
		})
	}
	allow, deny := start("allow"), start("deny")
	ca := connectDSN(t, allow.appDSN(rlSimple))
	cd := connectDSN(t, deny.appDSN(rlSimple))
	obExec(t, ca, "SELECT 1")
	obExec(t, cd, "SELECT 1")

	const stall = 4 * time.Second
	sleepStart := time.Now()
	slept := obAsync(func() error {
		_, err := rs.Do(ctxTimeout(t, 20*time.Second), "DEBUG", "SLEEP", int(stall/time.Second))
		return err
	})
	defer func() {
		if err := obDone(t, slept, 20*time.Second, "DEBUG SLEEP"); err != nil {
			t.Errorf("DEBUG SLEEP: %v", err)
		}
	}()
	probe := rs.Client()
	defer probe.Close()
	eventually(t, 3*time.Second, "Redis stalled by DEBUG SLEEP", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	})

	t0 := time.Now()
	obExec(t, ca, "SELECT 1")
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Fatalf("allow: query took %v while Redis stalls (redis_timeout 100ms)", d)
	}
	t0 = time.Now()
	_, err := cd.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Fatalf("deny: query took %v while Redis stalls (redis_timeout 100ms)", d)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "53400" || !strings.Contains(pe.Detail, "on_redis_error") {
		t.Fatalf("deny: query while Redis stalls: %v, want 53400 (on_redis_error deny)", err)
	}
	select {
	case <-slept:
		t.Fatalf("Redis answered again after %v, before the checks ended: they prove nothing", time.Since(sleepStart))
	default:
	}

	// Redis is back: the deny instance lets queries through again.
	eventually(t, stall+10*time.Second, "queries pass once Redis answers again", func() bool {
		_, err := cd.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
		return err == nil
	})
}
