package console

import (
	"cmp"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/observe"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/internal/wire"
)

const adminHelp = "\n\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION" +
	"\n\tSHOW PEERS|PEER_POOLS" +
	"\n\tSHOW SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE|PINNED|HOSTS|RATE_LIMITS" +
	"\n\tSHOW DNS_HOSTS|DNS_ZONES" +
	"\n\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS" +
	"\n\tSET key = arg" +
	"\n\tRELOAD" +
	"\n\tPAUSE [<db>]" +
	"\n\tRESUME [<db>]" +
	"\n\tDISABLE <db>" +
	"\n\tENABLE <db>" +
	"\n\tRECONNECT [<db>]" +
	"\n\tKILL [<db>]" +
	"\n\tKILL_CLIENT <client_id>" +
	"\n\tSUSPEND" +
	"\n\tSHUTDOWN" +
	"\n\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS" +
	"\n\tWAIT_CLOSE [<db>]"

// show answers SHOW what.
func (c *Console) show(what, sql string) ([]byte, bool, *wire.Error) {
	if what == "HELP" {
		notice := &wire.Error{Severity: "NOTICE", Code: "00000", Message: "Console usage", Detail: adminHelp}
		return wire.AppendCommandComplete(notice.AppendNotice(nil), "SHOW"), false, nil
	}
	build, ok := map[string]func() *resultSet{
		"VERSION": c.showVersion, "STATE": c.showState, "POOLS": c.showPools, "STATS": c.showStats,
		"STATS_TOTALS":   func() *resultSet { return c.showStatsTable(false) },
		"STATS_AVERAGES": func() *resultSet { return c.showStatsTable(true) },
		"TOTALS":         c.showTotals, "CLIENTS": c.showClients, "SERVERS": c.showServers, "DATABASES": c.showDatabases,
		"USERS": c.showUsers, "CONFIG": c.showConfig, "LISTS": c.showLists, "PINNED": c.showPinned,
		"HOSTS": c.showHosts, "RATE_LIMITS": c.showRateLimits, "SOCKETS": c.showSockets,
		"ACTIVE_SOCKETS": c.showActiveSockets, "MEM": c.showMem, "PEERS": c.showPeers, "PEER_POOLS": c.showPeerPools,
		"DNS_HOSTS": c.showDNSHosts, "DNS_ZONES": c.showDNSZones,
	}[what]
	if !ok {
		if notInPoolerd(what) != "" {
			return nil, false, errNotInPoolerd("SHOW "+what, what)
		}
		return nil, false, errInvalidCommand(sql)
	}
	return build().done("SHOW"), false, nil
}

func (c *Console) showVersion() *resultSet {
	r := newResult(text("version"))
	r.row(fmt.Sprintf("PgBouncer %s (poolerd %s)", pgbouncerVersion, c.p.Version()))
	return r
}

// showState: PgBouncer's 3 rows.
func (c *Console) showState() *resultSet {
	st := c.p.PauseState()
	r := newResult(text("key"), text("value"))
	r.row("active", yesNo(!st.Paused && !st.Suspended))
	r.row("paused", yesNo(st.Paused))
	r.row("suspended", yesNo(st.Suspended))
	return r
}

// sortedPools returns the pools by database and user, for stable output.
func (c *Console) sortedPools() []proxy.PoolStats {
	ps := c.p.Pools()
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].Database != ps[j].Database {
			return ps[i].Database < ps[j].Database
		}
		return ps[i].User < ps[j].User
	})
	return ps
}

// consoleSessions counts the logged-in console connections.
func (c *Console) consoleSessions() int { return int(c.sessions.Load()) }

