//go:build linux

package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/wire"
)

// unlessRescued runs a scenario of loop behaviour up to three times, until
// a run in which no loop's monitor took a loop over (a handler that ran a
// whole tick: on a loaded machine, -race and the suite's parallel
// packages, a loop's goroutine can be kept off its CPU that long, and the
// rescue changes what the scenario sees); the scenario reports what it
// found wrong, which counts only for such a run. If every run was rescued
// the test is skipped, saying so.
func unlessRescued(t *testing.T, scenario func(t *testing.T) (e *reactor.Engine, problems []string)) {
	t.Helper()
	for range 3 {
		e, problems := scenario(t)
		if rescues := e.Stats().Rescues; rescues > 0 {
			t.Logf("the monitor took a loop over (%d times): the run does not count", rescues)
			continue
		}
		for _, p := range problems {
			t.Error(p)
		}
		return
	}
	t.Skip("every run had a loop taken over by the monitor (a loaded machine)")
}

// keptWithin samples how many bytes a loop keeps for a peer that does not
// read (sample) every 20 ms until some are, for at most 10 s, and returns
// the most it saw.
func keptWithin(sample func() int64) int64 {
	var most int64
	for deadline := time.Now().Add(10 * time.Second); most == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		most = max(most, sample())
	}
	return most
}

// TestLoopPeerStopsReading: a client that sends many queries and reads none
// of their (large) answers cannot take what its server sends; the loop
// keeps the rest of one read for it and stops reading that server until
// the client reads (PgBouncer's backpressure), without giving the loop to
// another goroutine, so another client of the same loop is answered
// meanwhile, and the first still gets every answer, in order, once it
// reads. poolerd holds no more of the answers than one read: the server
// connection is not read while its client does not read.
func TestLoopPeerStopsReading(t *testing.T) {
	unlessRescued(t, func(t *testing.T) (*reactor.Engine, []string) {
		var problems []string
		fb := startFakeBackend(t, 256<<10)
		rl := startRelay(t, fb, 2, func(c *config.Config) { c.EventLoops = "1" })
		stalled := dialBench(t, rl.addr, simpleRequest)
		other := dialBench(t, rl.addr, simpleRequest)
		e := rl.srv.engine
		const n = 100 // 25 MB of answers
		var batch []byte
		for range n {
			batch = append(batch, simpleRequest...)
		}
		if _, err := stalled.conn.Write(batch); err != nil {
			t.Fatal(err)
		}
		// The socket buffers fill up, then the loop keeps the rest of a read.
		most := keptWithin(func() (kept int64) {
			for _, s := range rl.srv.sessionList() {
				if s.wmu.TryLock() { // held by a writer that waits
					if s.cio != nil {
						kept = max(kept, s.cio.Kept())
					}
					s.wmu.Unlock()
				}
			}
			return kept
		})
		// One read, and what a read may hold back from the one before it (a
		// frame's start, a held RowDescription).
		if most == 0 || most > serverReadSize+maxCapture+8 {
			problems = append(problems, fmt.Sprintf("output kept for the client that does not read: %d bytes, want some, at most one server read (%d)", most, serverReadSize))
		}
		_ = other.conn.SetDeadline(time.Now().Add(10 * time.Second))
		for i := range 20 {
			if err := other.roundTrip(); err != nil {
				t.Fatalf("the other client's query %d while one client does not read: %v", i, err)
			}
		}
		if tk := e.Stats().TakeOvers; tk != 0 {
			problems = append(problems, fmt.Sprintf("the loop was handed to another goroutine %d times while a client did not read", tk))
		}
		_ = stalled.conn.SetDeadline(time.Now().Add(20 * time.Second))
		if err := readReadies(stalled.conn, n); err != nil {
			t.Fatalf("answers to the client that stopped reading: %v", err)
		}
		if err := stalled.roundTrip(); err != nil {
			t.Fatalf("after catching up: %v", err)
		}
		if err := fb.Err(); err != nil {
			t.Fatal(err)
		}
		return e, problems
	})
}

