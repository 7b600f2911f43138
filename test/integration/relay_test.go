package integration

// Tests of what poolerd relays between clients and PostgreSQL: the extended
// protocol, pipelines, COPY in both directions (also through the extended
// protocol on a raw connection), notices, parameter reports, function calls,
// cancel requests, LISTEN/NOTIFY and the end of a session.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// ---------------------------------------------------------------------------
// Helpers shared by relay_test.go, concurrency_test.go and tools_test.go.

// relayName returns a unique lower-case identifier starting with prefix.
func relayName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// relayDirect opens a connection straight to PostgreSQL (database app),
// closed when the test ends.
func relayDirect(t *testing.T) *pgx.Conn {
	t.Helper()
	return connectDSN(t, directDSN(pgtest.DBApp))
}

// relayTable creates a table with a unique name in database app through a
// direct connection and drops it when the test ends.
func relayTable(t *testing.T, columns string) string {
	t.Helper()
	name := relayName("it")
	ctx := ctxTimeout(t, 15*time.Second)
	c := relayDirect(t)
	if _, err := c.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (%s)", name, columns)); err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		dc, err := pgx.Connect(ctx, directDSN(pgtest.DBApp))
		if err != nil {
			t.Logf("drop table %s: %v", name, err)
			return
		}
		defer dc.Close(ctx)
		if _, err := dc.Exec(ctx, "SET lock_timeout = '5s'"); err == nil {
			if _, err := dc.Exec(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
				t.Logf("drop table %s: %v", name, err)
			}
		}
	})
	return name
}

// connectConfig connects through dsn after mutate adjusts pgx's
// configuration; the connection is closed when the test ends.
func connectConfig(t *testing.T, dsn string, mutate func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if mutate != nil {
		mutate(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// txExecMode is the query parameter that makes pgx use unnamed statements, which
// is what transaction pooling supports (named statements live on one server
// connection only).
const txExecMode = "default_query_exec_mode=exec"

// cancelOnContext makes pgx send a CancelRequest when a query's context ends
// (its default only sets a deadline on the socket).
func cancelOnContext(cfg *pgx.ConnConfig) {
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 10 * time.Second}
	}
}

// pgCode returns the SQLSTATE of err, or "" if it is not a server error.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// rawConn is a client connection logged in through pgconn and then driven
// message by message with pgproto3.
type rawConn struct {
	t   *testing.T
	nc  net.Conn
	fe  *pgproto3.Frontend
	pid uint32
	key []byte
}

// rawConnect logs in to poolerd as app (SCRAM) and hijacks the connection.
func (p *instance) rawConnect(t *testing.T) *rawConn {
	t.Helper()
	ctx := ctxTimeout(t, 15*time.Second)
	pc, err := pgconn.Connect(ctx, p.appDSN())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		t.Fatalf("hijack: %v", err)
	}
	// hc.Frontend, not a new one: pgconn may have a read in flight whose
	// bytes only its own reader returns.
	rc := &rawConn{t: t, nc: hc.Conn, fe: hc.Frontend, pid: hc.PID, key: hc.SecretKey}
	t.Cleanup(func() {
		_ = rc.nc.SetDeadline(time.Now().Add(time.Second))
		rc.fe.Send(&pgproto3.Terminate{})
		_ = rc.fe.Flush()
		_ = rc.nc.Close()
	})
	return rc
}

// send writes messages and flushes them in one write.
func (rc *rawConn) send(msgs ...pgproto3.FrontendMessage) {
	rc.t.Helper()
	for _, m := range msgs {
		rc.fe.Send(m)
	}
	_ = rc.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := rc.fe.Flush(); err != nil {
		rc.t.Fatalf("send: %v", err)
	}
}

// recvUntil reads messages until stop accepts one (included) and returns a
// description of each; it fails the test if d passes first.
func (rc *rawConn) recvUntil(d time.Duration, stop func(pgproto3.BackendMessage) bool) []string {
	rc.t.Helper()
	_ = rc.nc.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = rc.nc.SetReadDeadline(time.Time{}) }()
	var trace []string
	for {
		msg, err := rc.fe.Receive()
		if err != nil {
			rc.t.Fatalf("receive after %v: %v", trace, err)
		}
		trace = append(trace, describeMsg(msg))
		if stop(msg) {
			return trace
		}
	}
}

