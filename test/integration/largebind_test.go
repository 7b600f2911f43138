package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Frames larger than one read in transaction mode (issue 13, item 1).
// poolerd holds a Parse, Bind, Describe or Close until it is complete, to
// rewrite statement names; while such a frame was still arriving, the
// server connection attached for it could be found clean (the answer to the
// parameter sync sent ahead of it came back) and go back to the pool, and
// the completed frame was then dropped: the client got "portal "" does not
// exist" (34000) or a Describe of its previous unnamed statement.

// largeNoise keeps the other server connection of a pool of 2 changing
// hands, so that consecutive requests of one client land on different
// server connections.
func largeNoise(t *testing.T, p *obInst) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 3 {
		o := tsConn(t, p, "noise")
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = o.Exec(ctx, "SELECT pg_sleep(0.001)")
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestLargeFramesUnnamed runs statements with 65,535 parameters (a Parse
// of about 1 MB and a Bind of about 0.5 MB) and a 1 MB text parameter, in
// pgx's three unnamed-statement modes, each several times while the pool's
// connections change hands.
func TestLargeFramesUnnamed(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	largeNoise(t, p)
	ctx := ctxTimeout(t, 120*time.Second)
	const n = 65535
	args := make([]any, n)
	ph := make([]string, n)
	for i := range args {
		args[i] = int32(i)
		ph[i] = fmt.Sprintf("$%d::int4", i+1)
	}
	manyParams := "SELECT array_length(ARRAY[" + strings.Join(ph, ",") + "], 1)"
	big := strings.Repeat("x", 1<<20)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeDescribeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec} {
		c := tsConn(t, p, "large_frames")
		for r := range 4 {
			// A small unnamed statement first, so that a Parse that went
			// missing would leave this one for the large Bind to hit.
			var small int
			if err := c.QueryRow(ctx, "SELECT $1::int4 + 1", mode, int32(r)).Scan(&small); err != nil || small != r+1 {
				t.Fatalf("%v round %d, small statement: %d, %v", mode, r, small, err)
			}
			var got int
			if err := c.QueryRow(ctx, manyParams, append([]any{mode}, args...)...).Scan(&got); err != nil || got != n {
				t.Fatalf("%v round %d, %d parameters: got %d, %v", mode, r, n, got, err)
			}
			var length int
			if err := c.QueryRow(ctx, "SELECT length($1::text)", mode, big).Scan(&length); err != nil || length != len(big) {
				t.Fatalf("%v round %d, 1 MB parameter: got %d, %v", mode, r, length, err)
			}
		}
	}
}

// TestLargeFramesPipeline sends, in one batch, large Binds of a named
// statement and then a new statement with a large Bind, while connections
// change hands; and the same through a client whose statements are all
// unnamed (describe_exec).
func TestLargeFramesPipeline(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	largeNoise(t, p)
	ctx := ctxTimeout(t, 120*time.Second)
	for _, mode := range []string{"cache_statement", "describe_exec"} {
		c := connectDSN(t, p.appDSN("application_name=large_pipeline", "default_query_exec_mode="+mode))
		largePipeline(t, ctx, c)
	}
}

func largePipeline(t *testing.T, ctx context.Context, c *pgx.Conn) {
	t.Helper()
	big := strings.Repeat("y", 700<<10)
	for r := range 4 {
		b := &pgx.Batch{}
		for i := range 4 {
			b.Queue("SELECT length($1::text) + $2::int4", big, int32(i))
		}
		b.Queue(fmt.Sprintf("SELECT length($1::text) + %d", r), big)
		res := c.SendBatch(ctx, b)
		for i := range 4 {
			var got int
			if err := res.QueryRow().Scan(&got); err != nil || got != len(big)+i {
				t.Fatalf("round %d, pipelined Bind %d: got %d, %v", r, i, got, err)
			}
		}
		var got int
		if err := res.QueryRow().Scan(&got); err != nil || got != len(big)+r {
			t.Fatalf("round %d, unnamed after the pipeline: got %d, %v", r, got, err)
		}
		if err := res.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