// TestLoopServerStopsReading: a client that sends more than its server
// reads (a backend busy with a long query while the client pipelines
// megabytes of requests) fills the server's socket; the loop keeps the
// rest of one read of the client for the server and stops reading that
// client until the server takes it, without giving the loop to another
// goroutine, so another client of the same loop is answered meanwhile, and
// the first gets every answer once its server reads again.
func TestLoopServerStopsReading(t *testing.T) {
	unlessRescued(t, func(t *testing.T) (*reactor.Engine, []string) {
		var problems []string
		fb := startFakeBackend(t, 64)
		fb.stallQuery, fb.stallRelease = []byte("SELECT stall"), make(chan struct{})
		rl := startRelay(t, fb, 2, func(c *config.Config) { c.EventLoops = "1" })
		busy := dialBench(t, rl.addr, simpleRequest)
		other := dialBench(t, rl.addr, simpleRequest)
		e := rl.srv.engine
		// The stalling query, then 8 MB of queries in the same write: the
		// whole pipeline goes to the server the stalling query went to.
		const n = 8000
		batch := wire.AppendQuery(nil, "SELECT stall")
		pad := "SELECT x FROM bench -- " + strings.Repeat(".", 1000)
		for range n {
			batch = wire.AppendQuery(batch, pad)
		}
		answers := make(chan error, 1)
		go func() { answers <- readReadies(busy.conn, n+1) }()
		wrote := make(chan error, 1)
		go func() {
			_, err := busy.conn.Write(batch)
			wrote <- err
		}()
		most := keptWithin(func() (kept int64) {
			for _, s := range rl.srv.sessionList() {
				if sc := s.server.Load(); sc != nil && sc.io != nil {
					kept = max(kept, sc.io.Kept())
				}
			}
			return kept
		})
		// One read of the client, and the parameter sync ahead of it.
		if most == 0 || most > wire.BufferSize+1024 {
			problems = append(problems, fmt.Sprintf("output kept for the server that does not read: %d bytes, want some, at most one read of its client (%d)", most, wire.BufferSize))
		}
		_ = other.conn.SetDeadline(time.Now().Add(10 * time.Second))
		for i := range 20 {
			if err := other.roundTrip(); err != nil {
				t.Fatalf("the other client's query %d while a server does not read: %v", i, err)
			}
		}
		if tk := e.Stats().TakeOvers; tk != 0 {
			problems = append(problems, fmt.Sprintf("the loop was handed to another goroutine %d times while a server did not read", tk))
		}
		close(fb.stallRelease)
		_ = busy.conn.SetDeadline(time.Now().Add(30 * time.Second))
		if err := <-wrote; err != nil {
			t.Fatalf("the pipeline: %v", err)
		}
		if err := <-answers; err != nil {
			t.Fatalf("answers to the pipeline: %v", err)
		}
		if err := busy.roundTrip(); err != nil {
			t.Fatalf("after the pipeline: %v", err)
		}
		if err := fb.Err(); err != nil {
			t.Fatal(err)
		}
		return e, problems
	})
}

// TestLoopSessionsMovePaths: clients that queue for a pool too small for
// them wait on their loop (no goroutine: the pool hands each connection to
// the waiting session's loop), and nothing of what they send is lost or
// reordered on the way (run with -race); shutdown then ends them all.
func TestLoopSessionsMovePaths(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) }) // runs last
	fb := startFakeBackend(t, 64)
	rl := startRelay(t, fb, 2, func(c *config.Config) { c.EventLoops = "2" })
	const n = 24
	clients := dialBenches(t, rl.addr, n, simpleRequest)
	e := rl.srv.engine
	detaches0 := e.Stats().Detaches
	for round := range 2 {
		parks, detaches := e.Stats().Parks, e.Stats().Detaches
		for _, c := range clients {
			_ = c.conn.SetDeadline(time.Now().Add(20 * time.Second))
		}
		if err := roundTripsAtOnce(clients, 100); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if e.Stats().Parks == parks {
			t.Fatalf("round %d: %d clients on a pool of 2 never waited on their loop", round, n)
		}
		// A handler the monitor finds running for a whole tick (a slow
		// machine, -race) still leaves; waiting for a connection does
		// not.
		p, d := e.Stats().Parks-parks, e.Stats().Detaches-detaches
		t.Logf("round %d: %d waits on the loop, %d handlers left it", round, p, d)
		if d*10 > p {
			t.Fatalf("round %d: %d of %d waits left the loop for a goroutine", round, d, p)
		}
		// One that left comes back between two requests or when idle
		// (the parker's sweep): not yet, perhaps, right after its last.
		if got := e.ClientCount(); uint64(n-got) > e.Stats().Detaches-detaches0 {
			t.Fatalf("round %d: %d of %d clients on a loop, %d left it", round, got, n, e.Stats().Detaches-detaches0)
		}
	}
	if err := fb.Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rl.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	expectShutdownError(t, "client on a loop", clients)
}

