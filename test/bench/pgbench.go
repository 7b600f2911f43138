package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// pgbenchSummary is what pgbench prints at the end of a run.
type pgbenchSummary struct {
	Mode       string  // "query mode"
	Clients    int     // "number of clients"
	Txns       int64   // "number of transactions actually processed"
	Failed     int64   // "number of failed transactions"
	LatencyMs  float64 // "latency average"
	ConnTimeMs float64 // "initial connection time" or, with -C, "average connection time"
	TPS        float64 // "tps = ..."
	// TPSIncludesConnect is true when pgbench's tps includes connection
	// times (-C: "including reconnection times").
	TPSIncludesConnect bool
	Aborted            bool     // "Run was aborted"
	Errors             []string // distinct client errors from stderr
	Found              bool     // a tps line was found
}

// parsePgbench reads pgbench's stdout and stderr. It never fails: whatever
// is missing stays zero, and Found says whether a result was printed.
func parsePgbench(stdout, stderr string) pgbenchSummary {
	var s pgbenchSummary
	for _, line := range strings.Split(stdout+"\n"+stderr, "\n") {
		line = strings.TrimSpace(line)
		key, val, ok := strings.Cut(line, ":")
		if !ok || strings.Contains(key, "=") {
			key, val, ok = strings.Cut(line, "=")
		}
		if !ok {
			if strings.Contains(line, "Run was aborted") {
				s.Aborted = true
			}
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "query mode":
			s.Mode = val
		case "number of clients":
			s.Clients, _ = strconv.Atoi(val)
		case "number of transactions actually processed":
			s.Txns, _ = strconv.ParseInt(firstField(val, "/"), 10, 64)
		case "number of failed transactions":
			s.Failed, _ = strconv.ParseInt(firstField(val, " "), 10, 64)
		case "latency average":
			s.LatencyMs = parseMs(val)
		case "initial connection time", "average connection time":
			s.ConnTimeMs = parseMs(val)
		case "tps":
			s.TPS, _ = strconv.ParseFloat(firstField(val, " "), 64)
			s.TPSIncludesConnect = strings.Contains(val, "including")
			s.Found = true
		}
		if strings.Contains(line, "Run was aborted") {
			s.Aborted = true
		}
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(stderr, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "pgbench (") || strings.HasPrefix(line, "starting vacuum") ||
			strings.HasPrefix(line, "progress: ") {
			continue
		}
		if !strings.Contains(line, "ERROR") && !strings.Contains(line, "FATAL") &&
			!strings.Contains(line, "aborted") && !strings.Contains(line, "error") &&
			!strings.Contains(line, "could not") && !strings.Contains(line, "failed") {
			continue
		}
		// "client 12 aborted in command 1 ..." -> one entry for all clients.
		norm := line
		if rest, ok := strings.CutPrefix(line, "pgbench: error: client "); ok {
			if _, after, ok := strings.Cut(rest, " "); ok {
				norm = "pgbench: error: client N " + after
			}
		} else if rest, ok := strings.CutPrefix(line, "client "); ok {
			if _, after, ok := strings.Cut(rest, " "); ok {
				norm = "client N " + after
			}
		}
		if !seen[norm] && len(s.Errors) < 8 {
			seen[norm] = true
			s.Errors = append(s.Errors, norm)
		}
	}
	return s
}

func firstField(s, sep string) string {
	f, _, _ := strings.Cut(strings.TrimSpace(s), sep)
	return strings.TrimSpace(f)
}

// parseMs parses "1.234 ms".
func parseMs(v string) float64 {
	f, _ := strconv.ParseFloat(firstField(v, " "), 64)
	return f
}

// latHist counts latencies in µs: exact below 1 ms, three significant
// digits above (0.1 % resolution), so that runs can be merged cheaply.
type latHist map[int64]int64

func latBucket(us int64) int64 {
	if us < 1000 {
		return us
	}
	p := int64(1)
	for us/p >= 1000 {
		p *= 10
	}
	return us / p * p
}

func (h latHist) add(us int64) { h[latBucket(us)]++ }

func (h latHist) merge(o latHist) {
	for k, v := range o {
		h[k] += v
	}
}

func (h latHist) count() int64 {
	var n int64
	for _, v := range h {
		n += v
	}
	return n
}

