package proxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/reactor"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// Reasons a server connection is closed instead of reused (the label of
// poolerd_server_evictions_total).
const (
	evictServerClosed    = "server_closed"
	evictBroken          = "broken"
	evictClientLeftDirty = "client_left_in_transaction"
	evictClientLeftBusy  = "client_left_mid_request"
	evictWriteFailed     = "write_failed"
	evictResetFailed     = "reset_query_failed"
	evictHung            = "server_response_timeout"
	evictParamCheck      = "parameter_check_failed"
	evictTimeout         = "timeout"
	evictKilled          = "killed"
	evictRoleChanged     = "role_changed"
	evictTempSchema      = "temp_schema"
)

// maxParamCache bounds the learned startup-parameter values per pool.
const maxParamCache = 1024

// dbPool is the pool of one (database, user) pair with what poolerd learned
// about its server sessions.
type dbPool struct {
	// Set by newDBPool; read-only afterwards (the pool guards itself).
	srv  *Server
	key  poolKey
	pool *pool.Pool[*serverConn]
	log  *zap.Logger
	met  poolMetrics // this pool's metric children
	// built is closed once the dbPool is complete (d.pool set).
	built chan struct{}

	// Atomics, read and written by anyone: the route (replaced by a
	// reload), what happened to this pool's clients, its traffic (ctr),
	// its logged-in clients and how many of them are pinned (see
	// session.pin), and whether it is retired (the database left the
	// configuration, see Server.retire, or pool_idle_timeout removed it,
	// see Server.reapIdlePools) or closing.
	routeP           atomic.Pointer[config.Route]
	timeoutCounts    [numTimeoutKinds]atomic.Uint64
	leaks            atomic.Uint64
	ctr              counters
	clients, pins    atomic.Int64
	retired, closing atomic.Bool
	// stmtEpoch counts the errors that said the statements poolerd keeps
	// prepared on this pool's server connections may be stale (a schema
	// change: see staleStatementError); each connection drops its
	// statements when it is next clean (serverConn.stmtEpoch).
	stmtEpoch atomic.Uint64
	// handoffs counts the hand-offs verify_handoff sample considered.
	handoffs atomic.Uint64
	// limitHit is the server connection limit that refused the pool's
	// latest attempt to open a connection, nil if it was admitted: a
	// checkout that times out names it (checkoutError).
	limitHit atomic.Pointer[serverLimit]
	// fleet holds the pool's leases on the fleet-wide budget (fleet.go).
	fleet fleetGate
	// joining counts the logins and hand-overs that took this pool from
	// Server.joinPool and are not yet counted in clients: while it is not
	// 0 the pool is in use (reapIdlePools).
	joining atomic.Int64

	// activeAt is when the pool was last seen in use, by reapIdlePools;
	// guarded by Server.mu.
	activeAt time.Time

	// mu guards the rest.
	mu sync.Mutex
	// defaults are the server's reported parameters at connection start.
	defaults map[string]string
	// learned maps a startup parameter (name, raw value) to the value the
	// server reports for it, or to the error setting it gave.
	learned map[txstate.Param]paramResult
	// paramSets are parameter maps shared by this pool's clients that have
	// the same parameters (by txstate.ParamsKey), copied by a client before it
	// changes one, with their key; at most maxParamSets.
	paramSets map[string]paramSet
	// clientKey is the latest SCRAM ClientKey recovered from a client of
	// this user, for SCRAM pass-through when only a verifier is configured.
	clientKey []byte
	// querySecret is the user's secret auth_query found at the latest
	// login, for a user with no secret in the configuration.
	querySecret auth.Secret
	// asking, while a login without keep asks the server about parameters
	// (prepareLogin), is closed when it is done.
	asking chan struct{}

	// hosts is what the pool knows of its servers (hosts.go); it locks
	// itself.
	hosts hostSet
}

// maxParamSets bounds dbPool.paramSets: clients beyond that many distinct
// parameter sets keep their own maps.
const maxParamSets = 64

// paramSet is a shared parameter map and its txstate.ParamsKey.
type paramSet struct {
	key    string
	params map[string]string
}

// shareParams returns the pool's shared set equal to params (whose
// txstate.ParamsKey is key), making params the shared one if there is none yet;
// ok is false if too many distinct sets are shared already.
func (d *dbPool) shareParams(key string, params map[string]string) (set paramSet, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if set, ok := d.paramSets[key]; ok {
		return set, true
	}
	if len(d.paramSets) >= maxParamSets {
		return paramSet{}, false
	}
	if d.paramSets == nil {
		d.paramSets = map[string]paramSet{}
	}
	set = paramSet{key: key, params: params}
	d.paramSets[key] = set
	return set, true
}

