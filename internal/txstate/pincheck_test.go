package txstate

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/test/pgtest"
)

// BenchmarkPinCheck measures, against a real PostgreSQL, what the pin check
// costs the pinned client whose transaction undid session state: one
// round trip of PinCheckSQL on its connection (check), next to a plain
// SELECT 1 round trip (select1) for scale. Run with
//
//	go test -run '^$' -bench PinCheck ./internal/txstate/
func BenchmarkPinCheck(b *testing.B) {
	pg, err := pgtest.Start(pgtest.Options{Logf: b.Logf})
	if err != nil {
		b.Fatalf("start PostgreSQL: %v", err)
	}
	b.Cleanup(func() { _ = pg.Cleanup() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	// Some state of each kind that the check looks at, then undone, as a
	// client that pinned and let go leaves its backend.
	for _, q := range []string{"LISTEN pin_bench", "UNLISTEN pin_bench", "CREATE TEMP TABLE pin_bench (x int)", "DROP TABLE pin_bench"} {
		if _, err := c.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct{ name, sql string }{
		{"check", PinCheckSQL(pgtest.RoleApp)}, {"select1", "SELECT 1"},
		{"locks", "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"},
		{"cursors", "SELECT count(*) FROM pg_cursors WHERE is_holdable"},
		{"temp", "SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()"},
		{"prepared", "SELECT count(*) FROM pg_prepared_statements WHERE from_sql"},
		{"listen", "SELECT count(*) FROM pg_listening_channels()"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				rows, err := c.Query(ctx, bc.sql, pgx.QueryExecModeSimpleProtocol)
				if err != nil {
					b.Fatal(err)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
