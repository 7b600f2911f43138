package proxy

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"unsafe"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/sqlscan"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// What a transaction- or statement-mode client's session holds beyond its
// current server connection: its prepared statements (prepared.go), its
// settings, and the state that pins it to one server connection.

// roleCheck: no client of a transaction- or statement-mode pool may run
// as a role that another client set. Three defences, cheapest first:
//
//   - The scanner pins every SQL spelling of a session-level role or
//     session authorization change it can see (sqlscan.PinRole), so the
//     client keeps its connection, and the connection gets DISCARD ALL when
//     the client leaves.
//   - What it cannot see (DO, CALL, set_config with computed arguments,
//     text longer than txstate.MaxScan) counts as a settings change: the settings
//     snapshot at the end of the transaction, which runs anyway, also asks
//     whether current_user is session_user (snapRoleRow), and pins the
//     client if not. A ParameterStatus session_authorization or
//     is_superuser other than the login's, in the client's own answers,
//     pins it too; a connection whose session_authorization is not the
//     login's is never handed out (authOff).
//   - A function the text calls by name (other than common built-ins,
//     sqlscan Calls) or by OID (FunctionCall), a DO block, or set_config
//     with a name the text does not show may run SET ROLE or set a
//     customized option (myapp.tenant) that no query can list and so no
//     snapshot can read: the server connection remembers the client
//     (serverConn.roleBy), and the next other client to get it has RESET
//     ROLE and RESET ALL (resetQueryLocked) sent ahead of its first
//     request, in the same write, the answer swallowed: no round trip, and
//     only after such calls. The client that called the function is not
//     pinned: it may lose that role or option at its next transaction,
//     but no one else gets it.
//
// Not tracked: a role set by code a statement runs without naming it (a
// trigger, a rule, a view's or a policy's function, a column default, a
// user-defined operator or cast), or by a function that shadows a
// built-in's name.
//
// resetQueryLocked returns that reset, one Query: RESET ROLE; RESET ALL
// (PostgreSQL lists no customized option that a function set under a name
// no text shows, so only RESET ALL clears them), then the reported
// parameters set back to the values sc.params holds, so that sc.params
// stays true; sc.applied is forgotten, so that the parameter sync that
// follows sets the next client's settings again. Called with sc.mu held.
func resetQueryLocked(sc *serverConn) []byte {
	q := resetSQL
	var keep []txstate.Param
	for name, value := range sc.params {
		if txstate.SyncedParam(name) {
			keep = append(keep, txstate.Param{Name: name, Value: value})
		}
	}
	if len(keep) > 0 {
		sort.Slice(keep, func(i, j int) bool { return keep[i].Name < keep[j].Name })
		q += "; " + txstate.SetConfigSQL(keep)
	}
	clear(sc.applied)
	sc.paramGen++
	return wire.AppendQuery(nil, q)
}

// resetSQL starts every reset query.
const resetSQL = "RESET ROLE; RESET ALL"

// maxHeldQuery is the largest Query poolerd holds until complete in
// transaction and statement mode, so that it can rewrite or refuse it;
// longer ones are forwarded as they arrive and scanned up to txstate.MaxScan.
const maxHeldQuery = 8 << 10

// heldFrame reports whether a frame of type t is held until complete.
func (s *session) heldFrame(t byte, n int) bool {
	switch t {
	case 'P', 'D', 'C':
		return s.tracked
	case 'B':
		return s.tracked || s.stateful && len(s.rawEff) > 0
	case 'Q':
		return s.stateful && n <= maxHeldQuery
	}
	return false
}

// emit appends p to what replaces the held frame (s.fo). A held frame for
// which nothing is emitted goes to the server unchanged.
func (s *session) emit(p ...[]byte) {
	for _, b := range p {
		s.fo = append(s.fo, b...)
	}
}

// emitFrame emits a frame of type t with body parts.
func (s *session) emitFrame(t byte, parts ...[]byte) {
	n := 4
	for _, p := range parts {
		n += len(p)
	}
	s.fo = append(s.fo, t, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	s.emit(parts...)
}

// cstring splits a NUL-terminated string off the front of b.
func cstring(b []byte) (string, []byte, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", nil, false
	}
	return string(b[:i]), b[i+1:], true
}

var nul = []byte{0}

// nopQuery is the text of the scratch statement (NUL-terminated): one whose
// Parse PostgreSQL refuses in a failed transaction block, as it refuses the
// client's own, and whose parse analysis takes no snapshot. A SELECT's
// takes the transaction's snapshot: the client's BEGIN ISOLATION LEVEL or
// SET TRANSACTION right after it then failed (25001, "must be called before
// any query"), where a direct connection runs it.
var nopQuery = []byte("SHOW search_path\x00")