func isRFQ(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.ReadyForQuery); return ok }

func isType[T pgproto3.BackendMessage](m pgproto3.BackendMessage) bool { _, ok := m.(T); return ok }

// describeMsg renders a backend message for traces and assertions.
func describeMsg(m pgproto3.BackendMessage) string {
	switch m := m.(type) {
	case *pgproto3.ReadyForQuery:
		return fmt.Sprintf("ReadyForQuery(%c)", m.TxStatus)
	case *pgproto3.ErrorResponse:
		return fmt.Sprintf("ErrorResponse(%s %s: %s)", m.Severity, m.Code, m.Message)
	case *pgproto3.NoticeResponse:
		return fmt.Sprintf("NoticeResponse(%s: %s)", m.Code, m.Message)
	case *pgproto3.CommandComplete:
		return fmt.Sprintf("CommandComplete(%s)", m.CommandTag)
	case *pgproto3.DataRow:
		vals := make([]string, len(m.Values))
		for i, v := range m.Values {
			vals[i] = string(v)
		}
		return fmt.Sprintf("DataRow(%s)", strings.Join(vals, ","))
	case *pgproto3.FunctionCallResponse:
		return fmt.Sprintf("FunctionCallResponse(%x)", m.Result)
	case *pgproto3.ParameterStatus:
		return fmt.Sprintf("ParameterStatus(%s=%s)", m.Name, m.Value)
	default:
		return strings.TrimPrefix(fmt.Sprintf("%T", m), "*pgproto3.")
	}
}

// sendCancel sends a CancelRequest for (pid, key) to addr and waits until
// the receiver closes the connection (it never answers).
func sendCancel(t *testing.T, addr string, pid uint32, key []byte) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg := make([]byte, 8, 16)
	binary.BigEndian.PutUint32(msg[0:], 16)
	binary.BigEndian.PutUint32(msg[4:], 80877102)
	msg = binary.BigEndian.AppendUint32(msg, pid)
	msg = append(msg, key...)
	if len(msg) != 16 {
		t.Fatalf("cancel key has %d bytes", len(key))
	}
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.Copy(io.Discard, nc)
	if err != nil || n != 0 {
		t.Fatalf("cancel request: got %d bytes back, err %v; want a silent close", n, err)
	}
}

// waitNoActive waits until the pool of (db, app) has nothing checked out.
func (p *instance) waitNoActive(t *testing.T, db string) {
	t.Helper()
	eventually(t, 5*time.Second, "no active server connection", func() bool {
		return p.poolStats(t, db, pgtest.RoleApp).Active == 0
	})
}

// ---------------------------------------------------------------------------

// Named prepared statements (pgx's default statement cache) in session mode.
func TestRelayPreparedStatementsSessionMode(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.PoolMode = config.PoolSession })
	c := p.connect(t) // QueryExecModeCacheStatement is pgx's default
	if c.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		t.Fatalf("default exec mode is %v", c.Config().DefaultQueryExecMode)
	}
	ctx := ctxTimeout(t, 20*time.Second)
	const sql = "SELECT $1::int * 2, $2::text || '!'"
	for i := 0; i < 50; i++ {
		var n int
		var s string
		if err := c.QueryRow(ctx, sql, i, fmt.Sprintf("s%d", i)).Scan(&n, &s); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if n != 2*i || s != fmt.Sprintf("s%d!", i) {
			t.Fatalf("query %d: got %d %q", i, n, s)
		}
	}
	// pgx prepared it once, under a name, on the session's server.
	var named int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1 AND name LIKE 'stmtcache_%'",
		sql).Scan(&named); err != nil {
		t.Fatal(err)
	}
	if named != 1 {
		t.Fatalf("%d named prepared statements for the query, want 1", named)
	}
	// An explicitly named statement.
	if _, err := c.Prepare(ctx, "plus100", "SELECT $1::int + 100"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		var n int
		if err := c.QueryRow(ctx, "plus100", i).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != i+100 {
			t.Fatalf("plus100(%d) = %d", i, n)
		}
	}
}

