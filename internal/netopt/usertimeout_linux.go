package netopt

import (
	"net"
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h), which package syscall
// does not name.
const tcpUserTimeout = 0x12

func setUserTimeout(tc *net.TCPConn, d time.Duration) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d/time.Millisecond))
	}); err != nil {
		return err
	}
	return serr
}
