package proxy

import (
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/wire"
)

// A client session on an event loop (internal/reactor) has no goroutine:
// the loop reads the client when it sends something and runs the same
// steps as session.relay, on the loop's goroutine. A checkout queue or a
// rate limit waits on the loop (LoopResume takes the read up); output the
// client or its server does not take yet is kept for the loop to send when
// it can, the peer that feeds it not read meanwhile (keepOnLoop, sendKept,
// serverConn.writeOrKeep). Another step that must wait (poolerd's own
// query, another writer) first hands the loop to a new goroutine
// (yieldLoop) and finishes on the old one; the socket is out
// of the loop meanwhile, so its bytes stay in order. TLS clients, and every
// client when event_loops is off, run on their own goroutine
// (session.run).

// startRelay starts relaying a session that has just logged in: on an event
// loop when there is one, on a goroutine of its own otherwise. The session
// counts in sessWG until it ends.
func (s *session) startRelay() {
	s.srv.sessWG.Add(1) // Done when the session ends
	if s.login != nil { // what came with the login (serveConn)
		go s.run(false) // the relay handles what came with the login first
		return
	}
	if s.joinLoop() {
		return
	}
	// The relay runs on a fresh goroutine: the login's deep stack (SCRAM,
	// configuration lookups) is not kept by an idle client for its whole
	// life.
	go s.run(true)
}