type paramResult struct {
	value string
	err   error
}

// poolSettings are the pool package's tunables for a route's settings.
func poolSettings(cfg *config.Config, route *config.Route) pool.Settings {
	set := route.Settings
	backoffMax := cfg.ReconnectBackoffMax
	if route.MultiHost() {
		backoffMax = min(backoffMax, multiHostBackoffMax) // find a promoted replica soon
	}
	return pool.Settings{
		MaxSize:            set.MaxSize,
		MinSize:            set.MinSize,
		ConnectTimeout:     set.ServerConnectTimeout,
		BackoffBase:        cfg.ReconnectBackoffBase,
		BackoffMax:         backoffMax,
		ValidationInterval: set.ValidationInterval,
		ValidationTimeout:  set.ValidationTimeout,
		MaxLifetime:        set.MaxLifetime,
		MaxQueries:         uint64(set.MaxQueries),
		MaxUses:            uint64(set.MaxUses),
		IdleTimeout:        set.IdleTimeout,
		RecycleRate:        cfg.RecycleRate,
		WaitUnavailable:    route.MultiHost() || cfg.OnServerUnavailable == "wait",
		WaitWarning:        set.WaitWarning,
		ReserveSize:        set.ReservePoolSize,
		ReserveTimeout:     set.ReservePoolTimeout,
		RoundRobin:         cfg.ServerRoundRobin,
	}
}

func newDBPool(srv *Server, key poolKey, route config.Route, warm, paused, suspended bool) *dbPool {
	d := &dbPool{
		srv: srv,
		key: key,
		log: srv.log.With(zap.String("database", key.database), zap.String("user", key.user),
			zap.String("server", backend.Target{Host: route.Host, Port: route.Port}.String())),
		learned: map[txstate.Param]paramResult{},
		built:   make(chan struct{}),
		met:     srv.metrics.forPool(key.database, key.user),
	}
	defer close(d.built)
	d.routeP.Store(&route)
	cfg := srv.cfg()
	d.pool = pool.New(pool.Config[*serverConn]{
		Settings:    poolSettings(cfg, &route),
		Warm:        warm,
		Connect:     d.connect,
		Unreachable: unreachable,
		Refused:     refused,
		Probe:       d.probe,
		Validate:    d.validate,
		Paused:      paused,
		Suspended:   suspended,
		CheckedOut: func(sc *serverConn, fresh bool) {
			if sc.hostSt == nil {
				return
			}
			if fresh {
				sc.hostSt.misses.Add(1)
			} else {
				sc.hostSt.hits.Add(1)
			}
		},
		Closed: func(sc *serverConn, reason string) {
			d.hosts.closedFor(sc.host, reason)
			sc.closeWhy.Store(&reason) // for its log line (serverConn.Close)
		},
		Opened: func(sc *serverConn) { sc.logOpened() },
		Admit: func() bool {
			if r := d.route(); r.HostCapped() && !d.hosts.anyRoomIn(r) {
				// Every server is at its max_size_per_host: wait as for a
				// full pool (a close nudges the pool).
				d.limitHit.Store(&serverLimit{key: "max_size_per_host", max: r.HostCap(r.Hosts[0]),
					whose: fmt.Sprintf("each server of database %q", key.database), count: r.HostCap(r.Hosts[0])})
				return false
			}
			if !d.fleetAdmit() {
				return false // a fleet lease first; it nudges the pool
			}
			hit := srv.admitServer(key.database, key.user)
			d.limitHit.Store(hit)
			if hit == nil {
				return true
			}
			d.fleetUnadmit()
			go srv.makeRoom(d, key.database, key.user)
			return false
		},
		Release: func() {
			srv.releaseServer(key.database, key.user)
			d.fleetRelease()
		},
		Capacity: serverFull,
		LongWait: d.warnLongWait,
		Logger:   d.log,
	}, &srv.connIDs)
	return d
}

// refused reports whether a connect error is PostgreSQL refusing the login
// for good, or poolerd unable to log in with its secret: those reach the
// client as they are (connectError), and waiting for the next attempt
// does not help.
func refused(err error) bool {
	var se *backend.ServerError
	var ae *backend.AuthError
	return errors.As(err, &se) && !transientRefusal(se.Code) || errors.As(err, &ae)
}

