package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports pool statistics at scrape time, so the relay pays
// nothing per message for them.
type collector struct {
	srv                                        *Server
	conns, waiting, clients                    *prometheus.Desc
	checkouts, hits, misses, timeouts, connErr *prometheus.Desc
	waitSeconds                                *prometheus.Desc
}

// Collector returns a Prometheus collector for the server's pools.
func (srv *Server) Collector() prometheus.Collector {
	l := []string{"database", "user"}
	return &collector{
		srv:         srv,
		conns:       prometheus.NewDesc("poolerd_server_connections", "Server connections by state (idle, active, opening).", append(l, "state"), nil),
		waiting:     prometheus.NewDesc("poolerd_waiting_clients", "Clients waiting for a server connection.", l, nil),
		clients:     prometheus.NewDesc("poolerd_clients", "Logged-in client connections.", nil, nil),
		checkouts:   prometheus.NewDesc("poolerd_checkouts_total", "Server connections checked out.", l, nil),
		hits:        prometheus.NewDesc("poolerd_pool_hits_total", "Checkouts served by an existing connection.", l, nil),
		misses:      prometheus.NewDesc("poolerd_pool_misses_total", "Checkouts served by a newly opened connection.", l, nil),
		timeouts:    prometheus.NewDesc("poolerd_checkout_timeouts_total", "Checkouts that gave up after checkout_timeout.", l, nil),
		connErr:     prometheus.NewDesc("poolerd_server_connect_failures_total", "Failed attempts to open a server connection.", l, nil),
		waitSeconds: prometheus.NewDesc("poolerd_checkout_wait_seconds_total", "Total time clients waited for a server connection.", l, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.waiting, c.clients, c.checkouts, c.hits, c.misses, c.timeouts, c.connErr, c.waitSeconds} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.clients, prometheus.GaugeValue, float64(c.srv.ClientCount()))
	for _, p := range c.srv.Pools() {
		db, user := p.Database, p.User
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(p.Idle), db, user, "idle")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(p.Active), db, user, "active")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(p.Opening), db, user, "opening")
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(p.Waiting), db, user)
		ch <- prometheus.MustNewConstMetric(c.checkouts, prometheus.CounterValue, float64(p.Acquisitions), db, user)
		ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(p.Hits), db, user)
		ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, float64(p.Misses), db, user)
		ch <- prometheus.MustNewConstMetric(c.timeouts, prometheus.CounterValue, float64(p.Timeouts), db, user)
		ch <- prometheus.MustNewConstMetric(c.connErr, prometheus.CounterValue, float64(p.ConnectFailures), db, user)
		ch <- prometheus.MustNewConstMetric(c.waitSeconds, prometheus.CounterValue, p.WaitTotal.Seconds(), db, user)
	}
}
