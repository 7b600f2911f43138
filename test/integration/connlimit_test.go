package integration

// Tests of the connection limits at PgBouncer parity, against the real
// PostgreSQL of the harness: max_client_conn, max_db_client_connections and
// max_user_client_connections refuse extra clients with a FATAL 53300 and
// a hint, and free the slot when a client leaves; max_db_connections and
// max_user_connections cap server connections, making clients queue
// instead; per-database and per-user settings override the global ones.
//
// The helpers of this file are prefixed cl.

import (
	"context"
	"errors"
	"fmt"
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

func clInt(v int) *int { return &v }

// clRefused checks a login refused by a client connection limit.
func clRefused(t *testing.T, dsn, wantMsg, wantHint string) {
	t.Helper()
	pe := obLoginErr(t, dsn)
	if pe.Severity != "FATAL" || pe.Code != "53300" {
		t.Fatalf("refusal %s %s %q, want FATAL 53300", pe.Severity, pe.Code, pe.Message)
	}
	if !strings.Contains(pe.Message, wantMsg) {
		t.Fatalf("refusal message %q, want it to contain %q", pe.Message, wantMsg)
	}
	if !strings.Contains(pe.Hint, wantHint) {
		t.Fatalf("refusal hint %q, want it to contain %q", pe.Hint, wantHint)
	}
}

// clAdmittedAgain waits until a login with dsn succeeds again after a
// client left, and returns the connection.
func clAdmittedAgain(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	var c *pgx.Conn
	eventually(t, 5*time.Second, "the freed slot admits a new client", func() bool {
		var err error
		c, err = pgx.Connect(ctxTimeout(t, 10*time.Second), dsn)
		return err == nil
	})
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	obExec(t, c, "SELECT 1")
	return c
}

// max_client_conn counts every client: over it, a login gets FATAL 53300
// with a hint, and the refusal is counted on /metrics; when a client
// leaves, the next one gets in.
func TestConnLimitMaxClientConn(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		c.MaxClientConn = 3
	}})
	conns := []*pgx.Conn{
		connectDSN(t, p.appDSN()),
		connectDSN(t, p.appDSN()),
		connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther)), // all databases count
	}
	clRefused(t, p.appDSN(), "max_client_conn", "raise max_client_conn")
	clRefused(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther), "max_client_conn", "raise max_client_conn")
	if v := rlMetric(t, p, "poolerd_connection_limit_refusals_total", "limit=max_client_conn"); v != 2 {
		t.Fatalf("max_client_conn refusals on /metrics = %v, want 2", v)
	}
	for _, c := range conns[1:] {
		obExec(t, c, "SELECT 1") // the others are unaffected
	}
	if err := conns[0].Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	clAdmittedAgain(t, p.appDSN())
	clRefused(t, p.appDSN(), "max_client_conn", "raise max_client_conn")
}

// max_db_client_connections counts clients per database; a database's own
// setting overrides the global one; a freed slot admits the next client.
func TestConnLimitDBClientConnections(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxDBClientConnections = 2
		c.Databases = []config.Database{{Name: pgtest.DBOther, MaxDBClientConnections: clInt(3)}}
	})
	otherDSN := p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther)
	a1 := connectDSN(t, p.appDSN())
	connectDSN(t, p.appDSN())
	clRefused(t, p.appDSN(), `database "app" (max_db_client_connections 2)`, "raise max_db_client_connections")

	// Another database has its own count, and its own limit.
	for range 3 {
		obExec(t, connectDSN(t, otherDSN), "SELECT 1")
	}
	clRefused(t, otherDSN, `database "other" (max_db_client_connections 3)`, "raise max_db_client_connections")

	if err := a1.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	clAdmittedAgain(t, p.appDSN())
	clRefused(t, p.appDSN(), "max_db_client_connections 2", "raise max_db_client_connections")
}

// max_user_client_connections counts clients per user over every
// database; a user's own setting overrides the global one.
func TestConnLimitUserClientConnections(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxUserClientConnections = 1
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password, MaxUserClientConnections: clInt(3)}}
	})
	a := connectDSN(t, p.appDSN())
	clRefused(t, p.appDSN(), `user "app" (max_user_client_connections 1)`, "raise max_user_client_connections")
	clRefused(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther), `user "app"`, "raise max_user_client_connections")

	scramDSN := func(db string) string { return p.dsn(pgtest.RoleSCRAM, pgtest.Password, db) }
	obExec(t, connectDSN(t, scramDSN(pgtest.DBApp)), "SELECT 1")
	obExec(t, connectDSN(t, scramDSN(pgtest.DBApp)), "SELECT 1")
	obExec(t, connectDSN(t, scramDSN(pgtest.DBOther)), "SELECT 1")
	clRefused(t, scramDSN(pgtest.DBOther), `user "scram_user" (max_user_client_connections 3)`, "raise max_user_client_connections")

	if err := a.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	clAdmittedAgain(t, p.dsn(pgtest.RoleApp, pgtest.Password, pgtest.DBOther))
	clRefused(t, p.appDSN(), `user "app"`, "raise max_user_client_connections")
}

