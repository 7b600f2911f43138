package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// Output of pgbench 15 for a normal run.
const pgbenchOK = `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: select only>
scaling factor: 10
query mode: extended
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 10 s
number of transactions actually processed: 140531
number of failed transactions: 0 (0.000%)
latency average = 1.138 ms
initial connection time = 25.706 ms
tps = 14058.331912 (without initial connection time)
`

// A -C run.
const pgbenchConnect = `transaction type: <builtin: select only>
scaling factor: 10
query mode: simple
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 10 s
number of transactions actually processed: 1061
number of failed transactions: 0 (0.000%)
latency average = 150.892 ms
average connection time = 18.712 ms
tps = 106.035432 (including reconnection times)
`

// A run whose clients were aborted (stdout, stderr).
const pgbenchAbortedOut = `transaction type: <builtin: select only>
scaling factor: 10
query mode: prepared
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 12438
number of failed transactions: 0 (0.000%)
latency average = 2.573 ms
initial connection time = 20.1 ms
tps = 6219.000000 (without initial connection time)
`

const pgbenchAbortedErr = `pgbench (15.18 (Debian 15.18-0+deb12u1))
pgbench: error: client 3 script 0 aborted in command 1 query 0: ERROR:  prepared statement "P_0" does not exist
pgbench: error: client 7 script 0 aborted in command 1 query 0: ERROR:  prepared statement "P_0" does not exist
pgbench: error: Run was aborted; the above results are incomplete.
`

func TestParsePgbench(t *testing.T) {
	s := parsePgbench(pgbenchOK, "pgbench (15.18 (Debian 15.18-0+deb12u1))\n"+
		"progress: 1.0 s, 14001.2 tps, lat 1.139 ms stddev 0.514, 0 failed\n")
	if !s.Found || s.Mode != "extended" || s.Clients != 16 || s.Txns != 140531 || s.Failed != 0 ||
		s.LatencyMs != 1.138 || s.ConnTimeMs != 25.706 || math.Abs(s.TPS-14058.331912) > 1e-6 ||
		s.TPSIncludesConnect || s.Aborted || len(s.Errors) != 0 {
		t.Fatalf("normal run parsed as %+v", s)
	}

	s = parsePgbench(pgbenchConnect, "")
	if !s.Found || !s.TPSIncludesConnect || s.ConnTimeMs != 18.712 || s.Txns != 1061 || math.Abs(s.TPS-106.035432) > 1e-6 {
		t.Fatalf("-C run parsed as %+v", s)
	}

	s = parsePgbench(pgbenchAbortedOut, pgbenchAbortedErr)
	if !s.Aborted || s.Mode != "prepared" || s.Txns != 12438 {
		t.Fatalf("aborted run parsed as %+v", s)
	}
	// The two client errors are the same once the client number is gone.
	if len(s.Errors) != 2 || !strings.Contains(s.Errors[0], `client N script 0 aborted`) ||
		!strings.Contains(s.Errors[1], "Run was aborted") {
		t.Fatalf("errors %q", s.Errors)
	}

	s = parsePgbench("", "pgbench: error: connection to server at \"127.0.0.1\", port 1 failed: Connection refused\n")
	if s.Found || len(s.Errors) != 1 {
		t.Fatalf("failed connection parsed as %+v", s)
	}
}

func TestParseTxLog(t *testing.T) {
	// client_id transaction_no time script_no time_epoch time_us
	log := `0 0 120 0 1700000000 1
0 1 80 0 1700000000 2
1 0 100 0 1700000000 3
1 1 failed 0 1700000000 4
1 2 2500 0 1700000000 5
`
	h := latHist{}
	failed, err := parseTxLog(strings.NewReader(log), h, 0)
	if err != nil || failed != 1 || h.count() != 4 {
		t.Fatalf("failed=%d count=%d err=%v", failed, h.count(), err)
	}
	// Only the transactions that ended from 1700000000.000003 on.
	late := latHist{}
	if _, err := parseTxLog(strings.NewReader(log), late, 1700000000*1e6+3); err != nil || late.count() != 2 {
		t.Fatalf("from 3 µs: count=%d err=%v", late.count(), err)
	}
	if p50 := h.quantile(0.5); p50 != 100 {
		t.Errorf("p50 = %v, want 100", p50)
	}
	if p99 := h.quantile(0.99); p99 != 2500 {
		t.Errorf("p99 = %v, want 2500", p99)
	}
	if !math.IsNaN(latHist{}.quantile(0.5)) {
		t.Error("quantile of an empty histogram is not NaN")
	}
}

