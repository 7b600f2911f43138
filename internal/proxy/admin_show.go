package proxy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

const adminHelp = "\n\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION" +
	"\n\tSHOW LISTS|STATE" +
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
	"\n\tSHUTDOWN" +
	"\n\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS" +
	"\n\tWAIT_CLOSE [<db>]"

func text(name string) column    { return column{name, oidText} }
func int4(name string) column    { return column{name, oidInt4} }
func numeric(name string) column { return column{name, oidNumeric} }

// adminShow answers SHOW what.
func (s *session) adminShow(what, sql string) ([]byte, bool, *wire.Error) {
	srv := s.srv
	var r *resultSet
	switch what {
	case "HELP":
		notice := &wire.Error{Severity: "NOTICE", Code: "00000", Message: "Console usage", Detail: adminHelp}
		return appendCommandComplete(notice.AppendNotice(nil), "SHOW"), false, nil
	case "VERSION":
		r = newResult(text("version"))
		r.row(fmt.Sprintf("PgBouncer %s (poolerd %s)", pgbouncerVersion, srv.version()))
	case "STATE":
		srv.mu.Lock()
		paused := srv.paused
		srv.mu.Unlock()
		r = newResult(text("key"), text("value"))
		r.row("active", yesNo(!paused))
		r.row("paused", yesNo(paused))
		r.row("suspended", "no")
	case "POOLS":
		r = srv.showPools()
	case "STATS":
		r = srv.showStats()
	case "STATS_TOTALS", "STATS_AVERAGES":
		r = srv.showStatsTable(what == "STATS_AVERAGES")
	case "TOTALS":
		r = srv.showTotals()
	case "CLIENTS":
		r = srv.showClients()
	case "SERVERS":
		r = srv.showServers()
	case "DATABASES":
		r = srv.showDatabases()
	case "USERS":
		r = srv.showUsers()
	case "CONFIG":
		r = srv.showConfig()
	case "LISTS":
		r = srv.showLists()
	default:
		return nil, false, adminError("invalid command '%s', use SHOW HELP;", sql)
	}
	return r.done("SHOW"), false, nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// pools sorted by database and user, for stable console output.
func (srv *Server) sortedPools() []*dbPool {
	ps := srv.poolList()
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].key.database != ps[j].key.database {
			return ps[i].key.database < ps[j].key.database
		}
		return ps[i].key.user < ps[j].key.user
	})
	return ps
}

func (srv *Server) adminSessions() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	n := 0
	for _, s := range srv.sessions {
		if s.admin {
			n++
		}
	}
	return n
}

