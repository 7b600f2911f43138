// Command bench measures poolerd side by side with PgBouncer and with
// PostgreSQL itself (issue 7, "Performance: measured side by side"):
//
//	go run ./test/bench [-T 10] [-rounds 3] [-quick] [-churn-T 90] [-only churn] [-out docs/benchmarks-latest.md]
//
// It starts a throwaway PostgreSQL (test/pgtest, max_connections 500),
// initialises pgbench (-i -s 10), builds and starts poolerd and, when
// pgbouncer is on PATH, PgBouncer with equivalent settings (transaction
// mode, pool size 20, SCRAM-SHA-256 client authentication), then:
//
//   - runs pgbench -S in simple, extended and prepared modes at 1, 16, 100
//     and 400 clients against every target, the targets interleaved run by
//     run and rounds repeated, recording TPS, latency (average, p50, p99
//     from pgbench's per-transaction logs), failed transactions and the CPU
//     time of each pooler process (/proc/PID/stat);
//   - runs a connection storm (pgbench -S -C -c 16) against every target;
//   - with -churn-T N, runs a connection churn against each pooler, N
//     seconds per pooler and round (churn.go: its own Go client makes full
//     SCRAM logins with a SELECT 1, abandoned logins and bursts of 500),
//     recording login latency p50/p99/max, failures and the pooler's CPU
//     per login;
//   - opens 10,000 idle authenticated clients to each pooler in turn
//     (fresh processes) and reports RSS growth per client.
//
// -only runs some of these alone (e.g. -only churn).
//
// It prints a Markdown report to stdout and to -out. Progress goes to
// stderr. Everything listens on 127.0.0.1, and every process and temporary
// directory it created is removed when it ends, also on errors and Ctrl-C.
// `make bench` runs it. It is not part of `make test`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/poolerd/poolerd/test/pgtest"
)

type options struct {
	seconds      int
	rounds       int
	jobs         int
	scale        int
	clients      []int
	modes        []string
	idleClients  int
	stormClients int
	stormSeconds int
	churn        churnOptions
	// noMatrix: -only without "matrix": no pgbench -S matrix runs (modes
	// and clients are then empty).
	noMatrix     bool
	out          string
	poolerdBin   string
	poolerdEnv   []string // POOLERD_* settings for the poolerd target (-poolerd-env)
	pgbouncerBin string
	noPgbouncer  bool
	// bareRelay is the directory of the bare Go relay (a yardstick in the
	// matrix); "" for ../shared/rig/bare-relay beside the repository,
	// "off" for none.
	bareRelay string
	noLog     bool
	quick     bool
	// tls: TLS on both sides (PostgreSQL accepts hostssl only, both
	// poolers require TLS from clients and use it to PostgreSQL, pgbench
	// connects with sslmode=require).
	tls   bool
	pause time.Duration
	// loginAllowance lengthens -T by this much per client per pgbench
	// thread: pgbench logs its clients in inside -T.
	loginAllowance time.Duration
}

// runSeconds is the -T of a matrix run with this many clients: the
// measured window plus time for pgbench's SCRAM logins, which it makes
// inside -T (its TPS excludes them). Without it, 400 clients onto a busy
// 2-CPU machine can spend all of a 10 s run logging in.
func (o options) runSeconds(clients int) int {
	j := min(o.jobs, clients)
	return o.seconds + int(o.loginAllowance*time.Duration(clients)/time.Duration(j)/time.Second)
}

func main() {
	os.Exit(mainExit())
}

