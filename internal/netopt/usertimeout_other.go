//go:build !linux

package netopt

import (
	"net"
	"time"
)

// setUserTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere it is not set.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
