package main

import (
	"fmt"
	"os"
	"sync"
)

// logFile is log_file: the log's copy in a file, opened for appending, and
// opened again by reopen (SIGHUP, as PgBouncer's logfile), so that a
// rotation that renamed it gets a new file.
type logFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func openLogFile(path string) (*logFile, error) {
	l := &logFile{path: path}
	if err := l.reopen(); err != nil {
		return nil, err
	}
	return l, nil
}

// reopen opens the path again and closes the file written so far.
func (l *logFile) reopen() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("log_file %s: %w", l.path, err)
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

func (l *logFile) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Sync()
}

// Close closes the file.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
