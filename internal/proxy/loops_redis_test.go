//go:build linux

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/redistest"
)

// redisRateRelay is rateRelay with the Redis backend of rs.
func redisRateRelay(t *testing.T, fb *fakeBackend, rs *redistest.Server, timeout time.Duration, rule config.RateLimitRule, n int) (*relay, []*benchClient) {
	t.Helper()
	rl := startRelay(t, fb, 4, func(c *config.Config) {
		c.EventLoops = "1"
		c.RateLimits = []config.RateLimitRule{rule}
		c.RateLimitBackend = "redis"
		c.RedisURL = fmt.Sprintf("redis://%s/0", rs.Addr())
		c.RedisTimeout = timeout
		c.OnRedisError = "allow"
	})
	clients := dialBenches(t, rl.addr, n, simpleRequest)
	for _, c := range clients {
		_ = c.conn.SetDeadline(time.Now().Add(20 * time.Second))
	}
	return rl, clients
}

// redisCounts returns how many script calls (EVALSHA, EVAL) and how many
// reads of a client socket rs has processed.
func redisCounts(t *testing.T, rs *redistest.Server) (calls, reads int) {
	t.Helper()
	v, err := rs.Do(context.Background(), "INFO", "all")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := v.(string)
	for _, line := range strings.Split(info, "\r\n") {
		switch {
		case strings.HasPrefix(line, "cmdstat_evalsha:calls="), strings.HasPrefix(line, "cmdstat_eval:calls="):
			k, _ := strconv.Atoi(strings.SplitN(strings.SplitN(line, "calls=", 2)[1], ",", 2)[0])
			calls += k
		case strings.HasPrefix(line, "total_reads_processed:"):
			reads, _ = strconv.Atoi(strings.TrimPrefix(line, "total_reads_processed:"))
		}
	}
	if reads == 0 {
		t.Fatalf("INFO all of Redis has no total_reads_processed: %q", info)
	}
	return calls, reads
}

