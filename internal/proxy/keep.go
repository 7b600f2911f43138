package proxy

import (
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/txstate"
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
// A request can change the transaction status it started in, so the
// decision looks at what the lost request may have done (txstate.TxShape), not only
// at that status. From the request's statements in order (a simple Query's
// text; for the extended protocol, the statement each Execute of the Sync
// group runs, known from its Bind, or, with max_prepared_statements 0,
// from the group's latest Parse; there every Execute may commit, its
// statement not being known for sure):
//
//   - opens: its last block boundary is BEGIN or START TRANSACTION: when
//     it completes, the client is in a block. Statements before that BEGIN
//     in the same Query or Sync group are part of the block (PostgreSQL
//     folds an implicit transaction into a BEGIN that follows).
//   - may commit: a statement that may commit (sqlscan Commits: COMMIT,
//     END, COMMIT AND CHAIN, PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED,
//     DO, CALL; any FunctionCall), or a statement after a block end that
//     no BEGIN follows in the request (ROLLBACK; INSERT: the INSERT runs,
//     and commits, outside any block; in ROLLBACK; INSERT; BEGIN the
//     INSERT is part of the new block), or a text not read whole.
//
// With the status s at the start (idle, or in a block, failed or not):
//
//	s       opens  may commit  the client gets
//	idle    no     -           08007 (08006 if nothing ran), idle
//	idle    yes    no          08006, a failed block
//	idle    yes    yes         FATAL
//	block   -      no          08006, a failed block
//	block   -      yes         FATAL
//
// So a request that may have opened a block leaves the client in a failed
// block, the loss its first error, exactly as one inside a block does: its
// next statements get 25P02 and its COMMIT answers ROLLBACK, never running
// on their own. Outside a block a request that ends outside one (BEGIN;
// INSERT; ROLLBACK, or plain autocommit statements) leaves the client idle,
// with 08007 whenever a statement ran. Unread text counts as opening and
// committing: FATAL.
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

// textShape is the shape of the Query or Parse just scanned (s.eff).
func (s *session) textShape() txstate.TxShape { return txstate.ShapeOf(s.eff, s.cur.Truncated()) }

// noteShape records in b what the Query or Parse of type t just scanned
// may do to the transaction status: a Query's text is its request's
// shape; a Parse of a session that does not map statements (Binds are
// not read) gives the shape of the Executes that follow it.
func (s *session) noteShape(b *batch, t byte) {
	switch {
	case t == 'Q':
		sh := s.textShape()
		b.opens = b.opens || sh&txstate.TxOpens != 0
		b.commits = b.commits || sh&txstate.TxAfterEnd != 0
	case t == 'P' && !s.tracked:
		s.bindTx = s.textShape()
	}
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
// messages it has (retry.go), and grpTx, the shape of its Executes so far
// (each runs the statement of the latest Bind, bindTx); its Sync records
// that shape in b (a simple Query's comes from its scan, noteShape).
func (s *session) noteRuns(b *batch, t byte) {
	switch t {
	case 'Q':
		b.runs = true
		b.commits = b.commits || !s.stateful // else from its scan
		s.groupRan, s.groupMsgs = false, 0
		s.grpTx = 0
	case 'E':
		b.runs = true
		b.commits = b.commits || s.portalCommits || !s.tracked
		s.groupRan = true
		s.groupMsgs++
		s.grpTx = s.grpTx.Then(s.bindTx)
		if s.bindDrop != txstate.DropNone && s.tracked {
			if sc := s.server.Load(); sc != nil {
				s.dropStatements(sc, s.bindDrop, b.reqs)
			}
		}
	case 'F':
		b.runs, b.commits = true, true
		s.groupRan = true
		s.groupMsgs++
	case 'S':
		s.groupRan, s.groupMsgs = false, 0
		b.opens = b.opens || s.grpTx&txstate.TxOpens != 0
		b.commits = b.commits || s.grpTx&txstate.TxAfterEnd != 0
		s.grpTx = 0
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
func (s *session) keepLocked(sc *serverConn, lostErr *wire.Error, limit time.Duration) *txstate.KeepPlan {
	if !s.mayKeep() || s.severed.Load() || s.sawFatal.Load() ||
		sc.busy || sc.unsynced || sc.midFrame || sc.clientMid || sc.copyIn.Load() ||
		sc.snapZ.Load() >= 0 || s.dirtyGen.Load() != s.cleanGen.Load() {
		return nil
	}
	owed := sc.pending - len(sc.swallowQ) // requests of the client's unanswered
	// A failed block sent ahead of the client's request and not answered
	// yet (failBlockSQL) still stands for the client: it is in a block.
	inBlock := sc.txStatus != wire.TxIdle || sc.failZ >= 0
	// opens: the request in flight may have opened a block itself.
	opens := owed == 1 && !inBlock && sc.openZ > sc.zRecv
	failed := inBlock || opens // the client is left in a failed block
	kp := &txstate.KeepPlan{}
	switch {
	case owed > 1 || owed < 0:
		return nil // a pipeline: which of its requests ran is unknown
	case owed == 1 && failed && sc.commitZ > sc.zRecv:
		return nil // it may have committed: the client must not be told it failed
	case owed == 1:
		code := "08006"
		if !failed && sc.runZ > sc.zRecv {
			code = "08007"
		}
		kp.Err = txstate.LossError(code, inBlock, opens, false, lostErr, limit)
		status := byte(wire.TxIdle)
		if failed {
			status = wire.TxFailed
		}
		kp.Answer = wire.AppendReadyForQuery(kp.Err.Append(nil), status)
	case inBlock:
		// Idle in a transaction block: its next request is told.
		kp.Err = txstate.LossError("08006", true, false, true, lostErr, limit)
		s.owed.Store(kp.Err)
	}
	if failed {
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
func (s *session) kept(sc *serverConn, kp *txstate.KeepPlan, err error) {
	if kp.Answer != nil {
		s.writeClient(kp.Answer)
		s.dbp.ctr.countError(kp.Err.Code)
	}
	s.lossMu.Unlock()
	fields := []zap.Field{zap.Uint64("conn_id", sc.ID()), zap.Error(err)}
	if kp.Err != nil {
		fields = append(fields, zap.String("sqlstate", kp.Err.Code), zap.String("reason", kp.Err.Message))
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