// joinLoop puts the session on an event loop; false if it cannot go there.
func (s *session) joinLoop() bool {
	if s.tls || !s.srv.engine.Enabled() {
		return false
	}
	sc, ok := s.conn.(syscall.Conn)
	if !ok {
		return false
	}
	// A session coming back from its own goroutine keeps its reader
	// (writers may hold it).
	s.wmu.Lock()
	rd := s.cio
	s.wmu.Unlock()
	if rd == nil {
		var err error
		if rd, err = wire.NewConnReader(s.conn, s.srv.bufs); err != nil {
			return false
		}
	}
	if !rd.Raw() {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	s.wmu.Lock()
	s.cio = rd
	s.wmu.Unlock()
	if !s.srv.engine.Add(rc.Control, s, true, s.item.Store) {
		return false
	}
	// Ended before it joined (a shutdown): its wake-up may have found no
	// item; end it now (wake ends it once, whoever calls it).
	if s.LoopStale() {
		s.wakeLoop()
	}
	return true
}

// yieldLoop is called before the session's client side waits: if an event
// loop is running its handler, the loop goes on without it.
func (s *session) yieldLoop() { s.item.Load().Yield() }

// LoopReady is relay's loop body for a session on an event loop: one read
// of the client, handled.
func (s *session) LoopReady(it *reactor.Item) bool {
	out, held := it.WantsWrite(), it.HoldsReads()
	if out && !s.sendKept() {
		return true // the client has not taken its output yet: read later
	}
	if out && held {
		// Its output is sent, but its server has not taken the last
		// request yet (serverConn.writeOrKeep): read later. Called
		// while its reads are held and not for its output, the
		// handler reads on: that is a hang-up or an error (or a stale
		// event), which the read finds.
		return true
	}
	bp := s.srv.bufs.Get()
	n, err := it.Read((*bp)[wire.Headroom:])
	if n == 0 {
		s.srv.bufs.Put(bp)
		if err == nil {
			return true // nothing there after all
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		s.endOnLoop(err)
		return false
	}
	if s.clientRead(bp, n) {
		s.endOnLoop(nil)
		return false
	}
	return true
}

// LoopResume takes up a read that waited on the loop for a server
// connection (fromClient), once the checkout is over.
func (s *session) LoopResume(it *reactor.Item) bool {
	r := &s.lw.pend
	quit, waiting := s.readFrames(r, true)
	if waiting {
		return true
	}
	bp := r.bp
	*r = readPass{}
	if s.readDone(bp, quit) {
		s.endOnLoop(nil)
		return false
	}
	return true
}

// loopWait is what a session's wait on its loop keeps beyond the loop's
// own part (the reactor's): the read in progress (pend) and its rate-limit
// wait (rate). Made at the session's first wait on a loop (waits), so that
// a session that never waits does not carry it; owned by whoever runs the
// session's handler.
type loopWait struct {
	pend readPass
	rate rateLoopWait
	// withdraw is WithdrawFunc of the item withdrawOf (withdrawFor).
	withdraw   *func(error)
	withdrawOf *reactor.Item
}

// waits returns the session's loop wait state, made on its first wait.
func (s *session) waits() *loopWait {
	if s.lw == nil {
		s.lw = new(loopWait)
	}
	return s.lw
}

// endOnLoop ends the session from its loop handler. Ending waits only for
// what the session still holds: its server connection (the release, a
// reset query) or a final message being written (endErr); then it runs
// off the loop's goroutine. Without either it is a few locks and a close,
// and the loop goes on after it (a client that says Terminate costs no
// hand-over of its loop).
func (s *session) endOnLoop(err error) {
	if s.server.Load() != nil || s.endErr.Load() != nil {
		s.yieldLoop()
	}
	s.end(err)
	s.srv.sessWG.Done()
}

// LoopStale reports whether the session was ended by another goroutine
// (finishLocked) while on its loop.
func (s *session) LoopStale() bool { return s.endErr.Load() != nil }

// LoopDetach moves a session whose handler waited (a checkout queue, a rate
// limit, a client that does not read) to a goroutine of its own: a session
// that waited once is likely to wait again soon (a saturated pool), and a
// goroutine waits for less than a hand-over of the loop each time. It comes
// back to a loop between two requests once it has not waited for
// rejoinAfter (rejoinable), or where it would otherwise park
// (session.tryPark).
func (s *session) LoopDetach() bool {
	if s.LoopStale() {
		return false // ended meanwhile: rearm wakes it on the loop path
	}
	s.waitedAt = s.srv.nanotime()
	s.item.Store(nil)
	// The parker's sweep tells an idle relay to come back (tryPark).
	_ = s.srv.parker.start()
	go s.run(false)
	return true
}

// rejoinAfter is how long a session that left its event loop to wait stays
// on its own goroutine after its last wait: while its pool is saturated it
// waits at almost every request, and a goroutine waits for less than a move
// between the loop and a goroutine each time.
const rejoinAfter = 100 * time.Millisecond

// rejoinable is relay's question when it finds nothing to read (in the
// runtime poller's callback): go back to an event loop instead of waiting?
// Yes once the session has not waited for rejoinAfter: the loop then reads
// its next request. A transaction in progress (a server held) moves too:
// the loop runs the same steps.
func (s *session) rejoinable() bool {
	return s.srv.nanotime()-s.waitedAt > int64(rejoinAfter) && s.endErr.Load() == nil && !s.closed.Load()
}

// LoopEnd ends a session woken on its loop by finishLocked.
func (s *session) LoopEnd() {
	if !s.handOverNow() {
		s.end(nil)
	}
	s.srv.sessWG.Done()
}

// wakeLoop ends the session if it waits on an event loop (finishLocked):
// if it waits there for a server connection, the checkout is withdrawn (on
// a goroutine: the caller holds finalMu), and the read taken up ends.
func (s *session) wakeLoop() {
	it := s.item.Load()
	if it.WaitingOnLoop() {
		// An end withdraws the wait; a hand-over claim leaves it (the
		// attach after it takes the claim back: waitEnded).
		if s.waitEnded() != nil {
			go s.withdrawWait(errTerminated)
		}
		return
	}
	s.srv.engine.Wake(it)
}

// closeConn closes the client connection. On a loop the socket is shut down
// first: the loop's own descriptor would keep it open.
func (s *session) closeConn() {
	if s.item.Load() != nil {
		if sc, ok := s.conn.(syscall.Conn); ok {
			if rc, err := sc.SyscallConn(); err == nil {
				reactor.ShutdownSocket(rc.Control)
			}
		}
	}
	_ = s.conn.Close()
	if sc := s.server.Load(); sc != nil {
		sc.resumeFeed() // it sends to no one now
	}
}
