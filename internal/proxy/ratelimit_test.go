package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/wire"
)

// rateServer returns a server (not serving) with the given rules on the
// memory backend.
func rateServer(t *testing.T, rules ...config.RateLimitRule) *Server {
	t.Helper()
	return New(unreachableConfig(t, func(c *config.Config) { c.RateLimits = rules }), zap.NewNop())
}

// queriesRule is a rule with a queries bucket of limit per minute.
func queriesRule(name string, limit int64, mode string, maxWait time.Duration) config.RateLimitRule {
	return config.RateLimitRule{Name: name, Queries: &config.RateBucket{Limit: limit, Per: time.Minute}, Mode: mode, MaxWait: maxWait}
}

// checkQuery asks srv's rules for one query (not starting a transaction)
// of a client of application app.
func checkQuery(srv *Server, app string) error {
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 5000}
	rates := srv.rates.Load().forSession("app", "app", app, addr)
	return srv.checkRate(context.Background(), zap.NewNop(), rates, requestBuckets(false), "ERROR", rateWait{})
}

// rateRefusal returns the rule a 53400 refusal names, or fails.
func rateRefusal(t *testing.T, err error) string {
	t.Helper()
	var werr *wire.Error
	if !errors.As(err, &werr) || werr.Code != "53400" {
		t.Fatalf("got %v, want a 53400 refusal", err)
	}
	return werr.Message
}

// A request that one rule refuses is debited by none: with a shared rule
// of 5 and a rule of 1 for application "x", a client of x refused by its
// own rule again and again leaves the shared budget to the others. Rules
// asked one after the other would debit the shared rule at every refusal,
// and the other client would find it spent.
func TestRateRulesAtomic(t *testing.T) {
	narrow := queriesRule("narrow", 1, "reject", 0)
	narrow.Match.ApplicationName = "x"
	for _, order := range []struct {
		name  string
		rules []config.RateLimitRule
	}{
		{"shared rule first", []config.RateLimitRule{queriesRule("shared", 5, "reject", 0), narrow}},
		{"shared rule last", []config.RateLimitRule{narrow, queriesRule("shared", 5, "reject", 0)}},
	} {
		t.Run(order.name, func(t *testing.T) {
			srv := rateServer(t, order.rules...)
			if err := checkQuery(srv, "x"); err != nil {
				t.Fatalf("first query of x: %v", err)
			}
			for i := range 10 {
				if msg := rateRefusal(t, checkQuery(srv, "x")); msg != `rate limit exceeded: rule "narrow", bucket queries` {
					t.Fatalf("query %d of x refused with %q, want rule narrow", i+2, msg)
				}
			}
			for i := range 4 {
				if err := checkQuery(srv, "y"); err != nil {
					t.Fatalf("query %d of y: %v (the refusals of x spent the shared rule)", i+1, err)
				}
			}
			if msg := rateRefusal(t, checkQuery(srv, "y")); msg != `rate limit exceeded: rule "shared", bucket queries` {
				t.Fatalf("5th query of y refused with %q, want rule shared", msg)
			}
		})
	}
}

// A request that a reject-mode rule refuses is refused at once, even when
// a wait-mode rule would also have it wait, and the wait-mode rule is not
// debited: the other clients of that rule get its unit on schedule. Rules
// asked one after the other would make the request wait for the first
// rule, debit it, and then be refused by the second.
func TestRateWaitAndRejectAtomic(t *testing.T) {
	const per = 2 * time.Second
	w := config.RateLimitRule{Name: "spread", Queries: &config.RateBucket{Limit: 1, Per: per}, Mode: "wait", MaxWait: 10 * time.Second}
	narrow := queriesRule("narrow", 1, "reject", 0)
	narrow.Match.ApplicationName = "x"
	srv := rateServer(t, w, narrow)
	if err := checkQuery(srv, "x"); err != nil {
		t.Fatalf("first query of x: %v", err)
	}
	first := time.Now()
	err := checkQuery(srv, "x")
	if el := time.Since(first); el > per/2 {
		t.Fatalf("second query of x refused after %v, want at once: it waited for rule spread first", el)
	}
	if msg := rateRefusal(t, err); msg != `rate limit exceeded: rule "narrow", bucket queries` {
		t.Fatalf("second query of x refused with %q, want rule narrow (the longest retry)", msg)
	}
	if err := checkQuery(srv, "y"); err != nil {
		t.Fatalf("query of y: %v", err)
	}
	if el := time.Since(first); el < per/2 || el > per+per/2 {
		t.Fatalf("query of y allowed %v after the unit was spent, want about %v: the refused query of x took the unit", el, per)
	}
}