// clLoad is a load of clients on one (database, user).
type clLoad struct {
	user, db string
	clients  int
}

// clMax are the most seen at one instant during clRun, by key.
type clMax struct {
	// pg counts the backends PostgreSQL shows active for the load's
	// clients (pg_stat_activity: their application_name is set on every
	// server connection they use).
	pg map[string]int
	// servers counts poolerd's server connections (open or opening) per
	// pool, summed by key. Pools are read one after the other, so a sum
	// over several pools may count a connection closed in one pool to
	// make room for another twice: it is exact only for a key with one
	// pool.
	servers map[string]int
	// waiting counts clients queued for a server connection.
	waiting map[string]int
}

// clRun runs every load at once: each client runs rounds of a short
// pg_sleep in transaction mode, so that clients outnumber server
// connections and queue. Meanwhile it samples PostgreSQL and poolerd and
// records the most server connections and waiting clients, by
// keyOf(database, user). Every query must succeed.
func clRun(t *testing.T, p *instance, app string, loads []clLoad, keyOf func(db, user string) string) clMax {
	t.Helper()
	const rounds = 8
	var conns []*pgx.Conn
	for _, l := range loads {
		for range l.clients {
			conns = append(conns, connectDSN(t, p.dsn(l.user, pgtest.Password, l.db, txExecMode, "application_name="+app)))
		}
	}
	direct := connectDSN(t, directDSN(pgtest.DBApp))
	res := clMax{pg: map[string]int{}, servers: map[string]int{}, waiting: map[string]int{}}
	var stop atomic.Bool
	var samplers sync.WaitGroup
	samplers.Add(2)
	go func() {
		defer samplers.Done()
		for !stop.Load() {
			servers, waiting := map[string]int{}, map[string]int{}
			for _, ps := range p.srv.Pools() {
				k := keyOf(ps.Database, ps.User)
				servers[k] += ps.Total
				waiting[k] += ps.Waiting
			}
			for k, n := range servers {
				res.servers[k] = max(res.servers[k], n)
				res.waiting[k] = max(res.waiting[k], waiting[k])
			}
			time.Sleep(time.Millisecond)
		}
	}()
	pgMax := map[string]int{}
	go func() {
		defer samplers.Done()
		for !stop.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rows, err := direct.Query(ctx, "SELECT datname, usename FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'", app)
			if err == nil {
				now := map[string]int{}
				for rows.Next() {
					var db, user string
					if rows.Scan(&db, &user) == nil {
						now[keyOf(db, user)]++
					}
				}
				rows.Close()
				for k, n := range now {
					pgMax[k] = max(pgMax[k], n)
				}
			}
			cancel()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for r := range rounds {
				if _, err := c.Exec(ctx, "SELECT pg_sleep(0.02)"); err != nil {
					errs <- fmt.Errorf("client %d, round %d: %w", i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	samplers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	res.pg = pgMax
	t.Logf("at most: active on PostgreSQL %v, poolerd server connections %v, waiting clients %v", res.pg, res.servers, res.waiting)
	return res
}

// max_db_connections caps a database's server connections below the pool
// size: many concurrent clients queue for them instead, PostgreSQL never
// sees more, and a database's own setting overrides the global one.
func TestConnLimitDBServerConnections(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 6
		c.MaxDBConnections = 2
		c.Databases = []config.Database{{Name: pgtest.DBOther, MaxDBConnections: clInt(3)}}
	})
	// One pool per database: poolerd's counts are exact.
	m := clRun(t, p, "cl-db-cap", []clLoad{
		{pgtest.RoleApp, pgtest.DBApp, 8},
		{pgtest.RoleApp, pgtest.DBOther, 8},
	}, func(db, _ string) string { return db })
	app, other := pgtest.DBApp, pgtest.DBOther
	if m.servers[app] > 2 || m.pg[app] > 2 {
		t.Fatalf("database app had %d server connections (PostgreSQL: %d active), max_db_connections is 2", m.servers[app], m.pg[app])
	}
	if m.servers[app] < 2 || m.waiting[app] == 0 {
		t.Fatalf("database app: at most %d server connections, %d clients waiting: the load never reached the cap", m.servers[app], m.waiting[app])
	}
	if m.servers[other] > 3 || m.pg[other] > 3 {
		t.Fatalf("database other had %d server connections (PostgreSQL: %d active), its max_db_connections is 3", m.servers[other], m.pg[other])
	}
	if m.servers[other] < 3 {
		t.Fatalf("database other had at most %d server connections: its own max_db_connections 3 should override the global 2 under load", m.servers[other])
	}
}

// max_user_connections caps a user's server connections over all its
// pools (here two databases), and a user's own setting overrides it.
func TestConnLimitUserServerConnections(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 6
		c.MaxUserConnections = 3
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password, MaxUserConnections: clInt(1)}}
	})
	m := clRun(t, p, "cl-user-cap", []clLoad{
		{pgtest.RoleApp, pgtest.DBApp, 5},
		{pgtest.RoleApp, pgtest.DBOther, 5},
		{pgtest.RoleSCRAM, pgtest.DBApp, 5},
	}, func(_, user string) string { return user })
	// User app has two pools: PostgreSQL's count is the exact one.
	if m.pg[pgtest.RoleApp] > 3 {
		t.Fatalf("user app had %d server connections active on PostgreSQL over its pools, max_user_connections is 3", m.pg[pgtest.RoleApp])
	}
	if m.pg[pgtest.RoleApp] < 2 || m.waiting[pgtest.RoleApp] == 0 {
		t.Fatalf("user app: at most %d server connections active, %d clients waiting: the load never reached the cap", m.pg[pgtest.RoleApp], m.waiting[pgtest.RoleApp])
	}
	// scram_user has one pool, so poolerd's count is exact (and
	// PostgreSQL hides the state of its backends from app).
	if m.servers[pgtest.RoleSCRAM] != 1 {
		t.Fatalf("user scram_user had at most %d server connections, its own max_user_connections is 1", m.servers[pgtest.RoleSCRAM])
	}
	if m.waiting[pgtest.RoleSCRAM] == 0 {
		t.Fatal("no scram_user client ever queued behind its single server connection")
	}
}

