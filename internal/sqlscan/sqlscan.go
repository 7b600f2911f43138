// Package sqlscan is a small lexer over SQL text that finds what a
// statement does to the session: a pooler in transaction mode must know when
// a client changes settings, creates state that only its own server
// connection holds (a temp table, LISTEN, a session advisory lock, ...) or
// may have removed such state again, opens a transaction block or
// deallocates prepared statements.
//
// It is not a parser. It splits text into statements at top-level
// semicolons, skipping comments, quoted identifiers, string constants
// (standard, E'...', dollar-quoted), and reads the first words of each statement
// plus any function names, which is what PostgreSQL's command tags cannot
// tell (CREATE TABLE does not say TEMP, SELECT does not say it took a lock).
// No statement or name inside a string is read: neither the body of a
// function (CREATE FUNCTION ... AS $$ ... $$) nor that of a DO block counts.
//
// The model is total: wherever the scanner cannot be sure what a statement
// does to the session, it errs to the safe side (Pin; Settings, so that
// the pooler reads the session back after the transaction; Calls, so that
// the next client gets RESET ROLE and RESET ALL), never to nothing. The
// rules, for words outside strings, comments and function bodies, any
// case, anywhere in the statement unless a position is given:
//
//	statement holds                            reports
//	-----------------------------------------  ------------------------------
//	TEMP, TEMPORARY or pg_temp[_N] (schema,    Pin temp_table (a table named
//	  quoted or not) with CREATE, or with        temp too: safe side); not
//	  INTO not right after INSERT or MERGE       with ON COMMIT DROP
//	  (SELECT ... INTO, WITH ... SELECT ...
//	  INTO, EXPLAIN ANALYZE CREATE ...)
//	PREPARE name (first word)                  Pin sql_prepare
//	LISTEN (first word)                        Pin listen
//	pg_advisory_lock, pg_try_advisory_lock     Pin advisory_lock
//	  and their _shared forms, by name
//	DECLARE ... WITH HOLD, any options         Pin cursor_with_hold
//	  between
//	session-level SET of role or session       Pin set_role
//	  authorization; set_config('role' |
//	  'session_authorization', x, not true)
//	SET (not LOCAL, TRANSACTION,               Settings
//	  CONSTRAINTS), RESET, set_config,
//	  DISCARD ALL
//	DO, CALL                                   Settings, Commits, Calls
//	set_config whose name is not a string      Calls (and Settings)
//	  constant CustomOptions reads ($1, a
//	  computed name, an E'' string with a
//	  backslash) and whose is_local is not
//	  the constant true
//	word( not provably syntax or a built-in   Calls
//
// A word before '(' is syntax only where it cannot name a function: a
// reserved key word or one that cannot name a function (IN, VALUES,
// varchar(10), CAST, COALESCE); a name after INTO, TABLE, WITH, AS,
// FUNCTION, ... (a relation or routine named, not called); ::type(n); and
// key words that can name a function only in their own syntax: RANGE,
// LIST, HASH, CUBE, ROLLUP after BY; OVER, FILTER, INCLUDE after ')';
// JOIN, LIKE, IS, SET after an operand. In the head of a CREATE or ALTER
// (before any SELECT), ON t (cols) and USING method (cols) name a relation
// and a method, and table-definition key words (PRIMARY KEY (, PARTITION
// BY RANGE (, ...) are syntax; elsewhere JOIN t ON f(x), USING f(), a[1:f(x)],
// hash(x) and range(1, 2) are calls.
//
// Not seen (documented in docs/transaction-mode.md): state a function, a
// DO block or a procedure creates inside its body (a temp table, LISTEN, a
// session advisory lock); a trigger's, rule's or policy's code.
//
// What pins (Effects.Pin, the first kind in the text):
//
//   - PinTempTable: see the table above.
//   - PinPrepare: PREPARE name (not PREPARE TRANSACTION).
//   - PinListen: LISTEN.
//   - PinAdvisoryLock: the name of a session-level advisory lock function
//     (pg_advisory_lock, pg_try_advisory_lock, their _shared forms) in any
//     statement, any case or quoted in its own spelling, schema-qualified
//     or not.
//   - PinCursorOnHold: DECLARE ... WITH HOLD.
//   - PinRole: see below.
//
// Role changes pin (PinRole): every spelling of a session-level SET of role
// or session_authorization (SET [SESSION] ROLE, SET [SESSION] SESSION
// AUTHORIZATION, SET [SESSION] role|"role"|session_authorization TO|= ...,
// any case), and a call of set_config (also quoted, schema-qualified,
// nested in any expression of any statement) whose first argument is the
// string constant 'role' or 'session_authorization' and whose third is not
// the constant true. What text cannot show (a DO block, CALL, set_config
// with computed arguments) is reported as Settings: the pooler checks the
// session after it ran. A call of any other function that is not a common
// built-in is reported as Calls: the function may set the role, or a
// customized option under a name no text shows.
//
// What may undo pinned state (Effects.Undo, every kind in the text):
//
//   - PinTempTable: DROP TABLE, DROP VIEW, DROP SEQUENCE (any name: an
//     unqualified one may be a temporary relation; these are the relations
//     PostgreSQL makes temporary), DISCARD TEMP | TEMPORARY.
//   - PinPrepare: DEALLOCATE [PREPARE] name | ALL.
//   - PinListen: UNLISTEN name | *.
//   - PinAdvisoryLock: the name pg_advisory_unlock, pg_advisory_unlock_shared
//     or pg_advisory_unlock_all, found as the lock functions are.
//   - PinCursorOnHold: CLOSE name | ALL (COMMIT and ROLLBACK leave a WITH
//     HOLD cursor open).
//   - PinRole: RESET ROLE, RESET SESSION AUTHORIZATION (or RESET role |
//     session_authorization, quoted or not); SET [SESSION] ROLE NONE and
//     SET [SESSION] role TO | = NONE | DEFAULT (NONE also as 'none' or
//     "none"); SET [SESSION] SESSION AUTHORIZATION DEFAULT and SET [SESSION]
//     session_authorization TO | = DEFAULT. Such a SET also pins, as every
//     session-level SET of the role does. Not RESET ALL, which leaves role
//     and session_authorization alone; not SET LOCAL.
//   - every kind: DISCARD ALL (which also sets Unpin).
//
// Undo says only that state of a kind may be gone: the statement may name
// something else, fail or be rolled back, and a text may create and remove
// the same kind (both are reported), so a pooler asks the server before it
// unpins. What text cannot show (a DO block, CALL, a function that unlocks
// or drops) is not reported: such a client stays pinned.
package sqlscan