// rateRelay starts a relay with one event loop and the rate-limit rule,
// and logs n clients in (with a deadline for their round trips).
func rateRelay(t *testing.T, fb *fakeBackend, rule config.RateLimitRule, n int) (*relay, []*benchClient) {
	t.Helper()
	rl := startRelay(t, fb, 4, func(c *config.Config) {
		c.EventLoops = "1"
		c.RateLimits = []config.RateLimitRule{rule}
	})
	clients := dialBenches(t, rl.addr, n, simpleRequest)
	for _, c := range clients {
		_ = c.conn.SetDeadline(time.Now().Add(20 * time.Second))
	}
	return rl, clients
}

// TestLoopRateCheckStaysOnLoop: a wait-mode rate limit that has room
// costs a request no hand-over of its loop (an in-memory decision does not
// block), so the sessions stay on their loop; before, each one's first
// request gave its loop away and it went on on a goroutine (LoopDetach).
func TestLoopRateCheckStaysOnLoop(t *testing.T) {
	fb := startFakeBackend(t, 64)
	rule := config.RateLimitRule{Name: "roomy", KeyBy: []string{"client"},
		Queries: &config.RateBucket{Limit: 1 << 40, Per: time.Minute}, Mode: "wait", MaxWait: time.Second}
	const n, rounds = 8, 50
	rl, clients := rateRelay(t, fb, rule, n)
	e := rl.srv.engine
	takeOvers, detaches := e.Stats().TakeOvers, e.Stats().Detaches
	if err := roundTripsAtOnce(clients, rounds); err != nil {
		t.Fatal(err)
	}
	// The monitor hands over a loop whose handler runs a whole tick (a
	// slow machine, -race): that may take one or two off, not all.
	tk, d, on := e.Stats().TakeOvers-takeOvers, e.Stats().Detaches-detaches, e.ClientCount()
	t.Logf("%d requests under a rate limit: %d hand-overs of the loop, %d sessions left it, %d of %d on it", n*rounds, tk, d, on, n)
	if on < n/2 || tk*10 > n*rounds {
		t.Fatalf("rate-checked requests left their loop: %d hand-overs, %d of %d sessions on the loop", tk, on, n)
	}
	if err := fb.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestLoopRateWaitsOnLoop: a request that must wait for a wait-mode rate
// limit parks on its loop (a timer wakes it to decide again), so the
// session neither gives its loop away nor leaves it; the wait still spaces
// the requests as the limit says; a client that leaves while it waits ends
// its session at once (an event on its socket wakes the wait;
// TestRateLimitWaitEndsWhenClientLeaves checks that its request does not
// run).
func TestLoopRateWaitsOnLoop(t *testing.T) {
	fb := startFakeBackend(t, 64)
	const per = 40 * time.Millisecond
	rule := config.RateLimitRule{Name: "spaced",
		Queries: &config.RateBucket{Limit: 1, Per: per}, Mode: "wait", MaxWait: 10 * time.Second}
	const n, rounds = 3, 4
	rl, clients := rateRelay(t, fb, rule, n)
	e := rl.srv.engine
	parks, takeOvers, detaches := e.Stats().Parks, e.Stats().TakeOvers, e.Stats().Detaches
	start := time.Now()
	if err := roundTripsAtOnce(clients, rounds); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	p, tk, d := e.Stats().Parks-parks, e.Stats().TakeOvers-takeOvers, e.Stats().Detaches-detaches
	t.Logf("%d requests, one per %v: %v, %d waits on the loop, %d hand-overs, %d left it", n*rounds, per, took, p, tk, d)
	// One budget for all: the first goes at once and each other waits
	// its turn, so the run takes about n*rounds-1 periods (at least
	// n*rounds-2, allowing for the clock).
	if min := time.Duration(n*rounds-2) * per; took < min {
		t.Fatalf("%d requests took %v, want at least %v: the limit did not space them", n*rounds, took, min)
	}
	// The monitor may hand over a handler that runs a whole tick (a slow
	// machine, -race), which takes its session off the loop: one, not
	// one per session (before, each session's first wait left).
	if p < uint64(n*rounds/2) || d > 1 || tk > 2 || e.ClientCount() < n-int(d) {
		t.Fatalf("rate-limit waits left the loop: %d waits on it, %d hand-overs, %d sessions left, %d of %d on it", p, tk, d, e.ClientCount(), n)
	}

	if err := fb.Err(); err != nil {
		t.Fatal(err)
	}

	// A client that leaves while its request waits, on a relay whose
	// limit is one query per 3s: its session ends long before the wait
	// would.
	const long = 3 * time.Second
	rule.Queries = &config.RateBucket{Limit: 1, Per: long}
	rl2, firsts := rateRelay(t, fb, rule, 1)
	if err := firsts[0].roundTrip(); err != nil { // takes the unit
		t.Fatal(err)
	}
	// Closed at once, and closed behind a Terminate (the data wakes the
	// wait first: it then watches for the hang-up alone).
	for _, terminate := range []bool{false, true} {
		leaver := dialBench(t, rl2.addr, simpleRequest)
		before := rl2.srv.engine.Stats().Parks
		if _, err := leaver.conn.Write(simpleRequest); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Second, "the request to wait on the loop", func() bool { return rl2.srv.engine.Stats().Parks > before })
		if terminate {
			if _, err := leaver.conn.Write(wire.AppendTerminate(nil)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Second, "the Terminate to wake the wait", func() bool { return rl2.srv.engine.Stats().Parks > before+1 })
		}
		_ = leaver.conn.Close()
		left := time.Now()
		waitFor(t, long/2, "the session whose client left during its rate-limit wait to end", func() bool { return rl2.srv.ClientCount() == 1 })
		t.Logf("terminate=%v: the session ended %v after its client left", terminate, time.Since(left).Round(time.Millisecond))
	}
}

