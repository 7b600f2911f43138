package integration

// Tests of the pool's lifecycle against the requirements of seed 004
// (production-grade connection management), one test per requirement:
// TestFR001… covers FR-001, TestFR002… FR-002 and so on. FR-006 (leak
// detection) is tested elsewhere. Tests that need PostgreSQL to disappear
// put a fault proxy (test/faultproxy) between poolerd and the shared server
// instead of stopping it; only outage_test.go stops the server itself.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/test/faultproxy"
	"github.com/poolerd/poolerd/test/pgtest"
)

// ---------------------------------------------------------------------------
// Helpers (prefixed lc to stay clear of the other files of the package).

// lcProxy starts a fault proxy in front of the shared PostgreSQL server;
// it is closed when the test ends.
func lcProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	px, err := faultproxy.Start(pg.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	return px
}

// lcUpstreamVia is the upstream URL (app:secret, database app) that reaches
// PostgreSQL through the fault proxy px.
func lcUpstreamVia(px *faultproxy.Proxy) string {
	u, _ := url.Parse(pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	u.Host = px.Addr()
	return u.String()
}

// lcStartVia starts poolerd with its upstream behind px. The instance is
// registered after the proxy, so its cleanup (shutdown) runs first.
func lcStartVia(t *testing.T, px *faultproxy.Proxy, mutate func(c *config.Config)) *instance {
	t.Helper()
	return startPoolerd(t, func(c *config.Config) {
		c.Upstream = lcUpstreamVia(px)
		if mutate != nil {
			mutate(c)
		}
	})
}

// lcStats returns the stats of the configured pool (app/app).
func lcStats(t *testing.T, p *instance) proxy.PoolStats {
	t.Helper()
	return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
}

// lcWaitState waits until the app/app pool is in state want.
func lcWaitState(t *testing.T, p *instance, d time.Duration, want pool.State) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, d, "pool state "+want.String(), func() bool {
		return lcStats(t, p).State == want
	})
	return time.Since(start)
}

// lcWaitReleased waits until no server connection of the pool is checked
// out (the reader releases a transaction-mode server just after it forwards
// ReadyForQuery, so a client can be a little ahead of the stats).
func lcWaitReleased(t *testing.T, p *instance) {
	t.Helper()
	eventually(t, 5*time.Second, "no active server connection", func() bool {
		st := lcStats(t, p)
		return st.Active == 0 && st.Acquisitions == st.Releases
	})
}

// lcBackendPID runs SELECT pg_backend_pid() through c.
func lcBackendPID(t *testing.T, ctx context.Context, c *pgx.Conn) int {
	t.Helper()
	var pid int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("SELECT pg_backend_pid(): %v", err)
	}
	return pid
}

// lcPgError returns err as a server error or fails the test.
func lcPgError(t *testing.T, err error) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("want a PostgreSQL error, got %v", err)
	}
	return pe
}

// lcLogEntry is one line of poolerd's console log.
type lcLogEntry struct {
	Time   time.Time
	Level  string
	Msg    string
	Fields map[string]any
}

// lcLogEntries parses the console log (time, level, message, JSON fields,
// tab-separated) and returns the entries whose message is msg.
func lcLogEntries(logs, msg string) []lcLogEntry {
	var out []lcLogEntry
	for _, line := range strings.Split(logs, "\n") {
		parts := strings.SplitN(line, "\t", 4)
		if len(parts) < 3 || parts[2] != msg {
			continue
		}
		e := lcLogEntry{Level: parts[1], Msg: parts[2], Fields: map[string]any{}}
		e.Time, _ = time.Parse("2006-01-02T15:04:05.000Z0700", parts[0])
		if len(parts) == 4 {
			_ = json.Unmarshal([]byte(parts[3]), &e.Fields)
		}
		out = append(out, e)
	}
	return out
}

func (e lcLogEntry) str(key string) string {
	s, _ := e.Fields[key].(string)
	return s
}

func (e lcLogEntry) num(key string) int {
	f, _ := e.Fields[key].(float64)
	return int(f)
}

// lcHealthChanges returns the "to" states of the pool's health changes, in
// order.
func lcHealthChanges(logs string) []string {
	var out []string
	for _, e := range lcLogEntries(logs, "pool health changed") {
		out = append(out, e.str("to"))
	}
	return out
}

// lcSubsequence reports whether want appears in have in order (not
// necessarily adjacent).
func lcSubsequence(have, want []string) bool {
	i := 0
	for _, h := range have {
		if i < len(want) && h == want[i] {
			i++
		}
	}
	return i == len(want)
}

// lcCheckBackoff checks the "server connect failed" log lines. A round of
// attempts starts with a line whose attempt number is higher than the
// previous one's (connects started together, e.g. for min_size 2, share an
// attempt number, and their failures are one round). The r-th round in a
// row waits base×2^(r-1), capped at max, ±20 %; a connect that fails with
// others of its round must not lengthen that wait. Attempt numbers never
// decrease. It returns the entries checked.
func lcCheckBackoff(t *testing.T, logs string, base, max time.Duration, minRounds int) []lcLogEntry {
	t.Helper()
	entries := lcLogEntries(logs, "server connect failed")
	prevAttempt, round := 0, 0
	var want time.Duration
	for k, e := range entries {
		attempt := e.num("attempt")
		if attempt < 1 || attempt < prevAttempt {
			t.Errorf("failure %d: attempt %d after attempt %d: attempt numbers must not decrease", k+1, attempt, prevAttempt)
		}
		wait, err := time.ParseDuration(e.str("next_retry_in"))
		if err != nil {
			t.Fatalf("failure %d: next_retry_in %q: %v", k+1, e.str("next_retry_in"), err)
		}
		if attempt > prevAttempt {
			round++
			want = base
			for i := 1; i < round && want < max; i++ {
				want *= 2
			}
			want = min(want, max)
			lo, hi := time.Duration(float64(want)*0.8)-2*time.Millisecond, time.Duration(float64(want)*1.2)+2*time.Millisecond
			if wait < lo || wait > hi {
				t.Errorf("failure %d (attempt %d, round %d): next_retry_in %s, want %s ±20%%", k+1, attempt, round, wait, want)
			}
		} else if hi := time.Duration(float64(want)*1.2) + 2*time.Millisecond; wait > hi {
			t.Errorf("failure %d (attempt %d again, round %d): next_retry_in %s: a connect failing together with another one of its round lengthened the backoff beyond %s",
				k+1, attempt, round, wait, want)
		}
		prevAttempt = attempt
	}
	if round < minRounds {
		t.Fatalf("%d rounds of failed connects (%d log lines), want at least %d", round, len(entries), minRounds)
	}
	return entries
}

