package soak

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// outcome is what a client knows about one transaction it ran.
type outcome int

const (
	// acked: COMMIT (or the COPY) was answered: it must be in the table.
	acked outcome = iota
	// failed: an error came before COMMIT was sent: it must not be.
	failed
	// unknown: the connection failed while COMMIT was under way.
	unknown
)

// ledger records the outcome of every identified transaction of one kind
// of client (each kind writes its own table).
type ledger struct {
	mu       sync.Mutex
	outcomes map[int64]outcome
}

func newLedger() *ledger { return &ledger{outcomes: map[int64]outcome{}} }

func (l *ledger) record(id int64, o outcome) {
	l.mu.Lock()
	l.outcomes[id] = o
	l.mu.Unlock()
}

// check compares the ledger with the ids in the table: every acked id is
// there, no failed one is. It returns the counts and the violations.
func (l *ledger) check(inTable map[int64]bool) (counts [3]int, missing, committed []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, o := range l.outcomes {
		counts[o]++
		switch {
		case o == acked && !inTable[id]:
			missing = append(missing, id)
		case o == failed && inTable[id]:
			committed = append(committed, id)
		}
	}
	return counts, missing, committed
}

// errorLog counts the errors clients saw: by SQLSTATE when the error was an
// ErrorResponse, and separately (with samples) the failures that came
// without one: a dropped socket where a message was possible, or a client
// that hung past its own deadline.
type errorLog struct {
	mu      sync.Mutex
	bySQL   map[string]int
	dropped int
	hung    int
	// closeReported: closes reported by a client library that was sent
	// the FATAL (observeText).
	closeReported int
	// midMessage: streams that ended inside a message (observe).
	midMessage int
	dirty      int
	// dialLost: connects to poolerd that timed out while no listen queue
	// on the machine overflowed (netstat_test.go); drops0 is that count
	// when the soak began (dropsOK: it can be read).
	dialLost  int
	drops0    uint64
	dropsOK   bool
	samples   []string
	maxSample int
}

func newErrorLog() *errorLog {
	e := &errorLog{bySQL: map[string]int{}, maxSample: 20}
	e.drops0, e.dropsOK = listenDrops()
	return e
}

func (e *errorLog) sample(s string) {
	if len(e.samples) < e.maxSample {
		e.samples = append(e.samples, s)
	}
}

// observe classifies a Go client's error; run is the load's context (an
// error after it ended is the test stopping the client, not a failure).
func (e *errorLog) observe(run context.Context, who string, err error) {
	if err == nil || run.Err() != nil {
		return
	}
	var pe *pgconn.PgError
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case errors.As(err, &pe):
		e.bySQL[pe.Code]++
	case errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "unexpected EOF"):
		// The stream ended inside a message: the server connection was
		// lost mid-frame, when poolerd sends nothing more (its FATAL
		// would be read as the rest of the frame).
		e.midMessage++
	case (errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)) && dialTimedOut(err) && e.noListenDrops():
		e.dialLost++
		e.sample(fmt.Sprintf("%s %s: connect unanswered, no listen queue overflowed (not poolerd's): %v", time.Now().UTC().Format("15:04:05.000"), who, err))
	case errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err):
		e.hung++
		e.sample(fmt.Sprintf("%s %s: hung: %v", time.Now().UTC().Format("15:04:05.000"), who, err))
	default:
		e.dropped++
		e.sample(fmt.Sprintf("%s %s: no ErrorResponse: %v", time.Now().UTC().Format("15:04:05.000"), who, err))
	}
}

// noListenDrops reports whether no listen queue on the machine has
// overflowed since the soak began.
func (e *errorLog) noListenDrops() bool {
	n, ok := listenDrops()
	return e.dropsOK && ok && n == e.drops0
}

// observeText classifies an error reported by an external client: sqlstate
// is its SQLSTATE, empty when the client got none.
//
// Some client libraries report a close although they were sent the FATAL,
// and PostgreSQL's own FATALs meet the same fate; those are counted apart
// (closeReported), the other errors are held to the strict count:
//   - libpq (psycopg, pgbench, psql) reports only "server closed the
//     connection unexpectedly" when the FATAL arrives in the same packet as
//     the ReadyForQuery of its previous request: it leaves the FATAL
//     unparsed, sends the next request, reads the end of the stream and
//     reports that (seen with strace);
//   - pgconn's CopyFrom reports the failed write of its COPY data when the
//     session ends in the middle of a large COPY (the server, like
//     PostgreSQL, stops reading it), before it reads the FATAL.
func (e *errorLog) observeText(run context.Context, who, sqlstate, text string) {
	if run.Err() != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if sqlstate != "" {
		e.bySQL[sqlstate]++
		return
	}
	e.closeReported++
}

