package soak

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/test/faultproxy"
	"github.com/poolerd/poolerd/test/pgtest"
	"github.com/poolerd/poolerd/test/redistest"
)

const password = pgtest.Password

// scale sizes a soak run.
type scale struct {
	name                  string
	dur                   time.Duration // how long the load runs
	accounts              int
	clientsPerMode        int // transfer clients per pgx query exec mode
	longClients           int // transfer clients that sleep inside transactions
	pgbenchClients        int
	psycopgClients        int
	psqlClients           int
	idleClients           int
	churnPerSec           int
	copyBytes             int64
	copyEvery             time.Duration
	gap                   time.Duration // mean time between two faults
	opTimeout             time.Duration // a client's limit on one operation
	serverResponseTimeout time.Duration
	sampleEvery           time.Duration
}

// scaleFromEnv is the full soak when SOAK_MINUTES is set (make soak), the
// short one of make test otherwise.
func scaleFromEnv(t *testing.T) scale {
	sc := scale{
		name: "short (make test)", dur: 100 * time.Second, accounts: 20,
		clientsPerMode: 2, longClients: 1, pgbenchClients: 2, psycopgClients: 1, psqlClients: 1,
		idleClients: 300, churnPerSec: 10, copyBytes: 8 << 20, copyEvery: 5 * time.Second,
		gap: 5 * time.Second, opTimeout: 60 * time.Second, serverResponseTimeout: 3 * time.Second,
		sampleEvery: 5 * time.Second,
	}
	if v := os.Getenv("SOAK_MINUTES"); v != "" {
		m, err := strconv.ParseFloat(v, 64)
		if err != nil || m <= 0 {
			t.Fatalf("SOAK_MINUTES=%q: want a positive number of minutes", v)
		}
		sc.name = fmt.Sprintf("full (SOAK_MINUTES=%s)", v)
		sc.dur = time.Duration(m * float64(time.Minute))
		sc.clientsPerMode, sc.longClients, sc.pgbenchClients = 3, 2, 4
		sc.psycopgClients, sc.psqlClients = 2, 2
		sc.idleClients, sc.churnPerSec = 10000, 50
		sc.copyBytes, sc.copyEvery = 100<<20, 20*time.Second
		sc.gap, sc.sampleEvery = 20*time.Second, 10*time.Second
	}
	return sc
}

// soak is one run: the servers, poolerd, the load's ledgers and the
// measurements.
type soak struct {
	t    *testing.T
	sc   scale
	seed int64

	pg         *pgtest.Server
	pgProxy    *faultproxy.Proxy // poolerd → PostgreSQL
	redis      *redistest.Server
	redisProxy *faultproxy.Proxy // poolerd → Redis

	bin, cfgPath     string
	listen, httpAddr string
	proc             *exec.Cmd
	out              *lockedBuffer
	exited           chan struct{}
	cfgGen           int // reloads so far (chaos goroutine)

	start, loadEnd time.Time

	nextID                                  atomic.Int64
	errs                                    *errorLog
	lat                                     *latencies
	transfers, pyLog, psqlLog, copies, gone *ledger
	pgbenchRuns, pgbenchAborts              atomic.Int64
	copyIn, copyOut                         atomic.Int64
	notifySent, notifyGot                   atomic.Int64
	idleLogins                              atomic.Int64
	idleRamped                              atomic.Bool

	probeMu        sync.Mutex
	probeSuccesses []time.Time

	evMu   sync.Mutex
	events []event

	smMu    sync.Mutex
	samples []sample
}

func (s *soak) logf(format string, args ...any) {
	s.t.Logf("%6.1fs "+format, append([]any{time.Since(s.start).Seconds()}, args...)...)
}

func (s *soak) host() string { h, _, _ := net.SplitHostPort(s.listen); return h }
func (s *soak) port() string { _, p, _ := net.SplitHostPort(s.listen); return p }

