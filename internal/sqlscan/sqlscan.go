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
// What pins (Effects.Pin, the first kind in the text):
//
//   - PinTempTable: CREATE ... TEMP | TEMPORARY TABLE, VIEW or SEQUENCE (not a
//     table ON COMMIT DROP), SELECT ... INTO TEMP.
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
// built-in is reported as Calls: the function may set the role.
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
	// DeallocateAll: DEALLOCATE ALL or DISCARD ALL.
	DeallocateAll bool
	// Deallocates counts the DEALLOCATE [PREPARE] name statements (see
	// Deallocations).
	Deallocates int
	// Calls: the text calls a function by name that is not one of the
	// common built-ins (see builtin), which may change the role (a
	// function that runs SET ROLE or set_config('role', ...)).
	Calls bool
	// Commits: the text may commit a transaction: COMMIT, END, COMMIT AND
	// CHAIN, PREPARE TRANSACTION, COMMIT PREPARED, ROLLBACK PREPARED, or
	// DO and CALL (a procedure or DO block may COMMIT). A statement that
	// only rolls back (ROLLBACK, ABORT) does not count.
	Commits bool
}

// Interesting reports whether the text does anything a pooler must act on.
func (e Effects) Interesting() bool {
	return e.Settings || e.Pin != "" || e.Unpin || !e.Undo.Empty() || e.BeginTx || e.DeallocateAll || e.Deallocates > 0
}

// maxWords is how many leading words of a statement are kept.
const maxWords = 8

type token struct {
	word   string // identifier or keyword as written (quoted: without quotes)
	pos    int    // where the token starts and ends in the text
	end    int
	str    bool // a string constant (only from a lexer with strs set)
	quoted bool
	punct  byte // non-zero for punctuation
}