import (
	"iter"
	"strings"
	"unsafe"
)

// Pin reasons: session state a transaction-mode client cannot take to another
// server connection.
const (
	PinTempTable     = "temp_table"
	PinPrepare       = "sql_prepare"
	PinListen        = "listen"
	PinAdvisoryLock  = "advisory_lock"
	PinCursorOnHold  = "cursor_with_hold"
	PinRole          = "set_role"
	PinSessionParams = "session_params"
)

// Kinds is a set of pin kinds (the Pin constants), one bit each: a plain
// value that Scan fills without allocating and == compares.
type Kinds uint8

// The bits of Kinds, in the order of kindNames.
const (
	kindTempTable Kinds = 1 << iota
	kindPrepare
	kindListen
	kindAdvisoryLock
	kindCursorOnHold
	kindRole
	kindSessionParams

	allKinds Kinds = 1<<iota - 1
)

// kindNames are the Pin constants in the order of their bits in Kinds.
var kindNames = [...]string{PinTempTable, PinPrepare, PinListen, PinAdvisoryLock, PinCursorOnHold, PinRole,
	PinSessionParams}

// kind returns the bit of pin, 0 for a name that is no Pin constant.
func kind(pin string) Kinds {
	for i, n := range kindNames {
		if n == pin {
			return 1 << i
		}
	}
	return 0
}

// Has reports whether k holds pin (a Pin constant; any other name is never
// held).
func (k Kinds) Has(pin string) bool { return k&kind(pin) != 0 }

// Add puts pin (a Pin constant) into k; any other name leaves k as it is.
func (k *Kinds) Add(pin string) { *k |= kind(pin) }

// Empty reports whether k holds no kind.
func (k Kinds) Empty() bool { return k == 0 }

// All yields the Pin constants k holds, in the order of the constants.
func (k Kinds) All() iter.Seq[string] {
	return func(yield func(string) bool) {
		for i, n := range kindNames {
			if k&(1<<i) != 0 && !yield(n) {
				return
			}
		}
	}
}

// String lists the kinds k holds, separated by commas.
func (k Kinds) String() string {
	var b strings.Builder
	for n := range k.All() {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n)
	}
	return b.String()
}

// Effects is what a piece of SQL text may do to the session.
type Effects struct {
	// Statements is the number of statements in the text.
	Statements int
	// Settings: the text may change session-level settings, or the role,
	// in a way a pooler must read back from the server (SET, RESET,
	// set_config, DISCARD ALL, SET SESSION CHARACTERISTICS, DO, CALL).
	Settings bool
	// Pin is the first kind of unmovable session state the text creates.
	Pin string
	// Unpin: DISCARD ALL, which removes every kind of session state.
	Unpin bool
	// Undo holds every kind of pinned state the text may have removed
	// (CLOSE, UNLISTEN, DROP TABLE, pg_advisory_unlock, RESET ROLE, ...;
	// see the package comment). It does not say the state is gone: the
	// statement may name something else, fail or be rolled back.
	Undo Kinds
	// BeginTx: the text opens a transaction block (BEGIN, START
	// TRANSACTION) that it does not end (COMMIT, END, ROLLBACK, ABORT).
	BeginTx bool
	// EndTx: the text ends a transaction block (COMMIT, END, ROLLBACK,
	// ABORT; not AND CHAIN, which opens the next) and opens none after it;
	// AfterEndTx: a statement follows that end, and so runs outside any
	// block the text opened or ended (it commits on its own).
	EndTx, AfterEndTx bool
	// DeallocateAll: DEALLOCATE ALL or DISCARD ALL. FirstDropAllDiscard:
	// the first of them in the text is a DISCARD ALL (its CommandComplete,
	// not a later one's, is when the server has dropped every prepared
	// statement; an error after it does not give them back).
	DeallocateAll, FirstDropAllDiscard bool
	// Deallocates counts the DEALLOCATE [PREPARE] name statements (see
	// Deallocations).
	Deallocates int
	// Calls: the text calls a function by name that is not one of the
	// common built-ins (see builtin), runs a DO block or CALL, or calls
	// set_config with a name it cannot read: this may change the role (a
	// function that runs SET ROLE or set_config('role', ...)) or set a
	// customized option under a name no text shows, so a pooler resets
	// both (RESET ROLE, RESET ALL) before another client uses the
	// connection.
	Calls bool
	// Commits: the text may commit a transaction: COMMIT, END, COMMIT AND
	// CHAIN, PREPARE TRANSACTION, COMMIT PREPARED, ROLLBACK PREPARED, or
	// DO and CALL (a procedure or DO block may COMMIT). A statement that
	// only rolls back (ROLLBACK, ABORT) does not count.
	Commits bool
	// Temp: the text creates a temporary object (ON COMMIT DROP too):
	// from then on the backend has a temporary schema, which changes how
	// PostgreSQL treats plans prepared before (see the proxy's tempSchema).
	Temp bool
}