func mainExit() int {
	var o options
	var clients, modes, only string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&o.seconds, "T", 10, "seconds measured per pgbench run (-T, plus -login-allowance)")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds of the whole matrix (targets interleaved in each)")
	fs.DurationVar(&o.loginAllowance, "login-allowance", 75*time.Millisecond, "added to -T per client per pgbench thread, for the logins pgbench makes inside -T")
	fs.IntVar(&o.jobs, "j", 2, "pgbench threads (-j), capped at the number of clients")
	fs.IntVar(&o.scale, "scale", 10, "pgbench scale factor for pgbench -i")
	fs.StringVar(&clients, "clients", "1,16,100,400", "comma-separated client counts (-c)")
	fs.StringVar(&modes, "modes", "simple,extended,prepared", "comma-separated pgbench query modes (-M)")
	fs.IntVar(&o.idleClients, "idle-clients", 10000, "idle authenticated clients opened to each pooler (0 skips the test)")
	fs.IntVar(&o.stormClients, "storm-clients", 16, "clients of the connection storm (pgbench -C); 0 skips it")
	fs.IntVar(&o.stormSeconds, "storm-T", 0, "seconds of each connection storm run (default: -T)")
	fs.IntVar(&o.churn.seconds, "churn-T", 0, "seconds of connection churn per pooler and round (0 skips the churn test)")
	fs.IntVar(&o.churn.workers, "churn-workers", 16, "churn: workers looping over login, SELECT 1, Terminate")
	fs.IntVar(&o.churn.abandon, "churn-abandon", 4, "churn: workers looping over logins abandoned at the server's SASL request")
	fs.IntVar(&o.churn.burst, "churn-burst", 500, "churn: clients that log in at once in each burst (0: no bursts)")
	fs.DurationVar(&o.churn.every, "churn-every", 10*time.Second, "churn: interval between bursts (the first comes after half of it)")
	fs.StringVar(&only, "only", "", "run only these tests, comma-separated from matrix, storm, churn, idle (e.g. -only churn -churn-T 90); PostgreSQL, pgbench -i and the warm-up run always")
	fs.StringVar(&o.out, "out", "", "also write the Markdown report to this file")
	fs.StringVar(&o.poolerdBin, "poolerd", "", "use this poolerd binary instead of building bin/poolerd")
	fs.Func("poolerd-env", "a POOLERD_KEY=value setting for poolerd, e.g. POOLERD_EVENT_LOOPS=1 (repeatable)", func(v string) error {
		if !strings.HasPrefix(v, "POOLERD_") || !strings.Contains(v, "=") {
			return fmt.Errorf("want POOLERD_KEY=value, got %q", v)
		}
		o.poolerdEnv = append(o.poolerdEnv, v)
		return nil
	})
	fs.StringVar(&o.pgbouncerBin, "pgbouncer", "", "pgbouncer binary (default: pgbouncer on PATH, skipped when absent)")
	fs.BoolVar(&o.noPgbouncer, "no-pgbouncer", false, "do not run PgBouncer even if installed")
	fs.StringVar(&o.bareRelay, "bare-relay", "", "directory of the bare Go relay, a yardstick in the pgbench matrix (default: ../shared/rig/bare-relay beside the repository when it is there; off: none; never with -tls)")
	fs.BoolVar(&o.noLog, "no-txlog", false, "no per-transaction pgbench logs (no p50/p99; slightly less pgbench CPU)")
	fs.BoolVar(&o.tls, "tls", false, "TLS on both sides: PostgreSQL accepts hostssl only; poolerd and PgBouncer with client_tls_sslmode and server_tls_sslmode require; pgbench with sslmode=require")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: -T 3 -rounds 1 -idle-clients 1000 (explicit flags win)")
	fs.DurationVar(&o.pause, "pause", time.Second, "pause between runs (lets connections of the previous run close)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./test/bench [flags]\n\nBenchmarks poolerd against PgBouncer and direct PostgreSQL (see docs/benchmarks.md).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		if !set["T"] {
			o.seconds = 3
		}
		if !set["rounds"] {
			o.rounds = 1
		}
		if !set["idle-clients"] {
			o.idleClients = 1000
		}
	}
	if o.stormSeconds <= 0 {
		o.stormSeconds = o.seconds
	}
	var err error
	if o.clients, err = parseInts(clients); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -clients:", err)
		return 2
	}
	for _, m := range strings.Split(modes, ",") {
		m = strings.TrimSpace(m)
		switch m {
		case "simple", "extended", "prepared":
			o.modes = append(o.modes, m)
		case "":
		default:
			fmt.Fprintf(os.Stderr, "bench: -modes: unknown mode %q\n", m)
			return 2
		}
	}
	if o.seconds < 1 || o.rounds < 1 || o.jobs < 1 || len(o.modes) == 0 || o.loginAllowance < 0 {
		fmt.Fprintln(os.Stderr, "bench: -T, -rounds and -j must be positive and -modes not empty")
		return 2
	}
	if o.churn.seconds < 0 || o.churn.workers < 0 || o.churn.abandon < 0 || o.churn.burst < 0 ||
		(o.churn.burst > 0 && o.churn.every <= 0) {
		fmt.Fprintln(os.Stderr, "bench: -churn-T, -churn-workers, -churn-abandon and -churn-burst must not be negative, -churn-every positive")
		return 2
	}
	if only != "" {
		want := map[string]bool{}
		for _, f := range strings.Split(only, ",") {
			switch f = strings.TrimSpace(f); f {
			case "matrix", "storm", "churn", "idle":
				want[f] = true
			case "":
			default:
				fmt.Fprintf(os.Stderr, "bench: -only: unknown test %q (want matrix, storm, churn, idle)\n", f)
				return 2
			}
		}
		if !want["matrix"] {
			o.noMatrix, o.modes, o.clients = true, nil, nil
		}
		if !want["storm"] {
			o.stormClients = 0
		}
		if !want["idle"] {
			o.idleClients = 0
		}
		if !want["churn"] {
			o.churn.seconds = 0
		} else if o.churn.seconds == 0 {
			fmt.Fprintln(os.Stderr, "bench: -only churn needs -churn-T N (seconds per pooler and round)")
			return 2
		}
	}

	var cl cleaner
	defer cl.run()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	finished := make(chan struct{})
	defer close(finished)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "\nbench: %v: stopping and cleaning up (again to force)\n", s)
			cancel()
			select {
			case <-sigs:
			case <-time.After(30 * time.Second):
			case <-finished:
				return
			}
			cl.run()
			os.Exit(130)
		case <-finished:
		}
	}()

	if err := run(ctx, o, &cl); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "bench: interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// estimate returns the expected wall time of the whole benchmark.
