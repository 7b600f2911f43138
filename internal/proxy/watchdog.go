package proxy

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// Kinds of timeout a session can run into (the checkout timeout is counted
// by the pool, the login timeout by the server).
type timeoutKind int

const (
	timeoutQuery timeoutKind = iota
	timeoutTransaction
	timeoutIdleTransaction
	timeoutClientIdle
	timeoutServerResponse
	numTimeoutKinds
)

var timeoutKindNames = [numTimeoutKinds]string{"query", "transaction", "idle_transaction", "client_idle", "server_response"}

func (k timeoutKind) String() string { return timeoutKindNames[k] }

// cancelGrace is how long a query whose query_timeout passed may take to
// answer the cancel request before its server connection is closed.
const cancelGrace = 5 * time.Second

// maxQueryText is how much of a query the leak warning shows.
const maxQueryText = 200

// watchdog enforces a session's timeouts and leak detection with one timer
// that is armed only when a limit applies and that fires at the earliest
// deadline that may have passed. Deadlines are derived from timestamps the
// relay records as it goes (nanoseconds since the server started), so the
// relay never touches the timer on its fast path: when the timer fires it
// recomputes and, if nothing has expired, re-arms for the next deadline.
type watchdog struct {
	armedAt atomic.Int64 // deadline the timer is set for; 0 when idle
	mu      sync.Mutex   // serialises arming and firing
	timer   *time.Timer

	// Fire-side state (under mu).
	leakSince  int64 // busySince the leak warnings below refer to
	leakNext   int64 // next multiple of the threshold to warn at
	cancelled  int64 // queryStart of the query cancelled by query_timeout
	cancelAt   int64 // when that cancel was sent
	lastActive atomic.Int64
}

// nanotime is the session clock: nanoseconds since the server started,
// never zero (zero means "not set").
func (srv *Server) nanotime() int64 { return int64(time.Since(srv.started)) + 1 }

// limits are the session's timeouts (from its pool's settings), as
// nanoseconds; zero disables one.
type limits struct {
	query, transaction, idleTx, clientIdle, serverResponse, leak int64
}

// limitsOf converts a route's settings.
func limitsOf(set config.PoolSettings) *limits {
	return &limits{
		query: int64(set.QueryTimeout), transaction: int64(set.TransactionTimeout),
		idleTx: int64(set.IdleTransactionTimeout), clientIdle: int64(set.ClientIdleTimeout),
		serverResponse: int64(set.ServerResponseTimeout), leak: int64(set.LeakDetectionThreshold),
	}
}

func (l limits) any() bool {
	return l.query|l.transaction|l.idleTx|l.clientIdle|l.serverResponse|l.leak != 0
}

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
	if s.limits().clientIdle != 0 {
		s.arm(now + s.limits().clientIdle)
	}
}

// noteBusy arms the timer for a server that just became busy for this
// session (a request sent with nothing pending before).
func (s *session) noteBusy(busySince, queryStart int64) {
	l := s.limits()
	next := int64(0)
	pick := func(d int64) {
		if d != 0 && (next == 0 || d < next) {
			next = d
		}
	}
	if l.query != 0 {
		pick(queryStart + l.query)
	}
	if l.serverResponse != 0 {
		pick(queryStart + l.serverResponse)
	}
	if l.transaction != 0 {
		pick(busySince + l.transaction)
	}
	if l.leak != 0 {
		pick(busySince + l.leak)
	}
	if next != 0 {
		s.arm(next)
	}
}

// noteIdleInTx arms the timer for idle_transaction_timeout.
func (s *session) noteIdleInTx(since int64) {
	if s.limits().idleTx != 0 {
		s.arm(since + s.limits().idleTx)
	}
}

