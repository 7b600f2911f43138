package integration

// Tests of the rate-limit decisions a client sees across rules and around
// authentication, against the real PostgreSQL of the harness: several
// rules decide a request together (all debited or none), and a request
// waiting for a wait-mode rule ends when its client leaves.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// A request refused by one rule is debited by none: a client of
// application x, refused again and again by its own narrow rule, does not
// spend the budget of the shared rule asked before it, which the other
// clients still find whole.
func TestRateLimitRulesAtomic(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		narrow := rlQueries("narrow", 1, time.Minute, "reject", 0)
		narrow.Match.ApplicationName = "rl-x"
		c.RateLimits = []config.RateLimitRule{rlQueries("shared", 5, time.Minute, "reject", 0), narrow}
	})
	x := connectDSN(t, p.appDSN(rlSimple, "application_name=rl-x"))
	y := connectDSN(t, p.appDSN(rlSimple, "application_name=rl-y"))
	obExec(t, x, "SELECT 1") // both rules: shared 1 of 5, narrow 1 of 1
	for i := range 4 {
		_, err := x.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
		pe, ok := rlLimited(err)
		if !ok {
			t.Fatalf("query %d of rl-x: %v, want 53400", i+2, err)
		}
		rlRetryAfter(t, pe, "ERROR", "narrow", "queries")
	}
	for i := range 4 {
		if _, err := y.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
			t.Fatalf("query %d of rl-y: %v (the refused queries of rl-x spent the shared rule)", i+1, err)
		}
	}
	_, err := y.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
	pe, ok := rlLimited(err)
	if !ok {
		t.Fatalf("query 5 of rl-y: %v, want 53400: the shared rule allows 5", err)
	}
	rlRetryAfter(t, pe, "ERROR", "shared", "queries")
}

// A request delayed by a wait-mode rule ends when its client closes the
// connection: the session goes at once (not when the wait would have
// ended), the request never reaches PostgreSQL, and the budget it waited
// for is not spent (the next client gets it on schedule). Also for a
// client that sent more (a Terminate) before closing, and for a login
// waiting for its connections budget.
func TestRateLimitWaitEndsWhenClientLeaves(t *testing.T) {
	t.Parallel()
	const per = 4 * time.Second
	p := startPoolerd(t, func(c *config.Config) {
		r := rlQueries("slow", 1, per, "wait", 20*time.Second)
		r.Match.ApplicationName = "rl-leave"
		logins := config.RateLimitRule{Name: "slow-logins", Match: config.RuleMatch{ApplicationName: "rl-leave-login"},
			Connections: &config.RateBucket{Limit: 1, Per: per}, Mode: "wait", MaxWait: 20 * time.Second}
		c.RateLimits = []config.RateLimitRule{r, logins}
	})
	table := relayTable(t, "n int")
	clients := func() int { return p.srv.ClientCount() }

	for _, terminate := range []bool{false, true} {
		before := clients()
		first := obRawConnect(t, p, pgtest.RoleApp, pgtest.DBApp, "application_name=rl-leave")
		first.exec("SELECT 1") // takes the unit: the next waits per
		spent := time.Now()
		leaver := obRawConnect(t, p, pgtest.RoleApp, pgtest.DBApp, "application_name=rl-leave")
		leaver.send("INSERT INTO " + table + " VALUES (1)")
		time.Sleep(300 * time.Millisecond) // it waits in the limiter now
		if terminate {
			leaver.fe.Send(&pgproto3.Terminate{})
			if err := leaver.fe.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		_ = leaver.nc.Close()
		left := time.Now()
		eventually(t, per/2, "the waiting session to end after its client left", func() bool { return clients() <= before+1 })
		t.Logf("terminate=%v: session ended %v after its client left", terminate, time.Since(left).Round(time.Millisecond))

		// The budget was not spent by the abandoned request: the first
		// client's next query runs when the unit it waited for comes.
		first.exec("SELECT 2")
		if el := time.Since(spent); el > per+per/2 {
			t.Fatalf("terminate=%v: the next query waited until %v after the unit was spent, want about %v: the abandoned request took the unit", terminate, el, per)
		}
		_ = first.nc.Close()
		eventually(t, 5*time.Second, "the first client to leave", func() bool { return clients() <= before })
	}
	var n int
	if err := connectDSN(t, directDSN(pgtest.DBApp)).QueryRow(ctxTimeout(t, 10*time.Second), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows inserted by requests whose clients had left while they waited, want 0", n)
	}

	// A login waiting for its budget ends when its client leaves too.
	c := connectDSN(t, p.appDSN("application_name=rl-leave-login")) // takes the unit
	obExec(t, c, "SELECT 1")
	dsn := p.appDSN("application_name=rl-leave-login")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := pgx.Connect(ctx, dsn); err == nil {
		t.Fatal("a login over the budget got in within 500ms, want it to wait")
	}
	// pgx closed the connection when its context ended.
	eventually(t, per/2, "the waiting login to end after its client left", func() bool { return p.srv.LoginCount() == 0 })
}
