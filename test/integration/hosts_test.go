package integration

// Several servers per database entry (hosts, target_session_attrs): a
// primary and a streaming replica on loopback, reads and writes routed by
// role, and a failover: the primary stops, the replica is promoted, and
// writes through poolerd resume on it (internal/proxy/hosts.go).

import (
	"context"
	"encoding/json"
	"errors"
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
)

// startPair starts a primary and a streaming replica of it, both stopped
// when the test ends.
func startPair(t *testing.T) (primary, replica *pgtest.Server) {
	t.Helper()
	primary, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Cleanup() })
	replica, err = primary.StartReplica()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Cleanup() })
	return primary, replica
}

// serverOf says which server c's next statement runs on: its port, and
// whether it is in recovery.
func serverOf(t *testing.T, ctx context.Context, c *pgx.Conn) (port int, standby bool) {
	t.Helper()
	if err := c.QueryRow(ctx, "SELECT inet_server_port(), pg_is_in_recovery()").Scan(&port, &standby); err != nil {
		t.Fatalf("which server: %v", err)
	}
	return port, standby
}

func TestHostsRoutingAndFailover(t *testing.T) {
	primary, replica := startPair(t)
	ctx := ctxTimeout(t, 3*time.Minute)
	if err := primary.Exec(ctx, pgtest.DBApp, "CREATE TABLE failover_t (id bigserial PRIMARY KEY, v int); ALTER TABLE failover_t OWNER TO app"); err != nil {
		t.Fatal(err)
	}
	hosts := []string{primary.Addr(), replica.Addr()}
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = primary.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 4
		c.CheckoutTimeout = 20 * time.Second
		c.LogLevel = "info"
		c.Databases = []config.Database{
			{Name: "rw", DBName: pgtest.DBApp, Hosts: hosts, TargetSessionAttrs: config.TargetReadWrite},
			{Name: "ro", DBName: pgtest.DBApp, Hosts: hosts, TargetSessionAttrs: config.TargetPreferStandby},
			{Name: "standby", DBName: pgtest.DBApp, Hosts: hosts, TargetSessionAttrs: config.TargetStandby},
		}
	})
	rw := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "rw", "default_query_exec_mode=simple_protocol"))
	ro := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "ro", "default_query_exec_mode=simple_protocol"))
	if port, standby := serverOf(t, ctx, rw); port != primary.Port || standby {
		t.Fatalf("rw runs on port %d (standby %v), want the primary %d", port, standby, primary.Port)
	}
	if port, standby := serverOf(t, ctx, ro); port != replica.Port || !standby {
		t.Fatalf("ro runs on port %d (standby %v), want the replica %d", port, standby, replica.Port)
	}

	eventually(t, 10*time.Second, "the table to reach the replica", func() bool {
		var ok bool
		return ro.QueryRow(ctx, "SELECT to_regclass('failover_t') IS NOT NULL").Scan(&ok) == nil && ok
	})

	// Load: one writer through rw, one reader through ro, each retrying
	// after an error, until the test says stop.
	var stop atomic.Bool
	var mu sync.Mutex
	var lastWrite time.Time
	var readErrs, reads, writes, writeErrs int
	var firstReadErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			_, err := rw.Exec(ctx, "INSERT INTO failover_t (v) VALUES (1)")
			mu.Lock()
			if err == nil {
				writes++
				lastWrite = time.Now()
			} else {
				writeErrs++
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		for !stop.Load() {
			var n int64
			err := ro.QueryRow(ctx, "SELECT count(*) FROM failover_t").Scan(&n)
			mu.Lock()
			if err == nil {
				reads++
			} else {
				readErrs++
				if firstReadErr == nil {
					firstReadErr = err
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	promoted := time.Now()
	if err := replica.Promote(); err != nil {
		t.Fatal(err)
	}
	var resumed time.Duration
	eventually(t, 60*time.Second, "a write after the promotion", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if lastWrite.After(promoted) {
			resumed = lastWrite.Sub(promoted)
			return true
		}
		return false
	})
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	t.Logf("writes resumed %s after pg_ctl promote was started; %d writes, %d refused; %d reads, %d failed",
		resumed.Round(time.Millisecond), writes, writeErrs, reads, readErrs)
	mu.Unlock()
	if port, standby := serverOf(t, ctx, rw); port != replica.Port || standby {
		t.Errorf("after the failover rw runs on port %d (standby %v), want the promoted replica %d", port, standby, replica.Port)
	}
	for _, ps := range p.srv.Pools() {
		if ps.Database != "rw" {
			continue
		}
		roles := map[string]string{}
		for _, h := range ps.Hosts {
			roles[h.Host] = h.Role
		}
		if roles[replica.Addr()] != "primary" || len(ps.Hosts) != 2 {
			t.Errorf("rw's hosts after the failover: %+v, want the promoted replica %s a primary", ps.Hosts, replica.Addr())
		}
	}
	if writeErrs > 2 {
		// The writer's request in flight when the primary stopped gets an
		// ERROR (keep.go); the next ones wait for the promoted replica.
		t.Errorf("%d writes refused during the failover: requests should wait (checkout_timeout) for a new primary", writeErrs)
	}
	if readErrs > 0 {
		t.Errorf("%d reads through prefer-standby failed while the replica served throughout; the first: %v", readErrs, firstReadErr)
	}
	// No standby is left: a standby-only entry refuses at checkout_timeout
	// (long enough for its connects to fail first, on a loaded machine),
	// naming why.
	if _, err := p.srv.Set("checkout_timeout", "3s"); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, p.dsn(pgtest.RoleApp, pgtest.Password, "standby", "default_query_exec_mode=simple_protocol"))
	if err == nil {
		_, err = c.Exec(ctx, "SELECT 1")
		_ = c.Close(ctx)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message+pe.Detail, "target_session_attrs standby") {
		t.Errorf("a standby-only entry with no standby left: got %v, want a refusal naming target_session_attrs", err)
	} else {
		t.Logf("standby-only entry: %s: %s (%s)", pe.Code, pe.Message, pe.Detail)
	}
}

// Each entry spreads its connections over its servers (round-robin), and
// a server that refuses connections is skipped.
func TestHostsBalanceAndSkip(t *testing.T) {
	primary, replica := startPair(t)
	ctx := ctxTimeout(t, 60*time.Second)
	dead, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = primary.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 4
		c.Databases = []config.Database{
			{Name: "any", DBName: pgtest.DBApp, Hosts: []string{primary.Addr(), replica.Addr(), "127.0.0.1:" + strconv.Itoa(dead)},
				LoadBalanceHosts: config.BalanceRoundRobin},
		}
	})
	// Four clients each holding a transaction: four connections, spread.
	ports := map[int]int{}
	var conns []*pgx.Conn
	for range 4 {
		c := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "any", "default_query_exec_mode=simple_protocol"))
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		port, _ := serverOf(t, ctx, c)
		ports[port]++
		conns = append(conns, c)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
	if ports[primary.Port] == 0 || ports[replica.Port] == 0 || ports[dead] != 0 {
		t.Fatalf("connections per port %v: want both live servers used and the dead one skipped", ports)
	}
	// The dead server's failure is logged, with the host, as PgBouncer logs
	// each server it could not reach.
	if want := "server of the entry failed; trying its next"; !strings.Contains(p.logs.String(), want) || !strings.Contains(p.logs.String(), strconv.Itoa(dead)) {
		t.Errorf("no %q line naming port %d", want, dead)
	}
}

