package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A client whose TCP connect to poolerd times out never reached poolerd:
// the kernel completes the handshake for a listening socket whether or not
// poolerd calls accept, unless the listen queue is full, and a full queue
// is counted (ListenOverflows, ListenDrops). So a connect that timed out
// while those counters stood still is the machine's network (CI once saw
// five of eight simultaneous connects to loopback go unanswered for 60 s
// while other connects went through), counted apart; with the counters
// moved, it may be poolerd not accepting, and counts as hung.

// listenDrops is the machine's count of connections refused for a full
// listen queue (TcpExt ListenOverflows + ListenDrops in /proc/net/netstat);
// ok is false where it cannot be read.
func listenDrops() (n uint64, ok bool) {
	f, err := os.Open("/proc/net/netstat")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var names []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "TcpExt:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		found := 0
		for i, v := range fields {
			if i >= len(names) || (names[i] != "ListenOverflows" && names[i] != "ListenDrops") {
				continue
			}
			x, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, false
			}
			n += x
			found++
		}
		return n, found == 2
	}
	return 0, false
}

// dialTimedOut reports whether err is a connect to the server that timed
// out before any byte was exchanged.
func dialTimedOut(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) && strings.Contains(err.Error(), "dial error") && pgconn.Timeout(err)
}

// TestDialLostNeedsNoOverflow: a connect that times out because a listen
// queue is full is recognised as a dial timeout, and the overflow is
// counted, so the soak counts it as hung, not as the machine's.
func TestDialLostNeedsNoOverflow(t *testing.T) {
	before, ok := listenDrops()
	if !ok {
		t.Skip("/proc/net/netstat has no TcpExt ListenOverflows here")
	}
	e := newErrorLog()
	// A listener with a backlog of 0 that never accepts: one connect
	// completes, the SYNs of the next ones are dropped.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			break
		}
		held = append(held, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pgconn.Connect(ctx, "postgres://u:p@"+addr+"/db?sslmode=disable&connect_timeout=1")
	if err == nil {
		t.Fatal("connected to a listener whose queue is full")
	}
	if !dialTimedOut(err) {
		t.Fatalf("not recognised as a connect that timed out: %v", err)
	}
	after, _ := listenDrops()
	if after == before || e.noListenDrops() {
		t.Fatalf("the full listen queue was not counted (%d → %d): a poolerd that stopped accepting would pass as the machine's fault", before, after)
	}
}