// Logins refused after taking a client slot (by a login rate limit, or by
// a wrong password) give the slot back: afterwards the database still
// admits exactly as many clients as its limit.
func TestConnLimitRefusedLoginsFreeSlots(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxDBClientConnections = 2
		c.RateLimits = []config.RateLimitRule{{Name: "logins", Match: config.RuleMatch{ApplicationName: "limited"},
			Connections: &config.RateBucket{Limit: 1, Per: time.Minute}, Mode: "reject"}}
	})
	connectDSN(t, p.appDSN("application_name=free"))
	b := connectDSN(t, p.appDSN("application_name=limited")) // takes the login budget
	if err := b.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// A refused client gets its error a moment before its slot is given
	// back, so the next login may still find the slot taken (53300): it
	// must not stay taken.
	refusedAs := func(dsn, code string) {
		t.Helper()
		for range 3 {
			var last *pgconn.PgError
			eventually(t, 5*time.Second, "a login refused with "+code, func() bool {
				last = obLoginErr(t, dsn)
				if last.Code != code && last.Code != "53300" {
					t.Fatalf("login refused with %s %s, want %s", last.Code, last.Message, code)
				}
				return last.Code == code
			})
		}
	}
	refusedAs(p.appDSN("application_name=limited"), "53400")
	refusedAs(p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp), "28P01")
	obExec(t, clAdmittedAgain(t, p.appDSN("application_name=free")), "SELECT 1")
	clRefused(t, p.appDSN("application_name=free"), "max_db_client_connections 2", "raise max_db_client_connections")
}

