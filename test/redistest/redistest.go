// Package redistest starts throwaway redis-server processes for tests.
//
// Start runs redis-server as a child process of the test binary, bound to
// 127.0.0.1 on a free port, without persistence (--save "" --appendonly
// no), with its working directory and log in a fresh temporary directory,
// and waits until it answers PING. Callers must call Server.Stop when done
// (StartTB registers it with tb.Cleanup); on Linux the server is also
// killed if the test binary dies first.
//
// Tests that need Redis should skip only when the redis-server binary is
// missing (Find fails) and fail on any other error, which StartTB does:
//
//	func TestSomething(t *testing.T) {
//		srv := redistest.StartTB(t)
//		c := srv.Client()
//		defer c.Close()
//		...
//	}
//
// Redis runs fine as root, so unlike PostgreSQL no user switching is
// needed. On Redis 7 and later the DEBUG command is enabled for local
// connections (--enable-debug-command local), so that tests can make the
// server slow with DEBUG SLEEP.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	readyTimeout = 10 * time.Second
	stopTimeout  = 5 * time.Second
	logFileName  = "redis.log"
	startTries   = 3
)

// Options configures StartWith.
type Options struct {
	// Args are extra redis-server arguments, appended after the harness's
	// own, e.g. []string{"--maxmemory", "16mb"}.
	Args []string
	// Logf receives harness progress (e.g. t.Logf); nil = silent.
	Logf func(format string, args ...any)
}

// Server is a redis-server child process started by Start.
type Server struct {
	// Host is the address the server listens on: always "127.0.0.1".
	Host string
	// Port is the TCP port the server listens on.
	Port int
	// Bin is the redis-server binary that runs.
	Bin string
	// Version is the server's version as reported by redis-server
	// --version, e.g. "7.0.15".
	Version string

	dir     string // temp dir: working dir and log; removed by Stop
	logFile string
	args    []string
	logf    func(format string, args ...any)

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	stopped bool
}

// Find returns the path of the redis-server binary: the one on PATH, else
// /usr/bin/redis-server or /usr/local/bin/redis-server. Its error means
// tests needing Redis should be skipped.
func Find() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("redistest: redis-server not found on PATH or in /usr/bin, /usr/local/bin; install it: apt-get install redis-server")
}

// Start starts a redis-server with default options.
func Start() (*Server, error) {
	return StartWith(Options{})
}

var versionRE = regexp.MustCompile(`v=(\d+)\.(\d+)\.(\d+)`)

// StartWith starts a redis-server on a free port of 127.0.0.1 and waits
// until it answers PING (timeout 10s; errors include the tail of the
// server log). Callers must call Stop when done.
func StartWith(opts Options) (_ *Server, err error) {
	begin := time.Now()
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	s := &Server{Host: "127.0.0.1", Bin: bin, logf: opts.Logf}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redistest: %s --version: %w: %s", bin, err, strings.TrimSpace(string(out)))
	}
	m := versionRE.FindStringSubmatch(string(out))
	if m == nil {
		return nil, fmt.Errorf("redistest: cannot parse the version of %s: %q", bin, strings.TrimSpace(string(out)))
	}
	s.Version = m[1] + "." + m[2] + "." + m[3]
	major, _ := strconv.Atoi(m[1])

	s.dir, err = os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: create temp dir: %w", err)
	}
	s.logFile = filepath.Join(s.dir, logFileName)
	defer func() {
		if err != nil {
			if serr := s.Stop(); serr != nil {
				err = fmt.Errorf("%w (stop also failed: %v)", err, serr)
			}
		}
	}()
	s.args = []string{
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", s.dir,
		"--logfile", "", // stdout, redirected to logFile
	}
	if major >= 7 {
		s.args = append(s.args, "--enable-debug-command", "local")
	}
	s.args = append(s.args, opts.Args...)

	for attempt := 1; ; attempt++ {
		if s.Port, err = FreePort(); err != nil {
			return nil, err
		}
		err = s.start()
		if err == nil {
			break
		}
		if attempt >= startTries || !strings.Contains(s.LogTail(20), "Address already in use") {
			return nil, err
		}
		s.logf("redistest: port %d taken, retrying with another port", s.Port)
	}
	s.logf("redistest: redis-server %s ready on %s in %v", s.Version, s.Addr(), time.Since(begin).Round(time.Millisecond))
	return s, nil
}

