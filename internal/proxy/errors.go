package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/limiter"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/txstate"

	"github.com/poolerd/poolerd/internal/wire"
)

// This file holds the errors poolerd itself sends to clients and the one
// place where an internal error becomes the ErrorResponse a client reads
// (wireError). A wire error is made by a constructor, fresh for every use:
// none is shared, so no session can change what another one sends. Code
// below the session passes them on as plain errors (wrapped or not); the
// session converts when it writes one (session.fail, session.refuse,
// session.refuseLogin).

// wireError is the ErrorResponse a client reads for err: the *wire.Error
// inside it, or, for an error that carries none (a bug), an internal error.
func wireError(err error) *wire.Error {
	var werr *wire.Error
	if errors.As(err, &werr) {
		return werr
	}
	return &wire.Error{Severity: "FATAL", Code: "XX000", Message: "internal error in poolerd: " + err.Error(),
		Hint: "reconnect; if this repeats, report it with poolerd's log"}
}

// isFatal reports whether err ends the client's connection.
func isFatal(err error) bool { return wireError(err).Fatal() }

// asFatal returns a copy of err's ErrorResponse with severity FATAL, for a
// refusal that ends a login.
func asFatal(err error) error {
	werr := *wireError(err)
	werr.Severity = "FATAL"
	return &werr
}

// Causes that never reach a client as such: they say why a wait ended.
var (
	// errTerminated is the cause given to a checkout of a terminated session.
	errTerminated = errors.New("session terminated")
	// errClientCancel is the cause given to a checkout the client cancelled.
	errClientCancel = errors.New("cancel request from the client")
	// errServerBroken is returned by exec when the connection failed.
	errServerBroken = errors.New("server connection lost")
	// errClientLeft: the client sent Terminate in the middle of its login.
	errClientLeft = errors.New("client sent Terminate during login")
)

// errShuttingDown ends a client because poolerd stops (or the session was
// ended while it waited).
func errShuttingDown() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "57P01",
		Message: "terminating connection due to administrator command",
		Detail:  "poolerd is shutting down",
		Hint:    "reconnect; another poolerd instance or the restarted one will serve you"}
}

// errPQExecDisabled ends a client that sent a simple Query with
// disable_pqexec on, as PgBouncer does.
func errPQExecDisabled() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: "PQexec disallowed: the simple query protocol is disabled (disable_pqexec)",
		Hint: "send statements with the extended query protocol (parameterized queries; libpq's PQexecParams, pgx's default), one per message, or have the administrator turn disable_pqexec off"}
}

// errBlockWithoutServer ends a client whose transaction block was lost
// with its server connection when no server can take its session on
// (why).
func errBlockWithoutServer(why error) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08006", Message: "server connection lost, and no server to continue the session on",
		Detail: "the transaction block was lost with its server connection (rolled back), and no server connection could be had: " + wireError(why).Message,
		Hint:   "reconnect when PostgreSQL is reachable again, and retry the transaction"}
}

// errServerLost ends a session whose server connection was lost while
// held: its transaction, pipeline or session state went with it.
func errServerLost() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08006", Message: "server connection lost",
		Detail: "the PostgreSQL backend serving this session closed its connection or failed; its open transaction, if any, was rolled back",
		Hint:   "reconnect and retry the transaction; if this repeats, check the PostgreSQL server log"}
}

// errServerUnavailable refuses a request for which no server connection
// could be opened.
func errServerUnavailable(err error) *wire.Error {
	return &wire.Error{Severity: "ERROR", Code: "08006",
		Message: "could not connect to the PostgreSQL server",
		Detail:  err.Error(),
		Hint:    "check that PostgreSQL is running and reachable from poolerd; the request can be retried"}
}

// errLimitCheckout refuses a request that waited checkout_timeout for a
// server connection its pool could have opened but for a server connection
// limit (hit), with the pool's stats st.
func (d *dbPool) errLimitCheckout(st pool.Stats, hit *serverLimit) *wire.Error {
	if hit.fleet {
		return d.errFleetCheckout(st, hit)
	}
	return &wire.Error{Severity: "ERROR", Code: "53300",
		Message: fmt.Sprintf("no server connection available within checkout_timeout (%s): %s reached", d.route().Settings.CheckoutTimeout, hit.key),
		Detail: fmt.Sprintf("%s is at its %s (%d of %d server connections, all its pools together), so pool %s/%s could not open one: total %d, idle %d, active %d, waiting %d, max_size %d",
			hit.whose, hit.key, hit.count, hit.max, d.key.database, d.key.user, st.Total, st.Idle, st.Active, st.Waiting, st.MaxSize),
		Hint: fmt.Sprintf("raise %s for %s (its entry in the poolerd configuration, or the global key) if PostgreSQL allows it, have its other pools hold fewer connections (min_size, shorter transactions), or raise checkout_timeout (query_wait_timeout in a pgbouncer.ini)", hit.key, hit.whose)}
}