func TestLatBucket(t *testing.T) {
	for in, want := range map[int64]int64{0: 0, 999: 999, 1000: 1000, 1234: 1230, 98765: 98700, 1234567: 1230000} {
		if got := latBucket(in); got != want {
			t.Errorf("latBucket(%d) = %d, want %d", in, got, want)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// utime 1234 and stime 56 are fields 14 and 15; the name has a space
	// and a parenthesis.
	stat := "4242 (pool (er) d) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 5 0 100 1000 200\n"
	got, err := parseStatCPU([]byte(stat))
	if err != nil || got != 1290 {
		t.Fatalf("parseStatCPU = %d, %v; want 1290", got, err)
	}
	st, err := parseStat([]byte(stat))
	if err != nil || st.ppid != 1 || st.cutime != 0 || st.cstime != 0 {
		t.Fatalf("parseStat = %+v, %v", st, err)
	}
	st, err = parseStat([]byte("7 (postgres) S 1 7 7 0 -1 0 0 0 0 0 5 6 70 80 20 0 1 0\n"))
	if err != nil || st.utime != 5 || st.stime != 6 || st.cutime != 70 || st.cstime != 80 {
		t.Fatalf("parseStat = %+v, %v", st, err)
	}
}

// A /proc/PID/task/TID/status of a poolerd event loop thread (Linux 6.1),
// shortened.
const taskStatus = `Name:	poolerd
Umask:	0022
State:	S (sleeping)
Tgid:	4242
Pid:	4245
PPid:	1
Threads:	9
VmRSS:	   11264 kB
Cpus_allowed_list:	0-1
voluntary_ctxt_switches:	150123
nonvoluntary_ctxt_switches:	877
`

func TestParseCtxSwitches(t *testing.T) {
	got, err := parseCtxSwitches([]byte(taskStatus))
	if err != nil || got != 151000 {
		t.Fatalf("parseCtxSwitches = %d, %v; want 151000", got, err)
	}
	// Without the fields the thread must not read as one that never ran.
	noNonvol := strings.Replace(taskStatus, "nonvoluntary_ctxt_switches:\t877\n", "", 1)
	if _, err := parseCtxSwitches([]byte(noNonvol)); err == nil {
		t.Error("no error without nonvoluntary_ctxt_switches")
	}
	if _, err := parseCtxSwitches([]byte("Name:\tx\n")); err == nil {
		t.Error("no error without either field")
	}
	bad := strings.Replace(taskStatus, "150123", "15x", 1)
	if _, err := parseCtxSwitches([]byte(bad)); err == nil || !strings.Contains(err.Error(), "voluntary_ctxt_switches") {
		t.Errorf("malformed count: error %v", err)
	}
}

// TestCtxSwitchesSelf reads the test process's own threads from /proc.
func TestCtxSwitchesSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	// Sleeping is a voluntary switch, so the count is above zero however
	// little the process has run.
	time.Sleep(time.Millisecond)
	n, err := ctxSwitches(os.Getpid())
	if err != nil || n <= 0 {
		t.Fatalf("ctxSwitches(self) = %d, %v; want > 0", n, err)
	}
	if _, err := ctxSwitches(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

func TestCommas(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := commas(in); got != want {
			t.Errorf("commas(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestProgressWindow(t *testing.T) {
	at, tps, lat, ok := parseProgress("progress: 3.0 s, 5321.9 tps, lat 2.994 ms stddev 3.211, 0 failed")
	if !ok || at != 3 || tps != 5321.9 || lat != 2.994 {
		t.Fatalf("parseProgress = %v, %v, %v, %v", at, tps, lat, ok)
	}
	if _, _, _, ok := parseProgress("pgbench: error: client 0 aborted"); ok {
		t.Fatal("parsed an error line as progress")
	}

	ticks := int64(0)
	w := &progressWriter{sample: func() counters {
		ticks += 10
		return counters{pooler: ticks, ctxSw: 3 * ticks, mach: 2 * ticks}
	}}
	// Logins, then four reports written in awkward pieces.
	for _, chunk := range []string{
		"pgbench (15.18)\nprogress: 1.0 s, 10.0 tps, lat 9 ms stddev 1, 0 failed\n",
		"progress: 2.0 s, 100.0 tps, lat 1 ms stddev 1, 0 failed\nprog",
		"ress: 3.0 s, 1000.0 tps, lat 1 ms stddev 1, 0 failed\n",
		"progress: 3.5 s, 2000.0 tps, lat 4 ms stddev 1, 0 failed\n",
	} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	// From 2 s: the report at 2.0 s opens the window: 1000×1 s + 2000×0.5 s.
	win, ok := w.window(2)
	if !ok || win.pooler != 20 || win.ctxSw != 60 || win.mach != 40 || win.txns != 2000 || win.seconds != 1.5 || win.latMs != 2.5 {
		t.Fatalf("window(2) = %+v, %v", win, ok)
	}
	// Too few reports after 3 s: the window opens at the first report.
	win, ok = w.window(3)
	if !ok || win.pooler != 30 || win.ctxSw != 90 || win.txns != 2100 || win.seconds != 2.5 {
		t.Fatalf("window(3) = %+v, %v", win, ok)
	}
	if !strings.HasPrefix(w.String(), "pgbench (15.18)\nprogress: 1.0 s") {
		t.Fatalf("stderr not kept: %q", w.String())
	}
}

func TestBurstOffsets(t *testing.T) {
	got := burstOffsets(10, 10*time.Second)
	if len(got) != 1 || got[0] != 5*time.Second {
		t.Fatalf("10 s every 10s: %v", got)
	}
	if got := burstOffsets(90, 10*time.Second); len(got) != 9 || got[8] != 85*time.Second {
		t.Fatalf("90 s every 10s: %v", got)
	}
	if got := burstOffsets(3, 10*time.Second); len(got) != 0 {
		t.Fatalf("3 s every 10s: %v", got)
	}
}

func TestParseTCPExt(t *testing.T) {
	text := "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 1 42 43\nIpExt: InNoRoutes\nIpExt: 0\n"
	if v := parseTCPExt(text, "ListenOverflows"); v != 42 {
		t.Errorf("ListenOverflows = %d, want 42", v)
	}
	if v := parseTCPExt(text, "Missing"); v != -1 {
		t.Errorf("Missing = %d, want -1", v)
	}
	if k := errKey(errors.New("read tcp 127.0.0.1:40312->127.0.0.1:6432: i/o timeout")); k != "read tcp 127.0.0.1:N->127.0.0.1:N: i/o timeout" {
		t.Errorf("errKey = %q", k)
	}
}

func TestChurnAggregate(t *testing.T) {
	a := &churnRun{Completed: 3, Hist: latHist{}, MaxUs: 9000, Failed: 1, Timeouts: 1, Abandoned: 10}
	for _, us := range []int64{1000, 2000, 9000} {
		a.Hist.add(us)
	}
	b := &churnRun{Completed: 1, Hist: latHist{5000: 1}, MaxUs: 5000, AbandonFailed: 2}
	bad := &churnRun{Err: "pooler process gone", Completed: 7, Failed: 4}
	g := aggregateChurn([]*churnRun{a, b, bad})
	if g.ok != 2 || g.completed != 4 || g.failed != 5 || g.timeouts != 1 || g.abandoned != 10 || g.abFailed != 2 || g.maxUs != 9000 {
		t.Fatalf("aggregate = %+v", g)
	}
	if p50, p99 := g.qms(0.5), g.qms(0.99); p50 != 2 || p99 != 9 {
		t.Fatalf("p50 %v ms, p99 %v ms; want 2 and 9", p50, p99)
	}
}

// TestAbandonLoginAndQuery runs abandonLogin and simpleQuery against a
// fake server.
func TestAbandonLoginAndQuery(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 2)
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				served <- err
				return
			}
			served <- fakeServer(c)
		}
	}()
	if err := abandonLogin(ln.Addr().String(), "u", "db", 5*time.Second, false); err != nil {
		t.Fatalf("abandonLogin: %v", err)
	}
	// The client hung up without answering the SASL request.
	if err := <-served; err != io.EOF {
		t.Fatalf("after the SASL request the server read %v, want EOF", err)
	}

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(startupMessage("u", "db")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if typ, _, err := readMsg(br); err != nil || typ != 'R' {
		t.Fatalf("SASL request: %q %v", typ, err)
	}
	// The fake server answers anything with an error and ReadyForQuery.
	if err := writeMsg(c, 'p', []byte("x")); err != nil {
		t.Fatal(err)
	}
	if typ, _, err := readMsg(br); err != nil || typ != 'E' {
		t.Fatalf("error: %q %v", typ, err)
	}
	if typ, _, err := readMsg(br); err != nil || typ != 'Z' {
		t.Fatalf("ReadyForQuery: %q %v", typ, err)
	}
	err = simpleQuery(c, "SELECT 1", 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("simpleQuery error = %v, want the server's boom", err)
	}
	terminate(c)
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// fakeServer reads a StartupMessage, sends AuthenticationSASL, then
// answers every message with ErrorResponse "boom" and ReadyForQuery,
// until Terminate (nil) or a read error (returned).
func fakeServer(c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(hdr[:])-4)); err != nil {
		return err
	}
	sasl := binary.BigEndian.AppendUint32(nil, 10)
	sasl = append(sasl, "SCRAM-SHA-256\x00\x00"...)
	if err := writeMsg(c, 'R', sasl); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	for {
		typ, _, err := readMsg(br)
		if err != nil {
			return err
		}
		if typ == 'X' {
			return nil
		}
		if err := writeMsg(c, 'E', []byte("SERROR\x00C42000\x00Mboom\x00\x00")); err != nil {
			return err
		}
		if err := writeMsg(c, 'Z', []byte("I")); err != nil {
			return err
		}
	}
}

// TestChurnReport renders the churn section: every row has the header's
// columns, and the p99 comparison is there.
func TestChurnReport(t *testing.T) {
	run := func(target string, round int, lat ...int64) *churnRun {
		r := &churnRun{Target: target, Round: round, Hist: latHist{}, BurstHist: latHist{}, Errors: map[string]int64{},
			Wall: 10 * time.Second, Abandoned: 100, PoolerCPUTicks: 50, SelfTicks: 10, MachineTicks: 1000}
		for _, us := range lat {
			r.Hist.add(us)
			r.Completed++
			r.MaxUs = max(r.MaxUs, us)
		}
		r.BurstHist.add(lat[len(lat)-1])
		return r
	}
	bad := run(targetPgbouncer, 2, 1000)
	bad.Err, bad.Failed, bad.Errors["login: EOF"] = "pooler process gone", 3, 3
	res := &results{
		opts:    options{rounds: 2, noMatrix: true, churn: churnOptions{seconds: 10, workers: 16, abandon: 4, burst: 500, every: 10 * time.Second}},
		targets: []*target{{name: targetDirect}, {name: targetPoolerd}, {name: targetPgbouncer}},
		churns: []*churnRun{run(targetPoolerd, 1, 1000, 2000, 40000), run(targetPgbouncer, 1, 3000, 9000),
			run(targetPoolerd, 2, 1500, 2500), bad},
		ticks: 100,
	}
	out := renderReport(res)
	i := strings.Index(out, "## Connection churn")
	if i < 0 {
		t.Fatalf("no churn section:\n%s", out)
	}
	var cols int
	rows := 0
	for _, l := range strings.Split(out[i:], "\n") {
		if !strings.HasPrefix(l, "|") {
			if rows > 0 {
				break
			}
			continue
		}
		n := strings.Count(l, "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("%d columns, header has %d: %s", n, cols, l)
		}
		rows++
	}
	// Header, separator, poolerd 1, 2, all, pgbouncer 1, 2 (failed), all.
	if rows != 8 {
		t.Errorf("%d table lines, want 8:\n%s", rows, out[i:])
	}
	for _, want := range []string{"| poolerd | all | 5 |", "poolerd 40.0 ms, PgBouncer 9.0 ms: 4.44×", "**not met**",
		"**failed**: pooler process gone", "3× `login: EOF`"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out[i:])
		}
	}
}

