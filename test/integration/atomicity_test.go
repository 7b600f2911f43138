package integration

// Atomicity when a server dies: once a client is inside a transaction block
// or has requests in flight, everything it sends goes to the server
// connection it holds, or to none (docs/architecture.md, "Atomicity"). These
// tests kill backends and restart PostgreSQL under clients that sit inside
// transactions, and then check the tables: no statement of a broken
// transaction ever ran on another server connection.
//
// Both stop the shared server's backends of their own database, and the
// stress test restarts PostgreSQL: they do not call t.Parallel (see
// outage_test.go for why that makes them run alone).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
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

// atomDB creates a database of the test's own, owned by app, with the
// accounts and transfers tables, and returns its name.
func atomDB(t *testing.T, accounts, balance int) string {
	t.Helper()
	ctx := ctxTimeout(t, 60*time.Second)
	db := fmt.Sprintf("atom_%d", time.Now().UnixNano()%1e9)
	if err := pg.Exec(ctx, "postgres", "CREATE DATABASE "+db+" OWNER app"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = pg.Exec(ctx, "postgres", "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
	})
	c, err := pgx.Connect(ctx, pg.DSN(pgtest.RoleApp, pgtest.Password, db))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO accounts SELECT g, %d FROM generate_series(1, %d) g;
		CREATE TABLE transfers (id bigint PRIMARY KEY, src int NOT NULL, dst int NOT NULL, amount int NOT NULL);
		CREATE TABLE ledger (client int NOT NULL, round int NOT NULL)`, balance, accounts)); err != nil {
		t.Fatal(err)
	}
	return db
}

// killBackends terminates app's backends of db (not the caller's own).
func killBackends(ctx context.Context, super *pgx.Conn, db string) (int, error) {
	var n int
	err := super.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE datname = $1 AND usename = 'app' AND pid <> pg_backend_pid()`, db).Scan(&n)
	return n, err
}

// TestAtomicityKillRace is the race of the issue "Atomicity when a server
// dies": clients inside BEGIN; UPDATE have their backends terminated while
// each sends an INSERT within a few milliseconds of the kill, and nobody
// sends COMMIT. No INSERT may be committed (before the fix, 15 of 160 were).
//
// POOLERD_KILLRACE_ROUNDS sets the rounds (default 20, 8 tries each).
func TestAtomicityKillRace(t *testing.T) {
	const clients = 8
	rounds := 20
	if v := os.Getenv("POOLERD_KILLRACE_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("POOLERD_KILLRACE_ROUNDS=%q: want a positive number", v)
		}
		rounds = n
	}
	db := atomDB(t, clients, 1000)
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, db)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = clients
		c.LogLevel = "info"
	})
	ctx := ctxTimeout(t, 3*time.Minute+time.Duration(rounds)*2*time.Second)
	super, err := pgx.Connect(ctx, pg.SuperDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(context.Background())
	dsn := p.dsn(pgtest.RoleApp, pgtest.Password, db, "default_query_exec_mode=simple_protocol")

	tries, clientErrs := 0, 0
	for round := range rounds {
		conns := make([]*pgx.Conn, clients)
		for i := range conns {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatalf("round %d: connect: %v", round, err)
			}
			if _, err := c.Exec(ctx, "BEGIN; UPDATE accounts SET balance = balance - 1 WHERE id = $1", i+1); err != nil {
				t.Fatalf("round %d: BEGIN; UPDATE: %v", round, err)
			}
			conns[i] = c
		}
		killAt := time.Now().Add(20 * time.Millisecond)
		var wg sync.WaitGroup
		var errs atomic.Int32
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Within ±3 ms of the kill.
				time.Sleep(time.Until(killAt) + time.Duration(rand.IntN(6000)-3000)*time.Microsecond)
				ictx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if _, err := c.Exec(ictx, "INSERT INTO ledger VALUES ($1, $2)", i, round); err != nil {
					errs.Add(1)
				}
			}()
		}
		time.Sleep(time.Until(killAt))
		if _, err := killBackends(ctx, super, db); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for _, c := range conns {
			_ = c.Close(context.Background())
		}
		tries += clients
		clientErrs += int(errs.Load())
	}
	var committed int
	if err := super.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&committed); err != nil {
		t.Fatal(err)
	}
	var sum int64
	if err := super.QueryRow(ctx, "SELECT sum(balance) FROM accounts").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d INSERTs sent inside transactions whose backend was terminated, %d answered with an error, %d committed", tries, clientErrs, committed)
	if committed != 0 {
		t.Errorf("%d of %d INSERTs committed although their transaction never sent COMMIT", committed, tries)
	}
	if sum != clients*1000 {
		t.Errorf("accounts sum to %d, want %d: an UPDATE of an uncommitted transaction was committed", sum, clients*1000)
	}
}

