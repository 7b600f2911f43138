package netopt

import (
	"net"

	"golang.org/x/sys/unix"
)

// AcceptQueued is how many connections the kernel has completed for a
// listening TCP socket that nobody has accepted yet (TCP_INFO's unacked,
// which a listening socket sets to the length of its accept queue); 0 when
// that cannot be told.
func AcceptQueued(ln net.Listener) int {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return 0
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = int(info.Unacked)
		}
	})
	return n
}