// tableAfter returns the lines of the first Markdown table after marker in
// out, or nil if there is none.
func tableAfter(out, marker string) []string {
	i := strings.Index(out, marker)
	if i < 0 {
		return nil
	}
	var rows []string
	for _, l := range strings.Split(out[i+len(marker):], "\n") {
		if strings.HasPrefix(l, "|") {
			rows = append(rows, l)
		} else if len(rows) > 0 {
			break
		}
	}
	return rows
}

// TestCPUReport renders the CPU table and the context switches per
// transaction beside it: per pooler, over the runs' windows, failed runs
// left out, and no column for direct PostgreSQL.
func TestCPUReport(t *testing.T) {
	run := func(target string, round int, txns float64, cpu, ctx int64) *pgbenchRun {
		return &pgbenchRun{Target: target, Mode: "simple", Clients: 16, Round: round, Hist: latHist{500: 1},
			pgbenchSummary: pgbenchSummary{Txns: int64(txns), TPS: txns / 10, Found: true},
			WinTPS:         txns / 10, WinTxns: txns, WinSeconds: 10, PoolerCPUTicks: cpu, PoolerCtxSwitches: ctx,
			MachineTicks: 1000, Wall: 12 * time.Second}
	}
	bad := run(targetPoolerd, 3, 10000, 999, 999999)
	bad.Err = "pooler process gone"
	runs := []*pgbenchRun{
		run(targetDirect, 1, 40000, 0, 0), run(targetDirect, 2, 40000, 0, 0),
		// poolerd: 60 ticks and 30,000 switches over 30,000 transactions.
		run(targetPoolerd, 1, 10000, 20, 12000), run(targetPoolerd, 2, 20000, 40, 18000), bad,
		// PgBouncer: 80 ticks and 60,000 switches over 20,000 transactions.
		run(targetPgbouncer, 1, 10000, 40, 30000), run(targetPgbouncer, 2, 10000, 40, 30000),
	}
	opts := options{rounds: 3, seconds: 10, jobs: 2, scale: 10, clients: []int{16}, modes: []string{"simple"}}
	res := &results{
		opts:    opts,
		targets: []*target{{name: targetDirect}, {name: targetPoolerd}, {name: targetPgbouncer}},
		runs:    runs,
		ticks:   100,
	}
	out := renderReport(res)
	checkTable := func(out, marker string, want []string) {
		t.Helper()
		rows := tableAfter(out, marker)
		if len(rows) != len(want) {
			t.Fatalf("table after %q: %d lines, want %d:\n%s", marker, len(rows), len(want), strings.Join(rows, "\n"))
		}
		for k, l := range rows {
			if l != want[k] {
				t.Errorf("table after %q, line %d:\n got %s\nwant %s", marker, k, l, want[k])
			}
		}
	}
	// CPU: poolerd 0.6 s / 30,000 tx, PgBouncer 0.8 s / 20,000 tx; each
	// run's machine is busy 10 s.
	checkTable(out, "## CPU seconds per 10,000 transactions", []string{
		"| mode | clients | poolerd | PgBouncer | poolerd / PgBouncer | machine, direct | machine, poolerd | machine, pgbouncer |",
		"|---|---|---|---|---|---|---|---|",
		"| simple | 16 | 0.200 | 0.400 | 0.50× | 2.500 | 6.667 | 10.000 |",
	})
	checkTable(out, "Context switches per transaction of the pooler process", []string{
		"| mode | clients | poolerd ctx switches / txn | PgBouncer ctx switches / txn | poolerd / PgBouncer |",
		"|---|---|---|---|---|",
		"| simple | 16 | 1.00 | 3.00 | 0.33× |",
	})

	// With the bare relay (a yardstick): its CPU, and poolerd's over it.
	// Bare relay: 20 ticks and 10,000 switches over 20,000 transactions.
	res.targets = append(res.targets, &target{name: targetBare, matrixOnly: true})
	res.runs = append(append([]*pgbenchRun(nil), runs...), run(targetBare, 1, 10000, 10, 5000), run(targetBare, 2, 10000, 10, 5000))
	out = renderReport(res)
	checkTable(out, "## CPU seconds per 10,000 transactions", []string{
		"| mode | clients | poolerd | PgBouncer | poolerd / PgBouncer | bare relay | poolerd / bare relay | machine, direct | machine, poolerd | machine, pgbouncer | machine, bare relay |",
		"|---|---|---|---|---|---|---|---|---|---|---|",
		"| simple | 16 | 0.200 | 0.400 | 0.50× | 0.100 | 2.00× | 2.500 | 6.667 | 10.000 | 10.000 |",
	})
	checkTable(out, "Context switches per transaction of the pooler process", []string{
		"| mode | clients | poolerd ctx switches / txn | PgBouncer ctx switches / txn | poolerd / PgBouncer | bare relay ctx switches / txn |",
		"|---|---|---|---|---|---|",
		"| simple | 16 | 1.00 | 3.00 | 0.33× | 0.50 |",
	})
	if others(res.targets)[len(others(res.targets))-1].name != targetPgbouncer {
		t.Error("the bare relay is not left out of the storm, churn and idle tests")
	}

	// Without PgBouncer there is no PgBouncer column and no ratio.
	res.targets, res.runs = res.targets[:2], runs[:5]
	out = renderReport(res)
	checkTable(out, "Context switches per transaction of the pooler process", []string{
		"| mode | clients | poolerd ctx switches / txn |",
		"|---|---|---|",
		"| simple | 16 | 1.00 |",
	})
}
