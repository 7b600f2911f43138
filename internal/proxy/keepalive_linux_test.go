package proxy

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// TestClientKeepAlive: a client socket has TCP keepalive every
// clientKeepAlive and TCP_NODELAY, though serveConn no longer sets them
// (Go's accept does): a client host that vanishes without a FIN is noticed
// within minutes, and small answers are not delayed.
func TestClientKeepAlive(t *testing.T) {
	fb := startFakeBackend(t, 64)
	rl := startRelay(t, fb, 1)
	c := dialBench(t, rl.addr, simpleRequest)
	if err := c.roundTrip(); err != nil {
		t.Fatal(err)
	}
	var s *session
	for _, x := range rl.srv.sessionList() {
		s = x
	}
	if s == nil {
		t.Fatal("no session")
	}
	rc, err := s.conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	_ = rc.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"SO_KEEPALIVE":  {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
			"TCP_KEEPIDLE":  {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
			"TCP_KEEPINTVL": {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
			"TCP_NODELAY":   {syscall.IPPROTO_TCP, syscall.TCP_NODELAY},
		} {
			v, err := syscall.GetsockoptInt(int(fd), opt[0], opt[1])
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			got[name] = v
		}
	})
	secs := int(clientKeepAlive / time.Second)
	if got["SO_KEEPALIVE"] == 0 || got["TCP_KEEPIDLE"] != secs || got["TCP_KEEPINTVL"] != secs || got["TCP_NODELAY"] == 0 {
		t.Errorf("client socket options %v, want keepalive on every %d s and TCP_NODELAY", got, secs)
	}
}
