package proxy

import (
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/poolerd/poolerd/internal/pool"
)

// Snapshots for the admin console (internal/console) and other readers:
// plain copies of the proxy's state, built here under the proxy's own
// locks, that the caller owns. Each one is consistent in itself; two
// snapshots taken one after the other may disagree a little.

// ClientInfo describes one logged-in client: a pool's client or an admin
// console connection.
type ClientInfo struct {
	// ID numbers the connection among clients and server connections.
	ID             uint64
	User, Database string
	// Console: an admin console connection (it holds no pool).
	Console               bool
	RemoteAddr, LocalAddr net.Addr
	ConnectedAt           time.Time
	// LastRequest is when the client last sent a request; zero if never.
	LastRequest time.Time
	// Ptr identifies the connection as PgBouncer's ptr column does (%p);
	// Link is the Ptr of the server connection it holds, "" if none.
	Ptr, Link string
	// Waiting: a request waits for a server connection, for Wait.
	Waiting bool
	Wait    time.Duration
	AppName string
	// PreparedStatements counts the client's mapped prepared statements;
	// Pinned is why it keeps its server connection ("" if it does not),
	// since PinnedFor.
	PreparedStatements int
	Pinned             string
	PinnedFor          time.Duration
	// ServerPID is the backend process of the server connection it holds
	// (0 if none).
	ServerPID uint32
}

// ServerInfo describes one open server connection.
type ServerInfo struct {
	pool.ConnInfo
	// Database and User name its pool; ServerUser is the role it logged
	// in as.
	Database, User, ServerUser string
	RemoteAddr, LocalAddr      net.Addr
	// PID is the backend's process id.
	PID uint32
	// Ptr identifies the connection (%p); Link is the Ptr of the client
	// holding it, "" if none, and AppName that client's application_name.
	Ptr, Link, AppName string
	// Cancelling: a cancel request for its backend is in flight.
	Cancelling bool
}

// DatabaseState is what the console set for one database.
type DatabaseState struct {
	Paused   bool // PAUSE db, or KILL db until RESUME db
	Disabled bool // DISABLE db
}

// PauseState is the global pause and the databases the console paused,
// killed or disabled.
type PauseState struct {
	Paused    bool
	Databases map[string]DatabaseState
}

func ptr(v any) string { return fmt.Sprintf("%p", v) }

// Clients returns every logged-in client, console connections included,
// by ID.
func (srv *Server) Clients() []ClientInfo {
	srv.mu.Lock()
	sessions := make([]*session, 0, len(srv.sessions))
	for _, s := range srv.sessions {
		sessions = append(sessions, s)
	}
	consoles := make([]*ConsoleConn, 0, len(srv.consoles))
	for _, c := range srv.consoles {
		consoles = append(consoles, c)
	}
	srv.mu.Unlock()
	out := make([]ClientInfo, 0, len(sessions)+len(consoles))
	for _, s := range sessions {
		ci := ClientInfo{ID: s.id, User: s.user, Database: s.database, RemoteAddr: s.conn.RemoteAddr(),
			LocalAddr: s.conn.LocalAddr(), ConnectedAt: s.connectedAt, LastRequest: srv.wallTime(s.lastReq.Load()),
			Ptr: ptr(s), AppName: s.appName(), PreparedStatements: s.preparedCount(), Pinned: s.pinnedReason()}
		if since := s.pinnedSince.Load(); ci.Pinned != "" && since != 0 {
			ci.PinnedFor = time.Duration(srv.nanotime() - since)
		}
		if sc := s.server.Load(); sc != nil {
			ci.Link, ci.ServerPID = ptr(sc), sc.PID
		} else if since := s.waitSince.Load(); since != 0 {
			ci.Waiting, ci.Wait = true, time.Duration(srv.nanotime()-since)
		}
		out = append(out, ci)
	}
	for _, c := range consoles {
		out = append(out, ClientInfo{ID: c.ID, User: c.User, Database: c.Database, Console: true,
			RemoteAddr: c.Conn.RemoteAddr(), LocalAddr: c.Conn.LocalAddr(), ConnectedAt: c.ConnectedAt,
			LastRequest: srv.wallTime(c.lastReq.Load()), Ptr: ptr(c)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Servers returns every open server connection, by pool (database, user)
// and ID.
func (srv *Server) Servers() []ServerInfo {
	var out []ServerInfo
	for _, p := range srv.sortedPools() {
		route := p.route()
		conns := p.pool.All()
		sort.Slice(conns, func(i, j int) bool { return conns[i].ID() < conns[j].ID() })
		for _, sc := range conns {
			si := ServerInfo{ConnInfo: p.pool.Info(sc), Database: p.key.database, User: p.key.user,
				ServerUser: route.ServerUser, RemoteAddr: sc.Conn.RemoteAddr(), LocalAddr: sc.Conn.LocalAddr(),
				PID: sc.PID, Ptr: ptr(sc)}
			sc.mu.Lock()
			si.Cancelling = sc.cancelling
			sc.mu.Unlock()
			if own := sc.owner.Load(); own != nil {
				si.Link, si.AppName = ptr(own), own.appName()
			}
			out = append(out, si)
		}
	}
	return out
}

// PauseState returns the global pause and the databases' console flags.
func (srv *Server) PauseState() PauseState {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	ps := PauseState{Paused: srv.paused, Databases: make(map[string]DatabaseState, len(srv.dbs))}
	for name, st := range srv.dbs {
		ps.Databases[name] = DatabaseState{Paused: st.paused, Disabled: st.disabled}
	}
	return ps
}

// LoginCount returns the number of connections still logging in.
func (srv *Server) LoginCount() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return len(srv.logins)
}

// sortedPools returns the pools by database and user, for stable output.
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

// wallTime converts the session clock to wall time (zero stays zero).
func (srv *Server) wallTime(nanotime int64) time.Time {
	if nanotime == 0 {
		return time.Time{}
	}
	return srv.started.Add(time.Duration(nanotime))
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
