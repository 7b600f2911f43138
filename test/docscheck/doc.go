// Package docscheck holds tests that keep the documentation true to the
// code: every error or log message the docs quote must be one poolerd can
// produce (a string literal or format string in its non-test Go code), and
// the README's `make run` output must be what scripts/run.sh prints; every
// Go file, method and package name docs/architecture.md uses must exist.
//
// The checks that need a running poolerd (the metric table, the admin
// console's columns) are in test/integration/docs_test.go; the
// configuration reference is checked by internal/config/docs_test.go.
package docscheck
