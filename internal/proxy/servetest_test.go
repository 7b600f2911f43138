package proxy

import (
	"context"
	"net"
	"testing"
	"time"
)

// serveTest serves srv on its configured listen address until the test
// ends, then shuts it down; it returns the address.
func serveTest(tb testing.TB, srv *Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", srv.cfg().Listen)
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