// pushOp records a queue entry of the batch; zb is the number of
// ReadyForQuery-producing messages before it in the batch.
func (s *session) pushOp(op stmtOp, zb int) {
	op.zseq = int64(zb)
	op.sess = s
	s.bops = append(s.bops, op)
}

// stmtFrame handles a complete Parse, Bind, Describe or Close of a client in
// transaction or statement mode: it appends what the server must get to the
// batch and records the queue entries. zb places it in the batch.
func (s *session) stmtFrame(sc *serverConn, t byte, body []byte, zb int) {
	m := &s.dbp.ctr
	switch t {
	case 'P':
		// The counters count named statements only, as PgBouncer's
		// (SHOW STATS *_parse_count, *_bind_count): an unnamed one is
		// the client's own business on every request.
		name, rest, ok := cstring(body)
		if !ok || name == "" {
			// Kept, so that a Bind in a later request finds it on
			// whichever server connection the client has then.
			s.unnamedGen++
			s.unnamedVoid.Store(uint32(s.unnamedGen) - 1) // not void, until the server fails or skips it
			s.unnamed = appendFrame(s.unnamed[:0], 'P', body)
			s.unnamedEff = txstate.EffectsOf(s.eff, s.cur.Truncated())
			sc.mu.Lock()
			sc.unnamedBy, sc.unnamedGen = s, s.unnamedGen
			sc.mu.Unlock()
			s.pushOp(stmtOp{kind: opClientUnnamed, gen: s.unnamedGen}, zb)
			return
		}
		m.clientParses.Add(1)
		s.stmu.Lock()
		old := s.stmts[name]
		s.stmu.Unlock()
		if old != nil {
			// PostgreSQL answers 42P05 and skips to the Sync: have it do
			// so by preparing the name the client's statement has there.
			s.ensurePrepared(sc, old, zb)
			s.emitFrame('P', []byte(old.name), nul, rest)
			s.pushOp(stmtOp{kind: opDuplicate, client: name, def: old}, zb)
			return
		}
		def := s.srv.stmts.acquire(s.searchPath(), rest)
		s.stmu.Lock()
		s.stmtSet(name, def)
		s.stmu.Unlock()
		sc.mu.Lock()
		hit := sc.stmts.Has(def.name)
		var evicted []string
		if !hit {
			evicted = s.makeRoomLocked(sc)
			sc.stmts.Add(def.name)
		}
		sc.mu.Unlock()
		s.emitEvictions(evicted, zb)
		if hit {
			m.cacheHits.Add(1)
			if s.hitDef == nil && !s.groupRan {
				s.hitDef, s.hitZB = def, zb // see retry.go
			}
			s.noteCacheHit(name, def)
			// A SHOW, not an empty text: in a failed transaction block
			// PostgreSQL refuses a Parse (25P02) unless its text is empty
			// or ends the transaction, and refuses the client's Parse
			// exactly then (txExit: ROLLBACK, COMMIT, ...).
			q := nopQuery
			if def.txExit {
				q = nul
			}
			s.emitFrame('P', []byte(nopStatement), nul, q, []byte{0, 0})
			s.pushOp(stmtOp{kind: opCacheHit, client: name, def: def}, zb)
			s.emitFrame('C', []byte{'S'}, []byte(nopStatement), nul)
			s.pushOp(stmtOp{kind: opNopClose, close: true, swallow: true}, zb)
			return
		}
		m.serverParses.Add(1)
		s.emit(def.parse)
		s.pushOp(stmtOp{kind: opClientParse, client: name, def: def}, zb)
	case 'B':
		portal, r1, ok1 := cstring(body)
		name, r2, ok2 := cstring(r1)
		if ok1 && ok2 && name != "" {
			m.binds.Add(1)
		}
		if ok1 && ok2 && name == "" {
			// Its effects were applied by bindEffects.
			if s.ensureUnnamed(sc, zb) {
				s.emitFrame(t, body)
			}
			return
		}
		var def *stmtDef
		if ok1 && ok2 {
			def = s.statement(name)
		}
		if def == nil {
			return // unknown: PostgreSQL says 26000
		}
		s.noteFirstUse(sc, name, def, zb)
		s.ensurePrepared(sc, def, zb)
		s.noteBound(def.name, name)
		s.emitFrame('B', []byte(portal), nul, []byte(def.name), nul, r2)
	case 'D':
		var def *stmtDef
		var name string
		if len(body) > 1 && body[0] == 'S' {
			var ok bool
			if name, _, ok = cstring(body[1:]); ok && name == "" {
				if s.ensureUnnamed(sc, zb) {
					s.emitFrame(t, body)
				}
				return
			} else if ok {
				def = s.statement(name)
			}
		}
		if def == nil {
			return
		}
		s.noteFirstUse(sc, name, def, zb)
		s.ensurePrepared(sc, def, zb)
		s.noteBound(def.name, name)
		s.emitFrame('D', []byte{'S'}, []byte(def.name), nul)
	case 'C':
		// Sent as is: the server has no statement under the client's
		// name, so it answers CloseComplete where a direct one would.
		if len(body) > 1 && body[0] == 'S' {
			if name, _, ok := cstring(body[1:]); ok && name != "" {
				s.stmu.Lock()
				def := s.stmts[name]
				if def != nil {
					delete(s.stmts, name)
				}
				s.stmu.Unlock()
				if def != nil {
					s.srv.stmts.release(def)
					s.pushOp(stmtOp{kind: opClientClose, close: true, client: name, def: def}, zb)
					return
				}
			}
		}
		s.pushOp(stmtOp{kind: opPlain, close: true}, zb)
	}
}

