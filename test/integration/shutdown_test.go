package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// appDirect connects straight to PostgreSQL as app.
func appDirect(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctxTimeout(t, 10*time.Second), pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// shutdownAsync starts srv.Shutdown with a context of timeout d and returns
// a channel that gets its result.
func shutdownAsync(p *instance, d time.Duration) <-chan error {
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		ch <- p.srv.Shutdown(ctx)
	}()
	return ch
}

// expectRefused checks that a new client cannot log in: the dial fails, or
// the connection is closed (possibly after a 57P01 error) without a login.
func expectRefused(t *testing.T, addr string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return
	}
	defer nc.Close()
	c := &feConn{t: t, nc: nc, fe: pgproto3.NewFrontend(nc, nc)}
	pkt, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: startupParamsFor(pgtest.RoleApp)}).Encode(nil)
	if _, err := nc.Write(pkt); err != nil {
		return
	}
	for _, e := range c.expectClosed(3 * time.Second) {
		if e.Code != "57P01" {
			t.Errorf("new client during shutdown got %s %s %s", e.Severity, e.Code, e.Message)
		}
	}
}

// pgxQueryFails checks that c can no longer run queries; the error must be
// 57P01 or a closed connection.
func pgxQueryFails(t *testing.T, c *pgx.Conn) {
	t.Helper()
	_, err := c.Exec(ctxTimeout(t, 5*time.Second), "SELECT 1")
	if err == nil {
		t.Fatal("query succeeded after shutdown")
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code != "57P01" {
		t.Errorf("got %s %s, want 57P01 or a closed connection", pe.Code, pe.Message)
	}
	t.Logf("after shutdown: %v", err)
}

func TestShutdownIdleClients(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)

	neverQueried := dialFE(t, p.addr)
	neverQueried.login(pgtest.RoleApp, pgtest.Password)
	queried := dialFE(t, p.addr)
	queried.login(pgtest.RoleApp, pgtest.Password)
	queried.mustQuery("SELECT 1")
	pc := p.connect(t)
	if _, err := pc.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "three clients", func() bool { return p.srv.ClientCount() == 3 })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown with only idle clients took %s", d)
	}
	for name, c := range map[string]*feConn{"never queried": neverQueried, "queried": queried} {
		e := c.expectError()
		if e.Code != "57P01" || e.Severity != "FATAL" {
			t.Errorf("%s client got %s %s %s, want FATAL 57P01", name, e.Severity, e.Code, e.Message)
		}
		c.expectClosed(3 * time.Second)
	}
	pgxQueryFails(t, pc)
	if n := p.srv.ClientCount(); n != 0 {
		t.Errorf("%d clients left after Shutdown", n)
	}
	if ok, reason := p.srv.Ready(); ok || reason != "shutting down" {
		t.Errorf("Ready after Shutdown: %v %q", ok, reason)
	}
	expectRefused(t, p.addr)
	// A second Shutdown (the harness runs one too) is harmless.
	if err := p.srv.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

func TestShutdownLetsTransactionsFinish(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ShutdownTimeout = 5 * time.Second })
	direct := appDirect(t)
	table := fmt.Sprintf("shutdown_tx_%d", time.Now().UnixNano())
	ctx := ctxTimeout(t, 20*time.Second)
	if _, err := direct.Exec(ctx, "CREATE TABLE "+table+" (x int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = direct.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })

	tx := p.connect(t, "default_query_exec_mode=simple_protocol")
	for _, sql := range []string{"BEGIN", "INSERT INTO " + table + " VALUES (1)"} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	idle := dialFE(t, p.addr)
	idle.login(pgtest.RoleApp, pgtest.Password)

	done := shutdownAsync(p, 10*time.Second)
	eventually(t, 5*time.Second, "shutdown to start", func() bool { ok, _ := p.srv.Ready(); return !ok })

	// The idle client is told at once, while the transaction goes on.
	if e := idle.expectError(); e.Code != "57P01" || e.Severity != "FATAL" {
		t.Errorf("idle client got %s %s %s, want FATAL 57P01", e.Severity, e.Code, e.Message)
	}
	idle.expectClosed(3 * time.Second)
	expectRefused(t, p.addr)

	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while a client is in a transaction", err)
	default:
	}
	for _, sql := range []string{"INSERT INTO " + table + " VALUES (2)", "COMMIT"} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s after shutdown started: %v", sql, err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the last transaction ended")
	}
	pgxQueryFails(t, tx)

	var n int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d rows committed, want 2", n)
	}
}

