package proxy

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/sqlscan"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// session is one client connection. Its reader (its goroutine, run, or an
// event loop, loopsession.go; one at a time) reads everything the client
// sends and writes it to the server connection the session holds, checking
// one out when a request arrives and none is held. The server's replies come
// back through that connection's reader (serverConn.readLoop, or a loop),
// which writes them to the client and, in transaction mode, returns the
// connection to its pool at a clean ReadyForQuery.
//
// Fields are grouped by who may touch them: set once at login, owned by the
// client goroutine, atomics read by anyone, and the groups guarded by one
// mutex each. Locks are taken in the order given in docs/architecture.md
// ("Concurrency contract"): finalMu, attachMu, then the held serverConn's mu,
// then pmu or stmu; wmu and qmu are leaves.
type session struct {
	// Set by the login goroutine before register publishes the session;
	// read-only afterwards.
	srv            *Server
	conn           net.Conn
	log            sessionLog
	id             uint64
	pid            uint32 // BackendKeyData sent to the client (see Server.register)
	key            uint32
	addr           string
	database, user string
	dbp            *dbPool
	connectedAt    time.Time
	mode           string
	clientKey      []byte // SCRAM ClientKey recovered at login, for pass-through
	stateful       bool   // session state is tracked (the mode is not session)
	tracked        bool   // ... and named prepared statements are mapped
	refuseState    bool   // session_state: refuse
	tls            bool   // the client connection is TLS (conn is a *tls.Conn): never parked
	maxPacket      int32  // max_packet_size at login (0: only the protocol's limit; at most 2^30-1)

	// Owned by the client goroutine (run, fromClient and what they call;
	// the goroutine may change between parks, never run two at once).
	cur      wire.Cursor
	carry    [wire.HeaderLen]byte
	unsynced bool // extended-protocol messages sent since the last Sync
	// refusing: a request was refused; skip extended-protocol messages
	// until the Sync, which gets the ReadyForQuery. refuseRest is why, when
	// poolerd refused it (no server, a rate limit): the requests after it
	// in the same read are refused too.
	refusing bool
	// dropFrame: the current frame is not forwarded.
	dropFrame  bool
	ncarry     int
	refuseRest error
	// syncsSinceOther counts Syncs sent since the last message other than
	// Sync, Flush or CopyData (see count).
	syncsSinceOther int
	// syncQuery is what a just-attached server gets ahead of the
	// client's first bytes, syncReqs Query frames whose answers are
	// swallowed: RESET ROLE and RESET ALL first when syncReset (see
	// roleCheck), then the parameter sync.
	syncQuery []byte
	syncReqs  int
	syncReset bool
	// calls: the batch being assembled may run code that sets the role (a
	// function call, see roleCheck).
	calls bool
	// hold: the current frame is kept until complete (Cursor capture),
	// then rewritten, refused or forwarded whole.
	hold       bool
	localClose bool // the current Close is answered by poolerd
	// obOn: this batch is assembled in ob instead of in place in the read
	// buffer (a held frame was rewritten); bops and bgroups are the queue
	// entries and swallowed response groups it adds, numbered within it.
	obOn    bool
	ob      []byte
	obp     *[]byte // the pool's pointer for ob
	bops    []stmtOp
	bundo   []qUndo
	bgroups []int
	// fo is what replaces the held frame; holdAt is where the held frame
	// starts in read number holdRead (reads counts fromClient calls).
	fo              []byte
	holdAt          int
	holdRead, reads uint64
	// unnamed is the client's latest unnamed Parse (frame), unnamedGen
	// counts them.
	unnamed     []byte
	unnamedGen  uint64
	unnamedEff  txstate.StmtEffects // what running the unnamed statement does
	unnamedVoid atomic.Uint32       // unnamedGen (low 32 bits) of an unnamed Parse the server failed or skipped: none then
	eff         sqlscan.Effects     // of the Query, Parse or Bind being handled
	// rawEff: with max_prepared_statements 0 (names passed through), the
	// effects of the client's named statements that have any, by name,
	// so that their Binds are held and apply them again.
	rawEff map[string]txstate.StmtEffects
	// portalCommits: a portal bound since the session attached its server
	// may commit when executed (see keep.go).
	portalCommits bool
	// syncFail: the parameter sync ends with failBlockQuery (see keep.go).
	syncFail bool
	// bindTx is the txstate.TxShape of the statement of the latest Bind (the
	// unnamed statement's is unnamedEff.tx), grpTx that of the Executes of
	// the extended-protocol request being read so far (keep.go).
	bindTx, grpTx txstate.TxShape
	// hitDef is the first statement of the batch answered from the cache,
	// hitZB its place (ReadyForQuery-producing messages before it);
	// replayOn says the batch's bytes from replayAt on follow its scratch
	// Close (retry.go). groupRan: the request being read ran a statement
	// (noteRuns), groupMsgs: it has this many messages so far. hitStart:
	// the retry would start at the frame that set hitDef, the first use of
	// a statement an earlier request got from the cache (cacheHits, client
	// name to definition; retry.go). (The bools share a word with the two
	// above.)
	replayOn bool
	groupRan bool
	hitStart bool
	// bindDrop: the statement of the latest Bind drops every prepared
	// statement (DEALLOCATE ALL, DISCARD ALL); its Executes apply that
	// (noteRuns, dropStatements).
	bindDrop  txstate.DropAll
	hitDef    *stmtDef
	hitZB     int
	replayAt  int
	groupMsgs int
	cacheHits map[string]*stmtDef
	// waiter is this session's reusable place in its pool's queue (made on
	// its first wait), cancelWait withdraws it (made with it); waiterPool
	// is the pool it belongs to.
	waiter     *pool.Waiter[*serverConn]
	waiterPool *pool.Pool[*serverConn]
	cancelWait *func(cause error)
	// login is the login's own state (handshake.go), nil once the relay
	// runs: an idle client does not carry it.
	login *loginState
	// waitedAt is the nanotime a wait of this session (a checkout queue,
	// or one that made it leave its event loop) last ended: a session
	// waits on its own goroutine while it keeps waiting (loopsession.go).
	waitedAt int64

	// Atomics: written by their owner, read by anyone (the server's
	// reader, the watchdog, the parker, shutdown, the console).
	logged    atomic.Bool  // logged in: log lines carry database and user
	lastReq   atomic.Int64 // nanotime of the last request (SHOW CLIENTS)
	waitSince atomic.Int64 // nanotime since a request waits for a server; 0 when not waiting
	// maxPrepared is max_prepared_statements: set at login, and by a
	// reload or SET while it stays above 0 (a tracked session keeps
	// mapping its statements).
	maxPrepared atomic.Int64
	// server is the connection held right now; stored by attach (under
	// attachMu), cleared by whoever releases or loses it (under its mu).
	server atomic.Pointer[serverConn]
	// dirtyGen counts the requests that may have changed the client's
	// settings, cleanGen the last of them a snapshot has seen (see
	// settingsDirty).
	dirtyGen, cleanGen atomic.Uint64
	// pinReason is set while the session is pinned, since pinnedSince
	// (nanotime); pinGen counts the requests that created session state
	// (pinned or not), pinUndo is set when a pinned client ran one that
	// may have undone it, until a pin check is sent (see pinCheckDue), and
	// undoGen is pinGen when that request was read: a check is void if
	// any request read after it created state, even one the server ran
	// after the check.
	pinReason   atomic.Pointer[string]
	pinnedSince atomic.Int64
	pinGen      atomic.Uint64
	undoGen     atomic.Uint64
	pinUndo     atomic.Bool
	// pinMu orders pinning with unpinning (see pinEffects, pinChecked):
	// taken alone or under the held serverConn's mu.
	pinMu sync.Mutex
	// timeoutsP are the session's limits (timeouts.go); a reload replaces
	// them.
	timeoutsP atomic.Pointer[timeouts]
	// rates are the rate-limit rules that apply to the session (a reload
	// replaces them); admitted is set while the session holds a client slot.
	rates    atomic.Pointer[[]sessionRate]
	admitted atomic.Bool
	// endLogged: the disconnection was logged (logDisconnect), before the
	// final message went out, or at end. (Here, beside admitted, it fills
	// padding: TestSessionRecordSize.)
	endLogged atomic.Bool
	// dropReason, when set, is why the server connection will be closed
	// at the end (a timeout, KILL), for the eviction metric.
	dropReason atomic.Pointer[string]
	// parked is set while the parker holds the session without a goroutine;
	// active is set by every read and cleared by the parker's sweeps.
	parked, active atomic.Bool
	// requested is set by the first read after login: the client has sent
	// a request (see Server.loginsFinish).
	requested atomic.Bool
	// inRead is set while the session handles what it read from the
	// client: a request read but not yet forwarded is in flight, and a
	// shutdown lets it run (terminateIfIdle).
	inRead   atomic.Bool
	closed   atomic.Bool
	sawFatal atomic.Bool // the server sent this client a FATAL error
	// midFrame: the server connection was lost after part of a frame was
	// forwarded; the session ends without a final message, which the
	// client would read as the rest of that frame (it sees the connection
	// end mid-message, as after a backend crash).
	midFrame atomic.Bool
	// severed is set, before the session's server pointer is cleared, when
	// the server connection it held was lost (closed, hung, failed) rather
	// than released clean: from then on nothing the client sends reaches
	// any server, and the session ends (see attach).
	severed atomic.Bool
	// failedBlock: the session keeps its session after losing its server
	// connection inside a transaction block; the next server connection it
	// attaches starts in a failed block (keep.go). owed is the error its
	// next request gets first (the block was lost while idle).
	failedBlock atomic.Bool
	owed        atomic.Pointer[wire.Error]
	// lossMu is held while a lost server connection's answer is written to
	// a client that keeps its session; attach waits for it, so that no
	// later request is answered first (keep.go).
	lossMu sync.Mutex
	// endErr is the final message, set once (under finalMu).
	endErr atomic.Pointer[wire.Error]
	// handshaking is set while the session logs in on serveConn's
	// goroutine, until register: fail then leaves the close to serveConn,
	// which lingers so that the client reads its refusal (lingerClose).
	handshaking atomic.Bool
	endOnce     sync.Once

	// finalMu is held from setting endErr until the final message is
	// written: whoever closes the client connection (a second fail, end)
	// takes it first, so the message is not lost to an early close.
	finalMu sync.Mutex
	// attachMu orders attaching a server with a shutdown's decision that
	// the session is idle (terminateIfIdle); it guards no field.
	attachMu sync.Mutex

	// wmu serialises writes to the client (the client goroutine and the
	// server's reader both write) and guards cio, the client connection's
	// raw reads and writes (set by run; nil while parked).
	wmu sync.Mutex
	cio *wire.ConnReader

	// pmu guards params: the values this client's session should have on
	// any server (startup parameters, then what ParameterStatus told it),
	// pkey, their txstate.ParamsKey ("" until needed after a change), and custom,
	// the customized options (a.b) the client touched.
	pmu    sync.Mutex
	params map[string]string
	pkey   string
	custom map[string]bool
	// paramsShared: params is a map shared with other sessions (never
	// changed: ownParams copies it first).
	paramsShared bool

	// stmu guards stmts, the client's statement names, and bound, which
	// maps back the definitions it used, for error messages (the server's
	// reader undoes mappings the server never made).
	stmu  sync.Mutex
	stmts map[string]*stmtDef
	bound map[string]string

	// waitCancel withdraws a wait in progress (a checkout's, a rate
	// limit's on the loop) for a cancel request or the session's end; nil
	// while none is. A call that comes after the wait ended (it loaded
	// the function before the owner cleared it) finds nothing to withdraw,
	// or the session's next wait, which a cancel request or an end may
	// withdraw as well.
	waitCancel atomic.Pointer[func(cause error)]

	// wd enforces the timeouts and leak detection (its own mutex).
	wd watchdog
	// qmu guards the start of the latest query's text, for leak warnings
	// and timeout logs.
	qmu   sync.Mutex
	qtext *[maxQueryText]byte
	qlen  int

	// epollReg says the socket is registered with the parker's epoll
	// instance (parker.mu).
	epollReg bool

	// item is the session's place on an event loop (nil: it runs on its
	// own goroutine); set when it joins one, cleared when it leaves
	// (loopsession.go). yieldFn is yieldLoop, set at creation.
	item    atomic.Pointer[reactor.Item]
	yieldFn func()
	// lw is a wait on the loop's state (loopsession.go), made at the
	// session's first wait there; owned by whoever runs its handler.
	lw *loopWait

	// handedOver: the session went to a new poolerd (handover.go); its
	// end closes this process's descriptor only.
	handedOver atomic.Bool
}