// lcBuildBinary builds cmd/poolerd into a temporary directory.
func lcBuildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not on PATH: cannot build the poolerd binary")
	}
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v %s", err, out)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "poolerd")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, "./cmd/poolerd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/poolerd: %v\n%s", err, out)
	}
	return bin
}

// lcLockedBuffer collects a process's output.
type lcLockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lcLockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lcLockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lcProc is a poolerd process.
type lcProc struct {
	cmd    *exec.Cmd
	stderr *lcLockedBuffer
	done   chan struct{}
	err    error // set when done is closed
	start  time.Time
}

// lcStartBinary runs the poolerd binary with args and an environment free
// of POOLERD_* variables. It is killed when the test ends if still running.
func lcStartBinary(t *testing.T, bin string, args ...string) *lcProc {
	t.Helper()
	return lcStartBinaryEnv(t, bin, nil, args...)
}

// lcStartBinaryEnv is lcStartBinary with env (KEY=value) added to the
// environment, which has no POOLERD_ variable of the test's own.
func lcStartBinaryEnv(t *testing.T, bin string, env []string, args ...string) *lcProc {
	t.Helper()
	return lcStartBinaryIn(t, bin, "", env, args...)
}

// lcStartBinaryIn is lcStartBinaryEnv run in the working directory dir
// ("": the test's).
func lcStartBinaryIn(t *testing.T, bin, dir string, env []string, args ...string) *lcProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, config.EnvPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	p := &lcProc{cmd: cmd, stderr: &lcLockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *lcProc) wait(t *testing.T, d time.Duration) (int, time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("poolerd still running after %s; output:\n%s", d, p.stderr.String())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0, time.Since(p.start)
	case errors.As(p.err, &ee):
		return ee.ExitCode(), time.Since(p.start)
	}
	t.Fatalf("poolerd: %v", p.err)
	return -1, 0
}

// lcFreeAddr returns 127.0.0.1:<a port nothing listens on>.
func lcFreeAddr(t *testing.T) string {
	t.Helper()
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// ---------------------------------------------------------------------------
// FR-001: pool initialisation.

// The pool opens min_size connections at start, is healthy and poolerd
// ready; the first queries reuse those connections.
func TestFR001WarmupOpensMinSize(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p := startPoolerd(t, func(c *config.Config) { c.MinSize = 3 })
	eventually(t, 5*time.Second, "3 idle connections and a healthy pool", func() bool {
		st := lcStats(t, p)
		return st.Idle == 3 && st.Total == 3 && st.State == pool.Healthy
	})
	warm := time.Since(start)
	eventually(t, 2*time.Second, "Ready()", func() bool { ok, _ := p.srv.Ready(); return ok })
	if ok, reason := p.srv.Ready(); !ok || reason != "" {
		t.Fatalf("Ready() = %v, %q", ok, reason)
	}
	t.Logf("pool warm (3 connections, healthy) %s after start", warm.Round(time.Millisecond))
	if warm > 4*time.Second {
		t.Errorf("warm-up took %s; seed 004 wants it within 2 s", warm)
	}
	st := lcStats(t, p)
	if st.ConnectAttempts != 3 || st.ConnectFailures != 0 || st.Acquisitions != 0 || st.MinSize != 3 {
		t.Fatalf("after warm-up: %+v", st.Stats)
	}
	if st.Created.IsZero() || st.LastHealthCheck.Before(st.Created) {
		t.Fatalf("Created %v, LastHealthCheck %v", st.Created, st.LastHealthCheck)
	}

	// The first queries find their connection ready: no new connect.
	c := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 10*time.Second)
	for range 3 {
		lcBackendPID(t, ctx, c)
	}
	lcWaitReleased(t, p)
	st = lcStats(t, p)
	if st.ConnectAttempts != 3 || st.Misses != 0 || st.Total != 3 {
		t.Fatalf("queries opened connections although 3 were warm: %+v", st.Stats)
	}
}

