package txstate

import (
	"fmt"
	"sort"
	"strings"

	"github.com/poolerd/poolerd/internal/wire"
)

// SyncedParam reports whether a parameter PostgreSQL reports with
// ParameterStatus is one poolerd keeps per client: a client-settable
// parameter whose value differs between sessions. The others (server_version,
// is_superuser, ...) are fixed per server and user.
func SyncedParam(name string) bool {
	switch name {
	case "application_name", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone",
		"standard_conforming_strings", "default_transaction_read_only", "search_path":
		return true
	}
	return false
}

// CanonicalParam returns the name PostgreSQL uses for a parameter
// (parameter names are case-insensitive; the mixed-case ones are reported
// in their canonical spelling).
func CanonicalParam(name string) string {
	lower := strings.ToLower(name)
	switch lower {
	case "datestyle":
		return "DateStyle"
	case "intervalstyle":
		return "IntervalStyle"
	case "timezone":
		return "TimeZone"
	}
	return lower
}

// StartupParams turns a client's startup packet parameters into the session
// parameters to apply: user, database and protocol options are removed and
// options=-c name=value is expanded, as PostgreSQL does. The parameters
// ignore names (ignore_startup_parameters) are dropped (Ignored).
func StartupParams(raw map[string]string, ignore []string) (map[string]string, error) {
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		switch {
		case k == "user", k == "database", k == "replication", strings.HasPrefix(k, "_pq_."):
			// replication: read by startup (proxy's parseReplication)
		case k == "options":
			opts, err := ParseOptions(v)
			if err != nil {
				if Ignored(ignore, k, false) {
					continue // PgBouncer drops an options it cannot read, when listed
				}
				return nil, &wire.Error{Severity: "FATAL", Code: "08P01", Message: err.Error(),
					Hint: "poolerd accepts -c name=value and --name=value in options"}
			}
			for name, value := range opts {
				if !Ignored(ignore, name, true) {
					out[CanonicalParam(name)] = value
				}
			}
		case Ignored(ignore, k, false):
		default:
			out[CanonicalParam(k)] = v
		}
	}
	return out, nil
}

// Ignored reports whether a startup parameter (fromOptions: a setting in
// the options parameter) is dropped by ignore_startup_parameters, as
// PgBouncer drops it: a parameter the list names, and with options listed
// every setting in options, except the parameters PgBouncer always applies
// (client_encoding, DateStyle, TimeZone, standard_conforming_strings,
// application_name, and IntervalStyle, its default track_extra_parameters).
// Names compare without regard to case.
func Ignored(ignore []string, name string, fromOptions bool) bool {
	if len(ignore) == 0 {
		return false
	}
	switch CanonicalParam(name) {
	case "client_encoding", "DateStyle", "TimeZone", "standard_conforming_strings", "application_name", "IntervalStyle":
		return false
	}
	for _, n := range ignore {
		if strings.EqualFold(n, name) || fromOptions && strings.EqualFold(n, "options") {
			return true
		}
	}
	return false
}

// ParseOptions splits a startup "options" value like PostgreSQL's
// pg_split_opts (whitespace separates, backslash escapes the next byte) and
// reads the -c name=value and --name=value switches.
func ParseOptions(s string) (map[string]string, error) {
	var words []string
	var cur strings.Builder
	inWord, escaped := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			cur.WriteByte(c)
			escaped = false
		case c == '\\':
			escaped, inWord = true, true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	out := map[string]string{}
	for i := 0; i < len(words); i++ {
		w := words[i]
		var assign string
		switch {
		case w == "-c":
			if i+1 >= len(words) {
				return nil, fmt.Errorf("options: -c needs name=value")
			}
			i++
			assign = words[i]
		case strings.HasPrefix(w, "-c"):
			assign = w[2:]
		case strings.HasPrefix(w, "--"):
			assign = w[2:]
		default:
			// The messages quote at most a switch's two characters: they
			// are logged, and the rest of options may carry any value.
			if len(w) >= 2 && w[0] == '-' {
				return nil, fmt.Errorf("options: switch %q is not supported: only -c name=value and --name=value are", w[:2])
			}
			return nil, fmt.Errorf("options: word %d is not a switch: only -c name=value and --name=value are accepted", i+1)
		}
		name, value, ok := strings.Cut(assign, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("options: word %d is not name=value", i+1)
		}
		out[strings.ReplaceAll(name, "-", "_")] = value
	}
	return out, nil
}