func estimate(o options, nTargets int, hasPgbouncer bool) time.Duration {
	// A run costs its duration, the pause, about half a second of start-up
	// and pgbench's SCRAM logins (~8 ms of CPU each here, -j at a time).
	perRun := func(sec, clients int) time.Duration {
		j := min(o.jobs, clients)
		return time.Duration(sec)*time.Second + o.pause + 500*time.Millisecond +
			time.Duration(clients/j)*8*time.Millisecond
	}
	var total time.Duration
	for _, m := range o.modes {
		n := nTargets
		if m == "prepared" && hasPgbouncer {
			n--
		}
		for _, c := range o.clients {
			total += time.Duration(o.rounds*n) * perRun(o.runSeconds(c), c)
		}
	}
	total += time.Duration(nTargets) * perRun(2, 16) // warm-up
	if o.stormClients > 0 {
		total += time.Duration(o.rounds*nTargets) * perRun(o.stormSeconds, o.stormClients)
	}
	if o.churn.seconds > 0 {
		// The cycles under way at the end, the settling and the pause.
		n := nTargets - 1
		total += time.Duration(o.rounds*n) * (time.Duration(o.churn.seconds)*time.Second + o.pause + 2*time.Second)
	}
	if o.idleClients > 0 {
		// Logins (8 at a time) take ~1 ms each to either pooler (PgBouncer
		// has the role's SCRAM secret: no key derived per login), plus
		// settling and restarts.
		total += time.Duration(o.idleClients)*time.Millisecond + 15*time.Second
		if hasPgbouncer {
			total += time.Duration(o.idleClients)*time.Millisecond + 15*time.Second
		}
	}
	total += 45 * time.Second // PostgreSQL, pgbench -i, build
	return total
}

// results is everything the report needs.
type results struct {
	opts      options
	info      machineInfo
	targets   []*target
	runs      []*pgbenchRun
	storms    []*pgbenchRun
	churns    []*churnRun
	idle      []idleResult
	commands  []string
	ticks     int64
	loadStart string // /proc/loadavg when the benchmark started
	started   time.Time
	elapsed   time.Duration
	estimated time.Duration
}

