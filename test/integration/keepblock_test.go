package integration

// A request that changes the transaction status itself (opens a block, or
// ends one and runs more) and loses its backend mid-way (issue #31, hole
// 3): the keep decision (internal/proxy/keep.go) must follow what the
// request may have done, not only the status it started in. Either the
// client is left in a failed block (its next statements 25P02, its COMMIT
// answering ROLLBACK) or, where something may have committed, its session
// ends; nothing is ever committed that the client did not see committed.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
)

// killedDuring runs fn, whose request sleeps with marker in its text, and
// terminates that backend while it runs; it returns fn's error.
func killedDuring(t *testing.T, marker string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	keepKill(t, marker)
	return <-done
}

// simpleQuery sends sql as one simple Query and reads all of its results.
func simpleQuery(ctx context.Context, c *pgx.Conn, sql string) error {
	_, err := c.PgConn().Exec(ctx, sql).ReadAll()
	return err
}

// tableRows returns the values of column v of table, read directly from
// PostgreSQL.
func tableRows(t *testing.T, ctx context.Context, table string) []string {
	t.Helper()
	rows, err := relayDirect(t).Query(ctx, "SELECT v FROM "+table+" ORDER BY v")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// sessionEnded reports whether err, the answer to a request whose backend
// was lost, ended c's session (a FATAL, or the connection closed); an
// ERROR that keeps it reports false, anything else fails the test.
func sessionEnded(t *testing.T, ctx context.Context, c *pgx.Conn, err error) bool {
	t.Helper()
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Severity == "ERROR" {
		return false
	}
	if err == nil {
		t.Fatal("the request whose backend was lost succeeded")
	}
	eventually(t, 5*time.Second, "the client connection to be closed", func() bool {
		_, err := c.Exec(ctx, "SELECT 1")
		return err != nil && c.IsClosed()
	})
	return true
}

// failedBlockAfterLoss checks that c, which got the loss as an ERROR, is
// in a failed block: INSERT 'second' gets 25P02 and COMMIT answers
// ROLLBACK (before the fix: the INSERT ran in autocommit and committed).
func failedBlockAfterLoss(t *testing.T, ctx context.Context, c *pgx.Conn, table string) {
	t.Helper()
	_, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES ('second')")
	if err == nil {
		t.Error("INSERT after the lost BEGIN ran: the client was not left in a failed block")
	} else {
		keepErr(t, err, "25P02", "statement after the lost BEGIN")
	}
	tag, err := c.Exec(ctx, "COMMIT")
	if err != nil || tag.String() != "ROLLBACK" {
		t.Errorf("COMMIT after the lost BEGIN: %q, %v; want ROLLBACK", tag.String(), err)
	}
}

// A simple Query that opens a block and dies before its answer:
// `BEGIN; INSERT 'first'; SELECT pg_sleep` (pgjdbc's shape in one Query).
// The client gets ERROR 08006 and a failed block; neither 'first' nor the
// 'second' it inserts next is committed (before: ERROR 08007 and idle,
// 'second' ran in autocommit and committed, its COMMIT answered COMMIT).
func TestKeepLostBeginSimple(t *testing.T) {
	p := startKeep(t, nil)
	table := relayTable(t, "v text")
	c := p.connect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	err := killedDuring(t, "keep_begin_simple", func() error {
		return simpleQuery(ctx, c, "BEGIN; INSERT INTO "+table+" VALUES ('first'); SELECT pg_sleep(20) /* keep_begin_simple */")
	})
	pe := keepErr(t, err, "08006", "lost request that opened a block")
	if !strings.Contains(pe.Detail, "rolled back") {
		t.Errorf("detail %q does not say the transaction was rolled back", pe.Detail)
	}
	failedBlockAfterLoss(t, ctx, c, table)
	if vs := tableRows(t, ctx, table); len(vs) != 0 {
		t.Fatalf("committed %v, none of which the client saw committed", vs)
	}
}

// The same through the extended protocol, pgjdbc's shape: Parse, Bind,
// Execute of BEGIN, of the INSERT and of the sleep, then one Sync; with
// unnamed statements (as pgjdbc sends BEGIN) and with statements prepared
// before under names (pgjdbc past prepareThreshold).
func TestKeepLostBeginExtended(t *testing.T) {
	p := startKeep(t, nil)
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("named=%v", named), func(t *testing.T) {
			table := relayTable(t, "v text")
			c := p.connect(t)
			ctx := ctxTimeout(t, 30*time.Second)
			marker := fmt.Sprintf("keep_begin_ext_%v", named)
			sqls := lostBeginSQL(table, marker)
			if named {
				prepareAll(t, ctx, c, sqls)
			}
			lostBeginGroup(t, ctx, c, table, marker, sqls, named)
		})
	}
}

