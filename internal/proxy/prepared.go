package proxy

import (
	"container/list"
	"encoding/binary"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// Protocol-level named prepared statements in transaction and statement
// mode.
//
// A client's statement names live in its session (session.stmts), mapped to
// statement definitions shared by every client that prepared the same text
// with the same parameter types and search_path (stmtRegistry). A definition
// has a server-side name, poolerd_s<N>. Each server connection remembers,
// least recently used last, which definitions are prepared on it
// (txstate.ServerStmts). When a client's Bind or Describe names a statement its
// current server does not have, poolerd sends the definition's Parse first and
// swallows its ParseComplete.
//
// Every response poolerd must swallow, and every mapping that a server-side
// error must undo, is an entry of the server connection's queue (stmtOp), in
// the order the messages were sent. Parse and Close are the only messages
// whose responses poolerd consumes (ParseComplete, CloseComplete), so they are
// the entries; each records how many ReadyForQuery-producing messages (Sync,
// Query, FunctionCall) were sent before it, which places it in a Sync group.
// An ErrorResponse makes PostgreSQL skip the rest of its group: the entries of
// that group still queued never ran, and their effects are undone, the
// latest first. Entries the client sent after its group's error arrived
// (the rest of a pipeline written after the client read the error) are
// undone at the ReadyForQuery that ends the group.
//
// The rule for a server connection's list of prepared definitions
// (sc.stmts) and a session's names (session.stmts): a Parse, injected Parse,
// eviction or Close is recorded when it is sent, and it stands once the
// server answers it; if its group's error makes the server skip it, it is
// undone before anything of a later group is answered (stmtFailed,
// stmtGroupEnded). What a later group of the same pipeline decides from
// such a record (a cache hit, an injected Parse or none, a name's meaning)
// would be wrong if the earlier group is skipped, so a frame that relies on
// a record an earlier group has not had answered waits for the answers
// first (session.unresolved). Every place that adds to sc.stmts keeps this:
// stmtFrame's client Parse (opClientParse), ensurePrepared (opInject),
// sendRetryLocked (opInject), the undo of an eviction (opEvict) and the
// undo of a DEALLOCATE (qUndo).
//
// poolerd never invents a response: a client's Parse of a statement already
// prepared on the server is sent as a Parse of an empty statement under a
// scratch name (and a swallowed Close of it), and a client's Close is sent as
// a Close of the client's own name, which the server does not have. The
// server's answers then arrive exactly where a direct connection's would,
// errors included.

// nopStatement is the scratch statement name of a client Parse answered from
// the cache.
const nopStatement = "poolerd_nop"

// stmtDef is one statement definition.
type stmtDef struct {
	name  string // server-side name
	key   string // search_path, query and parameter types
	parse []byte // the Parse frame that prepares it under name
	refs  int    // client mappings (registry mutex)
	// unused is its place in the registry's list of definitions no client
	// maps (nil while mapped).
	unused *list.Element
	// eff is what running the statement does to a session, read from its
	// text when the definition is made (never changed after); custom
	// lists the customized options (a.b) the text names, when it may
	// change settings. Every Bind of the statement applies them again.
	eff    txstate.StmtEffects
	custom []string
	// txExit: the statement ends a transaction (COMMIT, END, ROLLBACK,
	// ABORT, ROLLBACK TO SAVEPOINT, PREPARE TRANSACTION), which
	// PostgreSQL parses even in a failed transaction block.
	txExit bool
}

// maxUnusedStmts is how many definitions no client maps the registry keeps,
// so that clients that come and go (a web worker per request) still find
// the statements their predecessors prepared on the servers.
const maxUnusedStmts = 10000

// stmtRegistry deduplicates statement definitions across clients.
type stmtRegistry struct {
	mu     sync.Mutex
	byKey  map[string]*stmtDef
	unused list.List // of *stmtDef, least recently released last
	next   uint64
}

func newStmtRegistry() *stmtRegistry { return &stmtRegistry{byKey: map[string]*stmtDef{}} }

// useLocked counts a new mapping of d.
func (r *stmtRegistry) useLocked(d *stmtDef) {
	d.refs++
	if d.unused != nil {
		r.unused.Remove(d.unused)
		d.unused = nil
	}
}

// acquire returns the definition of rest (a Parse body after the statement
// name: query, NUL, parameter types) for a client whose search_path is
// searchPath, with one more reference.
func (r *stmtRegistry) acquire(searchPath string, rest []byte) *stmtDef {
	key := txstate.StmtKey(searchPath, rest)
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.byKey[string(key)]; d != nil {
		r.useLocked(d)
		return d
	}
	r.next++
	name := "poolerd_s" + strconv.FormatUint(r.next, 10)
	frame := make([]byte, wire.HeaderLen, wire.HeaderLen+len(name)+1+len(rest))
	frame[0] = 'P'
	frame = append(append(append(frame, name...), 0), rest...)
	binary.BigEndian.PutUint32(frame[1:], uint32(len(frame)-1))
	d := &stmtDef{name: name, key: string(key), parse: frame, refs: 1}
	d.eff, d.custom = txstate.TextEffects(rest)
	d.txExit = txstate.TxExitStmt(rest)
	r.byKey[d.key] = d
	return d
}

// lookup returns the definition of rest for searchPath if there is one,
// without a reference.
func (r *stmtRegistry) lookup(searchPath string, rest []byte) *stmtDef {
	key := txstate.StmtKey(searchPath, rest)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[string(key)]
}

// retain adds a reference to d (a mapping restored after an error).
func (r *stmtRegistry) retain(d *stmtDef) {
	r.mu.Lock()
	r.useLocked(d)
	if r.byKey[d.key] == nil {
		r.byKey[d.key] = d
	}
	r.mu.Unlock()
}

// release drops a reference. A definition nobody maps is kept among the
// last maxUnusedStmts such, then forgotten (server connections that have it
// keep it until their LRU closes it).
func (r *stmtRegistry) release(d *stmtDef) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d.refs--
	if d.refs > 0 || d.unused != nil || r.byKey[d.key] != d {
		return
	}
	d.unused = r.unused.PushFront(d)
	for r.unused.Len() > maxUnusedStmts {
		old := r.unused.Remove(r.unused.Back()).(*stmtDef)
		old.unused = nil
		delete(r.byKey, old.key)
	}
}

