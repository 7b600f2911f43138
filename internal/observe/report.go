// The /stats document: the health of poolerd and of each pool, built from
// the proxy's snapshots.

package observe

import (
	"slices"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/proxy"
)

// HealthReport is the /stats document: seed 004's health check response
// (FR-008), with one entry per pool. It is built from memory only.
type HealthReport struct {
	// Status is healthy, degraded, unhealthy, starting, paused or
	// shutting_down: the worst of the configured pools, or the server's
	// own state.
	Status    string    `json:"status"`
	Timestamp time.Time `json:"timestamp"`
	Clients   int       `json:"clients"`
	// Database is the first configured pool (the upstream URL's, for a
	// sidecar), in the seed's single-database shape.
	Database *PoolHealth  `json:"database,omitempty"`
	Pools    []PoolHealth `json:"pools"`
	// Fleet is this process's share of the fleet-wide server connection
	// budget; absent while no budget is configured.
	Fleet *FleetHealth `json:"fleet,omitempty"`
}

// FleetHealth is the fleet budget as this process sees it.
type FleetHealth struct {
	// LeasesHeld counts the leases held now by kind of budget (global,
	// database, user).
	LeasesHeld map[string]int `json:"leases_held"`
	// LeaseRefusals counts requests refused by a spent budget, by kind.
	LeaseRefusals map[string]uint64 `json:"lease_refusals"`
	LeasesLost    uint64            `json:"leases_lost"`
	// RedisErrors counts failed Redis calls by operation.
	RedisErrors map[string]uint64 `json:"redis_errors"`
}

// PoolHealth describes one pool.
type PoolHealth struct {
	Name string `json:"name"`
	User string `json:"user"`
	// Status is connected (connections can be opened), degraded,
	// disconnected (connects fail) or paused.
	Status string `json:"status"`
	// Health is the pool's state machine state.
	Health          string     `json:"health"`
	Pool            PoolCounts `json:"pool"`
	LatencyMs       *float64   `json:"latency_ms"`
	LastError       *string    `json:"last_error"`
	LastHealthCheck *time.Time `json:"last_health_check"`
	NextRetry       *time.Time `json:"next_retry,omitempty"`
	// Hosts are the servers of a pool over several (database hosts).
	Hosts []HostHealth `json:"hosts,omitempty"`
}

// HostHealth is one server of a pool over several.
type HostHealth struct {
	Host            string `json:"host"`
	Role            string `json:"role"`
	Connections     int    `json:"connections"`
	Idle            int    `json:"idle"`
	Active          int    `json:"active"`
	ConnectFailures int    `json:"connect_failures"`
	LastError       string `json:"last_error,omitempty"`
	// Hits and Misses are its checkouts that reused an open connection or
	// got one opened for them; HitRate the share of hits (0 before any).
	Hits    uint64  `json:"hits"`
	Misses  uint64  `json:"misses"`
	HitRate float64 `json:"hit_rate"`
	// Evictions are its connections the pool closed, by reason (evictions
	// and recycles).
	Evictions map[string]uint64 `json:"evictions,omitempty"`
	// IdleTimeout and MaxSize are its own settings (host_settings);
	// omitted when it has none.
	IdleTimeoutSeconds float64 `json:"idle_timeout_seconds,omitempty"`
	MaxSize            int     `json:"max_size,omitempty"`
}

// PoolCounts are the seed's pool statistics.
type PoolCounts struct {
	Total   int `json:"total"`
	Idle    int `json:"idle"`
	Active  int `json:"active"`
	Waiting int `json:"waiting"`
	MaxSize int `json:"max_size"`
	MinSize int `json:"min_size"`
	// EffectiveMinSize is the floor kept now: min_size, or fewer while
	// PostgreSQL refuses more connections (docs/operations.md).
	EffectiveMinSize      int     `json:"effective_min_size"`
	TotalAcquisitions     uint64  `json:"total_acquisitions"`
	TotalReleases         uint64  `json:"total_releases"`
	AvgAcquisitionTimeMs  float64 `json:"avg_acquisition_time_ms"`
	PeakActiveConnections int     `json:"peak_active_connections"`
	PeakWaitTimeMs        float64 `json:"peak_wait_time_ms"`
	PoolCreatedAt         string  `json:"pool_created_at"`
}

