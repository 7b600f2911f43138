package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestReadKeepsItsServerAfterWaiting: a read that waits in the middle for
// the answers to what it sent first (answered: a named Parse behind a
// pipelined DISCARD ALL waits until the drop is answered) goes on with the
// rest on one server connection. The DISCARD ALL changed settings, so the
// connection, idle after it, is not released at once: poolerd reads the
// settings first (snapshot), with the client still its owner. The snapshot's
// answer must not release it while the client's session is handling the
// rest of the read: the Parse handled for that connection would go to
// another, and the Describe behind it would prepare the statement there a
// second time (42P05 "poolerd_s1 already exists"; the state fuzzer's seeds
// 889613268 and 901000447, on a loaded machine only). The onFrame hook
// holds the session at the Describe until the snapshot is answered and,
// if the connection was released, has another client take it.
func TestReadKeepsItsServerAfterWaiting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, _ := realPGServer(t, func(c *config.Config) {
		c.MaxSize = 2
		c.CheckoutTimeout = 5 * time.Second
	})
	dsn := "postgres://app:" + pgtest.Password + "@" + serve(t, srv) + "/app?sslmode=disable"
	other, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())

	var describes atomic.Int32 // Describe frames to let by before the hold
	var held, released atomic.Bool
	srv.onFrame = func(s *session, typ byte) {
		if typ != 'D' || describes.Add(-1) != 0 {
			return
		}
		sc := s.server.Load()
		if sc == nil {
			t.Errorf("no server connection at the Describe: the hold proves nothing")
			return
		}
		held.Store(true)
		// Until the snapshot is answered, or the connection released.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if s.server.Load() != sc {
				break
			}
			sc.mu.Lock()
			done := sc.pending == 0 && len(sc.swallowQ) == 0
			sc.mu.Unlock()
			if done {
				break
			}
		}
		if s.server.Load() == sc {
			return
		}
		// Released mid-read: another client takes it, so that the rest of
		// the read goes to a connection of its own.
		released.Store(true)
		if err := other.Exec(context.Background(), "BEGIN; SELECT 1").Close(); err != nil {
			t.Errorf("other client: %v", err)
		}
	}

	c, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for round := 0; round < 3; round++ {
		held.Store(false)
		describes.Store(2) // the DISCARD ALL's Describe (portal), then the Parse's
		p := c.StartPipeline(ctx)
		p.SendQueryParams("DISCARD ALL", nil, nil, nil, nil)
		p.SendPipelineSync()
		name := "s" + string(rune('a'+round))
		p.SendPrepare(name, "SELECT 1 AS one", nil)
		p.SendQueryPrepared(name, nil, nil, nil)
		p.SendPipelineSync()
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			res, err := p.GetResults()
			if err != nil {
				t.Fatalf("round %d: %v (answers before it: %v)", round, err, got)
			}
			if res == nil {
				break
			}
			switch r := res.(type) {
			case *pgconn.ResultReader:
				rr := r.Read()
				if rr.Err != nil {
					t.Fatalf("round %d: %v (answers before it: %v)", round, rr.Err, got)
				}
				got = append(got, rr.CommandTag.String())
			case *pgconn.StatementDescription:
				got = append(got, "prepared")
			case *pgconn.PipelineSync:
				got = append(got, "sync")
			}
		}
		if err := p.Close(); err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		if !held.Load() {
			t.Fatalf("round %d: the hook did not hold the Describe: the test proves nothing", round)
		}
		if released.Load() {
			t.Errorf("round %d: the connection was released while the session handled the rest of the read", round)
			if err := other.Exec(context.Background(), "ROLLBACK").Close(); err != nil {
				t.Fatal(err)
			}
			released.Store(false)
		}
	}
}
