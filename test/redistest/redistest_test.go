package redistest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartStop(t *testing.T) {
	if _, err := Find(); err != nil {
		t.Skip(err)
	}
	s, err := StartWith(Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || s.Port == 0 || s.Version == "" {
		t.Fatalf("Addr %q, Port %d, Version %q", s.Addr(), s.Port, s.Version)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := s.Client()
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET = %q, %v", v, err)
	}
	// No persistence configured.
	if v, err := s.Do(ctx, "CONFIG", "GET", "save"); err != nil || strings.Join(strings.Fields(stringify(v)), " ") != "save" {
		t.Fatalf("CONFIG GET save = %v, %v; want an empty value", v, err)
	}
	if v, err := s.Do(ctx, "CONFIG", "GET", "appendonly"); err != nil || strings.Join(strings.Fields(stringify(v)), " ") != "appendonly no" {
		t.Fatalf("CONFIG GET appendonly = %v, %v", v, err)
	}
	// DEBUG is enabled (Redis 7 disables it by default).
	if _, err := s.Do(ctx, "DEBUG", "SLEEP", "0"); err != nil {
		t.Fatal(err)
	}

	if !s.Running() {
		t.Fatal("not running")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("still running after Stop")
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s not removed: %v", s.dir, err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after Stop")
	}
}

func stringify(v any) string {
	switch v := v.(type) {
	case map[any]any:
		var b strings.Builder
		for k, x := range v {
			b.WriteString(stringify(k) + " " + stringify(x) + " ")
		}
		return b.String()
	case []any:
		var b strings.Builder
		for _, x := range v {
			b.WriteString(stringify(x) + " ")
		}
		return b.String()
	case string:
		return v
	}
	return ""
}

func TestStartTB(t *testing.T) {
	s := StartTB(t)
	if !s.Running() {
		t.Fatal("not running")
	}
	if _, err := s.Do(context.Background(), "PING"); err != nil {
		t.Fatal(err)
	}
}

func TestExtraArgs(t *testing.T) {
	s := StartTBWith(t, Options{Args: []string{"--maxmemory", "16mb"}})
	v, err := s.Do(context.Background(), "CONFIG", "GET", "maxmemory")
	if err != nil {
		t.Fatal(err)
	}
	if got := stringify(v); !strings.Contains(got, "16777216") {
		t.Fatalf("CONFIG GET maxmemory = %q", got)
	}
}

func TestBadArgsFail(t *testing.T) {
	if _, err := Find(); err != nil {
		t.Skip(err)
	}
	s, err := StartWith(Options{Args: []string{"--no-such-option", "1"}})
	if err == nil {
		s.Stop()
		t.Fatal("started with an invalid option")
	}
	if !strings.Contains(err.Error(), "no-such-option") {
		t.Fatalf("error lacks the server's complaint: %v", err)
	}
}
