package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// serverReadSize is the read buffer of a server connection. Server
// connections are few, so each keeps its buffer for life.
const serverReadSize = 32 << 10

// maxCapture bounds how much of an inspected server frame is kept.
const maxCapture = 4096

// serverConn is one pooled connection to PostgreSQL. A single reader
// goroutine (readLoop) reads everything the server sends, for the whole life
// of the connection, and relays it to whoever holds the connection: a client
// session, or poolerd itself while it runs a query of its own. Because the
// reader is always waiting, a server that closes an idle connection (a
// restart, pg_terminate_backend) is noticed and dropped at once, not handed
// to the next client.
//
// Protocol state lives here, not in the session: how many ReadyForQuery the
// server still owes (pending), whether extended-protocol messages were sent
// without a Sync (unsynced), the last transaction status, and how many of
// the next responses answer poolerd's own queries (swallow). The connection
// may go back to its pool only when pending is zero, nothing is unsynced,
// the status is idle and no frame is half read.
type serverConn struct {
	pool.Entry
	*backend.Conn
	dbp    *dbPool
	log    *zap.Logger
	host   config.HostPort // the server it is connected to
	hostSt *hostState      // host's figures (checkouts), set at adoption

	// Reader goroutine only.
	cur     wire.Cursor
	carry   [wire.HeaderLen]byte
	ncarry  int
	drop    bool // the current frame is swallowed
	readBuf []byte
	// io reads and writes the connection with raw system calls; nil if the
	// connection has no file descriptor (then Conn is used).
	io *wire.ConnReader

	// zRecv counts the ReadyForQuery received (reader only); the responses
	// to the messages that produce one (Query, FunctionCall, Sync) form
	// numbered groups, and group zRecv is the one arriving now.
	zRecv int64
	// nextSwallow is the number of the next group that answers poolerd's own
	// request (a parameter sync, a settings snapshot), which the reader
	// swallows, or -1. The full list is swallowQ, under mu.
	nextSwallow atomic.Int64
	// snapZ is the group of a settings snapshot whose rows the reader keeps
	// (-1: none); snapRows are those rows (reader only).
	snapZ    atomic.Int64
	snapRows map[string]string
	snapGen  uint64 // the owner's dirtyGen when the snapshot was sent (mu)
	// checkZ is the group of a pin check (see txstate.PinCheckSQL) whose row the
	// reader keeps in checkRow (-1: none); checkGen is the owner's pinGen
	// when it was sent (mu).
	checkZ   atomic.Int64
	checkRow []byte
	checkGen uint64
	// verifyZ is the group of a hand-off check (handoff.go) whose row the
	// reader keeps in verifyRow (verifyGot: complete; -1: none);
	// verifiedZ is the group of the last check that came back clean, -1
	// if none (mu); verifyBy and verifyTracked describe the client that
	// left the connection (mu).
	verifyZ       atomic.Int64
	verifyRow     []byte
	verifyGot     bool
	verifiedZ     int64
	verifyBy      handoffClient
	verifyTracked bool
	// checking: nobody holds the connection while a hand-off check runs;
	// its answer gives it back to the pool or closes it (mu).
	checking bool
	// nops and nqundo are the lengths of stq and qundo, for the reader's
	// lock-free checks.
	nops, nqundo atomic.Int32
	// dupClient/dupServer: the ErrorResponse being read may be the server's
	// answer to a client's duplicate Parse (reader only).
	dupClient, dupServer string
	// owner is the session holding the connection; nil while idle or while
	// poolerd runs its own query. Changed only under mu.
	owner atomic.Pointer[session]
	// tempSchema: a statement that creates a temporary object was sent on
	// it, so its backend has a temporary schema for good (DISCARD ALL drops
	// the objects, not the schema). PostgreSQL re-plans a prepared
	// statement when a backend's first temporary schema appears (a new
	// temp table then shadows the name the plan resolved), but not in a
	// backend that already has one: such a connection would give a later
	// client's shared statements another meaning than a fresh backend
	// does, so it is closed instead of going back to the pool (checkin).
	tempSchema atomic.Bool
	// copyIn is set when the server entered COPY FROM STDIN (the reader saw
	// CopyInResponse) and cleared at ReadyForQuery or the client's CopyDone.
	copyIn atomic.Bool
	// lastRecv is when the reader last got bytes (server_response_timeout).
	lastRecv atomic.Int64
	// timeoutCancel: poolerd cancelled the running query for query_timeout
	// or lease_timeout (the timeoutKind plus one; 0: none); the server's
	// 57014 reply is rewritten to say so.
	timeoutCancel atomic.Int32
	// draining: the owner left mid-request and the connection is about to
	// be closed once the cancel request for its query has been delivered;
	// what the server still sends is dropped, not taken for a protocol
	// surprise (which would close the backend before the cancel reaches it).
	draining  atomic.Bool
	replacing bool // reader only: the current ErrorResponse is being rewritten
	// lostErr is the server's FATAL, held back from an owner that may keep
	// its session when the connection ends (reader only; keep.go).
	lostErr *wire.Error
	// Retrying a request whose statement, answered from the cache, was
	// stale (retry.go), reader only: hitDef is the definition of the last
	// cache hit answered, afterHit says the frame being read comes right
	// after its scratch Close, retryHit that the ErrorResponse being read
	// does (and undid nothing), retry that it was held, as retryErr, for a
	// retry at the ReadyForQuery.
	// heldT is a ParameterDescription held after the scratch Close
	// (holdingT while it is read).
	hitDef                         *stmtDef
	afterHit, retryHit, groupFirst bool
	retry                          bool
	retryErr                       []byte
	heldT                          []byte
	holdingT                       bool
	// hung is server_response_timeout when the owner's watchdog closed the
	// connection as hung (closeHung); 0 otherwise.
	hung atomic.Int64

	mu       sync.Mutex
	pending  int   // ReadyForQuery owed
	zSent    int64 // messages producing a ReadyForQuery sent so far
	swallowQ []int64
	stq      stmtQueue           // Parse and Close in flight (prepared.go)
	qundo    []qUndo             // DEALLOCATE and DISCARD ALL in flight
	stmts    txstate.ServerStmts // statements prepared on the connection
	// stmtEpoch is the pool's stmtEpoch its statements are known to be
	// valid at; behind the pool's, they are dropped (DEALLOCATE ALL) at
	// the next clean point.
	stmtEpoch uint64
	// unnamedBy and unnamedGen say whose unnamed statement the server has
	// (a session and its count of unnamed Parses); nil when unknown.
	unnamedBy  *session
	unnamedGen uint64
	unsynced   bool // extended-protocol messages sent since the last Sync
	// runZ, commitZ and openZ: the response groups before them may have
	// run, or committed, a statement, or opened a transaction block; failZ
	// is the group of a failBlockSQL (-1: none). See keep.go.
	runZ, commitZ, failZ int64
	openZ                int64
	txStatus             byte // from the last ReadyForQuery
	// replay is what the client sent after a cache hit's scratch Close,
	// up to and including the Sync of response group replayZ, for a retry
	// with replayDef prepared again (retry.go).
	// replayOpen: the request did not end with a Sync yet.
	replay     []byte
	replayZ    int64
	replayDef  *stmtDef
	replayOpen bool
	// replayStart: the replay is a whole request, from its first message
	// (replayStartZ, also read by the reader without mu; -1: none).
	replayStart  bool
	replayStartZ atomic.Int64
	cancelling   bool // a cancel request for this backend is in flight
	busy         bool // the owner is assembling a batch for this server
	midFrame     bool // the reader stopped inside a frame (set at each settle)
	// clientMid: the owner forwarded the start of a client frame whose
	// rest has not arrived (a streamed frame, not a held one; set at each
	// flush). The server would read whatever comes next as its rest.
	clientMid bool

	// Timestamps for the owner's watchdog (server nanotime; 0 = unset),
	// kept only when the owner has a limit: busySince is when the server
	// left the clean idle state for its owner, queryStart when the request
	// now running was sent (or the previous one answered), idleTxSince when
	// the server became idle inside a transaction.
	busySince, queryStart, idleTxSince int64
	// costRows and costBytes are what the owner's transaction has cost so
	// far (rows and bytes forwarded; added by the reader goroutine, reset
	// by attach: atomics, as a next owner may attach while the reader
	// still finishes the last read), and spent what the last one cost in
	// all, server time included, set when it ended for the owner's
	// measured rate limits (settleRead).
	costRows, costBytes atomic.Int64
	spent               requestCost
	// leaseStart is when the owner's checkout for its lease began waiting
	// (lease_timeout; 0 where no wait began it: session mode, a pinned
	// client's next transaction). Cleared with busySince.
	leaseStart int64
	quiet      chan struct{}
	opErr      error // first error in a swallowed response
	broken     bool  // closed, or must be closed instead of reused

	// params are the server's current reported parameters and applied the
	// unreported ones poolerd set; touched by whoever holds the connection
	// (the reader while relaying, the holder between requests).
	params  map[string]string
	applied map[string]string
	// normApplied are the values of applied a settings snapshot read or a
	// parameter sync's set_config answered, in the server's own spelling
	// (the hand-off check compares only those).
	normApplied map[string]string
	// paramGen counts changes of params and applied; syncedKey is the
	// parameter key (session.pkey) of the last client found in line with
	// them, at paramGen syncedGen: a client with the same key needs no
	// comparison at checkout.
	paramGen, syncedGen uint64
	syncedKey           string

	// Roles (see roleCheck in sessionstate.go). loginAuth and loginSuper
	// are session_authorization and is_superuser as the server reported
	// them at login. roleBy is the id of the session that last called a
	// function on the connection (which may have set the role) since it
	// was last known to run as the login role (0: none, as after login,
	// RESET ROLE or DISCARD ALL); any other session gets RESET ROLE ahead
	// of its first request (mu). resetZ is the response group of that
	// RESET ROLE, -1 when none is in flight (mu). authOff: the server
	// reported a session_authorization other than the login's; the
	// connection is not handed to anyone (reader writes).
	loginAuth, loginSuper string
	roleBy                uint64
	resetZ                int64
	authOff               atomic.Bool

	// The parameter sync (params.go). syncNames: the parameter each
	// statement of the sync being assembled sets (owner, at attach);
	// syncQ: the response groups of those sent, whose set_config answer
	// the reader keeps as the applied value (mu). mayFailQ: swallowed
	// groups whose failure leaves nothing behind (a DEALLOCATE's Parse
	// first); any other swallowed group that fails closes the connection
	// (mu).
	syncNames []string
	syncQ     []syncValue
	mayFailQ  []int64

	closeOnce sync.Once

	// Set when the event loops read the connection (startReading): item
	// is its place in a loop, changed by the holder when it moves the
	// connection to its own loop (nearLoop); yieldFn is yieldLoop, set
	// once. closing is set by Close before it shuts the socket down.
	item    atomic.Pointer[reactor.Item]
	yieldFn func()
	closing atomic.Bool
	// paused: the connection's reads are held until the holder's client
	// takes its kept output (pauseFeed); heldClient is the holder's
	// client item whose reads are held until the connection takes what
	// writeOrKeep kept for it.
	paused     atomic.Bool
	heldClient atomic.Pointer[reactor.Item]

	// closeWhy is the pool's reason for closing the connection (its Closed
	// hook), for the log line Close writes.
	closeWhy atomic.Pointer[string]
}

