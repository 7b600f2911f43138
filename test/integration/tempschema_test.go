package integration

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// A client's temp table shadows a table of the same name for the statements
// it prepares afterwards, through poolerd as directly, even when another
// client prepared the same text on the same server connection first (the
// state fuzzer's seed 10026779). PostgreSQL re-plans such a statement when
// the backend's temporary schema first appears, but not in a backend that
// already has one from an earlier client (DISCARD ALL keeps the schema): so
// a connection on which a temporary object was created is closed when its
// client is done with it, never pooled (evictTempSchema). Pool of one
// server connection: C creates a temp object and leaves (pinned, or with
// ON COMMIT DROP and not pinned), B prepares "SELECT v FROM t" (the public
// table), A creates its own temp t and prepares the same text.
func TestTempSchemaNotHandedOn(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 1
	})
	ctx := ctxTimeout(t, 60*time.Second)
	table := relayTable(t, "v text")
	if _, err := relayDirect(t).Exec(ctx, "INSERT INTO "+table+" VALUES ('public')"); err != nil {
		t.Fatal(err)
	}
	read := "SELECT v FROM " + table
	for _, tc := range []struct{ name, c string }{
		{"pinned temp table", "CREATE TEMP TABLE " + relayName("other") + " AS SELECT 1 AS x"},
		{"temp table ON COMMIT DROP", "BEGIN; CREATE TEMP TABLE " + relayName("other") + " (x int) ON COMMIT DROP; COMMIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evicted := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Evictions["temp_schema"]
			c := p.connect(t, "default_query_exec_mode=simple_protocol")
			if _, err := c.Exec(ctx, tc.c); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
			p.waitNoActive(t, pgtest.DBApp)
			b := p.connect(t) // pgx's statement cache: a named statement
			var v string
			if err := b.QueryRow(ctx, read).Scan(&v); err != nil || v != "public" {
				t.Fatalf("B read %q, %v; want the public table's row", v, err)
			}
			a := p.connect(t)
			if _, err := a.Exec(ctx, "CREATE TEMP TABLE "+table+" AS SELECT 'temp-a'::text AS v", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			if err := a.QueryRow(ctx, read).Scan(&v); err != nil || v != "temp-a" {
				t.Errorf("A read %q, %v after creating its own temp %s; want its temp table's row, as directly", v, err, table)
			}
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}
			p.waitNoActive(t, pgtest.DBApp)
			if n := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Evictions["temp_schema"]; n != evicted+2 {
				t.Errorf("%d connections closed for a temporary schema, want C's and A's (%d)", n-evicted, 2)
			}
		})
	}
}
