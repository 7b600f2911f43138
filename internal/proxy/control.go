package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// The control side of the admin console: what PAUSE, SUSPEND, RESUME,
// DISABLE, ENABLE, RECONNECT, KILL, KILL_CLIENT, WAIT_CLOSE and SHUTDOWN
// do to the proxy. internal/console parses the commands and words the
// replies; these methods only act, and report what stopped them with the
// errors below.

var (
	// ErrPaused: PAUSE, SUSPEND or KILL while the whole pooler is paused
	// or suspended.
	ErrPaused = errors.New("already paused")
	// ErrNotPaused: RESUME of a pooler or database that is not paused.
	ErrNotPaused = errors.New("not paused")
	// ErrDatabasesPaused: SUSPEND while a database is paused (PAUSE db,
	// KILL db), as PgBouncer refuses it.
	ErrDatabasesPaused = errors.New("databases paused")
	// ErrShutdownInProgress: RESUME while the pooler shuts down.
	ErrShutdownInProgress = errors.New("shutdown in progress")
)

// DatabaseKnown reports whether the console may act on database: it is
// configured (or matched by the wildcard or upstream) or has a pool.
func (srv *Server) DatabaseKnown(database string) bool {
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

// Pause pauses one database ("" for all) and waits until its server
// connections are closed: idle ones at once, busy ones when their client
// releases them. New requests wait (within checkout_timeout) until Resume.
// It returns ErrPaused if the pooler is paused already, and an error
// wrapping ctx's cause if ctx ends first: the pause stays until Resume or
// CancelPause.
func (srv *Server) Pause(ctx context.Context, database string) error {
	srv.mu.Lock()
	if srv.paused || srv.suspended {
		srv.mu.Unlock()
		return ErrPaused
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
			return fmt.Errorf("pause interrupted: %w", context.Cause(ctx))
		}
	}
	srv.log.Info("paused", zap.String("database", database))
	return nil
}

// Suspend stops all new work until Resume (SUSPEND): no pool hands out a
// server connection or opens one, so every request that needs one waits
// (within checkout_timeout), a login that must ask its server included;
// the server connections stay open, idle or held, and a client holding
// one (in a transaction, in session mode) goes on with it. It returns
// ErrPaused if the pooler is paused or suspended already,
// ErrDatabasesPaused while a database is, and ErrShutdownInProgress
// during a shutdown (which ends a suspension: stopAccepting).
func (srv *Server) Suspend() error {
	srv.mu.Lock()
	switch {
	case srv.paused || srv.suspended:
		srv.mu.Unlock()
		return ErrPaused
	case srv.shutting.Load() || srv.draining:
		srv.mu.Unlock()
		return ErrShutdownInProgress
	}
	for _, st := range srv.dbs {
		if st.paused {
			srv.mu.Unlock()
			return ErrDatabasesPaused
		}
	}
	srv.suspended = true
	pools := srv.poolListLocked()
	srv.mu.Unlock()
	for _, p := range pools {
		p.pool.Suspend()
	}
	srv.log.Info("suspended: no server connection is handed out until RESUME")
	return nil
}

// unsuspendLocked ends a suspension and returns the pools to take up
// (Pool.Unsuspend, called without srv.mu).
func (srv *Server) unsuspendLocked() []*dbPool {
	if !srv.suspended {
		return nil
	}
	srv.suspended = false
	return srv.poolListLocked()
}

// CancelPause ends a pause that Pause was interrupted in: the global pause
// for "", unconditionally, or the pause of database.
func (srv *Server) CancelPause(database string) {
	if database != "" {
		_ = srv.Resume(database)
		return
	}
	srv.mu.Lock()
	srv.paused = false
	srv.mu.Unlock()
	for _, p := range srv.poolList() {
		if paused, _ := srv.dbFlags(p.key.database); !paused {
			p.pool.Resume()
		}
	}
}

