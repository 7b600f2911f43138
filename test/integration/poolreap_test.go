package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestPoolIdleTimeout: pool_idle_timeout (set from the console in plain
// seconds, as PgBouncer's SET takes it) removes a pool once it has had no
// client and no server connection that long, and not before: a connected
// idle client whose server connection idle_timeout closed keeps its pool.
// The next client creates the pool anew.
func TestPoolIdleTimeout(t *testing.T) {
	p := obStart(t, obOpts{mutate: func(c *config.Config) {
		c.MinSize = 0
		c.WarmPools = false
		c.IdleTimeout = 200 * time.Millisecond
	}})
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	obCmd(t, adm, "SET pool_idle_timeout = 1", "SET pool_idle_timeout=1s")
	hasPool := func() bool {
		return obShow(t, adm, "SHOW POOLS").find("database", pgtest.DBApp, "user", pgtest.RoleApp) >= 0
	}

	c := obConn(t, p.instance, pgtest.DBApp, "reap")
	obExec(t, c, "SELECT 1")
	eventually(t, 5*time.Second, "idle_timeout to close the idle server connection", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Total == 0
	})
	time.Sleep(2500 * time.Millisecond) // pool_idle_timeout and two reaper rounds
	if !hasPool() {
		t.Fatal("the pool of a connected client was removed")
	}
	obExec(t, c, "SELECT 1") // still served by its pool
	if err := c.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 8*time.Second, "the idle pool to be removed", func() bool { return !hasPool() })
	if !strings.Contains(p.logs.String(), "idle pool removed") {
		t.Error("no log line for the removed pool")
	}

	c2 := obConn(t, p.instance, pgtest.DBApp, "reap-again")
	obExec(t, c2, "SELECT 1")
	if !hasPool() {
		t.Fatal("the next client did not create the pool anew")
	}

	// Off again: an idle pool stays.
	obCmd(t, adm, "SET pool_idle_timeout = 0", "SET pool_idle_timeout=0s")
	if err := c2.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if !hasPool() {
		t.Fatal("pool removed with pool_idle_timeout 0")
	}
}
