package integration

// Docs that cannot drift: the metric tables of docs/observability.md
// against the /metrics of the real poolerd binary, and the SHOW column lists
// of docs/admin-console-reference.md (with the counts docs/observability.md
// gives) against what its admin console sends.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/test/pgtest"

	"github.com/poolerd/poolerd/test/mdtable"
)

// docsDaemon is the poolerd binary, built from cmd/poolerd and started
// with a configuration that makes every documented metric family appear.
type docsDaemon struct {
	addr, http string
	logs       *bytes.Buffer
}

func docsFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startDocsDaemon builds and starts bin/poolerd in front of pg: the sidecar
// form, app as the console's admin, a database "limited" that accepts one
// client, and two rate-limit rules (reject and wait) for clients that ask
// for them by application_name.
func startDocsDaemon(t *testing.T) *docsDaemon {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "poolerd")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/poolerd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/poolerd: %v\n%s", err, out)
	}
	host, port, _ := net.SplitHostPort(pg.Addr())
	d := &docsDaemon{addr: docsFreeAddr(t), http: docsFreeAddr(t), logs: &bytes.Buffer{}}
	// Peer 2 is a port nothing listens on: a cancel request for it fails.
	_, deadPort, _ := net.SplitHostPort(docsFreeAddr(t))
	conf := fmt.Sprintf(`listen: %s
http_listen: %s
upstream: %s
admin_users: [%s]
users:
  - name: docs_repl
    password: %s
max_size: 5
log_level: info
peer_id: 1
peers:
  - id: 2
    host: 127.0.0.1
    port: %s
databases:
  - name: limited
    host: %s
    port: %s
    dbname: %s
    max_db_client_connections: 1
rate_limits:
  - name: docs-reject
    match: {application_name: docs-reject}
    queries: {limit: 1, per: 1h}
    mode: reject
  - name: docs-wait
    match: {application_name: docs-wait}
    queries: {limit: 1, per: 300ms}
    mode: wait
    max_wait: 5s
  - name: docs-measured
    match: {application_name: docs-measured}
    rows: {limit: 1, per: 1h}
    mode: reject
`, d.addr, d.http, pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp), pgtest.RoleApp, pgtest.Password, deadPort, host, port, pgtest.DBApp)
	file := filepath.Join(dir, "poolerd.yaml")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", file)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), // no POOLERD_* from the environment
		// A probe listener (a key being added) must not take a fixed
		// port; until the key exists, the variable is ignored.
		"POOLERD_HTTP_PROBE_LISTEN=" + docsFreeAddr(t)}
	cmd.Stderr = d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			dumpLog(t, "poolerd log", d.logs.String())
		}
	})
	eventually(t, 15*time.Second, "poolerd listening", func() bool {
		c, err := net.Dial("tcp", d.addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return d
}

func (d *docsDaemon) dsn(db string, extra ...string) string {
	s := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", pgtest.RoleApp, pgtest.Password, d.addr, db)
	for _, e := range extra {
		s += "&" + e
	}
	return s
}

func (d *docsDaemon) connect(t *testing.T, db string, extra ...string) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.Connect(ctxTimeout(t, 15*time.Second), d.dsn(db, extra...))
	if err != nil {
		t.Fatalf("connect to %s: %v", db, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func docsExec(ctx context.Context, c *pgconn.PgConn, sql string) ([]*pgconn.Result, error) {
	return c.Exec(ctx, sql).ReadAll()
}

// docsColumns runs one command and returns the names of its result's
// columns, rows or none (pgconn's Result has them only with rows).
func docsColumns(ctx context.Context, c *pgconn.PgConn, sql string) ([]string, error) {
	mrr := c.Exec(ctx, sql)
	var cols []string
	n := 0
	for mrr.NextResult() {
		n++
		for _, fd := range mrr.ResultReader().FieldDescriptions() {
			cols = append(cols, fd.Name)
		}
		if _, err := mrr.ResultReader().Close(); err != nil {
			_ = mrr.Close()
			return nil, err
		}
	}
	if err := mrr.Close(); err != nil {
		return nil, err
	}
	if n != 1 {
		return nil, fmt.Errorf("%d results, want 1", n)
	}
	return cols, nil
}

// metricsText fetches /metrics.
func (d *docsDaemon) metricsText(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + d.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// makeEvents does what it takes for every sparse family to have a series:
// an error relayed from PostgreSQL, an eviction, a rate-limit refusal and
// a backpressure wait, a connection-limit refusal, a failed login, a
// replication connection.
func (d *docsDaemon) makeEvents(t *testing.T) {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	c := d.connect(t, pgtest.DBApp)
	if _, err := docsExec(ctx, c, "SELEC 1"); err == nil {
		t.Fatal("a syntax error went through")
	}
	// Rate limits: the second query of docs-reject is refused, that of
	// docs-wait waits.
	rj := d.connect(t, pgtest.DBApp, "application_name=docs-reject")
	if _, err := docsExec(ctx, rj, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	var pe *pgconn.PgError
	if _, err := docsExec(ctx, rj, "SELECT 1"); !errors.As(err, &pe) || pe.Code != "53400" {
		t.Fatalf("docs-reject's second query: %v, want 53400", err)
	}
	wt := d.connect(t, pgtest.DBApp, "application_name=docs-wait")
	for range 2 {
		if _, err := docsExec(ctx, wt, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	// A measured bucket: three rows put docs-measured in debt (charged),
	// and its next transaction is refused for it (the charge lands just
	// after the answer).
	ms := d.connect(t, pgtest.DBApp, "application_name=docs-measured")
	if _, err := docsExec(ctx, ms, "SELECT generate_series(1, 3)"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := docsExec(ctx, ms, "SELECT 1"); !errors.As(err, &pe) || pe.Code != "53400" {
		t.Fatalf("docs-measured in debt: %v, want 53400", err)
	}
	// A second client of "limited" is refused by its connection limit.
	d.connect(t, "limited")
	if _, err := pgconn.Connect(ctx, d.dsn("limited")); !errors.As(err, &pe) || pe.Code != "53300" {
		t.Fatalf("second client of limited: %v, want FATAL 53300", err)
	}
	// A wrong password.
	bad := strings.Replace(d.dsn(pgtest.DBApp), ":"+pgtest.Password+"@", ":wrong@", 1)
	if _, err := pgconn.Connect(ctx, bad); err == nil {
		t.Fatal("a wrong password logged in")
	}
	// A replication connection (its role has the REPLICATION attribute).
	if err := pg.Exec(ctx, "postgres", `DO $$ BEGIN CREATE ROLE docs_repl LOGIN REPLICATION PASSWORD '`+pgtest.Password+`';
		EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	repl, err := pgconn.Connect(ctx, strings.Replace(d.dsn(pgtest.DBApp, "replication=database"), pgtest.RoleApp+":", "docs_repl:", 1))
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	t.Cleanup(func() { _ = repl.Close(context.Background()) })
	// A cancel request for a client of peer 2 (its id in the pid's second
	// and third bytes), which nobody serves: it cannot be passed on.
	sendCancel(t, d.addr, 0x7f000000|2<<16, []byte{0, 0, 0, 3})
	// An eviction: RECONNECT closes the idle server connections.
	adm := d.connect(t, "pgbouncer")
	if _, err := docsExec(ctx, adm, "RECONNECT"); err != nil {
		t.Fatal(err)
	}
}

// exposed is a parsed exposition: type, label names and label values of
// each family.
type exposedFamily struct {
	typ    string
	labels map[string]map[string]bool // label -> values
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func parseExposition(text string) map[string]*exposedFamily {
	fams := map[string]*exposedFamily{}
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			fams[name] = &exposedFamily{typ: typ, labels: map[string]map[string]bool{}}
			continue
		}
		m := sampleRE.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(line, "#") {
			continue
		}
		name := m[1]
		f := fams[name]
		if f == nil {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suf); ok && fams[base] != nil {
					f = fams[base]
				}
			}
		}
		if f == nil {
			continue
		}
		for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
			if l[1] == "le" || l[1] == "quantile" {
				continue
			}
			if f.labels[l[1]] == nil {
				f.labels[l[1]] = map[string]bool{}
			}
			f.labels[l[1]][l[2]] = true
		}
	}
	return fams
}

// documentedFamily is a row of a metric table in docs/observability.md.
type documentedFamily struct {
	typ    string
	labels []string            // label names
	values map[string][]string // for "label = value, value", the values
	line   int
}

var (
	docSpanRE  = regexp.MustCompile("`([^`]*)`")
	columnName = regexp.MustCompile(`^[a-z_]+$`)
)

// documentedMetrics reads every table of docs/observability.md whose header
// is | metric | type | labels | ...
func documentedMetrics(t *testing.T) map[string]documentedFamily {
	t.Helper()
	b, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]documentedFamily{}
	inTable := false
	for i, line := range strings.Split(string(b), "\n") {
		cells := mdtable.Cells(line)
		switch {
		case len(cells) >= 3 && cells[0] == "metric" && cells[1] == "type" && cells[2] == "labels":
			inTable = true
			continue
		case !strings.HasPrefix(strings.TrimSpace(line), "|"):
			inTable = false
			continue
		case !inTable || strings.HasPrefix(strings.TrimSpace(line), "|-"):
			continue
		}
		m := docSpanRE.FindStringSubmatch(cells[0])
		if m == nil {
			t.Errorf("docs/observability.md:%d: a metric row without a metric name", i+1)
			continue
		}
		f := documentedFamily{typ: cells[1], values: map[string][]string{}, line: i + 1}
		// `database`, `user`, `state` = `active`, `waiting`, `idle`
		var after string // the label whose values follow
		for _, part := range strings.Split(cells[2], ",") {
			name, vals, hasValues := strings.Cut(part, "=")
			if hasValues {
				n := docSpanRE.FindStringSubmatch(name)
				if n == nil {
					t.Errorf("docs/observability.md:%d: cannot read the labels %q", i+1, cells[2])
					break
				}
				after = n[1]
				f.labels = append(f.labels, after)
				part = vals
			} else if after == "" {
				if n := docSpanRE.FindStringSubmatch(part); n != nil {
					f.labels = append(f.labels, n[1])
				}
				continue
			}
			for _, v := range docSpanRE.FindAllStringSubmatch(part, -1) {
				f.values[after] = append(f.values[after], v[1])
			}
		}
		if _, dup := out[m[1]]; dup {
			t.Errorf("docs/observability.md:%d: %s is documented twice", i+1, m[1])
		}
		out[m[1]] = f
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics found in docs/observability.md's tables: has their header changed?", len(out))
	}
	return out
}

// TestDocsMatchDaemon starts the real binary once and checks the docs
// against it: the metric tables and the SHOW columns.
func TestDocsMatchDaemon(t *testing.T) {
	t.Parallel()
	d := startDocsDaemon(t)
	t.Run("ShowColumns", func(t *testing.T) { testDocsShowColumns(t, d) })
	t.Run("MetricTables", func(t *testing.T) { testDocsMetricTables(t, d) })
}

// testDocsMetricTables: every poolerd_* family the real binary exposes is
// in a metric table of docs/observability.md, with its type and label
// names; every family documented there is exposed; label values that the
// table lists are the only ones exposed. The Go runtime and process
// families the page mentions are there too.
func testDocsMetricTables(t *testing.T, d *docsDaemon) {
	d.makeEvents(t)
	doc := documentedMetrics(t)
	var fams map[string]*exposedFamily
	// The wait-mode decision and the eviction are counted as they happen;
	// give the scrape a moment to see them.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		fams = parseExposition(d.metricsText(t))
		missing := 0
		for name := range doc {
			if fams[name] == nil {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "poolerd_") {
			continue
		}
		df, ok := doc[name]
		if !ok {
			t.Errorf("/metrics exposes %s (%s), which no metric table of docs/observability.md lists", name, f.typ)
			continue
		}
		if df.typ != f.typ {
			t.Errorf("docs/observability.md:%d: %s is a %s, /metrics says %s", df.line, name, df.typ, f.typ)
		}
		var got []string
		for l := range f.labels {
			got = append(got, l)
		}
		sort.Strings(got)
		want := slices.Clone(df.labels)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("docs/observability.md:%d: %s has the labels %v, /metrics %v", df.line, name, want, got)
		}
		for l, vals := range df.values {
			for v := range f.labels[l] {
				if !slices.Contains(vals, v) {
					t.Errorf("docs/observability.md:%d: %s{%s=%q} is exposed, but the table lists only %v", df.line, name, l, v, vals)
				}
			}
		}
	}
	for name, df := range doc {
		if fams[name] == nil {
			t.Errorf("docs/observability.md:%d documents %s, which /metrics does not expose", df.line, name)
		}
	}
	// "plus the Go runtime (go_*), process (process_*) and go_build_info
	// metrics of the Prometheus client library"
	for _, want := range []string{"go_build_info", "go_goroutines", "process_cpu_seconds_total"} {
		if fams[want] == nil {
			t.Errorf("/metrics has no %s, which docs/observability.md promises", want)
		}
	}
}

// documentedColumns reads §2 of docs/admin-console-reference.md: for each
// SHOW command, its columns in order, PgBouncer's and poolerd's additions.
func documentedColumns(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/admin-console-reference.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## 2. ")
	end := strings.Index(text, "\n## 3. ")
	if start < 0 || end < start {
		t.Fatal("docs/admin-console-reference.md: no section 2 (SHOW commands)")
	}
	heading := regexp.MustCompile(`^### 2\.\d+ SHOW ([A-Z_]+)(?: / SHOW ([A-Z_]+))?`)
	addition := regexp.MustCompile("SHOW ([A-Z_]+) has an? [0-9a-z]+ column, `([a-z_]+)`")
	out := map[string][]string{}
	sections := strings.Split(text[start:end], "\n### ")
	for _, sec := range sections[1:] {
		sec = "### " + sec
		lines := strings.Split(sec, "\n")
		h := heading.FindStringSubmatch(lines[0])
		if h == nil || h[1] == "HELP" {
			continue // not one command's columns
		}
		var cols []string
		// A table | # | column | ...
		for i, ln := range lines {
			c := mdtable.Cells(ln)
			if len(c) >= 2 && c[0] == "#" && c[1] == "column" {
				for _, row := range lines[i+2:] {
					rc := mdtable.Cells(row)
					if len(rc) < 2 {
						break
					}
					cols = append(cols, strings.Trim(rc[1], "`"))
				}
				break
			}
		}
		// Else the heading's list: "— `key`(s), `value`(s); 3 rows"
		if cols == nil {
			if _, list, ok := strings.Cut(lines[0], "—"); ok {
				list, _, _ = strings.Cut(list, ";")
				list, _, _ = strings.Cut(list, "(C ") // the source it cites
				for _, m := range docSpanRE.FindAllStringSubmatch(list, -1) {
					if columnName.MatchString(m[1]) { // not a format such as `sNNN`
						cols = append(cols, m[1])
					}
				}
			}
		}
		// Else the first sentence of the section's text.
		if cols == nil {
			body := strings.Join(lines[1:], "\n")
			body = strings.TrimSpace(body)
			if i := strings.Index(body, ". "); i >= 0 {
				body = body[:i]
			}
			for _, m := range docSpanRE.FindAllStringSubmatch(body, -1) {
				cols = append(cols, m[1])
			}
		}
		for _, m := range addition.FindAllStringSubmatch(strings.ReplaceAll(sec, "\n", " "), -1) {
			out[m[1]] = append(out[m[1]], m[2]) // after PgBouncer's, filled below
		}
		for _, cmd := range h[1:] {
			if cmd != "" {
				out[cmd] = append(slices.Clone(cols), out[cmd]...)
			}
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d SHOW commands found in docs/admin-console-reference.md §2", len(out))
	}
	return out
}

// documentedCounts reads the column counts docs/observability.md gives:
// **SHOW CLIENTS** (22 columns …), **SHOW STATS, STATS_TOTALS,
// STATS_AVERAGES** (23, 12 and 12 columns).
func documentedCounts(t *testing.T) map[string]int {
	t.Helper()
	b, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`\*\*SHOW ([A-Z_, ]+)\*\* \(([0-9, and]+) columns`)
	out := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		names := strings.Split(m[1], ", ")
		nums := regexp.MustCompile(`[0-9]+`).FindAllString(m[2], -1)
		if len(nums) != len(names) && len(nums) != 1 {
			t.Errorf("docs/observability.md: cannot read %q", m[0])
			continue
		}
		for i, n := range names {
			v := nums[0]
			if len(nums) > 1 {
				v = nums[i]
			}
			out[n], _ = strconv.Atoi(v)
		}
	}
	if len(out) < 6 {
		t.Fatalf("only %d column counts found in docs/observability.md", len(out))
	}
	return out
}

// testDocsShowColumns: each SHOW command's columns, as the admin console of
// the real binary sends them, are the list in
// docs/admin-console-reference.md §2 (PgBouncer's, then poolerd's
// additions) and the count docs/observability.md gives. A command the
// console does not implement must be listed as such in observability.md.
func testDocsShowColumns(t *testing.T, d *docsDaemon) {
	adm := d.connect(t, "pgbouncer")
	d.connect(t, pgtest.DBApp) // a client and a pool, so that every SHOW has rows
	obs, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	_, notImpl, _ := strings.Cut(string(obs), "Not implemented: ")
	notImpl, _, _ = strings.Cut(notImpl, "\n\n")
	counts := documentedCounts(t)
	docCols := documentedColumns(t)
	for cmd, want := range docCols {
		got, err := docsColumns(ctxTimeout(t, 15*time.Second), adm, "SHOW "+cmd)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (strings.HasPrefix(pe.Message, "invalid command") || strings.HasSuffix(pe.Message, "is not supported by poolerd")) {
			if !strings.Contains(notImpl, "`"+cmd+"`") && !strings.Contains(notImpl, "`SHOW "+cmd+"`") {
				t.Errorf("SHOW %s: %s, but docs/observability.md does not list it as not implemented", cmd, pe.Message)
			}
			continue
		}
		if err != nil {
			t.Errorf("SHOW %s: %v", cmd, err)
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("SHOW %s sends the columns\n  %v\ndocs/admin-console-reference.md lists\n  %v", cmd, got, want)
		}
		if n, ok := counts[cmd]; ok && n != len(got) {
			t.Errorf("docs/observability.md: SHOW %s has %d columns, the console sends %d", cmd, n, len(got))
		}
	}
	for cmd := range counts {
		if _, ok := docCols[cmd]; !ok {
			t.Errorf("docs/observability.md counts the columns of SHOW %s, which docs/admin-console-reference.md does not list", cmd)
		}
	}
}
