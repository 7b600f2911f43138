package proxy

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
)

// Choosing a server for a new connection among a database entry's hosts
// (hosts, target_session_attrs, load_balance_hosts).
//
// A pool stays one pool per database and user; each of its connections goes
// to one of the entry's servers. A new connection tries them in the order
// load_balance_hosts gives, servers that failed lately last, and keeps the
// first whose role suits target_session_attrs. The role is what PostgreSQL
// (14 and later) reports at login and whenever it changes: in_hot_standby
// and default_transaction_read_only. A connection whose server changed role
// (a replica promoted, a primary demoted) is closed when it is next
// released or validated. So when a primary fails, read-write requests wait
// in the queue (bounded by checkout_timeout) while connects fail or find
// only standbys, and get the promoted replica's first connection; multi-
// server pools retry at most every multiHostBackoffMax for that.

// multiHostBackoffMax caps the reconnect backoff of a pool with several
// servers, so that a promoted replica is found within about that long.
const multiHostBackoffMax = time.Second

// hostSet is what a pool knows of its servers.
type hostSet struct {
	mu    sync.Mutex
	next  uint64 // round-robin cursor
	state map[config.HostPort]*hostState
}

// hostState is one server's recent history.
type hostState struct {
	open     int       // connections open to it
	opening  int       // connects to it under way
	failures int       // failed connects in a row
	retryAt  time.Time // tried last until then
	standby  bool      // role at the latest login
	known    bool      // a login reported its role
	lastErr  string
	// closes counts its connections the pool closed, by reason
	// (evictions and recycles).
	closes map[string]uint64
	// Checkouts of its connections: hits reused an open one, misses got
	// one opened for them. Counted by the pool's CheckedOut hook without
	// hs.mu (a connection keeps its hostState, serverConn.hostSt).
	hits, misses atomic.Uint64
}

func (hs *hostSet) get(h config.HostPort) *hostState {
	if hs.state == nil {
		hs.state = map[config.HostPort]*hostState{}
	}
	st := hs.state[h]
	if st == nil {
		st = &hostState{}
		hs.state[h] = st
	}
	return st
}

// order lists hosts in the order a new connection tries them: balance's
// order among those not backing off, then those backing off, soonest due
// first.
func (hs *hostSet) order(hosts []config.HostPort, balance string, now time.Time) []config.HostPort {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := slices.Clone(hosts)
	switch balance {
	case config.BalanceRoundRobin:
		k := int(hs.next % uint64(len(out)))
		hs.next++
		out = append(out[k:], out[:k]...)
	case config.BalanceRandom:
		rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	case config.BalanceLeastConns:
		slices.SortStableFunc(out, func(a, b config.HostPort) int { return hs.get(a).open - hs.get(b).open })
	}
	slices.SortStableFunc(out, func(a, b config.HostPort) int {
		ra, rb := hs.get(a).retryAt, hs.get(b).retryAt
		da, db := ra.After(now), rb.After(now)
		switch {
		case da && db:
			return ra.Compare(rb)
		case da:
			return 1
		case db:
			return -1
		}
		return 0
	})
	return out
}

// failed records a failed connect to h: it is tried last for a backoff
// that doubles with each failure in a row, from base up to max.
func (hs *hostSet) failed(h config.HostPort, err error, now time.Time, base, max time.Duration) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	st := hs.get(h)
	st.failures++
	d := base << min(st.failures-1, 16)
	if d > max || d <= 0 {
		d = max
	}
	st.retryAt, st.lastErr = now.Add(d), err.Error()
}

// reached records a login to h and the role it reported.
func (hs *hostSet) reached(h config.HostPort, standby bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	st := hs.get(h)
	st.failures, st.retryAt, st.lastErr = 0, time.Time{}, ""
	st.standby, st.known = standby, true
}

// opened and closed count the connections open to h.
func (hs *hostSet) opened(h config.HostPort) {
	hs.mu.Lock()
	hs.get(h).open++
	hs.mu.Unlock()
}

// reserve counts a connect to h under way, unless h already has max
// (max_size_per_host; 0: no cap) connections open or opening; done ends
// it.
func (hs *hostSet) reserve(h config.HostPort, max int) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	st := hs.get(h)
	if max > 0 && st.open+st.opening >= max {
		return false
	}
	st.opening++
	return true
}

func (hs *hostSet) done(h config.HostPort) {
	hs.mu.Lock()
	hs.get(h).opening--
	hs.mu.Unlock()
}