// logOpened logs the connection's opening (at info with log_connections,
// as PgBouncer's "new connection to server"), once it is in its pool.
func (sc *serverConn) logOpened() {
	lvl := zapcore.DebugLevel
	if sc.dbp.srv.cfg().LogConnections {
		lvl = zapcore.InfoLevel
	}
	if ce := sc.log.Check(lvl, "server connection opened"); ce != nil {
		local := "unix"
		if a, ok := sc.Conn.Conn.LocalAddr().(*net.TCPAddr); ok {
			local = a.String()
		}
		ce.Write(zap.Uint64("conn_id", sc.ID()), zap.String("host", sc.host.String()), zap.String("local", local), zap.Uint32("backend_pid", sc.PID))
	}
}

// logClosed logs the connection's end with log_disconnections: the pool's
// reason (an eviction's or a recycle's; none for KILL, a shutdown or a
// connection that never joined a pool) and its age.
func (sc *serverConn) logClosed() {
	if !sc.dbp.srv.cfg().LogDisconnections || sc.ID() == 0 {
		return
	}
	why := ""
	if p := sc.closeWhy.Load(); p != nil {
		why = *p
	}
	sc.log.Info("server connection closed", zap.Uint64("conn_id", sc.ID()), zap.String("host", sc.host.String()),
		zap.String("reason", why), zap.Duration("age", time.Since(sc.Created()).Round(time.Millisecond)))
}

// PoolEntry implements pool.Conn.
func (sc *serverConn) PoolEntry() *pool.Entry { return &sc.Entry }