// closeLocally answers a client's Close while it holds no server
// connection: its name is forgotten, and the server, had it been asked,
// would have said CloseComplete.
func (s *session) closeLocally(body []byte) {
	if len(body) > 1 && body[0] == 'S' {
		if name, _, ok := cstring(body[1:]); ok && name != "" {
			s.stmu.Lock()
			def := s.stmts[name]
			delete(s.stmts, name)
			s.stmu.Unlock()
			if def != nil {
				s.srv.stmts.release(def)
			}
		}
	}
	s.writeClient(closeComplete)
}

var closeComplete = []byte{'3', 0, 0, 0, 4}

// unresolved reports whether a Parse, Bind, Describe or Close names a
// statement whose mapping an earlier request of the pipeline changed (a
// Parse or Close of that name) and the server has not answered yet: if an
// error makes the server skip that request, the name means something else.
// The same holds for the definition the frame relies on being prepared on
// sc or not (the client's statement's, or the one a Parse would be answered
// from): a Parse, injected Parse or eviction of it in an earlier request
// makes sc.stmts say what the server has only if that request runs. zb
// places the frame in the batch. A DEALLOCATE or DISCARD ALL not answered
// yet leaves every name unresolved (pendingDrop).
func (s *session) unresolved(sc *serverConn, t byte, body []byte, zb int) bool {
	var name string
	var rest []byte
	var ok bool
	switch t {
	case 'P':
		name, rest, ok = cstring(body)
	case 'B':
		if _, r, ok1 := cstring(body); ok1 {
			name, _, ok = cstring(r)
		}
	case 'D', 'C':
		if len(body) > 1 && body[0] == 'S' {
			name, _, ok = cstring(body[1:])
		}
	}
	if ok && name == "" && (t == 'B' || t == 'D') {
		// The unnamed statement: an earlier request's Parse, injected Parse
		// or Close of it may be skipped.
		return s.pendingOp(sc, zb, func(op *stmtOp) bool {
			switch op.kind {
			case opClientUnnamed, opInjectUnnamed, opSwallowClose:
				return true
			}
			return false
		})
	}
	if !ok || name == "" {
		return false
	}
	if s.pendingDrop(sc, zb) {
		return true
	}
	var server string // the definition's server-side name
	if t != 'C' {
		if def := s.statement(name); def != nil {
			server = def.name
		} else if t == 'P' {
			if def := s.srv.stmts.lookup(s.searchPath(), rest); def != nil {
				server = def.name
			}
		}
	}
	changes := func(op *stmtOp) bool {
		switch op.kind {
		case opClientParse:
			return op.client == name || op.def.name == server
		case opCacheHit, opClientClose:
			return op.client == name
		case opInject:
			return op.def.name == server
		case opEvict:
			return op.name == server
		}
		return false
	}
	return s.pendingOp(sc, zb, changes)
}

