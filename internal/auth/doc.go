// Package auth holds poolerd's socket-free authentication logic.
//
// poolerd plays two roles: towards its clients it acts as a PostgreSQL
// server and verifies their passwords; towards PostgreSQL it acts as a
// client and proves its own (or its client's) identity. This package
// implements the pieces of both roles that do not touch the network:
//
//   - [Secret]: what poolerd knows about a user's password (plain text, an
//     md5 hash or a SCRAM-SHA-256 verifier), parsed with [ParseSecret] from
//     the text forms PostgreSQL stores in pg_authid.rolpassword.
//   - SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL implements it:
//     [SCRAMServer] verifies a client, [SCRAMClient] authenticates to
//     PostgreSQL, either with a password or, for "SCRAM pass-through", with
//     the ClientKey recovered by a [SCRAMServer] exchange.
//   - PostgreSQL's md5 password method: [MD5Hash], [MD5Response], [VerifyMD5].
//   - PgBouncer's auth_file ("userlist.txt") format: [ParseUserlist].
//
// The network code passes SASL message payloads in and sends the returned
// payloads out. Every function that parses peer input treats it as
// untrusted: malformed input yields an error, never a panic.
//
// Secrets are never included in error messages, and [Secret] refuses to
// print its contents through the fmt package.
//
// None of the types in this package are safe for concurrent use by
// multiple goroutines, except that a [Secret] and a [SCRAMVerifier] that is
// no longer modified may be shared freely.
package auth