// Close implements pool.Conn.
func (sc *serverConn) Close() error {
	var err error
	sc.closeOnce.Do(func() {
		sc.mu.Lock()
		sc.broken = true
		sc.mu.Unlock()
		if sc.host.Host != "" {
			sc.dbp.hosts.closed(sc.host)
			if sc.dbp.route().HostCapped() {
				sc.dbp.pool.Nudge() // a server has room again (see Admit)
			}
		}
		// Terminate lets the backend exit (rolling back) at once instead of
		// waiting to notice the closed socket. The deadline also wakes the
		// reader goroutine, which then finds the connection gone.
		_ = sc.Conn.Conn.SetDeadline(time.Now().Add(finalWriteTimeout))
		_, _ = sc.Conn.Write(wire.AppendTerminate(nil))
		if sc.io != nil && sc.io.Raw() && sc.dbp.srv.engine.Enabled() {
			// A loop reads through its own descriptor, which keeps the
			// socket open: shutting it down ends the stream there, and
			// closing tells the loop to stop reading (a server still
			// sending would otherwise be drained, not reset). Both before
			// the item is looked at: startReading may be duplicating the
			// descriptor right now, and a duplicate of a shut-down socket
			// is found ended by its loop at once.
			sc.closing.Store(true)
			reactor.ShutdownSocket(sc.io.Control)
			sc.resumeFeed()    // a held read finds the end
			sc.releaseClient() // what it kept goes nowhere now
		}
		err = sc.Conn.Close()
		sc.logClosed()
	})
	return err
}

func newServerConn(dbp *dbPool, c *backend.Conn) *serverConn {
	sc := &serverConn{
		Conn:     c,
		dbp:      dbp,
		log:      dbp.log,
		txStatus: wire.TxIdle,
		readBuf:  make([]byte, wire.Headroom+serverReadSize),
		// A new connection has no statement prepared: none is stale.
		stmtEpoch:   dbp.stmtEpoch.Load(),
		params:      make(map[string]string, len(c.Params)),
		applied:     map[string]string{},
		normApplied: map[string]string{},
		resetZ:      -1,
		failZ:       -1,
		verifiedZ:   -1,
		// Immutable after login.
		loginAuth:  c.Params["session_authorization"],
		loginSuper: c.Params["is_superuser"],
	}
	sc.nextSwallow.Store(-1)
	sc.snapZ.Store(-1)
	sc.checkZ.Store(-1)
	sc.verifyZ.Store(-1)
	sc.replayStartZ.Store(-1)
	if rio, err := wire.NewConnReader(c.Conn, nil); err == nil {
		sc.io = rio
	}
	for k, v := range c.Params {
		sc.params[k] = v
	}
	return sc
}

// startReading makes the event loops read sc, or gives it a reader goroutine
// of its own (TLS, or no loops).
func (sc *serverConn) startReading() {
	if sc.io != nil && sc.io.Raw() {
		sc.yieldFn = sc.yieldLoop
		if sc.dbp.srv.engine.Add(sc.io.Control, sc, false, sc.item.Store) {
			sc.Entry.SetShare(sc.item.Load().Share())
			return
		}
		sc.yieldFn = nil
	}
	go sc.readLoop()
}

// yieldLoop is called by the connection's handler before it waits (a
// client that does not read): its loop goes on without it.
func (sc *serverConn) yieldLoop() { sc.item.Load().Yield() }

// nearLoop moves the connection, just checked out, to the event loop of its
// new holder's handler (it, nil when the holder is not on a loop), so that
// one loop reads both the client and the server of a transaction, and
// marks it as that loop's in the pool (pool.TryGetNear). false: the
// connection could be put in no loop (shutdown) and is broken.
func (sc *serverConn) nearLoop(it *reactor.Item) bool {
	cur := sc.item.Load()
	if it == nil || cur == nil || !cur.MoveNear(it, sc.item.Store) {
		return true
	}
	moved := sc.item.Load()
	if moved == nil {
		sc.mu.Lock()
		sc.broken = true
		sc.mu.Unlock()
		return false
	}
	sc.Entry.SetShare(moved.Share())
	return true
}

// LoopStale: a server connection ends through its stream (Close shuts it
// down), never by a wake-up.
func (sc *serverConn) LoopStale() bool { return false }

func (sc *serverConn) LoopEnd() {}

// LoopDetach: a server connection whose handler waited (for a client that
// did not read) goes back in its loop.
func (sc *serverConn) LoopDetach() bool { return false }

// LoopReady is the event loop's readLoop: one read, handled (loops_linux.go).
// LoopResume: a server connection never waits on its loop (it never
// suspends); if it were taken up, it would read as LoopReady does.
func (sc *serverConn) LoopResume(it *reactor.Item) bool { return sc.LoopReady(it) }

func (sc *serverConn) LoopReady(it *reactor.Item) bool {
	if sc.closing.Load() {
		// Closed by poolerd: what the server still sends is not read.
		// Closing the loop's descriptor (on return) resets the socket, so
		// a backend blocked sending a large result ends at once.
		it.Yield()
		sc.gone(net.ErrClosed)
		return false
	}
	// Called while its reads were held: for its output, or for a
	// hang-up or error (or a stale event), which the read finds.
	out, held := it.WantsWrite(), it.HoldsReads()
	if out {
		sc.sendKept(it)
	}
	if own := sc.owner.Load(); (out || !held) && own != nil && sc.pauseFeed(it, own) {
		return true // resumeFeed lets it read again
	}
	buf := sc.readBuf
	n, err := it.Read(buf[wire.Headroom:])
	if n > 0 {
		if herr := sc.handle(buf, wire.Headroom, wire.Headroom+n); herr != nil {
			err = herr
		} else if err == nil {
			return true
		}
	}
	if err == nil {
		return true // nothing to read after all
	}
	// gone may write to a client: not on the loop's goroutine.
	it.Yield()
	sc.gone(err)
	return false
}

// pauseFeed stops reading the server while its holder's client, on its
// loop, has output kept for it (session.keepOnLoop): what the server
// sends next stays in the socket until the client has read the rest, so a
// client that does not read holds one read's worth of memory, and the
// server then blocks in its send (PgBouncer's backpressure). It reports
// whether the reads are held (Item.HoldReads); resumeFeed lets them go on
// (the client took its output, or the connection closes).
func (sc *serverConn) pauseFeed(it *reactor.Item, own *session) bool {
	if !own.keptOut() {
		return false
	}
	it.HoldReads(true)
	sc.paused.Store(true)
	if own.keptOut() && !sc.closing.Load() {
		return true
	}
	sc.resumeFeed() // taken meanwhile (a resumeFeed before paused was set found nothing)
	return false
}

// resumeFeed ends a pauseFeed (any goroutine).
func (sc *serverConn) resumeFeed() {
	if sc.paused.CompareAndSwap(true, false) {
		sc.item.Load().HoldReads(false)
	}
}

// writeOrKeep writes a then b to the server from its holder's loop (on,
// the holder's client item) without waiting: what the socket does not
// take now is kept for the server's loop to send when it can (sendKept),
// and the client is not read meanwhile (on holds its reads), so a server
// that does not read holds at most one read of its client. It returns
// false, having written nothing, if it cannot (the connection is not on a
// loop, or another write is under way): the caller then writes and waits.
func (sc *serverConn) writeOrKeep(on *reactor.Item, a, b []byte) (bool, error) {
	it := sc.item.Load()
	if it == nil || sc.io == nil || !sc.io.Raw() {
		return false, nil
	}
	kept, ok, err := sc.io.WriteOrKeep(a, b)
	if !ok || err != nil || kept == 0 {
		return ok, err
	}
	it.WantWrite(true)
	// Held before it is recorded: whoever takes the record lets it go
	// after this hold (sendKept, write2, Close).
	on.HoldReads(true)
	sc.heldClient.Store(on)
	if sc.io.Kept() == 0 || sc.closing.Load() {
		sc.releaseClient() // sent meanwhile, or closed
	}
	return true, nil
}