// A pipelined batch of 100 statements, in the extended and simple protocols.
func TestRelayPipelinedBatch(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MaxSize = 2 })
	for _, mode := range []string{"exec", "cache_describe", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			tbl := relayTable(t, "id int")
			c := p.connect(t, "default_query_exec_mode="+mode)
			ctx := ctxTimeout(t, 20*time.Second)

			b := &pgx.Batch{}
			for i := 0; i < 100; i++ {
				if i%2 == 0 {
					b.Queue(fmt.Sprintf("INSERT INTO %s (id) VALUES ($1::int)", tbl), i)
				} else {
					b.Queue(fmt.Sprintf("SELECT count(*), coalesce(sum(id), 0) FROM %s WHERE id <= $1::int", tbl), i)
				}
			}
			br := c.SendBatch(ctx, b)
			for i := 0; i < 100; i++ {
				if i%2 == 0 {
					tag, err := br.Exec()
					if err != nil {
						t.Fatalf("query %d: %v", i, err)
					}
					if tag.String() != "INSERT 0 1" {
						t.Fatalf("query %d: tag %q", i, tag)
					}
				} else {
					var n, sum int
					if err := br.QueryRow().Scan(&n, &sum); err != nil {
						t.Fatalf("query %d: %v", i, err)
					}
					// Rows 0, 2, ..., i-1 are in.
					k := (i + 1) / 2
					if n != k || sum != k*(k-1) {
						t.Fatalf("query %d: count %d sum %d, want %d %d", i, n, sum, k, k*(k-1))
					}
				}
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := c.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 50 {
				t.Fatalf("table has %d rows, want 50", n)
			}
			p.waitNoActive(t, pgtest.DBApp)
		})
		t.Run(mode+"/error_at_50", func(t *testing.T) {
			tbl := relayTable(t, "id int")
			c := p.connect(t, "default_query_exec_mode="+mode)
			ctx := ctxTimeout(t, 20*time.Second)

			b := &pgx.Batch{}
			for i := 0; i < 100; i++ {
				switch {
				case i == 49:
					b.Queue("SELECT 1 / $1::int", 0)
				case i%2 == 0:
					b.Queue(fmt.Sprintf("INSERT INTO %s (id) VALUES ($1::int)", tbl), i)
				default:
					b.Queue(fmt.Sprintf("SELECT count(*) FROM %s", tbl))
				}
			}
			br := c.SendBatch(ctx, b)
			for i := 0; i < 49; i++ {
				if i%2 == 0 {
					if _, err := br.Exec(); err != nil {
						t.Fatalf("query %d: %v", i, err)
					}
				} else {
					var n int
					if err := br.QueryRow().Scan(&n); err != nil {
						t.Fatalf("query %d: %v", i, err)
					}
					if n != (i+1)/2 {
						t.Fatalf("query %d: count %d, want %d", i, n, (i+1)/2)
					}
				}
			}
			var x int
			err := br.QueryRow().Scan(&x)
			if code := pgCode(err); code != "22012" {
				t.Fatalf("query 49: want division_by_zero (22012), got %v", err)
			}
			// The batch is one implicit transaction: nothing after the
			// error runs.
			for i := 50; i < 100; i++ {
				if _, err := br.Exec(); err == nil {
					t.Fatalf("query %d after the failed one succeeded", i)
				}
			}
			_ = br.Close()

			var n, one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("connection unusable after the failed batch: %v", err)
			}
			if err := c.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("%d rows survived the failed batch, want 0 (implicit transaction rolled back)", n)
			}
			p.waitNoActive(t, pgtest.DBApp)
		})
	}
}