// opKind says what undoing a queue entry means.
type opKind uint8

const (
	opPlain         opKind = iota // a client's Parse or Close passed through as is
	opClientParse                 // a client's Parse sent under a definition's name
	opCacheHit                    // a client's Parse answered by the scratch statement
	opNopClose                    // the swallowed Close of the scratch statement
	opInject                      // poolerd's Parse of a definition the server lacked
	opEvict                       // poolerd's Close of a definition the LRU evicted
	opClientClose                 // a client's Close of a mapped statement
	opDuplicate                   // a client's Parse of a name it already has
	opInjectUnnamed               // poolerd's Parse of the client's unnamed statement
	opSwallowClose                // poolerd's Close of another client's unnamed statement
	opClientUnnamed               // a client's Parse of the unnamed statement
)

// stmtOp is one queue entry: a Parse or Close sent to the server.
type stmtOp struct {
	zseq    int64 // ReadyForQuery-producing messages sent before it
	kind    opKind
	close   bool // answered by CloseComplete (else ParseComplete)
	swallow bool // the answer is poolerd's, not the client's
	ran     bool // opNopClose: the scratch Parse ran, so this Close must
	sess    *session
	client  string   // the client's statement name
	name    string   // opEvict: the server-side name closed
	gen     uint64   // opClientUnnamed: the session's unnamedGen for it
	def     *stmtDef // the definition concerned
	// drops are the DEALLOCATE ALL / DISCARD ALL sent after this entry
	// while it was unanswered (opClientParse, opInject): if the server
	// skips the entry, none of them may list its definition again when
	// it is undone in turn (dropped.undo).
	drops []*dropped
}

// dropped is what a DEALLOCATE ALL or DISCARD ALL of session sess took
// from a connection's list of prepared definitions when it was sent: names,
// in LRU order, and gone, those a Parse still unanswered then had added and
// the server then skipped, which its undo must not list again; goneClient,
// likewise, the client's statement names such a Parse (or a cache hit
// answering one) had mapped, which its undo must not map again.
type dropped struct {
	sess       *session
	names      []string
	gone       map[string]bool
	goneClient map[string]bool
}

