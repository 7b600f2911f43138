package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// The online hand-over of client connections (takeover_socket, --takeover):
// the old process passes each client whose session can go on elsewhere, at
// its next idle point, to the new process, which adopts it as logged in.
// The client notices nothing: its socket, its BackendKeyData, its session
// parameters and its prepared statements go on in the new process.
//
// A client can be passed when it uses transaction or statement pooling over
// plain TCP or a Unix socket, holds no server connection, is not pinned, and
// is between messages (nothing of a message read, no request refused
// half-way, no lost transaction owed). Others (TLS, session pooling, pinned)
// drain as on SIGTERM: they are ended at their next idle point.
//
// How one client goes: a claim (terminateIfIdle, at an idle point) sets its
// end error to errHandedOver and wakes its reader without a message (a read
// deadline, the parker, its event loop); the reader, the only goroutine
// that reads the client, passes it (handOverNow). A request read meanwhile
// takes the claim back (beginBatch) and runs here; the claim comes again at
// the next idle point.

// errHandedOver is the end error of a session claimed for the hand-over.
// It is never sent: a session that cannot be passed after all is ended with
// errShuttingDown.
var errHandedOver = &wire.Error{Severity: "FATAL", Code: "57P01", Message: "handed over to a new poolerd (takeover)"}

// handOverFunc passes a client's socket and state to the new process.
type handOverFunc func(f *os.File, state []byte) error

// handingOver reports whether idle clients are being handed over.
func (srv *Server) handingOver() bool { return srv.handOver.Load() != nil }

// HandOver stops accepting clients and passes each connected client that
// can go on in the new process to send, at its next idle point; the others
// are ended at theirs, as in Drain. It returns once every client has gone
// or ctx ends (then the rest are closed), after closing the pools.
func (srv *Server) HandOver(ctx context.Context, send func(f *os.File, state []byte) error) error {
	fn := handOverFunc(send)
	srv.handOver.Store(&fn)
	return srv.drain(ctx, func() {
		// Idle clients have no idle point to wait for: claimed here (a
		// claim taken back by a request comes again).
		for _, s := range srv.sessionList() {
			if s.handOverable() {
				s.terminateIfIdle()
			}
		}
	})
}

// sessionList returns the client sessions.
func (srv *Server) sessionList() []*session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.sessionListLocked()
}

// sessionListLocked is sessionList with srv.mu held.
func (srv *Server) sessionListLocked() []*session {
	out := make([]*session, 0, len(srv.sessions))
	for _, s := range srv.sessions {
		out = append(out, s)
	}
	return out
}

