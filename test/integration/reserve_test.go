package integration

// The reserve pool (reserve_pool_size, reserve_pool_timeout): a request
// that has waited reserve_pool_timeout on a full pool gets a connection
// beyond max_size, which closes when it comes back with nobody waiting.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// A pool of 2 held by two transactions; a third request waits, gets a
// reserve connection after reserve_pool_timeout (not before), and the
// reserve closes when its client is done; SHOW DATABASES shows the size
// and the metrics count it.
func TestReservePoolBurst(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{metrics: true, http: true, mutate: func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 2
		c.MinSize = 0
		c.ReservePoolSize = 1
		c.ReservePoolTimeout = time.Second
		c.CheckoutTimeout = 20 * time.Second
	}})
	ctx := ctxTimeout(t, 60*time.Second)
	held := rlConns(t, p.instance, 2, rlSimple)
	for _, c := range held {
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	third := connectDSN(t, p.appDSN(rlSimple))
	start := time.Now()
	var pid int
	if err := third.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("the third request: %v", err)
	}
	waited := time.Since(start)
	if waited < 900*time.Millisecond {
		t.Errorf("the third request was served after %s, before reserve_pool_timeout (1s) with the pool full", waited)
	}
	t.Logf("the third request waited %s for its reserve connection", waited)
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	dbs := obShow(t, adm, "SHOW DATABASES")
	if i := dbs.must(t, "the app database", "name", pgtest.DBApp); dbs.val(i, "reserve_pool_size") != "1" {
		t.Errorf("SHOW DATABASES reserve_pool_size %q, want 1", dbs.val(i, "reserve_pool_size"))
	}
	// The reserve connection closed when the third client's request was
	// done (nobody waits); the two others stay.
	eventually(t, 10*time.Second, "the reserve connection to close", func() bool {
		return rlMetric(t, p, "poolerd_server_evictions_total", "reason=reserve_idle") == 1
	})
	if n := rlMetric(t, p, "poolerd_pool_reserve_connections_total"); n != 1 {
		t.Errorf("poolerd_pool_reserve_connections_total = %v, want 1", n)
	}
	if n := rlMetric(t, p, "poolerd_server_connections", "state=active") + rlMetric(t, p, "poolerd_server_connections", "state=idle"); n != 2 {
		t.Errorf("%v server connections after the burst, want the pool's 2", n)
	}
	if !strings.Contains(p.logs.String(), "taking connection from reserve_pool") {
		t.Error("no log line says a reserve connection was opened")
	}
	for _, c := range held {
		if _, err := c.Exec(context.Background(), "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
}
