//go:build unix

// Package cpustat reads the CPU time the test process has used, for
// benchmarks that report CPU per operation. It measures nothing else.
package cpustat

import (
	"syscall"
	"time"
)

// Process is the CPU time (user + system) the process has used so far.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