// undo lists again, if the statement failed or was skipped, what it took,
// but what a skipped Parse had added. Called with sc.mu held.
func (d *dropped) undo(sc *serverConn) {
	for _, name := range d.names {
		if !d.gone[name] {
			sc.stmts.Add(name)
		}
	}
}

// stmtQueue is a FIFO of stmtOp.
type stmtQueue struct {
	ops  []stmtOp
	head int
}

func (q *stmtQueue) len() int { return len(q.ops) - q.head }

func (q *stmtQueue) push(op stmtOp) { q.ops = append(q.ops, op) }

func (q *stmtQueue) front() *stmtOp { return &q.ops[q.head] }

func (q *stmtQueue) pop() stmtOp {
	op := q.ops[q.head]
	q.ops[q.head] = stmtOp{}
	q.head++
	if q.head == len(q.ops) {
		q.ops, q.head = q.ops[:0], 0
	}
	return op
}

// stmtAnswered pops the queue entry that a ParseComplete ('1') or
// CloseComplete ('3') answers, and reports whether the frame is poolerd's to
// swallow. Reader goroutine.
func (sc *serverConn) stmtAnswered(typ byte) (swallow bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.stq.len() == 0 {
		return false
	}
	op := sc.stq.pop()
	sc.nops.Add(-1)
	if op.close != (typ == '3') {
		// The queue and the server disagree: nothing about this
		// connection is provable any more.
		sc.broken = true
		sc.log.Warn("prepared statement tracking lost step with the server; the connection will be closed",
			zap.String("got", string(rune(typ))), zap.Uint64("conn_id", sc.ID()))
		return false
	}
	if op.kind == opCacheHit && sc.stq.len() > 0 && sc.stq.front().kind == opNopClose {
		sc.stq.front().ran = true
	}
	switch op.kind {
	case opCacheHit:
		sc.hitDef = op.def
	case opNopClose:
		// What the server answers next may be the first error of a
		// statement answered from the cache (retry.go).
		sc.afterHit = sc.hitDef != nil
	default:
		sc.hitDef = nil
	}
	return op.swallow
}

// stmtFailed undoes the queue entries that an ErrorResponse made the server
// skip: those of the Sync group now running. It returns the client's name of
// a duplicate-name Parse among them, for the error rewrite, and how many it
// undid. Reader goroutine.
func (sc *serverConn) stmtFailed() (dupClient, dupServer string, undone int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i := sc.stq.head; i < len(sc.stq.ops) && sc.stq.ops[i].zseq <= sc.zRecv; i++ {
		if op := &sc.stq.ops[i]; op.kind == opDuplicate {
			dupClient, dupServer = op.client, op.def.name
			break
		}
	}
	return dupClient, dupServer, sc.stmtSkippedLocked()
}

// stmtGroupEnded is called at the ReadyForQuery that ends Sync group zRecv:
// an entry of the group still queued was sent after the group's error had
// arrived (the client sent the rest of its pipeline after reading the
// error), and the server skipped it as it did the others. Reader goroutine.
func (sc *serverConn) stmtGroupEnded() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.stmtSkippedLocked()
}

// stmtSkippedLocked pops the queue entries of the groups up to zRecv, which
// the server skipped, and undoes them, the latest first: each undo then
// finds the state its entry left (a Close and a Parse of one name, an
// eviction and a Parse of one definition, put back in the order they were
// made). It returns how many it undid.
func (sc *serverConn) stmtSkippedLocked() int {
	n := 0
	for i := sc.stq.head; i < len(sc.stq.ops) && sc.stq.ops[i].zseq <= sc.zRecv; i++ {
		n++
	}
	if n == 0 {
		return 0
	}
	for i := sc.stq.head + n - 1; i >= sc.stq.head; i-- {
		sc.undoOpLocked(sc.stq.ops[i])
	}
	for range n {
		sc.stq.pop()
	}
	sc.nops.Add(-int32(n))
	return n
}

