package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestServerDiesBetweenReadAndForward fails the client's server connection
// exactly between poolerd reading a message of an open transaction and
// routing it (the onFrame hook terminates the backend and waits until the
// server's reader has given the connection up). Whatever the protocol, the
// message must run nowhere: not on the dead connection, and above all not on
// a fresh one, where it would commit on its own. The client gets an error
// and its session ends, and the transaction's earlier UPDATE is rolled back.
func TestServerDiesBetweenReadAndForward(t *testing.T) {
	srv, pg := realPGServer(t, func(c *config.Config) {
		c.MaxSize = 4
		c.CheckoutTimeout = 5 * time.Second
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	super, err := pgx.Connect(ctx, pg.SuperDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(context.Background())
	if _, err := super.Exec(ctx, `CREATE TABLE acct (id int PRIMARY KEY, balance int NOT NULL);
		INSERT INTO acct VALUES (1, 100);
		CREATE TABLE ledger (note text NOT NULL);
		GRANT ALL ON acct, ledger TO app`); err != nil {
		t.Fatal(err)
	}

	// armed names the frame type at which the next frame of a client in a
	// transaction kills its backend.
	var armed atomic.Int32
	var killed atomic.Int32
	var hung atomic.Bool // drop the server as hung instead of killing its backend
	srv.onFrame = func(s *session, typ byte) {
		if armed.Load() != int32(typ) {
			return
		}
		sc := s.server.Load()
		if sc == nil {
			return
		}
		armed.Store(0)
		if hung.Load() {
			// What the watchdog does when server_response_timeout
			// expires, up to the moment it would tell the client.
			s.dropServer(sc)
		} else if _, err := super.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int32(sc.PID)); err != nil {
			t.Errorf("pg_terminate_backend: %v", err)
			return
		}
		// Wait until the server's reader has seen the end of the
		// connection and taken it from the session.
		deadline := time.Now().Add(10 * time.Second)
		for s.server.Load() == sc && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if s.server.Load() == sc {
			t.Errorf("the session still holds its server 10 s after pg_terminate_backend")
		}
		killed.Add(1)
	}
	dsn := "postgres://app:" + pgtest.Password + "@" + serve(t, srv) + "/app?sslmode=disable"

	check := func(t *testing.T, note string, sendErr error) {
		t.Helper()
		if sendErr == nil {
			t.Errorf("the client got no error for a statement sent after its server died")
		}
		// The client may read the server's FATAL before the hook has seen
		// the connection taken from the session.
		for i := 0; killed.Load() == 0 && i < 1500; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if killed.Load() == 0 {
			t.Fatal("the hook did not run: the test proves nothing")
		}
		time.Sleep(100 * time.Millisecond) // what the session does next
		var n int
		if err := super.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE note = $1", note).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d ledger rows %q committed from a transaction that never sent COMMIT", n, note)
		}
		var bal int
		if err := super.QueryRow(ctx, "SELECT balance FROM acct WHERE id = 1").Scan(&bal); err != nil {
			t.Fatal(err)
		}
		if bal != 100 {
			t.Errorf("balance %d: the transaction's UPDATE was committed", bal)
		}
	}
	connect := func(t *testing.T) *pgconn.PgConn {
		t.Helper()
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		if err := c.Exec(ctx, "BEGIN; UPDATE acct SET balance = balance - 10 WHERE id = 1").Close(); err != nil {
			t.Fatal(err)
		}
		killed.Store(0)
		return c
	}

	t.Run("simple", func(t *testing.T) {
		c := connect(t)
		armed.Store('Q')
		_, err := c.Exec(ctx, "INSERT INTO ledger VALUES ('simple')").ReadAll()
		check(t, "simple", err)
	})
	t.Run("extended", func(t *testing.T) {
		c := connect(t)
		armed.Store('P')
		err := c.ExecParams(ctx, "INSERT INTO ledger VALUES ($1)", [][]byte{[]byte("extended")}, nil, nil, nil).Read().Err
		check(t, "extended", err)
	})
	t.Run("server_response_timeout", func(t *testing.T) {
		c := connect(t)
		hung.Store(true)
		defer hung.Store(false)
		armed.Store('Q')
		_, err := c.Exec(ctx, "INSERT INTO ledger VALUES ('hung')").ReadAll()
		check(t, "hung", err)
	})
	t.Run("pipeline", func(t *testing.T) {
		c := connect(t)
		armed.Store('P')
		p := c.StartPipeline(ctx)
		p.SendQueryParams("INSERT INTO ledger VALUES ($1)", [][]byte{[]byte("pipeline")}, nil, nil, nil)
		p.SendPipelineSync()
		p.SendQueryParams("COMMIT", nil, nil, nil, nil)
		p.SendPipelineSync()
		var perr error
		if err := p.Flush(); err != nil {
			perr = err
		}
		for perr == nil {
			res, err := p.GetResults()
			if err != nil {
				perr = err
				break
			}
			if res == nil {
				break
			}
			if rr, ok := res.(*pgconn.ResultReader); ok {
				if _, err := rr.Close(); err != nil {
					perr = err
				}
			}
		}
		if err := p.Close(); perr == nil {
			perr = err
		}
		check(t, "pipeline", perr)
	})
}