// Scan reads sql and reports its effects.
func Scan(sql string) Effects {
	var e Effects
	var words []token
	var buf [maxWords]token
	words = buf[:0]
	inStmt, onCommitDrop := false, false
	// The statement's last tokens: the newest at ring[n&3], the one before
	// at ring[(n-1)&3], ...
	var ring [4]token
	n := 0
	endStmt := func() {
		if inStmt {
			e.Statements++
			statement(&e, sql, words, onCommitDrop)
		}
		words = buf[:0]
		inStmt, onCommitDrop = false, false
		ring = [4]token{}
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
		if t.is("drop") && ring[n&3].is("commit") && ring[(n-1)&3].is("on") {
			onCommitDrop = true
		}
		if t.punct == '(' && ring[n&3].word != "" && !e.Calls && call(&ring[n&3], &ring[(n-1)&3], &ring[(n-2)&3], &ring[(n-3)&3]) {
			e.Calls = true
		}
		n++
		ring[n&3] = t
		if t.punct == 0 && len(t.word) >= len("set_config") && (t.word[0]|0x20 == 'p' || t.word[0]|0x20 == 's') {
			function(&e, t, sql)
		}
	}
	endStmt()
	return e
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
// pooler's check of the session after it ran (Settings).
func setConfig(e *Effects, sql string, at int) {
	e.Settings = true
	if e.Pin == "" && setsRoleConfig(sql, at) {
		e.Pin = PinRole
	}
}

// setsRoleConfig reads the arguments of a call set_config(name, value,
// is_local) starting at sql[at:] (after the function name): it reports
// whether name is the string constant 'role' or 'session_authorization'
// (possibly cast) and is_local is not the constant true.
func setsRoleConfig(sql string, at int) bool {
	l := lexer{s: sql, i: at, strs: true}
	if t, _ := l.next(); t.punct != '(' {
		return false
	}
	name, _ := l.next()
	if !name.str || !strings.EqualFold(name.word, "role") && !strings.EqualFold(name.word, "session_authorization") {
		return false // most calls stop here: set_config('app.tenant', ...)
	}
	if t, _ := l.next(); t.punct == ':' { // 'role'::text
		if t, _ = l.next(); t.punct != ':' {
			return false
		}
		if t, _ = l.next(); t.punct != 0 || t.str {
			return false
		}
		t, _ = l.next()
		if t.punct != ',' {
			return false
		}
	} else if t.punct != ',' {
		return false // 'ro' || 'le', 'ro' 'le', ...
	}
	// Skip the value, up to the comma at this depth; read is_local.
	arg, depth, n := 1, 1, 0
	var third token
	for depth > 0 {
		t, more := l.next()
		if !more || t.punct == ';' {
			return false
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
			arg++
			continue
		}
		if arg == 2 {
			third = t
			n++
		}
	}
	return arg == 2 && !(n == 1 && isTrue(third))
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

// call reports whether name, followed by '(', is a call of a function that
// may run code the scanner cannot see: not SQL syntax (IN (, VALUES (,
// varchar(10), INSERT INTO t (cols), CREATE FUNCTION f(args)), not a
// built-in (unqualified or in pg_catalog). p1, p2 and p3 are the tokens
// before name, nearest first.
func call(name, p1, p2, p3 *token) bool {
	ctx, schema := p1, &token{}
	if ctx.punct == '.' {
		schema, ctx = p2, p3
	}
	if name.str || ctx.punct == ':' || !ctx.quoted && ctx.punct == 0 && notCallAfter(ctx.word) {
		return false // ::type(n), a relation's column list, a declaration
	}
	var b [32]byte
	if !name.quoted && syntax(lowerASCII(b[:], name.word)) {
		return false
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
// CREATE FUNCTION f(args), CREATE INDEX ON t (cols), USING btree (cols).
func notCallAfter(w string) bool {
	var b [16]byte
	switch lowerASCII(b[:], w) {
	case "into", "table", "copy", "references", "on", "using", "function", "procedure", "routine",
		"aggregate", "view", "type", "with", "as", "prepare", "domain", "trigger", "sequence", "index",
		"exists":
		return true
	}
	return false
}

// syntax reports whether a lower-case word before '(' is SQL syntax or a
// type with a modifier rather than a function.
func syntax(w string) bool {
	switch w {
	case "in", "exists", "values", "any", "all", "some", "and", "or", "not", "as", "on", "using", "over",
		"filter", "group", "row", "array", "lateral", "where", "when", "then", "else", "case", "select",
		"from", "join", "by", "having", "returning", "set", "into", "is", "between", "like", "ilike",
		"limit", "offset", "distinct", "conflict", "key", "unique", "check", "default", "include",
		"partition", "range", "list", "hash", "with", "tablesample", "repeatable", "window", "rows",
		"groups", "grouping", "sets", "cube", "rollup", "only", "recursive", "analyze", "explain",
		"vacuum", "reindex", "copy", "options", "table", "return", "exclude", "ordinality",
		"union", "intersect", "except", "identity", "to",
		"char", "character", "varchar", "varying", "nchar", "national", "numeric", "decimal", "dec",
		"float", "bit", "time", "timestamp", "interval", "coalesce", "nullif", "greatest", "least",
		"cast", "extract", "position", "substring", "trim", "overlay", "treat", "normalize", "collation",
		"xmlelement", "xmlforest", "xmlconcat", "xmlparse", "xmlpi", "xmlroot", "xmlserialize",
		"xmlexists", "xmlattributes", "current_timestamp", "current_time", "localtime", "localtimestamp":
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
func statement(e *Effects, sql string, ws []token, onCommitDrop bool) {
	pin := func(reason string) {
		if e.Pin == "" {
			e.Pin = reason
		}
	}
	if e.EndTx {
		e.AfterEndTx = true // this statement runs after the block's end
	}
	// A leading parenthesis or WITH does not hide SELECT ... INTO TEMP.
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
		// commit.
		e.Settings, e.Commits = true, true
	case w0.is("discard"):
		switch w1 := word(ws, 1); {
		case w1.is("all"):
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
	case w0.is("create"):
		for i := 1; i < len(ws) && i < 5; i++ {
			if ws[i].is("temp") || ws[i].is("temporary") {
				if !onCommitDrop { // gone at the end of its transaction
					pin(PinTempTable)
				}
				break
			}
			if ws[i].is("table") || ws[i].is("view") || ws[i].is("sequence") {
				break
			}
		}
	case w0.is("select"):
		for i := 1; i+1 < len(ws); i++ {
			if ws[i].is("into") && (ws[i+1].is("temp") || ws[i+1].is("temporary")) {
				pin(PinTempTable)
			}
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
		for i := 1; i+1 < len(ws); i++ {
			if ws[i].is("with") && ws[i+1].is("hold") {
				pin(PinCursorOnHold)
			}
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
			l.i += 2
			l.quoted('\'', true)
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
// myapp.tenant) that SQL text sets or resets: PostgreSQL does not list them
// in pg_settings, so a pooler must ask for them by name.
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
	var prev []token // the statement so far, up to a few tokens
	for {
		t, ok := l.next()
		if !ok {
			break
		}
		if t.punct == ';' {
			prev = prev[:0]
			continue
		}
		// set_config('name', ...)
		if t.str && len(prev) >= 2 && prev[len(prev)-1].punct == '(' && prev[len(prev)-2].is("set_config") {
			add(t.word)
		}
		prev = append(prev, t)
		// SET [SESSION] a.b / RESET a.b: a word, a dot and a word after the keyword.
		if n := len(prev); n >= 3 && prev[n-2].punct == '.' && prev[n-1].punct == 0 && !prev[n-1].str {
			k := 0
			if prev[0].is("set") || prev[0].is("reset") {
				k = 1
				if prev[0].is("set") && word(prev, 1).is("session") {
					k = 2
				}
			}
			if k > 0 && n == k+3 {
				add(prev[k].word + "." + prev[k+2].word)
			}
		}
	}
	return out
}
