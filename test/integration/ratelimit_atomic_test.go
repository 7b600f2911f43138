package integration

// Tests of the rate-limit decisions a client sees across rules and around
// authentication, against the real PostgreSQL of the harness: several
// rules decide a request together (all debited or none), login budgets and
// client connection limits keyed by user count only authenticated clients,
// and a request waiting for a wait-mode rule ends when its client leaves.

import (
	"context"
	"net"
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

// rlStartup opens a raw connection to p, sends a startup packet for user
// and database app, and returns it with the first answer.
func rlStartup(t *testing.T, p *instance, user string) (net.Conn, pgproto3.BackendMessage) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": user, "database": pgtest.DBApp}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := fe.Receive()
	if err != nil {
		t.Fatalf("startup as %s: %v", user, err)
	}
	return nc, m
}

// Anyone can claim a user name: a client that has not authenticated as
// app spends none of app's budgets. Logins that stop at the password
// prompt, and logins with a wrong password, neither take app's place
// under max_user_client_connections nor its login budget keyed by user;
// app itself then logs in, and only its own logins count.
func TestRateLimitLoginsKeyedByAuthenticatedUser(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxUserClientConnections = 1
		c.RateLimits = []config.RateLimitRule{{Name: "user-logins", KeyBy: []string{"user"},
			Connections: &config.RateBucket{Limit: 2, Per: time.Minute}, Mode: "reject"}}
	})
	// Three clients claim app and stay at the password prompt.
	for range 3 {
		if _, m := rlStartup(t, p, pgtest.RoleApp); isErrorResponse(m) {
			t.Fatalf("startup claiming app: %s, want an authentication request", describeMsg(m))
		}
	}
	// Wrong passwords: refused by authentication, not by app's limits.
	for i := range 4 {
		if pe := obLoginErr(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
			t.Fatalf("wrong password %d: %s %s %q, want 28P01 (not a limit spent by unauthenticated clients)", i+1, pe.Severity, pe.Code, pe.Message)
		}
	}
	// app logs in: its budget of 2 logins and its one client slot are
	// whole.
	a := connectDSN(t, p.appDSN())
	obExec(t, a, "SELECT 1")
	clRefused(t, p.appDSN(), `user "app" (max_user_client_connections 1)`, "raise max_user_client_connections")
	if err := a.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	b := clAdmittedAgain(t, p.appDSN()) // app's second login of 2
	if err := b.Close(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The third authenticated login is over app's budget (after its
	// password was checked); a wrong password is still just that.
	var pe = obLoginErr(t, p.appDSN())
	for pe.Code == "53300" { // b's slot may not be free yet
		time.Sleep(20 * time.Millisecond)
		pe = obLoginErr(t, p.appDSN())
	}
	if pe.Code != "53400" || pe.Severity != "FATAL" || pe.Message != `rate limit exceeded: rule "user-logins", bucket connections` {
		t.Fatalf("third login of app: %s %s %q, want FATAL 53400 of rule user-logins", pe.Severity, pe.Code, pe.Message)
	}
	if pe := obLoginErr(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
		t.Fatalf("wrong password after the budget is spent: %s %q, want 28P01", pe.Code, pe.Message)
	}
}

func isErrorResponse(m pgproto3.BackendMessage) bool {
	_, ok := m.(*pgproto3.ErrorResponse)
	return ok
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
