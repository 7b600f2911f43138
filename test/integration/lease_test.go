package integration

// Tests of lease_timeout (issue 34 item 3, seed 002's one deadline for
// the whole lease): the clock starts when a request begins waiting for a
// server connection; the checkout wait gets what is left of it, the work
// what is left after the wait. A checkout that runs out is 53300 naming
// lease_timeout, work that runs out outside a transaction block is
// cancelled (57014, session kept), inside one the session ends (25P04);
// each is its own kind in the timeout counts.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// startLeasePool is a pool of one server connection with lease_timeout
// lease and no other limit on the wait or the work.
func startLeasePool(t *testing.T, lease time.Duration) *instance {
	t.Helper()
	return startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		c.LeaseTimeout = lease
		c.CheckoutTimeout = 30 * time.Second
	})
}

// A checkout that uses up the lease: 53300 naming lease_timeout well before
// checkout_timeout, counted as lease_checkout and not as checkout; the
// client's session goes on. The database is paused, so that nothing holds
// a connection (a holder would run into its own lease first).
func TestLeaseCheckoutRunsOut(t *testing.T) {
	t.Parallel()
	const lease = 700 * time.Millisecond
	p := startLeasePool(t, lease)
	waiter := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)
	if err := p.srv.Pause(ctx, pgtest.DBApp); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := waiter.Exec(ctx, "SELECT 1")
	waited := time.Since(start)
	pe := toPgErr(t, err, "waiter")
	if pe.Code != "53300" || !strings.Contains(pe.Message, "lease_timeout (700ms)") || !strings.Contains(pe.Message, "checkout timed out") {
		t.Fatalf("waiter got %s %q, want 53300 naming lease_timeout", pe.Code, pe.Message)
	}
	if pe.Hint == "" || !strings.Contains(pe.Detail, "paused") {
		t.Errorf("no hint, or a detail that does not say the database is paused: %+v", pe)
	}
	if waited >= 10*time.Second {
		t.Errorf("refused after %s: the wait ran to checkout_timeout, not lease_timeout", waited)
	}
	if err := p.srv.Resume(pgtest.DBApp); err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the session after the refusal: %v", err)
	}
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if st.SessionTimeouts["lease_checkout"] != 1 || st.Timeouts != 0 || st.SessionTimeouts["lease"] != 0 {
		t.Errorf("timeouts: lease_checkout %d (want 1), checkout %d (want 0), lease %d (want 0)",
			st.SessionTimeouts["lease_checkout"], st.Timeouts, st.SessionTimeouts["lease"])
	}
}

// The work gets what the wait left: the waiter's query, which would run
// for 5 s, is cancelled once its whole lease (wait included) reaches
// lease_timeout, not lease_timeout after it got its connection; the session
// goes on, on a clean connection.
func TestLeaseWorkGetsWhatIsLeft(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	p := startLeasePool(t, lease)
	const simple = "default_query_exec_mode=simple_protocol"
	holder, waiter := p.connect(t, simple), p.connect(t, simple)
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		err     error
		elapsed time.Duration
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		_, err := waiter.Exec(ctx, "SELECT pg_sleep(5) /* lease-work */")
		res <- result{err, time.Since(start)}
	}()
	time.Sleep(1500 * time.Millisecond) // most of the lease spent waiting
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	got := <-res
	pe := toPgErr(t, got.err, "waiter")
	if pe.Code != "57014" || !strings.Contains(pe.Message, "due to lease timeout (lease_timeout 2s)") {
		t.Fatalf("waiter got %s %q, want 57014 naming lease_timeout", pe.Code, pe.Message)
	}
	// With a fresh clock after the wait, the cancel would come at about
	// 1.5 s + 2 s; with the one lease, at about 2 s.
	if got.elapsed >= 3200*time.Millisecond {
		t.Errorf("cancelled %s after the request began (1.5 s of it waiting): the work got a fresh lease_timeout", got.elapsed)
	}
	var n int
	if err := waiter.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
		t.Fatalf("the session after the cancel: %d, %v", n, err)
	}
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if st.SessionTimeouts["lease"] != 1 || st.SessionTimeouts["query"] != 0 {
		t.Errorf("timeouts: lease %d (want 1), query %d (want 0)", st.SessionTimeouts["lease"], st.SessionTimeouts["query"])
	}
}