// quantile returns the q-quantile (0..1) in µs, or NaN for an empty
// histogram.
func (h latHist) quantile(q float64) float64 {
	n := h.count()
	if n == 0 {
		return math.NaN()
	}
	keys := make([]int64, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	rank := int64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var cum int64
	for _, k := range keys {
		cum += h[k]
		if cum >= rank {
			return float64(k)
		}
	}
	return float64(keys[len(keys)-1])
}

// parseTxLog adds the latencies of a pgbench per-transaction log (--log)
// to h. A line is "client_id transaction_no time script_no time_epoch
// time_us [schedule_lag] [retries]"; time is the latency in µs, or
// "failed"/"skipped"; time_epoch and time_us say when the transaction
// ended. Transactions that ended before fromUs (µs since the epoch) are
// left out. It returns the number of failed lines.
func parseTxLog(r io.Reader, h latHist, fromUs int64) (failed int64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var fields [6][]byte
	for sc.Scan() {
		line := sc.Bytes()
		n := 0
		start := -1
		for i := 0; i <= len(line) && n < len(fields); i++ {
			if i == len(line) || line[i] == ' ' {
				if start >= 0 {
					fields[n] = line[start:i]
					n++
					start = -1
				}
				continue
			}
			if start < 0 {
				start = i
			}
		}
		if n < 3 {
			continue
		}
		if fromUs > 0 && n == 6 {
			sec, err1 := strconv.ParseInt(string(fields[4]), 10, 64)
			usec, err2 := strconv.ParseInt(string(fields[5]), 10, 64)
			if err1 == nil && err2 == nil && sec*1e6+usec < fromUs {
				continue
			}
		}
		field := fields[2]
		us, perr := strconv.ParseInt(string(field), 10, 64)
		if perr != nil {
			if bytes.Equal(field, []byte("failed")) {
				failed++
			}
			continue
		}
		h.add(us)
	}
	return failed, sc.Err()
}

// pgbenchRun is one pgbench invocation and what came out of it.
type pgbenchRun struct {
	Target  string
	Mode    string
	Clients int
	Round   int
	Storm   bool // -C run

	pgbenchSummary
	Hist      latHist
	LogFailed int64
	// The measurement window: with progress reports (-P 1), the reports
	// from measureFrom seconds into the run (after the logins) to the
	// end; else the whole run. WinTPS and WinLatMs are the throughput and
	// mean latency in the window; PoolerCPUTicks (the pooler process's
	// utime+stime, 0 for direct), PoolerCtxSwitches (the context switches
	// of the pooler's threads, 0 for direct) and MachineTicks (busy ticks
	// of all CPUs) are sampled at its ends; WinTxns transactions ended in
	// it.
	WinTPS            float64
	WinLatMs          float64
	WinTxns           float64
	WinSeconds        float64
	WholeRun          bool
	PoolerCPUTicks    int64
	PoolerCtxSwitches int64
	MachineTicks      int64
	// PgbenchCPU is pgbench's own user+system time.
	PgbenchCPU time.Duration
	// OtherTicks is the CPU that processes outside the benchmark used
	// during the whole run: the ticks /proc/stat charges to processes
	// (all busy time but steal) minus those of the pooler, PostgreSQL,
	// pgbench and the harness.
	OtherTicks int64
	Wall       time.Duration
	ExitCode   int
	Err        string // why this run does not count, "" if it does
}

func (r *pgbenchRun) ok() bool { return r.Err == "" }

// pgbenchCmd describes the command line of one run.
type pgbenchCmd struct {
	bin      string
	port     int
	mode     string
	clients  int
	jobs     int
	seconds  int
	connect  bool // -C
	progress bool // -P 1, to measure after the logins
	// measureFrom: seconds into the run where the measurement window
	// starts (the logins are over by then); needs progress.
	measureFrom int
	logDir      string // --log into this dir; "" = no per-transaction log
	user, db    string
	sslmode     string // PGSSLMODE; "" = disable
}

func (c pgbenchCmd) args() []string {
	jobs := c.jobs
	if jobs > c.clients {
		jobs = c.clients
	}
	a := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", c.user,
		"-n", "-S", "-M", c.mode}
	if c.connect {
		a = append(a, "-C")
	}
	a = append(a, "-c", strconv.Itoa(c.clients), "-j", strconv.Itoa(jobs), "-T", strconv.Itoa(c.seconds))
	if c.progress {
		a = append(a, "-P", "1")
	}
	if c.logDir != "" {
		a = append(a, "--log", "--log-prefix="+filepath.Join(c.logDir, "tx"))
	}
	return append(a, c.db)
}