// sendKept sends, on the server's loop (it), what writeOrKeep kept, as
// much as the server takes now; once all of it is sent (or the connection
// failed: its read finds why) the holder's client is read again.
func (sc *serverConn) sendKept(it *reactor.Item) {
	if left, err := sc.io.Flush(); left > 0 && err == nil {
		return
	}
	it.WantWrite(false)
	sc.releaseClient()
}

// releaseClient lets a client that writeOrKeep held be read again (any
// goroutine).
func (sc *serverConn) releaseClient() {
	if ci := sc.heldClient.Swap(nil); ci != nil {
		ci.HoldReads(false)
	}
}

// readLoop relays what the server sends until the connection ends.
func (sc *serverConn) readLoop() {
	buf := sc.readBuf
	for {
		n, err := sc.read(buf[wire.Headroom:])
		if n > 0 {
			if herr := sc.handle(buf, wire.Headroom, wire.Headroom+n); herr != nil {
				sc.gone(herr)
				return
			}
		}
		if err != nil {
			sc.gone(err)
			return
		}
	}
}

func (sc *serverConn) read(p []byte) (int, error) {
	if sc.io != nil {
		return sc.io.ReadInto(p)
	}
	return sc.Conn.Read(p)
}

// write2 writes a then b (either may be empty) to the server, in one system
// call when the socket takes both. Only the connection's holder writes.
// beforeWait (if not nil) is called before the write waits for the server
// to read (an event loop goes on without the writer).
func (sc *serverConn) write2(a, b []byte, beforeWait func()) error {
	if sc.io != nil {
		kept := sc.io.Kept() > 0
		err := sc.io.Write2Then(a, b, beforeWait) // after what was kept
		if kept {
			sc.item.Load().WantWrite(false)
			sc.releaseClient()
		}
		return err
	}
	if beforeWait != nil {
		beforeWait() // TLS may wait
	}
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			if _, err := sc.Conn.Write(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// handle processes one read: it scans frames, drops those that answer
// poolerd's own queries, forwards the rest to the owner in one write, and
// then settles the protocol state.
func (sc *serverConn) handle(buf []byte, start, end int) error {
	if sc.ncarry > 0 {
		start -= sc.ncarry
		copy(buf[start:], sc.carry[:sc.ncarry])
		sc.ncarry = 0
	}
	own := sc.owner.Load()
	var now int64
	if own != nil {
		now = own.srv.nanotime()
		sc.lastRecv.Store(now)
	}
	out, off := start, start
	rfqs, answered := 0, 0 // all ReadyForQuery; those of the client's own requests
	var status byte
	for off < end || sc.cur.Ending() {
		n, ev, err := sc.cur.Next(buf[off:end])
		if err != nil {
			return fmt.Errorf("server protocol error: %w", err)
		}
		switch ev {
		case wire.EvPartial:
			sc.ncarry = copy(sc.carry[:], buf[off:end])
			end = off
			continue
		case wire.EvHeader:
			sc.drop = sc.nextSwallow.Load() == sc.zRecv
			// The frame follows a cache hit's scratch Close, or starts a
			// request kept for a retry (retry.go).
			hit := sc.afterHit || sc.groupFirst && sc.replayStartZ.Load() == sc.zRecv
			sc.afterHit, sc.groupFirst = false, false
			switch {
			case hit && sc.cur.Type == 't' && !sc.drop && sc.cur.Len <= maxCapture:
				// Held until the next answer shows whether the request
				// is retried (retry.go).
				sc.cur.Capture(maxCapture)
				sc.holdingT, sc.afterHit = true, true
			case sc.heldT != nil && sc.cur.Type != 'E':
				if out > start {
					own.writeFromServer(sc, buf[start:out])
				}
				own.writeFromServer(sc, sc.heldT)
				sc.heldT = nil
				start, out = off, off
			}
			switch sc.cur.Type {
			case 'Z', 'S':
				sc.cur.Capture(maxCapture)
				if sc.retry && sc.cur.Type == 'Z' {
					sc.drop = true // answered by the retry (retry.go)
				}
			case 'C':
				if !sc.drop && sc.nqundo.Load() > 0 {
					sc.cur.Capture(64)
				}
			case '1', '3':
				if !sc.drop && sc.nops.Load() > 0 && sc.stmtAnswered(sc.cur.Type) {
					sc.drop = true
				}
			case 'D':
				if !sc.drop {
					sc.costRows.Add(1)
				}
				if sc.drop && (sc.snapZ.Load() == sc.zRecv || sc.checkZ.Load() == sc.zRecv || sc.syncAt(sc.zRecv)) {
					sc.cur.Capture(maxCapture)
				} else if sc.drop && sc.verifyZ.Load() == sc.zRecv {
					sc.cur.Capture(maxHandoffRow)
				}
			case 'E':
				sc.cur.Capture(maxCapture)
				undone := 0
				if !sc.drop && sc.nops.Load() > 0 {
					sc.dupClient, sc.dupServer, undone = sc.stmtFailed()
				}
				sc.retryHit = hit && undone == 0 && !sc.drop && own != nil
				if !sc.drop && sc.nqundo.Load() > 0 {
					sc.qFailed()
				}
				// The reply to a query_timeout cancel, or to a duplicate
				// Parse, is held back and rewritten at its end.
				sc.replacing = !sc.drop && own != nil && (sc.timeoutCancel.Load() != 0 || sc.dupClient != "" || own.tracked || own.mayKeep())
			case 'G':
				sc.copyIn.Store(true)
			}
		case wire.EvEnd:
			switch sc.cur.Type {
			case 't':
				if sc.holdingT {
					sc.holdingT = false
					sc.holdDescription()
				}
			case 'Z':
				body := sc.cur.Body()
				if len(body) != 1 {
					return errors.New("server sent a malformed ReadyForQuery")
				}
				status = body[0]
				rfqs++
				sc.copyIn.Store(false)
				if sc.retry {
					// The failed request's end: send it again, or give the
					// client the error held for it (retry.go).
					sc.retry = false
					if out > start {
						own.writeFromServer(sc, buf[start:out])
					}
					start, out = off, off
					if !sc.resend(own, status) {
						own.writeFromServer(sc, wire.AppendReadyForQuery(sc.retryErr, status))
						answered++
					}
					sc.retryErr = nil
				} else if sc.drop {
					sc.swallowed(own, status)
				} else {
					answered++
				}
				if sc.nops.Load() > 0 {
					sc.stmtGroupEnded()
				}
				if sc.nqundo.Load() > 0 {
					sc.qDone()
				}
				sc.zRecv++
				sc.groupFirst = true
			case 'D':
				switch {
				case !sc.drop:
				case sc.snapZ.Load() == sc.zRecv:
					sc.snapRow(sc.cur.Body())
				case sc.checkZ.Load() == sc.zRecv:
					sc.checkRow = append(sc.checkRow[:0], sc.cur.Body()...)
				case sc.syncAt(sc.zRecv):
					sc.syncRow(sc.cur.Body())
				case sc.verifyZ.Load() == sc.zRecv:
					sc.handoffRow(sc.cur.Body(), sc.cur.Truncated())
				}
			case 'C':
				if !sc.drop && sc.nqundo.Load() > 0 {
					if tag, _, ok := cstring(sc.cur.Body()); ok {
						sc.qCommitted(tag)
					}
				}
			case 'S':
				if name, value, ok := wire.ParseParameterStatus(sc.cur.Body()); ok {
					sc.params[name] = value
					sc.paramGen++
					if name == "session_authorization" {
						sc.authOff.Store(value != sc.loginAuth)
					}
					if own != nil && !sc.drop {
						own.noteParameter(name, value)
						if name == "session_authorization" && value != sc.loginAuth ||
							name == "is_superuser" && value != sc.loginSuper {
							own.roleChanged() // by code the scanner cannot see
						}
					}
				}
			case 'E':
				sev, code, msg := wire.ErrorFields(sc.cur.Body())
				if sc.replacing && sc.retryHit && sc.holdForRetry(own, code, msg) {
					// The first answer to a statement answered from the
					// cache says it is stale: the request is sent again
					// (retry.go); what was held for it is dropped.
					sc.replacing = false
					sc.heldT = nil
					if out > start {
						own.writeFromServer(sc, buf[start:out])
					}
					start, out = off, off
					break
				}
				if sc.heldT != nil {
					if out > start {
						own.writeFromServer(sc, buf[start:out])
					}
					own.writeFromServer(sc, sc.heldT)
					sc.heldT = nil
					start, out = off, off
				}
				if sc.replacing && (sev == "FATAL" || sev == "PANIC") && own.mayKeep() {
					// Held back: the client may keep its session when the
					// connection ends (keep.go), and gets an ERROR then.
					sc.replacing = false
					if out > start {
						own.writeFromServer(sc, buf[start:out])
					}
					start, out = off, off
					sc.lostErr = &wire.Error{Severity: sev, Code: code, Message: msg}
					sc.dbp.ctr.countError(code)
					sc.markBroken()
					break
				}
				if sc.replacing {
					sc.replacing = false
					if out > start {
						own.writeFromServer(sc, buf[start:out])
					}
					switch {
					case sc.dupClient != "" && txstate.IsDuplicateOf(code, msg, sc.dupServer):
						own.writeFromServer(sc, txstate.DuplicateError(sev, sc.dupClient))
					case code == "26000" && own.tracked:
						own.writeFromServer(sc, sc.unknownStatementReply(own, sev, code, msg))
					default:
						own.writeFromServer(sc, sc.timeoutReply(own, sev, code, msg))
					}
					start, out = off, off
				}
				sc.dupClient, sc.dupServer = "", ""
				if sc.drop {
					sc.mu.Lock()
					if sc.opErr == nil {
						sc.opErr = &backend.ServerError{Severity: sev, Code: code, Message: msg, Body: append([]byte(nil), sc.cur.Body()...)}
					}
					sc.mu.Unlock()
				}
				if !sc.drop && own != nil {
					sc.dbp.ctr.countError(code)
				}
				if staleStatementError(code, msg) {
					sc.dbp.stmtEpoch.Add(1)
				}
				if sev == "FATAL" || sev == "PANIC" {
					sc.markBroken()
					if own != nil && !sc.drop {
						// The client will take its session for over (it
						// may read this only after sending its next
						// request): nothing more of its may run, here or
						// on another connection. Set before the frame is
						// written to the client.
						own.sawFatal.Store(true)
						own.severed.Store(true)
					}
				}
			}
		}
		if ev == wire.EvHeader || ev == wire.EvBody {
			if !sc.drop && !sc.replacing && !sc.holdingT {
				if out != off {
					copy(buf[out:], buf[off:off+n])
				}
				out += n
				sc.costBytes.Add(int64(n))
			}
		}
		off += n
	}
	switch {
	case out == start:
	case own != nil:
		own.writeFromServer(sc, buf[start:out])
		sc.dbp.ctr.sent.Add(uint64(out - start))
	case sc.draining.Load():
		// The rest of the answer to a client that left mid-request,
		// while its cancel request is on the way: dropped.
	default:
		// Nobody asked: an idle connection got data (a FATAL before the
		// server closes it, or a protocol surprise).
		return errors.New("server sent data while idle")
	}
	if rfqs > 0 {
		sc.AddQueries(uint64(rfqs))
	}
	sc.settleRead(rfqs, answered, status, !sc.cur.AtBoundary() || sc.ncarry > 0, now)
	return nil
}

// timeoutReply is what the client gets instead of the server's reply to a
// query_timeout cancel: the same SQLSTATE, naming the limit.
func (sc *serverConn) timeoutReply(own *session, sev, code, msg string) []byte {
	e := &wire.Error{Severity: sev, Code: code, Message: msg}
	if k := sc.timeoutCancel.Load(); code == "57014" && k != 0 {
		kind := timeoutKind(k - 1)
		e.Message = "canceling statement due to " + kind.cause(time.Duration(own.timeouts().of(kind)))
		e.Hint = fmt.Sprintf("raise %s for this database or user, or make the query faster", kind.limitName())
	} else if body := sc.cur.Body(); !sc.cur.Truncated() {
		// Not the cancel's reply after all: pass it on unchanged.
		b := make([]byte, wire.HeaderLen, wire.HeaderLen+len(body))
		b[0] = 'E'
		binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
		return append(b, body...)
	}
	return e.Append(nil)
}

// settleRead records what one read of the reader answered: rfqs
// ReadyForQuery in all, answered of them for the client's own requests; now
// is the session clock when an owner holds the connection, else 0.
func (sc *serverConn) settleRead(rfqs, answered int, status byte, midFrame bool, now int64) {
	sc.mu.Lock()
	sc.midFrame = midFrame
	if rfqs > 0 {
		sc.timeoutCancel.Store(0)
	}
	var idleTx, idle int64
	if now != 0 {
		idleTx, idle = sc.noteTimesLocked(rfqs, answered, status, now)
	}
	own := sc.owner.Load()
	sc.settleLocked(rfqs, status)
	// After unlocking: the watchdog locks sc.mu.
	if own != nil && idleTx != 0 {
		own.noteIdleInTx(idleTx)
	}
	if own != nil && idle != 0 {
		own.chargeCosts(sc.spent) // the transaction is over: what it cost
	}
	if own != nil && idle != 0 && own.timeouts().idleTracked() {
		own.noteActive(idle) // the client is idle from its last answer on
	}
}

// noteTimesLocked keeps the watchdog's timestamps after a read that
// answered rfqs requests. It returns when an idle-in-transaction period
// began (idleTx) or when the server went back to idle outside a
// transaction (idle), if that happened with this read; else zeros.
func (sc *serverConn) noteTimesLocked(rfqs, answered int, status byte, now int64) (idleTx, idle int64) {
	if rfqs == 0 {
		return 0, 0
	}
	m := &sc.dbp.ctr
	if answered > 0 && sc.queryStart != 0 {
		d := uint64(now - sc.queryStart)
		m.queries.Add(uint64(answered))
		m.queryNano.Add(d)
		sc.dbp.met.queryDur.Observe(float64(d) / 1e9)
	}
	pending := sc.pending - rfqs
	switch {
	case pending > 0:
		sc.queryStart = now // the next pipelined request is now running
	case status == wire.TxIdle && !sc.unsynced:
		sc.spent = requestCost{rows: sc.costRows.Swap(0), bytes: sc.costBytes.Swap(0)}
		if sc.busySince != 0 {
			d := uint64(now - sc.busySince)
			m.xacts.Add(1)
			m.xactNanos.Add(d)
			sc.dbp.met.xactDur.Observe(float64(d) / 1e9)
			sc.spent.serverMicros = int64(d / 1000)
		}
		sc.busySince, sc.idleTxSince, sc.queryStart, sc.leaseStart = 0, 0, 0, 0
		return 0, now
	case status != wire.TxIdle && sc.idleTxSince == 0:
		sc.idleTxSince = now
		return now, 0
	}
	return 0, 0
}

// settle re-checks whether the connection can be released (after a cancel
// request that held it completes).
func (sc *serverConn) settle() {
	sc.mu.Lock()
	sc.settleLocked(0, 0)
}

// settleLocked records answered requests and releases the connection when
// it is provably clean and its owner pools by transaction. It unlocks mu.
func (sc *serverConn) settleLocked(rfqs int, status byte) {
	if rfqs > 0 {
		sc.pending -= rfqs
		sc.txStatus = status
		if sc.pending < 0 {
			sc.pending = 0
			sc.broken = true
		}
	}
	if sc.pending == 0 && sc.quiet != nil && len(sc.swallowQ) == 0 {
		close(sc.quiet)
		sc.quiet = nil
	}
	own := sc.owner.Load()
	if own == nil && sc.checking && sc.pending == 0 && len(sc.swallowQ) == 0 {
		sc.checkedLocked() // unlocks mu
		return
	}
	release := own != nil && sc.cleanLocked() && own.releaseWhenIdle()
	// A connection that must be closed is dropped as soon as it is idle
	// between transactions; the client gets another one next time.
	drop := own != nil && sc.broken && own.releaseWhenIdle() && sc.idleBrokenLocked()
	if drop {
		sc.detachLocked(own)
		sc.mu.Unlock()
		sc.dbp.pool.Discard(sc, evictBroken)
		return
	}
	if release && sc.stmtEpoch != sc.dbp.stmtEpoch.Load() && sc.cleanLocked() {
		// A schema change may have made the statements prepared here
		// stale: drop them before anyone else gets the connection; the
		// next Parse of each prepares it again.
		release = false
		sc.stmtEpoch = sc.dbp.stmtEpoch.Load()
		sc.stmts.Clear()
		sc.ownQueryLocked(nil, "DEALLOCATE ALL")
	}
	if release && own.settingsDirty() {
		// The client changed settings during the transaction: read what
		// they are now before anyone else gets the connection.
		release = false
		sc.snapshotLocked(own)
	}
	checking := false
	if release && sc.handoffDueLocked() {
		// verify_handoff: the client gives the connection up, which
		// joins the idle list once the check's answer is in and clean
		// (handoff.go).
		release, checking = false, true
		sc.verifyLocked(own)
		sc.detachLocked(own)
	}
	if own != nil && !release && sc.cleanLocked() && own.pinCheckDue() {
		// A pinned client ran what may have undone its session state:
		// ask the server whether any is left (pinChecked).
		sc.pinCheckLocked(own)
	}
	if release {
		sc.detachLocked(own)
	}
	shutdownIdle := own != nil && !release && sc.cleanLocked() && own.srv.endAtIdle()
	sc.mu.Unlock()
	if release || checking {
		if release {
			sc.dbp.checkin(sc)
		}
		if own.srv.endAtIdle() {
			own.endAtIdlePoint()
		}
	} else if shutdownIdle {
		own.endAtIdlePoint()
	}
}

// idleBrokenLocked reports whether a broken connection is otherwise idle
// between transactions (nothing owed, nothing half sent).
func (sc *serverConn) idleBrokenLocked() bool {
	return sc.pending == 0 && !sc.unsynced && sc.txStatus == wire.TxIdle && !sc.busy && !sc.keptOut() &&
		!sc.cancelling && !sc.midFrame
}

// cleanLocked reports whether the server owes nothing and is outside any
// transaction and frame.
func (sc *serverConn) cleanLocked() bool {
	return sc.pending == 0 && !sc.unsynced && sc.txStatus == wire.TxIdle && !sc.busy && !sc.keptOut() &&
		len(sc.swallowQ) == 0 && sc.stq.len() == 0 && len(sc.qundo) == 0 && !sc.cancelling && !sc.midFrame && !sc.clientMid && !sc.broken
}

// keptOut reports whether part of a request written from a loop is kept,
// not yet sent (writeOrKeep): the connection is in no state to serve
// anyone else.
func (sc *serverConn) keptOut() bool { return sc.io != nil && sc.io.Kept() > 0 }

// detachLocked gives the connection up from own, clean (released to the
// pool, or dropped at a transaction boundary): own may attach another one
// for its next request.
func (sc *serverConn) detachLocked(own *session) {
	sc.owner.Store(nil)
	own.server.CompareAndSwap(sc, nil)
}

// loseLocked takes the connection from own because it failed while held:
// own is severed before its server pointer is cleared, so that no request
// of its, not even one being handled right now, reaches another server
// connection (see session.attach).
func (sc *serverConn) loseLocked(own *session) {
	own.severed.Store(true)
	if sc.midFrame {
		// The client has part of a frame: a message now would be read
		// as the rest of it.
		own.midFrame.Store(true)
	}
	sc.detachLocked(own)
}

func (sc *serverConn) markBroken() {
	sc.mu.Lock()
	sc.broken = true
	sc.mu.Unlock()
}

// gone handles the end of the server connection.
func (sc *serverConn) gone(err error) {
	if errors.Is(err, io.EOF) && sc.closing.Load() {
		err = net.ErrClosed // closed by poolerd: Close shut the socket down
	}
	sc.mu.Lock()
	sc.broken = true
	own := sc.owner.Load()
	var kp *txstate.KeepPlan
	hung := time.Duration(sc.hung.Load())
	if own != nil {
		if kp = own.keepLocked(sc, sc.lostErr, hung); kp == nil {
			sc.loseLocked(own)
		}
	}
	if sc.quiet != nil {
		close(sc.quiet)
		sc.quiet = nil
	}
	sc.mu.Unlock()
	sc.dbp.pool.Discard(sc, evictServerClosed)
	switch {
	case kp != nil:
		own.kept(sc, kp, err)
	case own != nil && hung != 0:
		own.serverLostWith(sc, err, errTimedOut(timeoutServerResponse, hung))
	case own != nil && sc.lostErr != nil:
		// Held back for a keep that could not be: the client gets the
		// server's own FATAL.
		own.serverLostWith(sc, err, sc.lostErr)
	case own != nil:
		own.serverLost(sc, err)
	case errors.Is(err, net.ErrClosed):
		sc.log.Debug("idle server connection closed by poolerd", zap.Uint64("conn_id", sc.ID()))
	default:
		sc.log.Debug("idle server connection closed", zap.Uint64("conn_id", sc.ID()), zap.Error(err))
	}
}

// exec runs poolerd's own simple query on a connection nobody else holds and
// waits for its ReadyForQuery. It returns the server's error, if any.
func (sc *serverConn) exec(ctx context.Context, sql string) error {
	return sc.execOwn(ctx, nil, sql)
}

// execOwn is exec keeping the answer's rows for the group it stores in z
// (see ownQueryLocked).
func (sc *serverConn) execOwn(ctx context.Context, z *atomic.Int64, sql string) error {
	sc.mu.Lock()
	if sc.broken {
		sc.mu.Unlock()
		return errServerBroken
	}
	quiet := make(chan struct{})
	sc.quiet = quiet
	sc.opErr = nil
	sc.pending++
	sc.unnamedBy = nil // a simple query drops the unnamed statement
	if z != nil {
		z.Store(sc.zSent)
	}
	sc.swallowGroupLocked(sc.zSent)
	// Its error goes to the caller, who closes the connection or knows
	// the statement left nothing behind (swallowed).
	sc.mayFailQ = append(sc.mayFailQ, sc.zSent)
	sc.zSent++
	sc.mu.Unlock()
	if _, err := sc.Conn.Write(wire.AppendQuery(nil, sql)); err != nil {
		sc.markBroken()
		return err
	}
	select {
	case <-quiet:
	case <-ctx.Done():
		sc.markBroken()
		return fmt.Errorf("poolerd query on server connection: %w", ctx.Err())
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.broken {
		return errServerBroken
	}
	if sc.opErr != nil {
		return sc.opErr
	}
	if sc.txStatus != wire.TxIdle {
		sc.broken = true
		return fmt.Errorf("server left in transaction status %q after %q", sc.txStatus, sql)
	}
	return nil
}

// isBroken reports whether the connection must be closed.
func (sc *serverConn) isBroken() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.broken
}

// swallowGroupLocked marks response group z as poolerd's own. Groups are
// added in increasing order.
func (sc *serverConn) swallowGroupLocked(z int64) {
	sc.swallowQ = append(sc.swallowQ, z)
	if len(sc.swallowQ) == 1 {
		sc.nextSwallow.Store(z)
	}
}

// syncValue is a response group of the parameter sync that sets the
// unreported parameter name.
type syncValue struct {
	z    int64
	name string
}

// syncAt reports whether response group z sets a parameter of the sync.
// Reader goroutine (syncQ's head moves only there).
func (sc *serverConn) syncAt(z int64) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.syncQ) > 0 && sc.syncQ[0].z == z
}

