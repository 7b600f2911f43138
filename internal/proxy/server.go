// Package proxy is poolerd's relay and the session logic around it: the
// client listener, the startup and authentication handshake, client
// sessions and their relay to pooled server connections (transaction-mode
// rewriting of prepared statements, session state and pins, parking idle
// clients, timeouts, connection and rate limits), cancel requests, reload
// and graceful shutdown. It exports read-only snapshots of its state and a
// few control methods.
//
// It does not serve the admin console (internal/console does, once the
// proxy has authenticated a console login and handed it over), compute
// statistics or metrics for operators (internal/observe reads the
// snapshots), serve HTTP (internal/health), or keep the pools of server
// connections themselves (internal/pool).
package proxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/authquery"
	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/netopt"
	"github.com/poolerd/poolerd/internal/pamauth"
	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/wire"
)

// Server accepts clients and pools their server connections. Create it with
// New, run Serve for each listener, and stop it with Shutdown or Close.
type Server struct {
	// Set by New, or by a setter before Serve (Instrument, SetVersion's
	// value aside); read-only afterwards. The values behind the pointers
	// guard themselves.
	log   *zap.Logger
	bufs  *wire.BufferPool
	obufs sync.Pool // buffers for batches rewritten out of place
	// noTimeouts is every session's limits until its login sets them:
	// none (never written). timeoutsMu guards timeoutsSet, the sessions'
	// shared limits (timeoutsFor).
	noTimeouts  timeouts
	timeoutsMu  sync.Mutex
	timeoutsSet map[timeouts]*timeouts
	// loginReaders are the logins' buffered readers (*bufio.Reader of
	// loginBufSize), reused.
	loginReaders sync.Pool
	stmts        *stmtRegistry // prepared statements shared by transaction-mode clients
	// scramKeys keeps the SCRAM keys of the plain passwords poolerd logs in
	// to PostgreSQL with (one PBKDF2 per role and salt).
	scramKeys *auth.SCRAMKeyCache
	// authCache keeps the secrets auth_query found (auth_cache_ttl).
	authCache authquery.Cache
	parker    *parker // idle client sessions without a goroutine
	// handOver, set by HandOver, passes idle clients to a new poolerd.
	handOver atomic.Pointer[handOverFunc]
	engine   *reactor.Engine // event loops (event_loops; internal/reactor)
	limits   *connLimits
	fleet    *fleetBudget // fleet_max_server_connections (fleet.go)
	// authDelays slows down repeated failed logins per address.
	authDelays authDelays
	rateMet    *rateMetrics
	peering    *peering // cancel requests for other peers (peering.go)
	metrics    *metrics // nil until Instrument
	// ctx ends when the server is closed; checkouts and cancel requests
	// give up with it.
	ctx         context.Context
	cancel      context.CancelFunc
	started     time.Time // origin of the sessions' clock (nanotime)
	shutdownReq chan string
	// mockKey derives stable fake SCRAM salts for unknown users, so that a
	// login attempt does not reveal which users exist.
	mockKey [32]byte
	// onFrame, set only by tests before Serve, is called on a client
	// session's goroutine for each frame header it reads, before the frame
	// is routed: tests use it to fail a server exactly between poolerd
	// reading a message and forwarding it.
	onFrame func(s *session, typ byte)
	// onReleased, set only by tests before Serve, is called on a leaving
	// client's goroutine once its server connection is back in the pool.
	onReleased func(s *session)

	// Atomics, read and written by anyone.
	conf  atomic.Pointer[config.Config]
	rates atomic.Pointer[rateLimits] // nil without rules
	// chargeWarned is when a lost measured charge was last logged (unix
	// nanoseconds).
	chargeWarned atomic.Int64
	// clientTLS is the TLS configuration clients are served with; nil when
	// client_tls_sslmode is disable. Loaded with the configuration.
	clientTLS atomic.Pointer[tls.Config]
	// clientTLSDirect is clientTLS requiring the ALPN protocol
	// "postgresql", for PostgreSQL 17's direct TLS.
	clientTLSDirect atomic.Pointer[tls.Config]
	// serverTLS are the TLS policies towards PostgreSQL by
	// server_tls_sslmode (the global one and the databases'), loaded with
	// the configuration.
	serverTLS atomic.Pointer[map[string]*backend.TLS]
	ver       atomic.Pointer[string]
	// shutting: stopAccepting ran. idleEnd: clients are ended with 57P01
	// at their next idle point (SIGTERM's Shutdown, SHUTDOWN
	// WAIT_FOR_CLIENTS's Drain). consoleOnly: a shutdown or drain closed
	// the TCP listeners and keeps the Unix sockets open for admin console
	// logins only, until the clients are gone (as PgBouncer does).
	shutting, idleEnd, consoleOnly atomic.Bool
	loginTimeouts, authFailures    atomic.Uint64
	connIDs                        atomic.Uint64 // numbers server connections and sessions alike

	// sessWG counts one per client session, from login to its end, and
	// one per lingering close of a client connection (closeLingering).
	sessWG sync.WaitGroup

	// mu guards the rest.
	mu        sync.Mutex
	pools     map[poolKey]*dbPool
	sessions  map[uint64]*session     // logged-in client sessions, by id
	keys      map[uint32][]*session   // the same, by the pid of their BackendKeyData (see register)
	consoles  map[uint32]*ConsoleConn // admin console connections, by the pid of the key we issued
	repl      map[uint64]*replPair    // replication connections, by client id (replication.go)
	console   Console                 // serves console logins (SetConsole)
	verifiers map[string]*auth.SCRAMVerifier
	listeners map[net.Listener]struct{}
	logins    map[net.Conn]struct{} // connections still in their handshake
	warm      []*dbPool             // pools named by the configuration
	dbs       map[string]*dbState   // PAUSE/DISABLE state by database name
	paused    bool                  // global PAUSE
	suspended bool                  // SUSPEND until RESUME (control.go)
	// forgot is closed at the next forget, made by a caller waiting for
	// sessions to end (waitForgotten); nil while nobody waits.
	forgot    chan struct{}
	draining  bool // SHUTDOWN WAIT_FOR_CLIENTS
	reapArmed bool // the idle-pool reaper's next round is due (poolreap.go)
	// oldRates are rate limits replaced by a reload whose Redis client is
	// not closed yet.
	oldRates []*rateLimits
	reload   ReloadFunc
	setLevel func(string) error
	// pam is the PAM library, loaded at the first PAM login (pamLib).
	pam *pamauth.Lib
}