func (hs *hostSet) closed(h config.HostPort) {
	hs.mu.Lock()
	hs.get(h).open--
	hs.mu.Unlock()
}

// stateOf returns h's state, for a connection to keep (serverConn.hostSt).
func (hs *hostSet) stateOf(h config.HostPort) *hostState {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.get(h)
}

// closedFor counts a connection to h the pool closed, with the reason.
func (hs *hostSet) closedFor(h config.HostPort, reason string) {
	hs.mu.Lock()
	st := hs.get(h)
	if st.closes == nil {
		st.closes = map[string]uint64{}
	}
	st.closes[reason]++
	hs.mu.Unlock()
}

// anyRoomIn reports whether one of r's servers has fewer connections open
// or opening than its cap (HostCap; a server without one has room).
func (hs *hostSet) anyRoomIn(r *config.Route) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for _, h := range r.Hosts {
		if c := r.HostCap(h); c <= 0 || hs.get(h).open+hs.get(h).opening < c {
			return true
		}
	}
	return false
}

// HostInfo is one server of a pool, for the metrics, /stats and SHOW
// HOSTS.
type HostInfo struct {
	Host     string // host:port
	Role     string // primary, standby or unknown
	Open     int    // connections open to it
	Failures int    // failed connects in a row
	LastErr  string
	// Idle of Open are idle in the pool, the others active (checked out
	// or logging in).
	Idle int
	// Hits are checkouts that reused an open connection to it, Misses
	// those that got one opened for them.
	Hits, Misses uint64
	// Closes counts its connections the pool closed, by reason: the
	// evictions (poolerd_server_evictions_total's reasons) and recycles
	// (max_lifetime, max_queries, idle_timeout).
	Closes map[string]uint64
	// IdleTimeout and MaxSize are its own idle_timeout and cap
	// (host_settings, else max_size_per_host; 0: the pool's / none).
	IdleTimeout time.Duration
	MaxSize     int
}

// HitRate is the share of its checkouts that reused an open connection;
// 0 before any.
func (h HostInfo) HitRate() float64 {
	if h.Hits+h.Misses == 0 {
		return 0
	}
	return float64(h.Hits) / float64(h.Hits+h.Misses)
}

// idleByHost counts the pool's idle connections by server.
func (d *dbPool) idleByHost() map[config.HostPort]int {
	idle := d.pool.Idle()
	out := make(map[config.HostPort]int, 2)
	for _, sc := range idle {
		out[sc.host]++
	}
	return out
}

// snapshot lists the pool's servers in the route's order; idle counts the
// idle connections by server.
func (hs *hostSet) snapshot(r *config.Route, idle map[config.HostPort]int) []HostInfo {
	hosts := r.Hosts
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := make([]HostInfo, 0, len(hosts))
	for _, h := range hosts {
		st := hs.get(h)
		role := "unknown"
		if st.known {
			role = "primary"
			if st.standby {
				role = "standby"
			}
		}
		out = append(out, HostInfo{Host: h.String(), Role: role, Open: st.open, Failures: st.failures, LastErr: st.lastErr,
			Idle: idle[h], Hits: st.hits.Load(), Misses: st.misses.Load(), Closes: maps.Clone(st.closes),
			IdleTimeout: r.HostIdleTimeout(h), MaxSize: r.HostCap(h)})
	}
	return out
}

// serverRole reads a server's role from its reported parameters.
func serverRole(params map[string]string) (standby, readOnly bool) {
	return params["in_hot_standby"] == "on", params["default_transaction_read_only"] == "on"
}