// handOverable reports whether the session is of a kind that can be
// handed over (what is fixed at login, and its pinning).
func (s *session) handOverable() bool {
	if s.tls || !s.stateful || s.pinReason.Load() != nil {
		return false
	}
	switch s.conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// endAtIdlePoint ends the session at an idle point of a shutdown or drain,
// found by its server's reader: with 57P01, or, during a hand-over, by
// passing it to the new poolerd.
func (s *session) endAtIdlePoint() {
	if s.srv.handingOver() && s.handOverable() {
		s.terminateIfIdle()
		return
	}
	s.terminate(errShuttingDown())
}

// wakeToHandOver wakes the session's reader, wherever it waits, to pass
// the session (no message, no half-close).
func (s *session) wakeToHandOver() {
	_ = s.conn.SetReadDeadline(time.Now())
	s.srv.parker.wake(s)
	s.wakeLoop()
}

// unclaim takes back a hand-over claim: the client sent a request, which
// runs here (beginBatch, on the session's reader).
func (s *session) unclaim() {
	if s.endErr.Load() == errHandedOver {
		s.endErr.CompareAndSwap(errHandedOver, nil)
	}
}

// handOverNow passes a claimed session to the new process, on the
// session's reader, and ends it here; a session that cannot be passed
// after all is ended with 57P01. It returns false if the session was not
// claimed for a hand-over (its end is its caller's).
func (s *session) handOverNow() bool {
	if s.endErr.Load() != errHandedOver {
		return false
	}
	fn := s.srv.handOver.Load()
	state, why := s.handOverState()
	if fn != nil && why == "" {
		err := s.passTo(*fn, state)
		if err == nil {
			s.handedOver.Store(true)
			s.end(nil)
			return true
		}
		why = err.Error()
	}
	s.log.Warn("client not handed over to the new poolerd; ending it", zap.String("reason", why))
	s.endErr.CompareAndSwap(errHandedOver, nil)
	s.fail(errShuttingDown())
	s.end(nil)
	return true
}

// passTo sends the session's socket and state with fn.
func (s *session) passTo(fn handOverFunc, state []byte) error {
	type filer interface{ File() (*os.File, error) }
	fc, ok := s.conn.(filer)
	if !ok {
		return errors.New("the client connection has no descriptor to pass")
	}
	// The new process gets the socket; what this one still had to send
	// (kept on the loop for a client that had not read it) goes first.
	s.wmu.Lock()
	var err error
	if s.cio != nil && s.cio.Kept() > 0 {
		_ = s.conn.SetWriteDeadline(time.Now().Add(finalWriteTimeout))
		err = s.cio.Write(nil)
		_ = s.conn.SetWriteDeadline(time.Time{})
		s.keptSentLocked()
	}
	s.wmu.Unlock()
	if err != nil {
		return err
	}
	f, err := fc.File()
	if err != nil {
		return err
	}
	defer f.Close()
	return fn(f, state)
}

// handOver is what a session carries to the new process.
type handOver struct {
	Database    string            `json:"database"`
	User        string            `json:"user"`
	PID         uint32            `json:"pid"`
	Key         uint32            `json:"key"`
	Params      map[string]string `json:"params"`
	ConnectedAt time.Time         `json:"connected_at"`
	Statements  []handOverStmt    `json:"statements,omitempty"`
	// ClientKey is the SCRAM ClientKey the client's login proved, with
	// which the pool logs in to PostgreSQL for a user whose password
	// poolerd does not know (auth_query, pass-through). It crosses only
	// takeover_socket, between two poolerd processes.
	ClientKey []byte `json:"client_key,omitempty"`
	// Custom names the customized options (myapp.tenant) the client set
	// or reset, which each settings snapshot reads by name.
	Custom []string `json:"custom,omitempty"`
}

// handOverStmt is one of the client's prepared statements: its name and
// its definition's key (search_path, NUL, the Parse body after the name).
type handOverStmt struct {
	Name     string `json:"name"`
	Key      []byte `json:"key"`
	Settings bool   `json:"settings,omitempty"`
	Calls    bool   `json:"calls,omitempty"`
	Commits  bool   `json:"commits,omitempty"`
}

// handOverState encodes the session, or says why it cannot be passed (on
// the session's reader, which owns the frame state).
func (s *session) handOverState() ([]byte, string) {
	switch {
	case !s.handOverable():
		return nil, "a TLS, session-mode or pinned client"
	case s.ncarry > 0 || !s.cur.AtBoundary() || s.hold || s.refusing || s.unsynced:
		return nil, "the client is in the middle of a request"
	case s.server.Load() != nil || s.severed.Load() || s.owed.Load() != nil || s.failedBlock.Load():
		return nil, "the client is in a transaction"
	}
	st := handOver{Database: s.database, User: s.user, PID: s.pid, Key: s.key, ConnectedAt: s.connectedAt, ClientKey: s.clientKey}
	s.pmu.Lock()
	st.Params = maps.Clone(s.params)
	s.pmu.Unlock()
	st.Custom = s.customOptions()
	s.stmu.Lock()
	for name, d := range s.stmts {
		st.Statements = append(st.Statements, handOverStmt{Name: name, Key: []byte(d.key),
			Settings: d.eff.Settings, Calls: d.eff.Calls, Commits: d.eff.Commits})
	}
	s.stmu.Unlock()
	b, err := json.Marshal(&st)
	if err != nil {
		return nil, err.Error()
	}
	return b, ""
}

// AdoptClient takes over a client connection the old poolerd passed
// (takeover): f is its socket (AdoptClient closes it), state what the old
// process's HandOver encoded. The client goes on as logged in; one that
// cannot (its database is gone from this configuration, a limit) gets a
// FATAL that says why.
func (srv *Server) AdoptClient(f *os.File, state []byte) {
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		srv.log.Warn("could not adopt a client from the old poolerd", zap.Error(err))
		return
	}
	var st handOver
	if err := json.Unmarshal(state, &st); err != nil {
		srv.log.Warn("could not adopt a client from the old poolerd: its state does not decode", zap.Error(err))
		_ = nc.Close()
		return
	}
	cfg := srv.cfg()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		if o := tcpOptions(cfg, clientKeepAlive); o != nil {
			_ = o.Apply(tc)
		} else {
			_ = tc.SetKeepAlive(true)
			_ = tc.SetKeepAlivePeriod(clientKeepAlive)
		}
	}
	s := &session{srv: srv, conn: nc, id: srv.connIDs.Add(1), addr: clientAddr(nc), connectedAt: st.ConnectedAt}
	s.yieldFn = s.yieldLoop
	s.log = sessionLog{s}
	s.timeoutsP.Store(&s.srv.noTimeouts)
	s.database, s.user = st.Database, st.User
	if werr := s.adopt(&st, cfg); werr != nil {
		s.releaseClientSlot()
		_ = nc.SetWriteDeadline(time.Now().Add(finalWriteTimeout))
		_, _ = nc.Write(werr.Append(nil))
		lingerClose(nc)
		s.log.Warn("client from the old poolerd refused", zap.String("sqlstate", werr.Code), zap.String("reason", werr.Message))
		return
	}
	if cfg.LogConnections {
		s.log.Info("client adopted from the old poolerd", zap.String("pool_mode", s.mode),
			zap.String("application_name", s.params["application_name"]), zap.Int("prepared_statements", len(st.Statements)))
	}
	s.startRelay()
}