// clientReported counts an error a client library reported instead of the
// FATAL it was sent (see observeText).
func (e *errorLog) clientReported(who string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closeReported++
	e.sample(fmt.Sprintf("%s %s: reported by the client library instead of a FATAL: %v", time.Now().UTC().Format("15:04:05.000"), who, err))
}

func (e *errorLog) sawDirty(who, what string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dirty++
	e.sample(fmt.Sprintf("%s %s: dirty server connection: %s", time.Now().UTC().Format("15:04:05.000"), who, what))
}

// latencies keeps transaction latencies per minute of the run.
type latencies struct {
	start time.Time
	mu    sync.Mutex
	byMin map[int][]time.Duration
}

func newLatencies(start time.Time) *latencies {
	return &latencies{start: start, byMin: map[int][]time.Duration{}}
}

func (l *latencies) add(at time.Time, d time.Duration) {
	m := int(at.Sub(l.start) / time.Minute)
	l.mu.Lock()
	l.byMin[m] = append(l.byMin[m], d)
	l.mu.Unlock()
}

// p99 returns the 99th percentile and the count of each minute, in order.
func (l *latencies) p99() (mins []int, p99 []time.Duration, n []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for m := range l.byMin {
		mins = append(mins, m)
	}
	sort.Ints(mins)
	for _, m := range mins {
		ds := append([]time.Duration(nil), l.byMin[m]...)
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		p99 = append(p99, ds[(len(ds)*99)/100])
		n = append(n, len(ds))
	}
	return mins, p99, n
}

// clientLoop runs step on a connection to poolerd's database db until run
// ends, connecting again when step returns false (after closing the old
// connection) and, after a pause, when a connect or setup (run once per new
// connection; nil for none) fails.
func (s *soak) clientLoop(run context.Context, who, db string, extra []string, setup func(*pgx.Conn) error, step func(*pgx.Conn) bool) {
	var c *pgx.Conn
	defer func() {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}()
	for run.Err() == nil {
		if c == nil {
			cc, err := s.connectPgx(run, db, extra...)
			if err == nil && setup != nil {
				if err = setup(cc); err != nil {
					_ = cc.Close(context.Background())
				}
			}
			if err != nil {
				s.errs.observe(run, who, err)
				sleepCtx(run, 200*time.Millisecond)
				continue
			}
			c = cc
		}
		if !step(c) {
			_ = c.Close(context.Background())
			c = nil
		}
	}
}

// transferClient runs bank transfers between the accounts of the soak
// database through poolerd with pgx in the given query exec mode, until run
// ends. A long client sleeps inside each transaction. Each transaction
// first checks the marker the previous transaction on its server
// connection set with SET LOCAL: a marker still set means the connection
// was handed out inside another client's transaction.
func (s *soak) transferClient(run context.Context, name, mode string, long bool, rng *rand.Rand) {
	s.clientLoop(run, name, "soak", []string{"default_query_exec_mode=" + mode}, nil, func(c *pgx.Conn) bool {
		id := s.nextID.Add(1)
		a := 1 + rng.IntN(s.sc.accounts)
		b := 1 + (a+rng.IntN(s.sc.accounts-1))%s.sc.accounts
		amount := 1 + rng.IntN(100)
		start := time.Now()
		o, err := s.transfer(run, name, c, id, a, b, amount, long)
		if o != failed || err != nil {
			s.transfers.record(id, o)
		}
		if err != nil {
			s.errs.observe(run, name, err)
			sleepCtx(run, 50*time.Millisecond) // not a tight loop while PostgreSQL is away
			return !(c.IsClosed() || o == unknown || isFatal(err))
		}
		if !long {
			s.lat.add(start, time.Since(start))
		}
		sleepCtx(run, time.Duration(rng.IntN(20))*time.Millisecond)
		return true
	})
}

func isFatal(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Severity == "FATAL" || pe.Severity == "PANIC")
}