// Report builds the /stats document of src.
func Report(src Source) HealthReport {
	r := HealthReport{Timestamp: time.Now().UTC(), Clients: src.ClientCount(), Pools: []PoolHealth{}}
	if fs := src.FleetStats(); fs.Enabled {
		r.Fleet = &FleetHealth{LeasesHeld: fs.Held, LeaseRefusals: fs.Refused, LeasesLost: fs.Lost, RedisErrors: fs.Errors}
	}
	warm := src.ConfiguredPools()
	globalPause := src.Paused()
	type key struct{ database, user string }
	isWarm := map[key]bool{}
	for _, p := range warm {
		isWarm[key{p.Database, p.User}] = true
	}
	pools := src.Pools()
	slices.SortFunc(pools, func(a, b proxy.PoolStats) int {
		if c := strings.Compare(a.Database, b.Database); c != 0 {
			return c
		}
		return strings.Compare(a.User, b.User)
	})
	worst := "healthy"
	for _, p := range pools {
		ph := poolHealth(p)
		r.Pools = append(r.Pools, ph)
		if isWarm[key{p.Database, p.User}] {
			worst = worse(worst, ph)
		}
	}
	if len(warm) > 0 {
		ph := poolHealth(warm[0])
		r.Database = &ph
	}
	switch ok, _ := src.Ready(); {
	case src.ShuttingDown():
		r.Status = "shutting_down"
	case globalPause:
		r.Status = "paused"
	case !ok && worst == "healthy":
		r.Status = "starting"
	default:
		r.Status = worst
	}
	return r
}

var statusRank = map[string]int{"healthy": 0, "degraded": 1, "starting": 2, "paused": 3, "unhealthy": 4}

// worse returns the worse of the status cur and the one pool ph stands
// for.
func worse(cur string, ph PoolHealth) string {
	s := ph.Health
	switch ph.Health {
	case "recovering":
		s = "degraded"
	case "initializing":
		s = "starting"
	case "shutting_down", "terminated":
		return cur
	}
	if ph.Status == "paused" {
		s = "paused"
	}
	if statusRank[s] > statusRank[cur] {
		return s
	}
	return cur
}

func poolHealth(ps proxy.PoolStats) PoolHealth {
	st := ps.Stats
	ph := PoolHealth{
		Name: ps.Database, User: ps.User, Health: st.State.String(),
		Pool: PoolCounts{
			Total: st.Total, Idle: st.Idle, Active: st.Active, Waiting: st.Waiting,
			MaxSize: st.MaxSize, MinSize: st.MinSize, EffectiveMinSize: st.EffectiveMinSize,
			TotalAcquisitions: st.Acquisitions, TotalReleases: st.Releases,
			AvgAcquisitionTimeMs:  ms(st.AvgWait()),
			PeakActiveConnections: st.PeakActive,
			PeakWaitTimeMs:        ms(st.WaitMax),
			PoolCreatedAt:         st.Created.UTC().Format(time.RFC3339),
		},
	}
	if len(ps.Hosts) > 1 {
		for _, h := range ps.Hosts {
			ph.Hosts = append(ph.Hosts, HostHealth{Host: h.Host, Role: h.Role, Connections: h.Open,
				Idle: h.Idle, Active: max(h.Open-h.Idle, 0), ConnectFailures: h.Failures, LastError: h.LastErr,
				Hits: h.Hits, Misses: h.Misses, HitRate: h.HitRate(), Evictions: h.Closes,
				IdleTimeoutSeconds: h.IdleTimeout.Seconds(), MaxSize: h.MaxSize})
		}
	}
	switch {
	case st.Paused:
		ph.Status = "paused"
	case st.State == pool.Unhealthy:
		ph.Status = "disconnected"
	case st.State == pool.Degraded:
		ph.Status = "degraded"
	default:
		ph.Status = "connected"
	}
	if st.LastCheckLatency > 0 {
		v := ms(st.LastCheckLatency)
		ph.LatencyMs = &v
	}
	if st.LastError != "" {
		e := st.LastError
		ph.LastError = &e
	}
	if !st.LastHealthCheck.IsZero() {
		t := st.LastHealthCheck.UTC()
		ph.LastHealthCheck = &t
	}
	if !st.NextRetry.IsZero() {
		t := st.NextRetry.UTC()
		ph.NextRetry = &t
	}
	return ph
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