// With max_prepared_statements 0 poolerd does not map statements, and
// reads no Bind: the Parse texts of the Sync group say what its Executes
// run, and as the statement an Execute runs is not known for sure, it may
// commit: the session ends (before: ERROR 08007 and idle).
func TestKeepLostBeginExtendedUntracked(t *testing.T) {
	p := startKeep(t, func(c *config.Config) { c.MaxPreparedStatements = 0 })
	table := relayTable(t, "v text")
	c := p.connect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	err := sendKilledGroup(t, ctx, c, "keep_begin_untracked", lostBeginSQL(table, "keep_begin_untracked"), false)
	if !sessionEnded(t, ctx, c, err) {
		keepErr(t, err, "08006", "lost Sync group that opened a block")
		failedBlockAfterLoss(t, ctx, c, table)
	}
	if vs := tableRows(t, ctx, table); len(vs) != 0 {
		t.Fatalf("committed %v, none of which the client saw committed", vs)
	}
}

// The statements a client prepared before its poolerd handed it over
// (--takeover) are known for what they do to the transaction status on
// the new one: the lost Sync group that BEGINs by name leaves a failed
// block there too.
func TestKeepLostBeginAfterHandOver(t *testing.T) {
	oldP := startKeep(t, nil)
	newP := startKeep(t, nil)
	table := relayTable(t, "v text")
	c := oldP.connect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	sqls := lostBeginSQL(table, "keep_begin_handover")
	prepareAll(t, ctx, c, sqls)
	passed, done := handOver(ctx, oldP, newP)
	select {
	case <-passed:
	case <-time.After(10 * time.Second):
		t.Fatal("the client was not handed over")
	}
	if err := <-done; err != nil {
		t.Fatalf("HandOver: %v", err)
	}
	lostBeginGroup(t, ctx, c, table, "keep_begin_handover", sqls, true)
}

// lostBeginSQL is pgjdbc's request that opens a block: BEGIN, an INSERT of
// 'first' into table, and a sleep marked with marker.
func lostBeginSQL(table, marker string) []string {
	return []string{"BEGIN", "INSERT INTO " + table + " VALUES ('first')", "SELECT pg_sleep(20) /* " + marker + " */"}
}

