//go:build !unix

// Package cpustat reads the CPU time the test process has used, for
// benchmarks that report CPU per operation. It measures nothing else.
package cpustat

import "time"

// Process is not measured on this platform: it is always 0.
func Process() time.Duration { return 0 }