// Resume ends a pause of one database, or the global pause for "". It
// returns ErrShutdownInProgress or ErrNotPaused when there is nothing to
// resume.
func (srv *Server) Resume(database string) error {
	srv.mu.Lock()
	if database == "" {
		if srv.shutting.Load() || srv.draining {
			srv.mu.Unlock()
			return ErrShutdownInProgress
		}
		if pools := srv.unsuspendLocked(); pools != nil {
			srv.mu.Unlock()
			for _, p := range pools {
				p.pool.Unsuspend()
			}
			srv.log.Info("resumed", zap.String("database", database))
			return nil
		}
		if !srv.paused {
			srv.mu.Unlock()
			return ErrNotPaused
		}
		srv.paused = false
	} else {
		st, ok := srv.dbs[database]
		if !ok || !st.paused {
			srv.mu.Unlock()
			return fmt.Errorf("database %s: %w", database, ErrNotPaused)
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

// SetDisabled refuses (or again accepts) new clients of database.
func (srv *Server) SetDisabled(database string, disabled bool) {
	srv.mu.Lock()
	srv.dbStateLocked(database).disabled = disabled
	srv.mu.Unlock()
}

// Reconnect has the server connections of database ("" for all) closed
// and opened again as they come back to their pools: never mid-transaction.
func (srv *Server) Reconnect(database string) {
	for _, p := range srv.poolsOf(database) {
		p.pool.Reconnect()
	}
	srv.wakeForFastClose(database)
}

// WaitClose waits until the connections that Reconnect (or a reload) asked
// to close for database ("" for all) are gone. It returns an error wrapping
// ctx's error if ctx ends first.
func (srv *Server) WaitClose(ctx context.Context, database string) error {
	for _, p := range srv.poolsOf(database) {
		if err := p.pool.WaitReconnected(ctx); err != nil {
			return fmt.Errorf("wait close: %w", err)
		}
	}
	return nil
}

// Kill ends every client of database ("" for all) with an error, waits
// (killWait at most) until they are gone, closes its server connections
// and removes its pools; the database stays paused until
// Resume(database), so new clients wait. It returns ErrPaused if the
// pooler is paused or suspended.
func (srv *Server) Kill(database string) error {
	srv.mu.Lock()
	if srv.paused || srv.suspended {
		srv.mu.Unlock()
		return ErrPaused
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
		if database == "" || s.database == database {
			victims = append(victims, s)
		}
	}
	srv.warm = removePools(srv.warm, pools)
	srv.mu.Unlock()
	killed := &wire.Error{Severity: "FATAL", Code: "08P01", Message: "database removed",
		Hint: "an administrator ran KILL on this database; reconnect after RESUME"}
	for _, s := range victims {
		s.setDropReason(evictKilled)
		s.terminate(killed)
	}
	// As PgBouncer's: KILL answers once its clients are gone, so that a
	// SHOW CLIENTS after it no longer lists them.
	srv.waitForgotten(victims, killWait)
	srv.endReplication(database, killed)
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

// killWait bounds how long KILL and KILL_CLIENT wait for their clients to
// end: a client whose final message cannot be written (one that does not
// read) takes finalWriteTimeout.
const killWait = finalWriteTimeout + time.Second

// waitForgotten waits until none of victims is registered any more (each
// ends on its own goroutine or loop), or d has passed.
func (srv *Server) waitForgotten(victims []*session, d time.Duration) {
	if len(victims) == 0 {
		return
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		srv.mu.Lock()
		left := slices.ContainsFunc(victims, func(s *session) bool { return srv.sessions[s.id] == s })
		if !left {
			srv.mu.Unlock()
			return
		}
		if srv.forgot == nil {
			srv.forgot = make(chan struct{})
		}
		ch := srv.forgot
		srv.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return
		}
	}
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

// KillClient ends the logged-in client (a pool's client or a console
// connection) whose console id is id. It reports whether there was one.
func (srv *Server) KillClient(id uint64) bool {
	srv.mu.Lock()
	var victim *session
	for _, s := range srv.sessions {
		if s.id == id {
			victim = s
		}
	}
	var console ConsoleClient
	for _, c := range srv.consoles {
		if c.ID == id {
			console = c.client
		}
	}
	repl := srv.repl[id]
	srv.mu.Unlock()
	switch {
	case victim != nil:
		victim.terminate(errKilled())
		srv.waitForgotten([]*session{victim}, killWait)
	case console != nil:
		console.Terminate(errKilled())
	case repl != nil:
		repl.endWith(errKilled())
	default:
		return false
	}
	return true
}

// ShutdownRequests delivers SHUTDOWN commands from the console: "" (exit at
// once), "WAIT_FOR_SERVERS" or "WAIT_FOR_CLIENTS".
func (srv *Server) ShutdownRequests() <-chan string { return srv.shutdownReq }

// RequestShutdown asks the process to stop (see ShutdownRequests); a
// request already pending is not repeated.
func (srv *Server) RequestShutdown(mode string) {
	select {
	case srv.shutdownReq <- mode:
	default:
	}
}

// SetVersion sets the version SHOW VERSION reports.
func (srv *Server) SetVersion(v string) { srv.ver.Store(&v) }

// Version is the version set with SetVersion ("dev" without one).
func (srv *Server) Version() string {
	if v := srv.ver.Load(); v != nil {
		return *v
	}
	return "dev"
}