type poolKey struct{ database, user string }

// maxSCRAMKeys bounds the SCRAM key cache: one entry per role (and salt)
// poolerd logs in to PostgreSQL as with a plain password.
const maxSCRAMKeys = 1024

// New creates a server for a validated configuration.
func New(cfg *config.Config, log *zap.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	srv := &Server{
		log:          log,
		bufs:         wire.NewBufferPool(wire.BufferSize),
		loginReaders: sync.Pool{New: func() any { return bufio.NewReaderSize(nil, loginBufSize) }},
		stmts:        newStmtRegistry(),
		scramKeys:    auth.NewSCRAMKeyCache(maxSCRAMKeys),
		ctx:          ctx,
		cancel:       cancel,
		started:      time.Now(),
		pools:        map[poolKey]*dbPool{},
		sessions:     map[uint64]*session{},
		keys:         map[uint32][]*session{},
		consoles:     map[uint32]*ConsoleConn{},
		repl:         map[uint64]*replPair{},
		verifiers:    map[string]*auth.SCRAMVerifier{},
		listeners:    map[net.Listener]struct{}{},
		logins:       map[net.Conn]struct{}{},
		dbs:          map[string]*dbState{},
		shutdownReq:  make(chan string, 1),
		rateMet:      newRateMetrics(),
		peering:      newPeering(),
		limits:       newConnLimits(),
	}
	srv.parker = newParker(srv)
	loops, _ := cfg.EventLoopCount(runtime.GOMAXPROCS(0)) // validated
	var engErr error
	if srv.engine, engErr = reactor.New(loops); engErr != nil {
		srv.log.Warn("event loop unavailable; the connections it would have read get a reader goroutine each", zap.Error(engErr))
	}
	srv.fleet = &fleetBudget{srv: srv}
	srv.fleet.configure(cfg)
	_, _ = rand.Read(srv.mockKey[:])
	srv.conf.Store(cfg)
	srv.setRates(cfg)
	srv.setServerTLS(cfg)
	srv.setClientTLS(cfg)
	srv.scheduleReap()
	return srv
}

