package integration

// A client in transaction mode keeps its session when the backend serving
// it dies or hangs (internal/proxy/keep.go): outside a transaction block it
// gets an ERROR and its next request runs elsewhere; inside one, an ERROR
// and a failed block until ROLLBACK; a COMMIT in flight still ends the
// session, since its outcome is unknown.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// keepKill terminates, from a direct superuser connection, the backends of
// database app whose running query contains marker, once one does; it
// returns how many it terminated.
func keepKill(t *testing.T, marker string) int {
	t.Helper()
	ctx := ctxTimeout(t, 20*time.Second)
	super := connectDSN(t, pg.SuperDSN(pgtest.DBApp))
	var n int
	eventually(t, 10*time.Second, "a backend running "+marker, func() bool {
		err := super.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE query LIKE '%'||$1||'%' AND pid <> pg_backend_pid() AND state = 'active'`, marker).Scan(&n)
		return err == nil && n > 0
	})
	return n
}

// sleepKilled runs a long pg_sleep marked with marker on c and terminates
// its backend while it runs; it returns what c got.
func sleepKilled(t *testing.T, ctx context.Context, c *pgx.Conn, marker string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, fmt.Sprintf("SELECT pg_sleep(20) /* %s */", marker))
		done <- err
	}()
	keepKill(t, marker)
	return <-done
}

// keepErr checks that err is an ERROR (not FATAL) with code, and returns it.
func keepErr(t *testing.T, err error, code, what string) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: got %v, want ERROR %s", what, err, code)
	}
	if pe.Severity != "ERROR" || pe.Code != code {
		t.Fatalf("%s: got %s %s %q, want ERROR %s", what, pe.Severity, pe.Code, pe.Message, code)
	}
	if strings.HasPrefix(code, "08") && pe.Hint == "" { // poolerd's: 25P02 is PostgreSQL's own
		t.Errorf("%s: no hint", what)
	}
	return pe
}

func startKeep(t *testing.T, extra func(*config.Config)) *instance {
	return startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 4
		if extra != nil {
			extra(c)
		}
	})
}

// Outside a transaction block, a killed backend costs the client one
// ERROR (08007: the statement may have run) and nothing else, in every
// pgx query mode: the next statement runs on another server connection.
func TestKeepKilledOutsideBlock(t *testing.T) {
	p := startKeep(t, nil)
	for _, mode := range []string{"simple_protocol", "exec", "cache_statement", "cache_describe"} {
		t.Run(mode, func(t *testing.T) {
			c := p.connect(t, "default_query_exec_mode="+mode)
			ctx := ctxTimeout(t, 30*time.Second)
			var pid1 int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
				t.Fatal(err)
			}
			pe := keepErr(t, sleepKilled(t, ctx, c, "keep_out_"+mode), "08007", "statement whose backend was killed")
			if !strings.Contains(pe.Message, "server connection lost") {
				t.Errorf("message %q does not say the server connection was lost", pe.Message)
			}
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("the next statement on the same client: %v", err)
			}
			if c.IsClosed() {
				t.Fatal("the client connection was closed")
			}
		})
	}
}

// Inside a block, the client gets an ERROR and a failed transaction: its
// statements get 25P02 until it rolls back, COMMIT answers ROLLBACK, and
// nothing it did in the block is committed.
func TestKeepKilledInBlock(t *testing.T) {
	p := startKeep(t, nil)
	table := relayTable(t, "id int")
	for _, mode := range []string{"simple_protocol", "cache_statement"} {
		t.Run(mode, func(t *testing.T) {
			c := p.connect(t, "default_query_exec_mode="+mode)
			ctx := ctxTimeout(t, 30*time.Second)
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			pe := keepErr(t, sleepKilled(t, ctx, c, "keep_in_"+mode), "08006", "statement in a block whose backend was killed")
			if !strings.Contains(pe.Detail, "rolled back") {
				t.Errorf("detail %q does not say the transaction was rolled back", pe.Detail)
			}
			if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (2)"); err == nil {
				t.Fatal("a statement after the loss ran inside the lost block")
			} else {
				keepErr(t, err, "25P02", "statement after the loss")
			}
			tag, err := c.Exec(ctx, "COMMIT")
			if err != nil || tag.String() != "ROLLBACK" {
				t.Fatalf("COMMIT of the failed block: %q, %v; want ROLLBACK", tag.String(), err)
			}
			var n int
			if err := c.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
				t.Fatalf("after the rollback: %v", err)
			}
			if n != 0 {
				t.Fatalf("%d rows of the lost transaction are in the table", n)
			}
		})
	}
}

// A backend killed while its client sits idle in a block: the client's
// next statement gets the ERROR, the one after 25P02, and ROLLBACK ends it.
func TestKeepKilledIdleInBlock(t *testing.T) {
	p := startKeep(t, nil)
	table := relayTable(t, "id int")
	c := p.connect(t, "default_query_exec_mode=exec")
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1) /* keep_idle */"); err != nil {
		t.Fatal(err)
	}
	super := connectDSN(t, pg.SuperDSN(pgtest.DBApp))
	var n int
	if err := super.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE query LIKE '%keep_idle%' AND state = 'idle in transaction'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the idle backend: %d, %v", n, err)
	}
	p.eventuallyNoActive(t)
	_, err := c.Exec(ctx, "SELECT 1")
	pe := keepErr(t, err, "08006", "first statement after the idle block was lost")
	if !strings.Contains(pe.Detail, "idle") {
		t.Errorf("detail %q does not say the block was idle", pe.Detail)
	}
	_, err = c.Exec(ctx, "SELECT 2")
	keepErr(t, err, "25P02", "second statement")
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatalf("ROLLBACK: %v", err)
	}
	if err := c.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after ROLLBACK: %d rows, %v", n, err)
	}
}

// eventuallyNoActive waits until poolerd has noticed the loss of the app
// pool's only active server connection.
func (p *instance) eventuallyNoActive(t *testing.T) {
	t.Helper()
	eventually(t, 5*time.Second, "the lost server connection to leave the pool", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Active == 0
	})
}

// A COMMIT in flight when the backend dies may or may not have committed:
// the client is not told it failed, its session ends as a direct
// connection's would.
func TestKeepCommitInDoubtEnds(t *testing.T) {
	p := startKeep(t, nil)
	table := relayTable(t, "id int")
	direct := relayDirect(t)
	ctx := ctxTimeout(t, 30*time.Second)
	// A deferred constraint trigger that sleeps makes COMMIT slow enough to
	// be killed while it runs.
	if _, err := direct.Exec(ctx, fmt.Sprintf(`
		CREATE FUNCTION %[1]s_slow() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_sleep(20); RETURN NULL; END$$;
		CREATE CONSTRAINT TRIGGER %[1]s_slow AFTER INSERT ON %[1]s DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION %[1]s_slow()`, table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = direct.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; DROP FUNCTION IF EXISTS %[1]s_slow()", table))
	})
	for _, mode := range []string{"simple_protocol", "cache_statement"} {
		t.Run(mode, func(t *testing.T) {
			c := p.connect(t, "default_query_exec_mode="+mode)
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := c.Exec(ctx, "COMMIT")
				done <- err
			}()
			keepKill(t, "COMMIT")
			err := <-done
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Severity == "ERROR" {
				t.Fatalf("COMMIT in doubt answered with an ERROR (%s %q): the client would take it for a rollback", pe.Code, pe.Message)
			}
			if err == nil {
				t.Fatal("COMMIT whose backend was killed succeeded")
			}
			eventually(t, 5*time.Second, "the client connection to be closed", func() bool {
				_, err := c.Exec(ctx, "SELECT 1")
				return err != nil && c.IsClosed()
			})
		})
	}
}

// server_response_timeout outside a block: an ERROR naming the limit, and
// the session goes on (before, FATAL 08006 ended it).
func TestKeepServerResponseTimeout(t *testing.T) {
	p := startKeep(t, func(c *config.Config) { c.ServerResponseTimeout = 500 * time.Millisecond })
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 20*time.Second)
	_, err := c.Exec(ctx, "SELECT pg_sleep(3)")
	pe := keepErr(t, err, "08007", "query longer than server_response_timeout")
	if !strings.Contains(pe.Message, "server_response_timeout") {
		t.Errorf("message %q does not name server_response_timeout", pe.Message)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("the next statement after the timeout: %v", err)
	}
	if got := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).SessionTimeouts["server_response"]; got != 1 {
		t.Errorf("SessionTimeouts[server_response] = %d, want 1", got)
	}
}

// psycopg 3 (Debian's python3-psycopg): the killed statement raises
// OperationalError, the connection stays open and runs the next one.
func TestKeepPsycopg(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import psycopg").Run(); err != nil {
		t.Skip("python3-psycopg is not installed (CI installs it)")
	}
	p := startKeep(t, nil)
	script := `
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
try:
    conn.execute("SELECT pg_sleep(20) /* keep_psycopg */")
    print("no error")
    sys.exit(1)
except psycopg.OperationalError as e:
    print("error", e.sqlstate, "closed" if conn.closed else "open")
print("next", conn.execute("SELECT 41 + 1").fetchone()[0])
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, p.appDSN())
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	out := make(chan []byte, 1)
	go func() {
		b, err := cmd.CombinedOutput()
		if err != nil {
			b = append(b, []byte("\nexit: "+err.Error())...)
		}
		out <- b
	}()
	keepKill(t, "keep_psycopg")
	got := strings.TrimSpace(string(<-out))
	if got != "error 08007 open\nnext 42" {
		t.Fatalf("psycopg saw:\n%s\nwant an OperationalError 08007 on an open connection, then 42", got)
	}
}

// The client's prepared statements survive the loss: a statement prepared
// before the kill runs after it (on another server, which gets its Parse).
func TestKeepStatementsSurvive(t *testing.T) {
	p := startKeep(t, nil)
	c := p.connect(t, "default_query_exec_mode=cache_statement")
	ctx := ctxTimeout(t, 30*time.Second)
	var v int
	if err := c.QueryRow(ctx, "SELECT $1::int + 1", 1).Scan(&v); err != nil {
		t.Fatal(err)
	}
	keepErr(t, sleepKilled(t, ctx, c, "keep_stmts"), "08007", "killed statement")
	if err := c.QueryRow(ctx, "SELECT $1::int + 1", 41).Scan(&v); err != nil || v != 42 {
		t.Fatalf("the statement prepared before the loss: %d, %v", v, err)
	}
	// A transaction runs normally afterwards.
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT $1::int * 2", 21).Scan(&v)
	})
	if err != nil || v != 42 {
		t.Fatalf("a transaction after the loss: %d, %v", v, err)
	}
}

