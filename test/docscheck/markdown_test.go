package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/poolerd/poolerd/test/mdtable"
)

// A quote is a message the docs attribute to poolerd.
type quote struct {
	file string
	line int
	text string // as written, severity and SQLSTATE included
	why  string // which rule picked it
}

// messageColumns are the table headers whose cells quote messages.
var messageColumns = map[string]bool{
	"message": true, "reason": true, "DETAIL": true, "HINT": true, "errors": true, "`SET` error": true,
}

var (
	spanRE = regexp.MustCompile("`([^`]+)`")
	// psql's way of printing a server message, in code blocks.
	psqlLine = regexp.MustCompile(`^\s*(?:ERROR|FATAL|WARNING|NOTICE|DETAIL|HINT):\s+(.+)$`)
	// poolerd's docs' way: ERROR 08006 message, DETAIL: ..., HINT: ...
	sevCodeLine  = regexp.MustCompile(`^\s*(?:ERROR|FATAL) [0-9A-Z]{5} (.+)$`)
	jsonMsg      = regexp.MustCompile(`"msg":"((?:[^"\\]|\\.)*)"`)
	trailingCode = regexp.MustCompile(`\s*\([0-9A-Z]{5}\)$`)
	// A SQLSTATE: five digits or upper-case letters, at least one a digit
	// (so that PAUSE is not one).
	sqlstate   = `(?:[0-9][0-9A-Z]{4}|[A-Z][0-9][0-9A-Z]{3}|[A-Z]{2}[0-9][0-9A-Z]{2}|[A-Z]{3}[0-9][0-9A-Z]|[A-Z]{4}[0-9])`
	sevCode    = regexp.MustCompile(`^(?:ERROR|FATAL) ` + sqlstate + `$`)
	sevCodeMsg = regexp.MustCompile(`^(?:ERROR|FATAL) ` + sqlstate + ` (.+)$`)
	codeMsg    = regexp.MustCompile(`^` + sqlstate + ` ([a-z].+)$`)
	// Text before a span that says the span is a log message: "logs `x`",
	// "logged `x`", "logged as `x`", "Logged at `info` as `x`".
	leadingCode    = regexp.MustCompile(`^` + sqlstate + `( |$)`)
	consoleCommand = regexp.MustCompile(`^(?:PAUSE|RESUME|DISABLE|ENABLE|RECONNECT|WAIT_CLOSE|KILL|KILL_CLIENT)(?: db| id)?;?$`)
	logVerb        = regexp.MustCompile(`(?i)\blog(?:s|ged)(?: as)?\s*$`)
	logNext        = regexp.MustCompile(`^\s*(?:then|or|and|,)\s*$`)
	logLevel       = regexp.MustCompile(`(?i)\blogged at\s*$`)
	levels         = map[string]bool{"debug": true, "info": true, "warn": true, "error": true}
)

// docFiles are the documents checked: the README and the docs of poolerd's
// behaviour. docs/admin-console-reference.md is left out on purpose: it
// documents PgBouncer's console and quotes PgBouncer's messages.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "deploy", "grafana", "README.md")}
	md, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range md {
		switch filepath.Base(f) {
		case "admin-console-reference.md", "benchmarks.md", "benchmarks-latest.md", "benchmarks-micro.md":
			continue
		}
		files = append(files, f)
	}
	return files
}