// startup_mode wait: with the upstream unreachable poolerd runs but is not
// ready, says why, refuses clients at once, and becomes ready as soon as
// the upstream accepts connections, even in the middle of a long backoff.
func TestFR001WaitModeUnreachableUpstream(t *testing.T) {
	t.Parallel()
	px := lcProxy(t)
	if err := px.Pause(); err != nil {
		t.Fatal(err)
	}
	p := lcStartVia(t, px, func(c *config.Config) {
		c.StartupMode = config.StartupWait
		// 2s, 4s, 8s ...: after two failures the next attempt is at
		// least 3.2 s away.
		c.ReconnectBackoffBase = 2 * time.Second
		c.ReconnectBackoffMax = 16 * time.Second
	})
	eventually(t, 5*time.Second, "a failed connect", func() bool { return lcStats(t, p).ConnectFailures >= 1 })

	// Not ready, with a reason naming the pool and its state (once Serve,
	// started on a goroutine of its own, listens).
	var ok bool
	var reason string
	eventually(t, 5*time.Second, "poolerd listening", func() bool {
		ok, reason = p.srv.Ready()
		return !strings.Contains(reason, "not listening yet")
	})
	if ok {
		t.Fatal("Ready() is true with the upstream unreachable")
	}
	st := lcStats(t, p)
	if !strings.Contains(reason, "pool app/app is "+st.State.String()) || st.State.Usable() {
		t.Fatalf("Ready() reason %q, pool state %s", reason, st.State)
	}
	if st.State != pool.Unhealthy || !strings.Contains(reason, "unhealthy") || !strings.Contains(reason, "connection refused") {
		t.Fatalf("Ready() reason %q, state %s: want unhealthy with the connect error", reason, st.State)
	}

	// Clients are not left hanging: the login fails at once (no server
	// has ever been reached, so poolerd cannot complete it).
	ctx := ctxTimeout(t, 10*time.Second)
	t0 := time.Now()
	_, err := pgx.Connect(ctx, p.appDSN(txExecMode))
	if err == nil {
		t.Fatal("login succeeded with the upstream unreachable")
	}
	if pe := lcPgError(t, err); pe.Code != "08006" || !strings.Contains(pe.Message, "upstream unavailable, next retry in") {
		t.Fatalf("login error %s %q, want 08006 upstream unavailable", pe.Code, pe.Message)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("refused login took %s", d)
	}

	// Stays unready while the upstream is away; wait for 2 failures so
	// that the backoff is long (4 s ±20 %).
	deadline := time.Now().Add(10 * time.Second)
	for lcStats(t, p).ConnectFailures < 2 {
		if ok, _ := p.srv.Ready(); ok {
			t.Fatal("Ready() became true with the upstream unreachable")
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d connect failures after 10 s", lcStats(t, p).ConnectFailures)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st = lcStats(t, p)
	if ok, _ := p.srv.Ready(); ok {
		t.Fatal("Ready() true with the upstream unreachable")
	}
	retryIn := time.Until(st.NextRetry)
	t.Logf("after %d failures the next attempt is due in %s", st.Failures, retryIn.Round(time.Millisecond))

	if err := px.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	eventually(t, 5*time.Second, "Ready() after the upstream came back", func() bool { ok, _ := p.srv.Ready(); return ok })
	t.Logf("ready %s after the upstream came back", time.Since(resumed).Round(time.Millisecond))
	// The backoff in progress was cut short (the pool noticed the server
	// accepting connections again) instead of being waited out.
	if readyAt := time.Now(); !readyAt.Before(st.NextRetry) {
		t.Errorf("ready at %s, not before the next attempt due at %s: the backoff was waited out",
			readyAt.Format("15:04:05.000"), st.NextRetry.Format("15:04:05.000"))
	}
	if lcStats(t, p).State != pool.Healthy {
		t.Fatalf("ready but state %s", lcStats(t, p).State)
	}
	c := p.connect(t, txExecMode)
	lcBackendPID(t, ctx, c)
}

// startup_mode fail-fast with the real binary: an unreachable upstream makes
// it exit non-zero after 3 attempts; a reachable one lets it start and
// SIGTERM stops it cleanly.
func TestFR001FailFastBinary(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	upstream := pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)

	t.Run("unreachable", func(t *testing.T) {
		dead := lcFreeAddr(t)
		u, _ := url.Parse(upstream)
		u.Host = dead
		proc := lcStartBinary(t, bin, "--listen", lcFreeAddr(t), "--http-listen=", "--upstream", u.String(),
			"--startup-mode", "fail-fast")
		code, took := proc.wait(t, 15*time.Second)
		out := proc.stderr.String()
		t.Logf("exit %d after %s", code, took.Round(time.Millisecond))
		if code == 0 {
			t.Fatalf("exit code 0 with the upstream unreachable; output:\n%s", out)
		}
		if took > 10*time.Second {
			t.Errorf("fail-fast took %s", took)
		}
		if !strings.Contains(out, "fail-fast") || !strings.Contains(out, "3 connect attempts failed") {
			t.Fatalf("output does not explain the fail-fast exit:\n%s", out)
		}
		if n := strings.Count(out, "server connect failed"); n != 3 {
			t.Errorf("%d connect failures logged, want 3:\n%s", n, out)
		}
	})

	t.Run("reachable", func(t *testing.T) {
		listen := lcFreeAddr(t)
		proc := lcStartBinary(t, bin, "--listen", listen, "--http-listen=", "--upstream", upstream,
			"--startup-mode", "fail-fast")
		eventually(t, 10*time.Second, "configured pools are warm", func() bool {
			select {
			case <-proc.done:
				t.Fatalf("poolerd exited: %v\n%s", proc.err, proc.stderr.String())
			default:
			}
			return strings.Contains(proc.stderr.String(), "configured pools are warm")
		})
		ctx := ctxTimeout(t, 10*time.Second)
		u, _ := url.Parse(upstream)
		u.Host = listen
		c := connectDSN(t, u.String()+"&"+txExecMode)
		lcBackendPID(t, ctx, c)
		_ = c.Close(ctx)
		if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, _ := proc.wait(t, 10*time.Second)
		if code != 0 {
			t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, proc.stderr.String())
		}
		if !strings.Contains(proc.stderr.String(), "poolerd stopped") {
			t.Errorf("no \"poolerd stopped\" in the output:\n%s", proc.stderr.String())
		}
	})
}

// ---------------------------------------------------------------------------
// FR-002: validation before use.