// adopt sets up an adopted session as startup does for a login, and
// registers it under its BackendKeyData.
func (s *session) adopt(st *handOver, cfg *config.Config) *wire.Error {
	if werr := s.srv.admitClient(s.database, s.user); werr != nil {
		return wireError(werr)
	}
	s.admitted.Store(true)
	route, err := cfg.Route(s.database, s.user)
	if err != nil {
		return errNoSuchDatabase(s.database)
	}
	dbp, err := s.srv.joinPool(s.database, s.user)
	if err != nil {
		return errNoSuchDatabase(s.database)
	}
	defer dbp.joining.Add(-1) // counted in clients by then, or failed
	s.useRoute(dbp, route, cfg)
	// What the pool logs in to PostgreSQL with when no password is
	// configured for the user, as a login would have given it.
	s.clientKey = st.ClientKey
	dbp.setClientKey(s.clientKey)
	if _, known := cfg.ClientSecret(s.user); !known && cfg.AuthLookup(s.database).User != "" {
		ctx, cancel := context.WithTimeout(s.srv.ctx, 10*time.Second)
		secret, found, werr := s.srv.lookupSecret(ctx, cfg, s.database, s.user)
		cancel()
		if werr != nil {
			return werr
		}
		if found && secret.Kind() != 0 {
			dbp.setQuerySecret(secret)
		}
	}
	if !s.stateful {
		return &wire.Error{Severity: "FATAL", Code: "57P01", Message: "terminating connection: the new poolerd runs this database in session mode",
			Hint: "reconnect"}
	}
	s.params = st.Params
	if s.params == nil {
		s.params = map[string]string{}
	}
	for _, n := range st.Custom {
		if s.custom == nil {
			s.custom = map[string]bool{}
		}
		s.custom[n] = true
	}
	s.pkey = txstate.ParamsKey(s.params)
	if set, ok := dbp.shareParams(s.pkey, s.params); ok {
		s.params, s.pkey, s.paramsShared = set.params, set.key, true
	}
	if s.tracked {
		for _, h := range st.Statements {
			sp, rest, ok := strings.Cut(string(h.Key), "\x00")
			if !ok {
				continue
			}
			// The definition's effects come from its text (acquire), as
			// in the process that handed it over.
			d := s.srv.stmts.acquire(sp, []byte(rest))
			s.stmu.Lock()
			if old := s.stmts[h.Name]; old != nil {
				s.srv.stmts.release(old)
			}
			s.stmtSet(h.Name, d)
			s.stmu.Unlock()
		}
	}
	s.srv.registerAs(s, st.PID, st.Key)
	dbp.clients.Add(1) // end() takes it back
	return nil
}