// errCheckoutCancelled refuses a request the client cancelled while it
// waited for a server connection, as PostgreSQL refuses a cancelled query.
func errCheckoutCancelled() *wire.Error {
	return &wire.Error{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request",
		Detail: "the request was cancelled while it waited for a server connection"}
}

// errRateLimited builds the 53400 refusal naming the rule and bucket.
func errRateLimited(severity string, r *rateRule, d limiter.Decision) *wire.Error {
	// Rounded up: a retry under half a millisecond must not read "retry
	// in 0s", and retrying at the announced time must succeed.
	retry := max(d.RetryAfter.Truncate(time.Millisecond), time.Millisecond)
	if retry < d.RetryAfter {
		retry += time.Millisecond
	}
	return &wire.Error{Severity: severity, Code: "53400",
		Message: fmt.Sprintf("rate limit exceeded: rule %q, bucket %s", r.cfg.Name, d.Bucket),
		Detail:  fmt.Sprintf("limit %s; retry in %s", r.limitText(d.Bucket), retry),
		Hint:    "slow down, or ask the operator to raise the rule's limit (rate_limits in the poolerd configuration)"}
}

// errRateCheckUnavailable refuses a request whose rate-limit decision
// failed (Redis) when on_redis_error is deny; rules are the rules it was
// asked of.
func errRateCheckUnavailable(severity string, rules []string) *wire.Error {
	what := "rule " + strconv.Quote(rules[0])
	if len(rules) > 1 {
		quoted := make([]string, len(rules))
		for i, r := range rules {
			quoted[i] = strconv.Quote(r)
		}
		what = "rules " + strings.Join(quoted, ", ")
	}
	return &wire.Error{Severity: severity, Code: "53400", Message: "rate limit check unavailable: " + what,
		Detail: "the rate-limit store (Redis) failed and on_redis_error is deny",
		Hint:   "retry shortly; the operator can set on_redis_error allow"}
}

// errClientGone ends a session whose client closed its connection while
// its request (or login) waited for a rate limit. Nobody reads it: it is
// what the log of the disconnection says.
func errClientGone() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08006", Message: "client closed the connection while its request waited for a rate limit",
		Hint: "nothing to do: the request was dropped before it was debited or sent to the server"}
}

// errLoginTimeout ends a client that did not log in within
// client_login_timeout.
func errLoginTimeout() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08006", Message: "client did not log in within client_login_timeout",
		Hint: "raise client_login_timeout if clients (or the server connections they wait for) are this slow"}
}

// errNoSuchDatabase refuses a login to a database no entry serves, in
// PgBouncer's words.
func errNoSuchDatabase(database string) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "3D000", Message: "no such database: " + database,
		Hint: "add it to databases in the poolerd configuration ([databases] in a pgbouncer.ini), or set upstream to serve every database name"}
}

// errBadPassword refuses a login whose password did not match.
func errBadPassword(user string) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "28P01", Message: fmt.Sprintf("password authentication failed for user %q", user)}
}

// errProtocol ends a client that sent bytes it must not send in its state.
func errProtocol(msg string) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: msg,
		Hint: "the client sent a message poolerd does not know in this state; check the driver"}
}

// errPinCap refuses a statement that would pin one more client of a pool
// whose max_pinned_clients are all taken.
func (d *dbPool) errPinCap(reason string) *wire.Error {
	set := d.route().Settings
	return &wire.Error{Severity: "ERROR", Code: "53400",
		Message: fmt.Sprintf("too many pinned clients: %s would keep this client on its server connection, and %d clients of pool %s/%s are pinned already (max_pinned_clients %s)",
			txstate.PinWhat(reason), d.pins.Load(), d.key.database, d.key.user, set.MaxPinnedClients),
		Detail: "a pinned client keeps its server connection until its session state is gone; the cap keeps connections for the other clients",
		Hint:   "undo session state when done (CLOSE the cursor, UNLISTEN, pg_advisory_unlock, DROP the temporary table, DEALLOCATE, RESET ROLE) so that pins end, raise max_pinned_clients (POOLERD_MAX_PINNED_CLIENTS), or use pool_mode session for this client"}
}

// errFastClose ends a client whose server connection RECONNECT or a reload
// asked to close, with server_fast_close on.
func errFastClose() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "57P01", Message: "database configuration changed: its server connection is being replaced (server_fast_close)",
		Detail: "RECONNECT or a reload changed the server connections of this database; this session held one, idle outside a transaction",
		Hint:   "reconnect; the session's state (SET, prepared statements, temporary tables) starts over"}
}