func TestShutdownDeadline(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	app := fmt.Sprintf("shutdown_stuck_%d", time.Now().UnixNano())
	stuck := p.connect(t, "default_query_exec_mode=simple_protocol", "application_name="+app)
	ctx := ctxTimeout(t, 20*time.Second)
	for _, sql := range []string{"BEGIN", "SELECT 1"} {
		if _, err := stuck.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	where := "application_name = '" + app + "' AND state LIKE 'idle in transaction%'"
	if n := countBackends(t, where); n != 1 {
		t.Fatalf("%d backends idle in transaction for the client before shutdown, want 1", n)
	}

	sctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.srv.Shutdown(sctx)
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown returned %v, want the context's deadline error", err)
	}
	if elapsed < 450*time.Millisecond || elapsed > 4*time.Second {
		t.Errorf("Shutdown returned after %s, want about 500ms", elapsed)
	}
	pgxQueryFails(t, stuck)
	eventually(t, 5*time.Second, "the stuck transaction's backend to go", func() bool {
		return countBackends(t, "application_name = '"+app+"'") == 0
	})
	if n := p.srv.ClientCount(); n != 0 {
		t.Errorf("%d clients left after Shutdown", n)
	}
}

// TestShutdownPgbenchMidRun is SIGTERM under load (what main does on SIGTERM
// is Shutdown): pgbench -S -c 16, Shutdown after a second or two, five
// times. Every pgbench client ends, and each ends with the 57P01 message,
// none cut without it; a client inside pg_sleep(2) gets its row; the log
// has no "use of closed network connection" (a session cut mid-request).
func TestShutdownPgbenchMidRun(t *testing.T) {
	pgbench := needTool(t, "pgbench")
	const runs, clients = 5, 16
	db := atomDB(t, 1, 0)
	dir := t.TempDir()
	init := startPoolerd(t, func(c *config.Config) {
		c.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, db)
	})
	init.runTool(t, 60*time.Second, db, dir, pgbench, "-i", "-s", "1", "-q")

	aborted := regexp.MustCompile(`(?m)^pgbench: error: client \d+ .*aborted.*$`)
	withoutMsg, cut := 0, 0
	for run := range runs {
		p := startPoolerd(t, func(c *config.Config) {
			c.Upstream = pg.DSN(pgtest.RoleApp, pgtest.Password, db)
			c.PoolMode = config.PoolTransaction
			c.MaxSize = 8
			c.ShutdownTimeout = 30 * time.Second
			c.LogLevel = "debug"
		})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := p.toolCmd(t, ctx, db, dir, pgbench, "-S", "-n", "-c", fmt.Sprint(clients), "-j", "1", "-T", "30") // one thread: stderr lines not interleaved
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sleeper := p.connect(t, "default_query_exec_mode=simple_protocol")
		type row struct {
			v   int
			err error
		}
		slept := make(chan row, 1)
		time.Sleep(time.Duration(1000+run*200) * time.Millisecond)
		go func() {
			var r row
			r.err = sleeper.QueryRow(ctx, "SELECT 42 FROM pg_sleep(2)").Scan(&r.v)
			slept <- r
		}()
		time.Sleep(300 * time.Millisecond)
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		if err := p.srv.Shutdown(sctx); err != nil {
			t.Errorf("run %d: Shutdown: %v", run, err)
		}
		took := time.Since(start)
		scancel()
		if r := <-slept; r.err != nil || r.v != 42 {
			t.Errorf("run %d: the client inside pg_sleep(2) got %d, %v; want its row", run, r.v, r.err)
		}
		_ = cmd.Wait() // pgbench exits 2 when clients are aborted
		cancel()
		pgxQueryFails(t, sleeper)
		// A client gets the message as the answer to the request it is
		// sending, or, when it is between requests, as libpq's unsolicited
		// notice followed by "perhaps the backend died" on its next
		// request: either way, one message per client.
		msgs := strings.Count(stderr.String(), "FATAL:  terminating connection ")
		lines := aborted.FindAllString(stderr.String(), -1)
		if len(lines) != clients {
			t.Errorf("run %d: %d pgbench clients reported aborted, want all %d:\n%s", run, len(lines), clients, stderr.String())
		}
		if msgs < len(lines) {
			withoutMsg += len(lines) - msgs
			t.Errorf("run %d: %d clients ended, %d 57P01 messages:\n%s", run, len(lines), msgs, stderr.String())
		}
		if n := strings.Count(p.logs.String(), "use of closed network connection"); n > 0 {
			cut += n
			t.Errorf("run %d: %d sessions cut mid-request (\"use of closed network connection\" in the log)", run, n)
		}
		t.Logf("run %d: Shutdown took %s; %d clients ended, %d 57P01 messages", run, took.Round(time.Millisecond), len(lines), msgs)
	}
	t.Logf("%d runs: %d clients ended without the 57P01 message, %d sessions cut mid-request", runs, withoutMsg, cut)
}

