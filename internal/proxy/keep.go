package proxy

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// What a client keeps when the server connection it holds is lost.
//
// In transaction and statement mode a client's session lives in poolerd,
// not on one backend: when the backend serving its request dies (killed,
// PostgreSQL restarted) or hangs past server_response_timeout, the client
// gets an ERROR, as for any failed statement, and keeps its connection:
//
//   - outside a transaction block, the ERROR answers the request (SQLSTATE
//     08007, transaction_resolution_unknown, if it ran a statement that may
//     have committed before the backend went away; 08006 if it ran none),
//     and the next request runs on another server connection;
//   - inside a block, the ERROR leaves the client in a failed transaction,
//     as PostgreSQL does after any error: the next server connection it
//     attaches starts with a failed block (failBlockSQL), so its statements
//     get 25P02 until ROLLBACK, and COMMIT answers ROLLBACK. Nothing of the
//     lost transaction continues anywhere.
//
// The session ends with FATAL, as a direct connection would, whenever
// keeping it could mislead: a COMMIT (or anything that may commit: END,
// PREPARE TRANSACTION, DO, CALL, a function call) was in flight inside a
// block, so the client cannot know whether its transaction committed; more
// than one request was in flight (a pipeline); the client was mid-request
// or had part of a server message; a COPY ran; the session is pinned or in
// session mode (its state was on that backend); its settings were being
// read back.
//
// keepLocked decides, on the goroutine that ends the connection (the
// server's reader, in gone): it alone relays the server's bytes, so no part
// of a response can reach the client after the ERROR that replaces it. The
// watchdog declares a server hung by closing its connection (closeHung),
// which leaves the answer to the reader too.

// failBlockSQL opens a transaction block and fails it: the server
// connection a kept client attaches after losing its block is left as the
// lost one would have been after an error (see abortSQL).
const failBlockSQL = "BEGIN; DO $poolerd$BEGIN RAISE EXCEPTION 'poolerd: the transaction was lost with its server connection'; END$poolerd$"

// keepPlan is what a client that keeps its session is told.
type keepPlan struct {
	werr   *wire.Error // the error
	answer []byte      // written now: werr and ReadyForQuery; nil when nothing is owed
}

// mayKeep reports whether the session could keep itself after losing its
// server connection: transaction or statement mode, not pinned, not ending.
func (s *session) mayKeep() bool {
	return s.stateful && s.pinReason.Load() == nil && s.endErr.Load() == nil && !s.closed.Load()
}

// noteRuns records in b that frame type t runs a statement, and whether
// that statement may commit (see sqlscan Commits). Extended-protocol
// statements are known from their Parse (held frames, tracked sessions);
// anything unknown may commit.
//
// It also keeps groupRan and groupMsgs, which say whether the
// extended-protocol request being read ran a statement so far, and how many
// messages it has (retry.go).
func (s *session) noteRuns(b *batch, t byte) {
	switch t {
	case 'Q':
		b.runs = true
		b.commits = b.commits || !s.stateful // else from its scan
		s.groupRan, s.groupMsgs = false, 0
	case 'E':
		b.runs = true
		b.commits = b.commits || s.portalCommits || !s.tracked
		s.groupRan = true
		s.groupMsgs++
	case 'F':
		b.runs, b.commits = true, true
		s.groupRan = true
		s.groupMsgs++
	case 'S':
		s.groupRan, s.groupMsgs = false, 0
	default:
		s.groupMsgs++
	}
}

