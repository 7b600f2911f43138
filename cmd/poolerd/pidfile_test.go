package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestPIDFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "poolerd.pid")
	remove, err := writePIDFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != strconv.Itoa(os.Getpid())+"\n" {
		t.Fatalf("pidfile holds %q", b)
	}
	remove()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("pidfile left after remove: %v", err)
	}

	// A running process's pid refuses the start, but for a takeover; a
	// stale pid is replaced.
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	other := strconv.Itoa(sleeper.Process.Pid) + "\n"
	if err := os.WriteFile(path, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := writePIDFile(path, false); err == nil || !strings.Contains(err.Error(), "which is running") {
		t.Errorf("a running pid: %v", err)
	}
	remove, err = writePIDFile(path, true)
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	// The predecessor's remove leaves the successor's file alone.
	if err := os.WriteFile(path, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	remove()
	if b, _ := os.ReadFile(path); string(b) != other {
		t.Errorf("remove took another process's pidfile: %q", b)
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	if remove, err = writePIDFile(path, false); err != nil {
		t.Fatalf("a stale pid: %v", err)
	}
	remove()
	if _, err := writePIDFile(filepath.Join(t.TempDir(), "no", "such", "dir.pid"), false); err == nil {
		t.Error("a pidfile in a missing directory")
	}
}