func TestFR002Validation(t *testing.T) {
	t.Parallel()
	settings := func(c *config.Config) {
		c.ValidationInterval = 200 * time.Millisecond
		c.ValidationQuery = "SELECT 1"
		c.ValidationTimeout = 300 * time.Millisecond
		c.ServerConnectTimeout = 5 * time.Second
		c.CheckoutTimeout = 10 * time.Second
	}

	// A connection that looks alive (the socket is open) but does not
	// answer fails validation; the client gets a fresh connection and
	// never sees the problem.
	t.Run("hung idle connection is replaced", func(t *testing.T) {
		px := lcProxy(t)
		p := lcStartVia(t, px, func(c *config.Config) {
			settings(c)
			c.MaxSize = 2
		})
		lcWaitState(t, p, 5*time.Second, pool.Healthy)
		c := p.connect(t, txExecMode)
		ctx := ctxTimeout(t, 20*time.Second)
		pid1 := lcBackendPID(t, ctx, c)
		lcWaitReleased(t, p)
		time.Sleep(400 * time.Millisecond) // idle > validation_interval

		px.SetMode(faultproxy.Hang)
		type res struct {
			pid int
			err error
		}
		ch := make(chan res, 1)
		go func() {
			var pid int
			err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
			ch <- res{pid, err}
		}()
		// Validation times out after 300 ms; then a new connection is
		// opened, which may proceed once the proxy forwards again.
		eventually(t, 5*time.Second, "a validation failure", func() bool { return lcStats(t, p).ValidationFailures >= 1 })
		px.SetMode(faultproxy.Forward)
		var r res
		select {
		case r = <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("query did not finish after validation failed")
		}
		if r.err != nil {
			t.Fatalf("query after a failed validation: %v", r.err)
		}
		if r.pid == pid1 {
			t.Fatalf("query ran on backend %d, the connection that failed validation", pid1)
		}
		st := lcStats(t, p)
		if st.ValidationFailures != 1 {
			t.Errorf("ValidationFailures %d, want 1", st.ValidationFailures)
		}
		if !strings.Contains(p.logs.String(), "server connection failed validation; closing it") {
			t.Errorf("validation failure not logged")
		}
		if pid := lcBackendPID(t, ctx, c); pid != r.pid {
			t.Logf("next query on backend %d (was %d)", pid, r.pid)
		}
	})

	// Two connections in a row fail validation: the client gets 08006
	// saying so, and keeps its session.
	t.Run("two bad connections give 08006", func(t *testing.T) {
		px := lcProxy(t)
		p := lcStartVia(t, px, func(c *config.Config) {
			settings(c)
			c.MinSize = 2
			c.MaxSize = 2
		})
		eventually(t, 5*time.Second, "2 idle connections", func() bool {
			st := lcStats(t, p)
			return st.Idle == 2 && st.State == pool.Healthy
		})
		c := p.connect(t, txExecMode)
		ctx := ctxTimeout(t, 20*time.Second)
		lcBackendPID(t, ctx, c)
		lcWaitReleased(t, p)
		time.Sleep(400 * time.Millisecond)

		px.SetMode(faultproxy.Hang)
		t0 := time.Now()
		_, err := c.Exec(ctx, "SELECT 1")
		took := time.Since(t0)
		if err == nil {
			t.Fatal("query succeeded although every connection hangs")
		}
		pe := lcPgError(t, err)
		t.Logf("after %s: %s %s (hint: %s)", took.Round(time.Millisecond), pe.Code, pe.Message, pe.Hint)
		if pe.Code != "08006" || !strings.Contains(pe.Message, "validation") || !strings.Contains(pe.Hint, "validation") {
			t.Fatalf("got %s %q hint %q, want 08006 about validation", pe.Code, pe.Message, pe.Hint)
		}
		if took > 5*time.Second {
			t.Errorf("two validations of 300 ms took %s", took)
		}
		if st := lcStats(t, p); st.ValidationFailures != 2 {
			t.Errorf("ValidationFailures %d, want 2", st.ValidationFailures)
		}
		px.SetMode(faultproxy.Forward)
		// The session survived the error and works once the server
		// answers again.
		eventually(t, 10*time.Second, "a query to succeed again", func() bool {
			_, err := c.Exec(ctx, "SELECT 1")
			return err == nil
		})
	})

	// A healthy idle connection passes validation and is reused; the empty
	// query is a valid validation_query.
	for _, q := range []string{"SELECT 1", ""} {
		t.Run(fmt.Sprintf("query %q passes", q), func(t *testing.T) {
			p := startPoolerd(t, func(c *config.Config) {
				settings(c)
				c.ValidationQuery = q
			})
			lcWaitState(t, p, 5*time.Second, pool.Healthy)
			c := p.connect(t, txExecMode)
			ctx := ctxTimeout(t, 10*time.Second)
			pid1 := lcBackendPID(t, ctx, c)
			lcWaitReleased(t, p)
			before := lcStats(t, p).LastHealthCheck
			time.Sleep(400 * time.Millisecond)
			pid2 := lcBackendPID(t, ctx, c)
			lcWaitReleased(t, p)
			st := lcStats(t, p)
			if pid2 != pid1 || st.ValidationFailures != 0 || st.ConnectAttempts != 1 {
				t.Fatalf("backend %d then %d, stats %+v: the connection should have passed validation", pid1, pid2, st.Stats)
			}
			if !st.LastHealthCheck.After(before) {
				t.Fatalf("LastHealthCheck %v not advanced by the validation (was %v)", st.LastHealthCheck, before)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// FR-003: reconnection with exponential backoff.

// The upstream refuses connections (ECONNREFUSED): clients fail fast with
// 08006 and a retry hint, attempts are logged with growing backoff, the
// pool is unhealthy; when the upstream returns the pool recovers at once.
func TestFR003ReconnectConnectionRefused(t *testing.T) {
	t.Parallel()
	const base, max = 200 * time.Millisecond, time.Second
	px := lcProxy(t)
	p := lcStartVia(t, px, func(c *config.Config) {
		c.MinSize = 2
		c.CheckoutTimeout = 30 * time.Second
		c.ReconnectBackoffBase = base
		c.ReconnectBackoffMax = max
	})
	eventually(t, 5*time.Second, "2 idle connections", func() bool {
		st := lcStats(t, p)
		return st.Idle == 2 && st.State == pool.Healthy
	})
	c := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 30*time.Second)
	lcBackendPID(t, ctx, c)
	lcWaitReleased(t, p)

	// The server goes away: new connects are refused, existing
	// connections are reset.
	if err := px.Pause(); err != nil {
		t.Fatal(err)
	}
	px.ResetAll()
	// Wait until every reset connection has been noticed: a query sent on
	// one the reader has not yet seen fail would lose its server (FATAL
	// 08006 "server connection lost"), which is right but not the point.
	eventually(t, 5*time.Second, "an unhealthy pool with no connection left", func() bool {
		st := lcStats(t, p)
		return st.State == pool.Unhealthy && st.Idle == 0
	})

	for i := range 3 {
		t0 := time.Now()
		_, err := c.Exec(ctx, "SELECT 1")
		took := time.Since(t0)
		if err == nil {
			t.Fatal("query succeeded with the upstream down")
		}
		pe := lcPgError(t, err)
		if pe.Code != "08006" || !strings.HasPrefix(pe.Message, "upstream unavailable, next retry in") {
			t.Fatalf("query %d: got %s %q, want 08006 upstream unavailable, next retry in ...", i, pe.Code, pe.Message)
		}
		if took > 5*time.Second {
			t.Fatalf("query %d failed after %s (checkout_timeout 30s): it should fail fast", i, took)
		}
		t.Logf("query %d: %s after %s", i, pe.Message, took.Round(time.Millisecond))
		time.Sleep(150 * time.Millisecond)
	}
	eventually(t, 10*time.Second, "4 rounds of failed connects", func() bool { return lcStats(t, p).Failures >= 4 })
	st := lcStats(t, p)
	if st.State != pool.Unhealthy || st.FastFailures < 1 || st.ConnectFailures < 4 || st.NextRetry.IsZero() || st.LastError == "" {
		t.Fatalf("while down: %+v", st.Stats)
	}
	lcCheckBackoff(t, p.logs.String(), base, max, 4)
	if ok, reason := p.srv.Ready(); ok || !strings.Contains(reason, "unhealthy") {
		t.Fatalf("Ready() = %v, %q while the upstream is down", ok, reason)
	}

	if err := px.Resume(); err != nil {
		t.Fatal(err)
	}
	took := lcWaitState(t, p, 5*time.Second, pool.Healthy)
	t.Logf("healthy %s after the upstream came back", took.Round(time.Millisecond))
	lcBackendPID(t, ctx, c)
	changes := lcHealthChanges(p.logs.String())
	if !lcSubsequence(changes, []string{"healthy", "unhealthy", "recovering", "healthy"}) {
		t.Errorf("health changes %v, want … healthy → unhealthy → recovering → healthy", changes)
	}
	if !strings.Contains(p.logs.String(), "server connect succeeded; backoff ended") {
		t.Errorf("recovery not logged")
	}
}

// The upstream accepts TCP connections but never answers: connects time out
// after server_connect_timeout and are retried with backoff; clients fail
// fast instead of waiting for checkout_timeout.
func TestFR003ReconnectServerHangs(t *testing.T) {
	t.Parallel()
	const base, max = 200 * time.Millisecond, time.Second
	px := lcProxy(t)
	p := lcStartVia(t, px, func(c *config.Config) {
		c.CheckoutTimeout = 30 * time.Second
		c.ServerConnectTimeout = 500 * time.Millisecond
		c.ReconnectBackoffBase = base
		c.ReconnectBackoffMax = max
	})
	lcWaitState(t, p, 5*time.Second, pool.Healthy)
	c := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 30*time.Second)
	lcBackendPID(t, ctx, c)
	lcWaitReleased(t, p)
	acceptedBefore := px.Accepted()

	px.SetMode(faultproxy.Hang)
	px.ResetAll()
	lcWaitState(t, p, 5*time.Second, pool.Unhealthy)
	for i := range 3 {
		t0 := time.Now()
		_, err := c.Exec(ctx, "SELECT 1")
		took := time.Since(t0)
		if err == nil {
			t.Fatal("query succeeded with the upstream hanging")
		}
		pe := lcPgError(t, err)
		if pe.Code != "08006" || !strings.HasPrefix(pe.Message, "upstream unavailable, next retry in") {
			t.Fatalf("query %d: got %s %q, want 08006 upstream unavailable", i, pe.Code, pe.Message)
		}
		// At worst the query waits for one connect attempt (500 ms).
		if took > 5*time.Second {
			t.Fatalf("query %d failed after %s (checkout_timeout 30s): it should fail fast", i, took)
		}
	}
	eventually(t, 10*time.Second, "4 timed-out connects", func() bool { return lcStats(t, p).Failures >= 4 })
	st := lcStats(t, p)
	entries := lcCheckBackoff(t, p.logs.String(), base, max, 4)
	// Every attempt reached the (hanging) server: it was a timeout, not a
	// refusal, and the pool did not hammer it.
	if attempts := px.Accepted() - acceptedBefore; attempts < 4 || uint64(attempts) > st.ConnectAttempts {
		t.Errorf("the proxy accepted %d connections for %d connect attempts", attempts, st.ConnectAttempts)
	}
	for _, e := range entries {
		if !strings.Contains(e.str("error"), "timeout") && !strings.Contains(e.str("error"), "deadline") {
			t.Errorf("connect failure %q is not a timeout", e.str("error"))
		}
	}
	// Attempts are spaced by connect timeout + backoff: over the 4
	// failures that is at least 4×500 ms + 0.8×(200+400+800) ms.
	if span := entries[len(entries)-1].Time.Sub(entries[0].Time); span < 2500*time.Millisecond {
		t.Errorf("4 failures within %s: backoff not applied", span)
	}

	px.SetMode(faultproxy.Forward)
	// The next attempt is due within max backoff (1 s ±20 %) and then
	// takes one round trip.
	took := lcWaitState(t, p, 6*time.Second, pool.Healthy)
	t.Logf("healthy %s after the upstream answered again", took.Round(time.Millisecond))
	lcBackendPID(t, ctx, c)
}

// ---------------------------------------------------------------------------
// FR-004: statistics.

func TestFR004Statistics(t *testing.T) {
	t.Parallel()
	startAt := time.Now()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 3
		c.CheckoutTimeout = 30 * time.Second
	})
	lcWaitState(t, p, 5*time.Second, pool.Healthy)
	st0 := lcStats(t, p)
	if st0.Acquisitions != 0 || st0.Releases != 0 || st0.PeakActive != 0 || st0.WaitMax != 0 || st0.Total != 1 || st0.Idle != 1 {
		t.Fatalf("initial stats: %+v", st0.Stats)
	}
	if st0.Created.Before(startAt.Add(-time.Second)) || st0.Created.After(time.Now()) {
		t.Fatalf("Created %v, started at %v", st0.Created, startAt)
	}
	if st0.LastHealthCheck.Before(st0.Created) {
		t.Fatalf("LastHealthCheck %v before Created %v", st0.LastHealthCheck, st0.Created)
	}

	// N sequential checkouts reuse the warm connection.
	const n = 10
	c := p.connect(t, txExecMode)
	ctx := ctxTimeout(t, 30*time.Second)
	lcWaitReleased(t, p)
	before := lcStats(t, p)
	for range n {
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		lcWaitReleased(t, p)
	}
	after := lcStats(t, p)
	if d := after.Acquisitions - before.Acquisitions; d != n {
		t.Errorf("Acquisitions grew by %d for %d queries", d, n)
	}
	if d := after.Releases - before.Releases; d != n {
		t.Errorf("Releases grew by %d for %d queries", d, n)
	}
	if dh, dm := after.Hits-before.Hits, after.Misses-before.Misses; dh != n || dm != 0 {
		t.Errorf("Hits +%d, Misses +%d; want +%d, +0", dh, dm, n)
	}
	if after.ConnectAttempts != 1 || after.Total != 1 || after.Idle != 1 || after.Active != 0 || after.PeakActive != 1 {
		t.Errorf("after %d sequential queries: %+v", n, after.Stats)
	}
	if after.Created != st0.Created {
		t.Errorf("Created changed from %v to %v", st0.Created, after.Created)
	}

	// 20 clients on 3 connections: requests queue.
	const clients, each = 20, 2
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		conns[i] = p.connect(t, txExecMode)
	}
	lcWaitReleased(t, p)
	before = lcStats(t, p)
	stop := make(chan struct{})
	sampled := make(chan [2]int, 1)
	go func() {
		maxWaiting, maxActive := 0, 0
		for {
			select {
			case <-stop:
				sampled <- [2]int{maxWaiting, maxActive}
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, ps := range p.srv.Pools() {
				maxWaiting = max(maxWaiting, ps.Waiting)
				maxActive = max(maxActive, ps.Active)
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for _, cc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := cc.Exec(ctx, "SELECT pg_sleep(0.1)"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	m := <-sampled
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	lcWaitReleased(t, p)
	after = lcStats(t, p)
	t.Logf("concurrent phase: max waiting %d, max active %d; stats %+v", m[0], m[1], after.Stats)
	if m[0] == 0 {
		t.Errorf("never saw a waiting request with %d clients on max_size 3", clients)
	}
	if m[1] > 3 || after.PeakActive != 3 || after.Total > 3 {
		t.Errorf("max active seen %d, PeakActive %d, Total %d; want 3 at most and a peak of 3", m[1], after.PeakActive, after.Total)
	}
	// A client's next query may reuse its server before the reader
	// released it, so checkouts are between 1 and 2 per query.
	if d := after.Acquisitions - before.Acquisitions; d < clients || d > clients*each {
		t.Errorf("Acquisitions grew by %d for %d queries", d, clients*each)
	}
	if after.Acquisitions != after.Releases || after.Waiting != 0 || after.Timeouts != 0 {
		t.Errorf("after the concurrent phase: %+v", after.Stats)
	}
	if after.ConnectAttempts != 3 || after.Misses < 1 {
		t.Errorf("ConnectAttempts %d, Misses %d: the pool should have grown to 3 for waiters", after.ConnectAttempts, after.Misses)
	}
	if after.WaitMax < 50*time.Millisecond || after.AvgWait() <= 0 || after.WaitMax < before.WaitMax {
		t.Errorf("WaitMax %s, AvgWait %s: requests waited ~100 ms for a connection", after.WaitMax, after.AvgWait())
	}
	if !after.LastHealthCheck.After(before.LastHealthCheck) {
		t.Errorf("LastHealthCheck not advanced by the new connections")
	}
	// Peaks are retained.
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	lcWaitReleased(t, p)
	if st := lcStats(t, p); st.PeakActive != 3 || st.WaitMax != after.WaitMax {
		t.Errorf("peaks not retained: PeakActive %d, WaitMax %s", st.PeakActive, st.WaitMax)
	}
}

// ---------------------------------------------------------------------------
// FR-005: graceful shutdown of the pool (the client side is covered by
// shutdown_test.go).

func TestFR005ShutdownTerminatesPools(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MinSize = 2 })
	lcWaitState(t, p, 5*time.Second, pool.Healthy)
	app := relayName("lc-fr005")
	ctx := ctxTimeout(t, 20*time.Second)
	// Two clients in concurrent transactions use both server connections
	// under this application_name.
	pids := map[int]bool{}
	var txs []pgx.Tx
	for range 2 {
		c := p.connect(t, txExecMode, "application_name="+app)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids[pid] = true
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lcWaitReleased(t, p)
	where := fmt.Sprintf("application_name = '%s'", app)
	if n := countBackends(t, where); n != 2 || len(pids) != 2 {
		t.Fatalf("%d backends named %s (pids %v), want 2", n, app, pids)
	}

	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, ps := range p.srv.Pools() {
		if ps.State != pool.Terminated || ps.Total != 0 || ps.Idle != 0 || ps.Active != 0 {
			t.Errorf("pool %s/%s after Shutdown: %+v", ps.Database, ps.User, ps.Stats)
		}
	}
	if ok, reason := p.srv.Ready(); ok || reason != "shutting down" {
		t.Errorf("Ready() after Shutdown = %v, %q", ok, reason)
	}
	var list []string
	for pid := range pids {
		list = append(list, strconv.Itoa(pid))
	}
	sort.Strings(list)
	eventually(t, 5*time.Second, "no backend left behind", func() bool {
		return countBackends(t, where+" OR pid IN ("+strings.Join(list, ",")+")") == 0
	})
}

// ---------------------------------------------------------------------------
// FR-007: configuration validation (unit-tested in internal/config; here the
// binary's behaviour).

func TestFR007InvalidConfigExits2(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	upstream := pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"min_size above max_size", []string{"--min-pool-size", "15", "--pool-size", "10"},
			"min_size (15) exceeds max_size (10): reduce min_size to 10 or raise max_size to 15"},
		{"max_size zero", []string{"--pool-size", "0"}, "max_size 0 must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := lcFreeAddr(t)
			args := append([]string{"--listen", listen, "--http-listen=", "--upstream", upstream}, tc.args...)
			proc := lcStartBinary(t, bin, args...)
			code, _ := proc.wait(t, 10*time.Second)
			out := proc.stderr.String()
			if code != 2 {
				t.Fatalf("exit code %d, want 2; output:\n%s", code, out)
			}
			if !strings.Contains(out, "invalid configuration") || !strings.Contains(out, tc.want) {
				t.Fatalf("output lacks %q:\n%s", tc.want, out)
			}
			// Nothing was started: the listen address is still free.
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				t.Fatalf("listen address taken after a refused configuration: %v", err)
			}
			ln.Close()
		})
	}
}

