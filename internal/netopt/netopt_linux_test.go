package netopt

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// Apply sets keepalive's idle time, interval and count, and
// TCP_USER_TIMEOUT, as the kernel reports them back; Enable off turns
// keepalive off.
func TestApply(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func() map[string]int {
		got := map[string]int{}
		rc, _ := c.(*net.TCPConn).SyscallConn()
		_ = rc.Control(func(fd uintptr) {
			for name, opt := range map[string][2]int{
				"keepalive": {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
				"idle":      {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
				"interval":  {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
				"count":     {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
				"user":      {syscall.IPPROTO_TCP, tcpUserTimeout},
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
	o := TCP{KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 40 * time.Second, Interval: 7 * time.Second, Count: 4},
		UserTimeout: 2500 * time.Millisecond}
	if err := o.Apply(c); err != nil {
		t.Fatal(err)
	}
	if got := read(); got["keepalive"] == 0 || got["idle"] != 40 || got["interval"] != 7 || got["count"] != 4 || got["user"] != 2500 {
		t.Errorf("options %v, want keepalive after 40 s every 7 s, 4 probes, user timeout 2500 ms", got)
	}
	off := TCP{KeepAlive: net.KeepAliveConfig{Enable: false}}
	if err := off.Apply(c); err != nil {
		t.Fatal(err)
	}
	if got := read(); got["keepalive"] != 0 {
		t.Errorf("keepalive still on: %v", got)
	}
}
