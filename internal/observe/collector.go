// The Prometheus collector: poolerd's gauges and counters, read from the
// proxy's snapshots at scrape time, and its registration.

package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolerd/poolerd/internal/pool"
)

// Register registers the scrape-time collector of src's statistics on reg.
// The relay's own histograms and counters are registered by
// proxy.Server.Instrument.
func Register(reg prometheus.Registerer, src Source) error {
	return reg.Register(newCollector(src))
}

// collector exports pool statistics at scrape time.
type collector struct {
	src   Source
	descs map[string]*prometheus.Desc
}

type metricDef struct {
	name, help string
	extra      []string // labels after database and user
}

var poolMetricDefs = []metricDef{
	{"poolerd_clients", "Logged-in clients by state: active (holding a server connection), waiting (for one), idle.", []string{"state"}},
	{"poolerd_waiting_clients", "Clients waiting for a server connection.", nil},
	{"poolerd_server_connections", "Server connections by state: idle, active (held by a client), opening.", []string{"state"}},
	{"poolerd_server_tls_connections", "Open server connections that use TLS, by TLS version.", []string{"version"}},
	{"poolerd_server_host_connections", "Open server connections per server of the pool, with the server's role at its latest login (primary, standby, unknown).", []string{"host", "role"}},
	{"poolerd_server_host_connect_failures", "Failed connects in a row to each server of the pool (0 once one succeeds).", []string{"host"}},
	{"poolerd_server_host_idle_connections", "Idle server connections per server of the pool.", []string{"host"}},
	{"poolerd_server_host_active_connections", "Server connections per server of the pool that are not idle (held by a client, or being checked).", []string{"host"}},
	{"poolerd_server_host_checkouts_total", "Checkouts per server of the pool: hit (an open connection reused), miss (one opened for it).", []string{"host", "result"}},
	{"poolerd_server_host_evictions_total", "Server connections the pool closed per server of the pool, by reason: evictions (as poolerd_server_evictions_total) and recycles (max_lifetime, max_queries, idle_timeout).", []string{"host", "reason"}},
	{"poolerd_checkouts_total", "Server connections handed to clients.", nil},
	{"poolerd_pool_hits_total", "Checkouts served by an open connection.", nil},
	{"poolerd_pool_misses_total", "Checkouts served by a newly opened connection.", nil},
	{"poolerd_pool_reserve_connections_total", "Connections opened beyond max_size from the reserve (reserve_pool_size), for requests that waited reserve_pool_timeout.", nil},
	{"poolerd_server_recycles_total", "Idle server connections closed by recycling, by reason (max_lifetime, max_queries, idle_timeout).", []string{"reason"}},
	{"poolerd_server_evictions_total", "Server connections closed because they could not be reused, by reason.", []string{"reason"}},
	{"poolerd_server_connect_attempts_total", "Attempts to open a server connection.", nil},
	{"poolerd_server_connect_failures_total", "Failed attempts to open a server connection.", nil},
	{"poolerd_reconnect_backoff_seconds", "Time until the next connect attempt while connects fail; 0 otherwise.", nil},
	{"poolerd_pool_health", "The pool's health state: 1 for the current state, 0 for the others.", []string{"state"}},
	{"poolerd_pool_paused", "1 while the pool is paused (PAUSE), else 0.", nil},
	{"poolerd_pool_max_size", "The pool's max_size (for saturation: server connections / max_size).", nil},
	{"poolerd_pool_min_size_effective", "The floor of connections the pool keeps: min_size, or fewer while PostgreSQL refuses more (53300).", nil},
	{"poolerd_unavailable_total", "Requests refused at once (08006) because connects fail and nothing is open.", nil},
	{"poolerd_timeouts_total", "Timeouts by kind: checkout, query, transaction, idle_transaction, client_idle, server_response, pinned_idle, lease, lease_checkout.", []string{"kind"}},
	{"poolerd_validation_failures_total", "Server connections that failed validation_query before use.", nil},
	{"poolerd_leaks_total", "Leak warnings: clients that kept a server connection busy past leak_detection_threshold.", nil},
	{"poolerd_client_bytes_received_total", "Bytes received from clients and forwarded to PostgreSQL.", nil},
	{"poolerd_client_bytes_sent_total", "Bytes sent to clients.", nil},
	{"poolerd_client_logins_total", "Successful client logins.", nil},
	{"poolerd_client_errors_total", "Errors sent to clients, by SQLSTATE class (first two characters).", []string{"class"}},
	{"poolerd_prepared_client_parses_total", "Parse messages from clients (transaction and statement mode).", nil},
	{"poolerd_prepared_server_parses_total", "Parse messages sent to PostgreSQL: clients' unnamed and first-time statements, and statements prepared again on another server connection.", nil},
	{"poolerd_prepared_cache_hits_total", "Clients' Parse of a named statement already prepared on their server connection (no server Parse).", nil},
	{"poolerd_prepared_evictions_total", "Statements closed on a server connection to stay within max_prepared_statements.", nil},
	{"poolerd_pinned_clients", "Transaction- or statement-mode clients pinned to their server connection by session state, by reason.", []string{"reason"}},
	{"poolerd_pins_total", "Clients pinned to their server connection, by reason.", []string{"reason"}},
	{"poolerd_unpins_total", "Pinned clients returned to transaction pooling because a check found their session state gone, by the reason they were pinned for.", []string{"reason"}},
	{"poolerd_pinned_client_age_seconds", "How long the client pinned longest for this reason has been pinned; 0 when none is.", []string{"reason"}},
}