// fakeOwner is a waitOwner ended by the test.
type fakeOwner struct{ err atomic.Pointer[wire.Error] }

func (o *fakeOwner) waitEnded() *wire.Error { return o.err.Load() }

func (*fakeOwner) leaveLoop() {}

// watchPair returns both ends of a TCP connection: the client's, and
// poolerd's (the one a rate-limit wait watches).
func watchPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// TestRateWaitWatchesClient checks how a wait-mode wait ends: when the
// client closes its connection (also behind data it sent), when the
// session ends, and not because the client sends more or because of
// another read deadline (the parker's); afterwards the connection's read
// deadline is as before.
func TestRateWaitWatchesClient(t *testing.T) {
	if !reactor.CanWatch {
		t.Skip("a rate-limit wait watches its client on Linux only")
	}
	const per = 10 * time.Second
	// wait starts a wait of about per on a fresh server (its rule's
	// unit spent) and returns its result when it ends.
	wait := func(t *testing.T, conn net.Conn, owner waitOwner, per time.Duration) <-chan error {
		rule := config.RateLimitRule{Name: "spread", Queries: &config.RateBucket{Limit: 1, Per: per}, Mode: "wait", MaxWait: time.Minute}
		srv := rateServer(t, rule)
		if err := checkQuery(srv, "x"); err != nil {
			t.Fatal(err)
		}
		rates := srv.rates.Load().forSession("app", "app", "x", conn.RemoteAddr())
		done := make(chan error, 1)
		go func() {
			done <- srv.checkRate(context.Background(), zap.NewNop(), rates, requestBuckets(false), "ERROR", rateWait{conn: conn, owner: owner})
		}()
		return done
	}
	endsWith := func(t *testing.T, done <-chan error, code string) {
		t.Helper()
		select {
		case err := <-done:
			var werr *wire.Error
			if !errors.As(err, &werr) || werr.Code != code {
				t.Fatalf("the wait ended with %v, want SQLSTATE %s", err, code)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the wait goes on")
		}
	}
	goesOn := func(t *testing.T, done <-chan error) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("the wait ended (%v), want it to go on", err)
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Run("client closes", func(t *testing.T) {
		client, server := watchPair(t)
		done := wait(t, server, &fakeOwner{}, per)
		goesOn(t, done)
		_ = client.Close()
		endsWith(t, done, "08006")
	})
	t.Run("client closes behind data", func(t *testing.T) {
		client, server := watchPair(t)
		done := wait(t, server, &fakeOwner{}, per)
		if _, err := client.Write([]byte("Q\x00\x00\x00\x0dSELECT 1\x00")); err != nil {
			t.Fatal(err)
		}
		goesOn(t, done) // data alone: the next request
		if _, err := client.Write([]byte("X\x00\x00\x00\x04")); err != nil {
			t.Fatal(err)
		}
		goesOn(t, done)
		_ = client.Close()
		endsWith(t, done, "08006")
	})
	t.Run("session ends", func(t *testing.T) {
		_, server := watchPair(t)
		owner := &fakeOwner{}
		done := wait(t, server, owner, per)
		// The parker's idle sweep: a read deadline that is not the end.
		_ = server.SetReadDeadline(time.Unix(1, 0))
		goesOn(t, done)
		owner.err.Store(errKilled())
		_ = server.SetReadDeadline(time.Now()) // as finishLocked does
		endsWith(t, done, "08P01")
	})
	t.Run("allowed: deadline restored", func(t *testing.T) {
		client, server := watchPair(t)
		done := wait(t, server, &fakeOwner{}, 500*time.Millisecond)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the wait ended with %v, want allowed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the wait did not end")
		}
		if _, err := client.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := server.Read(b[:]); err != nil {
			t.Fatalf("read after the wait: %v (a deadline left behind)", err)
		}
	})
}

