package proxy

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// This file is the one home of a session's timeouts: the limits from its
// pool's settings (type timeouts, one field per configuration key), the
// watchdog that enforces them and leak detection with one timer, the
// errors a client reads when one expires, and the fixed delays poolerd
// waits for itself. checkout_timeout is the pool's (internal/pool),
// client_login_timeout the login's (handshake.go, as a socket deadline).

// Kinds of timeout a session can run into (the checkout timeout is counted
// by the pool, the login timeout by the server).
type timeoutKind int

const (
	timeoutQuery timeoutKind = iota
	timeoutTransaction
	timeoutIdleTransaction
	timeoutClientIdle
	timeoutServerResponse
	timeoutPinnedIdle
	// timeoutLease: lease_timeout ran out during the work; timeoutLeaseCheckout:
	// during the checkout wait (the pool counts it as a checkout timeout
	// too: the snapshot takes it out of that count).
	timeoutLease
	timeoutLeaseCheckout
	numTimeoutKinds
)

var timeoutKindNames = [numTimeoutKinds]string{"query", "transaction", "idle_transaction", "client_idle", "server_response", "pinned_idle", "lease", "lease_checkout"}

func (k timeoutKind) String() string { return timeoutKindNames[k] }

// limitName is the configuration key of the limit behind kind.
func (k timeoutKind) limitName() string {
	if k == timeoutLease || k == timeoutLeaseCheckout {
		return "lease_timeout"
	}
	return timeoutKindNames[k] + "_timeout"
}

// cause says in a client's message what ran out: the words PostgreSQL
// and PgBouncer use ("query timeout", "transaction timeout", which
// applications match on), then the key and its value.
func (k timeoutKind) cause(limit time.Duration) string {
	return fmt.Sprintf("%s (%s %s)", k.words(), k.limitName(), limit)
}

// words is the limit in words: "query timeout".
func (k timeoutKind) words() string {
	return strings.ReplaceAll(k.limitName(), "_", " ")
}

// Fixed delays: what poolerd waits for on its own account, where no
// setting applies.
const (
	// cancelGrace is how long a query whose query_timeout passed may take
	// to answer the cancel request before its server connection is
	// closed; also the bound on delivering any cancel request (connect,
	// send, wait for PostgreSQL to close). A cancel is a signal to a local
	// backend: seconds mean the server is in trouble, and the connection
	// is closed anyway.
	cancelGrace = 5 * time.Second
	// resetTimeout bounds server_reset_query, DISCARD ALL or RESET ALL
	// when a client leaves: they take microseconds on a healthy server; a
	// connection that needs longer is closed rather than pooled.
	resetTimeout = 10 * time.Second
	// finalWriteTimeout bounds writing a client's final message (and
	// unblocks a writer stuck on a client that does not read): a one-frame
	// write to a live client's socket buffer never takes a second.
	finalWriteTimeout = time.Second
	// sessionsEndWait is how long Shutdown and Drain wait, after closing
	// every client connection, for the sessions' goroutines to finish:
	// each only has cleanup left (cancelGrace bounds the longest), so a
	// longer wait means a bug, which is logged, and the pools close anyway.
	sessionsEndWait = cancelGrace
	// clientKeepAlive is the TCP keepalive period of client connections:
	// a client host that vanished without a FIN is noticed within minutes
	// (period plus probes), not after the kernel default of two hours,
	// at the cost of one empty packet per idle client every 15 s. It is
	// Go's default, which its accept sets (serveConn); a client passed
	// by an upgrade gets it explicitly (handover.go).
	clientKeepAlive = 15 * time.Second
)

// maxQueryText is how much of a query the leak warning shows.
const maxQueryText = 200

