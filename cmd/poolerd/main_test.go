package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestVersionAndCheckConfig(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "poolerd ") {
		t.Fatalf("--version: code %d out %q", code, out.String())
	}
	out.Reset()
	code := run([]string{"--check-config", "--upstream", "postgres://app:secret@127.0.0.1:5432/app"}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "valid") {
		t.Fatalf("valid config: code %d out %q err %q", code, out.String(), errb.String())
	}
	errb.Reset()
	code = run([]string{"--check-config", "--upstream", "postgres://app:hunter2@127.0.0.1:5432/app", "--pool-mode", "nope"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "pool_mode") {
		t.Fatalf("invalid config: code %d err %q", code, errb.String())
	}
	if strings.Contains(errb.String(), "hunter2") {
		t.Fatal("error output contains the password")
	}
	errb.Reset()
	if code := run([]string{"stray"}, &out, &errb); code != 2 {
		t.Fatalf("stray argument: code %d", code)
	}
}

// TestSIGTERMExitsZero runs the real binary: it must start without a
// reachable PostgreSQL, serve /healthz, and exit 0 on SIGTERM.
func TestSIGTERMExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "poolerd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	addr, haddr := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "--upstream", "postgres://app:secret@127.0.0.1:1/app", "--listen", addr, "--http-listen", haddr)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("poolerd did not listen: %s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("no exit after SIGTERM:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "secret") {
		t.Fatalf("log contains the password:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "poolerd stopped") {
		t.Fatalf("no stop message:\n%s", logs.String())
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestTuneGC: poolerd's GC target unless GOGC is set.
func TestTuneGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	tuneGC(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Fatalf("GOGC unset: GC percent %d, want %d", got, defaultGCPercent)
	}
	tuneGC(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GOGC set: GC percent changed to %d", got)
	}
}

// TestInvalidConfigInLogFile: a configuration refused at start is written
// to the log file it names too (once, in its log format), as PgBouncer
// writes it to its logfile; --check-config writes only to stderr.
func TestInvalidConfigInLogFile(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "pgbouncer.log")
	ini := filepath.Join(dir, "pgbouncer.ini")
	text := "[databases]\n* = host=127.0.0.1\n[pgbouncer]\nlisten_port = 1\nauth_type = md5\nauth_user = x\nauth_dbname = pgbouncer\nlogfile = " + logPath + "\n"
	if err := os.WriteFile(ini, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"--check-config", "--config", ini}, &out, &errb); code != 2 {
		t.Fatalf("--check-config: code %d", code)
	}
	if _, err := os.Stat(logPath); !os.IsNotExist(err) {
		t.Fatalf("--check-config wrote the log file: %v", err)
	}
	if code := run([]string{"--config", ini}, &out, &errb); code != 2 {
		t.Fatalf("code %d, want 2; stderr %q", code, errb.String())
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `cannot use the reserved "pgbouncer" database as an auth_dbname`); n != 1 || !strings.Contains(string(b), "ERROR invalid configuration: ") {
		t.Fatalf("log file (%d mentions):\n%s", n, b)
	}
}
