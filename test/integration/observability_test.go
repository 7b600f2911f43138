package integration

// Tests of the HTTP endpoints (internal/health, wired as cmd/poolerd does):
// /healthz, /readyz following PostgreSQL's availability, /stats matching
// the pools, /metrics passing promtool with every family the metrics
// design lists, and /debug/pprof/ only when enabled.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/observe"
	"github.com/poolerd/poolerd/test/faultproxy"
	"github.com/poolerd/poolerd/test/pgtest"
)

// obGet fetches path from p's HTTP server.
func obGet(t *testing.T, p *obInst, path string) (int, []byte) {
	t.Helper()
	resp, err := p.hc.Get(p.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, body
}

// obReport fetches and decodes /stats.
func obReport(t *testing.T, p *obInst) observe.HealthReport {
	t.Helper()
	code, body := obGet(t, p, "/stats")
	if code != http.StatusOK {
		t.Fatalf("/stats: %d %s", code, body)
	}
	var r observe.HealthReport
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("/stats: %v\n%s", err, body)
	}
	return r
}

// obFaultProxy starts a fault proxy in front of pg, closed when the test
// ends (after the poolerd started later).
func obFaultProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	px, err := faultproxy.Start(pg.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	return px
}

// obMetrics is a parsed text exposition.
type obMetrics struct {
	types   map[string]string // family -> type
	samples []obSample
}

type obSample struct {
	name   string
	labels map[string]string
	value  float64
}

// obParseMetrics reads the text format (enough of it for poolerd's and the
// Go collectors' output).
func obParseMetrics(t *testing.T, text string) obMetrics {
	t.Helper()
	m := obMetrics{types: map[string]string{}}
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			m.types[name] = typ
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		s := obSample{labels: map[string]string{}}
		var valuePart string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			s.name = line[:i]
			j := i + 1
			for j < len(line) && line[j] != '}' {
				eq := strings.IndexByte(line[j:], '=')
				if eq < 0 {
					t.Fatalf("bad metric line %q", line)
				}
				key := line[j : j+eq]
				j += eq + 2 // past ="
				var b strings.Builder
				for j < len(line) && line[j] != '"' {
					if line[j] == '\\' && j+1 < len(line) {
						j++
					}
					b.WriteByte(line[j])
					j++
				}
				s.labels[key] = b.String()
				j++ // past the closing quote
				if j < len(line) && line[j] == ',' {
					j++
				}
			}
			valuePart = strings.TrimSpace(line[j+1:])
		} else {
			name, v, _ := strings.Cut(line, " ")
			s.name, valuePart = name, v
		}
		if f := strings.Fields(valuePart); len(f) > 0 {
			v, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				t.Fatalf("bad value in %q: %v", line, err)
			}
			s.value = v
		}
		m.samples = append(m.samples, s)
	}
	return m
}

// get returns the value of the first sample of name whose labels include
// the given k=v pairs.
func (m obMetrics) get(name string, kv ...string) (float64, bool) {
samples:
	for _, s := range m.samples {
		if s.name != name {
			continue
		}
		for _, p := range kv {
			k, v, _ := strings.Cut(p, "=")
			if s.labels[k] != v {
				continue samples
			}
		}
		return s.value, true
	}
	return 0, false
}