// TestLoopCheckoutTimeoutOnLoop: a request that queues for a pool whose
// only connection another client holds waits on its loop and is refused
// at checkout_timeout (53300), timed by the loop's own timer (no
// goroutine, no runtime timer: the pool only records the deadline), and it
// does not leave the loop; once the holder is done, the next request is
// served.
func TestLoopCheckoutTimeoutOnLoop(t *testing.T) {
	fb := startFakeBackend(t, 64)
	const limit = 300 * time.Millisecond
	rl := startRelay(t, fb, 1, func(c *config.Config) {
		c.EventLoops = "1"
		c.CheckoutTimeout = limit
	})
	holder := dialBench(t, rl.addr, simpleRequest)
	// An extended-protocol request without its Sync holds the server
	// connection until the Sync.
	held := extendedRequest[:len(extendedRequest)-wire.HeaderLen]
	if _, err := holder.conn.Write(held); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the holder to hold the pool's connection", func() bool {
		for _, s := range rl.srv.sessionList() {
			if s.server.Load() != nil {
				return true
			}
		}
		return false
	})
	waiter := dialBench(t, rl.addr, simpleRequest)
	e := rl.srv.engine
	before := e.Stats()
	_ = waiter.conn.SetDeadline(time.Now().Add(10 * time.Second))
	wr := bufio.NewReader(waiter.conn)
	for round := range 2 {
		start := time.Now()
		if _, err := waiter.conn.Write(simpleRequest); err != nil {
			t.Fatal(err)
		}
		code, err := replyCode(wr)
		took := time.Since(start)
		if err != nil || code != "53300" {
			t.Fatalf("round %d: a request queued behind a held connection got %q (%v), want 53300 at checkout_timeout", round, code, err)
		}
		if took < limit-5*time.Millisecond || took > limit+2*time.Second {
			t.Fatalf("round %d: refused after %v, want about checkout_timeout (%v)", round, took, limit)
		}
	}
	after := e.Stats()
	if after.Parks-before.Parks < 2 || after.Detaches != before.Detaches {
		t.Fatalf("the waits left the loop: %d waits on it, %d sessions left it", after.Parks-before.Parks, after.Detaches-before.Detaches)
	}
	if _, err := holder.conn.Write(fbMsg(nil, 'S', "")); err != nil {
		t.Fatal(err)
	}
	_ = holder.conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := holder.readUntilReady(); err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.conn.Write(simpleRequest); err != nil {
		t.Fatal(err)
	}
	if code, err := replyCode(wr); err != nil || code != "" {
		t.Fatalf("after the holder let go: %q, %v", code, err)
	}
}

