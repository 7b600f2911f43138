package observe

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/proxy"
)

func poolOf(database, user string, state pool.State, paused bool) proxy.PoolStats {
	return proxy.PoolStats{Database: database, User: user, Stats: pool.Stats{State: state, Paused: paused}}
}

func TestReportStatus(t *testing.T) {
	healthy := poolOf("app", "app", pool.Healthy, false)
	for _, tc := range []struct {
		name       string
		src        *fakeSource
		wantStatus string
	}{
		{"all healthy", &fakeSource{ready: true, configured: []proxy.PoolStats{healthy}}, "healthy"},
		{"recovering counts as degraded", &fakeSource{ready: true, configured: []proxy.PoolStats{healthy, poolOf("b", "u", pool.Recovering, false)}}, "degraded"},
		{"unhealthy configured pool", &fakeSource{configured: []proxy.PoolStats{healthy, poolOf("b", "u", pool.Unhealthy, false)}}, "unhealthy"},
		{"a pool not configured does not count", &fakeSource{ready: true, configured: []proxy.PoolStats{healthy},
			pools: []proxy.PoolStats{poolOf("other", "u", pool.Unhealthy, false)}}, "healthy"},
		{"paused pool", &fakeSource{configured: []proxy.PoolStats{poolOf("app", "app", pool.Healthy, true)}}, "paused"},
		{"initializing", &fakeSource{configured: []proxy.PoolStats{poolOf("app", "app", pool.Initializing, false)}}, "starting"},
		{"not ready yet, pools healthy", &fakeSource{configured: []proxy.PoolStats{healthy}}, "starting"},
		{"global pause", &fakeSource{paused: true, configured: []proxy.PoolStats{healthy}}, "paused"},
		{"shutting down wins", &fakeSource{shutting: true, paused: true, configured: []proxy.PoolStats{poolOf("app", "app", pool.Unhealthy, false)}}, "shutting_down"},
		{"terminated pools are ignored", &fakeSource{ready: true, configured: []proxy.PoolStats{healthy, poolOf("b", "u", pool.Terminated, false)}}, "healthy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.src
			// Every configured pool is a pool too.
			src.pools = append(src.pools, src.configured...)
			if r := Report(src); r.Status != tc.wantStatus {
				t.Errorf("status %q, want %q", r.Status, tc.wantStatus)
			}
		})
	}
}

// TestReportDocument pins the /stats JSON: field names, the pools sorted by
// database and user, database being the first configured pool.
func TestReportDocument(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	checked := created.Add(time.Minute)
	a := proxy.PoolStats{Database: "app", User: "app", Stats: pool.Stats{
		State: pool.Healthy, MaxSize: 20, MinSize: 2, EffectiveMinSize: 2, Total: 3, Idle: 1, Active: 2, Waiting: 1,
		Acquisitions: 4, Releases: 3, WaitTotal: 10 * time.Millisecond, WaitMax: 7500 * time.Microsecond,
		PeakActive: 3, Created: created, LastHealthCheck: checked, LastCheckLatency: 1500 * time.Microsecond}}
	b := proxy.PoolStats{Database: "app", User: "aaa", Stats: pool.Stats{
		State: pool.Unhealthy, LastError: "connection refused", NextRetry: checked, Created: created}}
	src := &fakeSource{ready: true, clients: 5, configured: []proxy.PoolStats{a}, pools: []proxy.PoolStats{a, b}}
	r := Report(src)
	r.Timestamp = created
	got, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	pa := `{"name":"app","user":"app","status":"connected","health":"healthy","pool":{"total":3,"idle":1,"active":2,"waiting":1,"max_size":20,"min_size":2,"effective_min_size":2,"total_acquisitions":4,"total_releases":3,"avg_acquisition_time_ms":2.5,"peak_active_connections":3,"peak_wait_time_ms":7.5,"pool_created_at":"2026-01-02T03:04:05Z"},"latency_ms":1.5,"last_error":null,"last_health_check":"2026-01-02T03:05:05Z"}`
	pb := `{"name":"app","user":"aaa","status":"disconnected","health":"unhealthy","pool":{"total":0,"idle":0,"active":0,"waiting":0,"max_size":0,"min_size":0,"effective_min_size":0,"total_acquisitions":0,"total_releases":0,"avg_acquisition_time_ms":0,"peak_active_connections":0,"peak_wait_time_ms":0,"pool_created_at":"2026-01-02T03:04:05Z"},"latency_ms":null,"last_error":"connection refused","last_health_check":null,"next_retry":"2026-01-02T03:05:05Z"}`
	want := `{"status":"healthy","timestamp":"2026-01-02T03:04:05Z","clients":5,"database":` + pa + `,"pools":[` + pb + `,` + pa + `]}`
	if string(got) != want {
		t.Errorf("/stats document\n got %s\nwant %s", got, want)
	}

	// No pool at all: pools is an empty list, not null; no database.
	got, _ = json.Marshal(Report(&fakeSource{}))
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	if p, ok := m["pools"].([]any); !ok || len(p) != 0 {
		t.Errorf("pools of an empty report = %v, want []", m["pools"])
	}
	if _, ok := m["database"]; ok {
		t.Errorf("an empty report has a database: %s", got)
	}
}