// watchdog enforces a session's timeouts and leak detection with one timer
// that is armed only when a limit applies and that fires at the earliest
// deadline that may have passed. Deadlines are derived from timestamps the
// relay records as it goes (nanoseconds since the server started), so the
// relay never touches the timer on its fast path: when the timer fires it
// recomputes and, if nothing has expired, re-arms for the next deadline.
type watchdog struct {
	armedAt    atomic.Int64 // deadline the timer is set for; 0 when idle
	lastActive atomic.Int64 // nanotime of the client's last activity

	mu        sync.Mutex // serialises arming and firing; guards the rest
	timer     *time.Timer
	leakSince int64 // busySince the leak warnings below refer to
	leakNext  int64 // next multiple of the threshold to warn at
	// cancelled is the queryStart of the query cancelled by query_timeout,
	// or minus the start of the lease whose request lease_timeout
	// cancelled (both are positive clock readings); cancelAt is when that
	// cancel was sent. leaseQuery is the queryStart of the request
	// lease_timeout cancelled: a later request pending when the cancel
	// grace ends is not that request still unanswered.
	cancelled  int64
	cancelAt   int64
	leaseQuery int64
}

// nanotime is the session clock: nanoseconds since the server started,
// never zero (zero means "not set").
func (srv *Server) nanotime() int64 { return int64(time.Since(srv.started)) + 1 }

// timeouts are a session's limits from its pool's settings (per-user
// overrides applied), in nanoseconds, each named like its configuration
// key; zero disables one. A reload replaces a session's whole value.
type timeouts struct {
	queryTimeout, transactionTimeout, idleTransactionTimeout int64
	clientIdleTimeout, serverResponseTimeout                 int64
	leakDetectionThreshold, pinnedIdleTimeout                int64
	leaseTimeout                                             int64
}

// timeoutsOf converts a route's settings. Sessions share the result
// (timeoutsFor): it is never changed, only replaced.
func timeoutsOf(set config.PoolSettings) *timeouts {
	return &timeouts{
		queryTimeout:           int64(set.QueryTimeout),
		transactionTimeout:     int64(set.TransactionTimeout),
		idleTransactionTimeout: int64(set.IdleTransactionTimeout),
		clientIdleTimeout:      int64(set.ClientIdleTimeout),
		serverResponseTimeout:  int64(set.ServerResponseTimeout),
		leakDetectionThreshold: int64(set.LeakDetectionThreshold),
		pinnedIdleTimeout:      int64(set.PinnedIdleTimeout),
		leaseTimeout:           int64(set.LeaseTimeout),
	}
}

// timeoutsFor returns the limits of a route's settings, one value shared
// by every session with the same limits: an idle client does not keep a
// copy of its own.
func (srv *Server) timeoutsFor(set config.PoolSettings) *timeouts {
	t := timeoutsOf(set)
	srv.timeoutsMu.Lock()
	defer srv.timeoutsMu.Unlock()
	if shared, ok := srv.timeoutsSet[*t]; ok {
		return shared
	}
	if srv.timeoutsSet == nil || len(srv.timeoutsSet) >= maxTimeoutSets {
		srv.timeoutsSet = map[timeouts]*timeouts{} // reloads made many: start over
	}
	srv.timeoutsSet[*t] = t
	return t
}

// maxTimeoutSets bounds timeoutsFor's set of distinct limits.
const maxTimeoutSets = 256

func (t *timeouts) any() bool {
	return t.queryTimeout|t.transactionTimeout|t.idleTransactionTimeout|
		t.clientIdleTimeout|t.serverResponseTimeout|t.leakDetectionThreshold|t.pinnedIdleTimeout|t.leaseTimeout != 0
}

// idleTracked reports whether the client's idle periods are timed
// (client_idle_timeout, pinned_idle_timeout).
func (t *timeouts) idleTracked() bool { return t.clientIdleTimeout|t.pinnedIdleTimeout != 0 }

// of returns the limit of a kind.
func (t *timeouts) of(kind timeoutKind) int64 {
	switch kind {
	case timeoutQuery:
		return t.queryTimeout
	case timeoutTransaction:
		return t.transactionTimeout
	case timeoutIdleTransaction:
		return t.idleTransactionTimeout
	case timeoutClientIdle:
		return t.clientIdleTimeout
	case timeoutServerResponse:
		return t.serverResponseTimeout
	case timeoutPinnedIdle:
		return t.pinnedIdleTimeout
	case timeoutLease, timeoutLeaseCheckout:
		return t.leaseTimeout
	}
	return 0
}