// transfer runs one transfer. The outcome is failed with a nil error only
// when nothing was sent (the run ended).
func (s *soak) transfer(run context.Context, who string, c *pgx.Conn, id int64, a, b, amount int, long bool) (outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.sc.opTimeout)
	defer cancel()
	if run.Err() != nil {
		return failed, nil
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return failed, err
	}
	var marker string
	var sameUser bool
	if err := tx.QueryRow(ctx, "SELECT coalesce(current_setting('soak.tx', true), ''), current_user = session_user").Scan(&marker, &sameUser); err != nil {
		_ = tx.Rollback(ctx)
		return failed, err
	}
	if marker != "" || !sameUser {
		s.errs.sawDirty(who, fmt.Sprintf("soak.tx = %q, current_user = session_user: %v", marker, sameUser))
	}
	steps := []string{
		fmt.Sprintf("SET LOCAL soak.tx = '%d'", id),
		fmt.Sprintf("UPDATE accounts SET balance = balance - %d WHERE id = %d", amount, a),
	}
	if long {
		steps = append(steps, "SELECT pg_sleep(0.5)", "SELECT pg_sleep(0.5)")
	}
	steps = append(steps,
		fmt.Sprintf("UPDATE accounts SET balance = balance + %d WHERE id = %d", amount, b),
		fmt.Sprintf("INSERT INTO transfers (id, src, dst, amount) VALUES (%d, %d, %d, %d)", id, a, b, amount))
	for _, q := range steps {
		if _, err := tx.Exec(ctx, q); err != nil {
			_ = tx.Rollback(ctx)
			return failed, err
		}
	}
	switch err := tx.Commit(ctx); {
	case err == nil:
		return acked, nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return failed, nil
	default:
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Severity == "ERROR" {
			return failed, err // COMMIT refused: rolled back
		}
		return unknown, err
	}
}

// connectPgx logs in to poolerd's database db as app.
func (s *soak) connectPgx(ctx context.Context, db string, extra ...string) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, s.sc.opTimeout)
	defer cancel()
	return pgx.Connect(cctx, s.dsn(db, extra...))
}