// PrintableASCII reports whether PostgreSQL stores s unchanged as an
// application_name (it rewrites other bytes).
func PrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 32 || s[i] > 126 {
			return false
		}
	}
	return true
}

// QuoteLiteral quotes s as an escape string constant, which means the same
// whatever standard_conforming_strings is.
func QuoteLiteral(s string) string {
	var b strings.Builder
	b.WriteString("E'")
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\'':
			b.WriteString("''")
		case '\\':
			b.WriteString(`\\`)
		default:
			b.WriteByte(s[i])
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// QuoteIdent quotes a (possibly dotted, for custom options) parameter name.
func QuoteIdent(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

// Param is a parameter and its value.
type Param struct {
	Name  string // the parameter's name
	Value string // its value
}

// SetConfigSQL sets parameters with set_config, which takes the value as
// the startup packet does (a list like search_path stays one string).
func SetConfigSQL(params []Param) string {
	var b strings.Builder
	b.WriteString("SELECT ")
	for i, p := range params {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "pg_catalog.set_config(%s, %s, false)", QuoteLiteral(p.Name), QuoteLiteral(p.Value))
	}
	return b.String()
}

// ParamsKey encodes a client's parameters (names and values, sorted), so
// that equal keys mean equal parameters. It is never empty.
func ParamsKey(params map[string]string) string {
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteByte(1)
	for _, name := range names {
		b.WriteString(name)
		b.WriteByte(0)
		b.WriteString(params[name])
		b.WriteByte(0)
	}
	return b.String()
}

// SyncStmt is one statement of a parameter sync: its SQL, and the
// unreported parameter it sets (Name "" for a RESET and for a reported
// parameter, which ParameterStatus keeps exact). set_config answers with
// the value as the server keeps it ('16MB' for '16384kB'), which becomes
// the connection's applied value.
type SyncStmt struct {
	SQL  string // the statement, one Query
	Name string // the unreported parameter it sets, or ""
}

// ParamSyncSQL returns the statements that give a server connection the
// session parameters of a client, none if it has them already. want holds
// the client's values, reported the connection's reported parameters
// (ParameterStatus) and applied the other parameters poolerd applied on
// it; a parameter poolerd applied for an earlier client and this one did
// not ask for is reset. It records what it applies in applied.
//
// Each statement is sent as a Query of its own: a multi-statement text is
// one implicit transaction, and one statement that fails (temp_buffers
// cannot change once the backend used a temporary table) would skip the
// rest and roll back what ran, a RESET "role" of the previous client's
// startup role among them. A failed sync statement closes the connection
// after the request it went ahead of (proxy's serverConn.swallowed).
func ParamSyncSQL(want, reported, applied map[string]string) []SyncStmt {
	var sets []Param
	for name, value := range want {
		if have, isReported := reported[name]; isReported {
			if SyncedParam(name) && have != value {
				sets = append(sets, Param{name, value})
			}
			continue
		}
		if applied[name] != value {
			sets = append(sets, Param{name, value})
			applied[name] = value
		}
	}
	var resets []string
	for name := range applied {
		if _, ok := want[name]; !ok {
			resets = append(resets, name)
			delete(applied, name)
		}
	}
	if len(sets) == 0 && len(resets) == 0 {
		return nil
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })
	sort.Strings(resets)
	stmts := make([]SyncStmt, 0, len(sets)+len(resets))
	for _, p := range sets {
		name := p.Name
		if _, isReported := reported[name]; isReported {
			name = ""
		}
		stmts = append(stmts, SyncStmt{SQL: SetConfigSQL([]Param{p}), Name: name})
	}
	for _, name := range resets {
		stmts = append(stmts, SyncStmt{SQL: "RESET " + QuoteIdent(name)})
	}
	return stmts
}
