// Package soak runs the poolerd binary in front of a real PostgreSQL under a
// mixed load (pgx, pgbench, psycopg and psql clients; short and long
// transactions; COPY in and out; LISTEN in session mode; thousands of idle
// clients connecting and leaving) while faults are injected from a seeded
// schedule: PostgreSQL restarts (fast and immediate), killed and frozen
// backends, a delayed, blackholed and reset network, clients that vanish
// mid-transaction and mid-COPY, reloads with a changed configuration, and
// Redis stopping under rate limits.
//
// It checks that nothing is lost: no acknowledged transaction missing, none
// applied twice or in part, no failed one committed; every client error an
// ErrorResponse with a SQLSTATE; no server connection handed out dirty; and
// poolerd's goroutines, open files and memory back to their baseline after
// the load. It reports p99 latency per minute and the recovery time after
// each fault.
//
// The package has only tests: `go test ./test/soak/` runs the short version
// (about two minutes, part of make test); `make soak` runs the full one
// (SOAK_MINUTES, default 10) and writes docs/soak.md and docs/soak.svg.
// It does not test features one by one: test/integration does.
package soak
