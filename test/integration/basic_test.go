package integration

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/test/pgtest"
)

func TestSimpleAndExtendedQueries(t *testing.T) {
	p := startPoolerd(t, nil)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeDescribeExec,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			c := p.connect(t)
			ctx := ctxTimeout(t, 10*time.Second)
			var n int
			var s string
			if err := c.QueryRow(ctx, "SELECT $1::int + 1, $2::text", mode, 41, "x").Scan(&n, &s); err != nil {
				t.Fatal(err)
			}
			if n != 42 || s != "x" {
				t.Fatalf("got %d %q", n, s)
			}
		})
	}
}

func TestWrongPassword(t *testing.T) {
	p := startPoolerd(t, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	_, err := pgx.Connect(ctx, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "28P01" {
		t.Fatalf("want 28P01, got %v", err)
	}
}