// pgx CopyFrom (COPY FROM STDIN, binary) of 50,000 rows.
func TestRelayCopyFrom(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	const rows = 50000
	src := func() pgx.CopyFromSource {
		return pgx.CopyFromSlice(rows, func(i int) ([]any, error) {
			return []any{i + 1, fmt.Sprintf("row %d", i+1)}, nil
		})
	}
	const wantSum = int64(rows) * (rows + 1) / 2

	t.Run("temp_table_in_transaction", func(t *testing.T) {
		c := p.connect(t, txExecMode)
		ctx := ctxTimeout(t, 30*time.Second)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "CREATE TEMP TABLE copy_in (id int, v text) ON COMMIT DROP"); err != nil {
			t.Fatal(err)
		}
		n, err := tx.CopyFrom(ctx, pgx.Identifier{"copy_in"}, []string{"id", "v"}, src())
		if err != nil {
			t.Fatal(err)
		}
		if n != rows {
			t.Fatalf("CopyFrom reported %d rows", n)
		}
		var count, sum int64
		var last string
		if err := tx.QueryRow(ctx, "SELECT count(*), sum(id), max(v) FILTER (WHERE id = $1) FROM copy_in", rows).Scan(&count, &sum, &last); err != nil {
			t.Fatal(err)
		}
		if count != rows || sum != wantSum || last != fmt.Sprintf("row %d", rows) {
			t.Fatalf("count %d sum %d last %q; want %d %d %q", count, sum, last, rows, wantSum, fmt.Sprintf("row %d", rows))
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("table", func(t *testing.T) {
		tbl := relayTable(t, "id int, v text")
		c := p.connect(t, txExecMode)
		ctx := ctxTimeout(t, 30*time.Second)
		n, err := c.CopyFrom(ctx, pgx.Identifier{tbl}, []string{"id", "v"}, src())
		if err != nil {
			t.Fatal(err)
		}
		if n != rows {
			t.Fatalf("CopyFrom reported %d rows", n)
		}
		var count, sum int64
		if err := c.QueryRow(ctx, "SELECT count(*), sum(id) FROM "+tbl).Scan(&count, &sum); err != nil {
			t.Fatal(err)
		}
		if count != rows || sum != wantSum {
			t.Fatalf("count %d sum %d; want %d %d", count, sum, rows, wantSum)
		}
	})
	p.waitNoActive(t, pgtest.DBApp)
}

// COPY TO STDOUT of about 5 MB arrives byte for byte as PostgreSQL sends it.
func TestRelayCopyTo(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	const sql = "COPY (SELECT i, repeat(md5(i::text), 3), now() - now() FROM generate_series(1, 50000) i) TO STDOUT"
	ctx := ctxTimeout(t, 30*time.Second)

	direct, err := pgconn.Connect(ctx, directDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	var want bytes.Buffer
	if _, err := direct.CopyTo(ctx, &want, sql); err != nil {
		t.Fatal(err)
	}
	if want.Len() < 5_000_000 {
		t.Fatalf("direct COPY gave only %d bytes", want.Len())
	}

	c := p.connect(t)
	for round := 0; round < 2; round++ {
		var got bytes.Buffer
		tag, err := c.PgConn().CopyTo(ctx, &got, sql)
		if err != nil {
			t.Fatal(err)
		}
		if tag.String() != "COPY 50000" {
			t.Fatalf("tag %q", tag)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("round %d: got %d bytes through poolerd, %d directly; contents differ", round, got.Len(), want.Len())
		}
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after COPY: %v", err)
	}
	p.waitNoActive(t, pgtest.DBApp)
}

// COPY FROM STDIN started through the extended protocol on a raw
// connection. PostgreSQL ignores the Sync that follows the Execute (it
// arrives during COPY), so exactly one ReadyForQuery comes back; poolerd
// must release the server connection at that one.
func TestRelayCopyFromExtendedProtocol(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		c.CheckoutTimeout = 3 * time.Second
	})

	startCopy := func(t *testing.T, rc *rawConn, tbl string) {
		t.Helper()
		rc.send(&pgproto3.Parse{Query: fmt.Sprintf("COPY %s (id, v) FROM STDIN", tbl)},
			&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
		trace := rc.recvUntil(5*time.Second, isType[*pgproto3.CopyInResponse])
		if got, want := strings.Join(trace, " "), "ParseComplete BindComplete CopyInResponse"; got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
	}
	// inSync checks that the raw connection gets exactly the answer to a
	// new query: a second ReadyForQuery left over from the COPY would
	// come first.
	inSync := func(t *testing.T, rc *rawConn) {
		t.Helper()
		rc.send(&pgproto3.Query{String: "SELECT 42"})
		trace := rc.recvUntil(5*time.Second, isRFQ)
		if got, want := strings.Join(trace, " "), "RowDescription DataRow(42) CommandComplete(SELECT 1) ReadyForQuery(I)"; got != want {
			t.Fatalf("after COPY: got %s, want %s", got, want)
		}
	}
	// countRows runs a query on another client, which proves that the
	// only server connection was released.
	countRows := func(t *testing.T, other *pgx.Conn, tbl string) (n, sum int) {
		t.Helper()
		ctx := ctxTimeout(t, 2500*time.Millisecond)
		start := time.Now()
		if err := other.QueryRow(ctx, "SELECT count(*), coalesce(sum(id), 0) FROM "+tbl).Scan(&n, &sum); err != nil {
			t.Fatalf("second client (max_size 1) could not run a query; the server connection was not released: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("second client waited %s for the server connection", d)
		}
		return n, sum
	}

	t.Run("ok", func(t *testing.T) {
		tbl := relayTable(t, "id int, v text")
		other := p.connect(t, txExecMode)
		rc := p.rawConnect(t)
		startCopy(t, rc, tbl)
		var msgs []pgproto3.FrontendMessage
		for i := 1; i <= 1000; i++ {
			msgs = append(msgs, &pgproto3.CopyData{Data: []byte(fmt.Sprintf("%d\tv%d\n", i, i))})
			if i%100 == 0 {
				rc.send(msgs...)
				msgs = nil
			}
		}
		rc.send(&pgproto3.CopyDone{}, &pgproto3.Sync{})
		trace := rc.recvUntil(5*time.Second, isRFQ)
		if got, want := strings.Join(trace, " "), "CommandComplete(COPY 1000) ReadyForQuery(I)"; got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
		if n, sum := countRows(t, other, tbl); n != 1000 || sum != 500500 {
			t.Fatalf("count %d sum %d, want 1000 500500", n, sum)
		}
		inSync(t, rc)
		p.waitNoActive(t, pgtest.DBApp)
	})

	t.Run("bad_row", func(t *testing.T) {
		tbl := relayTable(t, "id int, v text")
		other := p.connect(t, txExecMode)
		rc := p.rawConnect(t)
		startCopy(t, rc, tbl)
		var msgs []pgproto3.FrontendMessage
		for i := 1; i <= 100; i++ {
			row := fmt.Sprintf("%d\tv%d\n", i, i)
			if i == 50 {
				row = "not-a-number\tbad\n"
			}
			msgs = append(msgs, &pgproto3.CopyData{Data: []byte(row)})
		}
		rc.send(msgs...)
		trace := rc.recvUntil(5*time.Second, isType[*pgproto3.ErrorResponse])
		if len(trace) != 1 || !strings.Contains(trace[0], "22P02") {
			t.Fatalf("want one ErrorResponse 22P02, got %v", trace)
		}
		rc.send(&pgproto3.CopyDone{}, &pgproto3.Sync{})
		trace = rc.recvUntil(5*time.Second, isRFQ)
		if got, want := strings.Join(trace, " "), "ReadyForQuery(I)"; got != want {
			t.Fatalf("after CopyDone+Sync: got %s, want %s", got, want)
		}
		if n, _ := countRows(t, other, tbl); n != 0 {
			t.Fatalf("%d rows from a failed COPY", n)
		}
		inSync(t, rc)
		// And the pool still serves the raw client's next COPY.
		startCopy(t, rc, tbl)
		rc.send(&pgproto3.CopyData{Data: []byte("7\tseven\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{})
		trace = rc.recvUntil(5*time.Second, isRFQ)
		if got, want := strings.Join(trace, " "), "CommandComplete(COPY 1) ReadyForQuery(I)"; got != want {
			t.Fatalf("second COPY: got %s, want %s", got, want)
		}
		if n, sum := countRows(t, other, tbl); n != 1 || sum != 7 {
			t.Fatalf("count %d sum %d, want 1 7", n, sum)
		}
		p.waitNoActive(t, pgtest.DBApp)
	})

	t.Run("copy_fail", func(t *testing.T) {
		tbl := relayTable(t, "id int, v text")
		other := p.connect(t, txExecMode)
		rc := p.rawConnect(t)
		startCopy(t, rc, tbl)
		rc.send(&pgproto3.CopyData{Data: []byte("1\tone\n")}, &pgproto3.CopyFail{Message: "client gave up"}, &pgproto3.Sync{})
		trace := rc.recvUntil(5*time.Second, isRFQ)
		if len(trace) != 2 || !strings.Contains(trace[0], "57014") || trace[1] != "ReadyForQuery(I)" {
			t.Fatalf("want ErrorResponse 57014 then ReadyForQuery, got %v", trace)
		}
		if n, _ := countRows(t, other, tbl); n != 0 {
			t.Fatalf("%d rows from a failed COPY", n)
		}
		inSync(t, rc)
		p.waitNoActive(t, pgtest.DBApp)
	})
}

// RAISE NOTICE reaches the client's notice handler.
func TestRelayNotice(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	var mu sync.Mutex
	var notices []pgconn.Notice
	c := connectConfig(t, p.appDSN(txExecMode), func(cfg *pgx.ConnConfig) {
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			mu.Lock()
			notices = append(notices, *n)
			mu.Unlock()
		}
	})
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := c.Exec(ctx, "DO $$ BEGIN RAISE NOTICE 'hello %', 42; RAISE WARNING 'careful'; END $$"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notices) != 2 {
		t.Fatalf("got %d notices: %+v", len(notices), notices)
	}
	if notices[0].Severity != "NOTICE" || notices[0].Message != "hello 42" || notices[0].Code != "00000" {
		t.Fatalf("first notice %+v", notices[0])
	}
	if notices[1].Severity != "WARNING" || notices[1].Message != "careful" || notices[1].Code != "01000" {
		t.Fatalf("second notice %+v", notices[1])
	}
}

// SET of a reported parameter reaches the client as ParameterStatus.
func TestRelayParameterStatus(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	c := p.connect(t, txExecMode, "application_name=before")
	ctx := ctxTimeout(t, 10*time.Second)
	if got := c.PgConn().ParameterStatus("application_name"); got != "before" {
		t.Fatalf("application_name at login %q", got)
	}
	if _, err := c.Exec(ctx, "SET application_name = 'x'"); err != nil {
		t.Fatal(err)
	}
	if got := c.PgConn().ParameterStatus("application_name"); got != "x" {
		t.Fatalf("ParameterStatus application_name = %q, want x", got)
	}
	var s string
	if err := c.QueryRow(ctx, "SHOW application_name").Scan(&s); err != nil {
		t.Fatal(err)
	}
	if s != "x" {
		t.Fatalf("SHOW application_name = %q, want x", s)
	}
	if _, err := c.Exec(ctx, "SET TimeZone = 'Asia/Tokyo'"); err != nil {
		t.Fatal(err)
	}
	if got := c.PgConn().ParameterStatus("TimeZone"); got != "Asia/Tokyo" {
		t.Fatalf("ParameterStatus TimeZone = %q", got)
	}
}

// FunctionCall (the fast-path protocol) of int4pl(2, 3).
func TestRelayFunctionCall(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	rc := p.rawConnect(t)
	for i := 0; i < 3; i++ {
		rc.send(&pgproto3.FunctionCall{
			Function:         177, // int4pl
			ArgFormatCodes:   []uint16{1},
			Arguments:        [][]byte{{0, 0, 0, 2}, {0, 0, 0, byte(3 + i)}},
			ResultFormatCode: 1,
		})
		trace := rc.recvUntil(5*time.Second, isRFQ)
		want := fmt.Sprintf("FunctionCallResponse(%08x) ReadyForQuery(I)", 5+i)
		if got := strings.Join(trace, " "); got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
	}
	p.waitNoActive(t, pgtest.DBApp)
}

// A context cancel makes pgx send a CancelRequest to poolerd, which must
// stop that client's query and no other.
func TestRelayCancel(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	a := connectConfig(t, p.appDSN(txExecMode), cancelOnContext)
	b := connectConfig(t, p.appDSN(txExecMode), cancelOnContext)

	direct := relayDirect(t)
	// running reports whether exactly one backend runs sql right now.
	running := func(sql string) bool {
		var n int
		qctx, qcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer qcancel()
		err := direct.QueryRow(qctx, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = $1", sql).Scan(&n)
		return err == nil && n == 1
	}

	bDone := make(chan error, 1)
	bSQL := fmt.Sprintf("SELECT pg_sleep(3)::text /* %s */", relayName("other"))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		var s string
		err := b.QueryRow(ctx, bSQL).Scan(&s)
		bDone <- err
	}()
	eventually(t, 5*time.Second, "b's query to run", func() bool { return running(bSQL) })

	// Cancel a's context 200ms after its query is seen running on the
	// server. (A cancel that arrives while the request still waits for a
	// server connection is not what this test is about.)
	sql := fmt.Sprintf("SELECT pg_sleep(30) /* %s */", relayName("cancel"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer cancel()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if running(sql) {
				time.Sleep(200 * time.Millisecond)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	start := time.Now()
	_, err := a.Exec(ctx, sql)
	elapsed := time.Since(start)
	if code := pgCode(err); code != "57014" {
		t.Fatalf("want query_canceled (57014), got %v", err)
	}
	if elapsed > 8*time.Second {
		t.Fatalf("cancel took %s", elapsed)
	}
	select {
	case err := <-bDone:
		t.Fatalf("b's query ended (%v) before a's was cancelled; the test proves nothing", err)
	default:
	}
	var one int
	if err := a.QueryRow(ctxTimeout(t, 5*time.Second), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after cancel: %d %v", one, err)
	}
	select {
	case err := <-bDone:
		if err != nil {
			t.Fatalf("the other client's query was hit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other client's query did not finish")
	}
	p.waitNoActive(t, pgtest.DBApp)
}

// A CancelRequest for a client that holds no server connection does
// nothing, even though its last server connection now runs another
// client's query.
func TestRelayCancelIdleClient(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MaxSize = 1 })
	a := p.connect(t, txExecMode)
	b := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 15*time.Second)
	var pidA, pidB int
	if err := a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidA); err != nil {
		t.Fatal(err)
	}

	// Idle client, idle pool.
	sendCancel(t, p.addr, a.PgConn().PID(), a.PgConn().SecretKey())

	// Idle client while its former server runs b's query.
	bDone := make(chan error, 1)
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var s string
		bDone <- b.QueryRow(bctx, "SELECT pg_backend_pid(), pg_sleep(1)::text").Scan(&pidB, &s)
	}()
	eventually(t, 5*time.Second, "b's query to hold the server", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Active == 1
	})
	time.Sleep(100 * time.Millisecond)
	sendCancel(t, p.addr, a.PgConn().PID(), a.PgConn().SecretKey())
	if err := <-bDone; err != nil {
		t.Fatalf("b's query was cancelled by a's cancel request: %v", err)
	}
	if pidB != pidA {
		t.Fatalf("b ran on backend %d, a on %d; with max_size 1 they share one", pidB, pidA)
	}
	var s string
	var n int
	if err := a.QueryRow(ctx, "SELECT pg_sleep(0.2)::text, 7").Scan(&s, &n); err != nil || n != 7 {
		t.Fatalf("a after its cancel request: %d %v", n, err)
	}
}

// A cancel request that arrives while the client's request still waits in
// the queue for a server connection withdraws the request (57014), instead
// of letting it run in full once a server frees up; the session stays usable.
func TestRelayCancelWhileQueued(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MaxSize = 1 })
	holder := p.connect(t, txExecMode)
	a := connectConfig(t, p.appDSN(txExecMode), cancelOnContext)
	ctx := ctxTimeout(t, 20*time.Second)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	qctx, cancel := context.WithCancel(ctx)
	go func() {
		eventually(t, 5*time.Second, "a to queue", func() bool {
			return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Waiting == 1
		})
		cancel()
	}()
	start := time.Now()
	_, err = a.Exec(qctx, "SELECT pg_sleep(4)")
	if code := pgCode(err); code != "57014" {
		t.Fatalf("want 57014, got %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the cancel took %s: the request was not withdrawn from the queue", d)
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Waiting != 0 {
		t.Fatalf("request still queued: %+v", st)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := a.QueryRow(ctx, "SELECT 5").Scan(&n); err != nil || n != 5 {
		t.Fatalf("a after the withdrawn request: %d %v", n, err)
	}
}

// LISTEN/NOTIFY in session mode.
func TestRelayListenNotify(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.PoolMode = config.PoolSession })
	ch := relayName("ch")
	a := p.connect(t)
	b := p.connect(t)
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := a.Exec(ctx, "LISTEN "+ch); err != nil {
		t.Fatal(err)
	}
	var bPID uint32
	if err := b.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&bPID); err != nil {
		t.Fatal(err)
	}

	// Notification sent while a is between statements.
	if _, err := b.Exec(ctx, "NOTIFY "+ch+", 'hello'"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	n, err := a.WaitForNotification(wctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != ch || n.Payload != "hello" || n.PID != bPID {
		t.Fatalf("notification %+v; want channel %s payload hello pid %d", n, ch, bPID)
	}

	// Notification arriving while a is blocked waiting for one.
	got := make(chan *pgconn.Notification, 1)
	errc := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := a.WaitForNotification(wctx)
		if err != nil {
			errc <- err
			return
		}
		got <- n
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := b.Exec(ctx, "SELECT pg_notify($1, 'while idle')", ch); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if n.Channel != ch || n.Payload != "while idle" {
			t.Fatalf("notification %+v", n)
		}
	case err := <-errc:
		t.Fatalf("waiting for the notification: %v", err)
	}
	var one int
	if err := a.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after notifications: %v", err)
	}
}