// dsn is a libpq URL for poolerd's database db as app.
func (s *soak) dsn(db string, extra ...string) string {
	q := append([]string{"sslmode=disable"}, extra...)
	return fmt.Sprintf("postgres://app:%s@%s/%s?%s", password, s.listen, db, strings.Join(q, "&"))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pgbenchLoop runs pgbench's TPC-B-like script with prepared statements
// through poolerd until run ends, starting it again when chaos aborts its
// clients. At the end the bench tables must balance (checkBench).
func (s *soak) pgbenchLoop(run context.Context) {
	for run.Err() == nil {
		left := time.Until(s.loadEnd)
		if left < 2*time.Second {
			return
		}
		cmd := exec.CommandContext(run, "pgbench", "-n", "-M", "prepared", "-c", strconv.Itoa(s.sc.pgbenchClients),
			"-j", "1", "-T", strconv.Itoa(int(left.Seconds())), "-h", s.host(), "-p", s.port(), "-U", "app", "bench")
		cmd.Env = append(os.Environ(), "PGPASSWORD="+password, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=30")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		s.pgbenchRuns.Add(1)
		s.classifyPgbench(run, stderr.String())
		sleepCtx(run, 100*time.Millisecond)
	}
}

var pgbenchAborted = regexp.MustCompile(`(?m)^pgbench: error: client \d+ (?:script \d+ )?aborted in command \d+ \(SQL\) of script \d+;?|^pgbench: error: client \d+ script \d+ aborted in command \d+ query \d+: `)

// classifyPgbench finds the clients pgbench reports aborted and whether
// each had an ErrorResponse (libpq prints it as "ERROR:" or "FATAL:").
func (s *soak) classifyPgbench(run context.Context, out string) {
	locs := pgbenchAborted.FindAllStringIndex(out, -1)
	for i, loc := range locs {
		end := len(out)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		msg := out[loc[1]:end]
		if j := strings.Index(msg, "\npgbench:"); j >= 0 {
			msg = msg[:j]
		}
		state := ""
		if m := regexp.MustCompile(`(?:ERROR|FATAL):  `).FindString(msg); m != "" {
			state = "(pgbench)" // pgbench prints no SQLSTATE, only the message
		}
		s.pgbenchAborts.Add(1)
		s.errs.observeText(run, "pgbench", state, msg)
	}
}

// psycopgScript runs short transactions with psycopg 3 until its deadline
// and prints one line per transaction: "ack ID MS", "fail ID SQLSTATE MSG",
// "unknown ID SQLSTATE MSG" ("-" when there was no SQLSTATE) or "dirty ID
// MARKER".
const psycopgScript = `
import sys, time, psycopg
dsn, base, deadline = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
n, conn = 0, None
def out(*a):
    print(*a, flush=True)
while time.time() < deadline:
    n += 1
    i = base + n
    stage = "connect"
    try:
        if conn is None or conn.closed:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=30)
        t0 = time.time()
        stage = "tx"
        cur = conn.cursor()
        cur.execute("BEGIN")
        cur.execute("SELECT coalesce(current_setting('soak.tx', true), '')")
        m = cur.fetchone()[0]
        if m != "":
            out("dirty", i, m)
        cur.execute("SET LOCAL soak.tx = '%d'" % i)
        cur.execute("INSERT INTO py_log (id) VALUES (%s)", (i,))
        stage = "commit"
        cur.execute("COMMIT")
        out("ack", i, round((time.time() - t0) * 1000, 3))
    except psycopg.Error as e:
        state = e.sqlstate or "-"
        kind = "unknown" if stage == "commit" else "fail"
        out(kind, i, state, str(e).replace("\n", " ")[:200])
        try:
            if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except Exception:
            pass
        if conn is not None and (conn.closed or state.startswith("08") or state.startswith("57")):
            try:
                conn.close()
            except Exception:
                pass
            conn = None
        time.sleep(0.1)
    time.sleep(0.01)
`

// psycopgLoop runs the psycopg script (one process per client) and
// records what it prints.
func (s *soak) psycopgLoop(run context.Context, client int) {
	py := python()
	base := int64(client+1) * 1_000_000_000
	cmd := exec.CommandContext(run, py, "-c", psycopgScript, s.dsn("soak"), strconv.FormatInt(base, 10),
		strconv.Itoa(int(time.Until(s.loadEnd).Seconds())))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Errorf("psycopg client: %v", err)
		return
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		s.t.Errorf("psycopg client: %v", err)
		return
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) < 3 {
			continue
		}
		id, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "ack":
			s.pyLog.record(id, acked)
		case "dirty":
			s.errs.sawDirty("psycopg", "soak.tx = "+f[2])
		case "fail", "unknown":
			o := failed
			if f[0] == "unknown" {
				o = unknown
			}
			s.pyLog.record(id, o)
			state := f[2]
			msg := ""
			if len(f) > 3 {
				msg = f[3]
			}
			if state == "-" {
				state = libpqAsync(msg)
			}
			s.errs.observeText(run, "psycopg", state, msg)
		}
	}
	if err := cmd.Wait(); err != nil && run.Err() == nil && time.Until(s.loadEnd) > 5*time.Second {
		s.t.Errorf("psycopg client exited early: %v\n%s", err, stderr.String())
	}
}

// libpqAsync classifies a libpq error without a SQLSTATE. When the server
// sends FATAL and closes while the client is between requests (PostgreSQL
// does the same when a backend is terminated), libpq reports the message
// followed by "server closed the connection unexpectedly" with no SQLSTATE:
// the client did get the message. Only the bare "server closed the
// connection" (or a reset) means there was none.
func libpqAsync(msg string) string {
	m := msg
	for _, p := range []string{"consuming input failed: ", "sending query failed: ", "sending query and params failed: "} {
		m = strings.TrimPrefix(m, p)
	}
	m = strings.TrimSpace(m)
	for _, bare := range []string{"server closed the connection unexpectedly", "connection to server", "could not receive data", "could not send data", "SSL SYSCALL", "no connection to the server", "the connection is lost", "the connection is closed"} {
		if strings.HasPrefix(m, bare) {
			return ""
		}
	}
	if m == "" {
		return ""
	}
	return "(libpq, async)"
}

var psqlState = regexp.MustCompile(`(?m)(?:ERROR|FATAL):  ([0-9A-Z]{5}): `)

