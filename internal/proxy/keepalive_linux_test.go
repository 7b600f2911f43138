package proxy

import (
	"github.com/poolerd/poolerd/internal/config"
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
	got := sockOpts(t, s.conn)
	secs := int(clientKeepAlive / time.Second)
	if got["keepalive"] == 0 || got["idle"] != secs || got["interval"] != secs || got["nodelay"] == 0 {
		t.Errorf("client socket options %v, want keepalive on every %d s and TCP_NODELAY", got, secs)
	}
}

// sockOpts reads the keepalive options, TCP_USER_TIMEOUT and TCP_NODELAY
// of c.
func sockOpts(t *testing.T, c net.Conn) map[string]int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	_ = rc.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"keepalive": {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
			"idle":      {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
			"interval":  {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
			"count":     {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
			"user":      {syscall.IPPROTO_TCP, 0x12}, // TCP_USER_TIMEOUT
			"nodelay":   {syscall.IPPROTO_TCP, syscall.TCP_NODELAY},
		} {
			v, err := syscall.GetsockoptInt(int(fd), opt[0], opt[1])
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			got[name] = v
		}
	})
	return got
}

// TestTCPOptions: the tcp_* keys set keepalive and TCP_USER_TIMEOUT on
// client sockets and on server sockets; tcp_keepalive off turns keepalive
// off on both.
func TestTCPOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *config.Config)
		want   map[string]int
	}{
		{"set", func(c *config.Config) {
			c.TCPKeepIdle, c.TCPKeepInterval, c.TCPKeepCount, c.TCPUserTimeout = 40*time.Second, 6*time.Second, 3, 20*time.Second
		}, map[string]int{"keepalive": 1, "idle": 40, "interval": 6, "count": 3, "user": 20000}},
		{"off", func(c *config.Config) { c.TCPKeepalive = false }, map[string]int{"keepalive": 0, "user": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := startFakeBackend(t, 64)
			rl := startRelay(t, fb, 1, tc.mutate)
			c := dialBench(t, rl.addr, simpleRequest)
			if err := c.roundTrip(); err != nil {
				t.Fatal(err)
			}
			var s *session
			for _, x := range rl.srv.sessionList() {
				s = x
			}
			var sc *serverConn
			for _, p := range rl.srv.poolList() {
				for _, x := range p.pool.All() {
					sc = x
				}
			}
			if s == nil || sc == nil {
				t.Fatal("no session or no server connection")
			}
			for side, conn := range map[string]net.Conn{"client": s.conn, "server": sc.Conn.Conn} {
				got := sockOpts(t, conn)
				for k, v := range tc.want {
					if (k == "keepalive" && (got[k] != 0) != (v != 0)) || (k != "keepalive" && got[k] != v) {
						t.Errorf("%s socket: %s = %d, want %d (all: %v)", side, k, got[k], v, got)
					}
				}
			}
		})
	}
}