// transferOutcome is what a client of the stress test knows about one
// transfer.
type transferOutcome int

const (
	// outcomeAcked: COMMIT answered COMMIT.
	outcomeAcked transferOutcome = iota
	// outcomeFailed: the client saw an error before its COMMIT could
	// have run: the transfer must not be in the table.
	outcomeFailed
	// outcomeUnknown: the connection failed while COMMIT was under way.
	outcomeUnknown
)

// stressDuration is how long TestAtomicityStress runs: 30 s in make test,
// longer with POOLERD_STRESS_DURATION (make soak).
func stressDuration(t *testing.T) time.Duration {
	if v := os.Getenv("POOLERD_STRESS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("POOLERD_STRESS_DURATION=%q: %v", v, err)
		}
		return d
	}
	if testing.Short() {
		return 5 * time.Second
	}
	return 30 * time.Second
}

// TestAtomicityStress runs bank transfers through poolerd from clients using
// the simple, extended, prepared and pipelined protocols, while backends are
// terminated in a loop and PostgreSQL is restarted. At the end: no transfer
// whose client saw an error before COMMIT is in the table, every
// acknowledged one is, and every account's balance is what the transfer
// rows say.
func TestAtomicityStress(t *testing.T) {
	const accounts, initial = 20, 10000
	modes := []string{"simple_protocol", "exec", "cache_statement", "pipeline"}
	const clientsPerMode = 3
	dur := stressDuration(t)
	db := atomDB(t, accounts, initial)
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, db)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 8
		c.CheckoutTimeout = 20 * time.Second
		c.LogLevel = "info"
	})
	ctx := ctxTimeout(t, dur+3*time.Minute)
	runCtx, stop := context.WithTimeout(ctx, dur)
	defer stop()

	var nextID atomic.Int64
	var mu sync.Mutex
	outcomes := map[int64]transferOutcome{}
	notes := map[int64]string{}
	record := func(id int64, o transferOutcome, note string) {
		mu.Lock()
		outcomes[id] = o
		notes[id] = note
		mu.Unlock()
	}

	var wg sync.WaitGroup
	for mi, mode := range modes {
		for w := range clientsPerMode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(mi), uint64(w)))
				stressClient(runCtx, p, db, mode, rng, &nextID, record, accounts)
			}()
		}
	}

	// Chaos: terminate backends every 30-250 ms, restart PostgreSQL every
	// third of the run.
	kills, restarts := 0, 0
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		rng := rand.New(rand.NewPCG(7, 7))
		nextRestart := time.Now().Add(dur / 3)
		var super *pgx.Conn
		defer func() {
			if super != nil {
				_ = super.Close(context.Background())
			}
		}()
		for runCtx.Err() == nil {
			time.Sleep(time.Duration(30+rng.IntN(220)) * time.Millisecond)
			if time.Now().After(nextRestart) && time.Until(time.Now().Add(dur)) > 0 {
				nextRestart = time.Now().Add(dur / 3)
				if super != nil {
					_ = super.Close(context.Background())
					super = nil
				}
				if err := pg.Restart(); err != nil {
					t.Errorf("restart PostgreSQL: %v", err)
					return
				}
				restarts++
				continue
			}
			if super == nil {
				c, err := pgx.Connect(ctx, pg.SuperDSN(db))
				if err != nil {
					continue
				}
				super = c
			}
			n, err := killBackends(ctx, super, db)
			if err != nil {
				_ = super.Close(context.Background())
				super = nil
				continue
			}
			kills += n
		}
	}()
	wg.Wait()
	<-chaosDone

	check, err := pgx.Connect(ctx, pg.SuperDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(context.Background())
	inTable := map[int64]bool{}
	rows, err := check.Query(ctx, "SELECT id FROM transfers")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		inTable[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var acked, failed, unknown, failedCommitted, ackedMissing int
	for id, o := range outcomes {
		switch o {
		case outcomeAcked:
			acked++
			if !inTable[id] {
				ackedMissing++
			}
		case outcomeFailed:
			failed++
			if inTable[id] {
				failedCommitted++
				if failedCommitted <= 5 {
					t.Logf("transfer %d committed after its client saw: %s", id, notes[id])
				}
			}
		case outcomeUnknown:
			unknown++
		}
	}
	var badAccounts int
	var report strings.Builder
	rows, err = check.Query(ctx, `SELECT a.id, a.balance,
			$1 - coalesce((SELECT sum(amount) FROM transfers WHERE src = a.id), 0)
			   + coalesce((SELECT sum(amount) FROM transfers WHERE dst = a.id), 0)
		FROM accounts a ORDER BY a.id`, initial)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		var bal, want int64
		if err := rows.Scan(&id, &bal, &want); err != nil {
			t.Fatal(err)
		}
		if bal != want {
			badAccounts++
			fmt.Fprintf(&report, "\n  account %d: balance %d, transfer rows say %d", id, bal, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d transfers acknowledged, %d failed before COMMIT, %d with COMMIT in doubt; %d backends terminated, %d restarts; "+
		"failed but committed: %d, acknowledged but missing: %d, accounts off: %d",
		dur, acked, failed, unknown, kills, restarts, failedCommitted, ackedMissing, badAccounts)
	if acked == 0 || failed == 0 {
		t.Errorf("the run proves little: %d acknowledged, %d failed", acked, failed)
	}
	if failedCommitted > 0 {
		t.Errorf("%d transfers whose client saw an error before COMMIT were committed", failedCommitted)
	}
	if ackedMissing > 0 {
		t.Errorf("%d acknowledged transfers are missing", ackedMissing)
	}
	if badAccounts > 0 {
		t.Errorf("%d accounts do not match their transfer rows:%s", badAccounts, report.String())
	}
}

// stressClient runs transfers until ctx ends, reconnecting after any error.
func stressClient(ctx context.Context, p *instance, db, mode string, rng *rand.Rand, nextID *atomic.Int64,
	record func(int64, transferOutcome, string), accounts int) {
	execMode := mode
	if mode == "pipeline" {
		execMode = "exec"
	}
	dsn := p.dsn(pgtest.RoleApp, pgtest.Password, db, "default_query_exec_mode="+execMode)
	var c *pgx.Conn
	defer func() {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			nc, err := pgx.Connect(cctx, dsn)
			cancel()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			c = nc
		}
		id := nextID.Add(1)
		src := 1 + rng.IntN(accounts)
		dst := 1 + (src+rng.IntN(accounts-1))%accounts
		amount := 1 + rng.IntN(100)
		// Not ctx: a transfer under way finishes when the run ends.
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var o transferOutcome
		var note string
		if mode == "pipeline" {
			o, note = pipelinedTransfer(tctx, c.PgConn(), id, src, dst, amount)
		} else {
			o, note = transfer(tctx, c, id, src, dst, amount)
		}
		cancel()
		record(id, o, mode+": "+note)
		if o != outcomeAcked {
			_ = c.Close(context.Background())
			c = nil
		}
	}
}

// transfer runs one transfer statement by statement.
func transfer(ctx context.Context, c *pgx.Conn, id int64, src, dst, amount int) (transferOutcome, string) {
	steps := []struct {
		sql  string
		args []any
	}{
		{"BEGIN", nil},
		{"UPDATE accounts SET balance = balance - $1 WHERE id = $2", []any{amount, src}},
		{"UPDATE accounts SET balance = balance + $1 WHERE id = $2", []any{amount, dst}},
		{"INSERT INTO transfers VALUES ($1, $2, $3, $4)", []any{id, src, dst, amount}},
	}
	for _, s := range steps {
		if _, err := c.Exec(ctx, s.sql, s.args...); err != nil {
			return outcomeFailed, s.sql + ": " + err.Error()
		}
	}
	tag, err := c.Exec(ctx, "COMMIT")
	switch {
	case err != nil:
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Severity == "ERROR" {
			return outcomeFailed, "COMMIT itself refused: nothing committed"
		}
		return outcomeUnknown, "COMMIT: " + err.Error()
	case tag.String() != "COMMIT":
		return outcomeFailed, "COMMIT answered " + tag.String() // the transaction had failed
	}
	return outcomeAcked, ""
}

// pipelinedTransfer sends the whole transfer at once, a Sync after each
// statement, and reads the results in order.
func pipelinedTransfer(ctx context.Context, c *pgconn.PgConn, id int64, src, dst, amount int) (transferOutcome, string) {
	ids := []byte(fmt.Sprint(id))
	sqls := []struct {
		sql  string
		args [][]byte
	}{
		{"BEGIN", nil},
		{"UPDATE accounts SET balance = balance - $1 WHERE id = $2", [][]byte{[]byte(fmt.Sprint(amount)), []byte(fmt.Sprint(src))}},
		{"UPDATE accounts SET balance = balance + $1 WHERE id = $2", [][]byte{[]byte(fmt.Sprint(amount)), []byte(fmt.Sprint(dst))}},
		{"INSERT INTO transfers VALUES ($1, $2, $3, $4)", [][]byte{ids, []byte(fmt.Sprint(src)), []byte(fmt.Sprint(dst)), []byte(fmt.Sprint(amount))}},
		{"COMMIT", nil},
	}
	pl := c.StartPipeline(ctx)
	defer pl.Close()
	for _, s := range sqls {
		pl.SendQueryParams(s.sql, s.args, nil, nil, nil)
		pl.SendPipelineSync()
	}
	if err := pl.Flush(); err != nil {
		return outcomeUnknown, "COMMIT may have gone out"
	}
	// Each statement's result, then its Sync.
	for i := range sqls {
		last := i == len(sqls)-1
		note := fmt.Sprintf("result %d", i)
		res, err := pl.GetResults()
		if err != nil {
			if last {
				return outcomeUnknown, note + ": " + err.Error()
			}
			return outcomeFailed, note + ": " + err.Error()
		}
		rr, ok := res.(*pgconn.ResultReader)
		if !ok {
			if last {
				return outcomeUnknown, fmt.Sprintf("%s: %T", note, res)
			}
			return outcomeFailed, fmt.Sprintf("%s: %T", note, res)
		}
		tag, err := rr.Close()
		if err != nil {
			var pgErr *pgconn.PgError
			if last && !(errors.As(err, &pgErr) && pgErr.Severity == "ERROR") {
				return outcomeUnknown, note + ": " + err.Error()
			}
			return outcomeFailed, note + ": " + err.Error()
		}
		if last && tag.String() != "COMMIT" {
			return outcomeFailed, "COMMIT answered " + tag.String()
		}
		if _, err := pl.GetResults(); err != nil { // the Sync
			if last {
				return outcomeAcked, "" // COMMIT was answered COMMIT
			}
			return outcomeFailed, note + " sync: " + err.Error()
		}
	}
	return outcomeAcked, ""
}

// TestClientLeavesMidResult: a client that closes its socket while a large
// result streams. Its query is cancelled while the backend still exists
// (PostgreSQL logs no unmatched cancel request), the rest of the result is
// dropped, and the server connection is closed under the eviction reason
// client_left_mid_request (before, the reader took the leftover bytes for a
// surprise and closed the connection as server_closed, ahead of the cancel).
func TestClientLeavesMidResult(t *testing.T) {
	const rounds = 5
	db := atomDB(t, 1, 0)
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, db)
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 2
		c.LogLevel = "info"
	})
	ctx := ctxTimeout(t, 2*time.Minute)
	dsn := p.dsn(pgtest.RoleApp, pgtest.Password, db)
	marker := fmt.Sprintf("left_mid_result_%d", time.Now().UnixNano())
	const unmatched = "in cancel request did not match any process"
	unmatchedBefore := strings.Count(pg.LogTail(1<<20), unmatched)
	for range rounds {
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		rr := c.ExecParams(ctx, "SELECT repeat('x', 1000), '"+marker+"' FROM generate_series(1, 5000000)", nil, nil, nil, nil)
		for i := 0; i < 100 && rr.NextRow(); i++ {
		}
		// Close the socket, no Terminate: a client that crashed or was
		// killed mid-read.
		_ = c.Conn().Close()
		_, _ = rr.Close()
		_ = c.Close(context.Background())
	}
	eventually(t, 30*time.Second, "every mid-result server connection evicted", func() bool {
		return p.poolStats(t, db, pgtest.RoleApp).Evictions["client_left_mid_request"] == rounds
	})
	st := p.poolStats(t, db, pgtest.RoleApp)
	if n := st.Evictions["server_closed"]; n != 0 {
		t.Errorf("%d connections evicted as server_closed, want 0 (evictions %v)", n, st.Evictions)
	}
	// Nothing of the queries runs on: they were cancelled, not left to
	// finish their 5 GB.
	super, err := pgx.Connect(ctx, pg.SuperDSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(context.Background())
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var left string
		err := super.QueryRow(ctx, `SELECT coalesce(string_agg(format('pid %s %s wait %s/%s port %s since %s', pid, state, wait_event_type, wait_event, client_port, backend_start), '; '), '')
			FROM pg_stat_activity WHERE query LIKE '%'||$1||'%' AND pid <> pg_backend_pid()`, marker).Scan(&left)
		if err == nil && left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for the cancelled queries gone from pg_stat_activity; left: %s (err %v)", left, err)
		}
	}
	if n := strings.Count(pg.LogTail(1<<20), unmatched) - unmatchedBefore; n > 0 {
		t.Errorf("PostgreSQL got %d cancel requests for backends already gone", n)
	}
}