// syncRow keeps the value a sync's set_config answered (the server's own
// spelling of it) as the parameter's applied value. Reader goroutine.
func (sc *serverConn) syncRow(body []byte) {
	cols, ok := dataRow(body, 1)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !ok || len(sc.syncQ) == 0 || cols[0] == nil {
		return
	}
	name := sc.syncQ[0].name
	if _, set := sc.applied[name]; set {
		v := string(cols[0])
		sc.applied[name] = v
		sc.normApplied[name] = v // the hand-off check compares it exactly
	}
}

// popGroupLocked drops the entries of response group z from q (a queue of
// increasing groups) and reports whether it had one.
func popGroupLocked(q *[]int64, z int64) bool {
	found := false
	for len(*q) > 0 && (*q)[0] <= z {
		found = found || (*q)[0] == z
		*q = (*q)[1:]
	}
	if len(*q) == 0 {
		*q = nil
	}
	return found
}

// swallowed ends a swallowed response group (its ReadyForQuery with
// transaction status status): the next one becomes the head, and a settings
// snapshot is handed to the owner. Reader goroutine.
//
// poolerd's own queries either succeed or the connection is closed: a
// parameter sync, RESET ROLE, a settings snapshot or DEALLOCATE ALL that
// failed leaves the connection in a state poolerd does not know, which must
// never reach another client. Only the pin check (the client stays pinned),
// the failed block (its error is the point), a DEALLOCATE's Parse first and
// exec's queries, whose caller gets the error (mayFailQ), may fail.
func (sc *serverConn) swallowed(own *session, status byte) {
	sc.mu.Lock()
	z := sc.zRecv
	for len(sc.syncQ) > 0 && sc.syncQ[0].z <= z {
		sc.syncQ = sc.syncQ[1:]
	}
	if len(sc.syncQ) == 0 {
		sc.syncQ = nil
	}
	// (A hand-off check that fails closes the connection itself.)
	mayFail := popGroupLocked(&sc.mayFailQ, z) || sc.checkZ.Load() == z || sc.failZ == z || sc.verifyZ.Load() == z
	if sc.opErr != nil && !mayFail && !sc.broken && sc.resetZ != z {
		sc.broken = true
		var who []zap.Field
		if own != nil {
			who = []zap.Field{zap.Uint64("client_id", own.id), zap.String("user", own.user), zap.String("database", own.database)}
		}
		sc.log.Warn("a query poolerd sent on a server connection failed; closing the connection at its next idle point",
			append(who, zap.Uint64("conn_id", sc.ID()), zap.Error(sc.opErr))...)
	}
	if len(sc.swallowQ) > 0 {
		sc.swallowQ = sc.swallowQ[1:]
	}
	if len(sc.swallowQ) > 0 {
		sc.nextSwallow.Store(sc.swallowQ[0])
	} else {
		sc.swallowQ = sc.swallowQ[:0:0]
		sc.nextSwallow.Store(-1)
	}
	snap := sc.snapZ.Load() == sc.zRecv
	if snap {
		sc.snapZ.Store(-1)
	}
	failed := sc.opErr != nil
	if sc.checkZ.Load() == sc.zRecv {
		sc.checkZ.Store(-1)
		if own != nil {
			own.pinChecked(sc.checkRow, failed, sc.checkGen)
		}
		sc.checkRow = sc.checkRow[:0]
		sc.opErr = nil
	}
	if sc.verifyZ.Load() == sc.zRecv {
		sc.verifyZ.Store(-1)
		sc.handoffAnsweredLocked()
	}
	if sc.failZ == sc.zRecv {
		sc.failZ = -1
		sc.opErr = nil // the failed block was the point (keep.go)
	}
	if sc.resetZ == sc.zRecv {
		sc.resetZ = -1
		if failed {
			// RESET ROLE cannot fail outside a failed transaction, and
			// it is only sent at idle; should it fail all the same, the
			// connection may have someone else's role: close it.
			sc.broken = true
			sc.log.Error("RESET ROLE failed on a server connection; closing it",
				zap.Uint64("conn_id", sc.ID()), zap.Error(sc.opErr))
			sc.opErr = nil
		}
	}
	var rows map[string]string
	if snap {
		rows, sc.snapRows = sc.snapRows, nil
		if rows == nil {
			rows = map[string]string{}
		}
		_, otherRole := rows[snapRoleRow]
		delete(rows, snapRoleRow)
		if !failed {
			sc.applySnapshotLocked(rows)
			if own != nil {
				own.settingsSnapshot(sc, status)
				if otherRole {
					own.roleChanged()
				}
			}
		}
		sc.opErr = nil
	}
	sc.mu.Unlock()
}

