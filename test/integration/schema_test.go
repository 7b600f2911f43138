package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/test/pgtest"
)

// Schema changes and statements poolerd keeps prepared for a pool's clients
// (issue 13, item 2). After a migration, PostgreSQL rejects a statement
// planned against the old schema (0A000 "cached plan must not change result
// type", XX000 "cache lookup failed for type"). A client that prepares the
// statement again must get a statement planned against the new schema, as
// on a direct connection, not poolerd's stale one again and again.
func TestSchemaChangeStatements(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 60*time.Second)
	table, typ := relayName("schema_t"), relayName("schema_ty")
	if err := pg.Exec(ctx, pgtest.DBApp, "CREATE TYPE "+typ+" AS ENUM ('a', 'b'); CREATE TABLE "+table+
		" (id int, v "+typ+"); INSERT INTO "+table+" VALUES (1, 'a'); GRANT ALL ON "+table+" TO app; ALTER TYPE "+typ+" OWNER TO app; ALTER TABLE "+table+" OWNER TO app"); err != nil {
		t.Fatal(err)
	}
	p := tsStart(t, 1, nil)
	// Two clients of the one server connection: the statement b prepares
	// is the one a prepared (poolerd shares it).
	a := tsConn(t, p, "schema_a")
	b := tsConn(t, p, "schema_b")
	query := "SELECT * FROM " + table + " WHERE id = $1"
	run := func(c *pgx.Conn) (int, error) {
		rows, err := c.Query(ctx, query, 1)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		n := len(rows.FieldDescriptions())
		for rows.Next() {
		}
		return n, rows.Err()
	}
	// until runs the query on c until it succeeds (the first attempt after
	// a migration may fail, as it does on a direct connection for a
	// statement the client prepared itself) and returns the column count.
	until := func(c *pgx.Conn, what string) int {
		t.Helper()
		var last error
		for attempt := range 3 {
			n, err := run(c)
			if err == nil {
				return n
			}
			last = err
			t.Logf("%s, attempt %d: %v", what, attempt+1, err)
		}
		t.Fatalf("%s: still failing after 3 attempts: %v", what, last)
		return 0
	}
	if n := until(a, "before the migration"); n != 2 {
		t.Fatalf("before: %d columns", n)
	}
	if n := until(b, "b before the migration"); n != 2 {
		t.Fatalf("b before: %d columns", n)
	}
	if err := pg.Exec(ctx, pgtest.DBApp, "ALTER TABLE "+table+" ADD COLUMN w int DEFAULT 7"); err != nil {
		t.Fatal(err)
	}
	if n := until(a, "a after ALTER TABLE"); n != 3 {
		t.Fatalf("a after ALTER TABLE: %d columns, want 3", n)
	}
	if n := until(b, "b after ALTER TABLE"); n != 3 {
		t.Fatalf("b after ALTER TABLE: %d columns, want 3", n)
	}
	// A type dropped and created again (an enum recreated by a migration).
	enumQuery := "SELECT $1::" + typ + "::text"
	enum := func(c *pgx.Conn) error {
		var s string
		return c.QueryRow(ctx, enumQuery, "a").Scan(&s)
	}
	if err := enum(a); err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, pgtest.DBApp, "ALTER TABLE "+table+" DROP COLUMN v; DROP TYPE "+typ+"; CREATE TYPE "+typ+" AS ENUM ('a', 'b', 'c'); ALTER TYPE "+typ+" OWNER TO app"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgx.Conn{a, b} {
		var err error
		for range 3 {
			if err = enum(c); err == nil {
				break
			}
			t.Logf("enum after DROP/CREATE TYPE: %v", err)
			// pgx keeps its own cache of described statements: a client
			// that sees the error drops it, as on a direct connection.
			c.DeallocateAll(context.Background())
		}
		if err != nil {
			t.Fatalf("enum query after DROP/CREATE TYPE: still failing: %v", err)
		}
	}
}
