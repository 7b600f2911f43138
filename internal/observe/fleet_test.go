package observe

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolerd/poolerd/internal/proxy"
)

// TestFleetMetricsAndReport: the fleet budget's counters reach /metrics
// (always) and /stats (once a budget is configured).
func TestFleetMetricsAndReport(t *testing.T) {
	src := &fakeSource{ready: true}
	if r := Report(src); r.Fleet != nil {
		t.Fatalf("/stats has a fleet object without a budget: %+v", r.Fleet)
	}
	src.fleet = proxy.FleetStats{Enabled: true,
		Held:     map[string]int{"global": 3, "database": 2, "user": 0},
		Refused:  map[string]uint64{"global": 7, "database": 0, "user": 0},
		Errors:   map[string]uint64{"acquire": 1, "renew": 0, "release": 0},
		Acquired: 11, Renewed: 40, Lost: 1, Unleased: 2, RedisDenied: 5}
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, src); err != nil {
		t.Fatal(err)
	}
	got := scrape(t, reg)
	for name, want := range map[string]string{
		"poolerd_fleet_leases_held":              `poolerd_fleet_leases_held{budget="global"} 3`,
		"poolerd_fleet_lease_refusals_total":     `poolerd_fleet_lease_refusals_total{budget="global"} 7`,
		"poolerd_fleet_redis_errors_total":       `poolerd_fleet_redis_errors_total{op="acquire"} 1`,
		"poolerd_fleet_lease_acquisitions_total": "poolerd_fleet_lease_acquisitions_total 11",
		"poolerd_fleet_lease_renewals_total":     "poolerd_fleet_lease_renewals_total 40",
		"poolerd_fleet_leases_lost_total":        "poolerd_fleet_leases_lost_total 1",
		"poolerd_fleet_unleased_opens_total":     "poolerd_fleet_unleased_opens_total 2",
		"poolerd_fleet_redis_denials_total":      "poolerd_fleet_redis_denials_total 5",
	} {
		if !strings.Contains(got[name], want+"\n") {
			t.Errorf("%s: want a line %q in\n%s", name, want, got[name])
		}
	}
	r := Report(src)
	if r.Fleet == nil || r.Fleet.LeasesHeld["global"] != 3 || r.Fleet.LeaseRefusals["global"] != 7 || r.Fleet.LeasesLost != 1 || r.Fleet.RedisErrors["acquire"] != 1 {
		t.Fatalf("/stats fleet %+v", r.Fleet)
	}
}