// A request poolerd refuses (here: cancelled while it waited for a server
// connection) takes the requests pipelined behind it in the same read with
// it: the INSERT and COMMIT after a refused BEGIN must not run on their
// own once a connection frees up (before, they ran and committed).
func TestRefusedPipelineRest(t *testing.T) {
	p := startKeep(t, func(c *config.Config) { c.MaxSize = 1 })
	table := relayTable(t, "id int")
	ctx := ctxTimeout(t, 30*time.Second)
	a := p.connect(t, "default_query_exec_mode=simple_protocol")
	b := p.connect(t, "default_query_exec_mode=simple_protocol")
	if _, err := a.Exec(ctx, "BEGIN"); err != nil { // holds the only server connection
		t.Fatal(err)
	}
	pl := b.PgConn().StartPipeline(ctx)
	for _, sql := range []string{"BEGIN", "INSERT INTO " + table + " VALUES (1)", "COMMIT"} {
		pl.SendQueryParams(sql, nil, nil, nil, nil)
		pl.SendPipelineSync()
	}
	if err := pl.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b to wait for a server connection", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Waiting == 1
	})
	if err := b.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	var codes []string
	for range 3 {
		res, err := pl.GetResults()
		if rr, ok := res.(*pgconn.ResultReader); ok && err == nil {
			_, err = rr.Close()
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			codes = append(codes, pe.Code)
		} else {
			codes = append(codes, fmt.Sprint(err))
		}
		if len(codes) == 1 {
			// The connection frees up: a request still queued would run.
			if _, err := a.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pl.GetResults(); err != nil { // the Sync
			t.Fatalf("sync: %v", err)
		}
	}
	_ = pl.Close()
	if codes[0] != "57014" || codes[1] != "57014" || codes[2] != "57014" {
		t.Errorf("the pipeline's results: %v, want 57014 for each", codes)
	}
	var n int
	if err := relayDirect(t).QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows inserted by the pipeline after its BEGIN was refused (%v)", n, err)
	}
}