// Only the rules that depend on nothing but the client's address have
// their connections bucket checked before authentication: a rule that
// matches or keys by a name the client claims (user, database,
// application_name) is checked once the client has authenticated, so that
// claiming a name spends nothing of its budgets.
func TestRatePreAuth(t *testing.T) {
	conns := &config.RateBucket{Limit: 1, Per: time.Minute}
	for _, tc := range []struct {
		name    string
		rule    config.RateLimitRule
		preAuth bool
	}{
		{"everyone, one budget", config.RateLimitRule{}, true},
		{"by client", config.RateLimitRule{KeyBy: []string{"client"}}, true},
		{"a subnet by client", config.RateLimitRule{Match: config.RuleMatch{Client: "10.0.0.0/8"}, KeyBy: []string{"client"}}, true},
		{"by user", config.RateLimitRule{KeyBy: []string{"user"}}, false},
		{"by client and database", config.RateLimitRule{KeyBy: []string{"client", "database"}}, false},
		{"by application_name", config.RateLimitRule{KeyBy: []string{"application_name"}}, false},
		{"one user", config.RateLimitRule{Match: config.RuleMatch{User: "app"}, KeyBy: []string{"client"}}, false},
		{"one database", config.RateLimitRule{Match: config.RuleMatch{Database: "app"}}, false},
		{"one application", config.RateLimitRule{Match: config.RuleMatch{ApplicationName: "x"}}, false},
	} {
		r := tc.rule
		r.Name, r.Connections, r.Mode = "r", conns, "reject"
		srv := rateServer(t, r)
		rule := srv.rates.Load().rules[0]
		if rule.preAuth != tc.preAuth {
			t.Errorf("%s: checked before authentication %v, want %v", tc.name, rule.preAuth, tc.preAuth)
		}
		if got := len(loginBuckets(tc.preAuth)(rule)) + len(loginBuckets(!tc.preAuth)(rule)); got != 1 {
			t.Errorf("%s: the login takes %d connections units over both checks, want 1", tc.name, got)
		}
	}
}

// benchRates returns a server with n reject rules of a budget no benchmark
// spends, keyed by user, and the rules of a client.
func benchRates(tb testing.TB, n int) (*Server, []sessionRate) {
	var rules []config.RateLimitRule
	for i := range n {
		rules = append(rules, config.RateLimitRule{Name: fmt.Sprint("r", i), KeyBy: []string{"user"},
			Queries: &config.RateBucket{Limit: 1 << 40, Per: time.Second}, Mode: "reject"})
	}
	srv := New(unreachableConfig(tb, func(c *config.Config) { c.RateLimits = rules }), zap.NewNop())
	return srv, srv.rates.Load().forSession("app", "app", "x", &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)})
}

// BenchmarkCheckRate is the cost a rate limit adds to each request of a
// client that one rule, or two, apply to (memory backend, allowed).
func BenchmarkCheckRate(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			srv, rates := benchRates(b, n)
			log := zap.NewNop()
			b.ReportAllocs()
			for b.Loop() {
				if err := srv.checkRate(context.Background(), log, rates, requestBuckets(false), "ERROR", rateWait{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCheckRateNoAlloc guards the common case, one rule that allows: the
// decision allocates nothing, the rateWait made per request as
// session.rateCheck makes it (on an event loop) included.
func TestCheckRateNoAlloc(t *testing.T) {
	srv, rates := benchRates(t, 1)
	log := zap.NewNop()
	conn, owner, lw := net.Conn(&net.TCPConn{}), &fakeOwner{}, &rateLoopWait{} // a session's: made once
	if n := testing.AllocsPerRun(1000, func() {
		_ = srv.checkRate(context.Background(), log, rates, requestBuckets(true), "ERROR", rateWait{conn: conn, owner: owner, loop: lw})
	}); n != 0 {
		t.Fatalf("checkRate allocates %v times per request, want 0", n)
	}
}