func run(ctx context.Context, o options, cl *cleaner) error {
	started := time.Now()
	res := &results{opts: o, started: started, ticks: clockTicks(), loadStart: loadAvg()}
	ticksPerSecond = res.ticks
	// How busy is the machine before we start anything?
	_, p0 := machineTicks()
	self0 := selfTicks()
	sleepCtx(ctx, time.Second)
	_, p1 := machineTicks()
	if busy := float64(p1-p0-(selfTicks()-self0)) / float64(res.ticks) / float64(runtime.NumCPU()); busy > 0.1 {
		logf("bench: warning: other processes are using %.0f%% of the %d CPUs: numbers will be noisy", 100*busy, runtime.NumCPU())
	}

	nofile, err := raiseNoFile()
	if err != nil {
		logf("bench: could not raise RLIMIT_NOFILE: %v", err)
	}
	if o.idleClients > 0 && nofile > 0 && uint64(o.idleClients)+200 > nofile {
		return fmt.Errorf("-idle-clients %d needs more open files than the limit %d", o.idleClients, nofile)
	}
	// A churn burst holds a socket per client, on top of the workers'.
	if need := uint64(o.churn.burst+o.churn.workers+o.churn.abandon) + 200; o.churn.seconds > 0 && nofile > 0 && need > nofile {
		return fmt.Errorf("-churn-burst %d needs more open files than the limit %d", o.churn.burst, nofile)
	}
	pgbenchBin, err := exec.LookPath("pgbench")
	if err != nil {
		return errors.New("pgbench not found on PATH (apt-get install postgresql-client)")
	}
	pgbouncerBin := ""
	if !o.noPgbouncer {
		if o.pgbouncerBin != "" {
			pgbouncerBin = o.pgbouncerBin
		} else if p, err := exec.LookPath("pgbouncer"); err == nil {
			pgbouncerBin = p
		} else {
			logf("bench: pgbouncer not on PATH: comparing poolerd with direct only")
		}
	}
	nTargets := 2
	if pgbouncerBin != "" {
		nTargets = 3
	}
	res.estimated = estimate(o, nTargets, pgbouncerBin != "")
	what := fmt.Sprintf("-T %d, clients %v, modes %v", o.seconds, o.clients, o.modes)
	if o.noMatrix {
		what = "no matrix"
	}
	if o.churn.seconds > 0 {
		what += fmt.Sprintf(", churn %d s", o.churn.seconds)
	}
	logf("bench: estimated total runtime ~%s (%d rounds, %s, %d targets)",
		res.estimated.Round(time.Minute), o.rounds, what, nTargets)

	root, err := repoRoot()
	if err != nil {
		return err
	}
	workDir, err := os.MkdirTemp("/tmp", "poolerd-bench-")
	if err != nil {
		return err
	}
	cl.add(func() { os.RemoveAll(workDir) })
	if err := os.Chmod(workDir, 0o755); err != nil {
		return err
	}

	poolerdBin := o.poolerdBin
	if poolerdBin == "" {
		logf("bench: building bin/poolerd")
		if poolerdBin, err = buildPoolerd(ctx, root); err != nil {
			return err
		}
	} else if poolerdBin, err = filepath.Abs(poolerdBin); err != nil {
		return err
	}

	logf("bench: starting PostgreSQL")
	pg, err := pgtest.Start(pgtest.Options{SSL: o.tls, ExtraConf: []string{
		"max_connections = 500",
		"shared_buffers = 256MB",
	}})
	if err != nil {
		return err
	}
	cl.add(func() {
		if err := pg.Cleanup(); err != nil {
			logf("bench: PostgreSQL cleanup: %v", err)
		}
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}

	sslmode, pgDesc := "disable", ""
	var tlsFiles *pgtest.TLSFiles
	if o.tls {
		sslmode, pgDesc = "require", ", ssl = on with TCP connections over TLS only (hostssl rules)"
		// The certificate both poolers present to pgbench.
		files, err := pgtest.MakeTLSFiles(workDir)
		if err != nil {
			return fmt.Errorf("TLS files: %w", err)
		}
		tlsFiles = &files
	}
	initArgs := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(pg.Port), "-U", benchUser, "-i", "-s", strconv.Itoa(o.scale), "-q", benchDB}
	logf("bench: pgbench %s", strings.Join(initArgs, " "))
	ic := exec.CommandContext(ctx, pgbenchBin, initArgs...)
	ic.Env = pgbenchEnv(benchPass, sslmode)
	ic.Dir = workDir
	ic.SysProcAttr = sysProcAttr(nil)
	if out, err := ic.CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	res.commands = append(res.commands,
		"# PostgreSQL: test/pgtest (initdb, fsync off, max_connections 500, shared_buffers 256MB"+pgDesc+"), role app/secret (SCRAM), database app",
		"PGPASSWORD=secret PGSSLMODE="+sslmode+" pgbench "+strings.Join(initArgs, " "))

	pmPid := postmasterPid(pg.DataDir)
	direct := &target{name: targetDirect, port: pg.Port, cmdline: "PostgreSQL " + pg.Addr() + pgDesc, tls: o.tls}
	res.targets = append(res.targets, direct)

	maxClients := o.idleClients + 1000
	if maxClients < 2000 {
		maxClients = 2000
	}
	pd, err := poolerdTarget(poolerdBin, workDir, pg, maxClients, tlsFiles, o.poolerdEnv...)
	if err != nil {
		return err
	}
	cl.add(pd.stop)
	res.targets = append(res.targets, pd)
	var pb *target
	if pgbouncerBin != "" {
		secret, err := scramSecret(ctx, pg, benchUser)
		if err != nil {
			return err
		}
		if pb, err = pgbouncerTarget(pgbouncerBin, workDir, pg, maxClients, tlsFiles, secret); err != nil {
			return err
		}
		cl.add(pb.stop)
		res.targets = append(res.targets, pb)
	}
	if dir := bareRelayDir(o, root); dir != "" && !o.noMatrix {
		br, err := bareRelayTarget(ctx, dir, workDir, pg)
		if err != nil {
			return err
		}
		cl.add(br.stop)
		res.targets = append(res.targets, br)
	}
	for _, t := range res.targets[1:] {
		logf("bench: starting %s on %s", t.name, t.addr())
		if err := t.start(ctx); err != nil {
			return err
		}
		logf("bench: %s pid %d, open files limit %s", t.name, t.pid(), openFilesLimit(t.pid()))
	}
	res.info = gatherInfo(root, pg, poolerdBin, pgbouncerBin, pgbenchBin)
	for _, t := range res.targets {
		res.commands = append(res.commands, strings.ReplaceAll("# "+t.name+": "+strings.ReplaceAll(t.cmdline, "\n", "\n# "), "# \n", "#\n"))
	}
	logOpt := ""
	if !o.noLog {
		logOpt = " --log --log-prefix=$TMPDIR/tx"
	}
	if !o.noMatrix {
		res.commands = append(res.commands,
			"# each matrix run (PORT: the target's; MODE simple|extended|prepared; CLIENTS "+joinInts(o.clients)+
				fmt.Sprintf("; JOBS min(%d, CLIENTS);", o.jobs),
			fmt.Sprintf("# T = %d + CLIENTS/JOBS × %v for pgbench's logins, which count in -T but not in its TPS: %s s):",
				o.seconds, o.loginAllowance, runSecondsList(o)),
			fmt.Sprintf("PGPASSWORD=secret PGSSLMODE="+sslmode+" pgbench -h 127.0.0.1 -p $PORT -U %s -n -S -M $MODE -c $CLIENTS -j $JOBS -T $T -P 1%s %s",
				benchUser, logOpt, benchDB))
	}
	if o.stormClients > 0 {
		st := pgbenchCmd{bin: "pgbench", port: 0, mode: "simple", clients: o.stormClients, jobs: o.jobs, seconds: o.stormSeconds, connect: true, user: benchUser, db: benchDB}
		res.commands = append(res.commands, "# connection storm, each target:",
			"PGPASSWORD=secret PGSSLMODE="+sslmode+" pgbench "+strings.Replace(strings.Join(st.args(), " "), "-p 0", "-p $PORT", 1))
	}
	if co := o.churn; co.seconds > 0 {
		tlsArg := ""
		if o.tls {
			tlsArg = " -tls"
		}
		res.commands = append(res.commands,
			fmt.Sprintf("# connection churn, each pooler, each round: the harness's own client (test/bench/churn.go), %d s:", co.seconds),
			fmt.Sprintf("#   %d workers loop: SCRAM login, SELECT 1, Terminate; %d workers loop: StartupMessage, hang up at the SASL request;", co.workers, co.abandon),
			fmt.Sprintf("#   every %v from %v: %d clients at once log in, SELECT 1, Terminate; login and query timeout %v. Alone:", co.every, co.every/2, co.burst, churnTimeout),
			fmt.Sprintf("go run ./test/bench -only churn -rounds %d -churn-T %d -churn-workers %d -churn-abandon %d -churn-burst %d -churn-every %v%s",
				o.rounds, co.seconds, co.workers, co.abandon, co.burst, co.every, tlsArg))
	}

	// Warm-up: open every pooler's server connections and warm caches.
	for _, t := range res.targets {
		c := pgbenchCmd{bin: pgbenchBin, port: t.port, mode: "simple", clients: 16, jobs: o.jobs, seconds: 2, user: benchUser, db: benchDB, sslmode: sslmode}
		if _, err := runPgbench(ctx, c, benchPass, 0, pmPid); err != nil {
			return err
		}
	}

	// The matrix.
	type cell struct {
		mode    string
		clients int
	}
	var cells []cell
	for _, m := range o.modes {
		for _, c := range o.clients {
			cells = append(cells, cell{m, c})
		}
	}
	total := 0
	for _, c := range cells {
		for _, t := range res.targets {
			if !(c.mode == "prepared" && t.name == targetPgbouncer) {
				total++
			}
		}
	}
	total *= o.rounds
	if o.stormClients > 0 {
		total += o.rounds * len(others(res.targets))
	}
	if o.churn.seconds > 0 {
		total += o.rounds * (len(others(res.targets)) - 1)
	}
	done := 0
	matrixStart := time.Now()
	step := func() time.Duration {
		done++
		return time.Duration(float64(time.Since(matrixStart)) / float64(done) * float64(total-done))
	}
	progress := func(r *pgbenchRun, t *target) {
		eta := step()
		what := fmt.Sprintf("%-8s c=%-3d", r.Mode, r.Clients)
		if r.Storm {
			what = fmt.Sprintf("storm -C c=%-3d", r.Clients)
		}
		status := fmt.Sprintf("%9.0f tps  lat %.3f ms", r.WinTPS, r.WinLatMs)
		if len(r.Hist) > 0 {
			status += fmt.Sprintf("  p50 %.0f µs  p99 %.0f µs", r.Hist.quantile(0.5), r.Hist.quantile(0.99))
		}
		if t.pid() > 0 && r.WinTxns > 0 {
			status += fmt.Sprintf("  cpu %.3f s/10k  ctx %.2f/txn", float64(r.PoolerCPUTicks)/float64(res.ticks)/r.WinTxns*1e4,
				float64(r.PoolerCtxSwitches)/r.WinTxns)
		}
		if r.Failed > 0 {
			status += fmt.Sprintf("  failed %d", r.Failed)
		}
		if w := r.Wall.Seconds() * float64(runtime.NumCPU()*int(res.ticks)); w > 0 {
			status += fmt.Sprintf("  other %.0f%%", 100*float64(r.OtherTicks)/w)
		}
		if !r.ok() {
			status += "  ERROR: " + truncate(r.Err, 160)
		}
		logf("bench: [%d/%d, eta %s] round %d %s %-9s %s", done, total, eta.Round(time.Second), r.Round, what, t.name, status)
	}
	for round := 1; round <= o.rounds; round++ {
		for _, c := range cells {
			// Rotate the target order each round so that no target always
			// runs right after another.
			for i := range res.targets {
				t := res.targets[(i+round-1)%len(res.targets)]
				if c.mode == "prepared" && t.name == targetPgbouncer {
					continue // PgBouncer 1.18 cannot do -M prepared in transaction mode
				}
				if err := t.ensureRunning(ctx, logf); err != nil {
					return err
				}
				pc := pgbenchCmd{bin: pgbenchBin, port: t.port, mode: c.mode, clients: c.clients, jobs: o.jobs,
					seconds: o.runSeconds(c.clients), progress: true, measureFrom: o.runSeconds(c.clients) - o.seconds,
					user: benchUser, db: benchDB, sslmode: sslmode}
				if !o.noLog {
					pc.logDir = filepath.Join(workDir, "txlog")
				}
				r, err := runPgbench(ctx, pc, benchPass, t.pid(), pmPid)
				if err != nil {
					return err
				}
				r.Target, r.Round = t.name, round
				res.runs = append(res.runs, r)
				progress(r, t)
				sleepCtx(ctx, o.pause)
			}
		}
		if o.stormClients > 0 {
			storm := others(res.targets)
			for i := range storm {
				t := storm[(i+round-1)%len(storm)]
				if err := t.ensureRunning(ctx, logf); err != nil {
					return err
				}
				pc := pgbenchCmd{bin: pgbenchBin, port: t.port, mode: "simple", clients: o.stormClients, jobs: o.jobs,
					seconds: o.stormSeconds, connect: true, user: benchUser, db: benchDB, sslmode: sslmode}
				r, err := runPgbench(ctx, pc, benchPass, t.pid(), pmPid)
				if err != nil {
					return err
				}
				r.Target, r.Round = t.name, round
				res.storms = append(res.storms, r)
				progress(r, t)
				sleepCtx(ctx, o.pause)
			}
		}
		if o.churn.seconds > 0 {
			// The poolers only: direct PostgreSQL would fork a backend per
			// login and a burst would pass its max_connections.
			pool := others(res.targets)[1:]
			for i := range pool {
				t := pool[(i+round-1)%len(pool)]
				if err := t.ensureRunning(ctx, logf); err != nil {
					return err
				}
				cr, err := runChurn(ctx, t, o.churn, pmPid)
				if err != nil {
					return err
				}
				cr.Round = round
				res.churns = append(res.churns, cr)
				eta := step()
				logf("bench: [%d/%d, eta %s] round %d churn %ds %-9s %s", done, total, eta.Round(time.Second), round, o.churn.seconds, t.name,
					churnProgress(cr, res.ticks))
				sleepCtx(ctx, o.pause)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	// Idle clients: one fresh pooler at a time (the harness holds one end
	// of every client connection; its open-file limit covers one pooler's
	// worth, and a fresh process keeps earlier load out of its RSS).
	if o.idleClients > 0 {
		for _, t := range res.targets[1:] {
			t.stop()
		}
		for _, t := range others(res.targets)[1:] {
			ir, err := idleTest(ctx, t, o.idleClients)
			if err != nil {
				return err
			}
			res.idle = append(res.idle, ir)
		}
	}

	res.elapsed = time.Since(started)
	report := renderReport(res)
	fmt.Print(report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			return err
		}
		logf("bench: report written to %s", o.out)
	}
	logf("bench: total runtime %s", res.elapsed.Round(time.Second))
	return nil
}

// loadAvg returns the first three fields of /proc/loadavg.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func runSecondsList(o options) string {
	var s []string
	for _, c := range o.clients {
		s = append(s, strconv.Itoa(o.runSeconds(c)))
	}
	return strings.Join(s, ", ")
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// idleResult is the idle-clients measurement of one pooler.
type idleResult struct {
	Target     string
	Wanted     int
	Opened     int
	Errors     int
	FirstErr   string
	RSSBeforeK int64
	RSSAfterK  int64
	OpenTime   time.Duration
	FDLimit    string
	Note       string
}

func (r idleResult) perClientBytes() float64 {
	if r.Opened == 0 {
		return math.NaN()
	}
	return float64(r.RSSAfterK-r.RSSBeforeK) * 1024 / float64(r.Opened)
}

// idleTest starts a fresh pooler, logs one client in (so the pool exists),
// reads its VmRSS, opens n idle authenticated clients, waits for the
// process to settle, reads VmRSS again, then closes the clients and stops
// the pooler.
func idleTest(ctx context.Context, t *target, n int) (idleResult, error) {
	r := idleResult{Target: t.name, Wanted: n}
	logf("bench: idle clients: starting a fresh %s", t.name)
	if err := t.start(ctx); err != nil {
		return r, err
	}
	defer t.stop()
	pid := t.pid()
	r.FDLimit = openFilesLimit(pid)
	warm, err := login(t.addr(), benchUser, benchPass, benchDB, 10*time.Second, t.tls)
	if err != nil {
		return r, fmt.Errorf("idle test: first login to %s: %w", t.name, err)
	}
	defer warm.Close()
	sleepCtx(ctx, 3*time.Second)
	if r.RSSBeforeK, err = procStatusKB(pid, "VmRSS"); err != nil {
		return r, err
	}

	conns := make([]interface{ Close() error }, n)
	var next, opened, failed atomic.Int64
	var firstErr sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				c, err := login(t.addr(), benchUser, benchPass, benchDB, 30*time.Second, t.tls)
				if err != nil {
					failed.Add(1)
					firstErr.Do(func() { r.FirstErr = err.Error() })
					continue
				}
				conns[i] = c
				if k := opened.Add(1); k%2000 == 0 {
					logf("bench: idle clients: %s: %d open", t.name, k)
				}
			}
		}()
	}
	wg.Wait()
	r.OpenTime = time.Since(start)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.Opened, r.Errors = int(opened.Load()), int(failed.Load())
	// Let the pooler finish whatever follows a login and its runtime settle.
	sleepCtx(ctx, 5*time.Second)
	if !t.proc.alive() {
		r.Note = "process exited during the test: " + t.proc.logTail(3)
		return r, nil
	}
	if r.RSSAfterK, err = procStatusKB(pid, "VmRSS"); err != nil {
		return r, err
	}
	logf("bench: idle clients: %s: %d open (%d failed) in %s, VmRSS %d kB -> %d kB: %.0f bytes per client",
		t.name, r.Opened, r.Errors, r.OpenTime.Round(time.Millisecond), r.RSSBeforeK, r.RSSAfterK, r.perClientBytes())
	return r, nil
}

