package integration

// The fleet-wide server connection budget (fleet_max_server_connections):
// three poolerd processes sharing one redis-server and one PostgreSQL never
// have more server connections together than the budget, sampled from
// pg_stat_activity every 100 ms under load, and the leases of one killed
// with SIGKILL come back within fleet_lease_ttl for the others to use.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
	"github.com/poolerd/poolerd/test/redistest"
)

// fleetProc is one poolerd process of the fleet test.
type fleetProc struct {
	proc       *lcProc
	addr, http string
	killed     atomic.Bool
}

// leasesHeld reads poolerd_fleet_leases_held{budget="global"} from the
// process's /metrics; -1 if it cannot.
func (p *fleetProc) leasesHeld() int {
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `poolerd_fleet_leases_held{budget="global"} `); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return int(n)
		}
	}
	return -1
}

// TestFleetBudget: three poolerd processes with max_size 8 each share a
// fleet budget of 5 server connections; 8 clients per process keep them
// busy. Sampled every 100 ms, PostgreSQL never shows more than 5 of their
// backends; a client that waits checkout_timeout gets 53300 naming
// fleet_max_server_connections and nothing else fails. Then the process
// holding the most leases is killed (SIGKILL: no release, no more
// renewals): its leases expire within fleet_lease_ttl and the two others
// take the whole budget.
func TestFleetBudget(t *testing.T) {
	const (
		budget   = 5
		ttl      = 3 * time.Second
		procs    = 3
		clients  = 8
		maxSize  = 8
		loadTime = 4 * time.Second
	)
	rs := redistest.StartTB(t)
	bin := lcBuildBinary(t)
	host, port, _ := strings.Cut(pg.Addr(), ":")
	var fleet []*fleetProc
	for i := range procs {
		p := &fleetProc{addr: docsFreeAddr(t), http: docsFreeAddr(t)}
		conf := fmt.Sprintf(`listen: %s
http_listen: %s
upstream: %s
pool_mode: transaction
max_size: %d
min_size: 0
checkout_timeout: 2s
redis_url: redis://%s/0
fleet_max_server_connections: %d
fleet_lease_ttl: %s
on_redis_error: deny
log_level: info
databases:
  - name: %s
    host: %s
    port: %s
`, p.addr, p.http, pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBOther), maxSize, rs.Addr(), budget, ttl, pgtest.DBOther, host, port)
		file := filepath.Join(t.TempDir(), fmt.Sprintf("poolerd%d.yaml", i))
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		p.proc = lcStartBinary(t, bin, "--config", file)
		fleet = append(fleet, p)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, p := range fleet {
				dumpLog(t, fmt.Sprintf("poolerd %d log", i), p.proc.stderr.String())
			}
		}
	})
	dsn := func(p *fleetProc) string {
		return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&%s", pgtest.RoleApp, pgtest.Password, p.addr, pgtest.DBOther, txExecMode)
	}
	for _, p := range fleet {
		eventually(t, 20*time.Second, "poolerd "+p.addr+" accepts clients", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := pgx.Connect(ctx, dsn(p))
			if err != nil {
				return false
			}
			defer c.Close(ctx)
			return c.Ping(ctx) == nil
		})
	}

	// The sampler: the fleet's backends, every 100 ms.
	direct := connectDSN(t, directDSN(pgtest.DBApp))
	var mu sync.Mutex
	var samples []int
	peak := 0
	sample := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = $1 AND usename = $2 AND backend_type = 'client backend'`, pgtest.DBOther, pgtest.RoleApp).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampler:
				return
			case <-tick.C:
			}
			if n := sample(); n >= 0 {
				mu.Lock()
				samples = append(samples, n)
				peak = max(peak, n)
				mu.Unlock()
			}
		}
	}()
	latest := func() int {
		mu.Lock()
		defer mu.Unlock()
		if len(samples) == 0 {
			return -1
		}
		return samples[len(samples)-1]
	}

	// The load: each client runs short transactions until stopped.
	var stop atomic.Bool
	var ok, fleetErrs, unavailable atomic.Int64
	errs := make(chan error, procs*clients)
	var wg sync.WaitGroup
	for _, p := range fleet {
		for range clients {
			c := connectDSN(t, dsn(p))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() && !p.killed.Load() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := c.Exec(ctx, "SELECT pg_sleep(0.02)")
					cancel()
					var pe *pgconn.PgError
					switch {
					case err == nil:
						ok.Add(1)
					case p.killed.Load():
						return // its poolerd is gone
					case errors.As(err, &pe) && pe.Code == "53300" && strings.Contains(pe.Message, "fleet_max_server_connections") &&
						strings.Contains(pe.Hint, "fleet_max_server_connections"):
						fleetErrs.Add(1)
					case errors.As(err, &pe) && pe.Code == "53300" && strings.Contains(pe.Message, "fleet connection budget is unavailable"):
						// Redis slower than its timeout on a loaded machine,
						// and on_redis_error deny: refused, never over budget.
						unavailable.Add(1)
					default:
						errs <- fmt.Errorf("poolerd %s: %w", p.addr, err)
						return
					}
				}
			}()
		}
	}
	time.Sleep(loadTime)

	// Kill the process holding the most leases.
	victim, most := -1, 0
	for i, p := range fleet {
		n := p.leasesHeld()
		t.Logf("poolerd %d holds %d leases", i, n)
		if n > most {
			victim, most = i, n
		}
	}
	if victim < 0 {
		t.Fatal("no poolerd holds a fleet lease under load")
	}
	others := func() int {
		n := 0
		for i, p := range fleet {
			if i != victim {
				n += max(p.leasesHeld(), 0)
			}
		}
		return n
	}
	before := others()
	fleet[victim].killed.Store(true)
	killed := time.Now()
	if err := fleet[victim].proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-fleet[victim].proc.done
	t.Logf("killed poolerd %d holding %d of the %d leases; the others held %d", victim, most, budget, before)
	// Its leases stay in Redis until they expire: the others cannot take
	// them before, and take them all within the TTL (plus a renewal and
	// the others' retry).
	var back time.Duration
	for deadline := killed.Add(ttl + 3*time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if others() == budget {
			back = time.Since(killed)
			break
		}
	}
	if back == 0 {
		t.Errorf("the others held %d of %d leases %v after the kill (fleet_lease_ttl %v)", others(), budget, ttl+3*time.Second, ttl)
	} else {
		t.Logf("the killed poolerd's leases were used by the others %v after the kill (fleet_lease_ttl %v)", back.Round(time.Millisecond), ttl)
		if back < ttl/3 && most == budget {
			t.Errorf("the killed poolerd's %d leases were back after %v, before they could have expired", most, back)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); latest() != budget; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Errorf("PostgreSQL does not show the survivors using the whole budget of %d; latest samples %v", budget, samples[max(len(samples)-20, 0):])
			mu.Unlock()
			break
		}
	}
	// Redis holds only the survivors' leases (members are INSTANCE:N).
	rc := rs.Client()
	defer rc.Close()
	members, err := rc.ZRange(context.Background(), "poolerd:fleet:global", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string]bool{}
	for _, m := range members {
		id, _, _ := strings.Cut(m, ":")
		holders[id] = true
	}
	if len(holders) > procs-1 {
		t.Errorf("leases of %d poolerd instances in Redis after the kill: %v", len(holders), members)
	}
	time.Sleep(time.Second) // more samples with the survivors at the budget
	stop.Store(true)
	wg.Wait()
	close(stopSampler)
	<-samplerDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n, err := rc.ZCard(context.Background(), "poolerd:fleet:global").Result()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d samples, peak %d backends (budget %d); %d transactions, %d checkouts refused with the fleet limit, %d with Redis unavailable; %d leases in Redis at the end",
		len(samples), peak, budget, ok.Load(), fleetErrs.Load(), unavailable.Load(), n)
	if peak > budget {
		t.Errorf("PostgreSQL showed %d backends of the fleet at once, fleet_max_server_connections is %d", peak, budget)
	}
	if len(samples) < int(loadTime/(100*time.Millisecond))/2 {
		t.Errorf("only %d samples", len(samples))
	}
	if ok.Load() == 0 {
		t.Error("no transaction succeeded")
	}
	if n > budget {
		t.Errorf("Redis holds %d leases, budget %d", n, budget)
	}
}

// TestFleetBudgetRefusals: with the budget spent, a request that waits
// checkout_timeout gets 53300 naming fleet_max_server_connections; with
// Redis gone, on_redis_error deny refuses the same way, naming the budget
// store, and allow opens the connection without a lease.
func TestFleetBudgetRefusals(t *testing.T) {
	rs := redistest.StartTB(t)
	start := func(t *testing.T, rs *redistest.Server, budget int, onErr string) *instance {
		return startPoolerd(t, func(c *config.Config) {
			c.PoolMode = "transaction"
			c.MaxSize = 4
			c.CheckoutTimeout = 700 * time.Millisecond
			c.RedisURL = "redis://" + rs.Addr() + "/0"
			c.FleetMaxServerConnections = budget
			c.OnRedisError = onErr
		})
	}
	// hold takes the pool's only server connection in a transaction.
	hold := func(t *testing.T, p *instance) {
		a := p.connect(t, txExecMode)
		if _, err := a.Exec(ctxTimeout(t, 5*time.Second), "BEGIN; SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	second := func(t *testing.T, p *instance) error {
		b := p.connect(t, txExecMode)
		_, err := b.Exec(ctxTimeout(t, 5*time.Second), "SELECT 1")
		return err
	}

	t.Run("spent", func(t *testing.T) {
		p := start(t, rs, 1, "allow")
		hold(t, p)
		err := second(t, p)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "fleet_max_server_connections reached") ||
			!strings.Contains(pe.Detail, "the fleet is at its fleet_max_server_connections (1 of 1") || !strings.Contains(pe.Hint, "raise fleet_max_server_connections") {
			t.Fatalf("want 53300 naming the fleet budget, got %v (detail %q, hint %q)", err, detailOf(err), hintOf(err))
		}
		if fs := p.srv.FleetStats(); fs.Held["global"] != 1 || fs.Refused["global"] == 0 {
			t.Fatalf("fleet stats %+v", fs)
		}
	})
	// A poolerd that shut down gave its leases back.
	rc := rs.Client()
	defer rc.Close()
	if n, err := rc.ZCard(context.Background(), "poolerd:fleet:global").Result(); err != nil || n != 0 {
		t.Fatalf("%d leases left in Redis after a shutdown (err %v)", n, err)
	}
	t.Run("database_entry", func(t *testing.T) {
		// No global budget; the database entry's budget of 1 is spent
		// by the pool's first connection.
		p := startPoolerd(t, func(c *config.Config) {
			c.PoolMode = "transaction"
			c.MaxSize = 4
			c.CheckoutTimeout = 700 * time.Millisecond
			c.RedisURL = "redis://" + rs.Addr() + "/1"
			c.Databases = []config.Database{{Name: pgtest.DBApp, FleetMaxServerConnections: clInt(1)}}
		})
		hold(t, p)
		err := second(t, p)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Detail, `database "app" is at its fleet_max_server_connections (1 of 1`) {
			t.Fatalf("want 53300 naming the database's fleet budget, got %v (detail %q)", err, detailOf(err))
		}
		if fs := p.srv.FleetStats(); fs.Held["database"] != 1 || fs.Held["global"] != 0 || fs.Refused["database"] == 0 {
			t.Fatalf("fleet stats %+v", fs)
		}
	})
	t.Run("set_at_runtime", func(t *testing.T) {
		// No budget at start; SET turns one on, and lowering it below
		// what is open closes nothing but refuses the next lease.
		p := start(t, rs, 0, "allow")
		if err := second(t, p); err != nil {
			t.Fatal(err)
		}
		if fs := p.srv.FleetStats(); fs.Enabled {
			t.Fatalf("fleet enabled without a budget: %+v", fs)
		}
		if _, err := p.srv.Set("fleet_max_server_connections", "1"); err != nil {
			t.Fatal(err)
		}
		hold(t, p) // the connection open from before has no lease
		if err := second(t, p); err != nil {
			t.Fatalf("the first lease after SET: %v", err)
		}
		if fs := p.srv.FleetStats(); !fs.Enabled || fs.Held["global"] != 1 {
			t.Fatalf("fleet stats after SET %+v", fs)
		}
		hold(t, p)
		err := second(t, p)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "fleet_max_server_connections reached") {
			t.Fatalf("want the fleet budget's 53300 once spent, got %v", err)
		}
	})
	t.Run("redis_down_deny", func(t *testing.T) {
		rs2 := redistest.StartTB(t)
		p := start(t, rs2, 5, "deny")
		hold(t, p)
		if err := rs2.Stop(); err != nil {
			t.Fatal(err)
		}
		err := second(t, p)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "fleet connection budget is unavailable") ||
			!strings.Contains(pe.Detail, "on_redis_error is deny") {
			t.Fatalf("want 53300 naming the unavailable budget, got %v (detail %q)", err, detailOf(err))
		}
		if fs := p.srv.FleetStats(); fs.Errors["acquire"] == 0 || fs.RedisDenied == 0 {
			t.Fatalf("fleet stats %+v", fs)
		}
	})
	t.Run("redis_down_allow", func(t *testing.T) {
		rs2 := redistest.StartTB(t)
		p := start(t, rs2, 5, "allow")
		hold(t, p)
		if err := rs2.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := second(t, p); err != nil {
			t.Fatalf("on_redis_error allow: %v", err)
		}
		if fs := p.srv.FleetStats(); fs.Unleased == 0 {
			t.Fatalf("fleet stats %+v", fs)
		}
	})
}

func detailOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Detail
	}
	return ""
}

func hintOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Hint
	}
	return ""
}

// TestFleetBudgetMakeRoom: a poolerd whose idle connections hold the whole
// budget closes one when another poolerd is refused a lease, so the other's
// client is served long before checkout_timeout (instead of waiting for
// idle_timeout).
func TestFleetBudgetMakeRoom(t *testing.T) {
	rs := redistest.StartTB(t)
	start := func() *instance {
		return startPoolerd(t, func(c *config.Config) {
			c.PoolMode = "transaction"
			c.MaxSize = 4
			c.CheckoutTimeout = 10 * time.Second
			c.RedisURL = "redis://" + rs.Addr() + "/0"
			c.FleetMaxServerConnections = 2
		})
	}
	a := start()
	// Two transactions at once: a's pool opens its second connection,
	// then both are idle and hold the budget.
	c1, c2 := a.connect(t, txExecMode), a.connect(t, txExecMode)
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := c1.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgx.Conn{c1, c2} {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
	if fs := a.srv.FleetStats(); fs.Held["global"] != 2 {
		t.Fatalf("a holds %d leases, want 2", fs.Held["global"])
	}
	b := start()
	began := time.Now()
	cb := b.connect(t, txExecMode)
	if _, err := cb.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	t.Logf("b was served %v after it started, a's idle connection closed to make room", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("b waited %v for a lease", took)
	}
	if fs := a.srv.FleetStats(); fs.Held["global"] != 1 {
		t.Fatalf("a holds %d leases after making room, want 1", fs.Held["global"])
	}
	if n := a.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Evictions["make_room"]; n == 0 {
		t.Fatal("a counted no make_room eviction")
	}
}