// pgbenchEnv is the environment pgbench runs with: no inherited PG*
// variables, the fixture password, and PGSSLMODE sslmode (disable: no TLS
// negotiation; require with -tls).
func pgbenchEnv(password, sslmode string) []string {
	if sslmode == "" {
		sslmode = "disable"
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return append(env, "PGPASSWORD="+password, "PGSSLMODE="+sslmode, "PGAPPNAME=pgbench")
}

// runPgbench runs pgbench and parses its output and per-transaction logs.
// Failures are recorded in the result, never returned: only a cancelled ctx
// is an error.
func runPgbench(ctx context.Context, c pgbenchCmd, password string, poolerPid, pmPid int) (*pgbenchRun, error) {
	r := &pgbenchRun{Mode: c.mode, Clients: c.clients, Storm: c.connect, Hist: latHist{}}
	if c.logDir != "" {
		if err := os.MkdirAll(c.logDir, 0o755); err != nil {
			return nil, err
		}
		defer os.RemoveAll(c.logDir)
	}
	// pgbench ends by itself after -T; allow for the logins of many
	// clients, and kill it if a target hangs.
	limit := time.Duration(c.seconds)*time.Second + 30*time.Second + time.Duration(c.clients)*50*time.Millisecond
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(rctx, c.bin, c.args()...)
	cmd.Env = pgbenchEnv(password, c.sslmode)
	cmd.Dir = os.TempDir()
	var stdout bytes.Buffer
	stderr := &progressWriter{}
	if poolerPid > 0 {
		stderr.sample = func() counters {
			// A pooler that died reads as zeros here; the reads after
			// the run notice it and fail the run.
			t, _ := cpuTicks(poolerPid)
			sw, _ := ctxSwitches(poolerPid)
			return counters{pooler: t, ctxSw: sw, mach: machineBusyTicks()}
		}
	} else {
		stderr.sample = func() counters { return counters{mach: machineBusyTicks()} }
	}
	cmd.Stdout = &stdout
	cmd.Stderr = stderr
	cmd.SysProcAttr = sysProcAttr(nil)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second

	var cpu0, sw0 int64
	if poolerPid > 0 {
		cpu0, _ = cpuTicks(poolerPid)
		sw0, _ = ctxSwitches(poolerPid)
	}
	pg0, self0 := clusterTicks(pmPid), selfTicks()
	m0, p0 := machineTicks()
	start := time.Now()
	fromUs := int64(0)
	if c.progress && c.measureFrom > 0 {
		fromUs = start.Add(time.Duration(c.measureFrom) * time.Second).UnixMicro()
	}
	runErr := cmd.Run()
	r.Wall = time.Since(start)
	if ps := cmd.ProcessState; ps != nil {
		r.PgbenchCPU = ps.UserTime() + ps.SystemTime()
	}
	// Let PostgreSQL's backends exit and be reaped: an exiting backend's
	// CPU time is in neither its own /proc entry nor its parent's yet.
	sleepCtx(ctx, 500*time.Millisecond)
	m1, p1 := machineTicks()
	r.MachineTicks = m1 - m0
	if poolerPid > 0 {
		cpu1, err := cpuTicks(poolerPid)
		if err != nil {
			r.Err = "pooler process gone: " + err.Error()
		}
		r.PoolerCPUTicks = cpu1 - cpu0
		sw1, err := ctxSwitches(poolerPid)
		if err != nil && r.Err == "" {
			r.Err = "pooler context switches: " + err.Error()
		}
		r.PoolerCtxSwitches = sw1 - sw0
	}
	r.OtherTicks = (p1 - p0) - r.PoolerCPUTicks - (clusterTicks(pmPid) - pg0) - (selfTicks() - self0) -
		int64(r.PgbenchCPU.Seconds()*float64(ticksPerSecond))
	r.WholeRun = true
	if w, ok := stderr.window(float64(c.measureFrom)); ok {
		r.WholeRun = false
		r.PoolerCPUTicks, r.PoolerCtxSwitches, r.MachineTicks = w.pooler, w.ctxSw, w.mach
		r.WinTxns, r.WinSeconds, r.WinTPS, r.WinLatMs = w.txns, w.seconds, w.txns/w.seconds, w.latMs
	} else {
		fromUs = 0
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.pgbenchSummary = parsePgbench(stdout.String(), stderr.String())
	if r.WholeRun {
		r.WinTPS, r.WinLatMs, r.WinTxns = r.TPS, r.LatencyMs, float64(r.Txns)
	}
	var ee *exec.ExitError
	switch {
	case errors.As(runErr, &ee):
		r.ExitCode = ee.ExitCode()
	case runErr != nil:
		r.ExitCode = -1
		r.Errors = append(r.Errors, runErr.Error())
	}
	if rctx.Err() != nil {
		r.Errors = append(r.Errors, fmt.Sprintf("pgbench still running %v after it started (-T %d): killed", limit.Round(time.Second), c.seconds))
	}
	if c.logDir != "" {
		files, _ := filepath.Glob(filepath.Join(c.logDir, "tx.*"))
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				continue
			}
			n, _ := parseTxLog(fh, r.Hist, fromUs)
			r.LogFailed += n
			fh.Close()
		}
	}
	switch {
	case r.Err != "":
	case r.ExitCode != 0 || r.Aborted || !r.Found || r.Txns == 0:
		msg := fmt.Sprintf("pgbench exit %d", r.ExitCode)
		if r.Aborted {
			msg += ", run aborted"
		}
		if len(r.Errors) > 0 {
			msg += ": " + strings.Join(r.Errors, " | ")
		} else if tail := strings.TrimSpace(stderr.String() + "\n" + stdout.String()); tail != "" {
			msg += ": " + lastLines(tail, 4)
		}
		if !r.Found && r.ExitCode == 0 {
			msg += " (no result in pgbench's output)"
		}
		r.Err = msg
	}
	return r, nil
}

