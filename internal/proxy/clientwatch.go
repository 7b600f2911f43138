package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/wire"
)

// clientWatch ends a rate-limit wait (limiter.WaitOptions.Watch) when the
// client goes away or its session or login ends meanwhile. The goroutine
// that waits is the one that would read from the client, so nothing else
// would notice a client that closed its connection: its request would wait
// on, and then be sent to a server, for nobody.
//
// While the wait lasts, a goroutine waits for the client socket to become
// readable (through the runtime's poller, no thread blocked) and looks
// without reading (peerGone): end of stream, a reset, or a connection the
// peer has closed behind data it sent (a pipelined request or a Terminate)
// ends the wait, as PostgreSQL's client_connection_check_interval ends a
// query. Data alone does not: it is the client's next request. The
// watcher is woken to stop, and by whoever ends the session, through the
// connection's read deadline, which it puts back when done.
type clientWatch struct {
	rateWait
	// gone is set when the watcher saw the client leave.
	gone atomic.Bool
}

// rateWait says whose rate-limit wait checkRate may have to watch. The
// zero value watches nothing.
type rateWait struct {
	conn net.Conn
	// deadline is the read deadline conn has outside the wait: none for
	// a session, the login deadline for a login.
	deadline time.Time
	owner    waitOwner
	// loop, for a session on its event loop, makes a wait (and a Redis
	// decision) park the session on the loop instead (errRateWaitOnLoop,
	// errRateDecideOnLoop).
	loop *rateLoopWait
}

// block is called before checkRate does what may block (a decision of a
// remote backend, a wait): the owner leaves its event loop (waitOwner).
func (rw rateWait) block() {
	if rw.owner != nil {
		rw.owner.leaveLoop()
	}
}

// A waitOwner is what a rate-limit wait is for: a session, or a login.
type waitOwner interface {
	// waitEnded returns the error the owner ended with meanwhile (a
	// KILL_CLIENT, a shutdown, a timeout), or nil. Whoever ends it sets
	// a read deadline on the client connection after what waitEnded
	// reads, which wakes the watcher.
	waitEnded() *wire.Error
	// leaveLoop is called before the wait blocks: a session on an event
	// loop gives its loop to another goroutine (yieldLoop; an interface
	// method, not a func field, so that a rate check allocates nothing).
	leaveLoop()
}

// watch implements limiter.WaitOptions.Watch.
func (w *clientWatch) watch(ctx context.Context) (context.Context, func()) {
	sc, ok := w.conn.(syscall.Conn)
	if !ok || !reactor.CanWatch {
		return ctx, func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var stopping atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			left := false
			err := rc.Read(func(fd uintptr) bool {
				left = reactor.PeerGone(fd)
				return left
			})
			switch {
			case left:
				w.gone.Store(true)
				cancel()
				return
			case stopping.Load():
				return
			case !errors.Is(err, os.ErrDeadlineExceeded):
				w.gone.Store(true) // closed, or failed
				cancel()
				return
			case w.owner.waitEnded() != nil:
				cancel()
				return
			}
			// Another deadline (the parker's idle sweep): not for the
			// wait. Put the connection's own back and watch on; a stop or
			// an end after this sets a deadline again.
			_ = w.conn.SetReadDeadline(w.deadline)
			if stopping.Load() {
				return
			}
			if w.owner.waitEnded() != nil {
				cancel()
				return
			}
		}
	}()
	return ctx, func() {
		stopping.Store(true)
		_ = w.conn.SetReadDeadline(time.Unix(1, 0))
		<-done
		cancel()
		_ = w.conn.SetReadDeadline(w.deadline)
		if w.owner.waitEnded() != nil {
			// Ended meanwhile: the deadline that tells the reader so may
			// be the one just replaced (as in tryPark).
			_ = w.conn.SetReadDeadline(time.Now())
		}
	}
}

// ended returns the error to end the session with when the wait ended
// because the client left (errClientGone) or the session or login ended,
// and nil otherwise (or for a nil w).
func (w *clientWatch) ended() *wire.Error {
	if w == nil {
		return nil
	}
	if w.gone.Load() {
		return errClientGone()
	}
	return w.owner.waitEnded()
}