// ---------------------------------------------------------------------------
// FR-008: health status (the HTTP endpoint is tested elsewhere).

func TestFR008ReadyReasons(t *testing.T) {
	t.Parallel()
	px := lcProxy(t)
	p := lcStartVia(t, px, func(c *config.Config) {
		c.ReconnectBackoffBase = 200 * time.Millisecond
		c.ReconnectBackoffMax = time.Second
	})
	lcWaitState(t, p, 5*time.Second, pool.Healthy)
	eventually(t, 2*time.Second, "Ready()", func() bool { ok, _ := p.srv.Ready(); return ok })
	if ok, reason := p.srv.Ready(); !ok || reason != "" {
		t.Fatalf("Ready() = %v, %q while healthy", ok, reason)
	}

	// Ready() is cheap: no database round trip.
	durs := make([]time.Duration, 200)
	for i := range durs {
		t0 := time.Now()
		p.srv.Ready()
		durs[i] = time.Since(t0)
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	if durs[len(durs)/2] > 10*time.Millisecond {
		t.Errorf("median Ready() call takes %s", durs[len(durs)/2])
	}

	// Unhealthy: nothing open and connects refused. The reason names the
	// pool, its state and the last connect error.
	if err := px.Pause(); err != nil {
		t.Fatal(err)
	}
	px.ResetAll()
	lcWaitState(t, p, 5*time.Second, pool.Unhealthy)
	ok, reason := p.srv.Ready()
	if ok || !strings.HasPrefix(reason, "pool app/app is unhealthy: ") || !strings.Contains(reason, "connection refused") {
		t.Errorf("Ready() = %v, %q while unhealthy", ok, reason)
	}
	if err := px.Resume(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "Ready() after recovery", func() bool { ok, _ := p.srv.Ready(); return ok })

	// Shutting down.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if ok, reason := p.srv.Ready(); ok || reason != "shutting down" {
		t.Errorf("Ready() after Shutdown = %v, %q", ok, reason)
	}
}