// setServerTLS loads the TLS policies towards PostgreSQL of cfg (validated,
// so its files load) and replaces the running ones: connections opened from
// now on use them.
func (srv *Server) setServerTLS(cfg *config.Config) {
	m := map[string]*backend.TLS{}
	for _, mode := range cfg.ServerTLSModes() {
		t, err := backend.NewTLS(mode, cfg.ServerTLSCAFile, cfg.ServerTLSCertFile, cfg.ServerTLSKeyFile)
		if err != nil {
			// All or nothing: the running settings stay in use.
			srv.log.Error("server TLS settings not applied; still using the old ones", zap.String("server_tls_sslmode", mode), zap.Error(err))
			if srv.serverTLS.Load() != nil {
				return
			}
			continue
		}
		if t.Config != nil {
			// Validated: server_tls_protocols and server_tls_ciphers parse.
			t.Config.MinVersion, t.Config.MaxVersion, _ = config.TLSProtocols(cfg.ServerTLSProtocols)
			t.Config.CipherSuites, _ = config.TLSCiphers(cfg.ServerTLSCiphers)
		}
		m[mode] = t
	}
	srv.serverTLS.Store(&m)
}

// setClientTLS loads the certificate clients are served with (validated, so
// it loads) and replaces the running one: handshakes from now on use it;
// connected clients keep theirs.
func (srv *Server) setClientTLS(cfg *config.Config) {
	tc, err := config.ClientTLS(cfg)
	if err != nil {
		srv.log.Error("client TLS settings not applied", zap.Error(err))
		return
	}
	srv.clientTLS.Store(tc)
	var direct *tls.Config
	if tc != nil {
		direct = tc.Clone()
		direct.NextProtos = []string{alpnPostgreSQL}
	}
	srv.clientTLSDirect.Store(direct)
}

// serverTLSFor is the TLS policy of a server_tls_sslmode.
func (srv *Server) serverTLSFor(mode string) *backend.TLS {
	if m := srv.serverTLS.Load(); m != nil {
		if t, ok := (*m)[mode]; ok {
			return t
		}
	}
	// Not loaded (its files failed): as asked, without files; a
	// verify mode then fails every connect, saying why.
	return &backend.TLS{Mode: mode, Config: &tls.Config{MinVersion: tls.VersionTLS12}}
}

// setRates compiles the rate-limit rules of cfg (validated) and replaces
// the running ones.
func (srv *Server) setRates(cfg *config.Config) {
	rl, err := newRateLimits(cfg)
	if err != nil {
		srv.log.Error("rate limits not applied", zap.Error(err))
		return
	}
	if rl != nil && rl.charges != nil {
		onErr := srv.chargeFailed
		rl.charges.onErr.Store(&onErr)
	}
	if old := srv.rates.Swap(rl); old != nil && old.redis != nil {
		// Checks already under way may still use the old Redis client:
		// close it once they are over (or at shutdown).
		srv.mu.Lock()
		srv.oldRates = append(srv.oldRates, old)
		srv.mu.Unlock()
		time.AfterFunc(2*cfg.RedisTimeout+time.Second, old.close)
	}
}

func (srv *Server) cfg() *config.Config { return srv.conf.Load() }

// Config returns the running configuration (it changes with reloads).
func (srv *Server) Config() *config.Config { return srv.conf.Load() }

func (srv *Server) shuttingDown() bool { return srv.shutting.Load() }

// endAtIdle reports whether a client must be ended with 57P01 as soon as it
// is idle: outside a transaction, with nothing in flight.
func (srv *Server) endAtIdle() bool { return srv.idleEnd.Load() }

// Ready reports whether poolerd should receive clients: it listens, is not
// shutting down, and every configured pool is usable (healthy, degraded or
// recovering). Otherwise it says why not.
func (srv *Server) Ready() (bool, string) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	switch {
	case srv.shutting.Load():
		return false, "shutting down"
	case srv.draining:
		return false, "draining: waiting for connected clients to leave (SHUTDOWN WAIT_FOR_CLIENTS)"
	case len(srv.listeners) == 0:
		return false, "starting: not listening yet"
	case srv.paused:
		return false, "paused (PAUSE on the admin console; RESUME ends it)"
	case srv.suspended:
		return false, "suspended (SUSPEND on the admin console; RESUME ends it)"
	}
	for _, p := range srv.warm {
		st := p.pool.Stats()
		if st.Paused {
			return false, fmt.Sprintf("pool %s/%s is paused", p.key.database, p.key.user)
		}
		if !st.State.Usable() {
			reason := fmt.Sprintf("pool %s/%s is %s", p.key.database, p.key.user, st.State)
			if st.LastError != "" {
				reason += ": " + st.LastError
			}
			return false, reason
		}
	}
	return true, ""
}