// psqlLoop runs psql, a new connection each time, for one transaction
// (BEGIN; INSERT; COMMIT) with verbose errors, so that each error shows its
// SQLSTATE.
func (s *soak) psqlLoop(run context.Context, client int) {
	n := int64(0)
	base := int64(client+1) * 1_000_000_000
	for run.Err() == nil && time.Until(s.loadEnd) > 0 {
		n++
		id := base + n
		ctx, cancel := context.WithTimeout(run, s.sc.opTimeout)
		cmd := exec.CommandContext(ctx, "psql", "-X", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose",
			"-c", "BEGIN", "-c", fmt.Sprintf("INSERT INTO psql_log (id) VALUES (%d)", id), "-c", "COMMIT", s.dsn("soak"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		timedOut := ctx.Err() == context.DeadlineExceeded
		cancel()
		out := stdout.String()
		switch {
		case err == nil:
			s.psqlLog.record(id, acked)
		case strings.Contains(out, "INSERT 0 1"):
			s.psqlLog.record(id, unknown)
		default:
			s.psqlLog.record(id, failed)
		}
		if err != nil {
			if timedOut && run.Err() == nil {
				s.errs.mu.Lock()
				s.errs.hung++
				s.errs.sample("psql: hung: " + stderr.String())
				s.errs.mu.Unlock()
				continue
			}
			state := ""
			if m := psqlState.FindStringSubmatch(stderr.String()); m != nil {
				state = m[1]
			}
			s.errs.observeText(run, "psql", state, stderr.String())
			sleepCtx(run, 100*time.Millisecond)
		}
		sleepCtx(run, 20*time.Millisecond)
	}
}

// copyLoop copies copyBytes into PostgreSQL with COPY FROM STDIN and back
// out with COPY TO STDOUT every copyEvery. A batch is acked when its COPY
// completed; its rows must then all be there; a failed one must have none.
func (s *soak) copyLoop(run context.Context) {
	batch := int64(0)
	s.clientLoop(run, "copy", "soak", nil, nil, func(c *pgx.Conn) bool {
		batch++
		rows := s.sc.copyBytes / copyRowBytes
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*s.sc.opTimeout)
		tag, err := c.PgConn().CopyFrom(ctx, newCopyReader(batch, rows, -1, nil), "COPY copy_in (batch, payload) FROM STDIN")
		cancel()
		switch {
		case err == nil && tag.RowsAffected() == rows:
			s.copies.record(batch, acked)
			s.copyIn.Add(rows * copyRowBytes)
		case err == nil:
			s.t.Errorf("COPY batch %d: %d rows, want %d", batch, tag.RowsAffected(), rows)
		default:
			s.copies.record(batch, unknown) // checked: all its rows or none
			s.logf("COPY batch %d (%d MiB) failed after %s: %v", batch, s.sc.copyBytes>>20, time.Since(start).Round(time.Millisecond), err)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) && !errors.Is(err, context.DeadlineExceeded) && run.Err() == nil {
				// pgconn reports the failed write of its COPY data, not
				// the FATAL it was sent: see observeText.
				s.errs.clientReported("copy in", err)
				sleepCtx(run, time.Second)
				return false
			}
			s.errs.observe(run, "copy in", err)
			sleepCtx(run, time.Second)
			return false
		}
		ctx, cancel = context.WithTimeout(context.Background(), 5*s.sc.opTimeout)
		var n countWriter
		_, err = c.PgConn().CopyTo(ctx, &n, fmt.Sprintf("COPY (SELECT batch, payload FROM copy_in WHERE batch = %d) TO STDOUT", batch))
		cancel()
		if err != nil {
			s.errs.observe(run, "copy out", err)
			return false
		}
		// PostgreSQL prints the batch without the leading zeros.
		if want := rows * (copyRowBytes - 10 + int64(len(strconv.FormatInt(batch, 10)))); n.n != want {
			s.t.Errorf("COPY TO STDOUT of batch %d: %d bytes, want %d", batch, n.n, want)
		}
		s.copyOut.Add(n.n)
		sleepCtx(run, s.sc.copyEvery)
		return true
	})
}

// copyRowBytes is the size of one COPY row: batch, tab, 100-byte payload,
// newline, with the batch number printed in 10 digits.
const copyRowBytes = 10 + 1 + 100 + 1

// copyReader produces rows of COPY text for a batch; when cut >= 0, it calls
// onCut after cut rows and then blocks until the COPY is torn down.
type copyReader struct {
	batch     int64
	rows, cut int64
	row       int64
	buf       []byte
	onCut     func()
}

func newCopyReader(batch, rows, cut int64, onCut func()) *copyReader {
	return &copyReader{batch: batch, rows: rows, cut: cut, onCut: onCut}
}