// connectAmong opens a connection to the first of r's servers, in load
// balance order, whose role suits r.Attrs (prefer-standby: a standby, else
// the first other server that answered).
func (d *dbPool) connectAmong(ctx context.Context, r *config.Route, creds backend.Credentials) (*serverConn, error) {
	cfg := d.srv.cfg()
	tlsCfg := d.srv.serverTLSFor(r.ServerTLSMode)
	var why []string
	var fallback *backend.Conn
	var fallbackHost config.HostPort
	var fallbackLags bool
	for _, h := range d.hosts.order(r.Hosts, r.Balance, time.Now()) {
		if ctx.Err() != nil {
			break
		}
		if !d.hosts.reserve(h, r.HostCap(h)) {
			why = append(why, fmt.Sprintf("%s: at max_size_per_host (%d)", h, r.HostCap(h)))
			continue
		}
		bc, err := backend.Connect(ctx, backend.Target{Host: h.Host, Port: h.Port, TLS: tlsCfg,
			TCP: tcpOptions(cfg, backend.ServerKeepAlive)}, r.DBName, creds, r.ServerParams)
		if err == nil {
			d.hosts.opened(h) // counted before the reservation ends; adopt does not count again
		}
		d.hosts.done(h)
		if err != nil {
			d.hosts.failed(h, err, time.Now(), cfg.ReconnectBackoffBase, min(cfg.ReconnectBackoffMax, multiHostBackoffMax))
			why = append(why, fmt.Sprintf("%s: %v", h, err))
			d.log.Info("server of the entry failed; trying its next", zap.String("host", h.String()), zap.Error(err))
			continue
		}
		standby, readOnly := serverRole(bc.Params)
		d.hosts.reached(h, standby)
		lagging := ""
		if standby && r.MaxLag > 0 {
			lagging = replicaLagging(ctx, bc, r.MaxLag)
		}
		if lagging == "" && config.AttrsMatch(r.Attrs, standby, readOnly, false) {
			if fallback != nil {
				d.hosts.closed(fallbackHost)
				_ = fallback.Close()
			}
			return d.adoptCounted(bc, h), nil
		}
		// prefer-standby takes another server if no standby suits: a
		// primary rather than a lagging standby.
		if r.Attrs == config.TargetPreferStandby && (fallback == nil || fallbackLags && lagging == "") {
			if fallback != nil {
				d.hosts.closed(fallbackHost)
				_ = fallback.Close()
			}
			fallback, fallbackHost, fallbackLags = bc, h, lagging != ""
			continue
		}
		d.hosts.closed(h)
		_ = bc.Close()
		if lagging != "" {
			why = append(why, fmt.Sprintf("%s: %s", h, lagging))
		} else {
			why = append(why, fmt.Sprintf("%s: %s", h, roleWord(standby, readOnly)))
		}
	}
	if fallback != nil {
		return d.adoptCounted(fallback, fallbackHost), nil
	}
	if err := ctx.Err(); err != nil {
		why = append(why, err.Error())
	}
	return nil, fmt.Errorf("no server suits target_session_attrs %s: %s", r.Attrs, strings.Join(why, "; "))
}

// replicaLagQuery is how far a standby's replay is behind, in seconds: 0
// when it has replayed all it received (an idle primary sends nothing, so
// the age of the last replayed transaction alone would count idleness as
// lag); -1 when it is behind but has replayed no transaction since it
// started, so that how far is unknown.
const replicaLagQuery = `SELECT CASE WHEN pg_catalog.pg_last_wal_receive_lsn() IS NULL
	OR pg_catalog.pg_last_wal_receive_lsn() OPERATOR(pg_catalog.=) pg_catalog.pg_last_wal_replay_lsn() THEN 0
	ELSE COALESCE(EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.pg_last_xact_replay_timestamp()), -1) END`

// replicaLagging says why the standby bc is too far behind (max), or ""
// if it is not.
func replicaLagging(ctx context.Context, bc *backend.Conn, max time.Duration) string {
	v, err := bc.QueryValue(ctx, replicaLagQuery)
	if err != nil {
		return fmt.Sprintf("its replication lag could not be read (%v)", err)
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return fmt.Sprintf("its replication lag could not be read (%q)", v)
	}
	if secs < 0 {
		return fmt.Sprintf("a standby behind by an unknown amount (it has replayed no transaction since it started; max_replica_lag %s)", max)
	}
	if lag := time.Duration(secs * float64(time.Second)); lag > max {
		return fmt.Sprintf("a standby %s behind (max_replica_lag %s)", lag.Round(time.Millisecond), max)
	}
	return ""
}

// roleWord says what a server that does not suit is.
func roleWord(standby, readOnly bool) string {
	switch {
	case standby:
		return "a standby (in_hot_standby on)"
	case readOnly:
		return "read-only (default_transaction_read_only on)"
	}
	return "a primary"
}

// roleSuits reports whether sc's server still suits the pool's route: a
// server that changed role since sc was opened does not.
func (d *dbPool) roleSuits(sc *serverConn) bool {
	r := d.route()
	if r.Attrs == config.TargetAny || r.Attrs == config.TargetPreferStandby {
		return true
	}
	standby, readOnly := serverRole(sc.params)
	if config.AttrsMatch(r.Attrs, standby, readOnly, false) {
		return true
	}
	d.log.Info("server changed role; closing its connection", zap.String("host", sc.host.String()),
		zap.String("target_session_attrs", r.Attrs), zap.String("role", roleWord(standby, readOnly)), zap.Uint64("conn_id", sc.ID()))
	return false
}
