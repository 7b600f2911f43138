package proxy

import (
	"context"
	"net"
	"testing"
	"time"
)

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
