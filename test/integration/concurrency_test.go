package integration

// Tests of many clients sharing few server connections, and of clients that
// vanish while they hold one.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// 200 clients, each with its own connection, run 20 transactions each over
// a pool of 5 server connections.
func TestConcurrencyManyClients(t *testing.T) {
	t.Parallel()
	const clients, txs = 200, 20
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 5
		c.CheckoutTimeout = 30 * time.Second
	})
	tbl := relayTable(t, "client_id int NOT NULL, i int NOT NULL")
	ctx := ctxTimeout(t, 60*time.Second)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstErr != nil
	}
	insert := fmt.Sprintf("INSERT INTO %s (client_id, i) VALUES ($1::int, $2::int)", tbl)
	count := fmt.Sprintf("SELECT count(*) FROM %s WHERE client_id = $1::int", tbl)
	for id := 0; id < clients; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pgx.Connect(ctx, p.appDSN(txExecMode))
			if err != nil {
				fail(fmt.Errorf("client %d: connect: %w", id, err))
				return
			}
			defer c.Close(context.Background())
			for i := 0; i < txs && !failed(); i++ {
				err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, insert, id, i); err != nil {
						return fmt.Errorf("insert: %w", err)
					}
					var n int
					if err := tx.QueryRow(ctx, count, id).Scan(&n); err != nil {
						return fmt.Errorf("count: %w", err)
					}
					if n != i+1 {
						return fmt.Errorf("sees %d of its rows, want %d", n, i+1)
					}
					return nil
				})
				if err != nil {
					fail(fmt.Errorf("client %d transaction %d: %w", id, i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	var total, distinct int
	if err := relayDirect(t).QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(DISTINCT (client_id, i)) FROM %s", tbl)).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != clients*txs || distinct != clients*txs {
		t.Fatalf("table has %d rows (%d distinct), want %d", total, distinct, clients*txs)
	}
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	if st.Total > 5 || st.PeakActive > 5 {
		t.Fatalf("pool exceeded max_size 5: %+v", st)
	}
	// Each transaction needs a checkout, unless the client's next BEGIN
	// arrives before the reader has released the server after COMMIT (the
	// client then keeps it, legitimately); that is rare. Far fewer
	// checkouts mean servers stay attached to clients between
	// transactions.
	if st.Acquisitions < clients*txs/2 {
		t.Fatalf("only %d checkouts for %d transactions: servers are not released between transactions", st.Acquisitions, clients*txs)
	}
	p.waitNoActive(t, pgtest.DBApp)
}

// backendState returns the state of a backend in pg_stat_activity, or ""
// if it is gone.
func backendState(t *testing.T, direct *pgx.Conn, pid int) string {
	t.Helper()
	ctx := ctxTimeout(t, 5*time.Second)
	var state *string
	err := direct.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	if state == nil {
		return "(null)"
	}
	return *state
}

// updateWithLockTimeout updates row id in its own transaction with the
// given lock_timeout, and returns how long it took.
func updateWithLockTimeout(t *testing.T, c *pgx.Conn, tbl string, id int, lockTimeout string) time.Duration {
	t.Helper()
	ctx := ctxTimeout(t, 20*time.Second)
	start := time.Now()
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, fmt.Sprintf("UPDATE %s SET v = v + 1 WHERE id = $1::int", tbl), id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("updated %d rows", tag.RowsAffected())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("update of the row the dead client locked: %v (after %s)", err, time.Since(start))
	}
	return time.Since(start)
}

// A client that disappears in the middle of a transaction (no Terminate)
// must not leave its locks or an idle-in-transaction backend behind.
func TestConcurrencyClientKilledInTransaction(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	tbl := relayTable(t, "id int PRIMARY KEY, v int NOT NULL")
	direct := relayDirect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := direct.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (1, 0)", tbl)); err != nil {
		t.Fatal(err)
	}

	a := p.connect(t, txExecMode)
	if _, err := a.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var pid, v int
	if err := a.QueryRow(ctx, fmt.Sprintf("SELECT pg_backend_pid(), v FROM %s WHERE id = 1 FOR UPDATE", tbl)).Scan(&pid, &v); err != nil {
		t.Fatal(err)
	}
	if st := backendState(t, direct, pid); st != "idle in transaction" {
		t.Fatalf("a's backend is %q, want idle in transaction", st)
	}
	// Kill the client: close its socket without a Terminate message.
	if err := a.PgConn().Conn().Close(); err != nil {
		t.Fatal(err)
	}

	// Without poolerd ending the dead client's server session the lock
	// would be held until TCP keepalive notices, far beyond lock_timeout.
	// (5s rather than 2s: with the whole package running on a small
	// machine, a backend has been seen to take 2s to exit.)
	b := p.connect(t, txExecMode)
	updateWithLockTimeout(t, b, tbl, 1, "5s")
	eventually(t, 5*time.Second, "the dead client's backend to leave its transaction", func() bool {
		st := backendState(t, direct, pid)
		return !strings.HasPrefix(st, "idle in transaction") && st != "active"
	})
	var got int
	if err := direct.QueryRow(ctx, fmt.Sprintf("SELECT v FROM %s WHERE id = 1", tbl)).Scan(&got); err != nil || got != 1 {
		t.Fatalf("v = %d (%v), want 1", got, err)
	}
	p.waitNoActive(t, pgtest.DBApp)
}

