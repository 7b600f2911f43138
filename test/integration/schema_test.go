package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// schemaTable creates a table owned by app with two columns and one row,
// and returns its name.
func schemaTable(t *testing.T, prefix string) string {
	t.Helper()
	table := relayName(prefix)
	ctx := ctxTimeout(t, 20*time.Second)
	if err := pg.Exec(ctx, pgtest.DBApp, "CREATE TABLE "+table+" (id int, v text); INSERT INTO "+table+" VALUES (1, 'a'); ALTER TABLE "+table+" OWNER TO app"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Exec(context.Background(), pgtest.DBApp, "DROP TABLE IF EXISTS "+table) })
	return table
}

// After a migration, a client that prepares a statement poolerd already
// has prepared (for another client, before the migration) gets it at the
// first attempt, as it would directly: poolerd prepares it again and
// retries the request (internal/proxy/retry.go). Before, the first
// attempt failed with 0A000 (ALTER TABLE) or XX000 (a type recreated).
func TestSchemaChangeRetry(t *testing.T) {
	// pgx's named statements, which poolerd shares (cache_describe and exec
	// use the unnamed statement, which is never shared); "exec" checks that
	// nothing changes for them.
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxTimeout(t, 60*time.Second)
			table := schemaTable(t, "retry_t")
			typ := relayName("retry_ty")
			if err := pg.Exec(ctx, pgtest.DBApp, "CREATE TYPE "+typ+" AS ENUM ('a', 'b'); ALTER TYPE "+typ+" OWNER TO app"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pg.Exec(context.Background(), pgtest.DBApp, "DROP TYPE IF EXISTS "+typ) })
			p := tsStart(t, 1, nil) // one server connection: every client shares its statements
			query := "SELECT * FROM " + table + " WHERE id = $1"
			columns := func(c *pgx.Conn) (int, error) {
				rows, err := c.Query(ctx, query, 1)
				if err != nil {
					return 0, err
				}
				defer rows.Close()
				for rows.Next() {
				}
				return len(rows.FieldDescriptions()), rows.Err()
			}
			enumQuery := "SELECT $1::" + typ + "::text"
			enum := func(c *pgx.Conn) error {
				var s string
				return c.QueryRow(ctx, enumQuery, "b").Scan(&s)
			}
			a := connectDSN(t, p.appDSN("default_query_exec_mode="+mode))
			if n, err := columns(a); err != nil || n != 2 {
				t.Fatalf("before the migration: %d, %v", n, err)
			}
			if err := enum(a); err != nil {
				t.Fatalf("enum before the migration: %v", err)
			}
			if err := pg.Exec(ctx, pgtest.DBApp, "ALTER TABLE "+table+" ADD COLUMN w int DEFAULT 7"); err != nil {
				t.Fatal(err)
			}
			// A new client prepares the statement a prepared: the first
			// attempt works.
			b := connectDSN(t, p.appDSN("default_query_exec_mode="+mode))
			n, err := columns(b)
			if err != nil {
				t.Fatalf("a new client's first query after ALTER TABLE: %v", err)
			}
			if n != 3 {
				t.Errorf("a new client's query has %d columns, want 3", n)
			}
			if err := pg.Exec(ctx, pgtest.DBApp, "DROP TYPE "+typ+"; CREATE TYPE "+typ+" AS ENUM ('a', 'b', 'c'); ALTER TYPE "+typ+" OWNER TO app"); err != nil {
				t.Fatal(err)
			}
			c := connectDSN(t, p.appDSN("default_query_exec_mode="+mode))
			if err := enum(c); err != nil {
				t.Fatalf("a new client's first enum query after DROP/CREATE TYPE: %v", err)
			}
		})
	}
}

