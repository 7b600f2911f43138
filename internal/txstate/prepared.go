package txstate

import (
	"bytes"
	"container/list"
	"fmt"
	"strings"

	"github.com/poolerd/poolerd/internal/sqlscan"
	"github.com/poolerd/poolerd/internal/wire"
)

// MaxScan is how much of a statement's text poolerd scans (sqlscan.Scan):
// the rest of a longer text is not read, and counts as changing settings
// and committing.
const MaxScan = 64 << 10

// TxExitStmt reports whether query is one of the statements PostgreSQL's
// IsTransactionExitStmt accepts in a failed transaction block.
func TxExitStmt(query []byte) bool {
	if i := bytes.IndexByte(query, 0); i >= 0 {
		query = query[:i]
	}
	f := strings.Fields(strings.ToLower(string(query[:min(len(query), 64)])))
	if len(f) == 0 {
		return false
	}
	w := strings.TrimRight(f[0], ";")
	switch w {
	case "commit", "end", "rollback", "abort":
		return true
	case "prepare":
		return len(f) > 1 && strings.HasPrefix(f[1], "transaction")
	}
	return false
}

// StmtEffects is what running a statement does to the session, from its
// text (sqlscan.Scan): the pin it creates and the pinned state it may undo,
// whether it may change settings, call a function that may set the role,
// or commit. Effects belong to a statement, not to its first Parse: every
// execution (each Bind of a named or the unnamed statement) applies them
// again, so that a prepared SET ROLE run again after RESET ROLE unpinned
// its client pins it again.
type StmtEffects struct {
	// Pin is the pin it creates, Undo the pinned state it may undo.
	Pin, Undo sqlscan.Kinds
	// Settings: it may change settings; Calls: it calls a function that
	// may set the role; Commits: it may commit.
	Settings, Calls, Commits bool
	// Tx is what it may do to the transaction status (keep.go).
	Tx TxShape
	// Drop says whether it drops every prepared statement of the session.
	Drop DropAll
}

// DropAll says whether a statement drops every prepared statement of the
// session, and with which command (the tag of its CommandComplete).
type DropAll uint8

// The values of DropAll.
const (
	DropNone       DropAll = iota
	DropDeallocate         // DEALLOCATE ALL
	DropDiscard            // DISCARD ALL
)

// DropOf is e's DropAll.
func DropOf(e sqlscan.Effects) DropAll {
	switch {
	case !e.DeallocateAll:
		return DropNone
	case e.FirstDropAllDiscard:
		return DropDiscard
	default:
		// DEALLOCATE ALL first (a DISCARD ALL after it in the same text
		// may fail, in a multi-statement Query always: the drop is final
		// at the DEALLOCATE ALL's CommandComplete).
		return DropDeallocate
	}
}

// Tag is the CommandComplete tag of the command.
func (d DropAll) Tag() string {
	if d == DropDiscard {
		return "DISCARD ALL"
	}
	return "DEALLOCATE ALL"
}

// EffectsOf keeps what of e a statement's execution repeats (truncated:
// the text was longer than the scanner read).
func EffectsOf(e sqlscan.Effects, truncated bool) StmtEffects {
	var r StmtEffects
	r.Pin.Add(e.Pin)
	r.Undo = e.Undo
	r.Settings, r.Calls, r.Commits = e.Settings, e.Calls, e.Commits
	r.Tx = ShapeOf(e, truncated)
	r.Drop = DropOf(e)
	return r
}

// Effects is e as the scanner's result, for proxy's stateEffects.
func (e StmtEffects) Effects() sqlscan.Effects {
	r := sqlscan.Effects{Undo: e.Undo, Settings: e.Settings, Calls: e.Calls, Commits: e.Commits}
	for k := range e.Pin.All() {
		r.Pin = k
		break
	}
	return r
}

// TextEffects scans a statement's text (a Parse body after its name: the
// query, NUL, parameter types) as proxy's scanEffects does; it also
// returns the customized options (a.b) the text names, when it may change
// settings.
func TextEffects(rest []byte) (StmtEffects, []string) {
	if i := bytes.IndexByte(rest, 0); i >= 0 {
		rest = rest[:i]
	}
	truncated := len(rest) > MaxScan
	if truncated {
		rest = rest[:MaxScan]
	}
	e := sqlscan.Scan(string(rest))
	if truncated {
		e.Settings, e.Commits = true, true
	}
	var custom []string
	if e.Settings && bytes.IndexByte(rest, '.') >= 0 {
		custom = sqlscan.CustomOptions(string(rest))
	}
	return EffectsOf(e, truncated), custom
}

// StmtKey is a statement definition's identity: search_path, NUL, and the
// Parse body after the statement name.
func StmtKey(searchPath string, rest []byte) []byte {
	key := make([]byte, 0, len(searchPath)+1+len(rest))
	return append(append(append(key, searchPath...), 0), rest...)
}

// ServerStmts is what is prepared on one server connection, most recently
// used first. Its user guards it (proxy: the connection's mu).
type ServerStmts struct {
	byName map[string]*list.Element // of string (the server-side name)
	lru    list.List
}

// Has reports whether name is prepared, and marks it most recently used.
func (ss *ServerStmts) Has(name string) bool {
	if e := ss.byName[name]; e != nil {
		ss.lru.MoveToFront(e)
		return true
	}
	return false
}

// Add records name as prepared, most recently used.
func (ss *ServerStmts) Add(name string) {
	if ss.byName == nil {
		ss.byName = map[string]*list.Element{}
	}
	if e := ss.byName[name]; e != nil {
		ss.lru.MoveToFront(e)
		return
	}
	ss.byName[name] = ss.lru.PushFront(name)
}

// Remove forgets name.
func (ss *ServerStmts) Remove(name string) {
	if e := ss.byName[name]; e != nil {
		ss.lru.Remove(e)
		delete(ss.byName, name)
	}
}

// Names lists the names, least recently used first.
func (ss *ServerStmts) Names() []string {
	out := make([]string, 0, ss.lru.Len())
	for e := ss.lru.Back(); e != nil; e = e.Prev() {
		out = append(out, e.Value.(string))
	}
	return out
}

// Oldest returns the least recently used name.
func (ss *ServerStmts) Oldest() string { return ss.lru.Back().Value.(string) }

// Len is how many names there are.
func (ss *ServerStmts) Len() int { return len(ss.byName) }

// Clear forgets everything (DISCARD ALL, DEALLOCATE ALL).
func (ss *ServerStmts) Clear() {
	clear(ss.byName)
	ss.lru.Init()
}

// DuplicateError is what a client gets for a Parse of a name it already
// has, in place of the server's error that names the definition.
func DuplicateError(sev, client string) []byte {
	return (&wire.Error{Severity: sev, Code: "42P05",
		Message: fmt.Sprintf("prepared statement \"%s\" already exists", client)}).Append(nil)
}

// IsDuplicateOf reports whether an ErrorResponse body is the server's 42P05
// for server-side name name.
func IsDuplicateOf(code, msg, name string) bool {
	return code == "42P05" && strings.Contains(msg, `"`+name+`"`)
}
