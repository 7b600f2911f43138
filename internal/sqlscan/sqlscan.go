// Package sqlscan is a small lexer over SQL text that finds what a
// statement does to the session: a pooler in transaction mode must know when
// a client changes settings, creates state that only its own server
// connection holds (a temp table, LISTEN, a session advisory lock, ...), opens
// a transaction block or deallocates prepared statements.
//
// It is not a parser. It splits text into statements at top-level
// semicolons, skipping comments, quoted identifiers, string constants
// (standard, E'', dollar-quoted), and reads the first words of each statement
// plus any function names, which is what PostgreSQL's command tags cannot
// tell (CREATE TABLE does not say TEMP, SELECT does not say it took a lock).
package sqlscan

import "strings"

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

// Effects is what a piece of SQL text may do to the session.
type Effects struct {
	// Statements is the number of statements in the text.
	Statements int
	// Settings: the text may change session-level settings (SET, RESET,
	// set_config, DISCARD ALL, SET SESSION CHARACTERISTICS).
	Settings bool
	// Pin is the first kind of unmovable session state the text creates.
	Pin string
	// Unpin: DISCARD ALL, which removes every kind of session state.
	Unpin bool
	// BeginTx: the text opens a transaction block (BEGIN, START TRANSACTION).
	BeginTx bool
	// DeallocateAll: DEALLOCATE ALL or DISCARD ALL.
	DeallocateAll bool
	// Deallocate is the statement name of a text that is exactly one
	// DEALLOCATE [PREPARE] name, folded as PostgreSQL folds identifiers.
	Deallocate string
}

// Interesting reports whether the text does anything a pooler must act on.
func (e Effects) Interesting() bool {
	return e.Settings || e.Pin != "" || e.Unpin || e.BeginTx || e.DeallocateAll || e.Deallocate != ""
}

// maxWords is how many leading words of a statement are kept.
const maxWords = 8

type token struct {
	word   string // identifier or keyword as written (quoted: without quotes)
	quoted bool
	punct  byte // non-zero for punctuation
}

// Scan reads sql and reports its effects.
func Scan(sql string) Effects {
	var e Effects
	var words []token
	var buf [maxWords]token
	words = buf[:0]
	inStmt := false
	endStmt := func() {
		if inStmt {
			e.Statements++
			statement(&e, words)
		}
		words = buf[:0]
		inStmt = false
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
		if t.punct == 0 && !t.quoted && len(t.word) >= len("set_config") && (t.word[0]|0x20 == 'p' || t.word[0]|0x20 == 's') {
			function(&e, t.word)
		}
	}
	endStmt()
	if e.Statements != 1 {
		e.Deallocate = ""
	}
	return e
}

// function notes a name that matters wherever it appears.
func function(e *Effects, w string) {
	for _, f := range [...]string{"pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared"} {
		if len(w) == len(f) && strings.EqualFold(w, f) {
			if e.Pin == "" {
				e.Pin = PinAdvisoryLock
			}
			return
		}
	}
	if len(w) == len("set_config") && strings.EqualFold(w, "set_config") {
		e.Settings = true
	}
}

// is reports whether t is the unquoted keyword w (lower case).
func (t token) is(w string) bool {
	return t.punct == 0 && !t.quoted && len(t.word) == len(w) && strings.EqualFold(t.word, w)
}

func word(ws []token, i int) token {
	if i < len(ws) {
		return ws[i]
	}
	return token{punct: ' '}
}

// statement applies the rules for one statement's leading words.
func statement(e *Effects, ws []token) {
	pin := func(reason string) {
		if e.Pin == "" {
			e.Pin = reason
		}
	}
	// A leading parenthesis or WITH does not hide SELECT ... INTO TEMP.
	w0 := word(ws, 0)
	switch {
	case w0.is("set"):
		switch w1 := word(ws, 1); {
		case w1.is("local"), w1.is("transaction"), w1.is("constraints"):
		case w1.is("role"):
			pin(PinRole)
		case w1.is("session") && word(ws, 2).is("authorization"):
			pin(PinRole)
		default:
			e.Settings = true
		}
	case w0.is("reset"):
		e.Settings = true
	case w0.is("discard"):
		if word(ws, 1).is("all") {
			e.Settings, e.DeallocateAll, e.Unpin = true, true, true
		}
	case w0.is("create"):
		for i := 1; i < len(ws) && i < 5; i++ {
			if ws[i].is("temp") || ws[i].is("temporary") {
				pin(PinTempTable)
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
		if !word(ws, 1).is("transaction") {
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
	case w0.is("deallocate"):
		i := 1
		if word(ws, i).is("prepare") {
			i++
		}
		switch n := word(ws, i); {
		case n.is("all"):
			e.DeallocateAll = true
		case n.punct == 0 && len(ws) == i+1:
			e.Deallocate = n.word
			if !n.quoted {
				e.Deallocate = strings.ToLower(n.word)
			}
		}
	}
}

// lexer yields the tokens of SQL text that matter here: words and
// punctuation, with comments, strings and numbers skipped.
type lexer struct {
	s string
	i int
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
			l.i++
			l.quoted('\'', false)
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
			return token{word: w, quoted: true}, true
		case c == '$' && l.dollar():
		case isIdentStart(c):
			start := l.i
			for l.i < len(s) && isIdentChar(s[l.i]) {
				l.i++
			}
			return token{word: s[start:l.i]}, true
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