// labelValues lists the values label takes in the samples of name.
func (m obMetrics) labelValues(name, label string) []string {
	var out []string
	for _, s := range m.samples {
		if v, ok := s.labels[label]; s.name == name && ok && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

// obScrape fetches and parses /metrics.
func obScrape(t *testing.T, p *obInst) (string, obMetrics) {
	t.Helper()
	code, body := obGet(t, p, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	return string(body), obParseMetrics(t, string(body))
}

// ---------------------------------------------------------------------------

// /readyz follows PostgreSQL: 503 with a reason within 2 s of it going
// away, 200 again soon after it returns; /healthz stays 200.
func TestObsReadyzFollowsUpstream(t *testing.T) {
	t.Parallel()
	px := obFaultProxy(t)
	p := obStart(t, obOpts{http: true, metrics: true, mutate: func(c *config.Config) {
		c.Upstream = lcUpstreamVia(px)
		c.MinSize = 2
		c.ReconnectBackoffBase = 200 * time.Millisecond
		c.ReconnectBackoffMax = time.Second
	}})
	eventually(t, 5*time.Second, "/readyz 200", func() bool {
		code, _ := obGet(t, p, "/readyz")
		return code == http.StatusOK
	})
	code, body := obGet(t, p, "/readyz")
	var ready map[string]string
	if err := json.Unmarshal(body, &ready); err != nil || ready["status"] != "ready" || code != 200 {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	eventually(t, 5*time.Second, "2 idle server connections", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Idle == 2
	})
	c := p.connect(t, txExecMode)
	obExec(t, c, "SELECT 1")

	// /healthz is polled throughout.
	stop := make(chan struct{})
	var mu sync.Mutex
	var bad []string
	polls := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			resp, err := p.hc.Get(p.base + "/healthz")
			mu.Lock()
			polls++
			if err != nil {
				bad = append(bad, err.Error())
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), `"alive"`) {
					bad = append(bad, fmt.Sprintf("%d %s", resp.StatusCode, b))
				}
			}
			mu.Unlock()
		}
	}()

	// PostgreSQL goes away.
	if err := px.Pause(); err != nil {
		t.Fatal(err)
	}
	px.ResetAll()
	t0 := time.Now()
	var notReady []byte
	for {
		code, body := obGet(t, p, "/readyz")
		if code == http.StatusServiceUnavailable {
			notReady = body
			break
		}
		if code != http.StatusOK {
			t.Fatalf("/readyz answered %d %s", code, body)
		}
		if time.Since(t0) > 2*time.Second {
			t.Fatalf("/readyz still 200 2s after PostgreSQL went away (pool %+v)", p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Stats)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/readyz 503 after %s: %s", time.Since(t0).Round(time.Millisecond), bytes.TrimSpace(notReady))
	var nr map[string]string
	if err := json.Unmarshal(notReady, &nr); err != nil {
		t.Fatalf("/readyz 503 body is not JSON: %v\n%s", err, notReady)
	}
	if nr["status"] != "not ready" || !strings.Contains(nr["reason"], "pool app/app is") {
		t.Errorf("/readyz 503 body %v, want status not ready and a reason naming the pool", nr)
	}
	if code, body := obGet(t, p, "/healthz"); code != 200 {
		t.Errorf("/healthz while PostgreSQL is away: %d %s", code, body)
	}
	// The other views agree.
	_, m := obScrape(t, p)
	if v, ok := m.get("poolerd_ready"); !ok || v != 0 {
		t.Errorf("poolerd_ready = %v (%v) while not ready", v, ok)
	}
	rep := obReport(t, p)
	if rep.Status == "healthy" || rep.Database == nil || rep.Database.Status == "connected" || rep.Database.LastError == nil {
		b, _ := json.Marshal(rep)
		t.Errorf("/stats while PostgreSQL is away: %s", b)
	}

	// PostgreSQL returns.
	if err := px.Resume(); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	for {
		code, body := obGet(t, p, "/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Since(t1) > 5*time.Second {
			t.Fatalf("/readyz still %d %s 5s after PostgreSQL came back", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/readyz 200 again %s after PostgreSQL came back", time.Since(t1).Round(time.Millisecond))
	_, m = obScrape(t, p)
	if v, _ := m.get("poolerd_ready"); v != 1 {
		t.Errorf("poolerd_ready = %v when ready", v)
	}
	if v, _ := m.get("poolerd_pool_health", "database=app", "state=healthy"); v != 1 {
		if v, _ := m.get("poolerd_pool_health", "database=app", "state=recovering"); v != 1 {
			t.Errorf("poolerd_pool_health neither healthy nor recovering after recovery")
		}
	}
	if v, _ := m.get("poolerd_server_connect_failures_total", "database=app"); v < 1 {
		t.Errorf("poolerd_server_connect_failures_total = %v after an outage", v)
	}

	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 || polls < 1 {
		t.Errorf("/healthz: %d polls, failures %v", polls, bad)
	}
}

// /stats reports the pool as it is under load, quickly; so do the metrics.
func TestObsStatsUnderLoad(t *testing.T) {
	t.Parallel()
	p := obStart(t, obOpts{http: true, metrics: true, mutate: func(c *config.Config) { c.MaxSize = 3 }})
	ctx := ctxTimeout(t, 30*time.Second)
	// Everyone logs in first (a login may need a server round trip).
	var holders, waiters []*pgx.Conn
	for i := range 3 {
		holders = append(holders, obConn(t, p.instance, pgtest.DBApp, fmt.Sprintf("obhold%d", i)))
	}
	for i := range 2 {
		waiters = append(waiters, obConn(t, p.instance, pgtest.DBApp, fmt.Sprintf("obwait%d", i)))
	}
	obConn(t, p.instance, pgtest.DBApp, "obidle")
	for _, c := range holders {
		obBegin(t, c)
	}
	var waits []<-chan error
	for _, w := range waiters {
		waits = append(waits, obAsync(func() error { _, err := w.Exec(ctx, "SELECT 1"); return err }))
	}
	eventually(t, 5*time.Second, "2 waiting clients", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Waiting == 2
	})

	rep := obReport(t, p)
	st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp)
	var ph *observe.PoolHealth
	for i := range rep.Pools {
		if rep.Pools[i].Name == pgtest.DBApp && rep.Pools[i].User == pgtest.RoleApp {
			ph = &rep.Pools[i]
		}
	}
	if ph == nil {
		t.Fatalf("/stats has no app/app pool: %+v", rep)
	}
	got := ph.Pool
	if got.Total != 3 || got.Active != 3 || got.Idle != 0 || got.Waiting != 2 || got.MaxSize != 3 {
		t.Errorf("/stats pool %+v, want total 3, active 3, idle 0, waiting 2, max_size 3", got)
	}
	if got.Total != st.Total || got.Active != st.Active || got.Idle != st.Idle || got.Waiting != st.Waiting {
		t.Errorf("/stats pool %+v differs from srv.Pools() %+v", got, st.Stats)
	}
	if rep.Clients != 6 || rep.Status != "healthy" || rep.Database == nil || rep.Database.Name != pgtest.DBApp ||
		rep.Database.Status != "connected" || rep.Database.Pool.Active != 3 {
		b, _ := json.Marshal(rep)
		t.Errorf("/stats: %s\nwant 6 clients, status healthy, database app connected", b)
	}
	if got.PeakActiveConnections < 3 || got.TotalAcquisitions < 3 {
		t.Errorf("/stats peak %d acquisitions %d", got.PeakActiveConnections, got.TotalAcquisitions)
	}

	// The metrics say the same.
	_, m := obScrape(t, p)
	for _, c := range []struct {
		name  string
		kv    []string
		value float64
	}{
		{"poolerd_clients", []string{"database=app", "user=app", "state=active"}, 3},
		{"poolerd_clients", []string{"database=app", "user=app", "state=waiting"}, 2},
		{"poolerd_clients", []string{"database=app", "user=app", "state=idle"}, 1},
		{"poolerd_waiting_clients", []string{"database=app", "user=app"}, 2},
		{"poolerd_server_connections", []string{"database=app", "state=active"}, 3},
		{"poolerd_server_connections", []string{"database=app", "state=idle"}, 0},
		{"poolerd_client_connections", nil, 6},
		{"poolerd_parked_clients", nil, 1}, // obidle: logged in, sent nothing
		{"poolerd_ready", nil, 1},
	} {
		if v, ok := m.get(c.name, c.kv...); !ok || v != c.value {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.kv, v, ok, c.value)
		}
	}

	// /stats is answered from memory: fast.
	durs := make([]time.Duration, 50)
	for i := range durs {
		t0 := time.Now()
		code, _ := obGet(t, p, "/stats")
		durs[i] = time.Since(t0)
		if code != 200 {
			t.Fatalf("/stats %d", code)
		}
	}
	slices.Sort(durs)
	t.Logf("/stats under load: median %s, max %s", durs[len(durs)/2], durs[len(durs)-1])
	if durs[len(durs)/2] > 50*time.Millisecond {
		t.Errorf("median /stats took %s", durs[len(durs)/2])
	}

	for _, c := range holders {
		obExec(t, c, "COMMIT")
	}
	for _, w := range waits {
		if err := obDone(t, w, 5*time.Second, "a waiting query"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "an idle pool in /stats", func() bool {
		r := obReport(t, p)
		return r.Database != nil && r.Database.Pool.Active == 0 && r.Database.Pool.Waiting == 0 && r.Database.Pool.Idle == 3
	})
}

// /metrics after traffic, errors and timeouts passes promtool and has every
// family poolerd documents.
func TestObsMetricsPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed")
	}
	p := obStart(t, obOpts{http: true, metrics: true, mutate: func(c *config.Config) {
		c.MaxSize = 1
		c.CheckoutTimeout = 300 * time.Millisecond
		c.QueryTimeout = 300 * time.Millisecond
	}})
	ctx := ctxTimeout(t, 30*time.Second)
	a := obConn(t, p.instance, pgtest.DBApp, "obmetA")
	b := obConn(t, p.instance, pgtest.DBApp, "obmetB")
	for range 5 {
		obExec(t, a, "SELECT 1")
	}
	obExec(t, a, "BEGIN")
	obExec(t, a, "SELECT 2")
	obExec(t, a, "COMMIT")
	// An error from PostgreSQL: class 22.
	if _, err := a.Exec(ctx, "SELECT 1/0"); pgCode(err) != "22012" {
		t.Fatalf("SELECT 1/0: %v", err)
	}
	// A checkout timeout: class 53.
	obBegin(t, a)
	if _, err := b.Exec(ctx, "SELECT 1"); pgCode(err) != "53300" {
		t.Fatalf("query with the only server held: %v, want 53300", err)
	}
	obExec(t, a, "COMMIT")
	// A query timeout: class 57.
	if _, err := a.Exec(ctx, "SELECT pg_sleep(3)"); pgCode(err) != "57014" {
		t.Fatalf("query past query_timeout: %v, want 57014", err)
	}
	// An eviction: a client leaves in the middle of a transaction.
	lc := obConn(t, p.instance, pgtest.DBApp, "obleaver")
	obBegin(t, lc)
	if err := lc.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the eviction", func() bool {
		return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Evictions["client_left_in_transaction"] >= 1
	})
	obExec(t, b, "SELECT 1")
	// A FATAL from poolerd itself: class 08.
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	obConn(t, p.instance, pgtest.DBApp, "obkilled")
	clients := obShow(t, adm, "SHOW CLIENTS")
	obCmd(t, adm, "KILL_CLIENT "+clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "obkilled"), "id"), "KILL_CLIENT")

	// A wrong password.
	if pe := obLoginErr(t, p.dsn(pgtest.RoleApp, "wrong", pgtest.DBApp)); pe.Code != "28P01" {
		t.Fatalf("wrong password: %s %q", pe.Code, pe.Message)
	}
	// A pool miss: b waits while a holds the pool's one connection in a
	// transaction; a's backend is terminated and b gets a fresh connection.
	// (Earlier misses depend on whether the pool reopened a connection
	// before a request asked for one.)
	obBegin(t, a)
	var pidA string
	if err := a.QueryRow(ctx, "SELECT pg_backend_pid()::text").Scan(&pidA); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		// The replacement connection may take longer than checkout_timeout
		// to open on a loaded machine: b's wait is what counts (a miss),
		// so it may ask again.
		var err error
		for range 5 {
			var pe *pgconn.PgError
			if _, err = b.Exec(ctx, "SELECT 1"); !errors.As(err, &pe) || pe.Code != "53300" {
				break
			}
		}
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := pg.Exec(ctx, "postgres", "SELECT pg_terminate_backend("+pidA+")"); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("b's request while a's backend was terminated: %v", err)
	}

	text, m := obScrape(t, p)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	} else {
		t.Logf("promtool check metrics: ok (%d bytes, %d families)", len(text), len(m.types))
	}

	for name, typ := range map[string]string{
		"poolerd_server_connections":            "gauge",
		"poolerd_clients":                       "gauge",
		"poolerd_client_connections":            "gauge",
		"poolerd_parked_clients":                "gauge",
		"poolerd_waiting_clients":               "gauge",
		"poolerd_checkout_wait_seconds":         "histogram",
		"poolerd_checkouts_total":               "counter",
		"poolerd_pool_hits_total":               "counter",
		"poolerd_pool_misses_total":             "counter",
		"poolerd_server_recycles_total":         "counter",
		"poolerd_server_evictions_total":        "counter",
		"poolerd_server_connect_attempts_total": "counter",
		"poolerd_server_connect_failures_total": "counter",
		"poolerd_reconnect_backoff_seconds":     "gauge",
		"poolerd_pool_health":                   "gauge",
		"poolerd_pool_paused":                   "gauge",
		"poolerd_timeouts_total":                "counter",
		"poolerd_validation_failures_total":     "counter",
		"poolerd_leaks_total":                   "counter",
		"poolerd_transaction_duration_seconds":  "histogram",
		"poolerd_query_duration_seconds":        "histogram",
		"poolerd_client_bytes_received_total":   "counter",
		"poolerd_client_bytes_sent_total":       "counter",
		"poolerd_client_errors_total":           "counter",
		"poolerd_unavailable_total":             "counter",
		"poolerd_login_timeouts_total":          "counter",
		"poolerd_auth_failures_total":           "counter",
		"poolerd_pool_max_size":                 "gauge",
		"poolerd_ready":                         "gauge",
		"poolerd_build_info":                    "gauge",
		"go_goroutines":                         "gauge",
		"go_gc_duration_seconds":                "summary",
		"process_cpu_seconds_total":             "counter",
		"process_resident_memory_bytes":         "gauge",
	} {
		if got, ok := m.types[name]; !ok {
			t.Errorf("no family %s", name)
		} else if got != typ {
			t.Errorf("%s is a %s, want %s", name, got, typ)
		}
	}
	for name, want := range map[string][]string{
		"poolerd_server_connections":    {"active", "idle", "opening"},
		"poolerd_clients":               {"active", "idle", "waiting"},
		"poolerd_server_recycles_total": {"idle_timeout", "max_lifetime", "max_queries", "max_uses"},
		"poolerd_pool_health":           {"degraded", "healthy", "initializing", "recovering", "shutting_down", "terminated", "unhealthy"},
	} {
		label := "state"
		if strings.HasSuffix(name, "_total") {
			label = "reason"
		}
		if got := m.labelValues(name, label); !slices.Equal(got, want) {
			t.Errorf("%s %s values %v, want %v", name, label, got, want)
		}
	}
	kinds := m.labelValues("poolerd_timeouts_total", "kind")
	for _, k := range []string{"checkout", "query", "transaction", "idle_transaction", "client_idle", "server_response"} {
		if !slices.Contains(kinds, k) {
			t.Errorf("poolerd_timeouts_total has no kind %q (has %v)", k, kinds)
		}
	}
	app := []string{"database=app", "user=app"}
	with := func(kv ...string) []string { return append(slices.Clone(app), kv...) }
	for _, c := range []struct {
		name string
		kv   []string
		min  float64
	}{
		{"poolerd_timeouts_total", with("kind=checkout"), 1},
		{"poolerd_timeouts_total", with("kind=query"), 1},
		{"poolerd_client_errors_total", with("class=22"), 1},
		{"poolerd_client_errors_total", with("class=53"), 1},
		{"poolerd_client_errors_total", with("class=57"), 1},
		{"poolerd_client_errors_total", with("class=08"), 1},
		{"poolerd_server_evictions_total", with("reason=client_left_in_transaction"), 1},
		{"poolerd_checkouts_total", app, 10},
		{"poolerd_pool_hits_total", app, 1},
		{"poolerd_pool_misses_total", app, 1},
		{"poolerd_server_connect_attempts_total", app, 2},
		{"poolerd_pool_health", with("state=healthy"), 1},
		{"poolerd_client_bytes_received_total", app, 100},
		{"poolerd_client_bytes_sent_total", app, 100},
		{"poolerd_checkout_wait_seconds_count", app, 10},
		{"poolerd_query_duration_seconds_count", app, 10},
		{"poolerd_transaction_duration_seconds_count", app, 8},
		{"poolerd_transaction_duration_seconds_sum", app, 0.3}, // the pg_sleep cancelled at 300ms
		{"poolerd_checkout_wait_seconds_sum", app, 0.3},        // the checkout timeout
		{"poolerd_build_info", nil, 1},
		{"poolerd_auth_failures_total", nil, 1},
		{"poolerd_pool_max_size", app, 1},
		{"go_goroutines", nil, 1},
		{"process_cpu_seconds_total", nil, 0},
	} {
		if v, ok := m.get(c.name, c.kv...); !ok || v < c.min {
			t.Errorf("%s%v = %v (present %v), want >= %v", c.name, c.kv, v, ok, c.min)
		}
	}
	for _, c := range []struct {
		name string
		kv   []string
	}{
		{"poolerd_server_connect_failures_total", app},
		{"poolerd_validation_failures_total", app},
		{"poolerd_leaks_total", app},
		{"poolerd_reconnect_backoff_seconds", app},
		{"poolerd_pool_paused", app},
		{"poolerd_pool_health", with("state=unhealthy")},
	} {
		if v, ok := m.get(c.name, c.kv...); !ok || v != 0 {
			t.Errorf("%s%v = %v (present %v), want 0", c.name, c.kv, v, ok)
		}
	}
	// The histograms of the pool have their buckets.
	for _, h := range []string{"poolerd_checkout_wait_seconds", "poolerd_query_duration_seconds", "poolerd_transaction_duration_seconds"} {
		if v, ok := m.get(h+"_bucket", with("le=+Inf")...); !ok || v < 1 {
			t.Errorf("%s has no +Inf bucket with samples", h)
		}
	}
}

