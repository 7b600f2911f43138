package proxy

import (
	"cmp"
	"net"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/netopt"
)

// tcpOptions returns the socket options the tcp_* keys ask for, period
// being the keepalive period poolerd uses where they do not say
// (clientKeepAlive, backend.ServerKeepAlive); nil when they ask for
// nothing else than that default, which costs no system call more.
func tcpOptions(cfg *config.Config, period time.Duration) *netopt.TCP {
	if cfg.TCPKeepalive && cfg.TCPKeepIdle == 0 && cfg.TCPKeepInterval == 0 && cfg.TCPKeepCount == 0 && cfg.TCPUserTimeout == 0 {
		return nil
	}
	o := &netopt.TCP{UserTimeout: cfg.TCPUserTimeout}
	if cfg.TCPKeepalive {
		count := cfg.TCPKeepCount
		if count == 0 {
			count = -1 // the system's
		}
		o.KeepAlive = net.KeepAliveConfig{Enable: true, Idle: cmp.Or(cfg.TCPKeepIdle, period),
			Interval: cmp.Or(cfg.TCPKeepInterval, period), Count: count}
	}
	return o
}