// A client in a failed block whose next server connection (which got the
// failed block sent ahead of its request) is lost before answering stays in
// the failed block: its COMMIT answers ROLLBACK (before, the loss was taken
// for one outside a block, and COMMIT answered COMMIT).
func TestKeepLossInFailedBlock(t *testing.T) {
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.ServerResponseTimeout = 500 * time.Millisecond
		c.MinSize = 3 // idle connections ready while responses are held
		c.MaxSize = 3
	})
	c := p.connect(t, "default_query_exec_mode=simple_protocol")
	ctx := ctxTimeout(t, 30*time.Second)
	eventually(t, 10*time.Second, "three warm server connections", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Idle >= 3
	})
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	fp.HoldResponses(true)
	_, err := c.Exec(ctx, "SELECT 1")
	keepErr(t, err, "08006", "statement in a block on a hung server")
	// The next request goes to another (hung) connection, behind the
	// failed block: lost too.
	_, err = c.Exec(ctx, "SELECT 2")
	keepErr(t, err, "08006", "statement in the failed block on another hung server")
	fp.HoldResponses(false)
	tag, err := c.Exec(ctx, "COMMIT")
	if err != nil || tag.String() != "ROLLBACK" {
		t.Fatalf("COMMIT of the failed block: %q, %v; want ROLLBACK", tag.String(), err)
	}
}