// pendingOp reports whether a queue entry for which changes is true is in
// an earlier group of the batch (before zb) or sent in an earlier batch and
// not answered yet.
func (s *session) pendingOp(sc *serverConn, zb int, changes func(op *stmtOp) bool) bool {
	for i := range s.bops {
		if op := &s.bops[i]; op.zseq < int64(zb) && changes(op) {
			return true // an earlier group of this batch
		}
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i := sc.stq.head; i < len(sc.stq.ops); i++ {
		if changes(&sc.stq.ops[i]) {
			return true // sent in an earlier batch, not answered yet
		}
	}
	return false
}

// pendingDrop reports whether a DEALLOCATE, DEALLOCATE ALL or DISCARD ALL
// (a qUndo) is in an earlier group of the batch (before zb) or sent in an
// earlier batch and not answered yet: until it is, a name may or may not
// still be prepared (in a failed transaction block it fails, and the name
// keeps its statement).
func (s *session) pendingDrop(sc *serverConn, zb int) bool {
	for i := range s.bundo {
		if s.bundo[i].zseq < int64(zb) {
			return true
		}
	}
	return sc.nqundo.Load() > 0
}

// statement returns the definition a client's statement name maps to.
func (s *session) statement(name string) *stmtDef {
	s.stmu.Lock()
	defer s.stmu.Unlock()
	return s.stmts[name]
}

// ensurePrepared makes sure def is prepared on sc before what follows in
// the batch, injecting its Parse (answer swallowed) if the server lacks it.
func (s *session) ensurePrepared(sc *serverConn, def *stmtDef, zb int) {
	sc.mu.Lock()
	if sc.stmts.Has(def.name) {
		sc.mu.Unlock()
		return
	}
	evicted := s.makeRoomLocked(sc)
	sc.stmts.Add(def.name)
	sc.mu.Unlock()
	s.emitEvictions(evicted, zb)
	s.dbp.ctr.serverParses.Add(1)
	s.emit(def.parse)
	s.pushOp(stmtOp{kind: opInject, swallow: true, def: def}, zb)
}

// ensureUnnamed makes the server's unnamed statement the client's latest
// before a Bind or Describe of it: a client that parsed it in an earlier
// request may now hold another server connection, whose unnamed statement
// (if any) is someone else's. It reports whether it emitted anything.
func (s *session) ensureUnnamed(sc *serverConn, zb int) bool {
	sc.mu.Lock()
	ok := sc.unnamedBy == s && sc.unnamedGen == s.unnamedGen
	sc.unnamedBy, sc.unnamedGen = s, s.unnamedGen
	sc.mu.Unlock()
	if ok {
		return false
	}
	if s.unnamed == nil || s.unnamedVoid.Load() == uint32(s.unnamedGen) {
		// The client never prepared one (or its last Parse failed or was
		// skipped): drop another client's, so that the server answers
		// 26000 as a direct connection would.
		s.emitFrame('C', []byte{'S'}, nul)
		s.pushOp(stmtOp{kind: opSwallowClose, close: true, swallow: true}, zb)
		return true
	}
	s.emit(s.unnamed)
	s.pushOp(stmtOp{kind: opInjectUnnamed, swallow: true}, zb)
	return true
}

// appendFrame appends a frame of type t with body to dst.
func appendFrame(dst []byte, t byte, body []byte) []byte {
	n := 4 + len(body)
	dst = append(dst, t, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(dst, body...)
}

// noteBound remembers the client's name for a definition it used, to put
// back in the server's error messages that name the definition.
func (s *session) noteBound(server, client string) {
	s.stmu.Lock()
	if s.bound == nil {
		s.bound = map[string]string{}
	}
	if s.bound[server] != client {
		if len(s.bound) > 4*max(int(s.maxPrepared.Load()), 64) {
			clear(s.bound)
		}
		s.bound[server] = client
	}
	s.stmu.Unlock()
}

// clientName is the client's name for server-side statement name, or "".
func (s *session) clientName(server string) string {
	s.stmu.Lock()
	defer s.stmu.Unlock()
	return s.bound[server]
}

// makeRoomLocked removes from sc's list the statements that must go for one
// more to fit; the caller closes them on the server (emitEvictions).
func (s *session) makeRoomLocked(sc *serverConn) []string {
	var out []string
	limit := int(s.maxPrepared.Load())
	for sc.stmts.Len() > 0 && sc.stmts.Len() >= limit {
		name := sc.stmts.Oldest()
		sc.stmts.Remove(name)
		out = append(out, name)
	}
	return out
}

func (s *session) emitEvictions(names []string, zb int) {
	for _, name := range names {
		s.dbp.ctr.stmtEvictions.Add(1)
		s.emitFrame('C', []byte{'S'}, []byte(name), nul)
		s.pushOp(stmtOp{kind: opEvict, close: true, swallow: true, name: name}, zb)
	}
}

// unmapStatement undoes a mapping the server never made (its Parse failed or
// was skipped). Called by the server's reader.
func (s *session) unmapStatement(name string, def *stmtDef) {
	s.stmu.Lock()
	mapped := s.stmts[name] == def
	if mapped {
		delete(s.stmts, name)
	}
	s.stmu.Unlock()
	if mapped {
		s.srv.stmts.release(def)
	}
}

// stmtSet maps the client's statement name to def (stmu held). The map is
// made on first use: an idle client that never prepared holds none.
func (s *session) stmtSet(name string, def *stmtDef) {
	if s.stmts == nil {
		s.stmts = map[string]*stmtDef{}
	}
	s.stmts[name] = def
}

// remapStatement undoes a Close the server skipped.
func (s *session) remapStatement(name string, def *stmtDef) {
	s.stmu.Lock()
	free := s.stmts[name] == nil
	if free {
		s.stmtSet(name, def)
	}
	s.stmu.Unlock()
	if free {
		s.srv.stmts.retain(def)
	}
}

// forgetStatements drops every mapping (DEALLOCATE ALL, DISCARD ALL, the
// end of the session).
func (s *session) forgetStatements() {
	s.stmu.Lock()
	defs := make([]*stmtDef, 0, len(s.stmts))
	for name, def := range s.stmts {
		defs = append(defs, def)
		delete(s.stmts, name)
	}
	s.stmu.Unlock()
	for _, def := range defs {
		s.srv.stmts.release(def)
	}
}

// preparedCount is the number of statements the client has prepared.
func (s *session) preparedCount() int {
	s.stmu.Lock()
	defer s.stmu.Unlock()
	return len(s.stmts)
}

// searchPath is the client's search_path, part of a statement's identity.
func (s *session) searchPath() string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.params["search_path"]
}

// scanEffects reads the SQL of a client's Query or Parse for session state
// (see stateEffects). Its effects are kept for queryFrame.
func (s *session) scanEffects(t byte, body []byte, canRefuse bool) error {
	var name string
	switch t {
	case 'B':
		return s.bindEffects(body, canRefuse)
	case 'D', 'C':
		s.eff = sqlscan.Effects{}
		return nil
	case 'P':
		n, rest, ok := cstring(body)
		if !ok {
			s.eff = sqlscan.Effects{}
			return nil
		}
		name, body = n, rest
	}
	if i := bytes.IndexByte(body, 0); i >= 0 {
		body = body[:i]
	}
	s.eff = sqlscan.Scan(bytesView(body)) // Scan keeps nothing of its input
	if s.cur.Truncated() {
		// Longer than txstate.MaxScan: what was not read may change settings or
		// the role (a SET ROLE after a long comment), or commit.
		s.eff.Settings, s.eff.Commits = true, true
	}
	s.calls = s.calls || s.eff.Calls // a Parse counts as if it ran
	if s.eff.Settings {
		s.noteCustom(body)
	}
	if t == 'P' && name != "" && !s.tracked {
		// Names pass through: remember what the statement does, so that
		// its Binds are held and apply it again (bindEffects).
		if e := txstate.EffectsOf(s.eff, s.cur.Truncated()); e != (txstate.StmtEffects{}) {
			if s.rawEff == nil {
				s.rawEff = map[string]txstate.StmtEffects{}
			}
			s.rawEff[name] = e
		} else {
			delete(s.rawEff, name)
		}
	}
	return s.stateEffects(s.eff, canRefuse)
}

// bindEffects applies again, at each Bind, what running the bound
// statement does to the session (its pin, the pinned state it may undo,
// settings, role-setting calls, commits): effects belong to the statement,
// not to its first Parse. A prepared SET ROLE, LISTEN or pg_advisory_lock
// run again after its pin was let go pins again; a prepared set_config
// marks the settings for a snapshot each time.
func (s *session) bindEffects(body []byte, canRefuse bool) error {
	var e txstate.StmtEffects
	_, r1, ok1 := cstring(body)
	name, _, ok2 := cstring(r1)
	switch {
	case !ok1 || !ok2:
	case name == "":
		e = s.unnamedEff
	case s.tracked:
		if def := s.statement(name); def != nil {
			e = def.eff
			if e.Settings && len(def.custom) > 0 {
				s.noteCustomNames(def.custom) // prepared by another client
			}
		}
	default:
		e = s.rawEff[name]
	}
	s.eff = e.Effects()
	s.calls = s.calls || e.Calls
	s.portalCommits = s.portalCommits || e.Commits
	s.bindTx = e.Tx // its Executes run this statement (noteRuns)
	s.bindDrop = e.Drop
	return s.stateEffects(s.eff, canRefuse)
}

// queryFrame forwards a complete (held) simple Query in transaction or
// statement mode, keeping the prepared-statement maps true for DEALLOCATE.
// zb is the number of ReadyForQuery-producing messages before it in the
// batch.
func (s *session) queryFrame(sc *serverConn, body []byte, b *batch, zb int) {
	if !s.tracked {
		return
	}
	eff := s.eff
	if eff.Deallocates > 0 {
		zb = s.deallocate(sc, body, b, zb)
	}
	if eff.DeallocateAll {
		s.dropStatements(sc, txstate.DropOf(eff), zb)
	}
}

// dropStatements forgets, when a statement that drops every prepared
// statement is sent (DEALLOCATE ALL or DISCARD ALL, in a Query or an
// Execute; zb places it in the batch), the client's names and the
// definitions sc holds, so that a Bind later in the pipeline does not find
// them and other clients prepare theirs again. Its CommandComplete makes
// that final (PostgreSQL has dropped them: DEALLOCATE is not undone by a
// later statement's failure); an error before it gives them back.
func (s *session) dropStatements(sc *serverConn, d txstate.DropAll, zb int) {
	s.stmu.Lock()
	before := s.stmts
	s.stmts = map[string]*stmtDef{}
	s.stmu.Unlock()
	sc.mu.Lock()
	took := &dropped{sess: s, names: sc.stmts.Names()}
	sc.stmts.Clear()
	// A Parse not answered yet (an earlier batch's, or this one's) may be
	// skipped: its undo then strikes its definition from what this drop's
	// undo lists again.
	for i := sc.stq.head; i < len(sc.stq.ops); i++ {
		took.follow(&sc.stq.ops[i])
	}
	sc.mu.Unlock()
	for i := range s.bops {
		took.follow(&s.bops[i])
	}
	// DISCARD ALL does not unpin at its answer: what the client sent
	// after it (LISTEN, a lock, a temp table, in the same text or
	// pipelined behind it) may have created state again. Its Undo has the
	// pin check run once everything is answered.
	s.pushUndo(qUndo{tag: d.Tag(),
		commit: func() {
			for _, def := range before {
				s.srv.stmts.release(def)
			}
		},
		undo: func(sc *serverConn) {
			s.stmu.Lock()
			for name, def := range before {
				if s.stmts[name] == nil && !took.goneClient[name] {
					s.stmtSet(name, def)
				} else {
					s.srv.stmts.release(def)
				}
			}
			s.stmu.Unlock()
			took.undo(sc)
		}}, zb)
}

// follow makes a queue entry that adds a definition tell d if it is
// undone (stmtOp.forgetInDrops).
func (d *dropped) follow(op *stmtOp) {
	switch op.kind {
	case opClientParse, opInject, opCacheHit:
		op.drops = append(op.drops, d)
	}
}

// deallocate runs a client's DEALLOCATE of protocol-level statements: the
// server deallocates each definition (other clients prepare it again when
// they need it) and the client's names are forgotten, unless the statement
// fails. It returns the query's place in the batch (after the groups it
// added before it).
func (s *session) deallocate(sc *serverConn, body []byte, b *batch, zb int) int {
	sql := body
	if i := bytes.IndexByte(sql, 0); i >= 0 {
		sql = sql[:i]
	}
	names := sqlscan.Deallocations(string(sql))
	var out []byte
	last := 0
	var undos []qUndo
	for _, n := range names {
		s.stmu.Lock()
		def := s.stmts[n.Name]
		if def != nil {
			delete(s.stmts, n.Name)
		}
		s.stmu.Unlock()
		if def == nil {
			undos = append(undos, qUndo{tag: "DEALLOCATE"}) // SQL-level, or unknown
			continue
		}
		sc.mu.Lock()
		onServer := sc.stmts.Has(def.name)
		sc.stmts.Remove(def.name)
		sc.mu.Unlock()
		if !onServer {
			// Prepare it first, in a group of its own whose answers are
			// poolerd's, so that DEALLOCATE answers as it would directly.
			s.emit(def.parse, syncFrame)
			s.bgroups = append(s.bgroups, zb)
			zb++
			b.reqs++
		}
		out = append(append(out, sql[last:n.Start]...), def.name...)
		last = n.End
		name := n.Name
		undos = append(undos, qUndo{tag: "DEALLOCATE",
			commit: func() { s.srv.stmts.release(def) },
			undo: func(sc *serverConn) {
				s.stmu.Lock()
				free := s.stmts[name] == nil
				if free {
					s.stmtSet(name, def)
				}
				s.stmu.Unlock()
				if !free {
					s.srv.stmts.release(def)
				}
				sc.stmts.Add(def.name)
			}})
	}
	for _, u := range undos {
		s.pushUndo(u, zb)
	}
	if out == nil {
		s.emitFrame('Q', body) // nothing of the client's: unchanged
		return zb
	}
	out = append(append(out, sql[last:]...), 0)
	s.emitFrame('Q', out)
	return zb
}

// qUndo is a simple query's change to the prepared-statement maps, made when
// it is sent: commit runs at the statement's CommandComplete (its tag), undo
// (with the connection's mu held) if the statement fails or is skipped.
type qUndo struct {
	zseq   int64
	tag    string
	commit func()
	undo   func(sc *serverConn)
}

// pushUndo records a qUndo of the batch; zb places the query in it.
func (s *session) pushUndo(u qUndo, zb int) {
	u.zseq = int64(zb)
	s.bundo = append(s.bundo, u)
}

var syncFrame = []byte{'S', 0, 0, 0, 4}

// stateEffects pins the session, marks its settings for a snapshot, or
// returns the refusal, for SQL with effects eff (a prepared LISTEN or SET
// counts from when it is prepared). A refusal is possible only where the
// statement can still be withheld (canRefuse); elsewhere the client is
// pinned instead.
func (s *session) stateEffects(eff sqlscan.Effects, canRefuse bool) error {
	if !eff.Interesting() {
		return nil
	}
	if eff.BeginTx && s.mode == config.PoolStatement && canRefuse {
		// The session ends, as PgBouncer ends it: a client that went on
		// after an error (psql without ON_ERROR_STOP) would run the
		// statements it meant for the block one by one, each committed.
		return &wire.Error{Severity: "FATAL", Code: "08P01",
			Message: "transaction blocks not allowed in statement pooling mode",
			Detail:  "in statement mode every statement may run on a different server connection, so a transaction block cannot be kept; the session ends so that none of the statements meant for it runs on its own",
			Hint:    "send the transaction as one query string, or use pool_mode transaction or session for this database or user"}
	}
	if eff.Pin != "" || !eff.Undo.Empty() {
		if err := s.pinEffects(eff, canRefuse); err != nil {
			return err
		}
	}
	if eff.Settings {
		s.markSettings()
	}
	if eff.Temp {
		if sc := s.server.Load(); sc != nil {
			sc.tempSchema.Store(true)
		}
	}
	return nil
}

// pinEffects pins the session for state eff creates (or returns the
// refusal), and notes an undo of a pinned client's state for a pin check.
// It runs under pinMu, as pinChecked does: a check's answer either sees
// the request (and is void) or unpins before the request pins again.
func (s *session) pinEffects(eff sqlscan.Effects, canRefuse bool) error {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if eff.Pin != "" {
		s.pinGen.Add(1) // a pin check sent before this request is void
	}
	if eff.Pin != "" && s.pinReason.Load() == nil {
		if s.refuseState && canRefuse {
			return &wire.Error{Severity: "ERROR", Code: "0A000",
				Message: fmt.Sprintf("%s is session state, which %s pooling cannot keep", txstate.PinWhat(eff.Pin), s.mode),
				Detail:  "the next transaction of this client may run on another server connection, where it would not exist",
				Hint:    "connect to a database or user with pool_mode session, or set session_state: pin to keep such clients on one server connection"}
		}
		if !s.pin(eff.Pin, !canRefuse) {
			return s.dbp.errPinCap(eff.Pin)
		}
	}
	if !eff.Undo.Empty() && s.pinReason.Load() != nil {
		s.undoGen.Store(s.pinGen.Load())
		s.pinUndo.Store(true)
	}
	return nil
}

// markSettings notes a request that may change the client's settings.
func (s *session) markSettings() { s.dirtyGen.Add(1) }

// settingsDirty reports whether the client may have changed settings since
// the last snapshot of them.
func (s *session) settingsDirty() bool { return s.dirtyGen.Load() != s.cleanGen.Load() }

// noteCustom remembers the customized options SQL text touches.
func (s *session) noteCustom(sql []byte) {
	if bytes.IndexByte(sql, '.') < 0 {
		return
	}
	s.noteCustomNames(sqlscan.CustomOptions(string(sql)))
}

// noteCustomNames remembers customized options a statement touches.
func (s *session) noteCustomNames(names []string) {
	if len(names) == 0 {
		return
	}
	s.pmu.Lock()
	if s.custom == nil {
		s.custom = map[string]bool{}
	}
	for _, n := range names {
		s.custom[n] = true
	}
	s.pmu.Unlock()
}

// customOptions lists the customized options the client touched, and
// those it has a value of (from its startup packet, or carried by a
// takeover), which a snapshot must read by name too: otherwise it would
// take them for reset while they stay set on the connection.
func (s *session) customOptions() []string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	out := make([]string, 0, len(s.custom))
	for n := range s.custom {
		out = append(out, n)
	}
	for n := range s.params {
		if strings.IndexByte(n, '.') >= 0 && !s.custom[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// roleChanged pins a transaction- or statement-mode session whose role or
// session authorization changed in a way the scanner could not see: a
// settings snapshot found current_user other than session_user, or the
// server reported a new session_authorization or is_superuser. Called by
// the server's reader.
func (s *session) roleChanged() {
	if s.stateful {
		s.pinMu.Lock()
		s.pinGen.Add(1)
		s.pin(sqlscan.PinRole, true)
		s.pinMu.Unlock()
	}
}

// pin keeps the session on its server connection until its session state
// is gone (pinChecked) or it leaves. A pin takes one of the pool's
// max_pinned_clients places: without one it reports false, unless force
// (the statement is on its way already), which takes a place beyond the
// cap.
func (s *session) pin(reason string, force bool) bool {
	if s.pinReason.Load() != nil {
		return true
	}
	if !s.dbp.takePin(force) {
		return false
	}
	if !s.pinReason.CompareAndSwap(nil, &reason) {
		s.dbp.pins.Add(-1) // pinned meanwhile by the server's reader
		return true
	}
	s.pinnedSince.Store(s.srv.nanotime())
	s.dbp.ctr.pinned(reason, 1)
	s.log.Debug("client pinned to its server connection", zap.String("reason", reason))
	// pinned_idle_timeout is armed when the client is next idle
	// (noteActive): not here, where the server's mu may be held.
	return true
}

func (s *session) unpin() {
	if r := s.pinReason.Swap(nil); r != nil {
		s.dbp.ctr.pinned(*r, -1)
		s.dbp.pins.Add(-1)
		s.pinnedSince.Store(0)
	}
}

// pinCheckDue reports, once, that a pinned client ran a statement that may
// have undone its session state, so a pin check is due when its
// transaction ends. Called with the server's mu held.
func (s *session) pinCheckDue() bool {
	return s.pinReason.Load() != nil && s.pinUndo.Load() && s.pinUndo.CompareAndSwap(true, false)
}

// pinChecked takes the answer to a pin check (row, the DataRow's body;
// failed if it got an error; gen, pinGen when it was sent): when no state
// is left and the client created none since, the client is unpinned, and
// its connection goes back to the pool once clean; when some is left, the
// pin's reason becomes the first kind left. Called by the server's reader
// with the connection's mu held.
func (s *session) pinChecked(row []byte, failed bool, gen uint64) {
	cols, ok := dataRow(row, len(txstate.PinCheckKinds))
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if failed || !ok || s.pinGen.Load() != gen {
		return // stays pinned: nothing is provable
	}
	left := ""
	for i, c := range cols {
		if string(c) != "0" {
			left = txstate.PinCheckKinds[i]
			break
		}
	}
	cur := s.pinReason.Load()
	switch {
	case cur == nil:
	case left == "":
		s.log.Debug("client unpinned: its session state is gone", zap.String("reason", *cur))
		s.dbp.ctr.unpinned(*cur)
		s.unpin()
		// What ran while pinned (an SQL EXECUTE of a prepared set_config,
		// say) may have changed settings unseen: read them before the
		// connection goes back to the pool.
		s.markSettings()
	case left != *cur && s.pinReason.CompareAndSwap(cur, &left):
		s.dbp.ctr.repinned(*cur, left)
	}
}

// pinned reports whether the session is pinned.
func (s *session) pinned() bool { return s.pinReason.Load() != nil }

// settingsSnapshot takes what a snapshot found set on the client's server
// connection (sc.applied, beyond the reported parameters) as the client's
// settings. Called by the reader with sc.mu held.
func (s *session) settingsSnapshot(sc *serverConn, status byte) {
	s.pmu.Lock()
	s.ownParams()
	for name := range s.params {
		if _, reported := sc.params[name]; reported {
			continue
		}
		if _, set := sc.applied[name]; !set {
			delete(s.params, name) // RESET
		}
	}
	for name, value := range sc.applied {
		s.params[name] = value
	}
	s.pkey = ""
	s.pmu.Unlock()
	if status == wire.TxIdle {
		// Marks made after the snapshot was sent stay.
		for {
			clean := s.cleanGen.Load()
			if sc.snapGen <= clean || s.cleanGen.CompareAndSwap(clean, sc.snapGen) {
				break
			}
		}
	}
}

// bytesView is b as a string without a copy, for functions that read it
// and keep nothing of it.
func bytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// obBuf borrows a buffer for an out-of-place batch.
func (s *session) obBuf() []byte {
	if p, ok := s.srv.obufs.Get().(*[]byte); ok {
		s.obp = p
		return (*p)[:0]
	}
	return make([]byte, 0, 4096)
}

// endBatch returns the out-of-place buffer and forgets the batch's entries.
func (s *session) endBatch() {
	if s.ob != nil {
		if cap(s.ob) <= 1<<20 {
			p := s.obp
			if p == nil {
				p = new([]byte)
			}
			*p = s.ob[:0]
			s.srv.obufs.Put(p)
		}
		s.ob, s.obp = nil, nil
	}
	s.obOn = false
	s.hitDef, s.replayOn, s.hitStart = nil, false, false
	clear(s.bops)
	s.bops = s.bops[:0]
	clear(s.bundo)
	s.bundo = s.bundo[:0]
	s.bgroups = s.bgroups[:0]
}