// Partial connectivity: one connection is open and busy, and the server
// refuses another one. With max_size 2 the pool is degraded (half of
// max_size open) and poolerd stays ready; with max_size 4 it is unhealthy
// and not ready. Either way the open connection keeps serving, and once the
// server accepts connections again the pool must return to healthy by
// itself, without waiting for more demand.
func TestFR008PartialOutageRecovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxSize int
		during  pool.State
		ready   bool
	}{
		{2, pool.Degraded, true},
		{4, pool.Unhealthy, false},
	} {
		t.Run(fmt.Sprintf("max_size %d %s", tc.maxSize, tc.during), func(t *testing.T) {
			px := lcProxy(t)
			p := lcStartVia(t, px, func(c *config.Config) {
				c.MinSize = 1
				c.MaxSize = tc.maxSize
				c.CheckoutTimeout = 20 * time.Second
				c.ReconnectBackoffBase = 200 * time.Millisecond
				c.ReconnectBackoffMax = time.Second
			})
			lcWaitState(t, p, 5*time.Second, pool.Healthy)
			ctx := ctxTimeout(t, 30*time.Second)
			holder := p.connect(t, txExecMode)
			other := p.connect(t, txExecMode)
			tx, err := holder.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			lcBackendPID(t, ctx, holder) // the transaction now holds the server
			if err := px.Pause(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := other.Exec(ctx, "SELECT 1")
				done <- err
			}()
			lcWaitState(t, p, 5*time.Second, tc.during)
			if ok, reason := p.srv.Ready(); ok != tc.ready {
				t.Errorf("Ready() = %v, %q while %s", ok, reason, tc.during)
			} else if !ok && !strings.HasPrefix(reason, "pool app/app is "+tc.during.String()) {
				t.Errorf("Ready() reason %q", reason)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("queued query: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("queued query not served by the released connection")
			}

			if err := px.Resume(); err != nil {
				t.Fatal(err)
			}
			if took, ok := lcWaitStateOK(p, 5*time.Second, pool.Healthy); !ok {
				st := lcStats(t, p)
				ready, reason := p.srv.Ready()
				t.Errorf("pool still %s %s after the server accepts connections again; Ready() = %v, %q; stats %+v",
					st.State, took.Round(time.Millisecond), ready, reason, st.Stats)
			}
			if _, err := other.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// lcWaitStateOK is lcWaitState that reports instead of failing.
func lcWaitStateOK(p *instance, d time.Duration, want pool.State) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < d {
		for _, ps := range p.srv.Pools() {
			if ps.Database == pgtest.DBApp && ps.User == pgtest.RoleApp && ps.State == want {
				return time.Since(start), true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), false
}

// ---------------------------------------------------------------------------
// FR-009: recycling by query count, lifetime and idleness.

func TestFR009Recycling(t *testing.T) {
	t.Parallel()

	t.Run("max_queries", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			c.MaxSize = 1
			c.MaxQueries = 5
			c.RecycleRate = 10
		})
		lcWaitState(t, p, 5*time.Second, pool.Healthy)
		c := p.connect(t, txExecMode)
		ctx := ctxTimeout(t, 20*time.Second)
		lcWaitReleased(t, p)
		uses := map[int]int{}
		for range 12 {
			uses[lcBackendPID(t, ctx, c)]++
			lcWaitReleased(t, p)
		}
		st := lcStats(t, p)
		t.Logf("client queries per backend: %v; RecycledQueries %d", uses, st.RecycledQueries)
		for pid, n := range uses {
			if n > 5 {
				t.Errorf("backend %d ran %d client queries, max_queries is 5", pid, n)
			}
		}
		if len(uses) < 3 || st.RecycledQueries < 2 {
			t.Errorf("%d backends used and %d recycled for 12 queries with max_queries 5", len(uses), st.RecycledQueries)
		}
		if st.RecycledLifetime != 0 || st.RecycledIdle != 0 {
			t.Errorf("recycled for other reasons: %+v", st.Stats)
		}
	})

	t.Run("max_lifetime", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			c.MinSize = 1
			c.MaxSize = 1
			c.MaxLifetime = 300 * time.Millisecond
		})
		lcWaitState(t, p, 5*time.Second, pool.Healthy)
		// Idle connections older than 300 ms are replaced.
		eventually(t, 6*time.Second, "an idle connection recycled by lifetime", func() bool {
			return lcStats(t, p).RecycledLifetime >= 1
		})
		c := p.connect(t, txExecMode)
		ctx := ctxTimeout(t, 20*time.Second)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pidA, pidB int
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidA); err != nil {
			t.Fatal(err)
		}
		recycled := lcStats(t, p).RecycledLifetime
		time.Sleep(1500 * time.Millisecond) // 5× max_lifetime inside one transaction
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidB); err != nil {
			t.Fatalf("transaction broken while its connection outlived max_lifetime: %v", err)
		}
		if pidA != pidB {
			t.Fatalf("backend changed inside a transaction: %d then %d", pidA, pidB)
		}
		if got := lcStats(t, p).RecycledLifetime; got != recycled {
			t.Fatalf("RecycledLifetime went from %d to %d while the only connection was in a transaction", recycled, got)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// Released past its lifetime: recycled, the next query gets
		// another backend.
		eventually(t, 5*time.Second, "the connection recycled after the transaction", func() bool {
			return lcStats(t, p).RecycledLifetime > recycled
		})
		if pid := lcBackendPID(t, ctx, c); pid == pidA {
			t.Fatalf("backend %d still used after it was recycled", pid)
		}
	})

	t.Run("idle_timeout", func(t *testing.T) {
		p := startPoolerd(t, func(c *config.Config) {
			c.MinSize = 1
			c.MaxSize = 4
			c.IdleTimeout = 300 * time.Millisecond
			c.RecycleRate = 1
		})
		lcWaitState(t, p, 5*time.Second, pool.Healthy)
		ctx := ctxTimeout(t, 30*time.Second)
		// Four concurrent transactions open four connections.
		var txs []pgx.Tx
		for range 4 {
			c := p.connect(t, txExecMode)
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			txs = append(txs, tx)
		}
		if st := lcStats(t, p); st.Active != 4 || st.Total != 4 {
			t.Fatalf("4 transactions: %+v", st.Stats)
		}
		for _, tx := range txs {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		lcWaitReleased(t, p)
		t0 := time.Now()
		if st := lcStats(t, p); st.Idle+int(st.RecycledIdle) != 4 {
			t.Fatalf("after the commits: %+v", st.Stats)
		}
		eventually(t, 8*time.Second, "the pool to shrink to min_size 1", func() bool { return lcStats(t, p).Total == 1 })
		took := time.Since(t0)
		t.Logf("4 → 1 idle connections in %s", took.Round(time.Millisecond))
		if took < 2*time.Second {
			t.Errorf("3 connections recycled in %s with recycle_rate 1/s", took)
		}
		time.Sleep(1500 * time.Millisecond)
		st := lcStats(t, p)
		if st.Total != 1 || st.Idle != 1 || st.RecycledIdle != 3 {
			t.Fatalf("below min_size or recycled too many: %+v", st.Stats)
		}
		entries := lcLogEntries(p.logs.String(), "server connection recycled")
		ids := map[int]bool{}
		for i, e := range entries {
			if e.str("reason") != pool.RecycleIdle || e.num("conn_id") == 0 {
				t.Errorf("recycle log %d: %v", i, e.Fields)
			}
			ids[e.num("conn_id")] = true
			if i > 0 {
				if gap := e.Time.Sub(entries[i-1].Time); gap < 500*time.Millisecond {
					t.Errorf("recycles %d and %d only %s apart (recycle_rate 1/s)", i, i+1, gap)
				}
			}
		}
		if len(entries) != 3 || len(ids) != 3 {
			t.Errorf("%d recycle log lines for %d connections, want 3", len(entries), len(ids))
		}
	})
}