// stmtLostLocked undoes every queue entry and pending qUndo: the connection
// was lost before the server answered them, and its client keeps its
// session (keep.go), with the statement names a direct connection's error
// would have left it.
func (sc *serverConn) stmtLostLocked() {
	for i := len(sc.stq.ops) - 1; i >= sc.stq.head; i-- {
		sc.undoOpLocked(sc.stq.ops[i])
	}
	for sc.stq.len() > 0 {
		sc.stq.pop()
	}
	sc.nops.Store(0)
	for _, u := range sc.qundo {
		if u.undo != nil {
			u.undo(sc)
		}
	}
	clear(sc.qundo)
	sc.qundo = sc.qundo[:0]
	sc.nqundo.Store(0)
}

// undoOpLocked undoes the effect of a queue entry the server skipped.
func (sc *serverConn) undoOpLocked(op stmtOp) {
	switch op.kind {
	case opClientParse:
		op.sess.unmapStatement(op.client, op.def)
		sc.stmts.Remove(op.def.name)
		op.forgetInDrops()
	case opCacheHit:
		op.sess.unmapStatement(op.client, op.def)
		op.forgetInDrops()
	case opInject:
		sc.stmts.Remove(op.def.name)
		op.forgetInDrops()
	case opNopClose:
		if op.ran {
			sc.broken = true // the scratch statement stays on the server
		}
	case opEvict:
		sc.stmts.Add(op.name) // still prepared: list it again
	case opClientClose:
		op.sess.remapStatement(op.client, op.def)
	case opInjectUnnamed, opSwallowClose:
		sc.unnamedBy = nil // whose unnamed statement the server has is unknown
	case opClientUnnamed:
		// PostgreSQL drops the unnamed statement before it parses the new
		// one: after a failed Parse there is none. (After a skipped one
		// the client's earlier one would remain; poolerd forgets that too.)
		op.sess.unnamedVoid.Store(uint32(op.gen))
		sc.unnamedBy = nil
	}
}

// forgetInDrops tells the drops sent after a skipped Parse that its
// definition is not on the server (opClientParse, opInject) and that its
// client's name maps nothing (opClientParse, opCacheHit).
func (op *stmtOp) forgetInDrops() {
	for _, d := range op.drops {
		if op.kind != opCacheHit {
			if d.gone == nil {
				d.gone = map[string]bool{}
			}
			d.gone[op.def.name] = true
		}
		if op.kind != opInject && op.sess == d.sess {
			if d.goneClient == nil {
				d.goneClient = map[string]bool{}
			}
			d.goneClient[op.client] = true
		}
	}
}

// qCommitted runs the commit of the first pending qUndo of the running
// group whose tag is the CommandComplete tag tag. Reader goroutine.
func (sc *serverConn) qCommitted(tag string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i, u := range sc.qundo {
		if u.zseq != sc.zRecv {
			continue
		}
		if u.tag == tag {
			sc.qundo = append(sc.qundo[:i], sc.qundo[i+1:]...)
			sc.nqundo.Add(-1)
			if u.commit != nil {
				u.commit()
			}
			return
		}
	}
}

// qFailed undoes the pending qUndo of the running group: an error ended
// its query before their statements ran. Reader goroutine.
func (sc *serverConn) qFailed() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	kept := sc.qundo[:0]
	for _, u := range sc.qundo {
		if u.zseq == sc.zRecv {
			if u.undo != nil {
				u.undo(sc)
			}
			continue
		}
		kept = append(kept, u)
	}
	clear(sc.qundo[len(kept):])
	sc.qundo = kept
	sc.nqundo.Store(int32(len(kept)))
}

// qDone commits what remains of the pending qUndo of groups answered by
// now (zRecv groups). Reader goroutine.
func (sc *serverConn) qDone() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	kept := sc.qundo[:0]
	for _, u := range sc.qundo {
		if u.zseq <= sc.zRecv {
			if u.commit != nil {
				u.commit()
			}
			continue
		}
		kept = append(kept, u)
	}
	clear(sc.qundo[len(kept):])
	sc.qundo = kept
	sc.nqundo.Store(int32(len(kept)))
}
