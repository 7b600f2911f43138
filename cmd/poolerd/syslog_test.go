package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
)

// The log reaches a syslog daemon (here a Unix datagram socket of the
// test's) with the ident, and the facility and severity in the priority.
func TestSyslog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := config.Defaults()
	cfg.Syslog, cfg.SyslogIdent, cfg.SyslogFacility = true, "poolerd-test", "local3"
	log, _, closeLog, err := newLoggerTo(&cfg, &strings.Builder{}, "unixgram", path)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	log.Warn("server unreachable", zap.String("host", "db1"))
	log.Debug("not at info level")
	_ = ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := ln.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	msg := string(buf[:n])
	// local3 (19) * 8 + warning (4) = 156.
	if !strings.HasPrefix(msg, "<156>") || !strings.Contains(msg, "poolerd-test[") ||
		!strings.Contains(msg, "server unreachable") || !strings.Contains(msg, `"host": "db1"`) {
		t.Errorf("syslog message %q", msg)
	}
	_ = ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := ln.Read(buf); err == nil {
		t.Errorf("a debug entry reached syslog at level info: %q", buf[:n])
	}
	// No syslog daemon: poolerd logs on without it, and says so.
	var out strings.Builder
	log2, _, close2, err := newLoggerTo(&cfg, &out, "unixgram", filepath.Join(t.TempDir(), "none"))
	if err != nil {
		t.Fatal(err)
	}
	log2.Info("still logging")
	close2()
	if !strings.Contains(out.String(), "syslog is on but unavailable") || !strings.Contains(out.String(), "still logging") {
		t.Errorf("without a syslog daemon: %q", out.String())
	}
}
