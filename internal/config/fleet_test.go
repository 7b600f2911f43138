package config

import (
	"strings"
	"testing"
	"time"
)

// TestFleetLimits: the entries' fleet budgets win over the global key, a
// "*" entry's applies to every name it matches, and 0 in an entry turns
// the entry's budget off.
func TestFleetLimits(t *testing.T) {
	c, err := load(t, `upstream: postgres://app:secret@db/app
redis_url: redis://127.0.0.1:6379/0
fleet_max_server_connections: 100
fleet_lease_ttl: 6s
databases:
  - name: reports
    host: h
    fleet_max_server_connections: 10
  - name: "*"
    host: h
    fleet_max_server_connections: 0
users:
  - name: batch
    password: pw
    fleet_max_server_connections: 5
`)
	if err != nil {
		t.Fatal(err)
	}
	if c.FleetLeaseTTL != 6*time.Second || !c.FleetEnabled() {
		t.Fatalf("ttl %v, enabled %v", c.FleetLeaseTTL, c.FleetEnabled())
	}
	for _, tc := range []struct {
		db, user         string
		global, dbN, usr int
	}{
		{"reports", "batch", 100, 10, 5},
		{"anything", "app", 100, 0, 100},
	} {
		g, d, u := c.FleetLimits(tc.db, tc.user)
		if g != tc.global || d != tc.dbN || u != tc.usr {
			t.Errorf("FleetLimits(%q, %q) = %d, %d, %d; want %d, %d, %d", tc.db, tc.user, g, d, u, tc.global, tc.dbN, tc.usr)
		}
	}
	if d := Defaults(); d.FleetEnabled() || d.FleetLeaseTTL != DefaultFleetLeaseTTL {
		t.Fatalf("defaults: enabled %v, ttl %v", d.FleetEnabled(), d.FleetLeaseTTL)
	}
}

func TestFleetRejects(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"no redis", up + "fleet_max_server_connections: 5\n", "fleet_max_server_connections needs redis_url"},
		{"no redis for an entry", up + "users:\n  - name: bob\n    password: pw\n    fleet_max_server_connections: 2\n", "needs redis_url"},
		{"negative", up + "redis_url: redis://h:1/0\nfleet_max_server_connections: -1\n", "must not be negative"},
		{"negative entry", up + "databases:\n  - name: a\n    fleet_max_server_connections: -2\n", `database "a": fleet_max_server_connections must not be negative`},
		{"short ttl", up + "fleet_lease_ttl: 500ms\n", "fleet_lease_ttl must be at least 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}
