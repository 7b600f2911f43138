package proxy

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// TestResetRoleOnHandOff: a server connection that changes hands gets
// RESET ROLE ahead of the new client's request, in the same write (no
// round trip: the backend reads both at once), and the client never sees
// its answer; a client that gets back the connection it used last gets
// nothing extra.
func TestResetRoleOnHandOff(t *testing.T) {
	fb := startFakeBackend(t, 16)
	var mu sync.Mutex
	var resets, alone int
	fb.mu.Lock() // before any connection: accept takes fb.mu
	fb.onRead = func(p []byte) {
		i := bytes.Index(p, resetRoleQuery)
		if i < 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		resets++
		if !bytes.HasPrefix(p[i+len(resetRoleQuery):], simpleRequest) {
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
		resets int
	}{
		{c1, 0}, {c1, 0}, // the connection's first client, then the same one
		{c2, 1}, {c2, 1}, // another client: reset once
		{c1, 2}, {c2, 3}, {c2, 3},
	} {
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
