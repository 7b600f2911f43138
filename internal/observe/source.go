// The Source interface: what observe reads from the proxy.

package observe

import (
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/proxy"
)

// Source is the proxy seen from observe: read-only snapshots, each a copy
// taken under the proxy's own locks. *proxy.Server implements it; tests use
// fakes. Its methods may be called from any goroutine, concurrently.
type Source interface {
	// Config is the running configuration (stats_period, log_stats).
	Config() *config.Config
	// Ready is the readiness of /readyz, with the reason when not ready.
	Ready() (bool, string)
	// ShuttingDown and Paused (a global PAUSE) are the server's own state.
	ShuttingDown() bool
	Paused() bool
	// ClientCount counts logged-in clients, console sessions and
	// replication connections included;
	// ParkedClients those held without a goroutine.
	ClientCount() int
	ParkedClients() int
	// ReplicationCounts counts replication connections by database, user
	// and mode.
	ReplicationCounts() []proxy.ReplicationCount
	// LoginTimeouts and AuthFailures count refused logins since start.
	LoginTimeouts() uint64
	AuthFailures() uint64
	// Pools is every pool; ConfiguredPools the pools the configuration
	// names, the upstream URL's first.
	Pools() []proxy.PoolStats
	ConfiguredPools() []proxy.PoolStats
	// DatabaseTotals sums the traffic of each database's pools.
	DatabaseTotals() map[string]proxy.Totals
	// FleetStats is the fleet-wide server connection budget's counters.
	FleetStats() proxy.FleetStats
}

var _ Source = (*proxy.Server)(nil)
