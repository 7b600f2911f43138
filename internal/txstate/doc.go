// Package txstate is transaction-mode state as pure code: startup
// parameters and the SQL that syncs them, prepared-statement bookkeeping,
// the shape of a transaction and what a client keeps when its server is
// lost, the hand-off check's query and verdict (and the pin check's query);
// no I/O, no locks.
//
// internal/proxy holds the sessions and server connections that use it.
package txstate