// sessionLog logs with the session's fields, added per line: a zap child
// logger per session would keep its encoded fields (about 1 KiB) for every
// idle client.
type sessionLog struct{ s *session }

func (l sessionLog) fields(extra []zap.Field) []zap.Field {
	s := l.s
	f := make([]zap.Field, 0, 4+len(extra))
	f = append(f, zap.Uint64("session", s.id), zap.String("client", s.addr))
	if s.logged.Load() {
		f = append(f, zap.String("database", s.database), zap.String("user", s.user))
	}
	return append(f, extra...)
}

// Log writes a line at level lvl.
func (l sessionLog) Log(lvl zapcore.Level, msg string, f ...zap.Field) {
	if ce := l.s.srv.log.Check(lvl, msg); ce != nil {
		ce.Write(l.fields(f)...)
	}
}

func (l sessionLog) Debug(msg string, f ...zap.Field) { l.Log(zap.DebugLevel, msg, f...) }
func (l sessionLog) Info(msg string, f ...zap.Field)  { l.Log(zap.InfoLevel, msg, f...) }
func (l sessionLog) Warn(msg string, f ...zap.Field)  { l.Log(zap.WarnLevel, msg, f...) }

func (s *session) releaseWhenIdle() bool { return s.stateful && s.pinReason.Load() == nil }

// run relays client messages on the session's goroutine until the client
// leaves (then it ends the session) or the session parks (then the
// goroutine ends and the parker starts a new one, with resume, when the
// client sends again). fresh is true right after login: the session parks
// at once, before its first read.
func (s *session) run(fresh bool) {
	if s.relay(fresh) {
		return
	}
	s.srv.sessWG.Done()
}

// ownParams makes s.params the session's own map before a change (pmu
// held).
func (s *session) ownParams() {
	if s.paramsShared {
		s.params = maps.Clone(s.params)
		s.paramsShared = false
	}
}

// resume runs a parked session again.
func (s *session) resume() { s.run(false) }

// relay is run's loop; it returns true if the session parked.
func (s *session) relay(fresh bool) (parked bool) {
	s.wmu.Lock()
	rd := s.cio
	if rd == nil {
		var err error
		if rd, err = wire.NewConnReader(s.conn, s.srv.bufs); err != nil {
			s.wmu.Unlock()
			s.end(err)
			return false
		}
		s.cio = rd
	}
	var err error
	if rd.Kept() > 0 {
		// Output its loop kept (keepOnLoop) goes first, before this
		// goroutine waits for the client.
		err = rd.Write(nil)
		s.keptSentLocked()
	}
	s.wmu.Unlock()
	if err != nil {
		s.end(err)
		return false
	}
	if fresh && s.tryPark() {
		return true
	}
	if l := s.login; l != nil {
		// Sent right behind the login (read with it): handled first.
		s.login = nil
		bp := s.srv.bufs.Get()
		n := copy((*bp)[wire.Headroom:], l.pending)
		if s.clientRead(bp, n) {
			s.end(nil)
			return false
		}
	}
	// A session that left its event loop to wait goes back between two
	// requests once it no longer waits (rejoinable).
	var idle func() bool
	if s.srv.engine.Enabled() && !s.tls {
		idle = s.rejoinable
	}
	for {
		// The buffer is borrowed only once data has arrived: an idle
		// client (even one that stopped inside a header, kept in s.carry)
		// holds none.
		bp, n, err := rd.ReadUnlessIdle(idle)
		if err != nil {
			if errors.Is(err, wire.ErrIdle) {
				if s.joinLoop() {
					return true
				}
				idle = nil // no loop takes it: stay on this goroutine
				continue
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if s.endErr.Load() != nil {
					// Ended by another goroutine (finishLocked), or
					// claimed for a hand-over (handover.go).
					if !s.handOverNow() {
						s.end(nil)
					}
					return false
				}
				// Otherwise the parker's sweep says the session has
				// been idle (see parker.sweep).
				if s.tryPark() {
					return true
				}
				continue
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			s.end(err)
			return false
		}
		if s.clientRead(bp, n) {
			s.end(nil)
			return false
		}
	}
}

// clientRead handles one read of the client (n bytes in bp, which it gives
// back), for relay and for an event loop (LoopReady). It returns true when
// the session must end.
func (s *session) clientRead(bp *[]byte, n int) (quit bool) {
	if !s.active.Load() { // a load is cheaper than a store per read
		s.active.Store(true)
	}
	if !s.requested.Load() {
		s.requested.Store(true)
	}
	if s.timeouts().idleTracked() {
		s.noteActive(s.srv.nanotime())
	}
	s.inRead.Store(true)
	quit, waiting := s.fromClient(bp, wire.Headroom, wire.Headroom+n)
	if waiting {
		return false // on its loop, for a server connection (LoopResume)
	}
	return s.readDone(bp, quit)
}

// readDone ends the handling of a read (clientRead, LoopResume).
func (s *session) readDone(bp *[]byte, quit bool) bool {
	s.inRead.Store(false)
	s.srv.bufs.Put(bp)
	if !quit && s.srv.endAtIdle() {
		// Shutting down: this read may have left the session idle
		// (answered locally, or already answered and released).
		s.terminateIfIdle()
	}
	return quit
}

// parkable reports whether the session could be parked: an idle client
// session holding no server connection.
func (s *session) parkable() bool {
	return !s.tls && !s.parked.Load() && !s.closed.Load() && s.endErr.Load() == nil && s.server.Load() == nil && s.waitSince.Load() == 0
}

// tryPark parks the session if it is parkable. It returns true if it did:
// the goroutine must then return without touching the session.
func (s *session) tryPark() bool {
	_ = s.conn.SetReadDeadline(time.Time{})
	if s.parkable() && (s.joinLoop() || s.srv.parker.park(s)) {
		return true
	}
	if s.endErr.Load() != nil {
		// Ended meanwhile: finishLocked's read deadline, which wakes this
		// goroutine to end the session, may be the one just cleared.
		_ = s.conn.SetReadDeadline(time.Now())
	}
	return false
}

// restoreIO gives back the reader/writer park took, if it could not park.
func (s *session) restoreIO(rd *wire.ConnReader) {
	s.wmu.Lock()
	if s.cio == nil {
		s.cio = rd
	}
	s.wmu.Unlock()
}

// batch accumulates what one read contributes to the server.
type batch struct {
	reqs     int  // ReadyForQuery the batch earns
	unsynced bool // extended-protocol state after the batch
	// runs: the batch runs statements (Query, Execute, FunctionCall);
	// commits: one of them may commit; opens: a request of it may open a
	// transaction block (keep.go).
	runs, commits, opens bool
	// midFrame: the read ends inside a frame that is being forwarded as
	// it arrives (not held, not dropped): its start goes with this batch,
	// its rest is still to come. Set for the last flush of a read only.
	midFrame bool
}

// readPass is fromClient's way through one read from the client. It lives
// on fromClient's stack, and is kept on the session's loop item
// (itemWait.pend) while the read waits there for a server connection
// (attachOrRefuse), to be taken up where it stopped (LoopResume).
type readPass struct {
	bp                   *[]byte // the read's buffer, given back when the read is done
	buf                  []byte
	start, out, off, end int
	b                    batch
	// Where a read waiting on its loop stopped: at a frame header of n
	// bytes, in attachOrRefuse, which had loaded owed.
	n    int
	owed *wire.Error
	wait loopCheckout
	// rateWait: the read waits in rateCheck (itemWait.rate), not for a
	// server connection.
	rateWait bool
}

// passData is what the read forwards so far.
func (s *session) passData(r *readPass) []byte {
	if s.obOn {
		return s.ob
	}
	return r.buf[r.start:r.out]
}

// answered sends what the read holds before at and waits until the server
// has answered all of it (a refusal must reach the client after those
// answers). The rest of the read is a batch of its own, begun as the read's
// first was: the connection, if the session still holds it (not released
// at the last answer: poolerd's own snapshot, pin check or hand-off check
// runs on it first), must stay unreleasable until that batch is sent, or
// the answer to poolerd's query would release it while frames handled for
// it wait to be sent (to the next connection attached: a Parse there twice,
// 42P05). It returns false if the server was lost or the session ended
// meanwhile.
func (s *session) answered(r *readPass, sc *serverConn, at int) bool {
	if !s.flush(s.passData(r), r.b) {
		return false
	}
	r.start, r.out, r.b.reqs = at, at, 0
	s.waitAnswered(sc)
	return s.beginBatch()
}

// fromClient handles one read from the client, in (*bp)[start:end]. It
// returns true when the session must end (Terminate, protocol violation,
// fatal refusal); waiting when the read waits on the session's event loop
// for a server connection: LoopResume takes it up, and the buffer is not
// the caller's to give back.
func (s *session) fromClient(bp *[]byte, start, end int) (quit, waiting bool) {
	buf := *bp
	if s.ncarry > 0 {
		start -= s.ncarry
		copy(buf[start:], s.carry[:s.ncarry])
		s.ncarry = 0
	}
	if !s.beginBatch() {
		s.endBatch()
		return true, false
	}
	s.reads++
	s.refuseRest = nil
	r := readPass{bp: bp, buf: buf, start: start, out: start, off: start, end: end, b: batch{unsynced: s.unsynced}}
	return s.readFrames(&r, false)
}

// readFrames walks the frames of a read (fromClient), or of one taken up
// after its wait on the loop (resumed: at the header it stopped at).
func (s *session) readFrames(r *readPass, resumed bool) (quit, waiting bool) {
	for resumed || r.off < r.end || s.cur.Ending() {
		var n int
		var ev wire.Event
		again := resumed
		if resumed {
			resumed = false
			n, ev = r.n, wire.EvHeader
		} else {
			var err error
			n, ev, err = s.cur.Next(r.buf[r.off:r.end])
			if err != nil {
				s.flush(s.passData(r), r.b)
				s.fail(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "invalid frontend message: " + err.Error(),
					Hint: "the client sent bytes that are not a PostgreSQL v3 message; check the driver"})
				return true, false
			}
		}
		switch ev {
		case wire.EvPartial:
			s.ncarry = copy(s.carry[:], r.buf[r.off:r.end])
			r.end = r.off
			continue
		case wire.EvHeader:
			quit, waiting := s.headerFrame(r, again)
			if waiting {
				r.n = n
				if p := &s.waits().pend; p != r {
					*p = *r
				}
				return false, true
			}
			if quit {
				return true, false
			}
		case wire.EvEnd:
			if s.endFrame(r) {
				return true, false
			}
		}
		if (ev == wire.EvHeader || ev == wire.EvBody) && !s.dropFrame && !s.hold {
			if s.obOn {
				s.ob = append(s.ob, r.buf[r.off:r.off+n]...)
			} else {
				if r.out != r.off {
					copy(r.buf[r.out:], r.buf[r.off:r.off+n])
				}
				r.out += n
			}
		}
		r.off += n
	}
	if !s.hold {
		s.cur.Trim(txstate.MaxScan)
	}
	r.b.midFrame = !s.hold && !s.dropFrame && !s.cur.AtBoundary()
	return !s.flush(s.passData(r), r.b), false
}

