package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Connection churn (item 6 of the "Relay engine" issue): for -churn-T
// seconds per pooler and round,
//
//   - -churn-workers steady workers loop: a full SCRAM-SHA-256 login
//     (login), a simple Query "SELECT 1" read to ReadyForQuery, Terminate,
//     close;
//   - -churn-abandon workers loop: connect, send the StartupMessage, wait
//     for the server's AuthenticationSASL request and hang up without
//     answering it;
//   - every -churn-every (the first after half of it) -churn-burst clients
//     start at once, each a login, SELECT 1 and Terminate like a steady
//     worker's.
//
// The login latency of a cycle is from the dial to the first
// ReadyForQuery; steady and burst logins go into one latency set. A login
// or query that errors or takes longer than churnTimeout counts as failed,
// not in the latencies. When the time is up no new cycle starts, the
// cycles under way finish (each bounded by churnTimeout) and the run waits
// for every goroutine it started: no goroutine or socket outlives it.
//
// The harness's own CPU matters: it runs on the same CPUs as the pooler
// (2 on the reference machine). Its SCRAM client caches the salted
// password per salt (client.go): poolerd's salt does not change, nor does
// PgBouncer's, whose auth_file holds the role's SCRAM secret
// (pgbouncerTarget), so a login costs the harness a few HMACs and system
// calls against either. (With a plain-text auth_file PgBouncer picks a new
// salt per login, and the harness would derive a key, about 1 ms of CPU,
// per login against PgBouncer only.) The report shows the harness's CPU per
// login beside the pooler's so that this can be judged.
// With -tls every login also costs the harness a TLS handshake.

// churnTimeout limits each login (dial to ReadyForQuery) and each query.
const churnTimeout = 10 * time.Second

// churnOptions are the -churn-* flags.
type churnOptions struct {
	seconds int           // -churn-T: seconds per pooler and round; 0 skips the test
	workers int           // -churn-workers: steady workers
	abandon int           // -churn-abandon: workers that abandon their logins
	burst   int           // -churn-burst: clients per burst; 0: no bursts
	every   time.Duration // -churn-every: interval between bursts
}

// burstOffsets returns when the bursts of a churn run of seconds start,
// from its beginning: at every/2, then every `every`, while inside the
// run (a 10 s run with -churn-every 10s has one burst, at 5 s; 90 s has
// nine).
func burstOffsets(seconds int, every time.Duration) []time.Duration {
	if every <= 0 {
		return nil
	}
	var out []time.Duration
	end := time.Duration(seconds) * time.Second
	for at := every / 2; at < end; at += every {
		out = append(out, at)
	}
	return out
}

// churnRun is one churn measurement of one pooler.
type churnRun struct {
	Target string
	Round  int
	// Wall: from the start to the end of the last cycle (the cycles under
	// way when the time is up finish, so it can exceed -churn-T).
	Wall           time.Duration
	Completed      int64   // login + SELECT 1 cycles that succeeded
	BurstCompleted int64   // of Completed, those of burst clients
	Bursts         int     // bursts started
	Hist           latHist // login latencies, µs, steady and burst
	BurstHist      latHist // of Hist, those of burst clients
	MaxUs          int64   // the largest login latency, exact
	Failed         int64   // cycles that failed: login or query error or timeout
	Timeouts       int64   // of Failed, those that ran out of time
	Abandoned      int64   // abandoned logins made (SASL request received)
	AbandonFailed  int64   // abandoned logins that did not get their SASL request
	// Errors counts the failures by message (ports masked), both kinds.
	Errors map[string]int64
	// CPU over the run and 500 ms after it: the pooler's utime+stime, the
	// harness's own, the busy ticks of all CPUs, and those of processes
	// outside the benchmark (as pgbenchRun.OtherTicks).
	PoolerCPUTicks int64
	SelfTicks      int64
	MachineTicks   int64
	OtherTicks     int64
	// ListenOverflows: TcpExt ListenOverflows over the run, machine-wide
	// (connections dropped because a listen queue was full).
	ListenOverflows int64
	Err             string // why the run does not count, "" if it does
}

func (r *churnRun) ok() bool { return r.Err == "" }

func (r *churnRun) loginsPerSec() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Wall.Seconds()
}

// churnRecorder collects the outcomes of the goroutines of one run.
type churnRecorder struct {
	mu sync.Mutex
	r  *churnRun
}