// /debug/pprof/ is served only with http_pprof.
func TestObsPprof(t *testing.T) {
	t.Parallel()
	on := obStart(t, obOpts{http: true, mutate: func(c *config.Config) { c.HTTPPprof = true }})
	off := obStart(t, obOpts{http: true})
	code, body := obGet(t, on, "/debug/pprof/")
	if code != 200 || !strings.Contains(string(body), "goroutine") {
		t.Errorf("/debug/pprof/ with http_pprof: %d", code)
	}
	if code, _ := obGet(t, on, "/debug/pprof/goroutine?debug=1"); code != 200 {
		t.Errorf("/debug/pprof/goroutine with http_pprof: %d", code)
	}
	if code, _ := obGet(t, on, "/debug/pprof/cmdline"); code != 200 {
		t.Errorf("/debug/pprof/cmdline with http_pprof: %d", code)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine", "/debug/pprof/cmdline"} {
		if code, _ := obGet(t, off, path); code != http.StatusNotFound {
			t.Errorf("%s without http_pprof: %d, want 404", path, code)
		}
	}
	// The other endpoints are there either way.
	for _, p := range []*obInst{on, off} {
		eventually(t, 5*time.Second, "ready", func() bool { ok, _ := p.srv.Ready(); return ok })
		for _, path := range []string{"/healthz", "/readyz", "/stats", "/metrics"} {
			if code, body := obGet(t, p, path); code != 200 {
				t.Errorf("%s: %d %s", path, code, body)
			}
		}
	}
}