// Warm creates the pools the configuration names completely (the upstream
// URL's database and user, and databases with a fixed user), so that they
// open their min_size connections (with warm_pools, at least one, which
// readiness waits for) before the first client arrives. Without
// warm_pools, a pool whose min_size is 0 waits for its first client.
func (srv *Server) Warm() {
	cfg := srv.cfg()
	if u := cfg.UpstreamInfo(); u != nil {
		srv.warmPool(u.Database, u.User)
	}
	for _, d := range cfg.Databases {
		if d.User != "" && d.Name != config.WildcardDatabase {
			srv.warmPool(d.Name, d.User)
		}
	}
}

func (srv *Server) warmPool(database, user string) {
	route, err := srv.cfg().Route(database, user)
	warm := srv.cfg().WarmPools
	if !warm && (err != nil || route.Settings.MinSize == 0) {
		return // lazy: its first client creates it
	}
	if err == nil && route.ServerSecret.Kind() == auth.SecretSCRAM {
		if _, plain := route.ServerSecret.Plain(); !plain {
			// SCRAM pass-through: no connection can be opened before a
			// client of this user has logged in, so it cannot warm up or
			// gate readiness.
			srv.log.Info("pool uses SCRAM pass-through: its connections open when a client logs in",
				zap.String("database", database), zap.String("user", user))
			return
		}
	}
	p, err := srv.getPoolWarm(database, user, warm, false)
	if err != nil {
		srv.log.Error("cannot create configured pool", zap.String("database", database), zap.String("user", user), zap.Error(err))
		return
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, w := range srv.warm {
		if w == p {
			return
		}
	}
	srv.warm = append(srv.warm, p)
}

// WaitWarm waits until every configured pool has opened its warm-up
// connections, or one of them failed maxFailures connects in a row.
func (srv *Server) WaitWarm(ctx context.Context, maxFailures int) error {
	srv.mu.Lock()
	warm := append([]*dbPool(nil), srv.warm...)
	srv.mu.Unlock()
	for _, p := range warm {
		if err := p.pool.WaitWarm(ctx, maxFailures); err != nil {
			return fmt.Errorf("pool %s/%s: %w", p.key.database, p.key.user, err)
		}
	}
	return nil
}

// Serve accepts clients on ln until it is closed.
func (srv *Server) Serve(ln net.Listener) error {
	srv.mu.Lock()
	if srv.shutting.Load() {
		srv.mu.Unlock()
		return net.ErrClosed
	}
	srv.listeners[ln] = struct{}{}
	srv.mu.Unlock()
	defer func() {
		srv.mu.Lock()
		delete(srv.listeners, ln)
		srv.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if srv.shutting.Load() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of file descriptors and the like: slow down, keep going.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				srv.log.Warn("accept failed; retrying", zap.Error(err), zap.Duration("retry_in", backoff))
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		srv.sessWG.Add(1)
		go func() {
			defer srv.sessWG.Done()
			srv.serveConn(nc)
		}()
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// Shutdown stops accepting, ends idle clients with 57P01 at once, lets every
// request and transaction in flight finish and deliver its result (a request
// already read from a client but not yet forwarded included), ends each of
// those clients with 57P01 at its next idle point, and when ctx ends closes
// whatever remains with the same message. It returns once every client
// connection is closed (see WaitClosed).
func (srv *Server) Shutdown(ctx context.Context) error {
	finish := srv.loginsFinish()
	sessions := srv.stopAccepting(!finish, true)
	srv.idleEnd.Store(true)
	for _, s := range sessions {
		if finish && !s.requested.Load() {
			// Just logged in, its first request not read yet: that
			// request is answered first, if it comes within
			// firstRequestGrace of the connect (loginsFinish).
			if wait := firstRequestGrace - time.Since(s.connectedAt); wait > 0 {
				time.AfterFunc(wait, s.terminateIfIdle)
				continue
			}
		}
		s.terminateIfIdle()
	}
	// A replication stream has no idle point to wait for: it ends now,
	// with 57P01 at the next message boundary (the client reconnects to
	// the poolerd that serves the port next).
	srv.endReplication("", errShuttingDown())
	// Admin console sessions stay until the clients are gone (they may
	// watch the shutdown); Close then ends them and closes the Unix
	// sockets kept for them.
	var err error
	select {
	case <-srv.clientsGone():
	case <-ctx.Done():
		err = ctx.Err()
		srv.log.Warn("shutdown_timeout reached; closing the remaining clients")
	}
	srv.closeAndWait(srv.sessionsEnded())
	srv.closePools()
	srv.cancel()
	return err
}

// Drain stops accepting and waits until every client has left
// (SHUTDOWN WAIT_FOR_CLIENTS): idle clients are left alone, but a client
// that becomes active is ended with 57P01 at its next idle point, after the
// answer to its request (never mid-transaction), so the wait ends while
// applications keep their pools busy. Admin console sessions do not hold it
// up. When ctx ends first, the rest are closed. Then the pools are closed.
func (srv *Server) Drain(ctx context.Context) error { return srv.drain(ctx, nil) }

// drain is Drain calling tick (if not nil) every 100 ms while clients are
// left (HandOver).
func (srv *Server) drain(ctx context.Context, tick func()) error {
	srv.mu.Lock()
	srv.draining = true
	// A hand-over leaves the Unix socket to the new poolerd: this one
	// must not take its logins.
	srv.closeListenersLocked(tick == nil)
	// What waits in a suspension (SUSPEND) is served: its clients reach
	// an idle point, where they leave or are handed over.
	resume := srv.unsuspendLocked()
	srv.mu.Unlock()
	for _, p := range resume {
		p.pool.Unsuspend()
	}
	srv.idleEnd.Store(true)
	if tick != nil {
		// A hand-over: the new poolerd serves the port, and a
		// replication stream, which cannot be passed, reconnects to it.
		srv.endReplication("", errShuttingDown())
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var err error
	for srv.clientSessions() > 0 {
		if tick != nil {
			tick()
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-t.C:
			continue
		}
		break
	}
	srv.closeAndWait(srv.sessionsEnded())
	srv.closePools()
	srv.cancel()
	return err
}

// sessionsEnded returns a channel closed once every client session has
// ended (its goroutine, or the parker's hold on it, is over).
func (srv *Server) sessionsEnded() <-chan struct{} {
	done := make(chan struct{})
	go func() { srv.sessWG.Wait(); close(done) }()
	return done
}

// WaitClosed waits until every client session has ended and every client
// connection is closed, or ctx is done. A connection ended with a final
// message closes only once the client has closed it too or lingerTime has
// passed (closeLingering): call WaitClosed after Close before the process
// exits, so that an exit does not reset connections whose clients have not
// read their final message yet. Shutdown and Drain wait for the same
// themselves.
func (srv *Server) WaitClosed(ctx context.Context) error {
	select {
	case <-srv.sessionsEnded():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeAndWait closes every client connection and waits, at most
// sessionsEndWait, until done (sessionsEnded) says their sessions ended.
func (srv *Server) closeAndWait(done <-chan struct{}) {
	srv.Close()
	select {
	case <-done:
	case <-time.After(sessionsEndWait):
		srv.log.Error("sessions did not end after being closed")
	}
}

// clientSessions counts connected clients (not console connections),
// replication connections included, and connections still logging in;
// once the Unix socket takes console logins only (consoleOnly), not those
// logging in there, which never become clients.
func (srv *Server) clientSessions() int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	logins := len(srv.logins)
	if srv.consoleOnly.Load() {
		for nc := range srv.logins {
			if onUnixSocket(nc) {
				logins--
			}
		}
	}
	return logins + len(srv.sessions) + len(srv.repl)
}

// Close ends every client and server connection at once.
func (srv *Server) Close() {
	srv.cancel() // first: loginsFinish is false from now on
	sessions := srv.stopAccepting(true, false)
	for _, s := range sessions {
		s.terminate(errShuttingDown())
	}
	srv.endConsoles()
	srv.endReplication("", errShuttingDown())
	srv.fleet.close() // the process is ending: give its fleet leases back now
}

// trackLogin records a connection that is logging in (add true) or done
// logging in, so that shutdown can close those too. It returns false when
// adding during shutdown.
func (srv *Server) trackLogin(nc net.Conn, add bool) bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if !add {
		delete(srv.logins, nc)
		return true
	}
	if srv.shutting.Load() && !srv.loginsFinish() && !(srv.consoleOnly.Load() && onUnixSocket(nc)) {
		return false
	}
	srv.logins[nc] = struct{}{}
	return true
}

// loginsFinish reports whether a shutdown lets the logins in progress
// finish. With so_reuseport a new poolerd serves the same port while this
// one shuts down, and a client this one accepted must not be refused for
// it: during SIGINT's safe shutdown its login completes and its first
// request is answered before it gets 57P01 at its next idle point (so a
// client that connects, queries and leaves sees no error), and so is the
// first request of a client that had logged in but sent none yet. Close, and the
// end of shutdown_timeout, still end every login.
//
// A client that sends no request within firstRequestGrace of its connect
// is ended as an idle one.
func (srv *Server) loginsFinish() bool {
	return srv.cfg().SOReusePort && srv.ctx.Err() == nil
}

// firstRequestGrace is how long after its connect a client that logged in
// during a shutdown with loginsFinish may take to send its first request.
const firstRequestGrace = time.Second

// stopAccepting marks the server as shutting down, closes its listeners
// (the TCP ones only with keepUnix: see closeListenersLocked) and, with
// cutLogins, the connections still logging in, and returns the sessions
// logged in at that moment.
func (srv *Server) stopAccepting(cutLogins, keepUnix bool) []*session {
	srv.mu.Lock()
	srv.shutting.Store(true)
	srv.closeListenersLocked(keepUnix)
	for nc := range srv.logins {
		if !cutLogins {
			break
		}
		// Wakes a login waiting for the client, which then gets 57P01
		// (loginFailed); one doing other work gets it when done.
		_ = nc.SetReadDeadline(time.Now())
	}
	sessions := srv.sessionListLocked()
	// A shutdown or hand-over ends a suspension (SUSPEND): what waits
	// for a server connection is served, as in any shutdown.
	resume := srv.unsuspendLocked()
	srv.mu.Unlock()
	for _, p := range resume {
		p.pool.Unsuspend()
	}
	return sessions
}

// closeListenersLocked closes the listeners. With keepUnix the Unix sockets
// stay open for admin console logins (consoleOnly): an operator can still
// watch a shutdown or drain with SHOW on the local socket, as with
// PgBouncer; other logins there are refused with 57P01 (startup), and
// Close closes them at the end.
func (srv *Server) closeListenersLocked(keepUnix bool) {
	for ln := range srv.listeners {
		if _, unix := ln.Addr().(*net.UnixAddr); unix && keepUnix {
			srv.consoleOnly.Store(true)
			continue
		}
		closeDrained(ln)
		delete(srv.listeners, ln)
	}
}

// closeDrained closes a listener once the connections the kernel has
// already completed for it are accepted (its Serve loop goes on accepting
// meanwhile, and each is answered as any login during a shutdown is), for
// at most acceptDrain: closing a listening socket resets the connections
// in its accept queue, which with so_reuseport another poolerd would have
// served, and which otherwise get a reset where an ErrorResponse is due.
func closeDrained(ln net.Listener) {
	for deadline := time.Now().Add(acceptDrain); netopt.AcceptQueued(ln) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	_ = ln.Close()
}

// acceptDrain bounds closeDrained's wait.
const acceptDrain = 100 * time.Millisecond

// onUnixSocket reports whether nc came in through a Unix socket.
func onUnixSocket(nc net.Conn) bool {
	_, unix := nc.LocalAddr().(*net.UnixAddr)
	return unix
}

// clientsGone returns a channel closed once no client is connected or
// logging in (clientSessions is 0); admin console connections do not count.
func (srv *Server) clientsGone() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for srv.clientSessions() > 0 {
			select {
			case <-t.C:
			case <-srv.ctx.Done():
				close(done)
				return
			}
		}
		close(done)
	}()
	return done
}

func (srv *Server) closePools() {
	srv.parker.close()
	for _, p := range srv.poolList() {
		p.pool.Close()
	}
	srv.engine.Close()
	if rl := srv.rates.Swap(nil); rl != nil {
		rl.close()
	}
	srv.fleet.close()
	srv.mu.Lock()
	old := srv.oldRates
	srv.oldRates = nil
	srv.mu.Unlock()
	for _, rl := range old {
		rl.close()
	}
}

// register gives a session its BackendKeyData and makes it cancellable.
//
// A session that holds its server connection from login (session mode,
// held non-nil) gets its backend's own pid, so that pg_backend_pid(),
// pg_stat_activity and pg_terminate_backend agree with what the client was
// told; any other gets a pid poolerd makes up. The key is always poolerd's,
// fresh for each session: the backend's own outlives the client (the
// connection goes back to the pool and serves the next session-mode client
// of the same pool), so a cancel request from a client that has left, sent
// late, or sent straight to PostgreSQL, would stop the next client's query.
// With poolerd's key it matches nothing once its session is gone, and
// poolerd forwards it with the backend's key only while the session holds
// the backend (session.cancel).
//
// Real pids are not unique among sessions: backends of two PostgreSQL
// servers may have the same pid, and one may equal a pid poolerd issued.
// Sessions are therefore found by pid and told apart by key
// (lookupSession), which is unique among the sessions and console
// connections of one pid.
func (srv *Server) register(s *session, held *serverConn) {
	srv.registerWith(s, func() {
		// With peer_id, the pid carries the peer id (peering.go): a
		// session-mode client gets one of poolerd's too.
		if held != nil && srv.cfg().PeerID == 0 {
			s.pid, s.key = held.PID, srv.newKeyForLocked(held.PID)
		} else {
			s.pid, s.key = srv.newKeyLocked()
		}
	})
}

// registerAs registers a session adopted from the old poolerd under the
// BackendKeyData its client has (handover.go).
func (srv *Server) registerAs(s *session, pid, key uint32) {
	srv.registerWith(s, func() { s.pid, s.key = pid, key })
}

// registerWith is register with the key set by setKey (srv.mu held).
func (srv *Server) registerWith(s *session, setKey func()) {
	// From now on other goroutines (shutdown, KILL_CLIENT) may end the
	// session: fail closes the connection itself again.
	s.handshaking.Store(false)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	setKey()
	srv.sessions[s.id] = s
	// No longer a login in progress: counted once under max_client_conn
	// (admitConn), not as a login and a session until serveConn's
	// trackLogin catches up.
	delete(srv.logins, s.conn)
	srv.keys[s.pid] = append(srv.keys[s.pid], s)
}

// minIssuedPID is the smallest pid poolerd issues itself: operating systems
// give processes smaller ones (Linux at most 2^22, the BSDs and macOS
// 99999), so a made-up pid does not look like a backend's and seldom
// equals a session-mode client's real one.
const minIssuedPID = 1 << 22

// newKeyLocked returns a random BackendKeyData whose pid no session or
// console connection has (srv.mu held), in the peering layout when peer_id
// is set (peering.go).
func (srv *Server) newKeyLocked() (pid, key uint32) {
	var b [8]byte
	cfg := srv.cfg()
	for {
		_, _ = rand.Read(b[:])
		pid, key = issueKey(cfg, binary.BigEndian.Uint32(b[:4])&0x7fffffff, binary.BigEndian.Uint32(b[4:]))
		_, session := srv.keys[pid]
		_, console := srv.consoles[pid]
		if pid >= minIssuedPID && !session && !console && !srv.replPIDLocked(pid) {
			return pid, key
		}
	}
}

// newKeyForLocked returns a random key that no session or console
// connection with pid has (srv.mu held).
func (srv *Server) newKeyForLocked(pid uint32) uint32 {
	var b [4]byte
	for {
		_, _ = rand.Read(b[:])
		key := binary.BigEndian.Uint32(b[:])
		taken := slices.ContainsFunc(srv.keys[pid], func(o *session) bool { return o.key == key })
		if c := srv.consoles[pid]; c != nil && c.key == key {
			taken = true
		}
		if !taken {
			return key
		}
	}
}

func (srv *Server) forget(s *session) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.sessions[s.id] != s {
		return // never registered
	}
	delete(srv.sessions, s.id)
	if srv.forgot != nil {
		close(srv.forgot)
		srv.forgot = nil
	}
	same := slices.DeleteFunc(srv.keys[s.pid], func(o *session) bool { return o == s })
	if len(same) == 0 {
		delete(srv.keys, s.pid)
	} else {
		srv.keys[s.pid] = same
	}
}

// lookupSession returns the session whose BackendKeyData is (pid, key), or
// nil. Keys are compared in constant time, every candidate's.
func (srv *Server) lookupSession(pid, key uint32) *session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var found *session
	for _, s := range srv.keys[pid] {
		if subtle.ConstantTimeEq(int32(s.key), int32(key)) == 1 {
			found = s
		}
	}
	return found
}

