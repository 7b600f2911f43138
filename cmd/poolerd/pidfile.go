package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// writePIDFile writes this process's pid to path (pidfile, as PgBouncer's),
// for init scripts and monitoring. A file naming a process that is still
// running refuses the start (another poolerd, or PgBouncer, serves with
// it), unless this one is taking over from it (--takeover), which then owns
// the file. The returned func removes the file at exit if it still names
// this process (a takeover's successor may own it by then).
func writePIDFile(path string, takeover bool) (remove func(), err error) {
	if old, err := os.ReadFile(path); err == nil && !takeover {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(old))); err == nil && pid > 0 && pid != os.Getpid() && alive(pid) {
			return nil, fmt.Errorf("pidfile %s names pid %d, which is running: stop that process first, or start this one with --takeover to take over from it", path, pid)
		}
	}
	own := strconv.Itoa(os.Getpid()) + "\n"
	tmp, err := os.CreateTemp(filepath.Dir(path), ".poolerd-pid-*")
	if err != nil {
		return nil, fmt.Errorf("pidfile %s: %w", path, err)
	}
	_, err = tmp.WriteString(own)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("pidfile %s: %w", path, err)
	}
	return func() {
		if b, err := os.ReadFile(path); err == nil && string(b) == own {
			os.Remove(path)
		}
	}, nil
}

// alive reports whether a process with pid exists (signal 0; EPERM: it
// exists, as another user's).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