// A request that waits out checkout_timeout because max_db_connections or
// max_user_connections kept its pool from opening a connection (its pool
// is below max_size) gets a 53300 that names the limit, its value and
// whose it is, and says to raise it, rather than only the pool's counts.
func TestConnLimitCheckoutTimeoutNamesLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mutate  func(c *config.Config)
		key     string
		whose   string
		setting string
	}{
		{"database", func(c *config.Config) { c.MaxDBConnections = 1 }, "max_db_connections", `database "app"`, "max_db_connections (1 of 1"},
		{"user", func(c *config.Config) { c.MaxUserConnections = 1 }, "max_user_connections", `user "app"`, "max_user_connections (1 of 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startPoolerd(t, func(c *config.Config) {
				c.MaxSize = 4
				c.CheckoutTimeout = 500 * time.Millisecond
				tc.mutate(c)
			})
			holder := connectDSN(t, p.appDSN())
			obExec(t, holder, "BEGIN") // keeps the one connection the limit allows
			obExec(t, holder, "SELECT 1")
			waiter := connectDSN(t, p.appDSN())
			_, err := waiter.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "53300" || pe.Severity != "ERROR" {
				t.Fatalf("query with the only allowed connection taken: %v, want ERROR 53300", err)
			}
			t.Logf("%s: %s\nDETAIL: %s\nHINT: %s", pe.Code, pe.Message, pe.Detail, pe.Hint)
			if !strings.Contains(pe.Message, "checkout_timeout") || !strings.Contains(pe.Message, tc.key) {
				t.Errorf("message %q does not name checkout_timeout and %s", pe.Message, tc.key)
			}
			if !strings.Contains(pe.Detail, tc.whose) || !strings.Contains(pe.Detail, tc.setting) {
				t.Errorf("detail %q does not say that %s reached %s", pe.Detail, tc.whose, tc.setting)
			}
			if !strings.Contains(pe.Hint, "raise "+tc.key) {
				t.Errorf("hint %q does not say to raise %s", pe.Hint, tc.key)
			}
			obExec(t, holder, "COMMIT")
			obExec(t, waiter, "SELECT 1") // the connection is free again
		})
	}
}

// SHOW DATABASES and SHOW USERS show the connection limits in force for
// each database and user, as PgBouncer does: an entry's own value, else
// the global one (0: no limit). The admin console's database row shows
// the global max_db_client_connections (console logins count under it, as
// in PgBouncer) and no server limit; its user row shows none.
func TestAdminShowConnectionLimits(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.MaxDBConnections = 7
		c.MaxDBClientConnections = 11
		c.MaxUserConnections = 5
		c.MaxUserClientConnections = 13
		c.Databases = []config.Database{{Name: pgtest.DBOther, MaxDBConnections: clInt(3), MaxDBClientConnections: clInt(0)}}
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password, MaxUserConnections: clInt(2), MaxUserClientConnections: clInt(4)}}
	}})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	// limits checks the two columns of the rows named in want.
	type limits struct {
		name             string
		servers, clients int64
	}
	check := func(show, serversCol, clientsCol string, want ...limits) {
		t.Helper()
		tb := obShow(t, adm, show)
		for _, w := range want {
			i := tb.must(t, show, "name", w.name)
			if got := (limits{w.name, tb.num(i, serversCol), tb.num(i, clientsCol)}); got != w {
				t.Errorf("%s %s: %s %d, %s %d; want %d, %d\n%s", show, w.name, serversCol, got.servers, clientsCol, got.clients, w.servers, w.clients, tb)
			}
		}
	}
	check("SHOW DATABASES", "max_connections", "max_client_connections",
		limits{pgtest.DBApp, 7, 11}, limits{pgtest.DBOther, 3, 0}, limits{"pgbouncer", 0, 11})
	check("SHOW USERS", "max_user_connections", "max_user_client_connections",
		limits{pgtest.RoleApp, 5, 13}, limits{pgtest.RoleSCRAM, 2, 4}, limits{"pgbouncer", 0, 0})
}

// Admin console logins count under their user's client limit, as
// PgBouncer's do: a stats user is refused at it, an admin is counted but
// never refused (the console stays open to whoever must raise the limit).
func TestConnLimitConsoleLogins(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxUserClientConnections = 1
		c.AdminUsers = []string{pgtest.RoleApp}
		c.StatsUsers = []string{pgtest.RoleSCRAM}
		c.Users = []config.User{{Name: pgtest.RoleSCRAM, Password: pgtest.Password}}
	})
	stats := p.dsn(pgtest.RoleSCRAM, pgtest.Password, "pgbouncer")
	connectDSN(t, stats)
	clRefused(t, stats, `user "scram_user" (max_user_client_connections 1)`, "raise max_user_client_connections")
	clRefused(t, p.dsn(pgtest.RoleSCRAM, pgtest.Password, pgtest.DBApp), `user "scram_user"`, "raise max_user_client_connections")
	adm := obAdmin(t, p, pgtest.RoleApp)
	obAdmin(t, p, pgtest.RoleApp) // a second admin session: counted, not refused
	users := obShow(t, adm, "SHOW USERS")
	for user, want := range map[string]int64{pgtest.RoleApp: 2, pgtest.RoleSCRAM: 1} {
		if got := users.num(users.must(t, "SHOW USERS", "name", user), "current_client_connections"); got != want {
			t.Errorf("SHOW USERS %s current_client_connections %d, want %d\n%s", user, got, want, users)
		}
	}
}