// pamLib returns the PAM library, loading it the first time.
func (srv *Server) pamLib() (*pamauth.Lib, error) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.pam == nil {
		lib, err := pamauth.Open()
		if err != nil {
			return nil, err
		}
		srv.pam = lib
	}
	return srv.pam, nil
}

// joinPool returns the pool of database and user for a client about to log
// in (or be handed over), creating it if need be, counted in its joining
// until the caller takes it back: after counting the client in clients,
// or on failure. A pool with a joining client is in use (reapIdlePools).
func (srv *Server) joinPool(database, user string) (*dbPool, error) {
	return srv.getPoolWarm(database, user, false, true)
}

// getPoolWarm returns the pool of database and user, creating it (warm:
// opening its min_size connections at once, or one if that is 0) if need
// be; join counts the caller in its joining (joinPool).
func (srv *Server) getPoolWarm(database, user string, warm, join bool) (*dbPool, error) {
	route, err := srv.cfg().Route(database, user)
	if err != nil {
		return nil, err
	}
	key := poolKey{database, user}
	if route.ForcedUser {
		// One pool for every client: its settings are the database's and
		// the server user's, whichever client creates it.
		key.user = route.ServerUser
		if route, err = srv.cfg().Route(database, route.ServerUser); err != nil {
			return nil, err
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	p, ok := srv.pools[key]
	if !ok {
		p = newDBPool(srv, key, route, warm, srv.dbPaused(database), srv.suspended)
		p.activeAt = time.Now()
		if srv.cfg().AutoDatabase(database) && !srv.hasPoolLocked(database) {
			srv.log.Info("registered new auto-database", zap.String("database", database))
		}
		srv.pools[key] = p
	}
	if join {
		p.joining.Add(1)
	}
	return p, nil
}

// hasPoolLocked reports whether database has a pool. Call with srv.mu held.
func (srv *Server) hasPoolLocked(database string) bool {
	for k := range srv.pools {
		if k.database == database {
			return true
		}
	}
	return false
}

// dbState is what the admin console set for one database.
type dbState struct {
	paused   bool // PAUSE db, or KILL db until RESUME db
	disabled bool // DISABLE db
}

// dbPaused reports whether new pools of database start paused. Call with
// srv.mu held.
func (srv *Server) dbPaused(database string) bool {
	if srv.paused {
		return true
	}
	st, ok := srv.dbs[database]
	return ok && st.paused
}

// poolList returns the pools.
func (srv *Server) poolList() []*dbPool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.poolListLocked()
}

// poolListLocked is poolList with srv.mu held.
func (srv *Server) poolListLocked() []*dbPool {
	out := make([]*dbPool, 0, len(srv.pools))
	for _, p := range srv.pools {
		out = append(out, p)
	}
	return out
}

// terminateIfIdle ends the session with 57P01 now if it is idle: outside a
// transaction, with no request in flight (one read from the client but not
// yet forwarded counts). A busy session ends at its next idle point: when
// its server is released or found clean (settle), or after the read it is
// handling (session.relay).
//
// The session is claimed (its end error set) under the lock that orders it
// with the session's own goroutine: attachMu when it holds no server (attach
// stores one under it, after checking for an end), the server's mu when it
// holds one (beginBatch marks the server busy under it, then checks for an
// end). Either the goroutine sees the claim and forwards nothing more, or
// the claim sees the session busy and waits for its next idle point.
func (s *session) terminateIfIdle() {
	if s.inRead.Load() {
		return
	}
	s.finalMu.Lock()
	defer s.finalMu.Unlock()
	werr := errShuttingDown()
	handOver := s.srv.handingOver() && s.handOverable()
	if handOver {
		werr = errHandedOver
	}
	s.endIfIdleLocked(werr, handOver, nil)
}

// endIfIdleWith ends the session with werr now if it is idle holding
// server connection on, as terminateIfIdle does; it reports whether it did.
func (s *session) endIfIdleWith(on *serverConn, werr *wire.Error) bool {
	if s.inRead.Load() {
		return false
	}
	s.finalMu.Lock()
	defer s.finalMu.Unlock()
	return s.endIfIdleLocked(werr, false, on)
}

// endIfIdleLocked is terminateIfIdle's claim, with finalMu held; with on
// set, only while the session holds on.
func (s *session) endIfIdleLocked(werr *wire.Error, handOver bool, on *serverConn) bool {
	claimed := false
	s.attachMu.Lock()
	sc := s.server.Load()
	if sc == nil && on == nil {
		claimed = s.endErr.CompareAndSwap(nil, werr)
	}
	s.attachMu.Unlock()
	if sc != nil && (on == nil || sc == on) {
		sc.mu.Lock()
		if on == nil && sc.owner.Load() != s || sc.owner.Load() == s && sc.cleanLocked() {
			claimed = s.endErr.CompareAndSwap(nil, werr)
		}
		sc.mu.Unlock()
	}
	switch {
	case claimed && handOver:
		s.wakeToHandOver()
	case claimed:
		s.withdrawWait(errTerminated)
		s.finishLocked(werr, true)
	}
	return claimed
}
