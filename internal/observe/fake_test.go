package observe

import (
	"maps"
	"slices"
	"sync"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/proxy"
)

// fakeSource is a Source whose snapshots the test sets.
type fakeSource struct {
	mu            sync.Mutex
	cfg           *config.Config
	ready         bool
	shutting      bool
	paused        bool
	clients       int
	parked        int
	repl          []proxy.ReplicationCount
	loginTimeouts uint64
	authFailures  uint64
	pools         []proxy.PoolStats
	configured    []proxy.PoolStats
	totals        map[string]proxy.Totals
	fleet         proxy.FleetStats
}

func (f *fakeSource) FleetStats() proxy.FleetStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fleet
}

func (f *fakeSource) Config() *config.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg
}

func (f *fakeSource) Ready() (bool, string) {
	if f.ready {
		return true, ""
	}
	return false, "not ready"
}

func (f *fakeSource) ShuttingDown() bool { return f.shutting }
func (f *fakeSource) Paused() bool       { return f.paused }
func (f *fakeSource) ClientCount() int   { return f.clients }
func (f *fakeSource) ParkedClients() int { return f.parked }
func (f *fakeSource) ReplicationCounts() []proxy.ReplicationCount {
	return f.repl
}
func (f *fakeSource) LoginTimeouts() uint64 { return f.loginTimeouts }
func (f *fakeSource) AuthFailures() uint64  { return f.authFailures }

func (f *fakeSource) Pools() []proxy.PoolStats           { return slices.Clone(f.pools) }
func (f *fakeSource) ConfiguredPools() []proxy.PoolStats { return slices.Clone(f.configured) }

func (f *fakeSource) DatabaseTotals() map[string]proxy.Totals {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.totals)
}

func (f *fakeSource) setTotals(t map[string]proxy.Totals) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.totals = t
}

func (f *fakeSource) setConfig(cfg *config.Config) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cfg = cfg
}
