package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/netopt"
)

// TestCloseDrained: a listener closed while the kernel holds completed
// connections nobody accepted yet (its accept loop busy for a moment) is
// closed only once they are accepted, so they are served (during a
// shutdown: answered), not reset; with so_reuseport the next poolerd gets
// every later one.
func TestCloseDrained(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	accepted := make(chan int)
	go func() {
		time.Sleep(20 * time.Millisecond) // the accept loop is busy
		k := 0
		for {
			c, err := ln.Accept()
			if err != nil {
				accepted <- k
				return
			}
			k++
			c.Close()
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if q := netopt.AcceptQueued(ln); q == n {
			break
		}
	}
	closeDrained(ln)
	if k := <-accepted; k != n {
		t.Fatalf("%d of %d queued connections accepted before the close (the rest were reset)", k, n)
	}
}
