package proxy

import (
	"fmt"
	"sync"

	"github.com/poolerd/poolerd/internal/wire"
)

// connLimits counts connections against max_client_conn and the per
// database and per user limits (PgBouncer's max_db_connections,
// max_user_connections, max_db_client_connections,
// max_user_client_connections).
type connLimits struct {
	mu                     sync.Mutex
	dbServers, userServers map[string]int
	dbClients, userClients map[string]int
}

func newConnLimits() *connLimits {
	return &connLimits{dbServers: map[string]int{}, userServers: map[string]int{},
		dbClients: map[string]int{}, userClients: map[string]int{}}
}

// serverLimit is a server connection limit that kept a pool from opening
// a connection: the key, its value, whose limit it is, and the count it
// had reached.
type serverLimit struct {
	key   string // max_db_connections or max_user_connections
	max   int
	whose string // database "x" or user "x"
	count int
	// fleet: the fleet-wide budget (fleet.go) refused; unavailable: its
	// Redis failed and on_redis_error is deny.
	fleet, unavailable bool
}

// admitServer takes a server-connection slot for (database, user), or
// returns the limit the database or the user is at.
func (srv *Server) admitServer(database, user string) *serverLimit {
	cfg := srv.cfg()
	dbMax, _ := cfg.DBLimits(database)
	userMax, _ := cfg.UserLimits(user)
	l := srv.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.dbServers[database]; dbMax > 0 && n >= dbMax {
		return &serverLimit{key: "max_db_connections", max: dbMax, whose: fmt.Sprintf("database %q", database), count: n}
	}
	if n := l.userServers[user]; userMax > 0 && n >= userMax {
		return &serverLimit{key: "max_user_connections", max: userMax, whose: fmt.Sprintf("user %q", user), count: n}
	}
	l.dbServers[database]++
	l.userServers[user]++
	return nil
}

// releaseServer gives a slot back and lets pools waiting for one try again.
func (srv *Server) releaseServer(database, user string) {
	l := srv.limits
	l.mu.Lock()
	l.dbServers[database]--
	l.userServers[user]--
	l.mu.Unlock()
	for _, p := range srv.poolList() {
		if p.key.database == database || p.route().ServerUser == user {
			p.pool.Nudge()
		}
	}
}

// makeRoom closes an idle server connection of another pool of database or
// user, when a pool could not open one because of their limit.
func (srv *Server) makeRoom(except *dbPool, database, user string) {
	for _, p := range srv.poolList() {
		if p != except && (p.key.database == database || p.route().ServerUser == user) && p.pool.CloseIdle() {
			return
		}
	}
}

// admitLogin checks a login before authentication, by what does not
// depend on the names the client claims, which anyone can claim:
// max_client_conn, and the connections buckets of the rules that match
// and key by the client's address only. It returns false after refusing
// the client. The rules that apply to the session are kept for its
// requests and for admitUser.
func (s *session) admitLogin(app string) bool {
	if werr := s.srv.admitConn(); werr != nil {
		s.refuseLogin(werr)
		return false
	}
	rates := s.srv.rates.Load().forSession(s.database, s.user, app, s.conn.RemoteAddr())
	if err := s.loginRate(rates, true); err != nil {
		s.refuseLogin(err)
		return false
	}
	if len(rates) > 0 {
		s.rates.Store(&rates)
	}
	return true
}

// admitUser checks a login once the client has authenticated, against what
// it claims: its database's and user's client connection limits (it is
// counted from now on; releaseClientSlot when it leaves), then the
// connections buckets of the other rules. So a client that fails to
// authenticate as a user spends none of that user's limits. It returns
// false after refusing the client.
func (s *session) admitUser() bool {
	if werr := s.srv.admitClient(s.database, s.user); werr != nil {
		s.refuseLogin(werr)
		return false
	}
	s.admitted.Store(true)
	if err := s.loginRate(s.sessionRates(), false); err != nil {
		s.refuseLogin(err)
		return false
	}
	return true
}

// admitConn checks a new client connection against max_client_conn.
func (srv *Server) admitConn() error {
	cfg := srv.cfg()
	srv.mu.Lock()
	total := len(srv.logins) + len(srv.sessions) + len(srv.consoles) + len(srv.repl)
	srv.mu.Unlock()
	if cfg.MaxClientConn > 0 && total > cfg.MaxClientConn {
		srv.rateMet.refusals.WithLabelValues("max_client_conn").Inc()
		return &wire.Error{Severity: "FATAL", Code: "53300", Message: "no more connections allowed (max_client_conn)",
			Detail: fmt.Sprintf("poolerd already has %d client connections", total-1),
			Hint:   "raise max_client_conn, or have clients use fewer connections"}
	}
	return nil
}

// admitClient checks an authenticated client against its database's and
// user's client limits, and counts it. The caller calls releaseClient when
// the client leaves.
func (srv *Server) admitClient(database, user string) error {
	cfg := srv.cfg()
	_, dbMax := cfg.DBLimits(database)
	_, userMax := cfg.UserLimits(user)
	l := srv.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if dbMax > 0 && l.dbClients[database] >= dbMax {
		srv.rateMet.refusals.WithLabelValues("max_db_client_connections").Inc()
		return &wire.Error{Severity: "FATAL", Code: "53300",
			Message: fmt.Sprintf("too many client connections to database %q (max_db_client_connections %d)", database, dbMax),
			Hint:    "raise max_db_client_connections for this database, or have clients use fewer connections"}
	}
	if userMax > 0 && l.userClients[user] >= userMax {
		srv.rateMet.refusals.WithLabelValues("max_user_client_connections").Inc()
		return &wire.Error{Severity: "FATAL", Code: "53300",
			Message: fmt.Sprintf("too many client connections for user %q (max_user_client_connections %d)", user, userMax),
			Hint:    "raise max_user_client_connections for this user, or have clients use fewer connections"}
	}
	l.dbClients[database]++
	l.userClients[user]++
	return nil
}

// countClient counts a client under its database's and user's client
// limits without checking them (an admin console login).
func (srv *Server) countClient(database, user string) {
	l := srv.limits
	l.mu.Lock()
	l.dbClients[database]++
	l.userClients[user]++
	l.mu.Unlock()
}

func (srv *Server) releaseClient(database, user string) {
	l := srv.limits
	l.mu.Lock()
	l.dbClients[database]--
	l.userClients[user]--
	l.mu.Unlock()
}