// replyCode reads an answer up to its ReadyForQuery and returns the
// SQLSTATE of its ErrorResponse ("" when none).
func replyCode(r *bufio.Reader) (string, error) {
	var hdr [5]byte
	code := ""
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return code, err
		}
		body := make([]byte, int(binary.BigEndian.Uint32(hdr[1:]))-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return code, err
		}
		switch hdr[0] {
		case 'E':
			_, code, _ = wire.ErrorFields(body)
		case 'Z':
			return code, nil
		}
	}
}

// TestLoopEndWithoutHandOver: a client in transaction mode that says
// Terminate between two transactions ends on its loop: its session holds
// nothing that could make the end wait, so the loop is not given away.
func TestLoopEndWithoutHandOver(t *testing.T) {
	fb := startFakeBackend(t, 64)
	rl := startRelay(t, fb, 4, func(c *config.Config) { c.EventLoops = "1" })
	e := rl.srv.engine
	const n = 20
	before := e.Stats().TakeOvers
	for range n {
		c := dialBench(t, rl.addr, simpleRequest)
		_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.roundTrip(); err != nil {
			t.Fatal(err)
		}
		c.close() // Terminate, then close
	}
	waitFor(t, 5*time.Second, "every session to end", func() bool { return rl.srv.ClientCount() == 0 })
	// The monitor may still hand over a handler that runs a whole tick
	// (a slow machine, -race): a few, not one per client.
	if got := e.Stats().TakeOvers - before; got*4 > n {
		t.Fatalf("%d clients that left between transactions handed their loop over %d times", n, got)
	}
	if err := fb.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestLoopHandOverClaimLeavesCheckout: a hand-over claim that reaches a
// session whose request waits on its loop for a server connection (a claim
// that raced the read's start) is no end: the wait goes on and the request
// runs once a connection comes, and its attach takes the claim back.
// Before, the claim's wake-up withdrew the checkout and the request failed.
func TestLoopHandOverClaimLeavesCheckout(t *testing.T) {
	fb := startFakeBackend(t, 64)
	rl := startRelay(t, fb, 1, func(c *config.Config) { c.EventLoops = "1" })
	holder := dialBench(t, rl.addr, simpleRequest)
	waiter := dialBench(t, rl.addr, simpleRequest)
	for _, c := range []*benchClient{holder, waiter} {
		_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	// The holder keeps the only server connection: an extended-protocol
	// request flushed without its Sync.
	unsynced := append(extendedRequest[:len(extendedRequest)-5:len(extendedRequest)-5], fbMsg(nil, 'H', "")...)
	if _, err := holder.conn.Write(unsynced); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the holder to hold the server connection", func() bool {
		for _, s := range rl.srv.sessionList() {
			if s.server.Load() != nil {
				return true
			}
		}
		return false
	})
	if _, err := waiter.conn.Write(simpleRequest); err != nil {
		t.Fatal(err)
	}
	var ws *session
	waitFor(t, 2*time.Second, "the request to wait on its loop", func() bool {
		for _, s := range rl.srv.sessionList() {
			if s.item.Load().WaitingOnLoop() {
				ws = s
				return true
			}
		}
		return false
	})
	// The claim, as terminateIfIdle makes it.
	ws.finalMu.Lock()
	ws.endErr.Store(errHandedOver)
	ws.wakeLoop()
	ws.finalMu.Unlock()
	time.Sleep(50 * time.Millisecond)
	if _, err := holder.conn.Write(fbMsg(nil, 'S', "")); err != nil {
		t.Fatal(err)
	}
	if err := holder.readUntilReady(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if err := waiter.readUntilReady(); err != nil {
		t.Fatalf("the request that waited through a hand-over claim: %v", err)
	}
	if werr := ws.endErr.Load(); werr != nil {
		t.Fatalf("the claim was not taken back: end error %v", werr)
	}
}

// TestLoopSessionsBackWhileBusy: clients whose handler waited off their
// loop (here a test hook that yields and sleeps, as a wait-mode rate limit
// does) come back to it between two requests once they no longer wait,
// though none is ever idle long enough to park (the parker's sweep would
// bring them back after a whole idle interval).
func TestLoopSessionsBackWhileBusy(t *testing.T) {
	fb := startFakeBackend(t, 64)
	var slow atomic.Int32
	slow.Store(40)
	rl := startRelayWith(t, fb, 2, zap.NewNop(), func(srv *Server) {
		srv.onFrame = func(s *session, typ byte) {
			if typ == 'Q' && slow.Add(-1) >= 0 {
				s.yieldLoop()
				time.Sleep(time.Millisecond)
			}
		}
	}, func(c *config.Config) { c.EventLoops = "1" })
	const n = 8
	clients := dialBenches(t, rl.addr, n, simpleRequest)
	for _, c := range clients {
		_ = c.conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	e := rl.srv.engine
	if err := roundTripsAtOnce(clients, 10); err != nil {
		t.Fatal(err)
	}
	if e.Stats().Detaches == 0 {
		t.Fatalf("%d clients whose handler waited never left their loop", n)
	}
	// Now one at a time, round robin, without pause: nobody waits, and
	// nobody is idle for a sweep interval, so none is parked by the sweep
	// (which would bring it back to a loop too).
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			for _, c := range clients {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				if err := c.roundTrip(); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	limit := 3 * parkSweep
	deadline := time.Now().Add(limit)
	for e.ClientCount() != n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	back := e.ClientCount()
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if back != n {
		t.Fatalf("%d of %d busy clients on the loop %v after their last wait; want all", back, n, limit)
	}
	if err := fb.Err(); err != nil {
		t.Fatal(err)
	}
}

// readReadies reads whole messages from c until n ReadyForQuery have come,
// checking that each answer is the fake backend's (RowDescription, DataRow,
// CommandComplete, ReadyForQuery), in order.
func readReadies(c net.Conn, n int) error {
	r := bufio.NewReaderSize(c, 64<<10)
	var hdr [5]byte
	want := []byte{'T', 'D', 'C', 'Z'}
	for got, i := 0, 0; got < n; i++ {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return fmt.Errorf("after %d of %d answers: %w", got, n, err)
		}
		if hdr[0] != want[i%4] {
			return fmt.Errorf("answer %d: message %q where %q was due", got+1, hdr[0], want[i%4])
		}
		if _, err := r.Discard(int(binary.BigEndian.Uint32(hdr[1:])) - 4); err != nil {
			return err
		}
		if hdr[0] == 'Z' {
			got++
		}
	}
	if r.Buffered() > 0 {
		return fmt.Errorf("%d bytes after the last answer", r.Buffered())
	}
	return nil
}

// TestLoopManySessions: one loop holds thousands of idle sessions (10,000
// where the open-file limit allows: each costs three descriptors here, the
// client's, poolerd's and the loop's duplicate) without a goroutine each,
// and answers a sample of them; it logs the heap each idle session costs
// (the test's own client connections included).
func TestLoopManySessions(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of connections")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	n := min(10000, int(lim.Cur-300)/3)
	if n < 1000 {
		t.Skipf("open-file limit %d: too low for a thousand sessions", lim.Cur)
	}
	fb := startFakeBackend(t, 16)
	rl := startRelay(t, fb, 2, func(c *config.Config) { c.EventLoops = "1"; c.MaxClientConn = 0 })
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	g0 := runtime.NumGoroutine()
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				conns[i] = dialIdle(t, rl.addr)
			}
		}()
	}
	for i := range conns {
		next <- i
	}
	close(next)
	wg.Wait()
	e := rl.srv.engine
	waitFor(t, 30*time.Second, "every session on the loop", func() bool { return e.ClientCount() == n })
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	if g := runtime.NumGoroutine() - g0; g > 50 {
		t.Fatalf("%d idle sessions on a loop hold %d goroutines", n, g)
	}
	t.Logf("%d idle sessions on one loop: %d bytes of heap each", n, (int64(ms1.HeapAlloc)-int64(ms0.HeapAlloc))/int64(n))
	for i := 0; i < n; i += n / 100 {
		c := &benchClient{conn: conns[i], request: simpleRequest, buf: make([]byte, 4096)}
		_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := c.roundTrip(); err != nil {
			t.Fatalf("session %d of %d: %v", i, n, err)
		}
	}
	for _, c := range conns {
		_ = c.Close()
	}
	waitFor(t, 30*time.Second, "the sessions to end", func() bool { return e.ClientCount() == 0 })
}