// errKilled is the final message of a client ended by KILL_CLIENT.
func errKilled() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: "admin forced disconnect",
		Hint: "an administrator ran KILL_CLIENT on this connection"}
}

// errNoConsole refuses a console login when no Console is set.
func errNoConsole() *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: "the admin console is not available",
		Hint: "this poolerd runs without an admin console; use the metrics and /stats endpoints"}
}

// errPacketTooLarge ends a client that sent a message longer than
// max_packet_size.
func errPacketTooLarge(typ byte, n, limit int) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01",
		Message: fmt.Sprintf("message %s of %d bytes is longer than max_packet_size (%d)", quoteByte(typ), n, limit),
		Hint:    "send smaller messages (COPY large data in pieces; bind fewer or smaller parameters), or raise max_packet_size (POOLERD_MAX_PACKET_SIZE)"}
}

// errTimedOut ends a session whose limit of kind expired.
// errCancelUnanswered ends a client whose query poolerd cancelled for
// query_timeout or lease_timeout (kind) when PostgreSQL did not answer the
// cancel within cancelGrace.
func errCancelUnanswered(kind timeoutKind, limit time.Duration) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "57014",
		Message: fmt.Sprintf("canceling statement due to %s; the server did not answer the cancel request within %s, so the connection was closed", kind.cause(limit), cancelGrace),
		Hint:    fmt.Sprintf("raise %s for this database or user, or make the query faster", kind.limitName())}
}

// errLeaseCheckout refuses a request whose checkout wait used up its
// lease_timeout (limit); st is the pool at that moment.
func errLeaseCheckout(limit time.Duration, d *dbPool, st pool.Stats) *wire.Error {
	detail := d.poolDetail(st)
	if st.Paused {
		detail += "; the database is paused (PAUSE on the admin console; RESUME ends it)"
	}
	if st.Suspended {
		detail += "; the pooler is suspended (SUSPEND on the admin console; RESUME ends it)"
	}
	return &wire.Error{Severity: "ERROR", Code: "53300",
		Message: fmt.Sprintf("checkout timed out: no server connection available within lease_timeout (%s)", limit),
		Detail:  detail,
		Hint:    "raise max_size (POOLERD_MAX_SIZE) if PostgreSQL's max_connections allows it, shorten transactions, or raise lease_timeout"}
}

func errTimedOut(kind timeoutKind, limit time.Duration) *wire.Error {
	switch kind {
	case timeoutQuery:
		return errCancelUnanswered(kind, limit)
	case timeoutLease:
		return &wire.Error{Severity: "FATAL", Code: "25P04",
			Message: "terminating connection due to " + kind.cause(limit),
			Detail:  "the transaction block, with the wait for its server connection, did not end within lease_timeout",
			Hint:    "keep transactions shorter, or raise lease_timeout for this database or user"}
	case timeoutTransaction:
		return &wire.Error{Severity: "FATAL", Code: "25P04",
			Message: "terminating connection due to " + kind.cause(limit),
			Hint:    "keep transactions shorter, or raise transaction_timeout for this database or user"}
	case timeoutIdleTransaction:
		return &wire.Error{Severity: "FATAL", Code: "25P03",
			Message: "terminating connection due to " + kind.cause(limit),
			Hint:    "commit or roll back promptly; an idle transaction holds a server connection and its locks"}
	case timeoutClientIdle:
		return &wire.Error{Severity: "FATAL", Code: "57P05",
			Message: fmt.Sprintf("terminating connection due to client_idle_timeout (%s)", limit),
			Hint:    "reconnect; raise client_idle_timeout if clients legitimately stay idle this long"}
	case timeoutPinnedIdle:
		return &wire.Error{Severity: "FATAL", Code: "57P05",
			Message: fmt.Sprintf("terminating connection due to pinned_idle_timeout (%s)", limit),
			Detail:  "the client was pinned to its server connection by session state and stayed idle; the connection is freed for other clients",
			Hint:    "undo session state when done (CLOSE the cursor, UNLISTEN, pg_advisory_unlock, ...) so that the client is unpinned, or raise pinned_idle_timeout"}
	default: // timeoutServerResponse
		return &wire.Error{Severity: "FATAL", Code: "08006",
			Message: fmt.Sprintf("server did not respond within server_response_timeout (%s); its connection was closed", limit),
			Hint:    "the PostgreSQL server or the network to it looks hung; check them, then reconnect"}
	}
}

// errChargeQueueFull: measured costs came faster than Redis took them.
var errChargeQueueFull = errors.New("the queue of charges for Redis is full")