// TestSoak is the soak: see the package comment. SOAK_MINUTES selects the
// full run; SOAK_SEED the fault schedule (default 1); SOAK_REPORT a file to
// write the Markdown report to (its plot goes beside it, .svg).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak takes minutes; -short skips it")
	}
	for _, tool := range []string{"pgbench", "psql"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: the soak needs it (apt-get install postgresql)", tool)
		}
	}
	if err := exec.Command(python(), "-c", "import psycopg").Run(); err != nil {
		t.Fatalf("%s cannot import psycopg: apt-get install python3-psycopg", python())
	}
	if _, err := redistest.Find(); err != nil {
		t.Fatal(err)
	}
	s := &soak{t: t, sc: scaleFromEnv(t), seed: 1, start: time.Now(),
		errs: newErrorLog(), transfers: newLedger(), pyLog: newLedger(), psqlLog: newLedger(),
		copies: newLedger(), gone: newLedger()}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want an integer", v)
		}
		s.seed = n
	}
	s.logf("soak %s: load %s, seed %d", s.sc.name, s.sc.dur, s.seed)
	s.setup()
	s.warmUp()
	base := s.sampleNow("baseline")
	s.logf("baseline: %d goroutines, %d open files (%s), RSS %.1f MiB", base.goroutines, base.fds, base.sockets, base.rssMiB())

	// The load.
	s.lat = newLatencies(time.Now())
	s.loadEnd = time.Now().Add(s.sc.dur)
	run, stop := context.WithDeadline(context.Background(), s.loadEnd)
	defer stop()
	var wg sync.WaitGroup
	goLoad := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	seedRng := func(i int) *rand.Rand { return rand.New(rand.NewPCG(uint64(s.seed), uint64(i))) }
	n := 0
	for _, mode := range []string{"simple_protocol", "exec", "cache_statement"} {
		for range s.sc.clientsPerMode {
			n++
			name, rng := "pgx "+mode, seedRng(n)
			goLoad(func() { s.transferClient(run, name, mode, false, rng) })
		}
	}
	for range s.sc.longClients {
		n++
		rng := seedRng(n)
		goLoad(func() { s.transferClient(run, "pgx long", "exec", true, rng) })
	}
	goLoad(func() { s.pgbenchLoop(run) })
	for i := range s.sc.psycopgClients {
		goLoad(func() { s.psycopgLoop(run, i) })
	}
	for i := range s.sc.psqlClients {
		goLoad(func() { s.psqlLoop(run, i) })
	}
	goLoad(func() { s.copyLoop(run) })
	goLoad(func() { s.listenLoop(run) })
	goLoad(func() { s.notifyLoop(run) })
	goLoad(func() { s.idleClients(run) })
	goLoad(func() { s.probe(run) })
	goLoad(func() { s.chaos(run) })
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		s.sampleLoop(run)
	}()
	wg.Wait()
	<-sampleDone
	s.logf("load over")

	// Back to the baseline once the load has gone.
	end := s.settle(base)
	s.checkAll(base, end)
	s.stopPoolerd()
	// verify_handoff always: no server connection may have passed to
	// another client holding session state poolerd did not expect.
	for _, line := range strings.Split(s.out.String(), "\n") {
		if strings.Contains(line, "hand-off check: server connection holds session state") {
			t.Errorf("dirty server connection at a hand-off: %s", line)
		}
	}
	s.report(base, end)
	if t.Failed() {
		if f, err := os.CreateTemp("", "poolerd-soak-*.log"); err == nil {
			_, _ = f.WriteString(s.out.String())
			_ = f.Close()
			t.Logf("poolerd's log: %s", f.Name())
		}
	}
}