// Interesting reports whether the text does anything a pooler must act on.
func (e Effects) Interesting() bool {
	return e.Settings || e.Pin != "" || e.Unpin || !e.Undo.Empty() || e.BeginTx || e.DeallocateAll || e.Deallocates > 0 || e.Temp
}

// maxWords is how many leading words of a statement are kept.
const maxWords = 8

type token struct {
	word   string // identifier or keyword as written (quoted: without quotes)
	pos    int    // where the token starts and ends in the text
	end    int
	str    bool // a string constant (only from a lexer with strs set)
	esc    bool // an escape string constant E'...' (str; word as written, backslashes kept)
	quoted bool
	punct  byte // non-zero for punctuation
}

// stmtFlags is what Scan notes of a whole statement, past its leading
// words.
type stmtFlags struct {
	temp         bool // TEMP, TEMPORARY or a pg_temp schema name
	create       bool // CREATE anywhere (EXPLAIN ANALYZE CREATE ... too)
	into         bool // INTO, not right after INSERT or MERGE (SELECT ... INTO)
	withHold     bool // WITH HOLD
	onCommitDrop bool // ON COMMIT DROP
	selected     bool // SELECT seen: the head of a DDL statement is over
}

// ringSize is how many of a statement's latest tokens Scan keeps (a power
// of two).
const ringSize = 8

// Scan reads sql and reports its effects.
func Scan(sql string) Effects {
	var e Effects
	var words []token
	var buf [maxWords]token
	words = buf[:0]
	inStmt := false
	var f stmtFlags
	// The statement's last tokens: the newest at ring[n%ringSize], the one
	// before at ring[(n-1)%ringSize], ...
	var ring [ringSize]token
	n := 0
	endStmt := func() {
		if inStmt {
			e.Statements++
			statement(&e, sql, words, f)
		}
		words = buf[:0]
		inStmt, f = false, stmtFlags{}
		ring = [ringSize]token{}
	}
	l := lexer{s: sql}
	for {
		t, ok := l.next()
		if !ok {
			break
		}
		if t.punct == ';' {
			endStmt()
			continue
		}
		inStmt = true
		if len(words) < maxWords {
			words = append(words, t)
		}
		prev := &ring[n&(ringSize-1)]
		if t.punct == 0 && !t.quoted && len(t.word) >= len("into") && len(t.word) <= len("temporary") {
			var lb [len("temporary")]byte
			switch lowerASCII(lb[:], t.word) {
			case "temp", "temporary":
				f.temp = true
			case "create":
				f.create = true
			case "into":
				f.into = f.into || !prev.is("insert") && !prev.is("merge")
			case "hold":
				f.withHold = f.withHold || prev.is("with")
			case "select":
				f.selected = true
			case "drop":
				if prev.is("commit") && ring[(n-1)&(ringSize-1)].is("on") {
					f.onCommitDrop = true
				}
			}
		}
		if t.punct == 0 && tempSchema(t.word) {
			f.temp = true
		}
		if t.punct == '(' && prev.word != "" && !e.Calls {
			w0 := word(words, 0)
			ddlHead := (w0.is("create") || w0.is("alter")) && !f.selected
			if call(&ring, n, ddlHead) {
				e.Calls = true
			}
		}
		n++
		ring[n&(ringSize-1)] = t
		if t.punct == 0 && len(t.word) >= len("set_config") && (t.word[0]|0x20 == 'p' || t.word[0]|0x20 == 's') {
			function(&e, t, sql)
		}
	}
	endStmt()
	return e
}

// tempSchema reports whether w names the temporary schema: pg_temp, or a
// backend's own pg_temp_N (any case: a quoted name in another case is
// another schema, but counting it errs to the safe side).
func tempSchema(w string) bool {
	return len(w) >= len("pg_temp") && (w[0] == 'p' || w[0] == 'P') && strings.EqualFold(w[:len("pg_temp")], "pg_temp") &&
		(len(w) == len("pg_temp") || w[len("pg_temp")] == '_')
}

// Name is a statement name in SQL text: Name as PostgreSQL reads it, at
// [Start, End) in the text (with its quotes, if quoted).
type Name struct {
	Name       string
	Start, End int
}

// Deallocations returns the names the DEALLOCATE statements of sql name,
// in order.
func Deallocations(sql string) []Name {
	var out []Name
	var buf [maxWords]token
	words := buf[:0]
	l := lexer{s: sql}
	flush := func() {
		if n, ok := deallocateName(words); ok {
			name := n.word
			if !n.quoted {
				name = strings.ToLower(name)
			}
			out = append(out, Name{Name: name, Start: n.pos, End: n.end})
		}
		words = buf[:0]
	}
	for {
		t, ok := l.next()
		if !ok {
			break
		}
		if t.punct == ';' {
			flush()
			continue
		}
		if len(words) < maxWords {
			words = append(words, t)
		}
	}
	flush()
	return out
}