func newCollector(src Source) *collector {
	c := &collector{src: src, descs: map[string]*prometheus.Desc{}}
	for _, d := range poolMetricDefs {
		c.descs[d.name] = prometheus.NewDesc(d.name, d.help, append([]string{"database", "user"}, d.extra...), nil)
	}
	c.descs["poolerd_client_connections"] = prometheus.NewDesc("poolerd_client_connections", "Client connections logged in, over all pools and the admin console.", nil, nil)
	c.descs["poolerd_auth_failures_total"] = prometheus.NewDesc("poolerd_auth_failures_total", "Client logins refused for a wrong password or unknown user (28P01).", nil, nil)
	c.descs["poolerd_login_timeouts_total"] = prometheus.NewDesc("poolerd_login_timeouts_total", "Clients dropped by client_login_timeout.", nil, nil)
	c.descs["poolerd_replication_connections"] = prometheus.NewDesc("poolerd_replication_connections", "Replication connections (replication=true: physical, replication=database: logical), each with its own server connection.", []string{"database", "user", "mode"}, nil)
	c.descs["poolerd_parked_clients"] = prometheus.NewDesc("poolerd_parked_clients", "Idle client sessions held without a goroutine (see docs/architecture.md).", nil, nil)
	c.descs["poolerd_ready"] = prometheus.NewDesc("poolerd_ready", "1 when poolerd is ready to serve clients (as /readyz), else 0.", nil, nil)
	for _, d := range fleetMetricDefs {
		c.descs[d.name] = prometheus.NewDesc(d.name, d.help, d.extra, nil)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

var healthStates = []pool.State{pool.Initializing, pool.Healthy, pool.Degraded, pool.Unhealthy, pool.Recovering, pool.ShuttingDown, pool.Terminated}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	counter := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, v, labels...)
	}
	gauge("poolerd_client_connections", float64(c.src.ClientCount()))
	gauge("poolerd_parked_clients", float64(c.src.ParkedClients()))
	for _, rc := range c.src.ReplicationCounts() {
		gauge("poolerd_replication_connections", float64(rc.Count), rc.Database, rc.User, rc.Mode)
	}
	counter("poolerd_login_timeouts_total", float64(c.src.LoginTimeouts()))
	counter("poolerd_auth_failures_total", float64(c.src.AuthFailures()))
	ready, _ := c.src.Ready()
	gauge("poolerd_ready", b2f(ready))
	c.collectFleet(gauge, counter)
	now := time.Now()
	for _, ps := range c.src.Pools() {
		db, user := ps.Database, ps.User
		active, waiting := int64(ps.Active), int64(ps.Waiting)
		gauge("poolerd_clients", float64(active), db, user, "active")
		gauge("poolerd_clients", float64(waiting), db, user, "waiting")
		gauge("poolerd_clients", float64(max(ps.Clients-active-waiting, 0)), db, user, "idle")
		gauge("poolerd_waiting_clients", float64(ps.Waiting), db, user)
		gauge("poolerd_server_connections", float64(ps.Idle), db, user, "idle")
		gauge("poolerd_server_connections", float64(ps.Active), db, user, "active")
		gauge("poolerd_server_connections", float64(ps.Opening), db, user, "opening")
		for _, version := range tlsVersions {
			gauge("poolerd_server_tls_connections", float64(ps.TLSConnections[version]), db, user, version)
		}
		for _, h := range ps.Hosts {
			gauge("poolerd_server_host_connections", float64(h.Open), db, user, h.Host, h.Role)
			gauge("poolerd_server_host_connect_failures", float64(h.Failures), db, user, h.Host)
			gauge("poolerd_server_host_idle_connections", float64(h.Idle), db, user, h.Host)
			gauge("poolerd_server_host_active_connections", float64(max(h.Open-h.Idle, 0)), db, user, h.Host)
			counter("poolerd_server_host_checkouts_total", float64(h.Hits), db, user, h.Host, "hit")
			counter("poolerd_server_host_checkouts_total", float64(h.Misses), db, user, h.Host, "miss")
			for reason, n := range h.Closes {
				counter("poolerd_server_host_evictions_total", float64(n), db, user, h.Host, reason)
			}
		}
		counter("poolerd_checkouts_total", float64(ps.Acquisitions), db, user)
		counter("poolerd_pool_hits_total", float64(ps.Hits), db, user)
		counter("poolerd_pool_misses_total", float64(ps.Misses), db, user)
		counter("poolerd_pool_reserve_connections_total", float64(ps.ReserveOpened), db, user)
		counter("poolerd_server_recycles_total", float64(ps.RecycledLifetime), db, user, pool.RecycleLifetime)
		counter("poolerd_server_recycles_total", float64(ps.RecycledUses), db, user, pool.RecycleUses)
		counter("poolerd_server_recycles_total", float64(ps.RecycledQueries), db, user, pool.RecycleQueries)
		counter("poolerd_server_recycles_total", float64(ps.RecycledIdle), db, user, pool.RecycleIdle)
		for reason, n := range ps.Evictions {
			counter("poolerd_server_evictions_total", float64(n), db, user, reason)
		}
		counter("poolerd_server_connect_attempts_total", float64(ps.ConnectAttempts), db, user)
		counter("poolerd_server_connect_failures_total", float64(ps.ConnectFailures), db, user)
		backoff := 0.0
		if !ps.NextRetry.IsZero() && ps.NextRetry.After(now) {
			backoff = ps.NextRetry.Sub(now).Seconds()
		}
		gauge("poolerd_reconnect_backoff_seconds", backoff, db, user)
		for _, st := range healthStates {
			gauge("poolerd_pool_health", b2f(ps.State == st), db, user, st.String())
		}
		gauge("poolerd_pool_paused", b2f(ps.Paused), db, user)
		gauge("poolerd_pool_max_size", float64(ps.MaxSize), db, user)
		gauge("poolerd_pool_min_size_effective", float64(ps.EffectiveMinSize), db, user)
		counter("poolerd_unavailable_total", float64(ps.FastFailures), db, user)
		counter("poolerd_timeouts_total", float64(ps.Timeouts), db, user, "checkout")
		for kind, n := range ps.SessionTimeouts {
			counter("poolerd_timeouts_total", float64(n), db, user, kind)
		}
		counter("poolerd_validation_failures_total", float64(ps.ValidationFailures), db, user)
		counter("poolerd_leaks_total", float64(ps.Leaks), db, user)
		counter("poolerd_client_bytes_received_total", float64(ps.Traffic.Received), db, user)
		counter("poolerd_client_bytes_sent_total", float64(ps.Traffic.Sent), db, user)
		counter("poolerd_client_logins_total", float64(ps.Traffic.ClientLogins), db, user)
		counter("poolerd_prepared_client_parses_total", float64(ps.Traffic.ClientParses), db, user)
		counter("poolerd_prepared_server_parses_total", float64(ps.Traffic.ServerParses), db, user)
		counter("poolerd_prepared_cache_hits_total", float64(ps.PreparedCacheHits), db, user)
		counter("poolerd_prepared_evictions_total", float64(ps.PreparedEvictions), db, user)
		for _, p := range ps.Pins {
			gauge("poolerd_pinned_clients", float64(p.Now), db, user, p.Reason)
			counter("poolerd_pins_total", float64(p.Total), db, user, p.Reason)
			counter("poolerd_unpins_total", float64(p.Unpins), db, user, p.Reason)
			gauge("poolerd_pinned_client_age_seconds", p.Oldest.Seconds(), db, user, p.Reason)
		}
		for class, n := range ps.ClientErrors {
			counter("poolerd_client_errors_total", float64(n), db, user, class)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// tlsVersions are the TLS versions poolerd speaks to PostgreSQL: each has a
// poolerd_server_tls_connections series, 0 when no connection uses it.
var tlsVersions = [...]string{"TLSv1.2", "TLSv1.3"}