// checkFrame refuses a frame header that ends the session (headerFrame):
// not a frontend message, a body where none may be, too large, a
// Terminate, a simple query where they are disabled, a session whose
// server was lost. It returns true when the session must end.
func (s *session) checkFrame(r *readPass, t byte) (quit bool) {
	if !isFrontendType(t) {
		s.flush(s.passData(r), r.b)
		s.fail(errProtocol("invalid frontend message type " + quoteByte(t)))
		return true
	}
	if (t == 'S' || t == 'H') && s.cur.Len != 0 {
		// Sync and Flush have no body; PostgreSQL refuses one that
		// has ("invalid message format"). poolerd may answer a Sync
		// itself at its header: without this check a Sync whose
		// body never comes would be answered (FuzzSessionFrames).
		s.flush(s.passData(r), r.b)
		s.fail(errProtocol("invalid message format: " + quoteByte(t) + " with a body of " + strconv.Itoa(s.cur.Len) + " bytes"))
		return true
	}
	if s.maxPacket > 0 && s.cur.Len+4 > int(s.maxPacket) {
		// Refused before any of it is forwarded; what came before
		// goes out first.
		s.flush(s.passData(r), r.b)
		s.fail(errPacketTooLarge(t, s.cur.Len+4, int(s.maxPacket)))
		return true
	}
	if t == 'X' {
		s.flush(s.passData(r), r.b)
		return true
	}
	if t == 'Q' && s.srv.cfg().DisablePQExec {
		s.flush(s.passData(r), r.b)
		s.fail(errPQExecDisabled())
		return true
	}
	if h := s.srv.onFrame; h != nil {
		h(s, t)
	}
	if s.severed.Load() {
		// The server connection this client's transaction or
		// pipeline ran on is gone: nothing of this read may reach
		// another one (see attach).
		s.fail(errServerLost())
		return true
	}
	return false
}

// headerFrame handles a frame's header (readFrames): what it needs (a
// server connection, a rate check) and whether it is forwarded, held or
// dropped. resumed: the read waited on the loop for a server connection
// for this frame, and takes up here.
func (s *session) headerFrame(r *readPass, resumed bool) (quit, waiting bool) {
	t := s.cur.Type
	if resumed && !r.rateWait {
		attached, quit, waiting := s.attachResumed(r)
		if waiting || quit {
			return quit, waiting
		}
		s.dropFrame = !attached
	} else {
		if !resumed {
			if s.checkFrame(r, t) {
				return true, false
			}
			s.dropFrame = false
		} else if s.severed.Load() {
			s.fail(errServerLost()) // lost while the read waited for its rate limits
			return true, false
		}
		var rateErr error
		if !s.refusing && s.refuseRest == nil {
			rateErr = s.rateCheck(t, r)
		}
		if rateErr == errRateWaitOnLoop {
			return false, true
		}
		switch {
		case rateErr != nil && isFatal(rateErr):
			s.flush(s.passData(r), r.b)
			s.fail(rateErr)
			return true, false
		case rateErr != nil:
			s.dropFrame = true
			// The refusal must reach the client after the answers to
			// what it sent before: send that, and wait for them.
			if sc := s.server.Load(); sc != nil {
				if !s.answered(r, sc, r.off) {
					return true, false
				}
				s.abortTx(sc)
			}
			s.refuse(rateErr)
			s.refuseRest = rateErr
		case s.refusing:
			// After a refusal, skip to the Sync as PostgreSQL does
			// after an error; the Sync gets the ReadyForQuery.
			s.dropFrame = true
			if t == 'S' {
				s.refusing = false
				s.writeClient(wire.AppendReadyForQuery(nil, s.txStatus()))
			}
		case s.refuseRest != nil && startsRequest(t, r.b.unsynced):
			// A request pipelined behind one poolerd refused, in the
			// same read: refused too, so that the statements after a
			// refused BEGIN do not run on their own.
			s.dropFrame = true
			s.refuse(s.refuseRest)
		case s.server.Load() == nil && (t == 'd' || t == 'c' || t == 'f'):
			// COPY messages with no COPY in progress: PostgreSQL ignores
			// them (they trail a COPY that failed).
			s.dropFrame = true
		case s.server.Load() == nil && s.tracked && (t == 'C' || t == 'S' || t == 'H'):
			// Answered without a server: a Close needs none (the
			// statement stays prepared for other clients), and outside
			// a transaction a Sync has nothing to finish. Drivers close
			// statements while holding their own pool's locks
			// (database/sql): that must never wait for a server.
			s.dropFrame = true
			switch t {
			case 'C':
				s.localClose = true
				s.cur.Capture(s.cur.Len)
			case 'S':
				s.writeClient(wire.AppendReadyForQuery(nil, s.txStatus()))
			}
		case s.server.Load() == nil:
			attached, quit, waiting := s.attachOrRefuse(r)
			if waiting || quit {
				return quit, waiting
			}
			s.dropFrame = !attached
		}
	}
	s.hold = false
	if t == 'Q' && s.tracked && !s.dropFrame {
		if sc := s.server.Load(); sc != nil {
			sc.mu.Lock()
			sc.unnamedBy = nil // a simple query drops the unnamed statement
			sc.mu.Unlock()
		}
	}
	if !s.dropFrame {
		s.noteRuns(&r.b, t)
		switch {
		case s.heldFrame(t, s.cur.Len):
			// Counted when complete, in the batch that sends it.
			s.hold = true
			s.holdAt, s.holdRead = r.off, s.reads
			s.cur.Capture(s.cur.Len)
		case (t == 'Q' || t == 'P') && s.stateful:
			s.count(&r.b, t)
			s.cur.Capture(txstate.MaxScan)
		case (t == 'Q' || t == 'P') && s.timeouts().any():
			s.count(&r.b, t)
			s.cur.Capture(maxQueryText + 128)
		default:
			s.count(&r.b, t)
		}
	}
	return false, false
}