// max_replica_lag: a standby whose replay is paused behind the primary is
// skipped by new connections (prefer-standby takes the primary), and used
// again once it has caught up.
func TestHostsReplicaLag(t *testing.T) {
	primary, replica := startPair(t)
	ctx := ctxTimeout(t, 60*time.Second)
	if err := primary.Exec(ctx, pgtest.DBApp, "CREATE TABLE lag_t (v int); ALTER TABLE lag_t OWNER TO app"); err != nil {
		t.Fatal(err)
	}
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = primary.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 12 // every inBlock holds one
		c.MinSize = 0  // no idle connection opened before the lag
		c.Databases = []config.Database{{Name: "ro", DBName: pgtest.DBApp, Hosts: []string{primary.Addr(), replica.Addr()},
			TargetSessionAttrs: config.TargetPreferStandby, MaxReplicaLag: 500 * time.Millisecond}}
	})
	// inBlock opens a client holding a transaction (so that the next
	// one needs a new server connection) and says where it runs.
	inBlock := func() int {
		c := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "ro", "default_query_exec_mode=simple_protocol"))
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		port, _ := serverOf(t, ctx, c)
		return port
	}
	// The replica has replayed the table (on a loaded machine it may
	// lag behind the CREATE TABLE for more than max_replica_lag).
	eventually(t, 20*time.Second, "the replica to replay lag_t", func() bool {
		return replica.Exec(ctx, pgtest.DBApp, "SELECT 1 FROM lag_t") == nil
	})
	if port := inBlock(); port != replica.Port {
		t.Fatalf("caught up: on port %d, want the replica %d", port, replica.Port)
	}
	if err := replica.Exec(ctx, pgtest.DBApp, "SELECT pg_wal_replay_pause()"); err != nil {
		t.Fatal(err)
	}
	if err := primary.Exec(ctx, pgtest.DBApp, "INSERT INTO lag_t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	// The pause is a request: wait until the replica is paused with WAL
	// received and not replayed, and then a second more.
	rc := connectDSN(t, replica.SuperDSN(pgtest.DBApp))
	eventually(t, 15*time.Second, "the replica paused behind the primary", func() bool {
		var behind bool
		err := rc.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state() = 'paused'
			AND pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()`).Scan(&behind)
		return err == nil && behind
	})
	time.Sleep(time.Second)
	if port := inBlock(); port != primary.Port {
		t.Fatalf("replay paused 1 s behind, max_replica_lag 500ms: on port %d, want the primary %d", port, primary.Port)
	}
	if err := replica.Exec(ctx, pgtest.DBApp, "SELECT pg_wal_replay_resume()"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "new connections on the caught-up replica", func() bool { return inBlock() == replica.Port })
}

// max_size_per_host: each server takes at most that many of the pool's
// connections; a request beyond them all waits as for a full pool and
// gets one when a connection closes.
func TestHostsMaxSizePerHost(t *testing.T) {
	primary, replica := startPair(t)
	ctx := ctxTimeout(t, 60*time.Second)
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = primary.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 10
		c.CheckoutTimeout = 20 * time.Second
		c.Databases = []config.Database{{Name: "any", DBName: pgtest.DBApp, Hosts: []string{primary.Addr(), replica.Addr()},
			MaxSizePerHost: 2}}
	})
	ports := map[int]int{}
	var held []*pgx.Conn
	for range 4 {
		c := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "any", "default_query_exec_mode=simple_protocol"))
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		port, _ := serverOf(t, ctx, c)
		ports[port]++
		held = append(held, c)
	}
	if ports[primary.Port] != 2 || ports[replica.Port] != 2 {
		t.Fatalf("connections per server %v, want 2 each", ports)
	}
	// A fifth waits until one of the four is closed.
	fifth := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "any", "default_query_exec_mode=simple_protocol"))
	done := make(chan error, 1)
	go func() {
		_, err := fifth.Exec(ctx, "SELECT 1")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a fifth request ran with every server at max_size_per_host: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	_ = held[0].Close(ctx) // its server connection is closed (left in a transaction)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the fifth request after a connection closed: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the fifth request still waits after a connection closed")
	}
}

// Per-server figures and settings: a replica with host_settings of its own
// (max_size_per_host 1, idle_timeout 1 s) beside a primary with the
// entry's cap (3). Each server's checkouts (hit or miss), idle and active
// connections and the connections the pool closed show in SHOW HOSTS,
// /stats and the metrics; the replica's idle connection is closed after
// its own idle_timeout while the primary's stay.
func TestHostsFiguresAndSettings(t *testing.T) {
	primary, replica := startPair(t)
	ctx := ctxTimeout(t, 60*time.Second)
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		c.Upstream = primary.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 10
		c.MinSize = 0
		c.IdleTimeout = time.Hour
		c.CheckoutTimeout = 20 * time.Second
		c.Databases = []config.Database{{Name: "any", DBName: pgtest.DBApp, Hosts: []string{primary.Addr(), replica.Addr()},
			MaxSizePerHost: 3, HostSettings: []config.HostSetting{{Host: replica.Addr(), IdleTimeout: time.Second, MaxSizePerHost: 1}}}}
	}})
	dsn := p.dsn(pgtest.RoleApp, pgtest.Password, "any", "default_query_exec_mode=simple_protocol")
	ports := map[int]int{}
	var held []*pgx.Conn
	for range 4 {
		c := connectDSN(t, dsn)
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		port, _ := serverOf(t, ctx, c)
		ports[port]++
		held = append(held, c)
	}
	if ports[primary.Port] != 3 || ports[replica.Port] != 1 {
		t.Fatalf("connections per server %v, want 3 on the primary (max_size_per_host) and 1 on the replica (its own)", ports)
	}
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	hosts := obShow(t, adm, "SHOW HOSTS")
	pr := hosts.must(t, "the primary", "database", "any", "host", primary.Addr())
	rr := hosts.must(t, "the replica", "database", "any", "host", replica.Addr())
	for _, c := range []struct {
		row                                             int
		conns, active, misses, maxSize, idleTimeoutSecs string
	}{{pr, "3", "3", "3", "3", "0"}, {rr, "1", "1", "1", "1", "1"}} {
		// Each connection was opened for a checkout (a miss); the pool's
		// warm connection served a login's check before (a hit).
		for col, want := range map[string]string{"connections": c.conns, "active": c.active, "idle": "0", "misses": c.misses,
			"max_size": c.maxSize, "idle_timeout_seconds": c.idleTimeoutSecs} {
			if got := hosts.val(c.row, col); got != want {
				t.Errorf("SHOW HOSTS %s %s = %q, want %q\n%s", hosts.val(c.row, "host"), col, got, want, hosts)
			}
		}
	}
	for _, c := range held {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		if _, err := held[0].Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	// The replica's connection has been idle for its idle_timeout (the
	// pool recycles once a second); the primary's stay.
	eventually(t, 10*time.Second, "the replica's idle connection to be closed", func() bool {
		tb := obShow(t, adm, "SHOW HOSTS")
		return tb.val(tb.must(t, "the replica", "host", replica.Addr()), "connections") == "0"
	})
	hosts = obShow(t, adm, "SHOW HOSTS")
	pr = hosts.must(t, "the primary", "database", "any", "host", primary.Addr())
	if hosts.val(pr, "connections") != "3" || hosts.val(pr, "idle") != "3" || hosts.val(pr, "evictions") != "0" {
		t.Errorf("the primary's connections were not kept:\n%s", hosts)
	}
	// The 20 queries reused open connections, of either server.
	rr = hosts.must(t, "the replica", "database", "any", "host", replica.Addr())
	hitsP, _ := strconv.Atoi(hosts.val(pr, "hits"))
	hitsR, _ := strconv.Atoi(hosts.val(rr, "hits"))
	rate, _ := strconv.ParseFloat(hosts.val(pr, "hit_rate"), 64)
	if hitsP+hitsR < 20 || rate < float64(hitsP)/float64(hitsP+3)-0.001 || rate > float64(hitsP)/float64(hitsP+3)+0.001 {
		t.Errorf("hits %d + %d, primary hit rate %.4f; want the 20 queries to reuse connections, and the rate hits/(hits+3 misses)\n%s",
			hitsP, hitsR, rate, hosts)
	}

	_, body := obGet(t, p, "/stats")
	var report struct {
		Pools []struct {
			Name  string
			Hosts []struct {
				Host               string
				Connections, Idle  int
				Hits, Misses       uint64
				HitRate            float64 `json:"hit_rate"`
				Evictions          map[string]uint64
				IdleTimeoutSeconds float64 `json:"idle_timeout_seconds"`
				MaxSize            int     `json:"max_size"`
			}
		}
	}
	if err := json.Unmarshal(body, &report); err != nil {
		t.Fatalf("/stats: %v\n%s", err, body)
	}
	found := false
	for _, pool := range report.Pools {
		for _, h := range pool.Hosts {
			if pool.Name != "any" || h.Host != replica.Addr() {
				continue
			}
			found = true
			if h.Connections != 0 || h.Misses != 1 || h.Evictions["idle_timeout"] != 1 || h.IdleTimeoutSeconds != 1 || h.MaxSize != 1 {
				t.Errorf("/stats replica: %+v", h)
			}
		}
	}
	if !found {
		t.Fatalf("/stats has no replica of pool any:\n%s", body)
	}
	host := "host=" + replica.Addr()
	if v := rlMetric(t, p, "poolerd_server_host_evictions_total", host, "reason=idle_timeout"); v != 1 {
		t.Errorf("poolerd_server_host_evictions_total{replica, idle_timeout} = %v, want 1", v)
	}
	if v := rlMetric(t, p, "poolerd_server_host_checkouts_total", host, "result=miss"); v != 1 {
		t.Errorf("poolerd_server_host_checkouts_total{replica, miss} = %v, want 1", v)
	}
	if v := rlMetric(t, p, "poolerd_server_host_idle_connections", "host="+primary.Addr()); v != 3 {
		t.Errorf("poolerd_server_host_idle_connections{primary} = %v, want 3", v)
	}
}