// unreachable reports whether a connect error means the server did not
// accept the TCP connection at all.
func unreachable(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// probe checks whether the server accepts TCP connections, without
// logging in: PostgreSQL logs nothing for a connection closed before its
// startup packet.
func (d *dbPool) probe(ctx context.Context) error {
	network, address := backend.Target{Host: d.route().Host, Port: d.route().Port}.Network()
	var dl net.Dialer
	c, err := dl.DialContext(ctx, network, address)
	if err != nil {
		return err
	}
	return c.Close()
}

// validate runs validation_query on an idle connection before use.
func (d *dbPool) validate(ctx context.Context, sc *serverConn) error {
	if err := sc.exec(ctx, d.route().Settings.ValidationQuery); err != nil {
		return err
	}
	if d.route().MultiHost() && !d.roleSuits(sc) {
		return errRoleChanged
	}
	return nil
}

// errRoleChanged fails the validation of a connection whose server no
// longer suits target_session_attrs.
var errRoleChanged = errors.New("the server changed role (target_session_attrs)")

// connect opens one server connection and starts its reader.
func (d *dbPool) connect(ctx context.Context) (*serverConn, error) {
	// A warm pool connects as soon as it is created: wait until d.pool is
	// set, since the connection's reader uses it.
	<-d.built
	creds := d.credentials()
	if r := d.route(); r.MultiHost() {
		return d.connectAmong(ctx, r, creds)
	}
	bc, err := backend.Connect(ctx, d.target(), d.route().DBName, creds, d.route().ServerParams)
	if err != nil {
		return nil, err
	}
	return d.adopt(bc, d.route().Hosts[0]), nil
}

// credentials are what the pool logs in to PostgreSQL with: the route's
// secret, else auth_query's, and the SCRAM client key a client gave for
// pass-through.
func (d *dbPool) credentials() backend.Credentials {
	creds := backend.Credentials{User: d.route().ServerUser, Secret: d.route().ServerSecret, KeyCache: d.srv.scramKeys}
	d.mu.Lock()
	defer d.mu.Unlock()
	if creds.Secret.Kind() == 0 && !d.route().ForcedUser {
		creds.Secret = d.querySecret // auth_query's, if any
	}
	if creds.Secret.Kind() == auth.SecretSCRAM {
		creds.ClientKey = d.clientKey
	}
	return creds
}

// adopt makes a server connection of bc, a login to host h, and starts its
// reader.
func (d *dbPool) adopt(bc *backend.Conn, h config.HostPort) *serverConn {
	d.hosts.opened(h)
	return d.adoptCounted(bc, h)
}

// adoptCounted is adopt for a login already counted open (hosts.opened).
func (d *dbPool) adoptCounted(bc *backend.Conn, h config.HostPort) *serverConn {
	sc := newServerConn(d, bc)
	sc.host = h
	sc.hostSt = d.hosts.stateOf(h)
	if idle := d.route().HostIdleTimeout(h); idle > 0 {
		sc.Entry.SetIdleTimeout(idle)
	}
	d.mu.Lock()
	if d.defaults == nil {
		d.defaults = maps.Clone(bc.Params)
	}
	d.mu.Unlock()
	sc.startReading()
	return sc
}

// route is how the pool reaches PostgreSQL, and its settings.
func (d *dbPool) route() *config.Route { return d.routeP.Load() }

func (d *dbPool) target() backend.Target {
	r := d.route()
	return backend.Target{Host: r.Host, Port: r.Port, TLS: d.srv.serverTLSFor(r.ServerTLSMode),
		TCP: tcpOptions(d.srv.cfg(), backend.ServerKeepAlive)}
}

// checkout is the one way to a server connection, for a client's request
// and for a login alike: an idle connection at once (one lock, no
// allocation), or else the first to come free in FIFO order, waiting at most
// checkout_timeout, until done closes, or until the waiter is withdrawn
// (pool.CancelWait). q is told when the checkout must queue and when the
// wait ends; it provides the waiter.
//
// near is the event loop item of the asker's handler (nil: not on a loop):
// an idle connection of that loop's share is preferred, and the connection
// is moved to that loop if it was in another (loop affinity: one loop then
// reads both sides of the transaction, no hand-off between loops). A
// connection that could not be moved (shutdown) is discarded. One that
// comes through the queue is not moved: the asker has handed its loop over
// to wait (queued) and goes on on a goroutine of its own (LoopDetach). The
// queue's checkout still prefers an idle connection of the loop's share
// (pool.Waiter.Prefer): one idle past validation_interval, which TryGetNear
// declines, is validated and used rather than another loop's.
//
// lease is the asker's lease_timeout and what is left of it (zero: none):
// the wait gets the shorter of that and checkout_timeout, and a wait that
// used up the lease is refused naming lease_timeout.
func (d *dbPool) checkout(q queuer, done <-chan struct{}, near *reactor.Item, lease leaseLeft) (*serverConn, error) {
	if sc, ok := d.pool.TryGetNear(near.Share()); ok {
		d.met.checkoutWait.Observe(0)
		return d.nearLoop(sc, near)
	}
	start := time.Now()
	limit, byLease := d.waitLimit(lease)
	w := q.queued()
	w.Prefer(near.Share())
	note := q.waitNotice()
	sc, err := d.pool.GetWith(w, limit, done)
	note.stop() // a notice being written is out before sc is used
	q.dequeued()
	d.met.checkoutWait.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, d.waitError(err, byLease, lease)
	}
	return sc, nil
}