// Closing a session-mode client returns its server connection, reset, to
// the pool.
func TestRelayTerminateSessionMode(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.PoolMode = config.PoolSession })
	ctx := ctxTimeout(t, 20*time.Second)
	c1, err := pgx.Connect(ctx, p.appDSN())
	if err != nil {
		t.Fatal(err)
	}
	var pid1 int
	if err := c1.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"PREPARE leftover AS SELECT 1", "CREATE TEMP TABLE leftover_tmp (x int)", "SET work_mem = '7MB'"} {
		if _, err := c1.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.Active != 1 || st.Total != 1 {
		t.Fatalf("while the client is connected: %+v", st)
	}
	if err := c1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the server connection back in the pool", func() bool {
		st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
		return st.Idle == 1 && st.Active == 0 && st.Total == 1
	})

	c2 := p.connect(t)
	var pid2, prepared int
	var tmp *string
	var workMem string
	if err := c2.QueryRow(ctx, `SELECT pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements WHERE name = 'leftover'),
		to_regclass('pg_temp.leftover_tmp')::text, current_setting('work_mem')`).Scan(&pid2, &prepared, &tmp, &workMem); err != nil {
		t.Fatal(err)
	}
	if pid2 != pid1 {
		t.Fatalf("second client got backend %d, want the pooled %d", pid2, pid1)
	}
	if prepared != 0 || tmp != nil || workMem == "7MB" {
		t.Fatalf("server_reset_query did not reset the session: prepared %d, temp table %v, work_mem %s", prepared, tmp, workMem)
	}
}