// TestShutdownWaitForClients: SHUTDOWN WAIT_FOR_CLIENTS (Drain) leaves idle
// clients alone but ends a client that becomes active with 57P01 after the
// answer to its request, so the wait ends while applications stay busy.
func TestShutdownWaitForClients(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.PoolMode = config.PoolTransaction })
	ctx := ctxTimeout(t, 30*time.Second)
	a := p.connect(t, "default_query_exec_mode=simple_protocol")
	b := p.connect(t, "default_query_exec_mode=exec")
	idle := dialFE(t, p.addr)
	idle.login(pgtest.RoleApp, pgtest.Password)
	eventually(t, 5*time.Second, "three clients", func() bool { return p.srv.ClientCount() == 3 })

	done := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- p.srv.Drain(dctx)
	}()
	eventually(t, 5*time.Second, "the drain to start", func() bool { ok, _ := p.srv.Ready(); return !ok })
	expectRefused(t, p.addr)

	// Active clients get their answer, then 57P01.
	for _, step := range []struct {
		c     *pgx.Conn
		after time.Duration
	}{{a, 600 * time.Millisecond}, {b, 2 * time.Second}} {
		time.Sleep(step.after)
		var v int
		if err := step.c.QueryRow(ctx, "SELECT 7").Scan(&v); err != nil || v != 7 {
			t.Fatalf("a query during WAIT_FOR_CLIENTS: %d, %v; want its answer", v, err)
		}
		pgxQueryFails(t, step.c)
	}
	// The idle client is left alone until it leaves.
	select {
	case err := <-done:
		t.Fatalf("Drain returned (%v) while an idle client is connected", err)
	case <-time.After(300 * time.Millisecond):
	}
	idle.nc.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Drain: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the last client left")
	}
}

// The signals of the real binary are tested in pgbouncer_test.go
// (TestSignalsLikePgBouncer).

// TestShutdownExitDeliversFinalMessage runs the poolerd binary and stops it
// with SIGINT, SIGTERM and SIGQUIT, with and without event loops, while a
// client has not read the end of its answers yet (a small receive buffer,
// not reading) and sends its next request once poolerd's sessions have
// ended. The client must then read every answer poolerd sent, and 57P01 as
// the last message. The exit used to close the client sockets while their
// lingering close still ran: the client's next request found its socket
// closed, the kernel reset the connection and threw away what the client
// had not taken yet (the end of the answer, the ReadyForQuery, the FATAL),
// and the client read a reset instead (issue #31, hole 7).
func TestShutdownExitDeliversFinalMessage(t *testing.T) {
	t.Parallel()
	bin := lcBuildBinary(t)
	for _, loops := range []string{"off", "2"} {
		for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT} {
			t.Run(fmt.Sprintf("event_loops=%s/%s", loops, signalNames[sig]), func(t *testing.T) {
				exitFinalMessage(t, bin, loops, sig)
			})
		}
	}
}