// waitLimit is how long a checkout waits: checkout_timeout, or what is
// left of the asker's lease if that is shorter (byLease).
func (d *dbPool) waitLimit(lease leaseLeft) (limit time.Duration, byLease bool) {
	limit = d.route().Settings.CheckoutTimeout
	byLease = lease.left > 0 && (limit <= 0 || lease.left < limit)
	if byLease {
		limit = lease.left
	}
	return limit, byLease
}

// waitError is the client's error for a checkout that failed.
func (d *dbPool) waitError(err error, byLease bool, lease leaseLeft) error {
	var te *pool.CheckoutTimeoutError
	if byLease && errors.As(err, &te) {
		d.timeoutCounts[timeoutLeaseCheckout].Add(1)
		return errLeaseCheckout(lease.limit, d, te.Stats)
	}
	return d.checkoutError(err)
}

// loopCheckout is a checkout waiting on an event loop (checkoutOnLoop):
// what its end needs (checkedOut), and where the attach that asked for it
// stood (attachFrom).
type loopCheckout struct {
	start   time.Time
	limit   time.Duration // checkout_timeout (or the lease's rest), timed by the loop
	lease   leaseLeft
	byLease bool
	// notify is query_wait_notify when its NOTICE is still to be sent
	// for this wait (0: none, or sent), timed by the loop too.
	notify  time.Duration
	leaseAt int64
	attempt int
}

// checkoutOnLoop is checkout for a session whose handler runs on its event
// loop (it): it does not block the loop. An idle connection is taken at
// once; otherwise the session's waiter joins the queue (the same queue, in
// the same order, as checkout's) and waiting is true: the session's loop
// takes the session up when the outcome is in (reactor.Item.wakeUp, then
// checkedOut). The connection is moved to the session's loop.
func (d *dbPool) checkoutOnLoop(s *session, it *reactor.Item, c *loopCheckout, lease leaseLeft) (sc *serverConn, waiting bool, err error) {
	if sc, ok := d.pool.TryGetNear(it.Share()); ok {
		d.met.checkoutWait.Observe(0)
		sc, err := d.nearLoop(sc, it)
		return sc, false, err
	}
	limit, byLease := d.waitLimit(lease)
	*c = loopCheckout{start: time.Now(), limit: limit, lease: lease, byLease: byLease}
	w := s.queue()
	w.Prefer(it.Share())
	sc, ok, err := d.pool.Enqueue(w, limit, it.Suspend())
	if ok || err != nil {
		it.Unsuspend()
		s.dequeued()
		d.met.checkoutWait.Observe(0)
		if err != nil {
			return nil, false, d.waitError(err, byLease, lease)
		}
		// Idle, but due for validation (TryGetNear declined it): the
		// validation query waits, off the loop.
		sc, err = d.validated(s, it, sc, false, c)
		return sc, false, err
	}
	// The loop's timer: checkedOut then sends the query_wait_notify
	// NOTICE or expires the wait, whichever is first.
	if n := s.srv.cfg().QueryWaitNotify; n > 0 && (limit <= 0 || n < limit) {
		c.notify = n
	}
	c.wakeNext(it, 0)
	// After the suspend (Enqueue's ready): an end from here on finds the
	// session waiting and withdraws its checkout (wakeLoop); one that came
	// before is withdrawn here.
	if s.waitEnded() != nil {
		s.withdrawWait(errTerminated)
	}
	return nil, true, nil
}