// machineInfo describes where the numbers come from.
type machineInfo struct {
	Date, Host, CPUs, CPUModel, Kernel, OS, Memory string
	PG, Pgbench, Pgbouncer, Poolerd, Commit, Go    string
}

func gatherInfo(root string, pg *pgtest.Server, poolerdBin, pgbouncerBin, pgbenchBin string) machineInfo {
	cmd := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(out))
	}
	i := machineInfo{
		Date:    time.Now().UTC().Format("2006-01-02 15:04 MST"),
		CPUs:    cmd("nproc"),
		Kernel:  cmd("uname", "-sr"),
		Pgbench: cmd(pgbenchBin, "--version"),
		Poolerd: cmd(poolerdBin, "--version"),
		Go:      runtime.Version(),
	}
	i.Host, _ = os.Hostname()
	if data, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				i.OS = strings.Trim(v, `"`)
			}
		}
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				i.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				i.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/1024/1024)
			}
		}
	}
	i.PG = cmd(filepath.Join(pg.BinDir, "postgres"), "--version")
	if pgbouncerBin != "" {
		v := cmd(pgbouncerBin, "--version")
		i.Pgbouncer, _, _ = strings.Cut(v, "\n")
	}
	commit := cmd("git", "-C", root, "rev-parse", "--short", "HEAD")
	if st := cmd("git", "-C", root, "status", "--porcelain", "--untracked-files=no"); st != "" && st != "?" {
		commit += " (with uncommitted changes)"
	}
	i.Commit = commit
	return i
}

// others is targets without the matrix-only ones (the bare relay).
func others(targets []*target) []*target {
	var out []*target
	for _, t := range targets {
		if !t.matrixOnly {
			out = append(out, t)
		}
	}
	return out
}

// bareRelayDir is where the bare relay's source is, or "" for none: -tls
// runs have none (the relay would pass TLS through to PostgreSQL, so it
// would measure PostgreSQL's TLS, not a pooler's).
func bareRelayDir(o options, root string) string {
	switch {
	case o.bareRelay == "off" || o.tls:
		return ""
	case o.bareRelay != "":
		return o.bareRelay
	}
	dir := filepath.Join(filepath.Dir(root), "shared", "rig", "bare-relay")
	if _, err := os.Stat(filepath.Join(dir, "main.go")); err != nil {
		return ""
	}
	return dir
}