// endFrame handles a frame once it is complete (readFrames): a frame held
// for its body is scanned, rewritten and forwarded, or refused. It returns
// true when the session must end.
func (s *session) endFrame(r *readPass) (quit bool) {
	t := s.cur.Type
	if s.localClose {
		s.localClose = false
		s.closeLocally(s.cur.Body())
	}
	if s.dropFrame {
		return false
	}
	body := s.cur.Body()
	if (t == 'Q' || t == 'P') && s.timeouts().any() {
		s.noteQuery(t, body)
	}
	if !s.hold {
		if s.stateful && (t == 'Q' || t == 'P') {
			// Too long to hold: already on its way, so it can only pin.
			_ = s.scanEffects(t, body, false)
			r.b.commits = r.b.commits || t == 'Q' && s.eff.Commits
			s.noteShape(&r.b, t)
		}
		return false
	}
	s.hold = false
	sc := s.server.Load()
	if sc == nil {
		return false // the server was lost; the session is ending
	}
	if t != 'Q' && s.tracked && s.unresolved(sc, t, body, r.b.reqs) {
		// The name's fate hangs on the answer to an earlier request of
		// the pipeline (a Parse or Close an error may skip): send what
		// came before, wait for the answers, then go on.
		if !s.answered(r, sc, r.off) {
			return true
		}
		s.holdRead = 0 // forwarded from its capture, not in place
		if sc = s.server.Load(); sc == nil {
			attached, quit, _ := s.attachOrRefuse(nil) // (nil: waits here)
			if quit {
				return true
			}
			if !attached {
				return false
			}
			sc = s.server.Load()
		}
	}
	canRefuse := !r.b.unsynced
	if werr := s.scanEffects(t, body, canRefuse); werr != nil {
		// Refused in order: what came before goes first and is answered
		// before the error.
		if !s.answered(r, sc, r.off) {
			return true
		}
		s.abortTx(sc)
		if isFatal(werr) {
			s.fail(werr)
			return true
		}
		s.refuse(werr)
		return false
	}
	zb := r.b.reqs
	s.count(&r.b, t)
	r.b.commits = r.b.commits || t == 'Q' && s.eff.Commits
	s.noteShape(&r.b, t)
	s.fo = s.fo[:0]
	if t == 'Q' {
		s.queryFrame(sc, body, &r.b, zb)
	} else {
		s.stmtFrame(sc, t, body, zb)
	}
	switch {
	case len(s.fo) == 0 && s.holdRead == s.reads:
		// Unchanged and all in this read: forward it in place.
		frame := r.buf[s.holdAt:r.off]
		if s.obOn {
			s.ob = append(s.ob, frame...)
		} else {
			r.out += copy(r.buf[r.out:], frame)
		}
	case len(s.fo) == 0:
		s.emitFrame(t, body)
		fallthrough
	default:
		if !s.obOn {
			s.ob = append(s.obBuf(), r.buf[r.start:r.out]...)
			s.obOn = true
		}
		s.ob = append(s.ob, s.fo...)
	}
	if s.hitDef != nil && !s.replayOn && s.obOn {
		// What follows a cache hit is kept for a retry (retry.go).
		s.replayOn, s.replayAt = true, len(s.ob)
		if s.hitStart {
			s.replayAt -= len(s.fo)
		}
	}
	if cap(s.fo) > 4096 {
		s.fo = nil
	}
	return false
}

// attachOrRefuse attaches a server connection for the request being read,
// or refuses the request: attached is false if it was refused, quit true if
// the refusal ended the session. With r (the read, at the request's first
// header) the checkout may wait on the session's event loop: waiting, and
// attachResumed takes it up; without, it waits where it is.
func (s *session) attachOrRefuse(r *readPass) (attached, quit, waiting bool) {
	owed := s.owed.Load()
	err := s.attachVia(nil, r)
	if err == errWaitOnLoop {
		r.owed = owed
		return false, false, true
	}
	attached, quit = s.attachOutcome(owed, err)
	return attached, quit, false
}

// attachResumed is attachOrRefuse once the checkout that waited on the
// loop is over.
func (s *session) attachResumed(r *readPass) (attached, quit, waiting bool) {
	err := s.resumeAttach(r)
	if err == errWaitOnLoop {
		return false, false, true
	}
	attached, quit = s.attachOutcome(r.owed, err)
	return attached, quit, false
}

// attachOutcome is what attach's err means for the request (owed: s.owed
// before the attach).
func (s *session) attachOutcome(owed *wire.Error, err error) (attached, quit bool) {
	werr, _ := err.(*wire.Error)
	switch {
	case err == nil:
		return true, false
	case isFatal(err):
		s.fail(err)
		return false, true
	case s.failedBlock.Load() && (owed == nil || werr != owed):
		// (The owed ERROR, the loss told at the next request, is not a
		// want of a server: the session keeps its failed block.)
		// The client's block was lost with its server connection and no
		// server can take it on: refused, even its ROLLBACK would leave
		// it in a failed block that every later request but a ROLLBACK
		// (its BEGIN included) is refused in. Its session ends, as a
		// direct connection's does when its server goes.
		s.fail(errBlockWithoutServer(err))
		return false, true
	}
	s.refuse(err)
	s.refuseRest = err
	return false, false
}

// startsRequest reports whether frame type t starts a request that runs
// something: a Query, a FunctionCall, or the first Parse, Bind, Describe
// or Execute after a Sync.
func startsRequest(t byte, unsynced bool) bool {
	switch t {
	case 'Q', 'F':
		return true
	case 'P', 'B', 'D', 'E':
		return !unsynced
	}
	return false
}

// count records what a forwarded frame earns. Every Query, FunctionCall and
// Sync earns one ReadyForQuery, except that PostgreSQL ignores a Sync it
// reads while in COPY FROM STDIN: such Syncs (sent after the Execute that
// started the COPY, before its CopyDone or CopyFail) are taken back when the
// COPY ends.
func (s *session) count(b *batch, t byte) {
	switch t {
	case 'S':
		b.reqs++
		b.unsynced = false
		s.syncsSinceOther++
		return
	case 'H', 'd':
		if t == 'H' {
			b.unsynced = true
		}
		return
	case 'c', 'f':
		if sc := s.server.Load(); sc != nil && sc.copyIn.CompareAndSwap(true, false) {
			b.reqs -= s.syncsSinceOther
			// server_response_timeout was off while the server waited
			// for COPY data; it counts again from the end of the data,
			// the server's answer being owed only from now.
			sc.lastRecv.Store(s.srv.nanotime())
		}
	case 'Q', 'F':
		b.reqs++
		if t == 'F' {
			s.calls = true // a function by OID: any function
		}
	case 'P', 'B', 'D', 'E', 'C':
		b.unsynced = true
	}
	s.syncsSinceOther = 0
}

func isFrontendType(t byte) bool {
	switch t {
	case 'Q', 'F', 'S', 'P', 'B', 'D', 'E', 'C', 'H', 'd', 'c', 'f', 'X':
		return true
	}
	return false
}

// refuse answers a request that could not get a server with an error, and
// keeps the session: a simple query gets ReadyForQuery at once, an extended
// one at its Sync.
func (s *session) refuse(err error) {
	werr := wireError(err)
	s.dbp.ctr.countError(werr.Code)
	msg := werr.Append(nil)
	switch s.cur.Type {
	case 'Q', 'F', 'S':
		msg = wire.AppendReadyForQuery(msg, s.txStatus())
	default:
		s.refusing = true
	}
	s.writeClient(msg)
	level := zap.WarnLevel
	if werr.Code == "53400" {
		// A client over its rate limit is refused many times a second:
		// the metrics count those, the log would only flood.
		level = zap.DebugLevel
	}
	s.log.Log(level, "request refused", zap.String("sqlstate", werr.Code), zap.String("reason", werr.Message), zap.String("detail", werr.Detail))
}