// wakeNext sets the loop's timer of a checkout that has waited for waited
// (checkoutOnLoop, checkedOut) for its next step: the query_wait_notify
// NOTICE or checkout_timeout, whichever comes first; none if neither is to
// come (the pool's delivery wakes it).
func (c *loopCheckout) wakeNext(it *reactor.Item, waited time.Duration) {
	next := time.Duration(0)
	for _, at := range [2]time.Duration{c.notify, c.limit} {
		if at > 0 && (next == 0 || at-waited < next) {
			next = max(at-waited, time.Microsecond)
		}
	}
	if next > 0 {
		it.WakeAfter(next)
	}
}

// checkedOut ends a checkout that waited on the session's loop
// (checkoutOnLoop), on the loop.
func (d *dbPool) checkedOut(s *session, it *reactor.Item, c *loopCheckout) (*serverConn, error) {
	// Suspended again first: a wake-up that was not the pool's finds
	// nothing to collect, and the pool's ready, still to come, then wakes
	// it. The wake-up of the wait's timer (checkoutOnLoop) times the wait
	// out (Expire delivers the timeout, its ready finding the handler
	// running); one before the deadline sets the timer for what is left.
	it.Suspend()
	sc, fresh, ok, err := d.pool.Collect(s.waiter)
	if !ok {
		waited := time.Since(c.start)
		if c.notify > 0 && waited >= c.notify {
			// Written on the loop, as the session's answers are: it
			// is out before anything of the checkout's.
			s.writeClientThen(noticeQueued(c.notify, d), s.yieldFn)
			c.notify = 0
		}
		if c.limit > 0 {
			if expired, _ := d.pool.Expire(s.waiter); expired {
				sc, fresh, ok, err = d.pool.Collect(s.waiter)
			}
		}
		if !ok {
			c.wakeNext(it, waited)
			return nil, errWaitOnLoop
		}
	}
	it.Unsuspend()
	it.SleepDone()
	s.dequeued()
	d.met.checkoutWait.Observe(time.Since(c.start).Seconds())
	if err != nil {
		return nil, d.waitError(err, c.byLease, c.lease)
	}
	return d.validated(s, it, sc, fresh, c)
}

// validated validates a connection from the queue that has been idle past
// validation_interval (the query waits: the loop goes on without the
// session first), and moves it to the session's loop. One that fails is
// closed, and the session waits for a second, off the loop, as checkout
// does; if that one fails too, the client is told (08006, validation).
func (d *dbPool) validated(s *session, it *reactor.Item, sc *serverConn, fresh bool, c *loopCheckout) (*serverConn, error) {
	if !d.pool.Due(sc, fresh) {
		return d.nearLoop(sc, it)
	}
	s.yieldLoop()
	failed := d.pool.Validate(sc)
	if failed == nil {
		return d.nearLoop(sc, it)
	}
	limit, _ := d.waitLimit(c.lease)
	w := s.queued()
	w.Prefer(it.Share())
	sc, err := d.pool.GetAfterFailed(w, limit, s.srv.ctx.Done(), failed)
	s.dequeued()
	if err != nil {
		return nil, d.waitError(err, c.byLease, c.lease)
	}
	return sc, nil
}

// leaseLeft is a lease_timeout (limit) and what is left of it for a
// checkout (left); zero: no lease_timeout.
type leaseLeft struct{ limit, left time.Duration }

// nearLoop moves a connection just checked out to the asker's loop
// (serverConn.nearLoop), or discards it if it cannot be read by any.
func (d *dbPool) nearLoop(sc *serverConn, near *reactor.Item) (*serverConn, error) {
	if !sc.nearLoop(near) {
		d.pool.Discard(sc, evictBroken)
		return nil, errShuttingDown()
	}
	return sc, nil
}

// A queuer is what waits in a checkout: queued is called before the
// checkout waits and returns the place to wait in; dequeued when the wait
// is over, however it ended.
type queuer interface {
	queued() *pool.Waiter[*serverConn]
	dequeued()
	// waitNotice arms the query_wait_notify notice of the wait (nil: none).
	waitNotice() *waitNotice
}

// loginQueuer queues a login's checkout (prepareLogin): a fresh waiter, as
// a login waits at most once.
type loginQueuer struct{}

func (loginQueuer) queued() *pool.Waiter[*serverConn] { return pool.NewWaiter[*serverConn]() }
func (loginQueuer) dequeued()                         {}
func (loginQueuer) waitNotice() *waitNotice           { return nil } // not logged in yet: no notice

