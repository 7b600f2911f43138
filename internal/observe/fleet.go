// The fleet-wide server connection budget's metrics.

package observe

// fleetMetricDefs are the fleet budget's families (no database or user
// label: leases are per process, budgets per fleet).
var fleetMetricDefs = []metricDef{
	{"poolerd_fleet_leases_held", "Fleet budget leases this poolerd holds now (one per server connection), by kind of budget: global, database, user.", []string{"budget"}},
	{"poolerd_fleet_lease_acquisitions_total", "Fleet budget leases taken before opening a server connection.", nil},
	{"poolerd_fleet_lease_refusals_total", "Lease requests refused because a fleet budget was spent, by kind of the budget that was full: global, database, user.", []string{"budget"}},
	{"poolerd_fleet_lease_renewals_total", "Fleet budget leases renewed (one per lease per renewal, every third of fleet_lease_ttl).", nil},
	{"poolerd_fleet_leases_lost_total", "Fleet budget leases a renewal found expired with their budget full meanwhile (their connection goes on without a lease).", nil},
	{"poolerd_fleet_redis_errors_total", "Failed or timed-out Redis calls of the fleet budget, by operation: acquire, renew, release.", []string{"op"}},
	{"poolerd_fleet_unleased_opens_total", "Server connections opened without a lease because Redis failed and on_redis_error is allow.", nil},
	{"poolerd_fleet_redis_denials_total", "Lease requests refused because Redis failed and on_redis_error is deny.", nil},
}

// collectFleet emits the fleet budget's metrics (zeros while no budget is
// configured, so that every series always exists).
func (c *collector) collectFleet(gauge, counter func(name string, v float64, labels ...string)) {
	fs := c.src.FleetStats()
	for kind, n := range fs.Held {
		gauge("poolerd_fleet_leases_held", float64(n), kind)
	}
	for kind, n := range fs.Refused {
		counter("poolerd_fleet_lease_refusals_total", float64(n), kind)
	}
	for op, n := range fs.Errors {
		counter("poolerd_fleet_redis_errors_total", float64(n), op)
	}
	counter("poolerd_fleet_lease_acquisitions_total", float64(fs.Acquired))
	counter("poolerd_fleet_lease_renewals_total", float64(fs.Renewed))
	counter("poolerd_fleet_leases_lost_total", float64(fs.Lost))
	counter("poolerd_fleet_unleased_opens_total", float64(fs.Unleased))
	counter("poolerd_fleet_redis_denials_total", float64(fs.RedisDenied))
}