// A client that disappears while its query runs: poolerd must stop the
// query so that the transaction's locks go at once.
func TestConcurrencyClientKilledDuringQuery(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	tbl := relayTable(t, "id int PRIMARY KEY, v int NOT NULL")
	direct := relayDirect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := direct.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES (2, 0)", tbl)); err != nil {
		t.Fatal(err)
	}

	a := p.connect(t, txExecMode)
	if _, err := a.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, fmt.Sprintf("UPDATE %s SET v = v + 10 WHERE id = 2", tbl)); err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Exec(context.Background(), "SELECT pg_sleep(60)")
		aDone <- err
	}()
	eventually(t, 5*time.Second, "a's pg_sleep to run", func() bool {
		var q string
		err := direct.QueryRow(ctx, "SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", pid).Scan(&q)
		return err == nil && strings.Contains(q, "pg_sleep(60)")
	})
	killed := time.Now()
	if err := a.PgConn().Conn().Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-aDone:
	case <-time.After(5 * time.Second):
		t.Fatal("a's Exec did not return after its socket was closed")
	}

	b := p.connect(t, txExecMode)
	// Without a cancel the lock would be held for the rest of the 60s
	// pg_sleep (PostgreSQL notices the closed socket only when the query
	// ends).
	updateWithLockTimeout(t, b, tbl, 2, "10s")
	if d := time.Since(killed); d > 10*time.Second {
		t.Fatalf("the lock was released %s after the client died", d)
	}
	var got int
	if err := direct.QueryRow(ctx, fmt.Sprintf("SELECT v FROM %s WHERE id = 2", tbl)).Scan(&got); err != nil || got != 1 {
		t.Fatalf("v = %d (%v), want 1 (a's update rolled back, b's applied)", got, err)
	}
	eventually(t, 5*time.Second, "the dead client's backend to stop", func() bool {
		st := backendState(t, direct, pid)
		return st != "active" && !strings.HasPrefix(st, "idle in transaction")
	})
	p.waitNoActive(t, pgtest.DBApp)
}

// A client that cannot get a server within checkout_timeout gets 53300 and
// keeps its session.
func TestConcurrencyCheckoutTimeout(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		c.CheckoutTimeout = 300 * time.Millisecond
	})
	a := p.connect(t, txExecMode)
	b := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 20*time.Second)
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		start := time.Now()
		var n int
		err := b.QueryRow(ctx, "SELECT 1", mode).Scan(&n)
		elapsed := time.Since(start)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" {
			t.Fatalf("%v: want 53300, got %v (after %s; pool %+v)", mode, err, elapsed, p.poolStats(t, pgtest.DBApp, pgtest.RoleApp))
		}
		if !strings.Contains(pe.Detail, "total 1") || !strings.Contains(pe.Detail, "waiting") {
			t.Fatalf("%v: detail %q should give the pool's numbers", mode, pe.Detail)
		}
		if !strings.Contains(pe.Hint, "max_size") {
			t.Fatalf("%v: hint %q should mention max_size", mode, pe.Hint)
		}
		if elapsed < 250*time.Millisecond || elapsed > 5*time.Second {
			t.Fatalf("%v: refused after %s, want about checkout_timeout (300ms)", mode, elapsed)
		}
		if b.PgConn().IsClosed() {
			t.Fatalf("%v: the refused client was disconnected", mode)
		}
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		var n int
		if err := b.QueryRow(ctx, "SELECT 2", mode).Scan(&n); err != nil || n != 2 {
			t.Fatalf("%v: after a committed: %d %v (pool %+v)", mode, n, err, p.poolStats(t, pgtest.DBApp, pgtest.RoleApp))
		}
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Timeouts != 2 || st.Total != 1 {
		t.Fatalf("pool counted %d timeouts, want 2 (pool %+v)", st.Timeouts, st)
	}
}