// deallocateName returns the name token of a DEALLOCATE [PREPARE] name
// statement.
func deallocateName(ws []token) (token, bool) {
	if !word(ws, 0).is("deallocate") {
		return token{}, false
	}
	i := 1
	if word(ws, i).is("prepare") {
		i++
	}
	n := word(ws, i)
	if n.punct != 0 || n.is("all") || len(ws) != i+1 {
		return token{}, false
	}
	return n, true
}

// function notes a name that matters wherever it appears; t is a word of
// sql.
func function(e *Effects, t token, sql string) {
	// A quoted name is case-sensitive: only the built-in's own spelling
	// calls it.
	name := t.word
	var b [32]byte
	if !t.quoted {
		name = lowerASCII(b[:], name)
	}
	switch name {
	case "set_config":
		setConfig(e, sql, t.end)
	case "pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared":
		if e.Pin == "" {
			e.Pin = PinAdvisoryLock
		}
	case "pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all":
		e.Undo |= kindAdvisoryLock
	}
}

// setConfig notes a set_config whose name ends at sql[at:]: it changes
// settings, and it pins when it is a call that sets the role or the session
// authorization for the session (set_config('role', ..., false)). A call
// whose name or is_local argument is not a constant is left to the
// pooler's check of the session after it ran (Settings); one whose name is
// not a string constant that CustomOptions reads, and whose is_local is
// not the constant true, also counts as Calls: it may set a customized
// option that a pooler cannot ask for by name.
func setConfig(e *Effects, sql string, at int) {
	e.Settings = true
	a, ok := setConfigArgs(sql, at)
	if !ok {
		return // not a call: set_config as a column's name
	}
	if e.Pin == "" && a.named && (strings.EqualFold(a.name, "role") || strings.EqualFold(a.name, "session_authorization")) &&
		a.args == 3 && !a.local {
		e.Pin = PinRole
	}
	if !a.named && !a.local {
		e.Calls = true
	}
}

// configArgs is what setConfigArgs reads of a call set_config(name, value,
// is_local).
type configArgs struct {
	name  string // the name, when named
	named bool   // name is a string constant, possibly cast, alone
	args  int    // the number of arguments read (3 for a whole call)
	local bool   // is_local is the constant true
}

// setConfigArgs reads the arguments of a call set_config(name, value,
// is_local) starting at sql[at:] (after the function name); ok is false if
// no '(' follows.
func setConfigArgs(sql string, at int) (a configArgs, ok bool) {
	l := lexer{s: sql, i: at, strs: true}
	if t, _ := l.next(); t.punct != '(' {
		return a, false
	}
	name, _ := l.next()
	if name.str && !(name.esc && strings.IndexByte(name.word, '\\') >= 0) {
		t, _ := l.next()
		if t.punct == ':' { // 'myapp.tenant'::text
			if t, _ = l.next(); t.punct == ':' {
				if t, _ = l.next(); t.punct == 0 && !t.str {
					t, _ = l.next()
				}
			}
		}
		if t.punct == ',' {
			a.name, a.named, a.args = name.word, true, 1
		}
	}
	if !a.named {
		// 'ro' || 'le', $1, a column, E'\x72ole': skip to the comma at
		// this depth.
		if name.punct == '(' || name.punct == '[' {
			if skipArg(&l, 1) != ',' {
				return a, true
			}
		} else if name.punct == ')' || name.punct == ',' || skipArg(&l, 0) != ',' {
			return a, true
		}
		a.args = 1
	}
	// Skip the value, up to the comma at this depth; read is_local.
	if skipArg(&l, 0) != ',' {
		return a, true
	}
	a.args = 2
	var third token
	n := 0
	for depth := 1; depth > 0; {
		t, more := l.next()
		if !more || t.punct == ';' {
			return a, true
		}
		switch {
		case t.punct == '(' || t.punct == '[':
			depth++
		case t.punct == ')' || t.punct == ']':
			depth--
			if depth == 0 {
				continue
			}
		case t.punct == ',' && depth == 1:
			return a, true // a fourth argument: not the built-in
		}
		third = t
		n++
	}
	a.args = 3
	a.local = n == 1 && isTrue(third)
	return a, true
}

// skipArg skips the rest of an argument, depth parentheses deep already
// (relative to the argument list), and returns the punctuation that ends
// it: ',' or ')' at the list's depth, or 0 at the end of the statement.
func skipArg(l *lexer, depth int) byte {
	for {
		t, more := l.next()
		if !more || t.punct == ';' {
			return 0
		}
		switch {
		case t.punct == '(' || t.punct == '[':
			depth++
		case (t.punct == ')' || t.punct == ']') && depth > 0:
			depth--
		case t.punct == ')' || t.punct == ',' && depth == 0:
			return t.punct
		}
	}
}

// isTrue reports whether t is a constant that PostgreSQL reads as boolean
// true: true, 'true', 't', 'on', 'yes', '1' (any case, unique prefixes of
// true and yes, surrounding blanks).
func isTrue(t token) bool {
	if !t.str {
		return t.is("true")
	}
	v := strings.ToLower(strings.TrimSpace(t.word))
	switch v {
	case "t", "tr", "tru", "true", "y", "ye", "yes", "on", "1":
		return true
	}
	return false
}

