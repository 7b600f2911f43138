package txstate

import (
	"fmt"
	"time"

	"github.com/poolerd/poolerd/internal/sqlscan"
	"github.com/poolerd/poolerd/internal/wire"
)

// KeepPlan is what a client that keeps its session, after losing the
// server connection it held, is told (internal/proxy/keep.go).
type KeepPlan struct {
	Err    *wire.Error // the error
	Answer []byte      // written now: Err and ReadyForQuery; nil when nothing is owed
}

// TxShape is what a request may have done to the transaction status, from
// its statements in order (see the comment at the top of
// internal/proxy/keep.go): a set of the flags below.
type TxShape uint8

// The flags of TxShape.
const (
	// TxOpens: the last block boundary opens a block (BEGIN, START
	// TRANSACTION).
	TxOpens TxShape = 1 << iota
	// TxEnds: the last block boundary ends a block (COMMIT, END, ROLLBACK,
	// ABORT).
	TxEnds
	// TxAfterEnd: a statement ran after that end, outside any block: it
	// may have committed.
	TxAfterEnd
	// TxUnknown is the shape of text that was not read whole: it may
	// have opened a block, and run statements outside one.
	TxUnknown = TxOpens | TxAfterEnd
)

// ShapeOf is the shape of SQL text with effects e; truncated says it was
// not read whole.
func ShapeOf(e sqlscan.Effects, truncated bool) TxShape {
	switch {
	case truncated:
		return TxUnknown
	case e.BeginTx:
		return TxOpens
	case e.AfterEndTx:
		return TxEnds | TxAfterEnd
	case e.EndTx:
		return TxEnds
	}
	return 0
}

// Then is the shape of a request of shape a that runs statements of shape
// b next.
func (a TxShape) Then(b TxShape) TxShape {
	switch {
	case b&(TxOpens|TxEnds) != 0:
		return b // b's last boundary is the request's
	case a&TxEnds != 0:
		return a | TxAfterEnd // b runs after a's end
	}
	return a
}

// LossError is the ERROR a client that keeps its session gets: code 08006,
// or 08007 when a statement outside a block may have committed; inBlock
// and idle say where the client was, opened that its request, outside a
// block, may have opened one; lostErr is the server's FATAL, if it sent
// one, and limit server_response_timeout when poolerd closed the
// connection as hung.
func LossError(code string, inBlock, opened, idle bool, lostErr *wire.Error, limit time.Duration) *wire.Error {
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
	case opened:
		e.Detail = "the request opened a transaction block, which was rolled back with its server connection; until ROLLBACK, statements fail with 25P02 as in any failed transaction"
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