// showPools: exactly PgBouncer 1.25's 17 columns (tools pick a layout by
// column count; poolerd's health is in /stats and the metrics).
func (c *Console) showPools() *resultSet {
	r := newResult(text("database"), text("user"), int4("cl_active"), int4("cl_waiting"),
		int4("cl_active_cancel_req"), int4("cl_waiting_cancel_req"), int4("sv_active"), int4("sv_active_cancel"),
		int4("sv_being_canceled"), int4("sv_idle"), int4("sv_used"), int4("sv_tested"), int4("sv_login"),
		int4("maxwait"), int4("maxwait_us"), text("pool_mode"), text("load_balance_hosts"))
	r.row(adminDatabase, adminDatabase, c.consoleSessions(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "statement", null{})
	counts := serverCountsByPool(c.p.Servers())
	for _, p := range c.sortedPools() {
		sc := counts[poolKey{p.Database, p.User}]
		wait := p.OldestWait
		r.row(p.Database, p.User, max(int(p.Clients)-p.Waiting, 0), p.Waiting, 0, 0,
			sc.active, sc.cancelling, 0, sc.idle, sc.used, sc.tested, p.Opening,
			int(wait/time.Second), int((wait%time.Second)/time.Microsecond),
			p.Mode, null{})
	}
	return r
}

type poolKey struct{ database, user string }

type serverCounts struct{ active, cancelling, idle, used, tested int }

// serverCountsByPool classifies each pool's open connections like
// PgBouncer's server states.
func serverCountsByPool(servers []proxy.ServerInfo) map[poolKey]serverCounts {
	out := map[poolKey]serverCounts{}
	for _, si := range servers {
		k := poolKey{si.Database, si.User}
		c := out[k]
		switch serverState(si) {
		case "active":
			c.active++
		case "active_cancel":
			c.cancelling++
		case "idle":
			c.idle++
		case "used":
			c.used++
		case "tested":
			c.tested++
		}
		out[k] = c
	}
	return out
}

// serverState is a connection's state in PgBouncer's terms: active (held by
// a client), active_cancel (a cancel request for it is in flight), idle,
// used (idle long enough to need validation before use), tested (poolerd
// runs its own query: validation, reset, parameter check).
func serverState(si proxy.ServerInfo) string {
	switch {
	case si.Cancelling:
		return "active_cancel"
	case si.Link != "":
		return "active"
	case si.Idle && si.Stale:
		return "used"
	case si.Idle:
		return "idle"
	default:
		return "tested"
	}
}

// showStats: SHOW STATS' 23 columns (total_server_assignment_count
// second, as PgBouncer 1.25 sends them).
func (c *Console) showStats() *resultSet {
	r := newResult(text("database"), numeric("total_server_assignment_count"), numeric("total_xact_count"),
		numeric("total_query_count"), numeric("total_received"), numeric("total_sent"), numeric("total_xact_time"),
		numeric("total_query_time"), numeric("total_wait_time"), numeric("total_client_parse_count"),
		numeric("total_server_parse_count"), numeric("total_bind_count"), numeric("avg_server_assignment_count"),
		numeric("avg_xact_count"), numeric("avg_query_count"), numeric("avg_recv"), numeric("avg_sent"),
		numeric("avg_xact_time"), numeric("avg_query_time"), numeric("avg_wait_time"), numeric("avg_client_parse_count"),
		numeric("avg_server_parse_count"), numeric("avg_bind_count"))
	totals, avgs := c.p.DatabaseTotals(), c.averages()
	for _, db := range statsDatabases(totals) {
		t, a := totals[db], avgs[db]
		r.row(db, t.ServerAssignments, t.Xacts, t.Queries, t.Received, t.Sent, t.XactTimeUs, t.QueryTimeUs, t.WaitTimeUs,
			t.ClientParses, t.ServerParses, t.Binds,
			a.ServerAssignments, a.Xacts, a.Queries, a.Received, a.Sent, a.XactTimeUs, a.QueryTimeUs, a.WaitTimeUs,
			a.ClientParses, a.ServerParses, a.Binds)
	}
	return r
}

// statsDatabases lists the admin database and every database with a pool.
func statsDatabases(totals map[string]proxy.Totals) []string {
	dbs := []string{adminDatabase}
	for db := range totals {
		if db != adminDatabase {
			dbs = append(dbs, db)
		}
	}
	sort.Strings(dbs[1:])
	return dbs
}

// showStatsTable: SHOW STATS_TOTALS or SHOW STATS_AVERAGES (12 columns;
// only the averages' last three carry an avg_ prefix, as in PgBouncer).
func (c *Console) showStatsTable(averages bool) *resultSet {
	last := []string{"client_parse_count", "server_parse_count", "bind_count"}
	if averages {
		for i := range last {
			last[i] = "avg_" + last[i]
		}
	}
	r := newResult(text("database"), numeric("server_assignment_count"), numeric("xact_count"), numeric("query_count"),
		numeric("bytes_received"), numeric("bytes_sent"), numeric("xact_time"), numeric("query_time"), numeric("wait_time"),
		numeric(last[0]), numeric(last[1]), numeric(last[2]))
	totals, avgs := c.p.DatabaseTotals(), c.averages()
	for _, db := range statsDatabases(totals) {
		if averages {
			a := avgs[db]
			r.row(db, a.ServerAssignments, a.Xacts, a.Queries, a.Received, a.Sent, a.XactTimeUs, a.QueryTimeUs, a.WaitTimeUs,
				a.ClientParses, a.ServerParses, a.Binds)
		} else {
			t := totals[db]
			r.row(db, t.ServerAssignments, t.Xacts, t.Queries, t.Received, t.Sent, t.XactTimeUs, t.QueryTimeUs, t.WaitTimeUs,
				t.ClientParses, t.ServerParses, t.Binds)
		}
	}
	return r
}

// showTotals: SHOW TOTALS, name and value over all databases.
func (c *Console) showTotals() *resultSet {
	var t proxy.Totals
	for _, x := range c.p.DatabaseTotals() {
		t.Add(x)
	}
	var a observe.Averages
	var xw, qw, ww uint64 // rate-weighted sums of the mean times
	for _, x := range c.averages() {
		a.ServerAssignments += x.ServerAssignments
		a.Xacts += x.Xacts
		a.Queries += x.Queries
		a.Received += x.Received
		a.Sent += x.Sent
		xw += x.XactTimeUs * x.Xacts
		qw += x.QueryTimeUs * x.Queries
		ww += x.WaitTimeUs * x.ServerAssignments
		a.ClientParses += x.ClientParses
		a.ServerParses += x.ServerParses
		a.Binds += x.Binds
	}
	if a.Xacts > 0 {
		a.XactTimeUs = xw / a.Xacts
	}
	if a.Queries > 0 {
		a.QueryTimeUs = qw / a.Queries
	}
	if a.ServerAssignments > 0 {
		a.WaitTimeUs = ww / a.ServerAssignments
	}
	r := newResult(text("name"), numeric("value"))
	for _, kv := range []struct {
		name string
		v    uint64
	}{
		{"total_server_assignment_count", t.ServerAssignments}, {"total_xact_count", t.Xacts}, {"total_query_count", t.Queries},
		{"total_client_bytes", t.Received}, {"total_server_bytes", t.Sent}, {"total_xact_time", t.XactTimeUs},
		{"total_query_time", t.QueryTimeUs}, {"total_wait_time", t.WaitTimeUs}, {"total_ps_client_parse_count", t.ClientParses},
		{"total_ps_server_parse_count", t.ServerParses}, {"total_ps_bind_count", t.Binds},
		{"avg_server_assignment_count", a.ServerAssignments}, {"avg_xact_count", a.Xacts}, {"avg_query_count", a.Queries},
		{"avg_client_bytes", a.Received}, {"avg_server_bytes", a.Sent}, {"avg_xact_time", a.XactTimeUs},
		{"avg_query_time", a.QueryTimeUs}, {"avg_wait_time", a.WaitTimeUs}, {"avg_ps_client_parse_count", a.ClientParses},
		{"avg_ps_server_parse_count", a.ServerParses}, {"avg_ps_bind_count", a.Binds},
	} {
		r.row(kv.name, kv.v)
	}
	return r
}

// socketColumns are SHOW CLIENTS' and SHOW SERVERS' 21 columns.
func socketColumns() []column {
	return []column{text("type"), text("user"), text("database"), text("replication"), text("state"), text("addr"),
		int4("port"), text("local_addr"), int4("local_port"), text("connect_time"), text("request_time"), int4("wait"),
		int4("wait_us"), int4("close_needed"), text("ptr"), text("link"), int4("remote_pid"), text("tls"),
		text("application_name"), int4("prepared_statements"), int4("id")}
}

// showClients lists client connections, console connections included.
func (c *Console) showClients() *resultSet {
	r := newResult(append(socketColumns(), text("pinned"))...)
	for _, ci := range c.p.Clients() {
		state, database := "idle", ci.Database
		switch {
		case ci.Console:
			state, database = "active", adminDatabase
		case ci.Link != "":
			state = "active"
		case ci.Waiting:
			state = "waiting"
		}
		r.row(append(clientRow(ci, state, database), ci.Pinned)...)
	}
	return r
}

// clientRow is a client's 21 socket columns (socketColumns).
func clientRow(ci proxy.ClientInfo, state, database string) []any {
	addr, port := splitAddr(ci.RemoteAddr)
	laddr, lport := splitAddr(ci.LocalAddr)
	return []any{"C", ci.User, database, orNone(ci.Replication), state, addr, port, laddr, lport,
		pgTime(ci.ConnectedAt), pgTime(ci.LastRequest),
		int(ci.Wait / time.Second), int((ci.Wait % time.Second) / time.Microsecond), 0, ci.Ptr, ci.Link, 0, "",
		ci.AppName, ci.PreparedStatements, ci.ID}
}

// serverRow is a server connection's 21 socket columns.
func serverRow(si proxy.ServerInfo, state string) []any {
	addr, port := splitAddr(si.RemoteAddr)
	laddr, lport := splitAddr(si.LocalAddr)
	return []any{"S", si.ServerUser, si.Database, orNone(si.Replication), state, addr, port, laddr, lport,
		pgTime(si.Created), pgTime(si.LastUsed), 0, 0, b2i(si.CloseNeeded), si.Ptr, si.Link,
		int(si.PID), si.TLS, si.AppName, 0, si.ID}
}

// socketDebugColumns are SHOW SOCKETS' 7 buffer columns, after the 21;
// noBuffers are their values: poolerd keeps no per-socket buffer positions.
func socketDebugColumns() []column {
	return []column{int4("recv_pos"), int4("pkt_pos"), int4("pkt_remain"), int4("send_pos"),
		int4("send_remain"), int4("pkt_avail"), int4("send_avail")}
}

func noBuffers() []any { return []any{0, 0, 0, 0, 0, 0, 0} }

// showPinned lists the clients pinned to their server connection by
// session state (a poolerd addition): why, for how long, and on which
// backend, longest first.
func (c *Console) showPinned() *resultSet {
	r := newResult(text("user"), text("database"), text("addr"), int4("port"), text("application_name"),
		text("reason"), numeric("pinned_seconds"), numeric("idle_seconds"), int4("server_pid"), int4("id"))
	clients := c.p.Clients()
	sort.SliceStable(clients, func(i, j int) bool { return clients[i].PinnedFor > clients[j].PinnedFor })
	for _, ci := range clients {
		if ci.Pinned == "" {
			continue
		}
		idle := time.Duration(0)
		if !ci.LastRequest.IsZero() {
			idle = max(time.Since(ci.LastRequest), 0)
		}
		addr, port := splitAddr(ci.RemoteAddr)
		r.row(ci.User, ci.Database, addr, port, ci.AppName, ci.Pinned,
			fmt.Sprintf("%.3f", ci.PinnedFor.Seconds()), fmt.Sprintf("%.3f", idle.Seconds()), int(ci.ServerPID), ci.ID)
	}
	return r
}

// showRateLimits lists every bucket of every rate-limit rule (a poolerd
// addition): its limit, what it counts, and what it refused, charged and
// delayed since the rules were compiled (start or reload).
func (c *Console) showRateLimits() *resultSet {
	r := newResult(text("rule"), text("bucket"), text("kind"), numeric("limit"), text("unit"), numeric("per_seconds"),
		text("mode"), numeric("max_wait_seconds"), text("key_by"), text("backend"), numeric("refused"),
		numeric("charged"), numeric("debt_waits"))
	for _, rl := range c.p.RateLimits() {
		kind := "count"
		charged, waits := any(null{}), any(null{})
		if rl.Measured {
			kind = "measured"
			charged, waits = strconv.FormatFloat(rl.Charged, 'f', -1, 64), strconv.FormatFloat(rl.DebtWaits, 'f', -1, 64)
		}
		r.row(rl.Rule, rl.Bucket, kind, rl.Limit, rl.Unit, strconv.FormatFloat(rl.Per.Seconds(), 'f', -1, 64),
			rl.Mode, strconv.FormatFloat(rl.MaxWait.Seconds(), 'f', -1, 64), rl.KeyBy, rl.Backend,
			strconv.FormatFloat(rl.Refused, 'f', -1, 64), charged, waits)
	}
	return r
}

// showHosts lists each pool's servers (a poolerd addition): the one host
// of a single-server pool, or each of an entry's hosts, with the role it
// reported at the latest login, its open connections and failed connects
// in a row.
func (c *Console) showHosts() *resultSet {
	r := newResult(text("database"), text("user"), text("host"), text("role"), int4("connections"),
		int4("connect_failures"), text("last_error"), int4("idle"), int4("active"), numeric("hits"), numeric("misses"),
		numeric("hit_rate"), numeric("evictions"), numeric("idle_timeout_seconds"), int4("max_size"))
	for _, ps := range c.sortedPools() {
		for _, h := range ps.Hosts {
			var evictions uint64
			for _, n := range h.Closes {
				evictions += n
			}
			r.row(ps.Database, ps.User, h.Host, h.Role, h.Open, h.Failures, h.LastErr, h.Idle, max(h.Open-h.Idle, 0),
				h.Hits, h.Misses, strconv.FormatFloat(h.HitRate(), 'f', 4, 64), evictions,
				strconv.FormatFloat(h.IdleTimeout.Seconds(), 'f', -1, 64), h.MaxSize)
		}
	}
	return r
}

// orNone is a replication mode as PgBouncer's replication column shows it.
func orNone(mode string) string {
	if mode == "" {
		return "none"
	}
	return mode
}

// showServers lists server connections.
func (c *Console) showServers() *resultSet {
	r := newResult(socketColumns()...)
	for _, si := range c.p.Servers() {
		r.row(serverRow(si, serverState(si))...)
	}
	return r
}

// showSockets lists every client and server connection, as SHOW CLIENTS
// and SHOW SERVERS do, under PgBouncer's socket states (cl_active,
// cl_waiting, sv_active, sv_idle, sv_used, sv_tested, sv_login), with its 7
// buffer columns. poolerd keeps no per-socket buffer positions (a session's
// bytes are relayed as they are read), so those are 0.
func (c *Console) showSockets() *resultSet {
	r := newResult(append(socketColumns(), socketDebugColumns()...)...)
	for _, ci := range c.p.Clients() {
		state, database := "cl_active", ci.Database
		switch {
		case ci.Console:
			database = adminDatabase
		case ci.Link == "" && ci.Waiting:
			state = "cl_waiting"
		}
		r.row(append(clientRow(ci, state, database), noBuffers()...)...)
	}
	for _, si := range c.p.Servers() {
		state := "sv_" + serverState(si)
		if state == "sv_active_cancel" {
			state = "sv_active"
		}
		r.row(append(serverRow(si, state), noBuffers()...)...)
	}
	return r
}

// showActiveSockets is PgBouncer's list of the sockets with data in their
// buffers: SHOW SOCKETS' columns, and no rows, since poolerd keeps no
// per-socket buffers (a session's bytes are relayed as they are read).
func (c *Console) showActiveSockets() *resultSet {
	return newResult(append(socketColumns(), socketDebugColumns()...)...)
}

// showMem is PgBouncer's memory report (name, size, used, free, memtotal)
// in byte units (size 1): where PgBouncer lists its slab caches, poolerd
// lists the Go runtime's heap, goroutine stacks and the runtime's own
// structures.
func (c *Console) showMem() *resultSet {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	r := newResult(text("name"), int4("size"), numeric("used"), numeric("free"), numeric("memtotal"))
	r.row("heap", 1, m.HeapInuse, m.HeapIdle-m.HeapReleased, m.HeapSys-m.HeapReleased)
	r.row("stacks", 1, m.StackInuse, m.StackSys-m.StackInuse, m.StackSys)
	other := m.MSpanSys + m.MCacheSys + m.BuckHashSys + m.GCSys + m.OtherSys
	r.row("runtime", 1, other, 0, other)
	return r
}

// showPeers lists the peers of peer_id's group (PgBouncer's [peers]),
// this poolerd's own entry aside, with the bound on cancel requests in
// flight to each; showPeerPools those requests (poolerd opens one
// connection per request, so sv_active_cancel is cl_active_cancel_req and
// sv_login 0).
func (c *Console) showPeers() *resultSet {
	cfg := c.p.Config()
	r := newResult(int4("peer_id"), text("host"), int4("port"), int4("pool_size"))
	for _, p := range cfg.Peers {
		if p.ID == cfg.PeerID {
			continue
		}
		size := p.PoolSize
		if size == 0 {
			size = cfg.MaxSize
		}
		r.row(p.ID, p.Host, p.Port, size)
	}
	return r
}

func (c *Console) showPeerPools() *resultSet {
	r := newResult(int4("peer_id"), int4("cl_active_cancel_req"), int4("cl_waiting_cancel_req"),
		int4("sv_active_cancel"), int4("sv_login"))
	for _, p := range c.p.PeerPools() {
		r.row(p.ID, p.Active, p.Waiting, p.Active, 0)
	}
	return r
}

// showDNSHosts and showDNSZones are PgBouncer's DNS cache: poolerd keeps
// none (host names are resolved at each connect by the system resolver),
// so they have no rows.
func (c *Console) showDNSHosts() *resultSet {
	return newResult(text("hostname"), int8c("ttl"), text("addrs"))
}

func (c *Console) showDNSZones() *resultSet {
	return newResult(text("zonename"), int8c("serial"), int4("count"))
}

// showDatabases lists configured databases, those with pools, and the
// admin database (17 columns).
func (c *Console) showDatabases() *resultSet {
	r := newResult(text("name"), text("host"), int4("port"), text("database"), text("force_user"), int4("pool_size"),
		int4("min_pool_size"), int4("reserve_pool_size"), int4("server_lifetime"), text("pool_mode"),
		text("load_balance_hosts"), int4("max_connections"), int4("current_connections"), int4("max_client_connections"),
		int4("current_client_connections"), int4("paused"), int4("disabled"))
	cfg := c.p.Config()
	first := cfg.ListenAddrs()[0] // validated: at least one
	port, _ := strconv.Atoi(first[strings.LastIndexByte(first, ':')+1:])
	// Console logins count under max_db_client_connections as other
	// clients do (an admin is never refused by it).
	_, consoleMax := cfg.DBLimits(adminDatabase)
	r.row(adminDatabase, null{}, port, adminDatabase, adminDatabase, 0, 0, 0, 0, "statement", null{}, 0, 0, consoleMax, c.consoleSessions(), 0, 0)
	type dbRow struct {
		name    string
		entry   *config.Database
		servers int
		clients int
	}
	rows := map[string]*dbRow{}
	for i := range cfg.Databases {
		d := &cfg.Databases[i]
		rows[d.Name] = &dbRow{name: d.Name, entry: d}
	}
	for _, p := range c.p.Pools() {
		row := rows[p.Database]
		if row == nil {
			row = &dbRow{name: p.Database}
			rows[p.Database] = row
		}
		row.servers += p.Total
		row.clients += int(p.Clients)
	}
	// Databases paused (KILL) or disabled with no pool now still show, so
	// the flags explain why their clients wait or are refused.
	state := c.p.PauseState()
	for name, st := range state.Databases {
		if (st.Paused || st.Disabled) && rows[name] == nil {
			rows[name] = &dbRow{name: name}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(rows)) {
		row := rows[n]
		route, err := cfg.Route(n, "")
		if n == config.WildcardDatabase {
			route, err = cfg.Route("*", "")
			route.DBName = ""
		}
		var host, dbname, forceUser, poolMode, balance any = null{}, n, null{}, null{}, null{}
		set := cfg.PoolSettings
		if err == nil {
			switch {
			case len(route.Hosts) > 1:
				// As PgBouncer: the list as configured, and how it is
				// balanced.
				names := make([]string, len(route.Hosts))
				for i, h := range route.Hosts {
					names[i] = h.String()
				}
				host, balance = strings.Join(names, ","), cmp.Or(route.Balance, config.BalanceDisable)
			case !strings.HasPrefix(route.Host, "/"):
				host = route.Host
			}
			dbname = route.DBName
			if route.ForcedUser {
				forceUser = route.ServerUser
			}
			set = route.Settings
		}
		if row.entry != nil && row.entry.PoolMode != nil {
			poolMode = *row.entry.PoolMode
		}
		st := state.Databases[n]
		maxServers, maxClients := cfg.DBLimits(n)
		r.row(n, host, route.Port, dbname, forceUser, set.MaxSize, set.MinSize, set.ReservePoolSize, int(set.MaxLifetime/time.Second),
			poolMode, balance, maxServers, row.servers, maxClients, row.clients, b2i(state.Paused || st.Paused), b2i(st.Disabled))
	}
	return r
}

// showUsers lists the users poolerd knows (8 columns).
func (c *Console) showUsers() *resultSet {
	r := newResult(text("name"), text("pool_size"), text("reserve_pool_size"), text("pool_mode"),
		int4("max_user_connections"), int4("current_connections"), int4("max_user_client_connections"),
		int4("current_client_connections"))
	cfg := c.p.Config()
	servers, clients := map[string]int{}, map[string]int{}
	for _, p := range c.p.Pools() {
		servers[p.ServerUser] += p.Total
	}
	// Clients by the user they logged in as (a forced user's pool holds
	// clients of other names), console and replication ones included, as
	// PgBouncer counts them.
	for _, ci := range c.p.Clients() {
		clients[ci.User]++
	}
	overrides := map[string]config.Overrides{}
	for _, u := range cfg.Users {
		overrides[u.Name] = u.Overrides
	}
	// The users the configuration names, and those that only logins
	// brought (auth_query, trust, upstream): PgBouncer lists every user it
	// has met.
	known := map[string]bool{}
	names := []string{adminDatabase}
	for _, n := range cfg.UserNames() {
		known[n] = true
		names = append(names, n)
	}
	for _, m := range []map[string]int{clients, servers} {
		for n := range m {
			if !known[n] && n != adminDatabase {
				known[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names[1:])
	for _, n := range names {
		poolSize, reserveSize, poolMode := "", "", any(null{})
		if o, ok := overrides[n]; ok {
			if o.MaxSize != nil {
				poolSize = fmt.Sprintf("%9d", *o.MaxSize)
			}
			if o.ReservePoolSize != nil {
				reserveSize = fmt.Sprintf("%9d", *o.ReservePoolSize)
			}
			if o.PoolMode != nil {
				poolMode = *o.PoolMode
			}
		}
		var maxServers, maxClients int
		if n != adminDatabase {
			maxServers, maxClients = cfg.UserLimits(n)
		}
		r.row(n, poolSize, reserveSize, poolMode, maxServers, servers[n], maxClients, clients[n])
	}
	return r
}

// showConfig lists the top-level keys: key, value, default, changeable.
func (c *Console) showConfig() *resultSet {
	r := newResult(text("key"), text("value"), text("default"), text("changeable"))
	cur, def := c.p.Config(), config.Defaults()
	keys := config.Keys()
	sort.Slice(keys, func(i, j int) bool { return keys[i].Name < keys[j].Name })
	for _, k := range keys {
		r.row(k.Name, config.FormatValue(cur, k.Name), config.FormatValue(&def, k.Name), yesNo(!proxy.RestartRequired(k.Name)))
	}
	return r
}

// showLists: PgBouncer's 14 rows.
func (c *Console) showLists() *resultSet {
	r := newResult(text("list"), int4("items"))
	cfg := c.p.Config()
	dbs := map[string]bool{}
	for _, d := range cfg.Databases {
		dbs[d.Name] = true
	}
	pools := c.p.Pools()
	servers := 0
	for _, p := range pools {
		dbs[p.Database] = true
		servers += p.Total
	}
	clients, logins := c.p.ClientCount(), c.p.LoginCount()
	for _, kv := range []struct {
		name string
		n    int
	}{
		{"databases", len(dbs) + 1}, {"users", len(cfg.UserNames()) + 1}, {"peers", 0}, {"pools", len(pools) + 1},
		{"peer_pools", 0}, {"free_clients", 0}, {"used_clients", clients}, {"login_clients", logins},
		{"free_servers", 0}, {"used_servers", servers}, {"dns_names", 0}, {"dns_zones", 0}, {"dns_queries", 0}, {"dns_pending", 0},
	} {
		r.row(kv.name, kv.n)
	}
	return r
}

// averages returns the last stats period's averages by database, or none.
func (c *Console) averages() map[string]observe.Averages {
	if c.avg == nil {
		return nil
	}
	return c.avg.DatabaseAverages()
}
