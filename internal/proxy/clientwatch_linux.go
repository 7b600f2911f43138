package proxy

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// canWatch says that peerGone can tell a client that left.
const canWatch = true

// tcpEstablished is TCP_ESTABLISHED of the kernel's tcp_states.h.
const tcpEstablished = 1

// peerGone reports, without reading, whether the peer of the socket fd has
// closed or reset the connection. A peek at the next byte tells end of
// stream and errors; behind unread data the TCP state tells whether the
// peer has closed since (CLOSE_WAIT).
func peerGone(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return false // nothing to read: the client is just quiet
	case err != nil:
		return true // reset, or any other failure of the connection
	case n == 0:
		return true // end of stream
	}
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && info.State != tcpEstablished
}