// call reports whether the token at ring[n], followed by '(', is a call of
// a function that may run code the scanner cannot see: not SQL syntax (IN
// (, VALUES (, varchar(10), INSERT INTO t (cols), PARTITION BY RANGE (a)),
// not a built-in (unqualified or in pg_catalog). ring holds the tokens
// before it, ring[n-1] the nearest. ddlHead: the statement is a CREATE or
// ALTER and no SELECT has come yet, where ON t (cols) and USING method
// (cols) name a relation and an index method. What is not provably syntax
// or a built-in is a call.
func call(ring *[ringSize]token, n int, ddlHead bool) bool {
	at := func(i int) *token { return &ring[(n-i)&(ringSize-1)] }
	name, ctx, before, schema := at(0), at(1), at(2), &token{}
	if ctx.punct == '.' {
		schema, ctx, before = at(2), at(3), at(4)
	}
	if name.str || ctx.punct == ':' && before.punct == ':' {
		return false // ::type(n)
	}
	if !ctx.quoted && ctx.punct == 0 && notCallAfter(ctx.word, ddlHead) {
		return false // a relation's column list, a declaration
	}
	var b [32]byte
	if !name.quoted && schema.word == "" {
		w := lowerASCII(b[:], name.word)
		if syntax(w) || ddlHead && ddlSyntax(w) || keywordSyntax(w, ctx, ctx.punct == 0 && ctx.word == "" && !ctx.quoted) {
			return false
		}
	}
	if schema.word != "" && !(schema.quoted && schema.word == "pg_catalog" || schema.is("pg_catalog")) {
		return true
	}
	if name.quoted {
		return !builtin(name.word)
	}
	return !builtin(lowerASCII(b[:], name.word))
}