// prepareAll prepares sqls on c as statements s0, s1, ...
func prepareAll(t *testing.T, ctx context.Context, c *pgx.Conn, sqls []string) {
	t.Helper()
	for i, sql := range sqls {
		if _, err := c.PgConn().Prepare(ctx, fmt.Sprintf("s%d", i), sql, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// lostBeginGroup sends sqls in one Sync group whose backend is terminated
// during the last one (sendKilledGroup), and checks that c is left in a
// failed block and that nothing reached table.
func lostBeginGroup(t *testing.T, ctx context.Context, c *pgx.Conn, table, marker string, sqls []string, named bool) {
	t.Helper()
	err := sendKilledGroup(t, ctx, c, marker, sqls, named)
	pe := keepErr(t, err, "08006", "lost Sync group that opened a block")
	if !strings.Contains(pe.Detail, "rolled back") {
		t.Errorf("detail %q does not say the transaction was rolled back", pe.Detail)
	}
	failedBlockAfterLoss(t, ctx, c, table)
	if vs := tableRows(t, ctx, table); len(vs) != 0 {
		t.Fatalf("committed %v, none of which the client saw committed", vs)
	}
}

// sendKilledGroup sends sqls (the statements prepared as s0, s1, ... when
// named) in one Sync group and terminates its backend during the last one
// (marked with marker); it returns the first error c got.
func sendKilledGroup(t *testing.T, ctx context.Context, c *pgx.Conn, marker string, sqls []string, named bool) error {
	t.Helper()
	var first error
	return killedDuring(t, marker, func() error {
		pl := c.PgConn().StartPipeline(ctx)
		for i, sql := range sqls {
			if named {
				pl.SendQueryPrepared(fmt.Sprintf("s%d", i), nil, nil, nil)
			} else {
				pl.SendQueryParams(sql, nil, nil, nil, nil)
			}
		}
		pl.SendPipelineSync()
		if err := pl.Flush(); err != nil {
			return err
		}
		for {
			res, err := pl.GetResults()
			if rr, ok := res.(*pgconn.ResultReader); ok && err == nil {
				_, err = rr.Close()
			}
			if err != nil && first == nil {
				first = err
			}
			var pe *pgconn.PgError
			if _, ok := res.(*pgconn.PipelineSync); ok || err != nil && !errors.As(err, &pe) {
				break
			}
		}
		if err := pl.Close(); err != nil && first == nil {
			first = err
		}
		return first
	})
}

// Inside a block, `ROLLBACK; INSERT ...; SELECT pg_sleep` ends the block
// and runs statements outside it, which commit on their own: the client
// must not be told its request was rolled back; its session ends (before:
// ERROR 08006 "rolled back" and a failed block). With the server's answer
// held past server_response_timeout, the INSERT after the ROLLBACK really
// did commit on the server while the client was told it did not.
func TestKeepLostAfterRollbackInBlock(t *testing.T) {
	t.Run("killed", func(t *testing.T) {
		p := startKeep(t, nil)
		table := relayTable(t, "v text")
		c := p.connect(t)
		ctx := ctxTimeout(t, 30*time.Second)
		if err := simpleQuery(ctx, c, "BEGIN; INSERT INTO "+table+" VALUES ('in block')"); err != nil {
			t.Fatal(err)
		}
		err := killedDuring(t, "keep_after_rollback", func() error {
			return simpleQuery(ctx, c, "ROLLBACK; INSERT INTO "+table+" VALUES ('after'); SELECT pg_sleep(20) /* keep_after_rollback */")
		})
		if !sessionEnded(t, ctx, c, err) {
			t.Fatalf("statements after ROLLBACK lost mid-way: got %v with the session kept; they may have committed", err)
		}
		if vs := tableRows(t, ctx, table); len(vs) != 0 {
			t.Fatalf("committed %v, none of which the client saw committed", vs)
		}
	})
	t.Run("held", func(t *testing.T) {
		fp := toStartProxy(t)
		p := toStartViaProxy(t, fp, func(c *config.Config) {
			c.PoolMode = config.PoolTransaction
			c.ServerResponseTimeout = 500 * time.Millisecond
			c.MaxSize = 2
		})
		table := relayTable(t, "v text")
		c := p.connect(t)
		ctx := ctxTimeout(t, 30*time.Second)
		if err := simpleQuery(ctx, c, "BEGIN; INSERT INTO "+table+" VALUES ('in block')"); err != nil {
			t.Fatal(err)
		}
		fp.HoldResponses(true)
		err := simpleQuery(ctx, c, "ROLLBACK; INSERT INTO "+table+" VALUES ('after')")
		ended := sessionEnded(t, ctx, c, err)
		fp.HoldResponses(false)
		vs := tableRows(t, ctx, table)
		if !ended && len(vs) != 0 {
			t.Fatalf("the client was told %v and kept its session, yet %v committed", err, vs)
		}
	})
}

// `COMMIT; BEGIN; INSERT 'first'; SELECT pg_sleep` from outside a block:
// a block boundary after a statement that may commit, the block left open.
// The client is not told it is outside a block (before: ERROR 08007 and
// idle, its next INSERT committed on its own); here the session ends.
func TestKeepLostCommitThenBegin(t *testing.T) {
	p := startKeep(t, nil)
	table := relayTable(t, "v text")
	c := p.connect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	err := killedDuring(t, "keep_commit_begin", func() error {
		return simpleQuery(ctx, c, "COMMIT; BEGIN; INSERT INTO "+table+" VALUES ('first'); SELECT pg_sleep(20) /* keep_commit_begin */")
	})
	if !sessionEnded(t, ctx, c, err) {
		// Kept: it must at least be a failed block.
		failedBlockAfterLoss(t, ctx, c, table)
	}
	if vs := tableRows(t, ctx, table); len(vs) != 0 {
		t.Fatalf("committed %v, none of which the client saw committed", vs)
	}
}

// A client left in a failed block (its server lost while it was idle in a
// transaction) whose next requests find no server (PostgreSQL unreachable)
// must not stay in a block no request can end: with the ROLLBACK refused
// for want of a server, every later BEGIN was answered 25P02 once
// PostgreSQL was back, forever (the soak's 60,505 25P02: a pgx loop whose
// Begin failed and which so never sent ROLLBACK again). Its session now
// ends there, as a direct connection to a server that went away does.
func TestKeepFailedBlockWithoutServer(t *testing.T) {
	t.Parallel()
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.CheckoutTimeout = time.Second
		c.ServerConnectTimeout = time.Second
	})
	ctx := ctxTimeout(t, time.Minute)
	c := connectDSN(t, p.appDSN())
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// The server connection goes, and no new one can be opened.
	if err := fp.Pause(); err != nil {
		t.Fatal(err)
	}
	fp.ResetAll()
	_, err := c.Exec(ctx, "SELECT 2")
	if pe := toPgErr(t, err, "the request after the loss"); pe.Code != "08006" {
		t.Fatalf("the request after the loss: %v, want 08006", err)
	}
	_, err = c.Exec(ctx, "ROLLBACK")
	if err := fp.Resume(); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("ROLLBACK answered without a server")
	}
	// The session ends at the first request that finds no server: the
	// one told of the loss (after that ERROR) or the ROLLBACK.
	if !c.IsClosed() {
		if pe := toPgErr(t, err, "ROLLBACK without a server"); pe.Severity != "FATAL" || pe.Code != "08006" || pe.Hint == "" {
			t.Errorf("ROLLBACK without a server: %v, want FATAL 08006 with a hint", err)
		}
	}
	if !sessionEnded(t, ctx, c, err) {
		// Kept: then it must be able to end its block now that
		// PostgreSQL is back.
		other := connectDSN(t, p.appDSN())
		eventually(t, 20*time.Second, "PostgreSQL reachable again", func() bool {
			_, err := other.Exec(ctx, "SELECT 1")
			return err == nil
		})
		for i := range 3 {
			_, err := c.Exec(ctx, "BEGIN")
			if err != nil {
				t.Fatalf("BEGIN %d after the outage, in a session kept after a refused ROLLBACK: %v", i, err)
			}
			_, _ = c.Exec(ctx, "ROLLBACK")
		}
	}
}