// StartTB starts a redis-server for a test or benchmark and registers its
// Stop with tb.Cleanup. It skips tb if redis-server is not installed and
// fails it if the server cannot start.
func StartTB(tb testing.TB) *Server {
	tb.Helper()
	return StartTBWith(tb, Options{Logf: tb.Logf})
}

// StartTBWith is StartTB with options.
func StartTBWith(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if _, err := Find(); err != nil {
		tb.Skip(err)
	}
	s, err := StartWith(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// FreePort returns a TCP port on 127.0.0.1 that was free at the time of
// the call.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start launches the process on s.Port and waits until it answers PING.
func (s *Server) start() error {
	logf, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("redistest: open log: %w", err)
	}
	defer logf.Close() // the child has its own descriptor
	args := append([]string{"--port", strconv.Itoa(s.Port)}, s.args...)
	cmd := exec.Command(s.Bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf // an *os.File: no copying goroutine
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	s.logf("redistest: starting %s on %s", s.Bin, s.Addr())
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.Bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	for {
		perr := ping(s.Addr(), 500*time.Millisecond)
		if perr == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redistest: redis-server exited during startup (%v)\nserver log tail:\n%s", cmd.ProcessState, s.LogTail(20))
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redistest: redis-server on %s not ready after %v: %w\nserver log tail:\n%s", s.Addr(), readyTimeout, perr, s.LogTail(20))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping sends an inline PING and expects +PONG.
func ping(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("unexpected PING reply %q", strings.TrimSpace(line))
	}
	return nil
}

// Addr returns the server's TCP address, "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
}

// ClientOptions returns go-redis options for the server: ContextTimeoutEnabled
// (context deadlines reach the socket), no command retries and a single
// dial attempt (a test sees every failure at once), no CLIENT SETINFO and
// no maintenance notifications (Redis 7.0 knows neither).
func (s *Server) ClientOptions() *redis.Options {
	return &redis.Options{
		Addr:                     s.Addr(),
		ContextTimeoutEnabled:    true,
		MaxRetries:               -1,
		DialerRetries:            1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// Client returns a new client of the server with ClientOptions. The caller
// must Close it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(s.ClientOptions())
}

// Running reports whether the server process is still running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Stop terminates the server (SIGTERM, then SIGKILL after 5s), waits for
// it to exit and removes its temporary directory. It is safe to call more
// than once.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	var errs []error
	if s.cmd != nil {
		s.logf("redistest: stopping redis-server on %s", s.Addr())
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			errs = append(errs, fmt.Errorf("redistest: redis-server on %s ignored SIGTERM for %v, killed", s.Addr(), stopTimeout))
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if s.dir != "" {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("redistest: remove %s: %w", s.dir, err))
		}
	}
	return errors.Join(errs...)
}

// kill SIGKILLs the process and waits for it, for a failed start.
func (s *Server) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Do runs one command on a fresh connection, for tests that need to
// poke the server (DEBUG SLEEP, CONFIG SET, ...), and returns its reply.
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	c := s.Client()
	defer c.Close()
	v, err := c.Do(ctx, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("redistest: %v: %w", args, err)
	}
	return v, nil
}

// LogTail returns the last n lines of the server log, for failure
// messages; "" if it cannot be read.
func (s *Server) LogTail(n int) string {
	if s.logFile == "" || n <= 0 {
		return ""
	}
	data, err := os.ReadFile(s.logFile)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
