// Package takeover opens poolerd's listening sockets (TCP, with
// SO_REUSEPORT if asked, and a Unix socket) and hands them from a running
// poolerd to a new one over a Unix socket, with SCM_RIGHTS, so that an
// upgrade refuses no connection.
package takeover

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
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

// ListenUnix opens a Unix-socket listener at path with file mode perm and,
// if group is set, that group (a name or a number). A socket file that no
// process serves (left by one that is gone) is replaced; one that a live
// process serves is an error, as PgBouncer's. The file is removed when the
// listener is closed (unless SetUnlinkOnClose(false): a hand-over).
func ListenUnix(path string, perm os.FileMode, group string) (*net.UnixListener, error) {
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			if g, err = user.LookupGroupId(group); err != nil {
				return nil, fmt.Errorf("unix_socket_group %q: no such group", group)
			}
		}
		if gid, err = strconv.Atoi(g.Gid); err != nil {
			return nil, fmt.Errorf("unix_socket_group %q: gid %q: %w", group, g.Gid, err)
		}
	}
	ul, live, err := bindUnix(path)
	switch {
	case live:
		return nil, fmt.Errorf("Unix socket %s: another process serves it (a second poolerd on this port needs a unix_socket_dir of its own)", path)
	case err != nil:
		return nil, fmt.Errorf("Unix socket %s: %w", path, err)
	}
	if err := os.Chmod(path, perm); err != nil {
		ul.Close()
		return nil, fmt.Errorf("Unix socket %s: unix_socket_mode %#o: %w", path, perm, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ul.Close()
			return nil, fmt.Errorf("Unix socket %s: unix_socket_group %q: %w", path, group, err)
		}
	}
	return ul, nil
}