// snapRow keeps one row (name, value) of a settings snapshot. Reader
// goroutine.
func (sc *serverConn) snapRow(body []byte) {
	cols, ok := dataRow(body, 2)
	if !ok {
		return
	}
	if sc.snapRows == nil {
		sc.snapRows = map[string]string{}
	}
	sc.snapRows[string(cols[0])] = string(cols[1])
}

// dataRow splits a DataRow body of n non-null columns.
func dataRow(body []byte, n int) ([][]byte, bool) {
	if len(body) < 2 || int(binary.BigEndian.Uint16(body)) != n {
		return nil, false
	}
	cols := make([][]byte, 0, n)
	p := body[2:]
	for range n {
		if len(p) < 4 {
			return nil, false
		}
		l := int(int32(binary.BigEndian.Uint32(p)))
		p = p[4:]
		if l < 0 || l > len(p) {
			return nil, false
		}
		cols = append(cols, p[:l])
		p = p[l:]
	}
	return cols, true
}

// applySnapshotLocked records what a settings snapshot says is set on the
// connection beyond the reported parameters.
func (sc *serverConn) applySnapshotLocked(rows map[string]string) {
	clear(sc.applied)
	sc.paramGen++
	for name, value := range rows {
		if _, reported := sc.params[name]; !reported {
			sc.applied[name] = value
			sc.normApplied[name] = value
		}
	}
}