// checkin returns a connection to the pool, or closes it if it is broken.
func (d *dbPool) checkin(sc *serverConn) {
	if sc.isBroken() {
		d.pool.Discard(sc, evictBroken)
		return
	}
	if sc.tempSchema.Load() {
		d.pool.Discard(sc, evictTempSchema)
		return
	}
	if d.route().MultiHost() && !d.roleSuits(sc) {
		d.pool.Discard(sc, evictRoleChanged)
		return
	}
	d.pool.Put(sc)
}

// poolDetail is the DETAIL of a refused checkout: the pool's counts.
func (d *dbPool) poolDetail(st pool.Stats) string {
	return fmt.Sprintf("pool %s/%s: total %d, idle %d, active %d, waiting %d, max_size %d",
		d.key.database, d.key.user, st.Total, st.Idle, st.Active, st.Waiting, st.MaxSize)
}

// checkoutError turns a pool error into what the client sees.
func (d *dbPool) checkoutError(err error) *wire.Error {
	var te *pool.CheckoutTimeoutError
	var ue *pool.UnavailableError
	var ve *pool.ValidationError
	switch {
	case errors.As(err, &te) && te.Stats.Paused:
		return &wire.Error{Severity: "ERROR", Code: "53300",
			Message: fmt.Sprintf("no server connection available within checkout_timeout (%s): the database is paused", d.route().Settings.CheckoutTimeout),
			Detail:  "an administrator ran PAUSE (or KILL) on the admin console; requests wait until RESUME",
			Hint:    "retry after the maintenance; RESUME on the admin console ends the pause"}
	case errors.As(err, &te) && te.Stats.Suspended:
		return &wire.Error{Severity: "ERROR", Code: "53300",
			Message: fmt.Sprintf("no server connection available within checkout_timeout (%s): the pooler is suspended", d.route().Settings.CheckoutTimeout),
			Detail:  "an administrator ran SUSPEND on the admin console; requests wait until RESUME",
			Hint:    "retry after the maintenance; RESUME on the admin console ends the suspension"}
	case errors.As(err, &te) && te.Stats.Total < te.Stats.MaxSize && d.limitHit.Load() != nil:
		return d.errLimitCheckout(te.Stats, d.limitHit.Load())
	case errors.As(err, &te) && te.Stats.Total == te.Stats.Opening && te.Stats.Failures > 0:
		// A pool over several servers waited through failed connects
		// (WaitUnavailable): none suited, or none answered; none is open
		// (one may be connecting again right now).
		st := te.Stats
		return &wire.Error{Severity: "ERROR", Code: "08006",
			Message: fmt.Sprintf("no server connection available within checkout_timeout (%s): connects fail", d.route().Settings.CheckoutTimeout),
			Detail:  fmt.Sprintf("%d connect attempts failed in a row; the last one: %s", st.Failures, st.LastError),
			Hint:    "check the servers of this database entry (hosts) and their roles against target_session_attrs; the request can be retried"}
	case errors.As(err, &te):
		st := te.Stats
		return &wire.Error{Severity: "ERROR", Code: "53300",
			Message: fmt.Sprintf("no server connection available within checkout_timeout (%s)", d.route().Settings.CheckoutTimeout),
			Detail:  d.poolDetail(st),
			Hint:    "raise max_size (POOLERD_MAX_SIZE) if PostgreSQL's max_connections allows it, shorten transactions, or raise checkout_timeout (query_wait_timeout in a pgbouncer.ini)"}
	case errors.As(err, &ue):
		if refused(ue.Err) {
			// The server is reachable and refuses this login for good
			// (no such database, bad credentials): say why.
			return d.connectError(ue.Err)
		}
		return &wire.Error{Severity: "ERROR", Code: "08006",
			Message: fmt.Sprintf("upstream unavailable, next retry in %s", ue.RetryIn.Round(100*time.Millisecond)),
			Detail:  fmt.Sprintf("%d connect attempts to %s failed in a row; the last one: %v", ue.Attempts, d.target(), ue.Err),
			Hint:    "check that PostgreSQL is running and reachable from poolerd; retry after the time given"}
	case errors.As(err, &ve):
		return &wire.Error{Severity: "ERROR", Code: "08006",
			Message: "server connections failed validation",
			Detail:  ve.Error(),
			Hint:    "two server connections in a row failed validation_query; check the PostgreSQL server and the network, then retry"}
	case errors.Is(err, errClientCancel):
		return errCheckoutCancelled()
	case errors.Is(err, pool.ErrClosed), errors.Is(err, errTerminated), pool.ErrDone(err):
		return errShuttingDown()
	}
	return errServerUnavailable(err)
}