// quotes extracts the messages a markdown file quotes.
func quotes(t *testing.T, file string) []quote {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := filepath.Rel(root, file)
	lines := strings.Split(string(b), "\n")
	var out []quote
	addQ := func(line int, text, why string) {
		text = strings.TrimSpace(text)
		if text != "" {
			out = append(out, quote{file: name, line: line + 1, text: text, why: why})
		}
	}
	// inline applies the rules for spans in running text (a paragraph or
	// a table cell) to text, which starts on line.
	inline := func(line int, text string, all bool) {
		locs := spanRE.FindAllStringSubmatchIndex(text, -1)
		prevEnd := 0
		afterLevel := false // the previous span was the level of "logged at `info` as"
		logged := false     // the previous span was a logged message
		for i, l := range locs {
			span := text[l[2]:l[3]]
			gap := text[prevEnd:l[0]]
			prevEnd = l[1]
			switch {
			case all && consoleCommand.MatchString(span):
				// A command named in a table of console errors.
			case all:
				addQ(line, span, "a message column of a table")
			case sevCodeMsg.MatchString(span):
				addQ(line, span, "`SEVERITY CODE message`")
			case codeMsg.MatchString(span):
				addQ(line, span, "`CODE message`")
			case i > 0 && strings.TrimSpace(gap) == "" && sevCode.MatchString(text[locs[i-1][2]:locs[i-1][3]]):
				addQ(line, span, "after `SEVERITY CODE`")
			case logged && levels[span] && strings.TrimSpace(gap) == "at":
				// "logs `poolerd stopped` at `error` with `…`"
				continue
			case levels[span] && logLevel.MatchString(gap):
				afterLevel = true
				continue
			case afterLevel && strings.TrimSpace(gap) == "as":
				addQ(line, span, "logged at `level` as")
				logged = true
				afterLevel = false
				continue
			case logVerb.MatchString(gap) && !levels[span]:
				addQ(line, span, "after logs/logged")
				logged = true
				afterLevel = false
				continue
			case logged && logNext.MatchString(gap):
				addQ(line, span, "a further logged message")
				continue
			case logged && strings.TrimSpace(gap) == "with" && strings.Contains(span, " "):
				// "logs `poolerd stopped` with `the error`" (a field
				// name has no space).
				addQ(line, span, "the error a logged message comes with")
			}
			logged = false
			afterLevel = false
		}
	}
	var para []string
	paraStart := 0
	flush := func() {
		if len(para) > 0 {
			inline(paraStart, strings.Join(para, " "), false)
		}
		para = nil
	}
	for i := 0; i < len(lines); i++ {
		ln := lines[i]
		trim := strings.TrimSpace(ln)
		switch {
		case strings.HasPrefix(trim, "```"):
			flush()
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
				code := lines[i]
				if m := psqlLine.FindStringSubmatch(code); m != nil {
					// The docs may show the SQLSTATE after the message,
					// as psql's VERBOSITY does in its own way.
					addQ(i, trailingCode.ReplaceAllString(m[1], ""), "psql output in a code block")
				} else if m := sevCodeLine.FindStringSubmatch(code); m != nil {
					addQ(i, m[1], "ERROR CODE line in a code block")
				}
				for _, m := range jsonMsg.FindAllStringSubmatch(code, -1) {
					addQ(i, m[1], `"msg" of a JSON log line`)
				}
			}
		case strings.HasPrefix(trim, "|") && i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "|-"):
			flush()
			header := mdtable.Cells(trim)
			for i += 2; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
				for c, cell := range mdtable.Cells(strings.TrimSpace(lines[i])) {
					inline(i, cell, c < len(header) && messageColumns[header[c]])
				}
			}
			i--
		case trim == "" || strings.HasPrefix(trim, "#"):
			flush()
		default:
			if len(para) == 0 {
				paraStart = i
			}
			para = append(para, trim)
		}
	}
	flush()
	return out
}

// message is the part of a quote to look for in the code: without a
// leading severity and SQLSTATE.
func message(q string) string {
	q = strings.TrimSpace(q)
	for _, sev := range []string{"ERROR", "FATAL", "WARNING", "NOTICE"} {
		if rest, ok := strings.CutPrefix(q, sev); ok && (rest == "" || rest[0] == ' ' || rest[0] == ':') {
			q = strings.TrimLeft(rest, ": ")
			break
		}
	}
	if m := leadingCode.FindString(q); m != "" {
		q = strings.TrimSpace(q[len(m):])
	}
	return q
}