// Inside a transaction block the lease cannot be cut short of the block:
// the session ends with 25P04 naming lease_timeout, whether the block is
// running a query or idle, and its connection is not pooled.
func TestLeaseInsideBlockEnds(t *testing.T) {
	t.Parallel()
	const lease = 800 * time.Millisecond
	p := startLeasePool(t, lease)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct{ name, sql string }{
		{"running", "SELECT pg_sleep(5)"},
		{"idle in transaction", ""},
	} {
		c := p.connect(t, "default_query_exec_mode=simple_protocol")
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		var err error
		if tc.sql != "" {
			_, err = c.Exec(ctx, tc.sql)
		} else {
			time.Sleep(lease + 700*time.Millisecond)
			_, err = c.Exec(ctx, "SELECT 1")
		}
		pe := toPgErr(t, err, tc.name)
		if pe.Code != "25P04" || pe.Severity != "FATAL" || !strings.Contains(pe.Message, "due to lease timeout (lease_timeout 800ms)") {
			t.Errorf("%s: got %s %s %q, want FATAL 25P04 naming lease_timeout", tc.name, pe.Severity, pe.Code, pe.Message)
		}
	}
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if st.SessionTimeouts["lease"] != 2 {
		t.Errorf("lease timeouts %d, want 2", st.SessionTimeouts["lease"])
	}
	// The pool of one still serves.
	c := p.connect(t)
	var n int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil {
		t.Fatalf("after the lease timeouts: %v", err)
	}
}

// Without a wait, a request outside a block gets the whole lease: a short
// query is untouched, a long one is cancelled and the session goes on.
func TestLeaseSingleStatement(t *testing.T) {
	t.Parallel()
	p := startLeasePool(t, 600*time.Millisecond)
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)
	for range 3 {
		if _, err := c.Exec(ctx, "SELECT pg_sleep(0.05)"); err != nil {
			t.Fatalf("a query well inside the lease: %v", err)
		}
	}
	_, err := c.Exec(ctx, "SELECT pg_sleep(5)")
	if pe := toPgErr(t, err, "long query"); pe.Code != "57014" || !strings.Contains(pe.Message, "lease_timeout") {
		t.Fatalf("got %s %q, want 57014 naming lease_timeout", pe.Code, pe.Message)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("after the cancel: %v", err)
	}
}

// A request that opens a block itself (BEGIN and a statement in one Query)
// is cancelled when the lease ends, as any request outside a block (57014);
// the block it leaves open cannot be held past the lease either, so the
// session then ends with 25P04 (within the cancel grace), counted once.
func TestLeaseRequestThatOpensBlock(t *testing.T) {
	t.Parallel()
	p := startLeasePool(t, 600*time.Millisecond)
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)
	_, err := c.Exec(ctx, "BEGIN; SELECT pg_sleep(5)")
	if pe := toPgErr(t, err, "BEGIN; sleep"); pe.Code != "57014" || !strings.Contains(pe.Message, "lease_timeout") {
		t.Fatalf("got %s %q, want 57014 naming lease_timeout", pe.Code, pe.Message)
	}
	eventually(t, 10*time.Second, "the session ended", func() bool {
		_, err := c.Exec(ctx, "SELECT 1")
		if err == nil {
			return false
		}
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == "25P02" {
			return false // the failed block, until the lease's end is acted on
		}
		pe := toPgErr(t, err, "after the cancel")
		if pe.Code != "25P04" || pe.Severity != "FATAL" || !strings.Contains(pe.Message, "lease_timeout") {
			t.Fatalf("got %s %s %q, want FATAL 25P04 naming lease_timeout", pe.Severity, pe.Code, pe.Message)
		}
		return true
	})
	if n := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["lease"]; n != 1 {
		t.Errorf("lease timeouts %d, want 1", n)
	}
}

// The same with a client that keeps sending requests into its failed block
// without a pause: a request of its in flight when the cancel grace ends
// is a later one, not the cancelled request unanswered, and the session
// ends with 25P04 all the same (it once ended with "the server did not
// answer the cancel request").
func TestLeaseRequestThatOpensBlockBusyClient(t *testing.T) {
	t.Parallel()
	p := startLeasePool(t, 600*time.Millisecond)
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)
	_, err := c.Exec(ctx, "BEGIN; SELECT pg_sleep(5)")
	if pe := toPgErr(t, err, "BEGIN; sleep"); pe.Code != "57014" {
		t.Fatalf("got %s %q, want 57014", pe.Code, pe.Message)
	}
	for {
		_, err := c.Exec(ctx, "SELECT 1")
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == "25P02" {
			continue
		}
		pe := toPgErr(t, err, "after the cancel")
		if pe.Code != "25P04" || pe.Severity != "FATAL" {
			t.Fatalf("got %s %s %q, want FATAL 25P04", pe.Severity, pe.Code, pe.Message)
		}
		return
	}
}