// connectError turns a failure to open a server connection into what the
// client sees. The server's own refusals (no such database, too many
// connections, starting up) pass through with their SQLSTATE; a failed
// server login is poolerd's configuration problem and says so.
func (d *dbPool) connectError(err error) *wire.Error {
	var se *backend.ServerError
	if errors.As(err, &se) {
		werr := &wire.Error{Severity: "ERROR", Code: se.Code, Message: se.Message}
		if len(se.Code) == 5 && se.Code[:2] == "28" {
			werr.Message = "server login failed: " + se.Message
			werr.Hint = fmt.Sprintf("poolerd logs in to PostgreSQL as %q; check the password configured for it (upstream, users or auth_file) and pg_hba.conf", d.route().ServerUser)
			if strings.Contains(se.Message, "no encryption") {
				werr.Hint = fmt.Sprintf("PostgreSQL accepts only TLS connections from poolerd (hostssl rules), and server_tls_sslmode is %s: set it to prefer, require or verify-full (POOLERD_SERVER_TLS_SSLMODE)", d.route().ServerTLSMode)
			}
		}
		return werr
	}
	var ae *backend.AuthError
	if errors.As(err, &ae) {
		hint := fmt.Sprintf("poolerd could not log in to PostgreSQL as %q with its configured secret; fix the secret for that user in the poolerd configuration", d.route().ServerUser)
		if r := d.route(); r.ForcedUser {
			// The secret is the entry's password, or else the user's
			// own (auth_file's), as in PgBouncer.
			hint = fmt.Sprintf("poolerd logs in to PostgreSQL as %q, the user of database entry %q: give the entry a password, or that user its plain password in auth_file (an md5 hash there works only with PostgreSQL's md5 method, a SCRAM secret only once a client has logged in as %q with SCRAM)",
				r.ServerUser, r.Database, r.ServerUser)
		}
		return &wire.Error{Severity: "ERROR", Code: "28000", Message: "server login failed: " + ae.Error(), Hint: hint}
	}
	return errServerUnavailable(err)
}

// transientRefusal reports whether a server's refusal of a login means it
// is unavailable for now (starting up, shutting down, too many
// connections) rather than that the login itself is wrong.
// serverFull reports whether a connect error is PostgreSQL refusing the
// login for lack of connection slots (53300), and names the limit from its
// message: the pool then lowers its floor instead of backing off
// (pool.Config.Capacity).
func serverFull(err error) (limit string, ok bool) {
	var se *backend.ServerError
	if !errors.As(err, &se) || se.Code != "53300" {
		return "", false
	}
	switch m := se.Message; {
	case strings.Contains(m, "too many connections for role"):
		return "the role's CONNECTION LIMIT (ALTER ROLE ... CONNECTION LIMIT)", true
	case strings.Contains(m, "too many connections for database"):
		return "the database's CONNECTION LIMIT (ALTER DATABASE ... CONNECTION LIMIT)", true
	case strings.Contains(m, "reserved"):
		return "max_connections minus the reserved slots (superuser_reserved_connections, reserved_connections)", true
	default:
		return "max_connections", true
	}
}

func transientRefusal(code string) bool {
	return len(code) == 5 && (code[:2] == "57" || code[:2] == "53")
}

