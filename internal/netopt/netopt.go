// Package netopt sets the TCP options of poolerd's sockets, to clients and
// to PostgreSQL: keepalive (whether, after how long idle, how often, how
// many unanswered probes) and TCP_USER_TIMEOUT (how long sent data may stay
// unacknowledged), as PgBouncer's tcp_keepalive, tcp_keepidle,
// tcp_keepintvl, tcp_keepcnt and tcp_user_timeout set them; and reads the
// user of a Unix-socket client (SO_PEERCRED) for peer authentication, and
// the accept queue of a listener (AcceptQueued).
package netopt

import (
	"net"
	"time"
)

// TCP is the options of one kind of socket.
type TCP struct {
	// KeepAlive is as net.KeepAliveConfig: Enable off turns keepalive
	// off; a zero Idle, Interval or Count keeps the operating system's.
	KeepAlive net.KeepAliveConfig
	// UserTimeout, when positive, closes a connection whose sent data
	// stays unacknowledged that long (Linux; ignored elsewhere).
	UserTimeout time.Duration
}

// Apply sets o on c, when c is a TCP connection (a Unix socket has no such
// options). It returns the first error.
func (o *TCP) Apply(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	if err := tc.SetKeepAliveConfig(o.KeepAlive); err != nil {
		return err
	}
	if o.UserTimeout > 0 {
		return setUserTimeout(tc, o.UserTimeout)
	}
	return nil
}
