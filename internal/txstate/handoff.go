package txstate

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// The hand-off check's query and verdict (the check itself, verify_handoff,
// is internal/proxy/handoff.go's).

// Kinds of leftover session state, as metric labels (HandoffKinds).
const (
	HandoffRole         = "role"
	HandoffListen       = "listen"
	HandoffAdvisoryLock = "advisory_lock"
	HandoffTempTable    = "temp_table"
	HandoffCursor       = "cursor"
	HandoffSQLPrepare   = "sql_prepare"
	HandoffProtoPrepare = "protocol_prepare"
	HandoffSetting      = "setting"
	HandoffCheckFailed  = "check_failed"
)

// HandoffKinds are every kind, in the order the WARN lists them.
var HandoffKinds = [...]string{HandoffRole, HandoffListen, HandoffAdvisoryLock, HandoffTempTable,
	HandoffCursor, HandoffSQLPrepare, HandoffProtoPrepare, HandoffSetting, HandoffCheckFailed}

// HandoffKindIndex is kind's index in HandoffKinds; an unknown kind is
// counted as the last one.
func HandoffKindIndex(kind string) int {
	for i, k := range HandoffKinds {
		if k == kind {
			return i
		}
	}
	return len(HandoffKinds) - 1
}

// HandoffCols is the number of columns of HandoffSQL's row.
const HandoffCols = 10

// TxScopedSettings are the settings of one transaction: PostgreSQL sets
// them anew, from their default_ counterparts, when each transaction
// starts, so they never carry anything from one client to the next. After
// a SET TRANSACTION (or BEGIN ISOLATION LEVEL ...) pg_settings reports their
// source as session for good, with the default value: the settings
// snapshot and the hand-off check leave them out.
var TxScopedSettings = [...]string{"transaction_isolation", "transaction_read_only", "transaction_deferrable"}

// HandoffSQL is the fingerprint query: current_user, session_user, the
// role setting, the channels listened to, the session's advisory locks,
// its temporary relations, open cursors, SQL-level prepared statements,
// protocol-level ones that are not poolerd's (poolerd_s<N>, poolerd_nop),
// and the session-level settings as a JSON object (pg_settings' source
// session, without role and session_authorization, which the role columns
// cover, and without TxScopedSettings; and custom, the customized options a.b poolerd knows were
// touched, which pg_settings does not list in PostgreSQL 15). Every name
// is qualified with pg_catalog.
func HandoffSQL(custom []string) string {
	settings := "SELECT name AS n, pg_catalog.current_setting(name) AS v FROM pg_catalog.pg_settings" +
		" WHERE source OPERATOR(pg_catalog.=) 'session' AND name OPERATOR(pg_catalog.<>) 'role'" +
		" AND name OPERATOR(pg_catalog.<>) 'session_authorization'"
	for _, n := range TxScopedSettings {
		settings += " AND name OPERATOR(pg_catalog.<>) " + QuoteLiteral(n)
	}
	if len(custom) > 0 {
		lits := make([]string, len(custom))
		for i, n := range custom {
			lits[i] = QuoteLiteral(n)
		}
		settings += " UNION SELECT c, pg_catalog.current_setting(c, true) FROM pg_catalog.unnest(ARRAY[" +
			strings.Join(lits, ", ") + "]::pg_catalog.text[]) AS c WHERE pg_catalog.current_setting(c, true) IS NOT NULL"
	}
	agg := func(col, from string) string {
		return "(SELECT pg_catalog.string_agg(" + col + "::pg_catalog.text, ',' ORDER BY " + col + ") FROM " + from + ")"
	}
	return "SELECT current_user::pg_catalog.text, session_user::pg_catalog.text, pg_catalog.current_setting('role'), " +
		agg("ch", "pg_catalog.pg_listening_channels() AS ch") + ", " +
		"(SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())::pg_catalog.text, " +
		agg("relname", "pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()") + ", " +
		agg("name", "pg_catalog.pg_cursors") + ", " +
		agg("name", "pg_catalog.pg_prepared_statements WHERE from_sql") + ", " +
		agg("name", "pg_catalog.pg_prepared_statements WHERE NOT from_sql AND name OPERATOR(pg_catalog.!~) '^poolerd_(s[0-9]+|nop)$'") + ", " +
		"(SELECT pg_catalog.json_object_agg(s.n, s.v)::pg_catalog.text FROM (" + settings + ") AS s)"
}

