package txstate

import "github.com/poolerd/poolerd/internal/sqlscan"

// PinWhat names the session state of a pin's reason (an sqlscan Pin kind)
// for a client's error message.
func PinWhat(reason string) string {
	switch reason {
	case sqlscan.PinTempTable:
		return "a temporary table"
	case sqlscan.PinPrepare:
		return "an SQL-level prepared statement (PREPARE)"
	case sqlscan.PinListen:
		return "LISTEN"
	case sqlscan.PinAdvisoryLock:
		return "a session-level advisory lock"
	case sqlscan.PinCursorOnHold:
		return "a cursor WITH HOLD"
	case sqlscan.PinRole:
		return "SET ROLE / SET SESSION AUTHORIZATION"
	}
	return reason
}

// PinCheckSQL asks a server connection, in one row of integers, what
// session state it holds, one column per kind in PinCheckKinds: WITH HOLD
// cursors, channels listened to, session advisory locks, relations in its
// temporary schema, SQL-level prepared statements, and whether the role or
// session authorization differs from the login role's (login).
func PinCheckSQL(login string) string {
	return "SELECT (SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors WHERE is_holdable)," +
		" (SELECT pg_catalog.count(*) FROM pg_catalog.pg_listening_channels())," +
		" (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())," +
		" (SELECT pg_catalog.count(*) FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())," +
		" (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql)," +
		" (current_user OPERATOR(pg_catalog.<>) session_user OR session_user OPERATOR(pg_catalog.<>) " + QuoteLiteral(login) + ")::pg_catalog.int4"
}

// PinCheckKinds are the kinds of session state, in PinCheckSQL's column
// order.
var PinCheckKinds = [...]string{sqlscan.PinCursorOnHold, sqlscan.PinListen, sqlscan.PinAdvisoryLock,
	sqlscan.PinTempTable, sqlscan.PinPrepare, sqlscan.PinRole}