// keepLocked decides whether s keeps its session now that sc, which it
// holds, is lost (sc.mu held). lostErr is the server's FATAL, if it sent
// one; limit is server_response_timeout when poolerd closed sc as hung.
// On keep, the client's statement names are put back as an error would
// leave them, s is told how to go on, lossMu is locked (kept unlocks it)
// and sc is detached from s; nil means the session ends.
func (s *session) keepLocked(sc *serverConn, lostErr *wire.Error, limit time.Duration) *keepPlan {
	if !s.mayKeep() || s.severed.Load() || s.sawFatal.Load() ||
		sc.busy || sc.unsynced || sc.midFrame || sc.clientMid || sc.copyIn.Load() ||
		sc.snapZ.Load() >= 0 || s.dirtyGen.Load() != s.cleanGen.Load() {
		return nil
	}
	owed := sc.pending - len(sc.swallowQ) // requests of the client's unanswered
	// A failed block sent ahead of the client's request and not answered
	// yet (failBlockSQL) still stands for the client: it is in a block.
	inBlock := sc.txStatus != wire.TxIdle || sc.failZ >= 0
	kp := &keepPlan{}
	switch {
	case owed > 1 || owed < 0:
		return nil // a pipeline: which of its requests ran is unknown
	case owed == 1 && inBlock && sc.commitZ > sc.zRecv:
		return nil // it may have committed: the client must not be told it failed
	case owed == 1:
		code := "08006"
		if !inBlock && sc.runZ > sc.zRecv {
			code = "08007"
		}
		kp.werr = lossError(code, inBlock, false, lostErr, limit)
		status := byte(wire.TxIdle)
		if inBlock {
			status = wire.TxFailed
		}
		kp.answer = wire.AppendReadyForQuery(kp.werr.Append(nil), status)
	case inBlock:
		// Idle in a transaction block: its next request is told.
		kp.werr = lossError("08006", true, true, lostErr, limit)
		s.owed.Store(kp.werr)
	}
	if inBlock {
		s.failedBlock.Store(true)
	}
	sc.stmtLostLocked()
	// Before the session's server is cleared: a read that finds it gone
	// waits for the answer (beginBatch).
	s.lossMu.Lock()
	sc.detachLocked(s)
	return kp
}

// kept finishes keepLocked once sc.mu is released: the client gets its
// answer before anything of a later request.
func (s *session) kept(sc *serverConn, kp *keepPlan, err error) {
	if kp.answer != nil {
		s.writeClient(kp.answer)
		s.dbp.ctr.countError(kp.werr.Code)
	}
	s.lossMu.Unlock()
	fields := []zap.Field{zap.Uint64("conn_id", sc.ID()), zap.Error(err)}
	if kp.werr != nil {
		fields = append(fields, zap.String("sqlstate", kp.werr.Code), zap.String("reason", kp.werr.Message))
	}
	s.log.Warn("server connection lost while in use; the client keeps its session", fields...)
}

// closeHung closes sc, which has not answered within server_response_timeout
// (limit): its reader's end of the connection answers the client (gone), or
// ends the session if it cannot keep it. It reports false if s no longer
// holds sc.
func (s *session) closeHung(sc *serverConn, limit time.Duration) bool {
	sc.mu.Lock()
	if sc.owner.Load() != s {
		sc.mu.Unlock()
		return false
	}
	sc.hung.Store(int64(limit))
	sc.broken = true
	sc.mu.Unlock()
	s.dbp.pool.Discard(sc, evictHung)
	return true
}

// lossError is the ERROR a client that keeps its session gets: code 08006,
// or 08007 when a statement outside a block may have committed; inBlock
// and idle say where the client was.
func lossError(code string, inBlock, idle bool, lostErr *wire.Error, limit time.Duration) *wire.Error {
	e := &wire.Error{Severity: "ERROR", Code: code, Message: "server connection lost"}
	switch {
	case limit > 0:
		e.Message = fmt.Sprintf("server did not respond within server_response_timeout (%s); its connection was closed", limit)
	case lostErr != nil:
		e.Message = "server connection lost: " + lostErr.Message
	}
	switch {
	case idle:
		e.Detail = "the server connection was lost while the transaction block was idle, and the transaction was rolled back; until ROLLBACK, statements fail with 25P02 as in any failed transaction"
		e.Hint = "roll back, then run the transaction again"
	case inBlock:
		e.Detail = "the transaction was rolled back with its server connection; until ROLLBACK, statements fail with 25P02 as in any failed transaction"
		e.Hint = "roll back, then run the transaction again"
	case code == "08007":
		e.Detail = "the statement may or may not have completed before the server connection was lost; the session is kept, and its next request runs on another server connection"
		e.Hint = "if the statement changes data, check whether it took effect before running it again"
	default:
		e.Detail = "no statement of the request ran; the session is kept, and its next request runs on another server connection"
		e.Hint = "run the request again"
	}
	if limit > 0 {
		e.Hint += "; if the server is healthy but slow, raise server_response_timeout (it must exceed the longest query)"
	}
	return e
}
