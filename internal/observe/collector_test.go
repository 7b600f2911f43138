package observe

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/proxy"
)

// TestCollector: a scrape reads the snapshots as they are at that moment,
// with the documented names, labels and types.
func TestCollector(t *testing.T) {
	ps := proxy.PoolStats{Database: "app", User: "u", Mode: "transaction",
		Stats: pool.Stats{State: pool.Degraded, Active: 2, Waiting: 1, Idle: 3, Acquisitions: 9,
			Evictions: map[string]uint64{"broken": 2}},
		SessionTimeouts: map[string]uint64{"query": 4},
		Clients:         5,
		Traffic:         proxy.Totals{Received: 100, Sent: 200, ClientParses: 7, ServerParses: 3, ClientLogins: 9},
		Pins:            []proxy.PinStats{{Reason: "temp_table", Now: 1, Total: 6}},
		ClientErrors:    map[string]uint64{"53": 2},
	}
	src := &fakeSource{ready: true, clients: 6, parked: 4, authFailures: 1, pools: []proxy.PoolStats{ps},
		repl: []proxy.ReplicationCount{{Database: "app", User: "repl", Mode: "physical", Count: 2}}}
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, src); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP poolerd_client_connections Client connections logged in, over all pools and the admin console.
# TYPE poolerd_client_connections gauge
poolerd_client_connections 6
# HELP poolerd_parked_clients Idle client sessions held without a goroutine (see docs/architecture.md).
# TYPE poolerd_parked_clients gauge
poolerd_parked_clients 4
# HELP poolerd_replication_connections Replication connections (replication=true: physical, replication=database: logical), each with its own server connection.
# TYPE poolerd_replication_connections gauge
poolerd_replication_connections{database="app",mode="physical",user="repl"} 2
# HELP poolerd_auth_failures_total Client logins refused for a wrong password or unknown user (28P01).
# TYPE poolerd_auth_failures_total counter
poolerd_auth_failures_total 1
# HELP poolerd_ready 1 when poolerd is ready to serve clients (as /readyz), else 0.
# TYPE poolerd_ready gauge
poolerd_ready 1
# HELP poolerd_clients Logged-in clients by state: active (holding a server connection), waiting (for one), idle.
# TYPE poolerd_clients gauge
poolerd_clients{database="app",state="active",user="u"} 2
poolerd_clients{database="app",state="idle",user="u"} 2
poolerd_clients{database="app",state="waiting",user="u"} 1
# HELP poolerd_server_evictions_total Server connections closed because they could not be reused, by reason.
# TYPE poolerd_server_evictions_total counter
poolerd_server_evictions_total{database="app",reason="broken",user="u"} 2
# HELP poolerd_timeouts_total Timeouts by kind: checkout, query, transaction, idle_transaction, client_idle, server_response, pinned_idle, lease, lease_checkout.
# TYPE poolerd_timeouts_total counter
poolerd_timeouts_total{database="app",kind="checkout",user="u"} 0
poolerd_timeouts_total{database="app",kind="query",user="u"} 4
# HELP poolerd_client_bytes_sent_total Bytes sent to clients.
# TYPE poolerd_client_bytes_sent_total counter
poolerd_client_bytes_sent_total{database="app",user="u"} 200
# HELP poolerd_client_logins_total Successful client logins.
# TYPE poolerd_client_logins_total counter
poolerd_client_logins_total{database="app",user="u"} 9
# HELP poolerd_prepared_server_parses_total Parse messages sent to PostgreSQL: clients' unnamed and first-time statements, and statements prepared again on another server connection.
# TYPE poolerd_prepared_server_parses_total counter
poolerd_prepared_server_parses_total{database="app",user="u"} 3
# HELP poolerd_pinned_clients Transaction- or statement-mode clients pinned to their server connection by session state, by reason.
# TYPE poolerd_pinned_clients gauge
poolerd_pinned_clients{database="app",reason="temp_table",user="u"} 1
# HELP poolerd_pins_total Clients pinned to their server connection, by reason.
# TYPE poolerd_pins_total counter
poolerd_pins_total{database="app",reason="temp_table",user="u"} 6
# HELP poolerd_client_errors_total Errors sent to clients, by SQLSTATE class (first two characters).
# TYPE poolerd_client_errors_total counter
poolerd_client_errors_total{class="53",database="app",user="u"} 2
`
	got := scrape(t, reg)
	for _, fam := range strings.Split(strings.TrimSpace(want), "\n# HELP ") {
		fam = "# HELP " + strings.TrimPrefix(fam, "# HELP ") + "\n"
		name := strings.Fields(fam)[2]
		if got[name] != fam {
			t.Errorf("%s:\n got %s\nwant %s", name, got[name], fam)
		}
	}
	// One series per health state, 1 for the pool's.
	health := `# HELP poolerd_pool_health The pool's health state: 1 for the current state, 0 for the others.
# TYPE poolerd_pool_health gauge
poolerd_pool_health{database="app",state="degraded",user="u"} 1
poolerd_pool_health{database="app",state="healthy",user="u"} 0
poolerd_pool_health{database="app",state="initializing",user="u"} 0
poolerd_pool_health{database="app",state="recovering",user="u"} 0
poolerd_pool_health{database="app",state="shutting_down",user="u"} 0
poolerd_pool_health{database="app",state="terminated",user="u"} 0
poolerd_pool_health{database="app",state="unhealthy",user="u"} 0
`
	if got["poolerd_pool_health"] != health {
		t.Errorf("poolerd_pool_health:\n got %s\nwant %s", got["poolerd_pool_health"], health)
	}
	// A pool that is gone is gone from the next scrape.
	src.pools = nil
	if s, ok := scrape(t, reg)["poolerd_clients"]; ok {
		t.Errorf("poolerd_clients after the pool left:\n%s", s)
	}
}

// scrape gathers reg and returns each family in the text format, by name.
func scrape(t *testing.T, reg prometheus.Gatherer) map[string]string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range fams {
		var b strings.Builder
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
		out[f.GetName()] = b.String()
	}
	return out
}