// txStatus is the transaction status to report for a request poolerd
// answers itself: the held server's, or idle.
func (s *session) txStatus() byte {
	sc := s.server.Load()
	if sc == nil {
		if s.severed.Load() || s.failedBlock.Load() {
			return wire.TxFailed // whatever it was in is gone
		}
		return wire.TxIdle
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.txStatus
}

// rateCheck checks the session's rate limits for a frame that starts a
// request (a Query, a FunctionCall, or the first extended-protocol message
// after a Sync) and returns the refusal when a limit says no. Wait-mode
// rules delay here, before a server is taken for a new transaction. On an
// event loop the read waits there (errRateWaitOnLoop: r.rateWait), woken
// by its timer to decide again, by an event on the client's socket to see
// whether the client left, or by the session's end; a decision of the
// Redis backend is waited for there too (rateDecide), woken by its answer.
// Only a session off its loop's goroutine waits off the loop.
func (s *session) rateCheck(t byte, r *readPass) error {
	switch t {
	case 'Q', 'F':
	case 'P', 'B', 'D', 'E', 'C', 'H', 'S':
		if r.b.unsynced {
			return nil // inside a request already counted
		}
	default:
		return nil
	}
	rates := s.sessionRates()
	if len(rates) == 0 {
		return nil
	}
	it := s.item.Load()
	if r.rateWait {
		if err := s.rateWoken(r, it); err != nil {
			return err
		}
	}
	var lw *rateLoopWait
	if it.OnLoop() || s.lw != nil && s.lw.rate.decision != nil {
		// (Resumed off its loop, the engine stopped, with a Redis
		// decision in: taken up all the same, not asked twice.)
		lw = &s.waits().rate
	}
	startsTx := s.txStatus() == wire.TxIdle
	if sc := s.server.Load(); sc != nil {
		sc.mu.Lock()
		startsTx = startsTx && sc.pending == 0
		sc.mu.Unlock()
	}
	err := s.srv.checkRate(s.srv.ctx, s.log, rates, requestBuckets(startsTx), "ERROR", rateWait{conn: s.conn, owner: s, loop: lw})
	switch err {
	case errRateWaitOnLoop:
		lw.until = time.Now().Add(lw.sleep)
		return s.rateSleep(r, it)
	case errRateDecideOnLoop:
		return s.rateDecide(r, it)
	}
	if lw != nil && !lw.start.IsZero() {
		*lw = rateLoopWait{}
		it.SleepDone()
	}
	return err
}

// rateSleep parks the read for the rest of its rate-limit wait on the loop
// (rateCheck) and returns errRateWaitOnLoop, or an end that came before the
// wait could be withdrawn (parkRate).
func (s *session) rateSleep(r *readPass, it *reactor.Item) error {
	it.Sleep(time.Until(s.lw.rate.until), true)
	return s.parkRate(r, it)
}

// rateDecide parks the read while the Redis backend decides its request
// (rateCheck, errRateDecideOnLoop): the decision is queued for an asker
// once the read is suspended (rateDecision.ask), and its answer wakes the
// read, whose rateCheck then takes it up. An event on the client's socket does
// not wake it (the answer comes within redis_timeout).
func (s *session) rateDecide(r *readPass, it *reactor.Item) error {
	d := s.lw.rate.decision
	it.SleepDone() // a sleep's timer still set would wake the wait early
	ready := it.Suspend()
	if err := s.parkRate(r, it); err != errRateWaitOnLoop {
		return err
	}
	d.ask(s.srv.ctx, s.srv.rateMet, ready)
	return errRateWaitOnLoop
}

// parkRate finishes parking the read for its rate-limit wait, the item
// suspended (rateSleep, rateDecide): the session's end withdraws the wait
// from here on (wakeLoop, withdrawWait). An end that came before is
// returned instead of errRateWaitOnLoop, the wait undone.
func (s *session) parkRate(r *readPass, it *reactor.Item) error {
	r.rateWait = true
	s.waitCancel.Store(s.withdrawFor(it))
	// The end sets endErr before it looks for a wait to withdraw: one
	// that did not find this one is seen here.
	werr := s.waitEnded()
	if werr == nil {
		return errRateWaitOnLoop
	}
	it.Unsuspend()
	it.SleepDone()
	r.rateWait = false
	s.waitCancel.Store(nil)
	s.lw.rate = rateLoopWait{}
	return werr
}

// withdrawFor is the item's WithdrawFunc, for waitCancel, made once per item.
func (s *session) withdrawFor(it *reactor.Item) *func(error) {
	lw := s.waits()
	if lw.withdrawOf != it {
		f := it.WithdrawFunc()
		lw.withdraw, lw.withdrawOf = &f, it
	}
	return lw.withdraw
}

// rateWoken takes up a rate-limit wait on the loop (rateCheck): it returns
// the session's end, or errClientGone, when the wait must end there, and
// errRateWaitOnLoop, the read parked again, when it woke before its time
// (an event on the client's socket that is not its leaving) or before the
// Redis decision it waits for came.
func (s *session) rateWoken(r *readPass, it *reactor.Item) error {
	r.rateWait = false
	s.waitCancel.Store(nil)
	werr := s.waitEnded()
	d := s.lw.rate.decision
	if werr == nil && d == nil && it.PeerGone() {
		werr = errClientGone()
	}
	if werr != nil {
		s.lw.rate = rateLoopWait{} // a decision still asked is dropped
		it.SleepDone()
		return werr
	}
	if d != nil {
		if !d.done.Load() {
			return s.rateDecisionWait(r, it, d)
		}
		return nil
	}
	if time.Now().Before(s.lw.rate.until) {
		return s.rateSleep(r, it)
	}
	return nil
}

// rateDecisionWait parks the read again for the Redis decision d, already
// asked, after a wake-up that was not its answer. The answer may have come
// between that wake-up and the suspend (its wake-up then found nothing
// waiting): done, seen after the suspend, says so, and the read goes on.
func (s *session) rateDecisionWait(r *readPass, it *reactor.Item, d *rateDecision) error {
	it.Suspend()
	if d.done.Load() {
		it.Unsuspend()
		return nil
	}
	return s.parkRate(r, it)
}

// waitAnswered waits until the held server has answered every request sent
// so far (or the session lost it).
func (s *session) waitAnswered(sc *serverConn) {
	sc.mu.Lock()
	if sc.owner.Load() != s || sc.pending == 0 {
		sc.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	sc.quiet = ch
	sc.mu.Unlock()
	s.yieldLoop()
	select {
	case <-ch:
	case <-s.srv.ctx.Done():
	}
	// quiet is closed by the settle of the last answer while it holds mu,
	// before it decides whether to release the connection: wait for that
	// decision, so that the caller sees the connection detached (its
	// server pointer nil) if it was, and never rewrites what follows for
	// a connection it no longer holds (the state fuzzer and
	// TestTxPreparedSkippedParse under verify_handoff always: a Bind
	// rewritten for the old connection went to another, 26000).
	sc.mu.Lock()
	sc.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
}

// abortSQL fails the transaction on the server, as the statement poolerd
// refused would have on a direct connection.
const abortSQL = "DO $poolerd$BEGIN RAISE EXCEPTION 'poolerd refused a statement of this transaction'; END$poolerd$"

// abortTx leaves sc's transaction failed, after a refusal inside it: the
// client's next statements get 25P02 and its COMMIT rolls back, as they
// would directly. It does nothing outside a transaction block.
func (s *session) abortTx(sc *serverConn) {
	sc.mu.Lock()
	if sc.owner.Load() != s || sc.txStatus != wire.TxInTx || sc.pending != 0 {
		sc.mu.Unlock()
		return
	}
	sc.pending++
	sc.unnamedBy = nil
	sc.swallowGroupLocked(sc.zSent)
	sc.failZ = sc.zSent // its error is the point (swallowed)
	sc.zSent++
	sc.mu.Unlock()
	s.yieldLoop()
	if _, err := sc.Conn.Write(wire.AppendQuery(nil, abortSQL)); err != nil {
		s.dbp.pool.Discard(sc, evictWriteFailed)
		s.serverLost(sc, err)
		return
	}
	s.waitAnswered(sc)
	sc.mu.Lock()
	sc.opErr = nil // the error was the point
	sc.mu.Unlock()
}

// lossWait waits until the answer to a lost server connection's request,
// if one is being written, has gone out (keep.go): a read handled without
// a server must not be answered first.
func (s *session) lossWait() {
	if !s.lossMu.TryLock() {
		s.yieldLoop()
		s.lossMu.Lock()
	}
	//lint:ignore SA2001 an empty critical section: the wait is the point
	s.lossMu.Unlock()
}

// beginBatch keeps the held server from being released while this read is
// being processed, so that all of it goes to one server.
//
// It reports false if the session has been ended meanwhile (see
// terminateIfIdle): nothing of the read may be forwarded then.
func (s *session) beginBatch() bool {
	sc := s.server.Load()
	if sc == nil {
		s.lossWait()
		s.unclaim() // a request came: it runs here (handover.go)
		return s.endErr.Load() == nil
	}
	sc.mu.Lock()
	if sc.owner.Load() != s {
		sc.mu.Unlock()
		s.lossWait()
		s.unclaim()
		return s.endErr.Load() == nil
	}
	defer sc.mu.Unlock()
	sc.busy = true
	s.unclaim()
	if s.endErr.Load() != nil {
		sc.busy = false // nothing will be sent: the connection stays clean
		return false
	}
	return true
}

// flush ends a batch: it records what the server will owe, then writes the
// RESET ROLE and the parameter sync (if the server was just attached and
// needs them) and the client's bytes in one system call. A batch that sent
// nothing may leave the server clean; in transaction mode it is released
// here. It returns false if the server was lost.
func (s *session) flush(data []byte, b batch) bool {
	defer s.endBatch()
	s.unsynced = b.unsynced
	sc := s.server.Load()
	if sc == nil {
		// Lost while this read was handled: what it holds is dropped, and
		// the session ends.
		return s.lostMidBatch(data)
	}
	sync, syncReqs, reset, fail := s.syncQuery, s.syncReqs, s.syncReset, s.syncFail
	s.syncQuery, s.syncReqs, s.syncReset, s.syncFail = nil, 0, false, false
	var now, busySince, queryStart, leaseStart int64
	timed := len(data) > 0
	if timed {
		now = s.srv.nanotime()
		s.lastReq.Store(now)
		s.dbp.ctr.received.Add(uint64(len(data)))
	}
	sc.mu.Lock()
	if sc.owner.Load() != s {
		sc.mu.Unlock()
		return s.lostMidBatch(data)
	}
	if timed {
		if sc.busySince == 0 {
			sc.busySince = now
		}
		if sc.pending == 0 && b.reqs > 0 {
			sc.queryStart = now
			sc.lastRecv.Store(now)
		}
		sc.idleTxSince = 0
		busySince, queryStart, leaseStart = sc.busySince, sc.queryStart, sc.leaseStart
	}
	sc.pending += b.reqs + syncReqs
	for i := range syncReqs {
		sc.swallowGroupLocked(sc.zSent + int64(i))
	}
	if len(sc.syncNames) > 0 {
		// The parameter sync's groups follow the RESET ROLE, if any: the
		// reader keeps each set_config's answer as the applied value.
		first := sc.zSent
		if reset {
			first++
		}
		for i, name := range sc.syncNames {
			if name != "" {
				sc.syncQ = append(sc.syncQ, syncValue{z: first + int64(i), name: name})
			}
		}
		sc.syncNames = sc.syncNames[:0]
	}
	if reset {
		sc.resetZ, sc.opErr, sc.roleBy = sc.zSent, nil, 0
	}
	if fail {
		sc.failZ = sc.zSent + int64(syncReqs) - 1 // the last of them
	}
	if s.calls {
		sc.roleBy = s.id // it may set a role that others must not get
		s.calls = false
	}
	base := sc.zSent + int64(syncReqs)
	for _, op := range s.bops {
		op.zseq += base
		sc.stq.push(op)
	}
	sc.nops.Add(int32(len(s.bops)))
	for _, u := range s.bundo {
		u.zseq += base
		sc.qundo = append(sc.qundo, u)
	}
	sc.nqundo.Add(int32(len(s.bundo)))
	for _, g := range s.bgroups {
		// A DEALLOCATE's Parse first: it may fail as the client's own
		// statement would (the schema changed); nothing is left behind.
		sc.swallowGroupLocked(base + int64(g))
		sc.mayFailQ = append(sc.mayFailQ, base+int64(g))
	}
	s.keepReplayLocked(sc, data, b, base)
	sc.zSent = base + int64(b.reqs)
	sc.unsynced = b.unsynced
	if b.runs || b.commits || b.opens {
		// The groups before end (the batch's, and the one it leaves
		// unsynced) may have run, or committed, a statement, or opened a
		// transaction block.
		end := sc.zSent
		if b.unsynced {
			end++
		}
		if b.runs {
			sc.runZ = end
		}
		if b.commits {
			sc.commitZ = end
		}
		if b.opens {
			sc.openZ = end
		}
	}
	// A held frame still arriving (it spans reads) is part of the batch
	// being assembled: the connection stays busy, and so unreleasable,
	// until it is complete and sent.
	sc.busy = s.hold
	// A streamed frame cut by the end of this read is partly on the
	// server: until its rest follows, the connection is in no state to
	// serve anybody else (FuzzSessionFrames: a CopyData with no COPY
	// running, its client gone in the middle of it).
	sc.clientMid = b.midFrame
	release := len(data) == 0 && syncReqs == 0 && s.releaseWhenIdle() && sc.cleanLocked()
	if release {
		sc.detachLocked(s)
	}
	sc.mu.Unlock()
	if release {
		s.dbp.checkin(sc)
		return true
	}
	if timed && s.timeouts().any() {
		s.noteBusy(busySince, queryStart, leaseStart)
	}
	var err error
	switch {
	case sync == nil && len(data) == 0:
	case s.item.Load().OnLoop():
		// On the client's loop: what the server does not take now is
		// kept for its loop to send, and the client is not read
		// meanwhile (writeOrKeep).
		var done bool
		if done, err = sc.writeOrKeep(s.item.Load(), sync, data); !done && err == nil {
			err = sc.write2(sync, data, s.yieldFn)
		}
	default:
		err = sc.write2(sync, data, s.yieldFn)
	}
	if err != nil {
		s.dbp.pool.Discard(sc, evictWriteFailed)
		s.serverLost(sc, err)
		return false
	}
	return true
}

// lostMidBatch is flush's answer when the session's server connection was
// lost while the batch was assembled: nothing of data reaches any server.
// A severed session ends (its final message comes from the loss); one whose
// loss was answered as kept (keep.go) would leave this request without an
// answer, so it ends too, with 08006 rather than silently. An empty batch
// loses nothing.
func (s *session) lostMidBatch(data []byte) bool {
	switch {
	case s.severed.Load():
		return false
	case len(data) == 0:
		return true
	}
	s.log.Warn("server connection lost while a request was being sent to it", zap.Int("bytes", len(data)))
	s.fail(errServerLost())
	return false
}

// attach checks out a server connection and makes it this session's. The
// query that brings the server's session parameters in line with the
// client's, and a RESET ROLE if another client called a function on the
// connection (see roleCheck), are kept for flush, which sends them ahead of
// the client's bytes.
//
// held is a connection the login already checked out for the session (a
// session-mode client, whose BackendKeyData names that backend): attach
// makes that one the session's or, if it cannot (the backend went away in
// between, the session was ended), gives it back and ends the session; it
// never takes another, which the client was not told about. nil: attach
// checks one out.
//
// This is the only place a session gets a server connection, and so the
// place where atomicity is enforced: a session attaches only when it holds
// none and the last one it held was given up clean (ReadyForQuery idle,
// nothing owed, nothing unsynced, nothing half sent). Once a client is
// inside a transaction block or has requests in flight, everything it sends
// goes to the server connection it holds, or to none: a connection lost in
// that state (server EOF or FATAL, server_response_timeout, a failed write)
// severs the session first, and a severed session never attaches again; its
// client gets the server's FATAL or 08006 and the session ends, as a direct
// connection to a backend that died would.
func (s *session) attach(held *serverConn) error { return s.attachVia(held, nil) }

// errWaitOnLoop is attachVia's answer when its checkout waits on the
// session's event loop (the read r is then kept for resumeAttach).
var errWaitOnLoop = errors.New("checkout waits on the event loop")

// attachVia is attach; with r (a read whose handler runs on the session's
// event loop) a checkout that must wait does so on the loop: errWaitOnLoop.
func (s *session) attachVia(held *serverConn, r *readPass) error {
	if held == nil && s.severed.Load() {
		return errServerLost()
	}
	if werr := s.owed.Swap(nil); werr != nil {
		// The block was lost while idle (keep.go).
		return werr
	}
	// During a shutdown a request already read runs (the session is ended
	// at its next idle point); a session already ended does not attach.
	if held == nil && s.endErr.Load() != nil && s.endErr.Load() != errHandedOver {
		return errShuttingDown()
	}
	// lease_timeout's clock starts with the wait for a connection.
	var leaseAt int64
	if held == nil && s.timeouts().leaseTimeout > 0 {
		leaseAt = s.srv.nanotime()
	}
	return s.attachFrom(held, r, leaseAt, 0)
}

// attachFrom is attachVia's checkout and binding, from the given attempt
// (a connection found broken is discarded and another tried, twice).
func (s *session) attachFrom(held *serverConn, r *readPass, leaseAt int64, attempt int) error {
	lease := time.Duration(s.timeouts().leaseTimeout)
	for ; ; attempt++ {
		sc := held
		if sc == nil {
			var werr error
			var left leaseLeft
			if leaseAt != 0 {
				left = leaseLeft{limit: lease, left: max(lease-time.Duration(s.srv.nanotime()-leaseAt), time.Nanosecond)}
			}
			it := s.item.Load()
			if r != nil && it.OnLoop() {
				var waiting bool
				sc, waiting, werr = s.dbp.checkoutOnLoop(s, it, &r.wait, left)
				if waiting {
					r.wait.leaseAt, r.wait.attempt = leaseAt, attempt
					return errWaitOnLoop
				}
			} else {
				sc, werr = s.dbp.checkout(s, s.srv.ctx.Done(), it, left)
			}
			if werr != nil {
				return werr
			}
		}
		retry, err := s.bindServer(sc, held, leaseAt)
		switch {
		case !retry:
			return err
		case attempt >= 2:
			return errServerUnavailable(errServerBroken)
		}
	}
}

// resumeAttach is attachVia once its checkout that waited on the loop is
// over (it may wait again, for another connection if the one it got was
// broken).
func (s *session) resumeAttach(r *readPass) error {
	sc, err := s.dbp.checkedOut(s, s.item.Load(), &r.wait)
	if err != nil {
		return err
	}
	retry, err := s.bindServer(sc, nil, r.wait.leaseAt)
	switch {
	case !retry:
		return err
	case r.wait.attempt >= 2:
		return errServerUnavailable(errServerBroken)
	}
	return s.attachFrom(nil, r, r.wait.leaseAt, r.wait.attempt+1)
}

// bindServer makes sc, just checked out (or held: the login's), the
// session's server connection. retry: sc was broken and is discarded, take
// another.
func (s *session) bindServer(sc, held *serverConn, leaseAt int64) (retry bool, err error) {
	if s.severed.Load() {
		s.dbp.checkin(sc)
		return false, errServerLost()
	}
	s.attachMu.Lock()
	s.unclaim() // a hand-over claim, under the lock it is made under
	if s.closed.Load() || s.endErr.Load() != nil {
		// Terminated while queued (shutdown, a timeout): its request
		// must not reach the server.
		s.attachMu.Unlock()
		s.dbp.checkin(sc)
		return false, errShuttingDown()
	}
	sc.mu.Lock()
	if sc.broken || sc.authOff.Load() {
		// authOff: another session authorization than the login's,
		// which RESET ROLE does not undo.
		sc.broken = true
		sc.mu.Unlock()
		s.attachMu.Unlock()
		s.dbp.pool.Discard(sc, evictBroken)
		if held != nil {
			return false, errServerLost()
		}
		return true, nil
	}
	// What an earlier owner's transaction cost, if it ended without its
	// ReadyForQuery (the client left mid-transaction), is not this
	// owner's. Before the owner is stored: the reader's next read loads
	// the owner first.
	sc.costRows.Store(0)
	sc.costBytes.Store(0)
	sc.owner.Store(s)
	sc.busy = true
	sc.unsynced = false
	sc.leaseStart = leaseAt
	var resetQ []byte
	if sc.roleBy != 0 && sc.roleBy != s.id {
		resetQ = resetQueryLocked(sc) // a startup role is set again after it
	}
	reset := resetQ != nil
	sc.mu.Unlock()
	s.server.Store(sc)
	s.attachMu.Unlock()
	s.syncQuery, s.syncReqs = s.syncParams(sc)
	s.syncReset = reset
	if reset {
		s.syncQuery = append(resetQ, s.syncQuery...)
		s.syncReqs++
	}
	s.portalCommits, s.grpTx = false, 0
	if held == nil && s.failedBlock.Swap(false) {
		// The client's transaction block was lost with its last server
		// connection: it continues, failed, on this one.
		s.syncQuery = wire.AppendQuery(s.syncQuery, failBlockSQL)
		s.syncReqs++
		s.syncFail = true
	}
	if s.syncQuery != nil && s.tracked {
		sc.mu.Lock()
		sc.unnamedBy = nil // a simple query drops the unnamed statement
		sc.mu.Unlock()
	}
	s.syncsSinceOther = 0
	return false, nil
}

// queued is called when the session's checkout must wait (dbPool.checkout):
// the session shows as waiting (SHOW CLIENTS, parking), and a cancel
// request from the client withdraws the request, which is then refused
// with 57014, as the query would have been. The waiter is made on the
// first wait and kept: waiting allocates nothing.
func (s *session) queued() *pool.Waiter[*serverConn] {
	s.yieldLoop()
	return s.queue()
}

// queue is queued for a checkout that waits on the session's event loop
// (dbPool.checkoutOnLoop): the loop goes on.
func (s *session) queue() *pool.Waiter[*serverConn] {
	s.waitSince.Store(s.srv.nanotime())
	if s.waiter == nil || s.waiterPool != s.dbp.pool {
		w, p := pool.NewWaiter[*serverConn](), s.dbp.pool
		s.waiter, s.waiterPool = w, p
		cancel := func(cause error) { p.CancelWait(w, cause) }
		s.cancelWait = &cancel
	}
	s.waitCancel.Store(s.cancelWait)
	return s.waiter
}

// dequeued ends the wait queued began.
func (s *session) dequeued() {
	s.waitCancel.Store(nil)
	s.waitSince.Store(0)
	s.waitedAt = s.srv.nanotime()
}

// syncParams returns the query that gives sc this session's parameters,
// or nil when they already match.
//
// Clients of one application usually have the same parameters: a server
// connection remembers the parameter key of the last client it was found in
// line with, and a client with that key, if the connection's parameters have
// not changed since, needs no comparison.
//
// It returns the Query frames and how many there are (one per statement,
// see txstate.ParamSyncSQL); sc.syncNames gets the parameter each sets, for the
// reader to keep the value the server answers.
func (s *session) syncParams(sc *serverConn) ([]byte, int) {
	sc.syncNames = sc.syncNames[:0]
	s.pmu.Lock()
	if s.pkey == "" {
		s.pkey = txstate.ParamsKey(s.params)
	}
	key := s.pkey
	if sc.syncedGen == sc.paramGen && sc.syncedKey == key {
		s.pmu.Unlock()
		return nil, 0
	}
	stmts := txstate.ParamSyncSQL(s.params, sc.params, sc.applied)
	s.pmu.Unlock()
	if len(stmts) == 0 {
		sc.syncedKey, sc.syncedGen = key, sc.paramGen
		return nil, 0
	}
	sc.paramGen++
	var q []byte
	for _, st := range stmts {
		q = wire.AppendQuery(q, st.SQL)
		sc.syncNames = append(sc.syncNames, st.Name)
	}
	return q, len(stmts)
}

// noteParameter is called by the server's reader for a ParameterStatus that
// answers this client: the client's session now has that value.
func (s *session) noteParameter(name, value string) {
	s.pmu.Lock()
	if v, ok := s.params[name]; !ok || v != value {
		s.ownParams()
		s.params[name] = value
		s.pkey = ""
	}
	s.pmu.Unlock()
}

// writeFromServer forwards bytes from sc to the client. When sc's loop is
// the writer and the client is on a loop, what the client does not take
// now is kept for its loop to send (keepOnLoop); otherwise the write waits,
// its loop going on without it (sc.yieldFn).
func (s *session) writeFromServer(sc *serverConn, p []byte) {
	if sc.item.Load().OnLoop() && s.keepOnLoop(p) {
		return
	}
	s.writeClientThen(p, sc.yieldFn)
}

// keepOnLoop writes p to a client on an event loop without waiting: what
// the socket does not take now is kept, and the client's loop sends it
// when the client reads (LoopReady, sendKept), while the server that
// sends more waits (serverConn.pauseFeed). It returns false if it cannot
// (the client is on a goroutine of its own, or another writer is busy):
// the caller then writes and waits.
func (s *session) keepOnLoop(p []byte) bool {
	ci := s.item.Load()
	if ci == nil || !s.wmu.TryLock() {
		return false
	}
	if s.cio == nil || !s.cio.Raw() || s.item.Load() != ci {
		s.wmu.Unlock()
		return false
	}
	kept, ok, err := s.cio.WriteOrKeep(p, nil) // ok: s.wmu orders its writers
	if kept > 0 && err == nil {
		ci.WantWrite(true)
	}
	s.wmu.Unlock()
	if !ok && err == nil {
		return false
	}
	if err != nil && !s.closed.Load() {
		s.log.Debug("client write failed", zap.Error(err))
		s.closeConn()
	}
	return true
}

// keptOut reports whether the client, on its loop, has output kept for it
// (keepOnLoop) that it has not read yet: its item waits to write from the
// keeping until keptSentLocked (any goroutine, no lock).
func (s *session) keptOut() bool {
	return !s.closed.Load() && s.item.Load().WantsWrite()
}

// sendKept sends, on the client's loop, what keepOnLoop kept, as much as
// the client takes now; it reports whether all of it is sent (or the
// connection failed).
func (s *session) sendKept() bool {
	if !s.wmu.TryLock() {
		return false // a writer that waits sends it first
	}
	var left int
	var err error
	if s.cio != nil {
		left, err = s.cio.Flush()
	}
	if left == 0 {
		s.keptSentLocked()
	}
	s.wmu.Unlock()
	if err != nil && !s.closed.Load() {
		s.log.Debug("client write failed", zap.Error(err))
		s.closeConn()
	}
	return left == 0
}

// keptSentLocked: the client has taken all its kept output (wmu held):
// its loop reads it again, and the server it holds sends on.
func (s *session) keptSentLocked() {
	s.item.Load().WantWrite(false)
	if sc := s.server.Load(); sc != nil {
		sc.resumeFeed()
	}
}

// writeClient writes to the client; errors end the session through its
// reader, which sees the closed connection.
func (s *session) writeClient(p []byte) { s.writeClientThen(p, s.yieldFn) }

// writeClientThen is writeClient calling beforeWait (if not nil) before
// anything makes it wait: another writer, or a client not reading.
func (s *session) writeClientThen(p []byte, beforeWait func()) {
	var err error
	if !s.wmu.TryLock() {
		if beforeWait != nil {
			beforeWait()
			beforeWait = nil
		}
		s.wmu.Lock()
	}
	switch {
	case s.cio != nil:
		kept := s.cio.Kept() > 0
		err = s.cio.Write2Then(p, nil, beforeWait) // after what was kept
		if kept {
			s.keptSentLocked()
		}
	default:
		if beforeWait != nil {
			beforeWait()
		}
		_, err = s.conn.Write(p)
	}
	s.wmu.Unlock()
	if err != nil && !s.closed.Load() {
		s.log.Debug("client write failed", zap.Error(err))
		s.closeConn()
	}
}

// fail sends a final error and closes the client connection.
//
// One final message per session: the first caller to set the session's end
// error sends it; a later fail (the server's reader and the client's
// goroutine can both find the session over) only closes. A client that
// already has the server's own FATAL gets nothing more.
func (s *session) fail(err error) {
	werr := wireError(err)
	s.finalMu.Lock()
	defer s.finalMu.Unlock()
	s.finishLocked(werr, s.endErr.CompareAndSwap(nil, werr))
}

// finishLocked is fail once the end error is decided (finalMu held): first
// says whether this caller set it, and so sends werr.
func (s *session) finishLocked(werr *wire.Error, first bool) {
	if s.dbp != nil && first {
		s.dbp.ctr.countError(werr.Code)
	}
	// The client's place under the connection limits is free before it
	// reads the refusal, so that an immediate reconnect is not refused too.
	s.releaseClientSlot()
	s.srv.trackLogin(s.conn, false)
	// Bounds the final write, and a writer blocked on a client that
	// does not read.
	_ = s.conn.SetWriteDeadline(time.Now().Add(finalWriteTimeout))
	if first && s.midFrame.Load() && !s.sawFatal.Load() {
		// The client has part of a message: anything now would be read
		// as its rest. It gets the end of the stream instead.
		s.log.Warn("client connection closed without a message: it was in the middle of a message from the server", zap.String("reason", werr.Message))
	}
	if first && !s.handshaking.Load() {
		// Before the client reads why, as PgBouncer logs "closing
		// because": whoever watches the log finds the line once the
		// client has its error.
		s.logDisconnect(werr, nil)
	}
	if first && !s.sawFatal.Load() && !s.midFrame.Load() {
		s.writeClient(werr.Append(nil))
	}
	if !s.handshaking.Load() { // a login's connection is closed by serveConn
		// FIN after the final message, not a close: a client whose
		// next request is still unread would get a reset that can
		// destroy the message before it reads it (see lingerClose).
		// The read deadline wakes the session's goroutine, whose end
		// closes the connection after a linger.
		halfClose(s.conn)
		_ = s.conn.SetReadDeadline(time.Now())
	}
	s.srv.parker.wake(s) // a parked session needs its goroutine to end
	s.wakeLoop()         // as does one on an event loop
}

// halfClose sends FIN (no more data from poolerd) and leaves the read side
// open; a connection that cannot half-close is closed.
func halfClose(nc net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := nc.(closeWriter); !ok || cw.CloseWrite() != nil {
		_ = nc.Close()
	}
}

// terminate ends the session from another goroutine (shutdown, server
// loss): the client gets werr and its connection is closed, which makes run
// return and clean up.
func (s *session) terminate(err error) {
	if s.closed.Load() {
		return
	}
	s.withdrawWait(errTerminated) // a queued request must not run later
	s.fail(err)
}

// withdrawWait withdraws the session's checkout in progress, if any.
func (s *session) withdrawWait(cause error) {
	if f := s.waitCancel.Load(); f != nil {
		(*f)(cause)
	}
}

// releaseClientSlot gives back the session's place under the client
// connection limits.
func (s *session) releaseClientSlot() {
	if s.admitted.CompareAndSwap(true, false) {
		s.srv.releaseClient(s.database, s.user)
	}
}

// sessionRates returns the rate-limit rules of the session.
func (s *session) sessionRates() []sessionRate {
	if r := s.rates.Load(); r != nil {
		return *r
	}
	return nil
}

// setDropReason records why the session's server connection will be closed.
func (s *session) setDropReason(reason string) { s.dropReason.Store(&reason) }

// serverLost is called when the held server connection failed. The session
// is severed before anything else, so that a request the client goroutine
// is handling right now cannot take another server (see attach), and ends:
// the client gets 08006, unless it already has the server's own FATAL, in
// which case the connection is only closed.
func (s *session) serverLost(sc *serverConn, err error) {
	s.serverLostWith(sc, err, errServerLost())
}

// serverLostWith is serverLost with the final message werr (the server's
// own FATAL, when it was held back; see keep.go).
func (s *session) serverLostWith(sc *serverConn, err error, werr *wire.Error) {
	s.severed.Store(true)
	s.server.CompareAndSwap(sc, nil)
	if s.closed.Load() {
		return
	}
	s.log.Warn("server connection lost while in use", zap.Uint64("conn_id", sc.ID()), zap.Error(err))
	// The client's session state on the server is gone, as after a backend
	// crash: end the client connection the way PostgreSQL would. Its pin's
	// place goes now, as its connection's has.
	s.unpin()
	s.terminate(werr)
}

// end cleans up after the client has gone: the server connection goes back
// to its pool if it is provably clean (after server_reset_query in session
// mode), and is closed otherwise.
func (s *session) end(err error) {
	s.endOnce.Do(func() {
		s.closed.Store(true)
		s.stopWatch()
		s.finalMu.Lock() // a final message being written goes out first
		linger := s.endErr.Load() != nil && !s.handedOver.Load()
		if !linger {
			_ = s.conn.Close()
		}
		s.finalMu.Unlock()
		if linger {
			// The client was sent a final message: let it read that
			// rather than a reset (finishLocked).
			s.srv.closeLingering(s.conn)
		}
		s.srv.forget(s)
		s.releaseClientSlot()
		if s.dbp != nil {
			s.dbp.clients.Add(-1)
			defer s.dbp.closeIfUnused() // after releasing the server below
		}
		if sc := s.server.Load(); sc != nil {
			s.releaseAtEnd(sc)
		}
		s.unpin() // pinned without a connection (lost)
		if s.tracked {
			s.forgetStatements()
		}
		s.logDisconnect(s.endErr.Load(), err)
	})
}

// logDisconnect logs the client's disconnection once (log_disconnections):
// with the final message werr poolerd sent, or the error err that ended
// the connection.
func (s *session) logDisconnect(werr *wire.Error, err error) {
	if !s.srv.cfg().LogDisconnections || s.endLogged.Swap(true) {
		return
	}
	fields := []zap.Field{zap.Duration("duration", time.Since(s.connectedAt).Round(time.Millisecond))}
	if werr != nil {
		fields = append(fields, zap.String("reason", werr.Message), zap.String("sqlstate", werr.Code))
		if werr.Detail != "" {
			fields = append(fields, zap.String("detail", werr.Detail))
		}
	} else if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
		fields = append(fields, zap.Error(err))
	}
	s.log.Info("client disconnected", fields...)
}

func (s *session) releaseAtEnd(sc *serverConn) {
	sc.mu.Lock()
	if sc.owner.Load() != s || !sc.awaitOwnLocked(s) {
		sc.mu.Unlock()
		return
	}
	// A frame the client was still sending (held, see flush) was never
	// forwarded: it leaves nothing on the server. One that was streamed
	// (clientMid) does, and keeps the connection from being clean.
	sc.busy = false
	clean := sc.cleanLocked()
	busy := sc.pending > 0
	if busy {
		// The rest of the answer has nobody to go to: the reader drops it
		// until the connection is closed below.
		sc.draining.Store(true)
	}
	sc.detachLocked(s)
	sc.mu.Unlock()
	// The pin's place under max_pinned_clients goes before the connection:
	// a client waiting for it may pin as soon as it has it.
	pinned := s.pinned()
	s.unpin()
	if !clean {
		reason := evictClientLeftDirty
		if busy {
			reason = evictClientLeftBusy
			// Stop the running query so its locks go at once; closing
			// the socket alone is noticed only when the query ends. The
			// connection stays open until the cancel request has been
			// delivered: closed first, the backend may exit before the
			// cancel arrives, and PostgreSQL logs it as unmatched.
			s.srv.cancelBackend(sc)
		}
		if r := s.dropReason.Load(); r != nil {
			reason = *r
		}
		s.dbp.pool.Discard(sc, reason)
		return
	}
	// A session-mode client's connection gets server_reset_query; a pinned
	// transaction-mode client's, DISCARD ALL; one whose settings changed
	// since their last snapshot, RESET ALL.
	var q string
	switch {
	case s.mode == config.PoolSession:
		q = s.dbp.route().Settings.ServerResetQuery
	case pinned:
		q = "DISCARD ALL"
	case s.settingsDirty():
		q = "RESET ALL"
	case s.tracked && sc.stmtEpoch != s.dbp.stmtEpoch.Load():
		q = "DEALLOCATE ALL" // statements a schema change may have made stale
	}
	if q != "" {
		epoch := s.dbp.stmtEpoch.Load()
		ctx, cancel := context.WithTimeout(s.srv.ctx, resetTimeout)
		err := sc.exec(ctx, q)
		cancel()
		if err != nil {
			s.log.Warn("resetting the server connection failed; closing it",
				zap.String("query", q), zap.Uint64("conn_id", sc.ID()), zap.Error(err))
			s.dbp.pool.Discard(sc, evictResetFailed)
			return
		}
		// DISCARD ALL / RESET ALL return every parameter to the
		// server's defaults; DISCARD ALL and DEALLOCATE ALL drop every
		// prepared statement.
		sc.mu.Lock()
		eff := sqlscan.Scan(q)
		if eff.Settings {
			clear(sc.applied)
			sc.paramGen++
		}
		if eff.DeallocateAll {
			sc.stmts.Clear()
			sc.stmtEpoch = epoch
		}
		if eff.Unpin && eff.Pin == "" {
			sc.roleBy = 0 // DISCARD ALL: SET SESSION AUTHORIZATION DEFAULT, RESET ALL
		}
		sc.mu.Unlock()
	}
	if s.stateful {
		// verify_handoff (handoff.go): checked before anyone else gets it.
		sc.mu.Lock()
		due := sc.handoffDueLocked()
		sc.mu.Unlock()
		if due {
			ctx, cancel := context.WithTimeout(s.srv.ctx, resetTimeout)
			clean := sc.verifyHandoff(ctx, s)
			cancel()
			if !clean {
				s.dbp.pool.Discard(sc, evictHandoffDirty)
				return
			}
		}
	}
	s.dbp.checkin(sc)
	if h := s.srv.onReleased; h != nil {
		h(s)
	}
}

// cancel forwards a cancel request to the backend this session holds, if it
// is running something; the connection is not released until the request has
// been delivered, so the signal cannot reach another client's query.
func (s *session) cancel() {
	sc := s.server.Load()
	if sc == nil {
		if f := s.waitCancel.Load(); f != nil {
			(*f)(errClientCancel)
		}
		return
	}
	sc.mu.Lock()
	if sc.owner.Load() != s || sc.pending == 0 || sc.cancelling {
		sc.mu.Unlock()
		return
	}
	sc.cancelling = true
	sc.mu.Unlock()
	s.srv.cancelBackend(sc)
	sc.mu.Lock()
	sc.cancelling = false
	sc.mu.Unlock()
	// The reader may have skipped a release while the cancel was in flight.
	sc.settle()
}

// cancelBackend sends a CancelRequest for sc's backend and waits for it to
// be delivered (bounded).
func (srv *Server) cancelBackend(sc *serverConn) {
	// Not derived from srv.ctx: at the shutdown deadline, when srv.ctx is
	// cancelled, running queries must still be cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	if err := backend.Cancel(ctx, sc.Target, sc.PID, sc.Key); err != nil {
		srv.log.Warn("cancel request to server failed", zap.Uint64("conn_id", sc.ID()), zap.Error(err))
	}
}

func quoteByte(b byte) string {
	if b >= 0x20 && b < 0x7f {
		return "'" + string(rune(b)) + "'"
	}
	return "0x" + string("0123456789abcdef"[b>>4]) + string("0123456789abcdef"[b&15])
}