var signalNames = map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGQUIT: "SIGQUIT"}

// exitFinalMessage is one case of TestShutdownExitDeliversFinalMessage.
func exitFinalMessage(t *testing.T, bin, loops string, sig syscall.Signal) {
	conf := filepath.Join(t.TempDir(), "poolerd.yaml")
	if err := os.WriteFile(conf, []byte("event_loops: \""+loops+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := lcFreeAddr(t)
	proc := lcStartBinary(t, bin, "--config", conf, "--listen", listen, "--http-listen=",
		"--upstream", pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp), "--pool-mode", "transaction")
	// A receive buffer of a few KB: most of the first answer stays in
	// poolerd's send buffer until the client reads.
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	var nc net.Conn
	eventually(t, 10*time.Second, "poolerd to accept connections", func() bool {
		select {
		case <-proc.done:
			t.Fatalf("poolerd exited: %v\n%s", proc.err, proc.stderr.String())
		default:
		}
		var err error
		nc, err = d.Dial("tcp", listen)
		return err == nil
	})
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &feConn{t: t, nc: nc, fe: pgproto3.NewFrontend(nc, nc)}
	c.login(pgtest.RoleApp, pgtest.Password)

	// A 100 kB answer the client does not read, then a request in flight
	// when the signal comes: SIGINT and SIGTERM let it finish and end the
	// client after its answer, SIGQUIT ends the client at once.
	sleep := "1" // long enough to be seen running
	if sig == syscall.SIGQUIT {
		sleep = "30"
	}
	tag := fmt.Sprintf("exit_final_%d", time.Now().UnixNano())
	c.send(&pgproto3.Query{String: "SELECT repeat('x', 100000)"},
		&pgproto3.Query{String: fmt.Sprintf("SELECT pg_sleep(%s) /* %s */", sleep, tag)})
	eventually(t, 10*time.Second, "the second request to run", func() bool {
		return countBackends(t, "state = 'active' AND query LIKE '%/* "+tag+" */%' AND pid <> pg_backend_pid()") == 1
	})
	if err := proc.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	// The client is busy elsewhere until poolerd has ended its session
	// (logged) or exited, then sends its next request; if poolerd exits
	// meanwhile, the request follows the exit.
	eventually(t, 10*time.Second, "the session to end", func() bool {
		select {
		case <-proc.done:
			return true
		default:
		}
		return strings.Contains(proc.stderr.String(), "client disconnected")
	})
	select {
	case <-proc.done:
	case <-time.After(300 * time.Millisecond):
	}
	c.send(&pgproto3.Query{String: "SELECT 1"})

	var got []string
	var last pgproto3.BackendMessage
	var err error
	for {
		var m pgproto3.BackendMessage
		if m, err = c.fe.Receive(); err != nil {
			break
		}
		last = m
		got = append(got, fmt.Sprintf("%T", m)[len("*pgproto3."):])
	}
	rfq := 0
	for _, g := range got {
		if g == "ReadyForQuery" {
			rfq++
		}
	}
	want := 2 // both answers
	if sig == syscall.SIGQUIT {
		want = 1 // the first; the second request was cut
	}
	e, ok := last.(*pgproto3.ErrorResponse)
	if rfq != want || !ok || e.Code != "57P01" || e.Severity != "FATAL" || errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the client read %d answers (want %d), then %T %v, and the stream ended with %v; messages: %v",
			rfq, want, last, e, err, got)
	}
	_ = nc.Close()
	code, _ := proc.wait(t, 10*time.Second)
	if code != 0 {
		t.Errorf("exit code %d; output:\n%s", code, proc.stderr.String())
	}
}