// snapRoleRow names the row of a settings snapshot that says the current
// role is not the session user: no parameter can have this name.
const snapRoleRow = "poolerd role"

// snapshotSQL lists the session-level settings of a connection: what a
// client's SET, RESET and set_config left behind (the reported parameters
// are tracked through ParameterStatus instead), and the customized options
// (a.b) the client touched, which pg_settings does not list. A row named
// snapRoleRow says that the role changed (by a DO block, a procedure, a
// computed set_config: what the scanner cannot see).
func snapshotSQL(custom []string) string {
	notIn := "'role', 'session_authorization'"
	for _, n := range txstate.TxScopedSettings {
		notIn += ", " + txstate.QuoteLiteral(n)
	}
	q := "SELECT name, pg_catalog.current_setting(name) FROM pg_catalog.pg_settings " +
		"WHERE source = 'session' AND name NOT IN (" + notIn + ") " +
		"UNION ALL SELECT '" + snapRoleRow + "', current_user::pg_catalog.text WHERE current_user OPERATOR(pg_catalog.<>) session_user"
	if len(custom) == 0 {
		return q
	}
	lits := make([]string, len(custom))
	for i, n := range custom {
		lits[i] = txstate.QuoteLiteral(n)
	}
	return q + " UNION ALL SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest(ARRAY[" +
		strings.Join(lits, ", ") + "]::text[]) AS n WHERE pg_catalog.current_setting(n, true) IS NOT NULL"
}

