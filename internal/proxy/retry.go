package proxy

import (
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// Retrying the prepare step of a statement answered from the cache.
//
// A client's Parse of a statement its server connection already has is
// answered from the cache (prepared.go): the server gets a scratch Parse,
// and the client's next Bind or Describe uses the definition prepared
// earlier, perhaps by another client, perhaps before a migration. If the
// schema changed since, PostgreSQL rejects that definition (0A000 cached
// plan must not change result type, XX000 cache lookup failed for type,
// 42P01 or 42704 after a rename, 26000 if the server lost it) where the
// client's own fresh Parse would have succeeded.
//
// poolerd then does what the client's Parse would have done: it closes the
// stale definition on that server, prepares it again and sends the rest of
// the request again, and the client sees only the answers to the retry.
// Only the prepare step is retried, and only when nothing else can have
// run: nothing of the request ran before the client's Parse (no Execute,
// FunctionCall or Query in its Sync group before it), the error is the
// server's first answer after the cache hit's scratch Close but for a
// ParameterDescription (held back until the next answer shows whether
// there is a retry), so it answers the Bind or Describe that followed the
// client's Parse, before any Execute; nothing else of the request was
// undone; it ran outside a transaction block (an error inside one has
// failed the block); and it is the only request in flight.
//
// The session keeps what the client sent after the scratch Close (replay,
// at most maxReplay bytes). A request that ended with its Sync is sent
// again at the ReadyForQuery that ends the failed one (resend); one the
// client is still sending, waiting for answers after a Flush (asyncpg
// prepares with Parse, Describe, Flush), is sent again at once behind a
// Sync of poolerd's own, whose answer is swallowed (resendOpen). A retry
// that fails again reaches the client as is; there is no second.

// maxReplay bounds the part of a request kept for a retry.
const maxReplay = 64 << 10

// retryableStale reports whether an error answering a statement from the
// cache may come from its being stale.
func retryableStale(code, msg string) bool {
	switch code {
	case "0A000", "XX000":
		return staleStatementError(code, msg)
	case "26000", "42704", "42P01", "42703", "42883":
		return true
	}
	return false
}

// holdForRetry is called at the end of an ErrorResponse that is the
// server's first answer after a cache hit's scratch Close. If a retry is
// possible, it sends it at once (a request the client is still sending) or
// keeps the error (retryErr) for the client in case the retry cannot be
// sent at the ReadyForQuery, and reports true: the error is not the
// client's. Reader goroutine.
func (sc *serverConn) holdForRetry(own *session, code, msg string) bool {
	if !retryableStale(code, msg) || sc.cur.Truncated() {
		return false
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.replayZ != sc.zRecv || !sc.replayStart && sc.replayDef != sc.hitDef || len(sc.replay) == 0 {
		return false
	}
	if sc.replayOpen && !sc.resendOpenLocked(own) {
		return false
	}
	if staleStatementError(code, msg) {
		sc.dbp.stmtEpoch.Add(1) // the other connections' copies are stale too
	}
	if !sc.replayOpen {
		sc.retryErr = appendFrame(nil, 'E', sc.cur.Body())
		sc.retry = true
	}
	return true
}

// resend sends the failed request again, with the stale statement closed
// and prepared anew, at the ReadyForQuery (status) that ended it, and
// reports whether it did. Reader goroutine.
func (sc *serverConn) resend(own *session, status byte) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if status != wire.TxIdle || sc.zSent != sc.zRecv+1 || sc.unsynced || !sc.canResendLocked(own) {
		sc.dropReplayLocked()
		return false
	}
	sc.sendRetryLocked(own, nil)
	return true
}

// resendOpenLocked retries a request the client is still sending: the
// server skips what it was sent up to a Sync, so poolerd sends one of its
// own (answer swallowed), then the retry; the client's next messages
// follow it. sc.mu held; reader goroutine.
func (sc *serverConn) resendOpenLocked(own *session) bool {
	if sc.txStatus != wire.TxIdle || sc.zSent != sc.zRecv || !sc.unsynced || !sc.canResendLocked(own) {
		sc.dropReplayLocked()
		return false
	}
	sc.pending++
	sc.swallowGroupLocked(sc.zSent)
	sc.zSent++
	sc.sendRetryLocked(own, []byte{'S', 0, 0, 0, 4})
	return true
}

// canResendLocked reports whether sc, held by own, may be written by its
// reader now: nobody is assembling a batch for it.
func (sc *serverConn) canResendLocked(own *session) bool {
	return own != nil && sc.owner.Load() == own && !sc.busy && !sc.broken && sc.replayDef != nil && len(sc.replay) > 0
}

// sendRetryLocked writes prefix, a Close and a Parse of the stale
// definition (answers swallowed) and the replay, as part of response group
// sc.zSent (a new one if the replay ends with its Sync).
func (sc *serverConn) sendRetryLocked(own *session, prefix []byte) {
	def, replay := sc.replayDef, sc.replay
	sc.dropReplayLocked()
	msg := append(prefix, appendFrame(nil, 'C', append(append([]byte{'S'}, def.name...), 0))...)
	msg = append(msg, def.parse...)
	z := sc.zSent
	sc.stq.push(stmtOp{zseq: z, kind: opEvict, close: true, swallow: true, name: def.name})
	sc.stq.push(stmtOp{zseq: z, kind: opInject, swallow: true, def: def})
	sc.nops.Add(2)
	sc.stmts.Add(def.name)
	if !sc.replayOpen {
		sc.pending++
		sc.zSent++
	}
	own.dbp.ctr.serverParses.Add(1)
	sc.log.Info("prepared statement answered from the cache was stale after a schema change; prepared it again and sent the request again",
		zap.Uint64("conn_id", sc.ID()), zap.String("statement", def.name))
	if err := sc.write2(msg, replay, sc.yieldFn); err != nil {
		// The reader sees the connection end, and answers the client
		// as for any lost request.
		sc.broken = true
	}
}

// holdDescription holds back a ParameterDescription that follows a cache
// hit's scratch Close (retry.go): if the next answer is an error that is
// retried, the client gets the retry's instead. Reader goroutine.
func (sc *serverConn) holdDescription() {
	sc.heldT = appendFrame(sc.heldT[:0], 't', sc.cur.Body())
}

// keepReplayLocked keeps, for a retry, what the batch being flushed sent
// after a cache hit's scratch Close (data from s.replayAt on), if that is
// the rest of one request or all of the request sent so far; base numbers
// the batch's first response group (sc.mu held).
func (s *session) keepReplayLocked(sc *serverConn, data []byte, b batch, base int64) {
	if sc.replayOpen && sc.replayZ == base && sc.replay != nil {
		// The request kept continues in this batch: what the kept part
		// misses may already be on its way.
		sc.dropReplayLocked()
	}
	if !s.replayOn {
		return
	}
	s.replayOn = false
	def, start := s.hitDef, s.hitStart
	s.hitDef, s.hitStart = nil, false
	open := b.unsynced && b.reqs == s.hitZB
	if !s.obOn || len(data)-s.replayAt > maxReplay || s.replayAt > len(data) ||
		!open && (b.unsynced || b.reqs-s.hitZB != 1) {
		return
	}
	sc.replay = append(sc.replay[:0], data[s.replayAt:]...)
	sc.replayZ = base + int64(s.hitZB)
	sc.replayDef = def
	sc.replayOpen = open
	sc.replayStart = start
	if start {
		sc.replayStartZ.Store(sc.replayZ)
	}
}

// dropReplayLocked forgets the kept request (sc.mu held).
func (sc *serverConn) dropReplayLocked() {
	sc.replay, sc.replayDef = nil, nil
	sc.replayStartZ.Store(-1)
}

// maxCacheHits bounds the statements a session remembers it got from the
// cache and has not used yet.
const maxCacheHits = 64

// noteCacheHit remembers that the client's Parse of name was answered from
// the cache: its first Bind or Describe in a later request may meet a stale
// definition (noteFirstUse).
func (s *session) noteCacheHit(name string, def *stmtDef) {
	if s.cacheHits == nil {
		s.cacheHits = map[string]*stmtDef{}
	}
	if len(s.cacheHits) < maxCacheHits {
		s.cacheHits[name] = def
	}
}

// noteFirstUse is called for a Bind or Describe of the client's statement
// name (definition def, place zb in the batch): if it is the statement's
// first use since its Parse was answered from the cache, and the first
// message of its request, the request from here on is kept for a retry.
func (s *session) noteFirstUse(sc *serverConn, name string, def *stmtDef, zb int) {
	if len(s.cacheHits) == 0 || s.cacheHits[name] != def {
		return
	}
	delete(s.cacheHits, name)
	if s.hitDef != nil || s.groupRan || s.groupMsgs != 1 {
		return
	}
	sc.mu.Lock()
	has := sc.stmts.Has(def.name) // else it is prepared afresh
	sc.mu.Unlock()
	if has {
		s.hitDef, s.hitZB, s.hitStart = def, zb, true
	}
}