// showPools: exactly PgBouncer 1.25's 17 columns (tools pick a layout by
// column count; poolerd's health is in /stats and the metrics).
func (srv *Server) showPools() *resultSet {
	r := newResult(text("database"), text("user"), int4("cl_active"), int4("cl_waiting"),
		int4("cl_active_cancel_req"), int4("cl_waiting_cancel_req"), int4("sv_active"), int4("sv_active_cancel"),
		int4("sv_being_canceled"), int4("sv_idle"), int4("sv_used"), int4("sv_tested"), int4("sv_login"),
		int4("maxwait"), int4("maxwait_us"), text("pool_mode"), text("load_balance_hosts"))
	r.row(adminDatabase, adminDatabase, srv.adminSessions(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "statement", null{})
	for _, p := range srv.sortedPools() {
		st := p.pool.Stats()
		c := p.serverCounts()
		clients := int(p.clients.Load())
		wait := st.OldestWait
		r.row(p.key.database, p.key.user, max(clients-st.Waiting, 0), st.Waiting, 0, 0,
			c.active, c.cancelling, 0, c.idle, c.used, c.tested, st.Opening,
			int(wait/time.Second), int((wait%time.Second)/time.Microsecond),
			p.route().Settings.PoolMode, null{})
	}
	return r
}

type serverCounts struct{ active, cancelling, idle, used, tested int }

// serverCounts classifies a pool's open connections like PgBouncer's
// server states.
func (p *dbPool) serverCounts() serverCounts {
	var c serverCounts
	for _, sc := range p.pool.All() {
		switch p.serverState(sc) {
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
	}
	return c
}

// serverState is a connection's state in PgBouncer's terms: active (held by
// a client), active_cancel (a cancel request for it is in flight), idle,
// used (idle long enough to need validation before use), tested (poolerd
// runs its own query: validation, reset, parameter check).
func (p *dbPool) serverState(sc *serverConn) string {
	info := p.pool.Info(sc)
	sc.mu.Lock()
	cancelling := sc.cancelling
	sc.mu.Unlock()
	switch {
	case cancelling:
		return "active_cancel"
	case sc.owner.Load() != nil:
		return "active"
	case info.Idle && info.Stale:
		return "used"
	case info.Idle:
		return "idle"
	default:
		return "tested"
	}
}

// statsColumns are SHOW STATS' 23 columns (total_server_assignment_count
// second, as PgBouncer 1.25 sends them).
func (srv *Server) showStats() *resultSet {
	r := newResult(text("database"), numeric("total_server_assignment_count"), numeric("total_xact_count"),
		numeric("total_query_count"), numeric("total_received"), numeric("total_sent"), numeric("total_xact_time"),
		numeric("total_query_time"), numeric("total_wait_time"), numeric("total_client_parse_count"),
		numeric("total_server_parse_count"), numeric("total_bind_count"), numeric("avg_server_assignment_count"),
		numeric("avg_xact_count"), numeric("avg_query_count"), numeric("avg_recv"), numeric("avg_sent"),
		numeric("avg_xact_time"), numeric("avg_query_time"), numeric("avg_wait_time"), numeric("avg_client_parse_count"),
		numeric("avg_server_parse_count"), numeric("avg_bind_count"))
	totals, avgs := srv.DatabaseTotals(), srv.databaseAverages()
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
func statsDatabases(totals map[string]Totals) []string {
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
func (srv *Server) showStatsTable(averages bool) *resultSet {
	last := []string{"client_parse_count", "server_parse_count", "bind_count"}
	if averages {
		for i := range last {
			last[i] = "avg_" + last[i]
		}
	}
	r := newResult(text("database"), numeric("server_assignment_count"), numeric("xact_count"), numeric("query_count"),
		numeric("bytes_received"), numeric("bytes_sent"), numeric("xact_time"), numeric("query_time"), numeric("wait_time"),
		numeric(last[0]), numeric(last[1]), numeric(last[2]))
	totals, avgs := srv.DatabaseTotals(), srv.databaseAverages()
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
func (srv *Server) showTotals() *resultSet {
	var t Totals
	for _, x := range srv.DatabaseTotals() {
		t.Add(x)
	}
	var a Averages
	var xw, qw, ww uint64 // rate-weighted sums of the mean times
	for _, x := range srv.databaseAverages() {
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

func ptr(v any) string { return fmt.Sprintf("%p", v) }

// showClients lists client connections.
func (srv *Server) showClients() *resultSet {
	r := newResult(append(socketColumns(), text("pinned"))...)
	srv.mu.Lock()
	sessions := make([]*session, 0, len(srv.sessions))
	for _, s := range srv.sessions {
		sessions = append(sessions, s)
	}
	srv.mu.Unlock()
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].id < sessions[j].id })
	for _, s := range sessions {
		state, link, waitFor := "idle", "", time.Duration(0)
		if sc := s.server.Load(); sc != nil {
			state, link = "active", ptr(sc)
		} else if since := s.waitSince.Load(); since != 0 {
			state, waitFor = "waiting", time.Duration(srv.nanotime()-since)
		}
		if s.admin {
			state = "active"
		}
		addr, port := splitAddr(s.conn.RemoteAddr())
		laddr, lport := splitAddr(s.conn.LocalAddr())
		database := s.database
		if s.admin {
			database = adminDatabase
		}
		r.row("C", s.user, database, "none", state, addr, port, laddr, lport,
			pgTime(s.connectedAt), pgTime(srv.wallTime(s.lastReq.Load())),
			int(waitFor/time.Second), int((waitFor%time.Second)/time.Microsecond), 0, ptr(s), link, 0, "",
			s.appName(), s.preparedCount(), s.id, s.pinnedReason())
	}
	return r
}

// pinnedReason is why a transaction-mode client keeps its server
// connection ("" when it does not).
func (s *session) pinnedReason() string {
	if r := s.pinReason.Load(); r != nil {
		return *r
	}
	return ""
}

func (s *session) appName() string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.params["application_name"]
}

// wallTime converts the session clock to wall time (zero stays zero).
func (srv *Server) wallTime(nanotime int64) time.Time {
	if nanotime == 0 {
		return time.Time{}
	}
	return srv.started.Add(time.Duration(nanotime))
}

// showServers lists server connections.
func (srv *Server) showServers() *resultSet {
	r := newResult(socketColumns()...)
	for _, p := range srv.sortedPools() {
		conns := p.pool.All()
		sort.Slice(conns, func(i, j int) bool { return conns[i].ID() < conns[j].ID() })
		for _, sc := range conns {
			info := p.pool.Info(sc)
			state := p.serverState(sc)
			link, app := "", ""
			if own := sc.owner.Load(); own != nil {
				link, app = ptr(own), own.appName()
			}
			addr, port := splitAddr(sc.Conn.RemoteAddr())
			laddr, lport := splitAddr(sc.Conn.LocalAddr())
			r.row("S", p.route().ServerUser, p.key.database, "none", state, addr, port, laddr, lport,
				pgTime(info.Created), pgTime(info.LastUsed), 0, 0, b2i(info.CloseNeeded), ptr(sc), link,
				int(sc.PID), "", app, 0, info.ID)
		}
	}
	return r
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// showDatabases lists configured databases, those with pools, and the
// admin database (17 columns).
func (srv *Server) showDatabases() *resultSet {
	r := newResult(text("name"), text("host"), int4("port"), text("database"), text("force_user"), int4("pool_size"),
		int4("min_pool_size"), int4("reserve_pool_size"), int4("server_lifetime"), text("pool_mode"),
		text("load_balance_hosts"), int4("max_connections"), int4("current_connections"), int4("max_client_connections"),
		int4("current_client_connections"), int4("paused"), int4("disabled"))
	cfg := srv.cfg()
	port, _ := strconv.Atoi(cfg.Listen[strings.LastIndexByte(cfg.Listen, ':')+1:])
	r.row(adminDatabase, null{}, port, adminDatabase, adminDatabase, 0, 0, 0, 0, "statement", null{}, 0, 0, 0, srv.adminSessions(), 0, 0)
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
	for _, p := range srv.poolList() {
		row := rows[p.key.database]
		if row == nil {
			row = &dbRow{name: p.key.database}
			rows[p.key.database] = row
		}
		row.servers += p.pool.Stats().Total
		row.clients += int(p.clients.Load())
	}
	// Databases paused (KILL) or disabled with no pool now still show, so
	// the flags explain why their clients wait or are refused.
	srv.mu.Lock()
	for name, st := range srv.dbs {
		if (st.paused || st.disabled) && rows[name] == nil {
			rows[name] = &dbRow{name: name}
		}
	}
	srv.mu.Unlock()
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		row := rows[n]
		route, err := cfg.Route(n, "")
		if n == config.WildcardDatabase {
			route, err = cfg.Route("*", "")
			route.DBName = ""
		}
		var host, dbname, forceUser, poolMode any = null{}, n, null{}, null{}
		set := cfg.PoolSettings
		if err == nil {
			if !strings.HasPrefix(route.Host, "/") {
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
		paused, disabled := srv.dbFlags(n)
		r.row(n, host, route.Port, dbname, forceUser, set.MaxSize, set.MinSize, 0, int(set.MaxLifetime/time.Second),
			poolMode, null{}, 0, row.servers, 0, row.clients, b2i(paused), b2i(disabled))
	}
	return r
}

// showUsers lists the users poolerd knows (8 columns).
func (srv *Server) showUsers() *resultSet {
	r := newResult(text("name"), text("pool_size"), text("reserve_pool_size"), text("pool_mode"),
		int4("max_user_connections"), int4("current_connections"), int4("max_user_client_connections"),
		int4("current_client_connections"))
	cfg := srv.cfg()
	servers, clients := map[string]int{}, map[string]int{}
	for _, p := range srv.poolList() {
		servers[p.route().ServerUser] += p.pool.Stats().Total
		clients[p.key.user] += int(p.clients.Load())
	}
	overrides := map[string]config.Overrides{}
	for _, u := range cfg.Users {
		overrides[u.Name] = u.Overrides
	}
	names := append([]string{adminDatabase}, cfg.UserNames()...)
	sort.Strings(names[1:])
	for _, n := range names {
		poolSize, poolMode := "", any(null{})
		if o, ok := overrides[n]; ok {
			if o.MaxSize != nil {
				poolSize = fmt.Sprintf("%9d", *o.MaxSize)
			}
			if o.PoolMode != nil {
				poolMode = *o.PoolMode
			}
		}
		r.row(n, poolSize, "", poolMode, 0, servers[n], 0, clients[n])
	}
	return r
}

// showConfig lists the top-level keys: key, value, default, changeable.
func (srv *Server) showConfig() *resultSet {
	r := newResult(text("key"), text("value"), text("default"), text("changeable"))
	cur, def := srv.cfg(), config.Defaults()
	keys := config.Keys()
	sort.Slice(keys, func(i, j int) bool { return keys[i].Name < keys[j].Name })
	for _, k := range keys {
		r.row(k.Name, config.FormatValue(cur, k.Name), config.FormatValue(&def, k.Name), yesNo(!restartRequired(k.Name)))
	}
	return r
}

// showLists: PgBouncer's 14 rows.
func (srv *Server) showLists() *resultSet {
	r := newResult(text("list"), int4("items"))
	cfg := srv.cfg()
	dbs := map[string]bool{}
	for _, d := range cfg.Databases {
		dbs[d.Name] = true
	}
	pools := srv.poolList()
	servers := 0
	for _, p := range pools {
		dbs[p.key.database] = true
		servers += p.pool.Stats().Total
	}
	srv.mu.Lock()
	clients, logins := len(srv.sessions), len(srv.logins)
	srv.mu.Unlock()
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

// adminSet runs SET key = value: a top-level key that can change at run
// time, applied like a reload; others are refused with the reason.
func (s *session) adminSet(key, value string) ([]byte, bool, *wire.Error) {
	if !s.adminAll {
		return nil, false, errAdminAccess()
	}
	key = strings.ToLower(key)
	if restartRequired(key) {
		return nil, false, adminError("SET failed: %s can only change with a restart", key)
	}
	if err := s.srv.Set(key, value); err != nil {
		return nil, false, &wire.Error{Severity: "ERROR", Code: "08P01", Message: "SET failed", Detail: err.Error(),
			Hint: "SHOW CONFIG lists the keys; durations need a unit (30s), lists are comma-separated"}
	}
	s.log.Info("admin console: setting changed", logField(key, value))
	shown := value
	if key == "upstream" || key == "redis_url" {
		shown = config.FormatValue(s.srv.cfg(), key) // without the password
	}
	return appendCommandComplete(nil, "SET "+key+"="+shown), false, nil
}