// snapshotLocked sends the settings snapshot query for own on a clean
// connection.
func (sc *serverConn) snapshotLocked(own *session) {
	sc.snapGen = own.dirtyGen.Load()
	sc.ownQueryLocked(&sc.snapZ, snapshotSQL(own.customOptions()))
}

// pinCheckLocked sends the pin check query for own on a clean connection.
func (sc *serverConn) pinCheckLocked(own *session) {
	sc.checkGen = own.undoGen.Load()
	sc.ownQueryLocked(&sc.checkZ, txstate.PinCheckSQL(sc.loginAuth))
}

// ownQueryLocked sends one of poolerd's own queries whose answer the reader
// swallows, keeping its rows for the group it stores in z. The connection
// is clean (the server is waiting for a request, so the write cannot block
// on it); the query is owed before the write, in the same critical
// section, so that no one finds the connection clean in between.
func (sc *serverConn) ownQueryLocked(z *atomic.Int64, sql string) {
	sc.pending++
	sc.unnamedBy = nil
	if z != nil {
		z.Store(sc.zSent)
	}
	sc.swallowGroupLocked(sc.zSent)
	sc.zSent++
	if _, err := sc.Conn.Write(wire.AppendQuery(nil, sql)); err != nil {
		sc.broken = true
	}
}

// unknownStatementReply is a 26000 error with the client's name for the
// statement in place of poolerd's (a Bind of a statement whose Parse failed
// earlier in the pipeline reaches the server under the shared name).
func (sc *serverConn) unknownStatementReply(own *session, sev, code, msg string) []byte {
	const pre, post = `prepared statement "`, `" does not exist`
	if strings.HasPrefix(msg, pre) && strings.HasSuffix(msg, post) {
		if client := own.clientName(msg[len(pre) : len(msg)-len(post)]); client != "" {
			return (&wire.Error{Severity: sev, Code: code, Message: pre + client + post}).Append(nil)
		}
	}
	return sc.timeoutReply(own, sev, code, msg)
}

// staleStatementError reports whether an error from PostgreSQL says that a
// prepared statement was planned against objects that changed since (a
// migration altered a table, or dropped and created a type): PostgreSQL
// answers a client's own fresh Parse with the new schema, but a statement
// poolerd keeps prepared for the pool's clients keeps failing until it is
// prepared again.
func staleStatementError(code, msg string) bool {
	switch code {
	case "0A000":
		return strings.HasPrefix(msg, "cached plan must not change result type")
	case "XX000":
		return strings.HasPrefix(msg, "cache lookup failed for type")
	}
	return false
}
