//go:build linux

package proxy

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/poolerd/poolerd/internal/config"
)

// waitFor polls cond for up to limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIdleClientsPark: idle clients hold no goroutine. They park right after
// login, wake up for a query, park again after a sweep interval without
// traffic, end when they hang up while parked, and get the shutdown error
// while parked; the parker's goroutines stop with the server.
func TestIdleClientsPark(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) }) // runs last
	fb := startFakeBackend(t, 16)
	rl := startRelay(t, fb, 2, func(c *config.Config) { c.EventLoops = "off" })
	const n = 200
	before := runtime.NumGoroutine()
	clients := make([]*benchClient, n)
	for i := range clients {
		clients[i] = dialBench(t, rl.addr, simpleRequest)
	}
	p := rl.srv.parker
	waitFor(t, 5*time.Second, "all clients parked after login", func() bool { return p.parkedCount() == n })
	if g := runtime.NumGoroutine() - before; g > n/4 {
		t.Fatalf("%d idle clients hold %d goroutines", n, g)
	}

	// A query wakes a client up; it parks again after a sweep or two.
	for i, c := range clients {
		if err := c.roundTrip(); err != nil {
			t.Fatalf("client %d after parking: %v", i, err)
		}
	}
	if p.parkedCount() == n {
		t.Fatal("no client was woken by its query")
	}
	waitFor(t, 3*parkSweep+time.Second, "clients parked again after a sweep", func() bool { return p.parkedCount() == n })
	for i, c := range clients[:10] {
		for range 3 {
			if err := c.roundTrip(); err != nil {
				t.Fatalf("client %d after parking twice: %v", i, err)
			}
		}
	}

	// Clients hanging up while parked end their sessions.
	for _, c := range clients[n/2:] {
		c.close()
	}
	waitFor(t, 5*time.Second, "sessions of the clients that left to end", func() bool {
		return rl.srv.clientSessions() == n/2
	})

	// Shutdown terminates the parked ones, which get the error.
	waitFor(t, 3*parkSweep+time.Second, "remaining clients parked", func() bool { return p.parkedCount() == n/2 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rl.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with parked clients: %v", err)
	}
	expectShutdownError(t, "parked client", clients[:n/2])
}

// expectShutdownError checks that each client reads a 57P01 error.
func expectShutdownError(t *testing.T, what string, clients []*benchClient) {
	t.Helper()
	for i, c := range clients {
		_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 512)
		k, _ := c.conn.Read(buf)
		if !bytes.Contains(buf[:k], []byte("57P01")) {
			t.Fatalf("%s %d got %q at shutdown, want a 57P01 error", what, i, buf[:k])
		}
	}
}

// TestSessionModeClientsDoNotPark: a session-mode client holds its server
// connection from login on, so it is never parked, however long it stays
// idle; it answers at once, and a shutdown still ends it at once with 57P01
// (it is idle, with its connection clean).
func TestSessionModeClientsDoNotPark(t *testing.T) {
	fb := startFakeBackend(t, 16)
	const n = 8
	rl := startRelay(t, fb, n, func(c *config.Config) { c.PoolMode = config.PoolSession; c.EventLoops = "off" })
	clients := make([]*benchClient, n)
	for i := range clients {
		clients[i] = dialBench(t, rl.addr, simpleRequest)
	}
	waitFor(t, 5*time.Second, "every client to hold a server connection", func() bool {
		ps := rl.srv.Pools()
		return len(ps) == 1 && ps[0].Active == n
	})
	time.Sleep(2*parkSweep + parkSweep/2)
	if k := rl.srv.parker.parkedCount(); k != 0 {
		t.Fatalf("%d session-mode clients holding server connections were parked", k)
	}
	for i, c := range clients {
		if err := c.roundTrip(); err != nil {
			t.Fatalf("client %d after idling: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := rl.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with idle session-mode clients: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("shutdown with idle session-mode clients took %s", d)
	}
	expectShutdownError(t, "session-mode client", clients)
}

// TestIdleClientsOnLoops: with event loops, a client holds no goroutine
// from its login on, busy or idle: the loop reads it. Queries are answered,
// clients that hang up end their sessions, and shutdown ends the rest with
// 57P01; the loops' goroutines stop with the server.
func TestIdleClientsOnLoops(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) }) // runs last
	fb := startFakeBackend(t, 16)
	rl := startRelay(t, fb, 2, func(c *config.Config) { c.EventLoops = "2" })
	const n = 200
	before := runtime.NumGoroutine()
	clients := make([]*benchClient, n)
	for i := range clients {
		clients[i] = dialBench(t, rl.addr, simpleRequest)
	}
	e := rl.srv.engine
	waitFor(t, 5*time.Second, "all clients on the loops after login", func() bool { return e.ClientCount() == n })
	for round := range 3 {
		for i, c := range clients {
			if err := c.roundTrip(); err != nil {
				t.Fatalf("client %d, round %d: %v", i, round, err)
			}
		}
	}
	// A handler that waited (a loaded machine: the monitor hands over a
	// slow one) leaves its session on a goroutine until it is idle.
	waitFor(t, 3*parkSweep+time.Second, "every idle client back on the loops", func() bool { return e.ClientCount() == n })
	if g := runtime.NumGoroutine() - before; g > n/4 {
		t.Fatalf("%d clients that each ran 3 queries hold %d goroutines", n, g)
	}
	for _, c := range clients[n/2:] {
		c.close()
	}
	waitFor(t, 5*time.Second, "sessions of the clients that left to end", func() bool {
		return rl.srv.clientSessions() == n/2 && e.ClientCount() == n/2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rl.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with clients on the loops: %v", err)
	}
	expectShutdownError(t, "client on a loop", clients[:n/2])
	if k, c := e.Counts(); k != 0 || c != 0 {
		t.Fatalf("loops still hold %d sockets (%d clients) after shutdown", k, c)
	}
}