var portRE = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+):\d+`)

// errKey is an error's message without port numbers, so that the same
// failure on different connections counts once.
func errKey(err error) string {
	return portRE.ReplaceAllString(err.Error(), "$1:N")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func (c *churnRecorder) done(lat time.Duration, burst bool) {
	us := lat.Microseconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.r.Completed++
	if burst {
		c.r.BurstCompleted++
	}
	c.r.Hist.add(us)
	if burst {
		c.r.BurstHist.add(us)
	}
	c.r.MaxUs = max(c.r.MaxUs, us)
}

func (c *churnRecorder) abandoned(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.r.Abandoned++
		return
	}
	c.r.AbandonFailed++
	c.addErr("abandoned login: " + errKey(err))
}

func (c *churnRecorder) failed(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.r.Failed++
	if isTimeout(err) {
		c.r.Timeouts++
	}
	c.addErr(errKey(err))
}

// addErr counts an error message; beyond 20 distinct ones the rest are
// "other".
func (c *churnRecorder) addErr(k string) {
	if _, ok := c.r.Errors[k]; !ok && len(c.r.Errors) >= 20 {
		k = "other errors"
	}
	c.r.Errors[k]++
}

// churnCycle logs in to t, runs SELECT 1 and terminates; it returns the
// login latency, dial to ReadyForQuery.
func churnCycle(t *target) (time.Duration, error) {
	start := time.Now()
	conn, err := login(t.addr(), benchUser, benchPass, benchDB, churnTimeout, t.tls)
	if err != nil {
		return 0, fmt.Errorf("login: %w", err)
	}
	lat := time.Since(start)
	if err := simpleQuery(conn, "SELECT 1", churnTimeout); err != nil {
		conn.Close()
		return lat, fmt.Errorf("SELECT 1: %w", err)
	}
	terminate(conn)
	return lat, nil
}

// runChurn runs one churn measurement against the pooler t. Failures are
// recorded in the result; only a cancelled ctx is an error.
func runChurn(ctx context.Context, t *target, co churnOptions, pmPid int) (*churnRun, error) {
	r := &churnRun{Target: t.name, Hist: latHist{}, BurstHist: latHist{}, Errors: map[string]int64{}}
	rec := &churnRecorder{r: r}
	pid := t.pid()
	cpu0, err := cpuTicks(pid)
	if err != nil {
		r.Err = "pooler process gone: " + err.Error()
		return r, nil
	}
	pg0, self0 := clusterTicks(pmPid), selfTicks()
	m0, p0 := machineTicks()
	ov0 := tcpExtCounter("ListenOverflows")

	start := time.Now()
	rctx, cancel := context.WithDeadline(ctx, start.Add(time.Duration(co.seconds)*time.Second))
	defer cancel()
	// pause keeps a worker whose logins fail at once (a pooler that
	// refuses connections) from spinning.
	pause := func() {
		select {
		case <-rctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	var wg sync.WaitGroup
	for range co.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				lat, err := churnCycle(t)
				if err != nil {
					rec.failed(err)
					pause()
					continue
				}
				rec.done(lat, false)
			}
		}()
	}
	for range co.abandon {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				err := abandonLogin(t.addr(), benchUser, benchDB, churnTimeout, t.tls)
				rec.abandoned(err)
				if err != nil {
					pause()
				}
			}
		}()
	}
	if co.burst > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, at := range burstOffsets(co.seconds, co.every) {
				select {
				case <-rctx.Done():
					return
				case <-time.After(time.Until(start.Add(at))):
				}
				r.Bursts++ // read only after wg.Wait
				// Every client of the burst dials once all are started.
				gate := make(chan struct{})
				for range co.burst {
					wg.Add(1) // the counter is > 0: this goroutine holds one
					go func() {
						defer wg.Done()
						<-gate
						lat, err := churnCycle(t)
						if err != nil {
							rec.failed(err)
							return
						}
						rec.done(lat, true)
					}()
				}
				close(gate)
			}
		}()
	}
	wg.Wait()
	r.Wall = time.Since(start)
	// Let the pooler and PostgreSQL finish with the last connections.
	sleepCtx(ctx, 500*time.Millisecond)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	m1, p1 := machineTicks()
	r.MachineTicks = m1 - m0
	r.SelfTicks = selfTicks() - self0
	r.ListenOverflows = tcpExtCounter("ListenOverflows") - ov0
	cpu1, err := cpuTicks(pid)
	if err != nil {
		r.Err = "pooler process gone: " + err.Error()
	}
	r.PoolerCPUTicks = cpu1 - cpu0
	r.OtherTicks = (p1 - p0) - r.PoolerCPUTicks - (clusterTicks(pmPid) - pg0) - r.SelfTicks
	if r.Err == "" && r.Completed == 0 {
		r.Err = "no login completed"
	}
	return r, nil
}

// tcpExtCounter returns a TcpExt counter of /proc/net/netstat (-1 if
// unknown).
func tcpExtCounter(name string) int64 {
	data, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return -1
	}
	return parseTCPExt(string(data), name)
}

// parseTCPExt finds a TcpExt counter in the text of /proc/net/netstat: a
// line of names and a line of values, both starting "TcpExt:".
func parseTCPExt(text, name string) int64 {
	var names []string
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "TcpExt:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == name && i < len(f) {
				v, err := strconv.ParseInt(f[i], 10, 64)
				if err != nil {
					return -1
				}
				return v
			}
		}
		return -1
	}
	return -1
}

// churnAgg merges the ok churn runs of one target.
type churnAgg struct {
	runs      []*churnRun
	ok        int
	completed int64
	hist      latHist
	burst     latHist
	maxUs     int64
	failed    int64 // failed cycles (login or SELECT 1)
	timeouts  int64
	abandoned int64
	abFailed  int64 // abandoned logins without their SASL request
	wall      time.Duration
	pooler    int64
	self      int64
	machine   int64
	overflows int64
}

func aggregateChurn(runs []*churnRun) *churnAgg {
	a := &churnAgg{runs: runs, hist: latHist{}, burst: latHist{}}
	for _, r := range runs {
		a.failed += r.Failed
		a.abFailed += r.AbandonFailed
		if !r.ok() {
			continue
		}
		a.ok++
		a.completed += r.Completed
		a.hist.merge(r.Hist)
		a.burst.merge(r.BurstHist)
		a.maxUs = max(a.maxUs, r.MaxUs)
		a.timeouts += r.Timeouts
		a.abandoned += r.Abandoned
		a.wall += r.Wall
		a.pooler += r.PoolerCPUTicks
		a.self += r.SelfTicks
		a.machine += r.MachineTicks
		a.overflows += max(r.ListenOverflows, 0)
	}
	return a
}

// qms is the q-quantile of the merged login latencies in ms, NaN
// without an ok run.
func (a *churnAgg) qms(q float64) float64 {
	if a == nil || a.ok == 0 {
		return math.NaN()
	}
	return a.hist.quantile(q) / 1000
}

// churnErrors renders a run's error counts, most frequent first.
func churnErrors(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d× `%s`", m[k], truncate(k, 200)))
	}
	return strings.Join(parts, "; ")
}

// churnProgress is the progress line of a churn run.
func churnProgress(r *churnRun, ticks int64) string {
	s := fmt.Sprintf("%6d logins (%.0f/s)  p50 %.1f ms  p99 %.1f ms  max %.1f ms  failed %d (%d timeouts)  abandoned %d  bursts %d",
		r.Completed, r.loginsPerSec(), r.Hist.quantile(0.5)/1000, r.Hist.quantile(0.99)/1000, float64(r.MaxUs)/1000,
		r.Failed+r.AbandonFailed, r.Timeouts, r.Abandoned, r.Bursts)
	if r.BurstHist.count() > 0 {
		s += fmt.Sprintf("  burst p99 %.1f ms", r.BurstHist.quantile(0.99)/1000)
	}
	if r.Completed > 0 {
		s += fmt.Sprintf("  cpu %.3f ms/login (harness %.3f)", ticksMs(r.PoolerCPUTicks, ticks)/float64(r.Completed),
			ticksMs(r.SelfTicks, ticks)/float64(r.Completed))
	}
	if r.ListenOverflows > 0 {
		s += fmt.Sprintf("  listen overflows %d", r.ListenOverflows)
	}
	if !r.ok() {
		s += "  ERROR: " + r.Err
	}
	return s
}

func ticksMs(t, ticks int64) float64 { return float64(t) / float64(ticks) * 1000 }

// churnTable renders the churn section of the report.
func (r *report) churnTable() {
	if len(r.churns) == 0 {
		return
	}
	co := r.opts.churn
	byTarget := map[string][]*churnRun{}
	for _, c := range r.churns {
		byTarget[c.Target] = append(byTarget[c.Target], c)
	}
	aggs := map[string]*churnAgg{}
	for n, runs := range byTarget {
		aggs[n] = aggregateChurn(runs)
	}
	r.p("## Connection churn: %d s per pooler and round, full SCRAM logins, abandoned logins, bursts of %d", co.seconds, co.burst)
	r.p("")
	r.p("For %d s per pooler and round (the poolers interleaved like the other runs): %d workers loop over", co.seconds, co.workers)
	r.p("log in (SCRAM-SHA-256), `SELECT 1`, Terminate, close; %d workers loop over connect, StartupMessage, hang up", co.abandon)
	r.p("on the AuthenticationSASL request; every %v (the first at %v) %d clients start at once, each a login,", co.every, co.every/2, co.burst)
	r.p("`SELECT 1` and Terminate. Login latency: dial to the first ReadyForQuery, of every completed login, steady")
	r.p("and burst together. Failed: a login or `SELECT 1` that errored or took over %v. Logins/s: completed logins", churnTimeout)
	r.p("over the run's wall time (the cycles under way at the end finish). CPU per login: utime+stime over the run")
	r.p("and 500 ms after it (abandoned logins included) / completed logins; harness: the benchmark's own process, on")
	r.p("the same CPUs (its SCRAM client reuses the salted password of a salt it has seen: no PBKDF2 per login to")
	r.p("poolerd, but PgBouncer with a plain-text auth_file sends a new salt every login). Burst: the burst clients'")
	r.p("logins alone. Machine busy: all CPUs, all processes. Listen overflows: TcpExt ListenOverflows")
	r.p("(/proc/net/netstat, machine-wide) during the run. All workers run closed-loop: a faster pooler gets more")
	r.p("logins (and more abandoned ones) in the same time.")
	r.p("")
	r.p("| target | round | completed logins | logins/s | login p50 | login p99 | login max | burst logins: p50 / p99 | failed logins (timeouts) | abandoned logins | pooler CPU per login | harness CPU per login | machine busy | listen overflows |")
	r.p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	ms := func(us float64) string { return fmtF(us/1000, 1) + " ms" }
	burst := func(h latHist) string {
		if h.count() == 0 {
			return "—"
		}
		return fmtF(h.quantile(0.5)/1000, 1) + " / " + ms(h.quantile(0.99))
	}
	cpuMs := func(t, n int64) string {
		if n <= 0 {
			return "—"
		}
		return fmtF(ticksMs(t, r.ticks)/float64(n), 3) + " ms"
	}
	// busy: over the runs' walls and the 500 ms after each.
	busy := func(mach int64, window time.Duration) string {
		w := window.Seconds() * float64(runtime.NumCPU()) * float64(r.ticks)
		if w <= 0 {
			return "—"
		}
		return fmtPct(float64(mach) / w)
	}
	ab := func(n, failed int64) string {
		s := commas(n)
		if failed > 0 {
			s += fmt.Sprintf(" (%s failed)", commas(failed))
		}
		return s
	}
	for _, n := range r.names {
		runs := byTarget[n]
		if len(runs) == 0 {
			continue
		}
		for _, c := range runs {
			if !c.ok() {
				r.p("| %s | %d | **failed**: %s | | | | | | %s (%s) | %s | | | | |", n, c.Round, truncate(c.Err, 120),
					commas(c.Failed), commas(c.Timeouts), ab(c.Abandoned, c.AbandonFailed))
				continue
			}
			r.p("| %s | %d | %s | %s | %s | %s | %s | %s | %s (%s) | %s | %s | %s | %s | %d |", n, c.Round, commas(c.Completed),
				fmtTPS(c.loginsPerSec()), ms(c.Hist.quantile(0.5)), ms(c.Hist.quantile(0.99)), ms(float64(c.MaxUs)), burst(c.BurstHist),
				commas(c.Failed), commas(c.Timeouts), ab(c.Abandoned, c.AbandonFailed),
				cpuMs(c.PoolerCPUTicks, c.Completed), cpuMs(c.SelfTicks, c.Completed), busy(c.MachineTicks, c.Wall+500*time.Millisecond), c.ListenOverflows)
		}
		if a := aggs[n]; len(runs) > 1 && a.ok > 0 {
			perSec := math.NaN()
			if a.wall > 0 {
				perSec = float64(a.completed) / a.wall.Seconds()
			}
			r.p("| %s | all | %s | %s | %s | %s | %s | %s | %s (%s) | %s | %s | %s | %s | %d |", n, commas(a.completed),
				fmtTPS(perSec), ms(a.hist.quantile(0.5)), ms(a.hist.quantile(0.99)), ms(float64(a.maxUs)), burst(a.burst),
				commas(a.failed), commas(a.timeouts), ab(a.abandoned, a.abFailed),
				cpuMs(a.pooler, a.completed), cpuMs(a.self, a.completed), busy(a.machine, a.wall+time.Duration(a.ok)*500*time.Millisecond), a.overflows)
		}
	}
	r.p("")
	if pd, pb := aggs[targetPoolerd], aggs[targetPgbouncer]; pd != nil && pb != nil {
		x := ratio(pd.qms(0.99), pb.qms(0.99))
		st := "met"
		switch {
		case math.IsNaN(x):
			st = "n/a"
		case x > 1:
			st = "**not met**"
		}
		r.p("Login p99 under churn, all rounds: poolerd %s ms, PgBouncer %s ms: %s (goal: ≤ PgBouncer's): %s.",
			fmtF(pd.qms(0.99), 1), fmtF(pb.qms(0.99), 1), fmtRatio(x), st)
		r.p("")
	}
}