// HandoffExpect is what poolerd believes a clean connection holds.
type HandoffExpect struct {
	// Login is the role poolerd logged in as (session_user).
	Login string
	// Role is the role a client's startup parameter set (applied
	// "role"), "" for none.
	Role string
	// RoleReset: a function a client called may have set the role or
	// options, and the next client gets RESET ROLE; RESET ALL first
	// (proxy's serverConn.roleBy): role and settings are not compared.
	RoleReset bool
	// Tracked: protocol-level statements are poolerd's (the pool maps
	// them); without it, client statement names pass through.
	Tracked bool
	// Params are the reported parameters (ParameterStatus keeps them
	// exact), Applied the other settings poolerd set or found, and Norm
	// the values known to be in the server's normal form (a settings
	// snapshot read them with current_setting): an applied value that
	// came from a client's startup packet ("16MB" for "16MB", "30000" for
	// "30s") may be spelled otherwise by the server, so only a value
	// equal to Norm's is compared.
	Params, Applied, Norm map[string]string
}

// HandoffFinding is one kind of state a check found that poolerd did not
// expect, with what it was.
type HandoffFinding struct {
	Kind string // one of HandoffKinds
	What string // what was found, for the WARN
}

// ParseHandoffRow splits the body of HandoffSQL's DataRow; NULL columns are
// empty.
func ParseHandoffRow(body []byte) ([]string, bool) {
	if len(body) < 2 || int(binary.BigEndian.Uint16(body)) != HandoffCols {
		return nil, false
	}
	cols := make([]string, 0, HandoffCols)
	p := body[2:]
	for range HandoffCols {
		if len(p) < 4 {
			return nil, false
		}
		l := int(int32(binary.BigEndian.Uint32(p)))
		p = p[4:]
		if l < 0 {
			cols = append(cols, "")
			continue
		}
		if l > len(p) {
			return nil, false
		}
		cols = append(cols, string(p[:l]))
		p = p[l:]
	}
	return cols, true
}

// CheckHandoff compares a check's row (ParseHandoffRow) with what poolerd
// expects; nil means clean.
func CheckHandoff(cols []string, e HandoffExpect) []HandoffFinding {
	var out []HandoffFinding
	add := func(kind, format string, a ...any) {
		out = append(out, HandoffFinding{kind, fmt.Sprintf(format, a...)})
	}
	curUser, sessUser, role := cols[0], cols[1], cols[2]
	switch {
	case sessUser != e.Login:
		add(HandoffRole, "session_user %q, logged in as %q", sessUser, e.Login)
	case e.RoleReset:
		// The next client gets RESET ROLE before its first request.
	case e.Role != "" && curUser != e.Role:
		add(HandoffRole, "current_user %q, the client's startup role is %q", curUser, e.Role)
	case e.Role == "" && (curUser != sessUser || role != "none"):
		add(HandoffRole, "current_user %q (role %q), session_user %q", curUser, role, sessUser)
	}
	if cols[3] != "" {
		add(HandoffListen, "channels %s", cols[3])
	}
	if cols[4] != "0" {
		add(HandoffAdvisoryLock, "%s session advisory locks", cols[4])
	}
	if cols[5] != "" {
		add(HandoffTempTable, "temporary relations %s", cols[5])
	}
	if cols[6] != "" {
		add(HandoffCursor, "cursors %s", cols[6])
	}
	if cols[7] != "" {
		add(HandoffSQLPrepare, "SQL-level prepared statements %s", cols[7])
	}
	if cols[8] != "" && e.Tracked {
		add(HandoffProtoPrepare, "protocol-level prepared statements %s", cols[8])
	}
	var found map[string]string
	if e.RoleReset {
		// The next client gets RESET ROLE; RESET ALL first (a function
		// or DO block may have set options no text names), which also
		// takes every setting back.
		return out
	}
	if cols[9] != "" {
		if err := json.Unmarshal([]byte(cols[9]), &found); err != nil {
			add(HandoffCheckFailed, "settings column unreadable: %v", err)
			return out
		}
	}
	var bad []string
	for name, value := range found {
		if _, reported := e.Params[name]; reported {
			continue
		}
		want, ok := e.Applied[name]
		switch {
		case !ok && value == "" && strings.Contains(name, "."):
			// A customized option reset: a placeholder stays, empty.
		case !ok:
			bad = append(bad, fmt.Sprintf("%s set (not by poolerd)", name))
		case want != value && e.Norm[name] == want:
			bad = append(bad, fmt.Sprintf("%s differs from the value poolerd applied", name))
		}
	}
	for name, want := range e.Applied {
		if _, ok := found[name]; ok || name == "role" {
			continue
		}
		if _, reported := e.Params[name]; reported || want == "" && strings.Contains(name, ".") {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s no longer set", name))
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		add(HandoffSetting, "%s", strings.Join(bad, ", "))
	}
	return out
}