// TestLoopRedisDecisionsOnLoop: a request under a Redis-backed rate limit
// waits on its loop for the decision (asked on a goroutine of its own,
// whose answer wakes the read), so the sessions neither give their loop
// away nor leave it; before, every decision handed the loop to a new
// goroutine and the session went on on a goroutine of its own. Decisions
// queued together are made in one round trip. A wait-mode denial then
// sleeps on the loop as with the memory backend, spacing the requests as
// the limit says.
func TestLoopRedisDecisionsOnLoop(t *testing.T) {
	rs := redistest.StartTB(t)
	fb := startFakeBackend(t, 64)

	t.Run("room", func(t *testing.T) {
		rule := config.RateLimitRule{Name: "roomy", KeyBy: []string{"client"},
			Queries: &config.RateBucket{Limit: 1 << 40, Per: time.Minute}, Mode: "wait", MaxWait: time.Second}
		const n, rounds = 8, 40
		rl, clients := redisRateRelay(t, fb, rs, time.Second, rule, n)
		e := rl.srv.engine
		parks, takeOvers, detaches := e.Stats().Parks, e.Stats().TakeOvers, e.Stats().Detaches
		calls0, reads0 := redisCounts(t, rs)
		if err := roundTripsAtOnce(clients, rounds); err != nil {
			t.Fatal(err)
		}
		calls, reads := redisCounts(t, rs)
		calls, reads = calls-calls0, reads-reads0
		p, tk, d, on := e.Stats().Parks-parks, e.Stats().TakeOvers-takeOvers, e.Stats().Detaches-detaches, e.ClientCount()
		t.Logf("%d requests decided by Redis: %d waits on the loop, %d hand-overs of it, %d sessions left it, %d of %d on it; %d script calls in %d reads of Redis", n*rounds, p, tk, d, on, n, calls, reads)
		// Decisions queued together share a round trip (a pipeline, one
		// read of Redis): asked one by one, each call is a read of its
		// own, and Redis counts its INFO reads too.
		if calls < n*rounds || float64(calls) < 1.05*float64(reads) {
			t.Fatalf("%d decisions made in %d script calls and %d reads of Redis: not batched", n*rounds, calls, reads)
		}
		// The monitor hands over a loop whose handler runs a whole tick
		// (a slow machine, -race): that may take one or two off, not all.
		if p < uint64(n*rounds/2) || on < n/2 || tk*10 > n*rounds {
			t.Fatalf("Redis decisions left the loop: %d waits on it, %d hand-overs, %d of %d sessions on it", p, tk, on, n)
		}
	})

	t.Run("spaced", func(t *testing.T) {
		const per = 40 * time.Millisecond
		rule := config.RateLimitRule{Name: "spaced",
			Queries: &config.RateBucket{Limit: 1, Per: per}, Mode: "wait", MaxWait: 10 * time.Second}
		const n, rounds = 3, 4
		rl, clients := redisRateRelay(t, fb, rs, time.Second, rule, n)
		e := rl.srv.engine
		takeOvers, detaches := e.Stats().TakeOvers, e.Stats().Detaches
		start := time.Now()
		if err := roundTripsAtOnce(clients, rounds); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		tk, d := e.Stats().TakeOvers-takeOvers, e.Stats().Detaches-detaches
		t.Logf("%d requests, one per %v, decided by Redis: %v, %d hand-overs, %d left the loop", n*rounds, per, took, tk, d)
		if min := time.Duration(n*rounds-2) * per; took < min {
			t.Fatalf("%d requests took %v, want at least %v: the limit did not space them", n*rounds, took, min)
		}
		if d > 1 || tk > 2 || e.ClientCount() < n-int(d) {
			t.Fatalf("rate-limit waits left the loop: %d hand-overs, %d sessions left, %d of %d on it", tk, d, e.ClientCount(), n)
		}
	})

	t.Run("killed while Redis decides", func(t *testing.T) {
		// Redis stalls for 3 s, within redis_timeout: a KILL_CLIENT of
		// the session whose request waits for the decision ends it at
		// once, and the other client of the loop, whose request waits
		// too, is served when Redis answers.
		rule := config.RateLimitRule{Name: "stalled",
			Queries: &config.RateBucket{Limit: 1 << 40, Per: time.Minute}, Mode: "reject"}
		rl, clients := redisRateRelay(t, fb, rs, 10*time.Second, rule, 2)
		if err := clients[0].roundTrip(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = rs.Do(context.Background(), "DEBUG", "SLEEP", 3)
		}()
		defer wg.Wait()
		time.Sleep(200 * time.Millisecond) // the DEBUG SLEEP has begun
		e := rl.srv.engine
		parks := e.Stats().Parks
		for _, c := range clients {
			if _, err := c.conn.Write(c.request); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 2*time.Second, "both requests to wait on the loop for Redis", func() bool { return e.Stats().Parks >= parks+2 })
		infos := rl.srv.Clients()
		if len(infos) != 2 {
			t.Fatalf("%d clients, want 2", len(infos))
		}
		victim := infos[0].ID
		for _, ci := range infos[1:] {
			victim = min(victim, ci.ID) // the first logged in: clients[0]
		}
		killed := time.Now()
		if !rl.srv.KillClient(victim) {
			t.Fatal("KILL_CLIENT found no such client")
		}
		_ = clients[0].conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var got []byte
		buf := make([]byte, 512)
		for !bytes.Contains(got, []byte("FATAL")) {
			k, err := clients[0].conn.Read(buf)
			got = append(got, buf[:k]...)
			if err != nil {
				break
			}
		}
		if !bytes.Contains(got, []byte("FATAL")) {
			t.Fatalf("killed while Redis decides: got %q, want a FATAL", got)
		}
		if d := time.Since(killed); d > 1500*time.Millisecond {
			t.Fatalf("the killed session ended %v after the KILL, while Redis stalled 3s: it waited for the decision", d)
		}
		if err := clients[1].readUntilReady(); err != nil {
			t.Fatalf("the other client, once Redis answers: %v", err)
		}
		if got := rl.srv.ClientCount(); got != 1 {
			t.Fatalf("%d clients after the kill, want 1", got)
		}
	})
	if err := fb.Err(); err != nil {
		t.Fatal(err)
	}
}