// setup starts PostgreSQL, Redis, the fault proxies and poolerd, and
// creates the soak's databases.
func (s *soak) setup() {
	t := s.t
	// Commits must survive an immediate shutdown (a crash of
	// PostgreSQL's processes): pgtest turns synchronous_commit off.
	pg, err := pgtest.Start(pgtest.Options{ExtraConf: []string{"synchronous_commit = on"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Cleanup() })
	s.pg = pg
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, db := range []string{"soak", "bench"} {
		if err := pg.Exec(ctx, "postgres", "CREATE DATABASE "+db+" OWNER app"); err != nil {
			t.Fatal(err)
		}
	}
	c, err := pgx.Connect(ctx, pg.DSN(pgtest.RoleApp, password, "soak"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO accounts SELECT g, %d FROM generate_series(1, %d) g;
		CREATE TABLE transfers (id bigint PRIMARY KEY, src int NOT NULL, dst int NOT NULL, amount int NOT NULL);
		CREATE TABLE py_log (id bigint PRIMARY KEY);
		CREATE TABLE psql_log (id bigint PRIMARY KEY);
		CREATE TABLE gone (id bigint PRIMARY KEY);
		CREATE TABLE copy_in (batch bigint NOT NULL, payload text NOT NULL);
		CREATE INDEX ON copy_in (batch);`, initialBalance, s.sc.accounts))
	_ = c.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	init := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", "1", "-h", pg.Host, "-p", strconv.Itoa(pg.Port), "-U", "app", "bench")
	init.Env = append(os.Environ(), "PGPASSWORD="+password)
	if out, err := init.CombinedOutput(); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}

	if s.pgProxy, err = faultproxy.Start(pg.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.pgProxy.Close() })
	if s.redis, err = redistest.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.redis.Stop() })
	if s.redisProxy, err = faultproxy.Start(s.redis.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.redisProxy.Close() })

	s.bin = buildPoolerd(t)
	s.listen, s.httpAddr = freeAddr(t), freeAddr(t)
	s.cfgPath = filepath.Join(t.TempDir(), "poolerd.yaml")
	if err := os.WriteFile(s.cfgPath, []byte(s.config()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.startPoolerd()
}

const initialBalance = 100000

// config is poolerd's configuration; each reload (cfgGen) changes the pool
// size and the query timeout.
func (s *soak) config() string {
	return fmt.Sprintf(`listen: %s
http_listen: %s
auth_type: md5
pool_mode: transaction
verify_handoff: always
max_client_conn: 20000
max_size: %d
min_size: 2
checkout_timeout: 20s
server_response_timeout: %s
query_timeout: %ds
idle_transaction_timeout: 30s
idle_timeout: 10s
shutdown_timeout: 10s
log_connections: false
log_disconnections: true
log_stats: false
rate_limit_backend: redis
redis_url: redis://%s/0
on_redis_error: allow
rate_limits:
  - name: soak-queries
    key_by: [database]
    queries: {limit: 1000000, per: 1s}
    mode: reject
databases:
  - name: soak
    host: %s
    port: %d
  - name: soak_session
    host: %s
    port: %d
    dbname: soak
    pool_mode: session
    max_size: 4
  - name: bench
    host: %s
    port: %d
users:
  - name: app
    password: %s
`, s.listen, s.httpAddr, 12+2*(s.cfgGen%2), s.sc.serverResponseTimeout, 60+s.cfgGen%2, s.redisProxy.Addr(),
		s.pgProxy.Host(), s.pgProxy.Port(), s.pgProxy.Host(), s.pgProxy.Port(), s.pgProxy.Host(), s.pgProxy.Port(), password)
}

// warmUp uses every pool once (and so the Redis rate limiter) and waits
// until each pool holds its min_size server connections, so that the
// baseline is what an idle, warm poolerd holds.
func (s *soak) warmUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, db := range []string{"soak", "soak_session", "bench"} {
		c, err := s.connectPgx(ctx, db)
		if err != nil {
			s.t.Fatalf("warm-up: %v", err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			s.t.Fatalf("warm-up on %s: %v", db, err)
		}
		_ = c.Close(context.Background())
	}
	deadline := time.Now().Add(15 * time.Second)
	for s.socketsNow().servers < 6 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
}

// reload writes a changed configuration and sends SIGHUP; it returns once
// poolerd has logged the reload.
func (s *soak) reload() error {
	s.cfgGen++
	if err := os.WriteFile(s.cfgPath, []byte(s.config()), 0o600); err != nil {
		return err
	}
	before := strings.Count(s.out.String(), "configuration reloaded")
	if err := s.proc.Process.Signal(syscall.SIGHUP); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(s.out.String(), "configuration reloaded") == before {
		if time.Now().After(deadline) {
			return fmt.Errorf("no \"configuration reloaded\" within 10s of SIGHUP; output tail:\n%s", tail(s.out.String(), 10))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func (s *soak) startPoolerd() {
	t := s.t
	cmd := exec.Command(s.bin, "--config", s.cfgPath)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "POOLERD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	s.out = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.proc = cmd
	s.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = cmd.Process.Kill()
			<-s.exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + s.httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("poolerd exited at start:\n%s", s.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("poolerd not ready within 30s:\n%s", s.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // min_size connections
}

// stopPoolerd sends SIGINT (the safe shutdown; SIGTERM would wait for the
// clients to leave): poolerd must exit 0 within shutdown_timeout.
func (s *soak) stopPoolerd() {
	if err := s.proc.Process.Signal(syscall.SIGINT); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.t.Fatalf("poolerd did not exit within 20s of SIGINT:\n%s", tail(s.out.String(), 30))
	}
	if code := s.proc.ProcessState.ExitCode(); code != 0 {
		s.t.Errorf("poolerd exited %d after SIGINT:\n%s", code, tail(s.out.String(), 30))
	}
}

// checkAll checks the data, the errors, the faults and the resources.
func (s *soak) checkAll(base, end sample) {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.pg.SuperDSN("soak"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ids := func(sql string) map[int64]bool {
		m := map[int64]bool{}
		rows, err := c.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			m[id] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, l := range []struct {
		name string
		l    *ledger
		sql  string
	}{
		{"pgx transfers", s.transfers, "SELECT id FROM transfers"},
		{"psycopg transactions", s.pyLog, "SELECT id FROM py_log"},
		{"psql transactions", s.psqlLog, "SELECT id FROM psql_log"},
	} {
		counts, missing, committed := l.l.check(ids(l.sql))
		s.logf("%s: %d acked, %d failed, %d unknown", l.name, counts[acked], counts[failed], counts[unknown])
		if len(missing) > 0 {
			t.Errorf("%s: %d acknowledged transactions missing (lost), e.g. %v", l.name, len(missing), missing[:min(5, len(missing))])
		}
		if len(committed) > 0 {
			t.Errorf("%s: %d transactions committed after their client saw an error before COMMIT, e.g. %v", l.name, len(committed), committed[:min(5, len(committed))])
		}
		if counts[acked] == 0 {
			t.Errorf("%s: none acknowledged: the load did not run", l.name)
		}
	}
	// Balances: every account is what its transfer rows say (nothing
	// applied twice or in part).
	var bad int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM accounts a WHERE a.balance <> $1
		- coalesce((SELECT sum(amount) FROM transfers WHERE src = a.id), 0)
		+ coalesce((SELECT sum(amount) FROM transfers WHERE dst = a.id), 0)`, initialBalance).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad > 0 {
		t.Errorf("%d accounts' balances differ from their transfer rows", bad)
	}
	// COPY: each batch is all there or not at all; acked ones are there.
	batches := map[int64]int64{}
	rows, err := c.Query(ctx, "SELECT batch, count(*) FROM copy_in GROUP BY batch")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var b, n int64
		if err := rows.Scan(&b, &n); err != nil {
			t.Fatal(err)
		}
		batches[b] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := s.sc.copyBytes / copyRowBytes
	s.copies.mu.Lock()
	for b, o := range s.copies.outcomes {
		switch n := batches[b]; {
		case n != 0 && n != want:
			t.Errorf("COPY batch %d: %d rows, want %d or none", b, n, want)
		case o == acked && n == 0:
			t.Errorf("COPY batch %d acknowledged but not in the table", b)
		}
	}
	s.copies.mu.Unlock()
	// Clients that went away mid-transaction or mid-COPY left nothing.
	goneRows := ids("SELECT id FROM gone")
	s.gone.mu.Lock()
	for id := range s.gone.outcomes {
		if (id > 0 && goneRows[id]) || (id < 0 && batches[id] > 0) {
			t.Errorf("the work of client %d, which went away before committing, was committed", id)
		}
	}
	s.gone.mu.Unlock()
	// pgbench's TPC-B tables balance.
	bc, err := pgx.Connect(ctx, s.pg.SuperDSN("bench"))
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close(context.Background())
	var a, b, tl, h int64
	if err := bc.QueryRow(ctx, `SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),
		(SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)`).Scan(&a, &b, &tl, &h); err != nil {
		t.Fatal(err)
	}
	var hn int64
	_ = bc.QueryRow(ctx, "SELECT count(*) FROM pgbench_history").Scan(&hn)
	s.logf("pgbench: %d runs, %d clients aborted by faults, %d transactions committed; sums %d/%d/%d/%d", s.pgbenchRuns.Load(), s.pgbenchAborts.Load(), hn, a, b, tl, h)
	if a != h || b != h || tl != h {
		t.Errorf("pgbench tables do not balance: accounts %d, branches %d, tellers %d, history %d", a, b, tl, h)
	}
	if hn == 0 {
		t.Error("pgbench committed nothing")
	}

	// Errors.
	s.errs.mu.Lock()
	s.logf("client errors by SQLSTATE: %v; without an ErrorResponse: %d (and %d closes reported by client libraries that were sent the FATAL, %d streams ended mid-message); hung: %d; dirty connections: %d; connects unanswered with no listen queue overflow (the machine's, not poolerd's): %d",
		s.errs.bySQL, s.errs.dropped, s.errs.closeReported, s.errs.midMessage, s.errs.hung, s.errs.dirty, s.errs.dialLost)
	if s.errs.dropped > 0 || s.errs.hung > 0 || s.errs.dirty > 0 {
		t.Errorf("%d errors without an ErrorResponse, %d hung clients, %d dirty server connections:\n%s",
			s.errs.dropped, s.errs.hung, s.errs.dirty, strings.Join(s.errs.samples, "\n"))
	}
	s.errs.mu.Unlock()

	// Every fault ran, and poolerd recovered from each.
	s.evMu.Lock()
	seen := map[string]int{}
	for i := range s.events {
		ev := &s.events[i]
		seen[ev.fault]++
		if ev.err != nil {
			t.Errorf("fault %s at %s failed: %v", ev.fault, ev.start.Sub(s.start).Round(time.Second), ev.err)
		}
		if at, ok := s.recoveredAt(ev.end); ok {
			ev.recovery = at.Sub(ev.end)
		} else {
			ev.recovery = -1
			t.Errorf("no successful probe after fault %s at %s", ev.fault, ev.start.Sub(s.start).Round(time.Second))
		}
	}
	s.evMu.Unlock()
	for _, f := range faults {
		if seen[f.name] == 0 {
			t.Errorf("fault %s never ran: the run is too short for the schedule (%d faults ran)", f.name, len(s.events))
		}
	}
	if s.notifyGot.Load() == 0 {
		t.Errorf("the LISTEN client received none of %d notifications", s.notifySent.Load())
	}
	if !s.idleRamped.Load() {
		t.Errorf("the idle clients never all logged in (%d logins)", s.idleLogins.Load())
	}

	// Memory flat over a long run (the pool manager document's "no growth
	// over a day"): the slope of the load's last three quarters.
	if sl, ok := s.memorySlope(); ok && sl.window >= slopeMinWindow {
		if sl.rssPerHour > rssSlopeBound || sl.heapPerHour > heapSlopeBound {
			t.Errorf("memory grew during the load: RSS %+.1f MiB/h, Go heap %+.1f MiB/h over the last %s (bounds %d and %d MiB/h)",
				sl.rssPerHour, sl.heapPerHour, sl.window.Round(time.Minute), rssSlopeBound, heapSlopeBound)
		}
	}

	// Resources back to the baseline.
	if !backToBase(base, end) {
		t.Errorf("not back to the baseline after the load: goroutines %d → %d, RSS %.1f → %.1f MiB, open files %d → %d:\nbaseline: %s\nafter:    %s\nother files at the baseline: %s\nother files after:           %s",
			base.goroutines, end.goroutines, base.rssMiB(), end.rssMiB(), base.fds, end.fds, base.sockets, end.sockets,
			base.sockets.fileKinds, end.sockets.fileKinds)
	}
}

// backToBase reports whether poolerd's resources after the load are back to
// the baseline taken after the warm-up: no client socket, no more server
// sockets (idle_timeout closes those above min_size) or other files, a few
// goroutines at most, and memory within rssSlack (the Go runtime returns
// memory to the system slowly). Redis sockets are not counted: the Redis
// client keeps up to 10 per CPU open for reuse. One more epoll instance is
// the parker's (internal/proxy/park_linux.go), made when a session first
// parks off its event loop, which the warm-up may not have made happen:
// everything of the warm-up stays on the loops.
func backToBase(base, m sample) bool {
	return m.sockets.clients == 0 && m.sockets.servers <= base.sockets.servers &&
		m.sockets.files-m.sockets.epolls <= base.sockets.files-base.sockets.epolls &&
		m.sockets.epolls <= base.sockets.epolls+1 && m.sockets.otherSockets <= base.sockets.otherSockets &&
		m.goroutines <= base.goroutines+goroutineSlack && m.rss <= base.rss+rssSlack
}

const (
	goroutineSlack = 4
	rssSlack       = 64 << 20
)

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// buildPoolerd builds cmd/poolerd into a temporary directory.
func buildPoolerd(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v %s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "poolerd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/poolerd")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/poolerd: %v\n%s", err, out)
	}
	return bin
}

// python is Debian's python3, which python3-psycopg is installed for, when
// there is one (a python3 earlier on PATH, from pyenv say, may lack it).
func python() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

func freeAddr(t *testing.T) string {
	p, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}
