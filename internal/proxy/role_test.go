package proxy

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/wire"
)

// TestResetRoleOnHandOff: a server connection on which a client called a
// function (which may have set the role) gets RESET ROLE and RESET ALL ahead of the next
// other client's request, in the same write (no round trip: the backend
// reads both at once), and the client never sees its answer. Plain
// requests, and the same client getting its connection back, cost nothing.
func TestResetRoleOnHandOff(t *testing.T) {
	fb := startFakeBackend(t, 16)
	var mu sync.Mutex
	var resets, alone int
	fb.mu.Lock() // before any connection: accept takes fb.mu
	fb.onRead = func(p []byte) {
		i := bytes.Index(p, []byte(resetSQL))
		if i < 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		resets++
		if !bytes.Contains(p[i:], simpleRequest) && !bytes.Contains(p[i:], callRequest) {
			alone++
		}
	}
	fb.mu.Unlock()
	t.Cleanup(func() {
		if err := fb.Err(); err != nil {
			t.Errorf("fake backend: %v", err)
		}
	})
	rl := startRelay(t, fb, 1)
	c1 := dialBench(t, rl.addr, simpleRequest)
	c2 := dialBench(t, rl.addr, simpleRequest)
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return resets, alone
	}
	for i, step := range []struct {
		c      *benchClient
		req    []byte
		resets int
	}{
		{c1, simpleRequest, 0}, {c2, simpleRequest, 0}, {c1, simpleRequest, 0}, // plain: nothing
		{c1, callRequest, 0}, {c1, simpleRequest, 0}, // the caller keeps its connection as it is
		{c2, simpleRequest, 1}, // the next client: reset
		{c1, simpleRequest, 1}, // c2 called nothing: no reset
		{c2, callRequest, 1}, {c2, callRequest, 1}, {c1, callRequest, 2}, {c2, simpleRequest, 3},
		{c2, simpleRequest, 3}, {c1, simpleRequest, 3},
	} {
		step.c.request = step.req
		if err := step.c.roundTrip(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if r, a := count(); r != step.resets || a != 0 {
			t.Fatalf("step %d: %d RESET ROLE (%d not followed by the request in the same read), want %d", i, r, a, step.resets)
		}
	}
	// Exactly one answer per request reached each client.
	for _, c := range []*benchClient{c1, c2} {
		_ = c.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var b [1]byte
		if n, err := c.conn.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
			var ne net.Error
			t.Fatalf("client read %d bytes more (%v, timeout %v)", n, err, errors.As(err, &ne) && ne.Timeout())
		}
		_ = c.conn.SetReadDeadline(time.Time{})
	}
}

// callRequest calls a function of the application's.
var callRequest = wire.AppendQuery(nil, "SELECT app.set_tenant('a')")