// prepareLogin makes sure the pool knows its server's default parameters
// and what the server makes of each of the client's startup parameters,
// using one server round trip only for values it has not seen before. It
// returns the client's parameters as the server reports them.
//
// With keep (a session-mode login, whose client holds a server connection
// from login on), a connection is checked out in any case and returned, the
// caller's from then on; it is the one any question was asked on. Without
// keep, or on error, none is returned.
//
// Without keep, one login of the pool asks at a time: the others wait for
// it and then find what it learned, so that a burst of logins with the
// same parameters takes one server connection for the question, not one
// each.
func (d *dbPool) prepareLogin(ctx context.Context, startup map[string]string, keep bool) (map[string]string, *serverConn, error) {
	var haveDefaults bool
	var unknown []txstate.Param
	var out map[string]string
	for {
		d.mu.Lock()
		haveDefaults = d.defaults != nil
		unknown = unknown[:0]
		out = make(map[string]string, len(startup))
		for name, value := range startup {
			if name == "application_name" && txstate.PrintableASCII(value) {
				out[name] = value // stored as given; no need to ask the server
				continue
			}
			if v, ok := d.defaults[name]; ok && v == value {
				// The server's own report of its default: setting it
				// gives the same report back (a server that runs no SQL,
				// a PgBouncer console, is never asked for it).
				out[name] = value
				continue
			}
			r, ok := d.learned[txstate.Param{Name: name, Value: value}]
			switch {
			case !ok:
				unknown = append(unknown, txstate.Param{Name: name, Value: value})
			case r.err != nil:
				d.mu.Unlock()
				return nil, nil, r.err
			default:
				out[name] = r.value
			}
		}
		if keep || haveDefaults && len(unknown) == 0 {
			d.mu.Unlock()
			break
		}
		if ch := d.asking; ch != nil {
			d.mu.Unlock()
			select {
			case <-ch:
				continue // what it learned may answer this login too
			case <-ctx.Done():
				return nil, nil, asFatal(errServerUnavailable(ctx.Err()))
			}
		}
		ch := make(chan struct{})
		d.asking = ch
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			d.asking = nil
			d.mu.Unlock()
			close(ch)
		}()
		break
	}
	if haveDefaults && len(unknown) == 0 && !keep {
		return out, nil, nil
	}
	sc, werr := d.checkout(loginQueuer{}, ctx.Done(), nil, leaseLeft{})
	if werr != nil {
		return nil, nil, asFatal(werr) // a refusal here ends the login
	}
	// done hands sc back to the pool, or to the caller with keep.
	done := func() *serverConn {
		if keep {
			return sc
		}
		d.checkin(sc)
		return nil
	}
	// The first login of a pool learns the defaults with its checkout.
	unknown = slices.DeleteFunc(unknown, func(k txstate.Param) bool {
		if v, ok := sc.params[k.Name]; ok && v == k.Value {
			out[k.Name] = v
			return true
		}
		return false
	})
	if len(unknown) == 0 {
		return out, done(), nil
	}
	sql := txstate.SetConfigSQL(unknown)
	qctx, cancel := context.WithTimeout(ctx, d.route().Settings.ServerConnectTimeout)
	err := sc.exec(qctx, sql)
	cancel()
	var se *backend.ServerError
	if errors.As(err, &se) {
		d.checkin(sc) // the failed statement rolled back; the server is clean
		werr := &wire.Error{Severity: "FATAL", Code: se.Code, Message: se.Message,
			Hint: "a startup parameter of the client was refused by PostgreSQL; fix or remove it in the connection settings"}
		if len(unknown) == 1 {
			d.mu.Lock()
			d.remember(unknown[0], paramResult{err: werr})
			d.mu.Unlock()
		}
		return nil, nil, werr
	}
	if err != nil {
		d.pool.Discard(sc, evictParamCheck)
		return nil, nil, &wire.Error{Severity: "FATAL", Code: "08006", Message: "could not check startup parameters on the server",
			Detail: err.Error(), Hint: "retry the connection; if it repeats, check the PostgreSQL server"}
	}
	d.mu.Lock()
	for _, k := range unknown {
		v := k.Value
		if reported, ok := sc.params[k.Name]; ok {
			v = reported
		} else {
			sc.applied[k.Name] = k.Value
			sc.paramGen++
		}
		d.remember(k, paramResult{value: v})
		out[k.Name] = v
	}
	d.mu.Unlock()
	return out, done(), nil
}

func (d *dbPool) remember(k txstate.Param, r paramResult) {
	if len(d.learned) >= maxParamCache {
		clear(d.learned)
	}
	d.learned[k] = r
}

// defaultParams returns the server's default reported parameters.
func (d *dbPool) defaultParams() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.defaults)
}

// setClientKey records a client's SCRAM key for pass-through logins.
func (d *dbPool) setClientKey(k []byte) {
	if k == nil {
		return
	}
	d.mu.Lock()
	d.clientKey = k
	d.mu.Unlock()
}

// setQuerySecret records the secret auth_query found for the pool's user.
func (d *dbPool) setQuerySecret(s auth.Secret) {
	if s.Kind() == 0 {
		return
	}
	d.mu.Lock()
	d.querySecret = s
	d.mu.Unlock()
}

// takePin takes a place for a pinned client under max_pinned_clients, or
// reports that there is none; force takes one beyond the cap.
func (d *dbPool) takePin(force bool) bool {
	if force {
		d.pins.Add(1)
		return true
	}
	limit := d.pinCap()
	for {
		n := d.pins.Load()
		if n >= int64(limit) {
			return false
		}
		if d.pins.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// pinCap is max_pinned_clients for this pool (validated with the
// configuration).
func (d *dbPool) pinCap() int {
	set := d.route().Settings
	n, err := set.PinnedCap()
	if err != nil {
		return set.MaxSize
	}
	return n
}