// serverTimes is what the watchdog reads from the held server connection.
type serverTimes struct {
	pending                                      int
	txStatus                                     byte
	busySince, queryStart, lastRecv, idleTxSince int64
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
	l := *s.limits()
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
			t = serverTimes{sc.pending, sc.txStatus, sc.busySince, sc.queryStart, sc.lastRecv.Load(), sc.idleTxSince}
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
		if l.serverResponse != 0 && t.pending > 0 && !shutting && !sc.copyIn.Load() {
			check(timeoutServerResponse, max(t.lastRecv, t.queryStart)+l.serverResponse)
		}
		if l.transaction != 0 && t.busySince != 0 {
			check(timeoutTransaction, t.busySince+l.transaction)
		}
		if l.query != 0 && t.pending > 0 {
			if w.cancelled == t.queryStart {
				// Cancel sent: give the server cancelGrace to answer.
				check(timeoutQuery, w.cancelAt+int64(cancelGrace))
			} else {
				check(timeoutQuery, t.queryStart+l.query)
			}
		}
		if l.idleTx != 0 && t.pending == 0 && t.txStatus != wire.TxIdle && t.idleTxSince != 0 {
			check(timeoutIdleTransaction, t.idleTxSince+l.idleTx)
		}
		if l.leak != 0 && t.busySince != 0 {
			if w.leakSince != t.busySince {
				w.leakSince, w.leakNext = t.busySince, t.busySince+l.leak
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
	if l.clientIdle != 0 && idleOutside {
		check(timeoutClientIdle, w.lastActive.Load()+l.clientIdle)
	}
	retryQuery := expired == timeoutQuery && w.cancelled != t.queryStart
	if retryQuery {
		w.cancelled, w.cancelAt = t.queryStart, now
		pick(now + int64(cancelGrace))
	}
	w.mu.Unlock()

	if leak {
		s.warnLeak(sc, held, t)
	}
	switch {
	case expired < 0:
	case retryQuery:
		s.queryTimeout(sc)
	default:
		s.timedOut(expired, sc)
		return // the session ends
	}
	if next != 0 {
		s.arm(next)
	}
}

// queryTimeout cancels the running query; the server's 57014 reply is
// rewritten to name query_timeout, and if no reply comes within cancelGrace
// the next fire closes the connection.
func (s *session) queryTimeout(sc *serverConn) {
	s.dbp.timeouts[timeoutQuery].Add(1)
	s.log.Warn("query_timeout reached; cancelling the query",
		zap.Duration("query_timeout", time.Duration(s.limits().query)), zap.Uint64("conn_id", sc.ID()),
		zap.String("query", s.queryText()))
	sc.mu.Lock()
	if sc.owner.Load() != s || sc.pending == 0 {
		sc.mu.Unlock()
		return
	}
	sc.cancelling = true
	sc.timeoutCancel.Store(true)
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
	var werr *wire.Error
	limit := time.Duration(s.limit(kind))
	switch kind {
	case timeoutQuery:
		werr = &wire.Error{Severity: "FATAL", Code: "57014",
			Message: fmt.Sprintf("canceling statement due to query_timeout (%s); the server did not answer the cancel request within %s, so the connection was closed", limit, cancelGrace),
			Hint:    "raise query_timeout for this database or user, or make the query faster"}
	case timeoutTransaction:
		werr = &wire.Error{Severity: "FATAL", Code: "25P04",
			Message: fmt.Sprintf("terminating connection due to transaction_timeout (%s)", limit),
			Hint:    "keep transactions shorter, or raise transaction_timeout for this database or user"}
	case timeoutIdleTransaction:
		werr = &wire.Error{Severity: "FATAL", Code: "25P03",
			Message: fmt.Sprintf("terminating connection due to idle_transaction_timeout (%s)", limit),
			Hint:    "commit or roll back promptly; an idle transaction holds a server connection and its locks"}
	case timeoutClientIdle:
		werr = &wire.Error{Severity: "FATAL", Code: "57P05",
			Message: fmt.Sprintf("terminating connection due to client_idle_timeout (%s)", limit),
			Hint:    "reconnect; raise client_idle_timeout if clients legitimately stay idle this long"}
	case timeoutServerResponse:
		werr = &wire.Error{Severity: "FATAL", Code: "08006",
			Message: fmt.Sprintf("server did not respond within server_response_timeout (%s); its connection was closed", limit),
			Hint:    "the PostgreSQL server or the network to it looks hung; check them, then reconnect"}
	}
	if kind != timeoutQuery { // counted when the query was cancelled
		s.dbp.timeouts[kind].Add(1)
	}
	fields := []zap.Field{zap.String("timeout", kind.String()), zap.Duration("limit", limit)}
	if sc != nil {
		fields = append(fields, zap.Uint64("conn_id", sc.ID()))
	}
	if kind != timeoutClientIdle {
		fields = append(fields, zap.String("query", s.queryText()))
	}
	s.log.Warn("client connection closed: timeout", fields...)
	s.setDropReason(evictTimeout)
	switch {
	case sc == nil, kind == timeoutClientIdle:
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

func (s *session) limit(kind timeoutKind) int64 {
	switch kind {
	case timeoutQuery:
		return s.limits().query
	case timeoutTransaction:
		return s.limits().transaction
	case timeoutIdleTransaction:
		return s.limits().idleTx
	case timeoutClientIdle:
		return s.limits().clientIdle
	case timeoutServerResponse:
		return s.limits().serverResponse
	}
	return 0
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
		zap.Duration("leak_detection_threshold", time.Duration(s.limits().leak)),
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