// ---------------------------------------------------------------------------
// FR-010: concurrent access.

func TestFR010ConcurrentTransactions(t *testing.T) {
	t.Parallel()
	const workers, txs = 100, 50
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 4
		c.CheckoutTimeout = 60 * time.Second
	})
	tbl := relayTable(t, "w int NOT NULL, i int NOT NULL, PRIMARY KEY (w, i)")
	ctx := ctxTimeout(t, 120*time.Second)
	insert := fmt.Sprintf("INSERT INTO %s (w, i) VALUES ($1::int, $2::int)", tbl)
	sum := fmt.Sprintf("SELECT count(*), coalesce(sum(i), 0) FROM %s WHERE w = $1::int", tbl)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pgx.Connect(ctx, p.appDSN(txExecMode))
			if err != nil {
				errs <- fmt.Errorf("worker %d: connect: %w", w, err)
				return
			}
			defer c.Close(context.Background())
			for i := range txs {
				err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, insert, w, i); err != nil {
						return err
					}
					var n, s int
					if err := tx.QueryRow(ctx, sum, w).Scan(&n, &s); err != nil {
						return err
					}
					if n != i+1 || s != i*(i+1)/2 {
						return fmt.Errorf("sees %d rows summing to %d, want %d and %d", n, s, i+1, i*(i+1)/2)
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("worker %d transaction %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d transactions by %d clients in %s", workers*txs, workers, time.Since(start).Round(time.Millisecond))

	var total, distinct int
	if err := relayDirect(t).QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(DISTINCT (w, i)) FROM %s", tbl)).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != workers*txs || distinct != workers*txs {
		t.Fatalf("table has %d rows (%d distinct), want %d", total, distinct, workers*txs)
	}
	eventually(t, 5*time.Second, "every server connection released", func() bool {
		st := lcStats(t, p)
		return st.Active == 0 && st.Waiting == 0
	})
	st := lcStats(t, p)
	t.Logf("stats: %+v", st.Stats)
	if st.Acquisitions != st.Releases || st.PeakActive > 4 || st.Total > 4 || st.Idle != st.Total ||
		st.Timeouts != 0 || st.State != pool.Healthy || st.ConnectFailures != 0 {
		t.Fatalf("inconsistent stats after the run: %+v", st.Stats)
	}
	if st.PeakActive != 4 {
		t.Errorf("PeakActive %d with %d clients on max_size 4", st.PeakActive, workers)
	}
	// Every transaction needs at least one checkout, unless the client's
	// next BEGIN arrives before the server was released (rare).
	if st.Acquisitions < workers*txs/2 {
		t.Errorf("only %d checkouts for %d transactions", st.Acquisitions, workers*txs)
	}
	if st.Hits+st.Misses != st.Acquisitions {
		t.Errorf("Hits %d + Misses %d != Acquisitions %d", st.Hits, st.Misses, st.Acquisitions)
	}
}