// TestLoopAffinity: with two loops, a client's request runs on a server
// connection in the client's own loop, so that one loop reads both sides
// of it: an idle connection of that loop's share when there is one (with a
// pool of 2, one in each loop: no move after the first), else one moved
// there from the other loop (a pool of 1: a move at every change of loop).
func TestLoopAffinity(t *testing.T) {
	for _, tc := range []struct {
		pool     int
		min, max uint64 // moves
	}{{pool: 1, min: 30, max: 60}, {pool: 2, min: 0, max: 2}} {
		t.Run(fmt.Sprintf("pool%d", tc.pool), func(t *testing.T) {
			fb := startFakeBackend(t, 64)
			rl := startRelay(t, fb, tc.pool, func(c *config.Config) { c.EventLoops = "2" })
			checkAffinity(t, rl, 10)
			if m := rl.srv.engine.Stats().Moves; m < tc.min || m > tc.max {
				t.Fatalf("%d moves between loops, want %d to %d", m, tc.min, tc.max)
			}
			if err := fb.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkAffinity runs rounds of one request of each of up to 6 clients (of 8
// logged in), one at a time, alternating between the two loops, and checks
// that each ran on a server connection of the client's loop.
func checkAffinity(t *testing.T, rl *relay, rounds int) {
	const n = 8 // round robin: about half on each loop
	all := dialBenches(t, rl.addr, n, simpleRequest)
	e := rl.srv.engine
	waitFor(t, 5*time.Second, "every client on a loop", func() bool { return e.ClientCount() == n })
	loopOf := map[string]int32{}
	for _, s := range rl.srv.sessionList() {
		if it := s.item.Load(); it != nil {
			loopOf[s.conn.RemoteAddr().String()] = it.Share()
		}
	}
	var on [2][]*benchClient
	for _, c := range all {
		l, ok := loopOf[c.conn.LocalAddr().String()]
		if !ok {
			t.Fatal("a client's session is not on a loop")
		}
		on[l] = append(on[l], c)
	}
	var clients []*benchClient // alternating
	for i := range min(3, len(on[0]), len(on[1])) {
		clients = append(clients, on[0][i], on[1][i])
	}
	if len(clients) < 4 {
		t.Fatalf("%d and %d clients on the two loops; the test wants at least two on each", len(on[0]), len(on[1]))
	}
	rl.srv.mu.Lock()
	var dbp *dbPool
	for _, p := range rl.srv.pools {
		dbp = p
	}
	rl.srv.mu.Unlock()
	misses := 0
	for round := range rounds {
		for i, c := range clients {
			_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
			if err := c.roundTrip(); err != nil {
				t.Fatal(err)
			}
			// The connection comes back to the pool (its most recently
			// used idle one) just after the client has its answer, and
			// its handler then returns (else it could not move).
			var sc *serverConn
			waitFor(t, 5*time.Second, "the server connection back in the pool", func() bool {
				idle := dbp.pool.Idle()
				if dbp.pool.Stats().Active != 0 || len(idle) == 0 {
					return false
				}
				sc = idle[len(idle)-1]
				return sc.item.Load().Armed()
			})
			want := loopOf[c.conn.LocalAddr().String()]
			if got := sc.item.Load().Share(); got != want {
				// A connection its loop is still handling (an event that
				// came with its answer) cannot move: the request runs on
				// the other loop, correctly but crossing loops. Rare,
				// except on a loaded machine.
				misses++
				t.Logf("round %d, client %d (loop %d): its request ran on a server connection of loop %d", round, i, want, got)
				continue
			}
			if sc.Entry.Share() != want {
				t.Fatalf("round %d, client %d: the connection is in loop %d but counts in the pool as loop %d's", round, i, want, sc.Entry.Share())
			}
		}
	}
	if requests := rounds * len(clients); misses > requests/10 {
		t.Fatalf("%d of %d requests ran on a server connection of the other loop", misses, requests)
	}
}

// TestLoopClosedServerNotDrained: a server connection poolerd has closed is
// read by nobody. A client asks for an endless result and reads none of it,
// so the loop's handler for the server connection blocks writing to the
// client and the loop goes on without it; then the client leaves, the
// session discards the connection mid-result, and the backend must find its
// socket gone. A loop that went on reading the closed connection through its
// own descriptor (the handler, when it returned, put the socket back in
// epoll) kept the socket open and drained the backend's stream, which then
// never ended (with PostgreSQL: a backend sending rows to nobody until the
// whole result was out).
func TestLoopClosedServerNotDrained(t *testing.T) {
	fb := startFakeBackend(t, 64)
	fb.mu.Lock()
	fb.streamQuery, fb.streamEnded = []byte("STREAM"), make(chan error, 1)
	fb.mu.Unlock()
	rl := startRelay(t, fb, 1, func(c *config.Config) { c.EventLoops = "1" })
	// Whether a loop that goes on reading finds the stream empty for a
	// moment (and ends it then) is a race with the backend; each round is
	// another chance to lose it.
	for round := range 8 {
		c := dialBench(t, rl.addr, wire.AppendQuery(nil, "STREAM"))
		if _, err := c.conn.Write(c.request); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the socket buffers fill up; the handler blocks
		select {
		case err := <-fb.streamEnded:
			t.Fatalf("round %d: the stream ended while the client was still there: %v", round, err)
		default:
		}
		if round%2 == 1 {
			_ = c.conn.(*net.TCPConn).SetLinger(0) // a reset rather than a FIN
		}
		_ = c.conn.Close()
		select {
		case <-fb.streamEnded:
		case <-time.After(15 * time.Second): // the session sends a cancel first (up to cancelGrace); a loaded -race run is slow
			rl.srv.mu.Lock()
			var st string
			for _, p := range rl.srv.pools {
				s := p.pool.Stats()
				st = fmt.Sprintf("total %d, active %d, idle %d, evictions %v", s.Total, s.Active, s.Idle, s.Evictions)
			}
			rl.srv.mu.Unlock()
			t.Fatalf("round %d: the backend still sends 15 s after its client left: poolerd went on reading the server connection it closed (pool: %s)", round, st)
		}
	}
}