func (r *copyReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.row == r.rows {
			return 0, io.EOF
		}
		if r.cut >= 0 && r.row == r.cut {
			r.onCut()
			r.cut = -1
			return 0, errors.New("client went away mid-COPY")
		}
		r.row++
		r.buf = fmt.Appendf(r.buf[:0], "%010d\t%0100d\n", r.batch, r.row)
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// listenLoop keeps a session-mode client LISTENing and counts what it
// receives; notifyLoop sends a NOTIFY through transaction mode every 100
// ms.
func (s *soak) listenLoop(run context.Context) {
	listen := func(c *pgx.Conn) error {
		_, err := c.Exec(run, "LISTEN soak_ch")
		return err
	}
	s.clientLoop(run, "listen", "soak_session", nil, listen, func(c *pgx.Conn) bool {
		ctx, cancel := context.WithTimeout(run, 2*time.Second)
		_, err := c.WaitForNotification(ctx)
		cancel()
		switch {
		case err == nil:
			s.notifyGot.Add(1)
		case run.Err() != nil:
		case errors.Is(err, context.DeadlineExceeded):
			// pgx closes the connection when a wait is interrupted.
			return !c.IsClosed()
		default:
			s.errs.observe(run, "listen", err)
			return false
		}
		return true
	})
}

func (s *soak) notifyLoop(run context.Context) {
	s.clientLoop(run, "notify", "soak", nil, nil, func(c *pgx.Conn) bool {
		ctx, cancel := context.WithTimeout(context.Background(), s.sc.opTimeout)
		_, err := c.Exec(ctx, "SELECT pg_notify('soak_ch', 'n')")
		cancel()
		if err != nil {
			s.errs.observe(run, "notify", err)
			return false
		}
		s.notifySent.Add(1)
		sleepCtx(run, 100*time.Millisecond)
		return true
	})
}

// idleClients keeps about sc.idleClients clients logged in and doing
// nothing, closing and opening churnPerSec of them each second.
func (s *soak) idleClients(run context.Context) {
	var mu sync.Mutex
	var conns []*pgconn.PgConn
	open := func() {
		ctx, cancel := context.WithTimeout(run, s.sc.opTimeout)
		defer cancel()
		c, err := pgconn.Connect(ctx, s.dsn("soak"))
		if err != nil {
			s.errs.observe(run, "idle client", err)
			return
		}
		s.idleLogins.Add(1)
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close(context.Background())
		}
		conns = nil
	}()
	// Ramp up with a few workers.
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for run.Err() == nil && next.Add(1) <= int64(s.sc.idleClients) {
				open()
			}
		}()
	}
	wg.Wait()
	s.idleRamped.Store(true)
	rng := rand.New(rand.NewPCG(uint64(s.seed), 99))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-run.Done():
			return
		case <-tick.C:
		}
		for range s.sc.churnPerSec {
			mu.Lock()
			if len(conns) > 0 {
				i := rng.IntN(len(conns))
				c := conns[i]
				conns[i] = conns[len(conns)-1]
				conns = conns[:len(conns)-1]
				mu.Unlock()
				_ = c.Close(context.Background())
			} else {
				mu.Unlock()
			}
			open()
		}
	}
}

// probe runs SELECT 1 through poolerd every 50 ms and records when it
// succeeded, for the recovery time after each fault.
func (s *soak) probe(run context.Context) {
	s.clientLoop(run, "probe", "soak", []string{"default_query_exec_mode=simple_protocol"}, nil, func(c *pgx.Conn) bool {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), s.sc.opTimeout)
		_, err := c.Exec(ctx, "SELECT 1")
		cancel()
		if err != nil {
			s.errs.observe(run, "probe", err)
			return false
		}
		s.probeOK(start)
		sleepCtx(run, 50*time.Millisecond)
		return true
	})
}

func (s *soak) probeOK(sent time.Time) {
	s.probeMu.Lock()
	s.probeSuccesses = append(s.probeSuccesses, sent)
	s.probeMu.Unlock()
}

// recoveredAt returns the send time of the first successful probe sent at
// or after t.
func (s *soak) recoveredAt(t time.Time) (time.Time, bool) {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	i := sort.Search(len(s.probeSuccesses), func(i int) bool { return !s.probeSuccesses[i].Before(t) })
	if i == len(s.probeSuccesses) {
		return time.Time{}, false
	}
	return s.probeSuccesses[i], true
}