// The same with client libraries that prepare named statements in one
// request with their first execution (psycopg 3 with prepare_threshold=0,
// the PostgreSQL JDBC driver with prepareThreshold=-1) or in a request of
// their own (asyncpg). Each warms poolerd's statement with one connection,
// runs the migration directly, and queries from a new connection.
func TestSchemaChangeRetryDrivers(t *testing.T) {
	p := tsStart(t, 1, nil)
	addr := p.addr
	host, port, _ := strings.Cut(addr, ":")
	run := func(t *testing.T, name string, cmd *exec.Cmd) {
		t.Helper()
		out, err := cmd.CombinedOutput()
		got := strings.TrimSpace(string(out))
		if err != nil || got != "3" {
			t.Fatalf("%s: %v\n%s\nwant 3 columns from the new connection's first query", name, err, got)
		}
	}
	t.Run("psycopg", func(t *testing.T) {
		requirePython(t, "psycopg")
		table := schemaTable(t, "retry_pg3")
		script := `
import sys, psycopg
q = "SELECT * FROM ` + table + ` WHERE id = %s"
with psycopg.connect(sys.argv[1], prepare_threshold=0, autocommit=True) as a:
    a.execute(q, (1,)).fetchall()
    with psycopg.connect(sys.argv[2], autocommit=True) as d:
        d.execute("ALTER TABLE ` + table + ` ADD COLUMN w int DEFAULT 7")
    with psycopg.connect(sys.argv[1], prepare_threshold=0, autocommit=True) as b:
        cur = b.execute(q, (1,))
        cur.fetchall()
        print(len(cur.description))
`
		run(t, "psycopg", exec.Command("/usr/bin/python3", "-c", script, p.appDSN(), directDSN(pgtest.DBApp)))
	})
	t.Run("asyncpg", func(t *testing.T) {
		requirePython(t, "asyncpg")
		table := schemaTable(t, "retry_apg")
		script := `
import sys, asyncio, asyncpg
q = "SELECT * FROM ` + table + ` WHERE id = $1"
async def main():
    a = await asyncpg.connect(sys.argv[1])
    await a.fetch(q, 1)
    d = await asyncpg.connect(sys.argv[2])
    await d.execute("ALTER TABLE ` + table + ` ADD COLUMN w int DEFAULT 7")
    await d.close()
    b = await asyncpg.connect(sys.argv[1])
    rows = await b.fetch(q, 1)
    print(len(rows[0]))
    await b.close()
    await a.close()
asyncio.run(main())
`
		run(t, "asyncpg", exec.Command("/usr/bin/python3", "-c", script, p.appDSN(), directDSN(pgtest.DBApp)))
	})
	// pgjdbc heals 0A000 and 26000 itself (it prepares again and runs the
	// statement again): this checks that its retry and poolerd's agree.
	t.Run("jdbc", func(t *testing.T) {
		const jar = "/usr/share/java/postgresql.jar"
		if _, err := os.Stat(jar); err != nil {
			t.Skip("no PostgreSQL JDBC driver (libpostgresql-jdbc-java; CI installs it)")
		}
		if _, err := exec.LookPath("java"); err != nil {
			t.Skip("no java (default-jdk-headless; CI installs it)")
		}
		table := schemaTable(t, "retry_jdbc")
		src := filepath.Join(t.TempDir(), "Retry.java")
		if err := os.WriteFile(src, []byte(`
import java.sql.*;
public class Retry {
  static int columns(Connection c) throws SQLException {
    try (PreparedStatement ps = c.prepareStatement("SELECT * FROM `+table+` WHERE id = ?")) {
      ps.setInt(1, 1);
      try (ResultSet rs = ps.executeQuery()) { while (rs.next()) {} return rs.getMetaData().getColumnCount(); }
    }
  }
  public static void main(String[] a) throws Exception {
    try (Connection c1 = DriverManager.getConnection(a[0], a[1], a[2])) {
      columns(c1);
      try (Connection d = DriverManager.getConnection(a[3], a[1], a[2]); Statement st = d.createStatement()) {
        st.execute("ALTER TABLE `+table+` ADD COLUMN w int DEFAULT 7");
      }
      try (Connection c2 = DriverManager.getConnection(a[0], a[1], a[2])) {
        System.out.println(columns(c2));
      }
    }
  }
}
`), 0o644); err != nil {
			t.Fatal(err)
		}
		url := fmt.Sprintf("jdbc:postgresql://%s:%s/%s?sslmode=disable&prepareThreshold=-1", host, port, pgtest.DBApp)
		dhost, dport, _ := strings.Cut(pg.Addr(), ":")
		direct := fmt.Sprintf("jdbc:postgresql://%s:%s/%s?sslmode=disable", dhost, dport, pgtest.DBApp)
		run(t, "jdbc", exec.Command("java", "-cp", jar, src, url, pgtest.RoleApp, pgtest.Password, direct))
	})
}

// requirePython skips t unless Debian's python3 has module.
func requirePython(t *testing.T, module string) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import "+module).Run(); err != nil {
		t.Skipf("python3 module %s is not installed (CI installs python3-%s)", module, module)
	}
}