// warm_pools false (PgBouncer's lazy pools, what a pgbouncer.ini gives): a
// configured pool opens no connection before its first client, and
// poolerd is ready at once; a configured pool with a min_size opens that
// many at start. With the default (true) the same pool opens one.
func TestWarmPoolsOff(t *testing.T) {
	t.Parallel()
	lazy := startPoolerd(t, func(c *config.Config) { c.WarmPools = false })
	eventually(t, 2*time.Second, "Ready()", func() bool { ok, _ := lazy.srv.Ready(); return ok })
	time.Sleep(300 * time.Millisecond) // a warm-up would have connected by now
	if n := len(lazy.srv.Servers()); n != 0 {
		t.Fatalf("%d server connections before any client, want none (lazy pool)", n)
	}
	c := lazy.connect(t, txExecMode)
	lcBackendPID(t, ctxTimeout(t, 10*time.Second), c)
	if st := lcStats(t, lazy); st.Total != 1 || st.ConnectAttempts != 1 {
		t.Fatalf("after the first client's query: %+v, want one connection", st.Stats)
	}

	floor := startPoolerd(t, func(c *config.Config) { c.WarmPools, c.MinSize = false, 2 })
	eventually(t, 5*time.Second, "min_size 2 open without a client", func() bool {
		st := lcStats(t, floor)
		return st.Total == 2 && st.Idle == 2
	})

	warm := startPoolerd(t, nil)
	eventually(t, 5*time.Second, "the warm-up connection", func() bool { return len(warm.srv.Servers()) == 1 })
}
