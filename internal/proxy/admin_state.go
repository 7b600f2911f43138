package proxy

import (
	"context"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// databaseKnown reports whether the console may act on database: it is
// configured (or matched by the wildcard or upstream) or has a pool.
func (srv *Server) databaseKnown(database string) bool {
	if _, err := srv.cfg().Route(database, ""); err == nil {
		return true
	}
	return len(srv.poolsOf(database)) > 0
}

// poolsOf returns the pools of database, or all pools for "".
func (srv *Server) poolsOf(database string) []*dbPool {
	var out []*dbPool
	for _, p := range srv.poolList() {
		if database == "" || p.key.database == database {
			out = append(out, p)
		}
	}
	return out
}

func (srv *Server) dbStateLocked(database string) *dbState {
	st, ok := srv.dbs[database]
	if !ok {
		st = &dbState{}
		srv.dbs[database] = st
	}
	return st
}

// dbFlags returns whether database is paused and disabled.
func (srv *Server) dbFlags(database string) (paused, disabled bool) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	st, ok := srv.dbs[database]
	return srv.paused || ok && st.paused, ok && st.disabled
}

// pause pauses one database ("" for all) and waits until its server
// connections are closed: idle ones at once, busy ones when their client
// releases them. New requests wait (within checkout_timeout) until RESUME.
func (srv *Server) pause(ctx context.Context, database string) *wire.Error {
	srv.mu.Lock()
	if srv.paused {
		srv.mu.Unlock()
		return adminError("already suspended/paused")
	}
	if database == "" {
		srv.paused = true
	} else {
		srv.dbStateLocked(database).paused = true
	}
	srv.mu.Unlock()
	pools := srv.poolsOf(database)
	for _, p := range pools {
		p.pool.Pause()
	}
	srv.log.Info("pausing", zap.String("database", database))
	for _, p := range pools {
		if err := p.pool.WaitEmpty(ctx); err != nil {
			return nil // interrupted: the caller reports it
		}
	}
	srv.log.Info("paused", zap.String("database", database))
	return nil
}

// resume ends a pause of one database, or the global pause for "".
func (srv *Server) resume(database string) *wire.Error {
	srv.mu.Lock()
	if database == "" {
		if srv.shutting.Load() {
			srv.mu.Unlock()
			return adminError("pooler is shutting down")
		}
		if !srv.paused {
			srv.mu.Unlock()
			return adminError("pooler is not paused/suspended")
		}
		srv.paused = false
	} else {
		st, ok := srv.dbs[database]
		if !ok || !st.paused {
			srv.mu.Unlock()
			return adminError("database %s is not paused", database)
		}
		st.paused = false
	}
	srv.mu.Unlock()
	for _, p := range srv.poolsOf(database) {
		if paused, _ := srv.dbFlags(p.key.database); !paused {
			p.pool.Resume()
		}
	}
	srv.Warm() // configured pools a KILL removed come back
	srv.log.Info("resumed", zap.String("database", database))
	return nil
}

// resumeAll ends the global pause (a cancel request on the console).
func (srv *Server) resumeAll() {
	srv.mu.Lock()
	srv.paused = false
	srv.mu.Unlock()
	for _, p := range srv.poolList() {
		if paused, _ := srv.dbFlags(p.key.database); !paused {
			p.pool.Resume()
		}
	}
}

// setDisabled refuses (or again accepts) new clients of database.
func (srv *Server) setDisabled(database string, disabled bool) {
	srv.mu.Lock()
	srv.dbStateLocked(database).disabled = disabled
	srv.mu.Unlock()
}

// kill ends every client of database ("" for all) with an error, closes
// its server connections and removes its pools; the database stays paused
// until RESUME db, so new clients wait.
func (srv *Server) kill(database string) *wire.Error {
	srv.mu.Lock()
	if srv.paused {
		srv.mu.Unlock()
		return adminError("already suspended/paused")
	}
	var pools []*dbPool
	for k, p := range srv.pools {
		if database == "" || k.database == database {
			pools = append(pools, p)
			delete(srv.pools, k)
			srv.dbStateLocked(k.database).paused = true
		}
	}
	if database != "" {
		srv.dbStateLocked(database).paused = true
	}
	var victims []*session
	for _, s := range srv.sessions {
		if !s.admin && (database == "" || s.database == database) {
			victims = append(victims, s)
		}
	}
	srv.warm = removePools(srv.warm, pools)
	srv.mu.Unlock()
	for _, s := range victims {
		s.setDropReason(evictKilled)
		s.terminate(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "database removed",
			Hint: "an administrator ran KILL on this database; reconnect after RESUME"})
	}
	for _, p := range pools {
		p.pool.Close()
		srv.metrics.forget(p.key.database, p.key.user)
	}
	// Configured pools are created again, paused: readiness reports the
	// pause until RESUME.
	srv.Warm()
	srv.log.Warn("killed", zap.String("database", database), zap.Int("clients", len(victims)), zap.Int("pools", len(pools)))
	return nil
}

func removePools(list, gone []*dbPool) []*dbPool {
	out := list[:0]
	for _, p := range list {
		keep := true
		for _, g := range gone {
			if p == g {
				keep = false
			}
		}
		if keep {
			out = append(out, p)
		}
	}
	return out
}

// sessionByID finds a logged-in client by its console id.
func (srv *Server) sessionByID(id uint64) *session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, s := range srv.sessions {
		if s.id == id {
			return s
		}
	}
	return nil
}

// ShutdownRequests delivers SHUTDOWN commands from the console: "" (exit at
// once), "WAIT_FOR_SERVERS" or "WAIT_FOR_CLIENTS".
func (srv *Server) ShutdownRequests() <-chan string { return srv.shutdownReq }

func (srv *Server) requestShutdown(mode string) {
	select {
	case srv.shutdownReq <- mode:
	default:
	}
}

// SetVersion sets the version SHOW VERSION reports.
func (srv *Server) SetVersion(v string) { srv.ver.Store(&v) }

func (srv *Server) version() string {
	if v := srv.ver.Load(); v != nil {
		return *v
	}
	return "dev"
}