// lowerASCII returns w in lower case, in b if it fits (else "").
func lowerASCII(b []byte, w string) string {
	if len(w) > len(b) {
		return ""
	}
	for i := 0; i < len(w); i++ {
		c := w[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	return unsafe.String(&b[0], len(w))
}

// notCallAfter reports whether a name after keyword w (any case) is a
// relation, type or routine being named, not called: INSERT INTO t (cols),
// CREATE FUNCTION f(args), WITH q (cols) AS; with rel, also CREATE INDEX
// ON t (cols) and USING btree (cols) (elsewhere JOIN t ON f(x) and USING
// f(x) call f).
func notCallAfter(w string, rel bool) bool {
	var b [16]byte
	switch lowerASCII(b[:], w) {
	case "into", "table", "copy", "references", "function", "procedure", "routine",
		"aggregate", "view", "type", "with", "recursive", "as", "prepare", "domain", "trigger", "sequence", "index",
		"exists":
		return true
	case "on", "using":
		return rel
	}
	return false
}

// syntax reports whether a lower-case word before '(' is SQL syntax that
// can never be a function's name: PostgreSQL's reserved key words and
// those that cannot name a function (types with a modifier, CAST,
// COALESCE, ...).
func syntax(w string) bool {
	switch w {
	case "in", "exists", "values", "any", "all", "some", "and", "or", "not", "as", "on", "using", "group",
		"row", "array", "lateral", "where", "when", "then", "else", "case", "select", "from", "having",
		"returning", "into", "between", "limit", "offset", "distinct", "unique", "check", "default",
		"with", "window", "only", "analyze", "analyse", "table", "union", "intersect", "except", "to", "for",
		"placing", "grouping", "char", "character", "varchar", "nchar", "national", "numeric", "decimal",
		"dec", "float", "bit", "time", "timestamp", "interval", "coalesce", "nullif", "greatest", "least",
		"cast", "extract", "position", "substring", "trim", "overlay", "treat", "normalize", "xmlelement",
		"xmlforest", "xmlconcat", "xmlparse", "xmlpi", "xmlroot", "xmlserialize", "xmlexists",
		"xmlattributes", "xmlnamespaces", "xmltable", "current_timestamp", "current_time", "localtime",
		"localtimestamp":
		return true
	}
	return false
}

// ddlSyntax reports whether a lower-case key word before '(' is syntax in
// the head of a CREATE or ALTER statement (a table's or index's
// definition), though it may name a function elsewhere.
func ddlSyntax(w string) bool {
	switch w {
	case "key", "include", "partition", "range", "list", "hash", "options", "exclude", "identity",
		"set", "return", "varying", "over", "filter", "conflict", "collation", "tablesample", "repeatable":
		return true
	}
	return false
}

// keywordSyntax reports whether w, a lower-case key word that may also
// name a function (PostgreSQL's unreserved ones and those that can name a
// function or type), is syntax where it stands: after ctx, the token
// before it (start: w begins the statement). Elsewhere it is a call:
// hash(x), range(1, 2), over(y).
func keywordSyntax(w string, ctx *token, start bool) bool {
	switch w {
	case "over", "filter", "include", "repeatable":
		return ctx.punct == ')' // count(*) OVER (...), FILTER (WHERE ...)
	case "by":
		return ctx.is("group") || ctx.is("order") || ctx.is("partition")
	case "range", "list", "hash", "cube", "rollup":
		return ctx.is("by") // PARTITION BY RANGE (a), GROUP BY CUBE (a)
	case "sets":
		return ctx.is("grouping")
	case "key":
		return ctx.is("primary") || ctx.is("foreign")
	case "varying":
		return ctx.is("character") || ctx.is("bit")
	case "conflict":
		return ctx.is("on")
	case "first", "next":
		return ctx.is("fetch") // FETCH FIRST (n) ROWS ONLY
	case "explain", "vacuum", "reindex", "copy", "cluster":
		return start // EXPLAIN (ANALYZE) ..., COPY (SELECT ...) TO
	case "join", "is", "like", "ilike", "similar", "overlaps", "tablesample", "set":
		// Infix: a JOIN (subquery), x LIKE (pattern), UPDATE t SET (a, b)
		// = ...; after a key word that starts an expression it is a call.
		return ctx.punct == ')' || ctx.punct == 0 && ctx.word != "" && !ctx.str && !exprStart(ctx)
	}
	return false
}

// exprStart reports whether t is a key word after which an expression (and
// so a function call) starts.
func exprStart(t *token) bool {
	if t.quoted {
		return false
	}
	var b [16]byte
	switch lowerASCII(b[:], t.word) {
	case "select", "where", "and", "or", "not", "when", "then", "else", "on", "having", "by", "returning",
		"in", "values", "return", "using", "from", "distinct", "all", "any", "some", "case", "between",
		"is", "like", "ilike", "limit", "offset", "call", "perform", "do", "execute", "array", "row", "as",
		"join", "lateral", "set":
		return true
	}
	return false
}

// builtin reports whether a lower-case function name is a common built-in
// that runs no user code and leaves the role alone (set_config and the
// advisory locks are handled by name elsewhere). The list only saves work:
// a built-in missing from it costs a RESET ROLE, never a leak.
func builtin(w string) bool {
	switch w {
	case "count", "sum", "avg", "min", "max", "now", "lower", "upper", "length", "abs", "round",
		"floor", "ceil", "ceiling", "mod", "trunc", "sqrt", "power", "exp", "ln", "log", "sign", "random",
		"date_trunc", "date_part", "to_char", "to_timestamp", "to_date", "to_number", "age",
		"make_interval", "make_date", "make_timestamp", "make_timestamptz", "clock_timestamp",
		"statement_timestamp", "transaction_timestamp", "timezone",
		"array_agg", "string_agg", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg",
		"bool_and", "bool_or", "every", "row_number", "rank", "dense_rank", "percent_rank", "cume_dist",
		"ntile", "lag", "lead", "first_value", "last_value", "nth_value",
		"json_build_object", "jsonb_build_object", "json_build_array", "jsonb_build_array", "to_json",
		"to_jsonb", "row_to_json", "jsonb_set", "jsonb_insert", "jsonb_strip_nulls", "jsonb_typeof",
		"jsonb_array_length", "json_array_length", "jsonb_array_elements", "json_array_elements",
		"jsonb_array_elements_text", "json_array_elements_text", "jsonb_each", "json_each",
		"jsonb_each_text", "json_each_text", "jsonb_extract_path", "jsonb_extract_path_text",
		"array_length", "array_to_string", "string_to_array", "array_append", "array_prepend",
		"array_cat", "array_remove", "array_position", "cardinality", "unnest", "generate_series",
		"nextval", "currval", "setval", "lastval", "gen_random_uuid", "md5", "encode", "decode",
		"concat", "concat_ws", "substr", "replace", "split_part", "strpos", "left", "right", "lpad",
		"rpad", "btrim", "ltrim", "rtrim", "format", "initcap", "reverse", "repeat", "char_length",
		"character_length", "octet_length", "regexp_replace", "regexp_match", "regexp_matches",
		"regexp_split_to_array", "starts_with", "quote_ident", "quote_literal", "quote_nullable",
		"current_setting", "set_config", "pg_typeof", "pg_backend_pid", "pg_sleep", "pg_notify",
		"txid_current", "pg_current_xact_id", "version",
		"pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock",
		"pg_try_advisory_lock_shared", "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
		"pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared", "pg_advisory_unlock",
		"pg_advisory_unlock_shared", "pg_advisory_unlock_all":
		return true
	}
	return false
}

// is reports whether t is the unquoted keyword w (lower case).
func (t token) is(w string) bool {
	return t.punct == 0 && !t.quoted && !t.str && len(t.word) == len(w) && strings.EqualFold(t.word, w)
}

// isParam reports whether t names the configuration parameter w (lower
// case), quoted or not: PostgreSQL looks parameter names up ignoring case.
func (t token) isParam(w string) bool {
	return t.punct == 0 && !t.str && len(t.word) == len(w) && strings.EqualFold(t.word, w)
}

func word(ws []token, i int) token {
	if i < len(ws) {
		return ws[i]
	}
	return token{punct: ' '}
}

// statement applies the rules for one statement's leading words ws, words
// of sql.
func statement(e *Effects, sql string, ws []token, f stmtFlags) {
	pin := func(reason string) {
		if e.Pin == "" {
			e.Pin = reason
		}
	}
	if e.EndTx {
		e.AfterEndTx = true // this statement runs after the block's end
	}
	// Wherever it stands (past any number of words, after WITH, in
	// parentheses, in EXPLAIN ANALYZE), TEMP, TEMPORARY or pg_temp in a
	// statement that creates something pins; a table ON COMMIT DROP is
	// gone at the end of its transaction.
	if f.temp && (f.create || f.into) {
		e.Temp = true
		if !f.onCommitDrop {
			pin(PinTempTable)
		}
	}
	w0 := word(ws, 0)
	switch {
	case w0.is("set"):
		if at, auth, ok := setsRole(ws); ok {
			pin(PinRole)
			if resetsRole(sql, ws[at], auth) {
				e.Undo |= kindRole
			}
			break
		}
		switch w1 := word(ws, 1); {
		case w1.is("local"), w1.is("transaction"), w1.is("constraints"):
		default:
			e.Settings = true
		}
	case w0.is("reset"):
		// RESET ROLE and RESET SESSION AUTHORIZATION go back to the login
		// role; RESET ALL leaves both alone.
		e.Settings = true
		w1, w2 := word(ws, 1), word(ws, 2)
		if w1.is("session") && w2.is("authorization") ||
			(w1.isParam("role") || w1.isParam("session_authorization")) && w2.punct != '.' {
			e.Undo |= kindRole
		}
	case w0.is("do"), w0.is("call"):
		// DO and CALL run code that may change settings or the role, and
		// commit; what they set may be a customized option no text names.
		e.Settings, e.Commits, e.Calls = true, true, true
	case w0.is("discard"):
		switch w1 := word(ws, 1); {
		case w1.is("all"):
			e.FirstDropAllDiscard = e.FirstDropAllDiscard || !e.DeallocateAll
			e.Settings, e.DeallocateAll, e.Unpin = true, true, true
			e.Undo = allKinds
		case w1.is("temp"), w1.is("temporary"):
			e.Undo |= kindTempTable
		}
	case w0.is("drop"):
		// The relations PostgreSQL makes temporary; an unqualified name
		// may be one.
		if w1 := word(ws, 1); w1.is("table") || w1.is("view") || w1.is("sequence") {
			e.Undo |= kindTempTable
		}
	case w0.is("close"):
		if word(ws, 1).punct == 0 { // a cursor's name or ALL
			e.Undo |= kindCursorOnHold
		}
	case w0.is("unlisten"):
		if w1 := word(ws, 1); w1.punct == 0 || w1.punct == '*' {
			e.Undo |= kindListen
		}
	case w0.is("prepare"):
		if word(ws, 1).is("transaction") {
			e.Commits = true // the transaction outlives the session
		} else {
			pin(PinPrepare)
		}
	case w0.is("listen"):
		pin(PinListen)
	case w0.is("declare"):
		if f.withHold { // whatever the options between: BINARY INSENSITIVE NO SCROLL CURSOR WITH HOLD
			pin(PinCursorOnHold)
		}
	case w0.is("begin"), w0.is("start") && word(ws, 1).is("transaction"):
		e.BeginTx = true
		e.EndTx, e.AfterEndTx = false, false
	case w0.is("commit"), w0.is("end"), w0.is("abort"), w0.is("rollback"):
		w1 := word(ws, 1)
		if !w1.is("prepared") && !w1.is("to") && !(w1.is("and") && word(ws, 2).is("chain")) {
			e.BeginTx = false
			e.EndTx, e.AfterEndTx = true, false
		}
		if w0.is("commit") || w0.is("end") || w1.is("prepared") {
			e.Commits = true
		}
	case w0.is("deallocate"):
		i := 1
		if word(ws, i).is("prepare") {
			i++
		}
		if word(ws, i).is("all") {
			e.DeallocateAll = true
			e.Undo |= kindPrepare
		} else if _, ok := deallocateName(ws); ok {
			e.Deallocates++
			e.Undo |= kindPrepare
		}
	}
}

// setsRole reports whether a SET statement (ws[0] is SET) changes the role
// or the session authorization for the session: SET [SESSION] ROLE ...,
// SET [SESSION] SESSION AUTHORIZATION ..., SET [SESSION] role TO|= ... and
// SET [SESSION] session_authorization TO|= ..., the names quoted or not.
// SET LOCAL lasts until the end of the transaction and does not count. If
// it does, ws[at] is the word the value follows (ROLE, AUTHORIZATION, the
// parameter's name) and auth says whether it sets the session
// authorization.
func setsRole(ws []token) (at int, auth, ok bool) {
	i := 1
	if word(ws, i).is("session") && !word(ws, i+1).is("authorization") && !word(ws, i+1).is("characteristics") {
		i++
	}
	switch w := word(ws, i); {
	case w.is("session"):
		return i + 1, true, word(ws, i+1).is("authorization")
	case w.isParam("role"), w.isParam("session_authorization"):
		// not a custom option role.x
		return i, w.isParam("session_authorization"), word(ws, i+1).punct != '.'
	}
	return 0, false, false
}

// resetsRole reports whether the value of a session-level SET of the role
// (or, with auth, of the session authorization), which follows the token at
// of sql, sets it back to the login's: DEFAULT, or for the role NONE
// (also 'none' or "none", which PostgreSQL reads as NONE).
func resetsRole(sql string, at token, auth bool) bool {
	l := lexer{s: sql, i: at.end, strs: true}
	v, _ := l.next()
	if v.punct == '=' || v.is("to") {
		v, _ = l.next()
	}
	if v.is("default") {
		return true
	}
	return !auth && (v.is("none") || (v.quoted || v.str) && v.word == "none")
}

// lexer yields the tokens of SQL text that matter here: words and
// punctuation, with comments, strings and numbers skipped.
type lexer struct {
	s    string
	i    int
	strs bool // yield standard string constants as tokens
}

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func isIdentChar(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' || c == '$' }

func (l *lexer) next() (token, bool) {
	s := l.s
	for l.i < len(s) {
		c := s[l.i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			l.i++
		case c == '-' && l.i+1 < len(s) && s[l.i+1] == '-':
			for l.i < len(s) && s[l.i] != '\n' {
				l.i++
			}
		case c == '/' && l.i+1 < len(s) && s[l.i+1] == '*':
			l.blockComment()
		case c == '\'':
			start := l.i
			l.i++
			l.quoted('\'', false)
			if l.strs {
				w := l.s[start+1 : max(start+1, l.i-1)]
				return token{word: strings.ReplaceAll(w, "''", "'"), str: true, pos: start, end: l.i}, true
			}
		case (c == 'e' || c == 'E') && l.i+1 < len(s) && s[l.i+1] == '\'':
			start := l.i
			l.i += 2
			l.quoted('\'', true)
			if l.strs {
				w := l.s[start+2 : max(start+2, l.i-1)]
				return token{word: strings.ReplaceAll(w, "''", "'"), str: true, esc: true, pos: start, end: l.i}, true
			}
		case c == '"':
			start := l.i + 1
			l.i++
			l.quoted('"', false)
			end := max(start, l.i-1)
			w := s[start:end]
			if strings.Contains(w, `""`) {
				w = strings.ReplaceAll(w, `""`, `"`)
			}
			return token{word: w, quoted: true, pos: start - 1, end: l.i}, true
		case c == '$' && l.dollar():
		case isIdentStart(c):
			start := l.i
			for l.i < len(s) && isIdentChar(s[l.i]) {
				l.i++
			}
			return token{word: s[start:l.i], pos: start, end: l.i}, true
		case c >= '0' && c <= '9':
			for l.i < len(s) && (isIdentChar(s[l.i]) || s[l.i] == '.') {
				l.i++
			}
		default:
			l.i++
			return token{punct: c}, true
		}
	}
	return token{}, false
}

// blockComment skips a (nestable) /* */ comment.
func (l *lexer) blockComment() {
	depth := 0
	for l.i < len(l.s) {
		switch {
		case strings.HasPrefix(l.s[l.i:], "/*"):
			depth++
			l.i += 2
		case strings.HasPrefix(l.s[l.i:], "*/"):
			depth--
			l.i += 2
			if depth == 0 {
				return
			}
		default:
			l.i++
		}
	}
}

// quoted skips to after the closing quote q (doubled quotes stay inside;
// with backslash, a backslash escapes the next byte).
func (l *lexer) quoted(q byte, backslash bool) {
	for l.i < len(l.s) {
		c := l.s[l.i]
		l.i++
		switch {
		case backslash && c == '\\':
			l.i++
		case c == q:
			if l.i < len(l.s) && l.s[l.i] == q {
				l.i++
				continue
			}
			return
		}
	}
}

// dollar skips a dollar-quoted string starting at l.i and reports whether
// there was one ($1 parameters are not).
func (l *lexer) dollar() bool {
	s := l.s
	j := l.i + 1
	for j < len(s) && s[j] != '$' {
		if !isIdentChar(s[j]) || s[j] == '$' || (j == l.i+1 && s[j] >= '0' && s[j] <= '9') {
			return false
		}
		j++
	}
	if j >= len(s) {
		return false
	}
	tag := s[l.i : j+1]
	end := strings.Index(s[j+1:], tag)
	if end < 0 {
		l.i = len(s)
	} else {
		l.i = j + 1 + end + len(tag)
	}
	return true
}

// CustomOptions returns the customized options (names with a dot, such as
// myapp.tenant) that SQL text sets or resets, in lower case: PostgreSQL
// does not list them in pg_settings, so a pooler must ask for them by name.
// It reads SET [SESSION] a.b[.c...], RESET a.b[.c...] (names quoted or
// not) and set_config('a.b', ...) (also "set_config", pg_catalog.set_config,
// E'a.b' without backslashes, 'a.b'::text). A name it cannot read (a
// computed one, $1, an E'...' string with escapes) is for Scan to report as
// Calls; a name set in a DO block, a procedure or a function is not read
// either.
func CustomOptions(sql string) []string {
	var out []string
	add := func(name string) {
		if !strings.Contains(name, ".") {
			return
		}
		name = strings.ToLower(name)
		for _, o := range out {
			if o == name {
				return
			}
		}
		out = append(out, name)
	}
	l := lexer{s: sql, strs: true}
	var stmt [16]token // the statement's first tokens
	k := 0             // how many of them
	var p1, p2 token   // the two tokens before the current one
	flush := func() {
		if name, ok := setName(stmt[:k]); ok {
			add(name)
		}
		k = 0
		p1, p2 = token{}, token{}
	}
	for {
		t, ok := l.next()
		if !ok {
			break
		}
		if t.punct == ';' {
			flush()
			continue
		}
		// set_config('name', ...)
		if t.str && p1.punct == '(' && (p2.is("set_config") || p2.quoted && p2.word == "set_config") &&
			!(t.esc && strings.IndexByte(t.word, '\\') >= 0) {
			add(t.word)
		}
		if k < len(stmt) {
			stmt[k] = t
			k++
		}
		p2, p1 = p1, t
	}
	flush()
	return out
}

// setName reads the name of a session-level SET [SESSION] or RESET of a
// dotted name from a statement's first tokens ws.
func setName(ws []token) (string, bool) {
	i := 1
	switch {
	case word(ws, 0).is("set"):
		if word(ws, 1).is("session") {
			i = 2
		}
	case word(ws, 0).is("reset"):
	default:
		return "", false
	}
	var b strings.Builder
	for ; ; i += 2 {
		w := word(ws, i)
		if w.punct != 0 || w.str {
			return "", false
		}
		b.WriteString(w.word)
		if word(ws, i+1).punct != '.' {
			break
		}
		b.WriteByte('.')
	}
	return b.String(), true
}
