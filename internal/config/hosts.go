package config

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Several servers for one database entry: hosts, target_session_attrs and
// load_balance_hosts, with libpq's names and meanings.

// Values of target_session_attrs: which servers of an entry a server
// connection may go to, judged by what PostgreSQL 14+ reports at login and
// after every change (in_hot_standby, default_transaction_read_only).
const (
	TargetAny           = "any"
	TargetReadWrite     = "read-write"
	TargetReadOnly      = "read-only"
	TargetPrimary       = "primary"
	TargetStandby       = "standby"
	TargetPreferStandby = "prefer-standby"
)

// Values of load_balance_hosts: the order in which a new server connection
// tries the entry's servers.
const (
	BalanceRoundRobin = "round-robin"
	BalanceRandom     = "random"
	BalanceLeastConns = "least-connections"
	BalanceDisable    = "disable" // in the order listed
)

// HostPort is one server of a database entry, normalised: a host name in
// lower case (IPv6 addresses without brackets), a port.
type HostPort struct {
	Host string
	Port int
}

// String is host:port, with an IPv6 address in brackets.
func (h HostPort) String() string { return net.JoinHostPort(h.Host, strconv.Itoa(h.Port)) }

// ParseHostPort reads "host", "host:port", "[v6]:port" or a bare IPv6
// address; the port is defaultPort when absent.
func ParseHostPort(s string, defaultPort int) (HostPort, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return HostPort{}, fmt.Errorf("empty host")
	}
	host, portStr := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return HostPort{}, fmt.Errorf("host %q: missing ]", s)
		}
		host, portStr = s[1:end], strings.TrimPrefix(s[end+1:], ":")
		if rest := s[end+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
			return HostPort{}, fmt.Errorf("host %q: expected :port after ]", s)
		}
	case strings.Count(s, ":") == 1:
		host, portStr, _ = strings.Cut(s, ":")
	}
	port := defaultPort
	if portStr != "" {
		p, err := strconv.Atoi(portStr)
		if err != nil || p < 1 || p > 65535 {
			return HostPort{}, fmt.Errorf("host %q: port %q is not a port number (1-65535)", s, portStr)
		}
		port = p
	}
	if host == "" {
		return HostPort{}, fmt.Errorf("host %q has no name", s)
	}
	if strings.HasPrefix(host, "/") {
		return HostPort{Host: host, Port: port}, nil // a Unix socket directory
	}
	return HostPort{Host: strings.ToLower(host), Port: port}, nil
}

// hostList is the normalised server list of database entry d (its host and
// port, or its hosts), defaultHost/defaultPort filling what it leaves out.
func hostList(d Database, defaultHost string, defaultPort int) ([]HostPort, error) {
	port := d.Port
	if port == 0 {
		port = defaultPort
	}
	if len(d.Hosts) == 0 {
		host := d.Host
		if host == "" {
			host = defaultHost
		}
		if strings.HasPrefix(host, "/") {
			return []HostPort{{Host: host, Port: port}}, nil
		}
		return []HostPort{{Host: strings.ToLower(host), Port: port}}, nil
	}
	seen := map[HostPort]bool{}
	out := make([]HostPort, 0, len(d.Hosts))
	for _, s := range d.Hosts {
		h, err := ParseHostPort(s, port)
		if err != nil {
			return nil, err
		}
		if seen[h] {
			return nil, fmt.Errorf("%s is listed twice in hosts", h)
		}
		seen[h] = true
		out = append(out, h)
	}
	return out, nil
}

// validateHosts checks the multi-server keys of database entry d (where
// names it in messages).
func validateHosts(d Database, where string, bad func(string, ...any)) {
	if len(d.Hosts) > 0 && d.Host != "" {
		bad("%s has both host and hosts: keep hosts (a list of host:port) and remove host", where)
	}
	if _, err := hostList(d, "", 5432); err != nil {
		bad("%s hosts: %v", where, err)
	}
	switch d.TargetSessionAttrs {
	case "", TargetAny, TargetReadWrite, TargetReadOnly, TargetPrimary, TargetStandby, TargetPreferStandby:
	default:
		bad("%s target_session_attrs %q: use any, read-write, read-only, primary, standby or prefer-standby", where, d.TargetSessionAttrs)
	}
	if d.MaxSizePerHost < 0 {
		bad("%s max_size_per_host %d is negative: use 0 for no cap of its own", where, d.MaxSizePerHost)
	}
	validateHostSettings(d, where, bad)
	if d.MaxReplicaLag < 0 {
		bad("%s max_replica_lag %s is negative: use 0 to disable", where, d.MaxReplicaLag)
	}
	switch d.LoadBalanceHosts {
	case "", BalanceRoundRobin, BalanceRandom, BalanceLeastConns, BalanceDisable:
	default:
		bad("%s load_balance_hosts %q: use round-robin, random, least-connections or disable", where, d.LoadBalanceHosts)
	}
}

// AttrsMatch reports whether a server that is (or is not) a hot standby and
// whose default_transaction_read_only is readOnly suits target attrs;
// relaxed is prefer-standby's second pass, when no standby could be had.
func AttrsMatch(attrs string, standby, readOnly, relaxed bool) bool {
	switch attrs {
	case TargetReadWrite:
		return !standby && !readOnly
	case TargetReadOnly:
		return standby || readOnly
	case TargetPrimary:
		return !standby
	case TargetStandby:
		return standby
	case TargetPreferStandby:
		return standby || relaxed
	}
	return true
}

// validateHostSettings checks database entry d's host_settings: each names
// one of its hosts, once, with no negative value.
func validateHostSettings(d Database, where string, bad func(string, ...any)) {
	if len(d.HostSettings) == 0 {
		return
	}
	if len(d.Hosts) == 0 {
		bad("%s has host_settings but no hosts: host_settings applies to servers of hosts; with one server use idle_timeout and max_size", where)
		return
	}
	port := cmp.Or(d.Port, 5432)
	hosts, err := hostList(d, "", port)
	if err != nil {
		return // reported by validateHosts
	}
	seen := map[HostPort]bool{}
	for i, hs := range d.HostSettings {
		h, err := ParseHostPort(hs.Host, port)
		switch {
		case err != nil:
			bad("%s host_settings[%d]: %v", where, i, err)
			continue
		case !slices.Contains(hosts, h):
			bad("%s host_settings[%d]: %s is not one of its hosts", where, i, h)
		case seen[h]:
			bad("%s host_settings: %s is listed twice", where, h)
		}
		seen[h] = true
		if hs.IdleTimeout < 0 {
			bad("%s host_settings %s: idle_timeout %s is negative: use 0 to inherit", where, h, hs.IdleTimeout)
		}
		if hs.MaxSizePerHost < 0 {
			bad("%s host_settings %s: max_size_per_host %d is negative: use 0 to inherit", where, h, hs.MaxSizePerHost)
		}
	}
}

// hostSettingsOf resolves database entry d's host_settings against its
// servers (default port port); nil when it has none.
func hostSettingsOf(d Database, port int) map[HostPort]HostSetting {
	if len(d.HostSettings) == 0 {
		return nil
	}
	out := make(map[HostPort]HostSetting, len(d.HostSettings))
	for _, hs := range d.HostSettings {
		if h, err := ParseHostPort(hs.Host, port); err == nil {
			out[h] = hs
		}
	}
	return out
}