// progressWriter collects pgbench's stderr and samples the pooler's and
// the machine's counters when a progress report ("progress: 3.0 s, 5321.9
// tps, lat ...") arrives.
type progressWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	sample  func() counters
	samples []progressSample
}

// counters are the cumulative counters sampled at each progress report,
// or, in a window, their growth over it.
type counters struct {
	pooler int64 // utime+stime of the pooler process, in ticks
	ctxSw  int64 // context switches of the pooler's threads
	mach   int64 // busy ticks of all CPUs
}

type progressSample struct {
	at, tps, latMs float64
	counters
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		if at, tps, lat, ok := parseProgress(line); ok {
			w.samples = append(w.samples, progressSample{at: at, tps: tps, latMs: lat, counters: w.sample()})
		}
	}
	return len(p), nil
}

func (w *progressWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

type window struct {
	counters
	txns, seconds float64
	latMs         float64
}

// window sums the progress reports after the first one at or after from
// seconds: that report opens the window and the counters sampled with it
// are the window's start. It needs at least two reports after the
// opening one; if there are too few after from, the window opens at the
// first report.
func (w *progressWriter) window(from float64) (window, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.samples
	k := 0
	for k < len(s) && s[k].at < from-0.01 {
		k++
	}
	if len(s)-k < 3 {
		k = 0
	}
	if len(s)-k < 3 {
		return window{}, false
	}
	var win window
	var latSum float64
	for i := k + 1; i < len(s); i++ {
		n := s[i].tps * (s[i].at - s[i-1].at)
		win.txns += n
		latSum += s[i].latMs * n
	}
	win.seconds = s[len(s)-1].at - s[k].at
	if win.txns <= 0 || win.seconds <= 0 {
		return window{}, false
	}
	win.latMs = latSum / win.txns
	last := s[len(s)-1]
	win.counters = counters{
		pooler: last.pooler - s[k].pooler,
		ctxSw:  last.ctxSw - s[k].ctxSw,
		mach:   last.mach - s[k].mach,
	}
	return win, true
}

// parseProgress parses pgbench's "progress: 3.0 s, 5321.9 tps, lat 2.994
// ms stddev 3.211, 0 failed".
func parseProgress(line string) (at, tps, latMs float64, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(line), "progress: ")
	if !found {
		return 0, 0, 0, false
	}
	f := strings.Split(rest, ", ")
	if len(f) < 3 || !strings.HasSuffix(f[0], " s") || !strings.HasSuffix(f[1], " tps") || !strings.HasPrefix(f[2], "lat ") {
		return 0, 0, 0, false
	}
	at, err1 := strconv.ParseFloat(strings.TrimSuffix(f[0], " s"), 64)
	tps, err2 := strconv.ParseFloat(strings.TrimSuffix(f[1], " tps"), 64)
	lat, err3 := strconv.ParseFloat(firstField(strings.TrimPrefix(f[2], "lat "), " "), 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, 0, false
	}
	return at, tps, lat, true
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