// timeouts returns the session's limits (all zero until login sets them;
// never nil).
func (s *session) timeouts() *timeouts { return s.timeoutsP.Load() }

// arm makes sure the timer fires no later than deadline.
func (s *session) arm(deadline int64) {
	w := &s.wd
	if a := w.armedAt.Load(); a != 0 && a <= deadline {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := w.armedAt.Load(); a != 0 && a <= deadline {
		return
	}
	d := time.Duration(deadline - s.srv.nanotime())
	if w.timer == nil {
		w.timer = time.AfterFunc(d, s.fire)
	} else {
		w.timer.Reset(d)
	}
	w.armedAt.Store(deadline)
}

// stopWatch stops the timer for good (the session ended).
func (s *session) stopWatch() {
	s.wd.mu.Lock()
	if s.wd.timer != nil {
		s.wd.timer.Stop()
	}
	s.wd.armedAt.Store(0)
	s.wd.mu.Unlock()
}

// noteActive records client activity (for client_idle_timeout).
func (s *session) noteActive(now int64) {
	s.wd.lastActive.Store(now)
	t := s.timeouts()
	if t.clientIdleTimeout != 0 {
		s.arm(now + t.clientIdleTimeout)
	}
	if t.pinnedIdleTimeout != 0 && s.pinReason.Load() != nil {
		s.arm(now + t.pinnedIdleTimeout)
	}
}

// noteBusy arms the timer for a server that just became busy for this
// session (a request sent with nothing pending before).
func (s *session) noteBusy(busySince, queryStart, leaseStart int64) {
	l := s.timeouts()
	next := int64(0)
	pick := func(d int64) {
		if d != 0 && (next == 0 || d < next) {
			next = d
		}
	}
	if l.queryTimeout != 0 {
		pick(queryStart + l.queryTimeout)
	}
	if l.serverResponseTimeout != 0 {
		pick(queryStart + l.serverResponseTimeout)
	}
	if l.transactionTimeout != 0 {
		pick(busySince + l.transactionTimeout)
	}
	if l.leaseTimeout != 0 {
		pick(serverTimes{busySince: busySince, leaseStart: leaseStart}.lease() + l.leaseTimeout)
	}
	if l.leakDetectionThreshold != 0 {
		pick(busySince + l.leakDetectionThreshold)
	}
	if next != 0 {
		s.arm(next)
	}
}

// noteIdleInTx arms the timer for idle_transaction_timeout.
func (s *session) noteIdleInTx(since int64) {
	if s.timeouts().idleTransactionTimeout != 0 {
		s.arm(since + s.timeouts().idleTransactionTimeout)
	}
}

// serverTimes is what the watchdog reads from the held server connection.
type serverTimes struct {
	pending                                      int
	txStatus                                     byte
	busySince, queryStart, lastRecv, idleTxSince int64
	leaseStart                                   int64
}

// fire runs on the timer's goroutine: it finds what expired, acts on the
// most severe, and re-arms for the next deadline.
func (s *session) fire() {
	w := &s.wd
	w.mu.Lock()
	w.armedAt.Store(0)
	if s.closed.Load() {
		w.mu.Unlock()
		return
	}
	now := s.srv.nanotime()
	l := s.timeouts()
	next := int64(0)
	pick := func(d int64) {
		if next == 0 || d < next {
			next = d
		}
	}
	var expired timeoutKind = -1
	var leak bool
	var held time.Duration
	sc := s.server.Load()
	var t serverTimes
	if sc != nil {
		sc.mu.Lock()
		owned := sc.owner.Load() == s
		if owned {
			t = serverTimes{sc.pending, sc.txStatus, sc.busySince, sc.queryStart, sc.lastRecv.Load(), sc.idleTxSince, sc.leaseStart}
		}
		sc.mu.Unlock()
		if !owned {
			sc = nil
		}
	}
	shutting := s.srv.shuttingDown()
	check := func(kind timeoutKind, deadline int64) {
		if deadline > now {
			pick(deadline)
		} else if expired < 0 {
			expired = kind
		}
	}
	if sc != nil {
		// Order is precedence: a hung server first (it explains the rest),
		// then the whole transaction, then one query, then idling in one.
		// Not while the server waits for COPY data from the client, nor
		// during shutdown (seed 002 rule 3).
		if l.serverResponseTimeout != 0 && t.pending > 0 && !shutting && !sc.copyIn.Load() {
			check(timeoutServerResponse, max(t.lastRecv, t.queryStart)+l.serverResponseTimeout)
		}
		if l.transactionTimeout != 0 && t.busySince != 0 {
			check(timeoutTransaction, t.busySince+l.transactionTimeout)
		}
		if l.leaseTimeout != 0 && t.busySince != 0 {
			if start := t.lease(); w.cancelled == -start {
				// Cancel sent: give the server cancelGrace to answer.
				check(timeoutLease, w.cancelAt+int64(cancelGrace))
			} else {
				check(timeoutLease, start+l.leaseTimeout)
			}
		}
		if l.queryTimeout != 0 && t.pending > 0 {
			if w.cancelled == t.queryStart {
				// Cancel sent: give the server cancelGrace to answer.
				check(timeoutQuery, w.cancelAt+int64(cancelGrace))
			} else {
				check(timeoutQuery, t.queryStart+l.queryTimeout)
			}
		}
		if l.idleTransactionTimeout != 0 && t.pending == 0 && t.txStatus != wire.TxIdle && t.idleTxSince != 0 {
			check(timeoutIdleTransaction, t.idleTxSince+l.idleTransactionTimeout)
		}
		if l.leakDetectionThreshold != 0 && t.busySince != 0 {
			if w.leakSince != t.busySince {
				w.leakSince, w.leakNext = t.busySince, t.busySince+l.leakDetectionThreshold
			}
			if w.leakNext <= now {
				leak, held = true, time.Duration(now-t.busySince)
				// Warn again only when twice as long has passed.
				w.leakNext = t.busySince + 2*(now-t.busySince)
			}
			pick(w.leakNext)
		}
	}
	idleOutside := sc == nil || (t.pending == 0 && t.txStatus == wire.TxIdle && t.busySince == 0)
	if l.clientIdleTimeout != 0 && idleOutside {
		check(timeoutClientIdle, w.lastActive.Load()+l.clientIdleTimeout)
	}
	if l.pinnedIdleTimeout != 0 && idleOutside && s.pinReason.Load() != nil {
		check(timeoutPinnedIdle, max(w.lastActive.Load(), s.pinnedSince.Load())+l.pinnedIdleTimeout)
	}
	retryQuery := expired == timeoutQuery && w.cancelled != t.queryStart
	if retryQuery {
		w.cancelled, w.cancelAt = t.queryStart, now
		pick(now + int64(cancelGrace))
	}
	// lease_timeout outside a transaction block cancels the request, as
	// query_timeout does; inside one it ends the session, as
	// transaction_timeout does (the block cannot continue within the
	// lease). After an unanswered cancel, the session ends too.
	leaseCancelled := expired == timeoutLease && w.cancelled == -t.lease()
	// The cancelled request itself still pending (not a later one, sent
	// after the cancel's answer): the cancel went unanswered.
	leaseUnanswered := leaseCancelled && t.pending > 0 && t.queryStart == w.leaseQuery
	cancelLease := expired == timeoutLease && !leaseCancelled && t.pending > 0 && t.txStatus == wire.TxIdle
	if cancelLease {
		w.cancelled, w.cancelAt, w.leaseQuery = -t.lease(), now, t.queryStart
		pick(now + int64(cancelGrace))
	}
	w.mu.Unlock()

	if leak {
		s.warnLeak(sc, held, t)
	}
	switch {
	case expired < 0:
	case retryQuery:
		s.cancelFor(timeoutQuery, sc)
	case cancelLease:
		s.cancelFor(timeoutLease, sc)
	case leaseUnanswered:
		s.endForTimeout(timeoutLease, sc, errCancelUnanswered(timeoutLease, time.Duration(l.leaseTimeout)))
		return // the session ends
	case leaseCancelled:
		// The cancel was answered, but the request had opened a block
		// (BEGIN and a statement in one Query), which the lease cannot
		// hold: ended as one inside a block is (counted at the cancel).
		s.endForTimeout(timeoutLease, sc, errTimedOut(timeoutLease, time.Duration(l.leaseTimeout)))
		return // the session ends
	default:
		s.timedOut(expired, sc)
		return // the session ends
	}
	if s.fastClose(sc, now) {
		return // the session ends
	}
	if next != 0 {
		s.arm(next)
	}
}

// fastClosePoll is how often a session whose server connection must close
// (server_fast_close) looks again for an idle point while it is busy.
const fastClosePoll = 50 * time.Millisecond

// fastClose ends the session if server_fast_close is on and sc, the server
// connection it holds, was asked to close (RECONNECT, a reload) and is
// idle outside a transaction; while sc is busy it looks again soon. It
// reports whether the session ended.
func (s *session) fastClose(sc *serverConn, now int64) bool {
	if sc == nil || !s.srv.cfg().ServerFastClose || !s.dbp.pool.CloseNeeded(sc) {
		return false
	}
	if s.endIfIdleWith(sc, errFastClose()) {
		s.log.Info("client closed: its server connection is being replaced (server_fast_close)", zap.Uint64("conn_id", sc.ID()))
		return true
	}
	s.arm(now + int64(fastClosePoll))
	return false
}

// wakeForFastClose has the sessions of database ("" for all) look at once
// whether server_fast_close ends them (after RECONNECT or a reload).
func (srv *Server) wakeForFastClose(database string) {
	if !srv.cfg().ServerFastClose {
		return
	}
	srv.mu.Lock()
	var wake []*session
	for _, s := range srv.sessions {
		if database == "" || s.database == database {
			wake = append(wake, s)
		}
	}
	srv.mu.Unlock()
	now := srv.nanotime()
	for _, s := range wake {
		if s.server.Load() != nil {
			s.arm(now)
		}
	}
}

// lease is when the lease being timed began: the start of the checkout
// wait that got the connection, or (session mode, a pinned client: no
// wait) when the connection became busy.
func (t serverTimes) lease() int64 {
	if t.leaseStart != 0 {
		return t.leaseStart
	}
	return t.busySince
}

// cancelFor cancels the running query for query_timeout or lease_timeout
// (kind); the server's 57014 reply is rewritten to name the limit, and if
// no reply comes within cancelGrace the next fire closes the connection.
func (s *session) cancelFor(kind timeoutKind, sc *serverConn) {
	s.dbp.timeoutCounts[kind].Add(1)
	limit := time.Duration(s.timeouts().of(kind))
	s.log.Warn(kind.words()+" reached; cancelling the query",
		zap.Duration(kind.limitName(), limit), zap.Uint64("conn_id", sc.ID()),
		zap.String("query", s.queryText()))
	sc.mu.Lock()
	if sc.owner.Load() != s || sc.pending == 0 {
		sc.mu.Unlock()
		return
	}
	sc.cancelling = true
	sc.timeoutCancel.Store(int32(kind) + 1)
	sc.mu.Unlock()
	// In the background: the cancel grace runs from now, and a server that
	// does not close the cancel connection must not hold the watchdog.
	go func() {
		s.srv.cancelBackend(sc)
		sc.mu.Lock()
		sc.cancelling = false
		sc.mu.Unlock()
		sc.settle()
	}()
}

// timedOut ends the session for an expired limit: the client gets an error
// naming it, and the server connection, which is not provably clean, is
// closed (after a cancel request if a query runs, so its locks go at once).
func (s *session) timedOut(kind timeoutKind, sc *serverConn) {
	limit := time.Duration(s.timeouts().of(kind))
	if kind != timeoutQuery { // counted when the query was cancelled
		s.dbp.timeoutCounts[kind].Add(1)
	}
	s.endForTimeout(kind, sc, errTimedOut(kind, limit))
}

// endForTimeout is timedOut with the client's error werr (counted by the
// caller).
func (s *session) endForTimeout(kind timeoutKind, sc *serverConn, werr *wire.Error) {
	limit := time.Duration(s.timeouts().of(kind))
	fields := []zap.Field{zap.String("timeout", kind.String()), zap.Duration("limit", limit)}
	if sc != nil {
		fields = append(fields, zap.Uint64("conn_id", sc.ID()))
	}
	if kind != timeoutClientIdle && kind != timeoutPinnedIdle {
		fields = append(fields, zap.String("query", s.queryText()))
	}
	if kind == timeoutServerResponse && sc != nil && s.closeHung(sc, limit) {
		// Hung: closed now, no cancel request to send. Its reader answers
		// the client, which may keep its session (keep.go).
		s.log.Warn("server connection closed: timeout", fields...)
		return
	}
	s.log.Warn("client connection closed: timeout", fields...)
	s.setDropReason(evictTimeout)
	switch {
	case sc == nil, kind == timeoutClientIdle, kind == timeoutPinnedIdle:
		// An idle client's server (session mode) is clean: it goes back
		// to the pool when the session ends.
	case kind == timeoutServerResponse:
		s.dropServer(sc) // hung: close it now, no cancel request to send
	default:
		// Not provably clean: when the session ends it is closed, after a
		// cancel request if a query still runs. The client is told first.
		sc.markBroken()
	}
	s.terminate(werr)
}

// dropServer detaches a hung sc from the session and closes it.
func (s *session) dropServer(sc *serverConn) {
	sc.mu.Lock()
	if sc.owner.Load() != s {
		sc.mu.Unlock()
		return
	}
	sc.broken = true
	sc.loseLocked(s)
	sc.mu.Unlock()
	s.dbp.pool.Discard(sc, evictHung)
}

// warnLeak logs that the client has kept its server connection busy for a
// long time: who, where, how long, doing what.
func (s *session) warnLeak(sc *serverConn, held time.Duration, t serverTimes) {
	s.dbp.leaks.Add(1)
	state := "idle in transaction"
	if t.pending > 0 {
		state = "active query"
	}
	s.pmu.Lock()
	app := s.params["application_name"]
	s.pmu.Unlock()
	s.log.Warn("possible connection leak: client has held a server connection for a long time",
		zap.Uint64("conn_id", sc.ID()), zap.String("application_name", app),
		zap.Duration("held", held.Round(time.Millisecond)),
		zap.Duration("leak_detection_threshold", time.Duration(s.timeouts().leakDetectionThreshold)),
		zap.String("state", state), zap.String("query", s.queryText()))
}

// noteQuery keeps the start of a query the client sent (the text of a
// Query, or of a Parse), for leak warnings and timeout logs. Parameter
// values (in Bind) are never kept.
func (s *session) noteQuery(typ byte, body []byte) {
	if typ == 'P' {
		// Parse: statement name, then the query.
		i := 0
		for i < len(body) && body[i] != 0 {
			i++
		}
		if i >= len(body) {
			return
		}
		body = body[i+1:]
	}
	n := 0
	for n < len(body) && n < maxQueryText && body[n] != 0 {
		n++
	}
	s.qmu.Lock()
	if s.qtext == nil {
		s.qtext = new([maxQueryText]byte) // on the first query: idle clients do without
	}
	s.qlen = copy(s.qtext[:], body[:n])
	s.qmu.Unlock()
}

func (s *session) queryText() string {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.qtext == nil {
		return ""
	}
	return string(s.qtext[:s.qlen])
}
