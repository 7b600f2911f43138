// Package takeover opens poolerd's listening socket (with SO_REUSEPORT if
// asked) and hands it from a running poolerd to a new one over a Unix
// socket, with SCM_RIGHTS, so that an upgrade refuses no connection.
package takeover

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listen opens a TCP listener on addr; with reusePort the socket gets
// SO_REUSEPORT before it is bound, so that another process that sets it
// too can bind the same address (PgBouncer's so_reuseport).
func Listen(ctx context.Context, addr string, reusePort bool) (net.Listener, error) {
	var lc net.ListenConfig
	if reusePort {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("setsockopt SO_REUSEPORT: %w", serr)
			}
			return nil
		}
	}
	return lc.Listen(ctx, "tcp", addr)
}
