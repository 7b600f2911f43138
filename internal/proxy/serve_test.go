package proxy

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// realPGServer starts a throwaway PostgreSQL (stopped when the test ends)
// and a Server in transaction mode in front of it, its configuration
// changed by mutate and validated; the test sets its hooks and serves it.
func realPGServer(t *testing.T, mutate func(c *config.Config)) (*Server, *pgtest.Server) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	pg, err := pgtest.Start(pgtest.Options{Logf: t.Logf})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = pg.Cleanup() })
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	cfg.PoolMode = config.PoolTransaction
	mutate(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return New(&cfg, zap.NewNop()), pg
}

// unreachableConfig returns the default configuration with a loopback
// listener, no HTTP server and an upstream that is never reached (port
// 1), changed by mutate and validated.
func unreachableConfig(tb testing.TB, mutate func(c *config.Config)) *config.Config {
	tb.Helper()
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = "postgres://app:secret@127.0.0.1:1/app"
	mutate(&cfg)
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	return &cfg
}

// serve runs srv on a loopback listener (cfg.Listen of the tests) until
// the test ends, then shuts it down, and returns the address clients dial.
func serve(tb testing.TB, srv *Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return ln.Addr().String()
}
