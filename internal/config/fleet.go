package config

import (
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultFleetLeaseTTL is the default fleet_lease_ttl.
const DefaultFleetLeaseTTL = 15 * time.Second

// FleetSettings are the global keys of the fleet-wide server connection
// budget: every poolerd using the same redis_url shares it through leases
// in Redis (internal/fleet).
type FleetSettings struct {
	// FleetMaxServerConnections is the most server connections all the
	// instances together may have open or opening; 0 means no limit.
	// Databases and users may set their own.
	FleetMaxServerConnections int `mapstructure:"fleet_max_server_connections"`
	// FleetLeaseTTL is how long a lease lives unrenewed; leases are
	// renewed every third of it.
	FleetLeaseTTL time.Duration `mapstructure:"fleet_lease_ttl"`
}

// FleetLimits returns the fleet-wide budgets a server connection of
// database, logged in as the server user user, counts against: the global
// one, its database's and its user's (0 means none). An entry's value wins
// over the global key, as for max_db_connections.
func (c *Config) FleetLimits(database, user string) (global, db, usr int) {
	global, db, usr = c.FleetMaxServerConnections, c.FleetMaxServerConnections, c.FleetMaxServerConnections
	if d, ok := c.database(database); ok && d.FleetMaxServerConnections != nil {
		db = *d.FleetMaxServerConnections
	}
	for _, u := range c.Users {
		if u.Name == user && u.FleetMaxServerConnections != nil {
			usr = *u.FleetMaxServerConnections
		}
	}
	return global, db, usr
}

// FleetEnabled reports whether any fleet-wide budget is set.
func (c *Config) FleetEnabled() bool {
	if c.FleetMaxServerConnections > 0 {
		return true
	}
	for _, d := range c.Databases {
		if d.FleetMaxServerConnections != nil && *d.FleetMaxServerConnections > 0 {
			return true
		}
	}
	for _, u := range c.Users {
		if u.FleetMaxServerConnections != nil && *u.FleetMaxServerConnections > 0 {
			return true
		}
	}
	return false
}

// validateFleet checks the fleet budget keys: no negative budget, a TTL of
// at least a second, and a usable redis_url when a budget is set.
func (c *Config) validateFleet(bad func(string, ...any)) {
	if c.FleetMaxServerConnections < 0 {
		bad("fleet_max_server_connections must not be negative (0 means no limit)")
	}
	for _, d := range c.Databases {
		if v := d.FleetMaxServerConnections; v != nil && *v < 0 {
			bad("database %q: fleet_max_server_connections must not be negative (0 means no limit)", d.Name)
		}
	}
	for _, u := range c.Users {
		if v := u.FleetMaxServerConnections; v != nil && *v < 0 {
			bad("user %q: fleet_max_server_connections must not be negative (0 means no limit)", u.Name)
		}
	}
	if c.FleetLeaseTTL < time.Second {
		bad("fleet_lease_ttl must be at least 1s (default 15s): leases are renewed every third of it")
	}
	if !c.FleetEnabled() {
		return
	}
	if !strings.HasPrefix(c.RedisURL, "redis://") && !strings.HasPrefix(c.RedisURL, "rediss://") {
		bad("fleet_max_server_connections needs redis_url, e.g. redis://127.0.0.1:6379/0: the budget is shared through Redis")
	} else if _, err := redis.ParseURL(c.RedisURL); err != nil {
		bad("redis_url is not a valid Redis URL: write it as redis://[:password@]host:port/db")
	}
}
