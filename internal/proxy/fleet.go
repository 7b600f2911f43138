package proxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/fleet"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/wire"
)

// The fleet-wide server connection budget (fleet_max_server_connections):
// before a pool opens a server connection it takes a lease in Redis on
// each budget the connection counts against (the global one, its
// database's, its server user's), through the pool's Admit hook, as the
// connection limits of connlimits.go do locally. Taking a lease needs a
// Redis round trip, and Admit runs under the pool's lock, so Admit never
// waits for Redis: without a lease in hand it starts taking one in the
// background and says no; the pool waits as at a shared limit, and the
// lease, once taken, nudges it (fleetGate).

const (
	// fleetKey names the budget in errors and logs.
	fleetKey = "fleet_max_server_connections"
	// fleetRetry is how long a pool whose lease was refused (or could not
	// be taken, with on_redis_error deny) waits before asking again, with
	// up to as much again of jitter; a lease given back by this process
	// wakes it at once.
	fleetRetry = 50 * time.Millisecond
	// fleetReadyHold is how long a lease taken for a pool waits to be used
	// before it is given back (the checkout that wanted it gave up).
	fleetReadyHold = time.Second
	// fleetMinTimeout is the least time a fleet call to Redis may take
	// (fleetTimeout).
	fleetMinTimeout = 500 * time.Millisecond
	// fleetStopTimeout bounds giving every lease back at shutdown.
	fleetStopTimeout = 2 * time.Second
	// fleetMakeRoomEvery is how often a process holding leases checks
	// whether another one waits for a lease of the same budget (makeRoom).
	fleetMakeRoomEvery = 200 * time.Millisecond
)

// Budget kinds: the part of a budget's key before ':' (the label of the
// fleet metrics).
var fleetKinds = [...]string{"global", "database", "user"}

// fleetBudget is a Server's side of the fleet-wide budget: the leaser
// (made when a budget is first configured, kept across reloads so that the
// leases held stay held), its Redis client and its renewal loop.
type fleetBudget struct {
	srv         *Server
	unleased    atomic.Uint64 // connections opened without a lease (on_redis_error allow)
	redisDenied atomic.Uint64 // lease requests refused because Redis failed (on_redis_error deny)

	mu     sync.Mutex
	leaser *fleet.Leaser
	client *redis.Client
	url    string
	stop   context.CancelFunc
	done   chan struct{}
	closed bool // close ran: a later reload starts nothing
}

// leaserNow is the leaser, nil while no budget was ever configured.
func (fb *fleetBudget) leaserNow() *fleet.Leaser {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return fb.leaser
}

// fleetClient opens a Redis client for leases: no retries (a retried
// acquire could take a lease twice), one dial per attempt, and the timeout
// on the socket.
func fleetClient(url string) (*redis.Client, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, errors.New("redis_url is not a valid Redis URL") // never echo it: it may hold a password
	}
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = -1
	opts.DialerRetries = 1
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(opts), nil
}

// fleetTimeout bounds each fleet call to Redis: redis_timeout, but at
// least fleetMinTimeout. A lease is taken only to open a server connection
// (itself a TCP connect and a login), not for every request as a
// rate-limit check, and a call that times out may have taken the lease
// anyway (it then holds a place until it expires): better to wait a little
// longer than to fall back or refuse under a briefly slow Redis.
func fleetTimeout(cfg *config.Config) time.Duration {
	return max(cfg.RedisTimeout, fleetMinTimeout)
}

// configure applies cfg (validated): the leaser is made with the first
// budget configured, and takes a new client when redis_url changes and the
// new TTL and timeout at once. Budgets removed later leave it running: the
// leases held are given back as their connections close.
func (fb *fleetBudget) configure(cfg *config.Config) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.closed || fb.leaser == nil && !cfg.FleetEnabled() {
		return
	}
	if fb.leaser != nil && (cfg.RedisURL == fb.url || !cfg.FleetEnabled()) {
		// Same Redis, or no budget any more: the leases held are given
		// back to the Redis they were taken in as their connections close.
		fb.leaser.Configure(fb.client, cfg.FleetLeaseTTL, fleetTimeout(cfg))
		return
	}
	client, err := fleetClient(cfg.RedisURL)
	if err != nil {
		fb.srv.log.Error("fleet connection budget not applied", zap.Error(err))
		return
	}
	old := fb.client
	fb.client, fb.url = client, cfg.RedisURL
	if fb.leaser != nil {
		// The leases move to the new Redis at the next renewal.
		fb.leaser.Configure(client, cfg.FleetLeaseTTL, fleetTimeout(cfg))
		time.AfterFunc(2*fleetTimeout(cfg)+time.Second, func() { _ = old.Close() })
		return
	}
	fb.leaser = fleet.New(fleet.Options{Client: client, TTL: cfg.FleetLeaseTTL, Timeout: fleetTimeout(cfg)})
	ctx, cancel := context.WithCancel(context.Background())
	fb.stop, fb.done = cancel, make(chan struct{})
	go func(l *fleet.Leaser, done chan struct{}) {
		defer close(done)
		var wg sync.WaitGroup
		wg.Go(func() { fb.makeRoom(ctx, l) })
		l.Run(ctx, fb.lost, func(err error) {
			fb.srv.log.Warn("fleet lease renewal failed; leases expire unless a later renewal succeeds",
				zap.Duration("fleet_lease_ttl", l.TTL()), zap.Error(err))
		})
		wg.Wait()
	}(fb.leaser, fb.done)
}

// makeRoom looks every fleetMakeRoomEvery, while this process holds
// leases, whether another poolerd was refused a lease on one of its
// budgets; if so it closes one idle server connection under that budget
// (giving its lease back), as max_db_connections makes room among the
// pools of one process. Only idle connections are closed, so a busy pool
// keeps what it uses.
func (fb *fleetBudget) makeRoom(ctx context.Context, l *fleet.Leaser) {
	t := time.NewTicker(fleetMakeRoomEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var keys []string
		for key, n := range l.Stats().Held {
			if n > 0 {
				keys = append(keys, key)
			}
		}
		wanted, err := l.Wanted(ctx, keys)
		if err != nil {
			continue // renewals report Redis failures
		}
		for _, key := range wanted {
			for _, p := range fb.srv.poolList() {
				if p.fleet.holds(key) && p.pool.CloseIdle() {
					if ce := p.log.Check(zap.DebugLevel, "closed an idle server connection: another poolerd waits for a lease of its fleet budget"); ce != nil {
						ce.Write(zap.String("budget", key))
					}
					break
				}
			}
		}
	}
}

// close stops the renewals, gives every lease back and closes the client,
// at shutdown once the pools are closed.
func (fb *fleetBudget) close() {
	fb.mu.Lock()
	l, client, stop, done := fb.leaser, fb.client, fb.stop, fb.done
	fb.leaser, fb.client, fb.stop = nil, nil, nil
	fb.closed = true
	fb.mu.Unlock()
	if l == nil {
		return
	}
	stop()
	<-done
	ctx, cancel := context.WithTimeout(context.Background(), fleetStopTimeout)
	defer cancel()
	if err := l.ReleaseAll(ctx); err != nil {
		fb.srv.log.Warn("fleet leases not given back at shutdown; they expire within fleet_lease_ttl", zap.Error(err))
	}
	_ = client.Close()
}

// lost handles a lease a renewal found expired and taken by others: its
// connection goes on without one, and the pool closes an idle connection
// to get back within the budget.
func (fb *fleetBudget) lost(lease *fleet.Lease) {
	for _, p := range fb.srv.poolList() {
		if p.fleet.forget(lease) {
			fb.srv.log.Warn("fleet lease lost (it expired and its budget filled up meanwhile); closing an idle server connection",
				zap.String("database", p.key.database), zap.String("user", p.key.user))
			p.pool.CloseIdle()
			return
		}
	}
}

// budgets are the fleet budgets a new server connection of pool d counts
// against, with the leaser; nil when none applies.
func (fb *fleetBudget) budgets(d *dbPool) (*fleet.Leaser, []fleet.Budget) {
	l := fb.leaserNow()
	if l == nil {
		return nil, nil
	}
	user := d.route().ServerUser
	global, db, usr := fb.srv.cfg().FleetLimits(d.key.database, user)
	var out []fleet.Budget
	if global > 0 {
		out = append(out, fleet.Budget{Key: "global", Limit: global})
	}
	if db > 0 {
		out = append(out, fleet.Budget{Key: "database:" + d.key.database, Limit: db})
	}
	if usr > 0 {
		out = append(out, fleet.Budget{Key: "user:" + user, Limit: usr})
	}
	if len(out) == 0 {
		return nil, nil
	}
	return l, out
}

// nudgeStarved wakes the pools whose latest lease request was refused: a
// lease of this process came free.
func (fb *fleetBudget) nudgeStarved() {
	for _, p := range fb.srv.poolList() {
		if p.fleet.starved.Load() {
			p.pool.Nudge()
		}
	}
}

// fleetGate is one pool's leases: those taken and not yet used by a
// connection (ready), and one entry per open connection the pool's Admit
// let through (held; nil for a connection opened without a lease).
type fleetGate struct {
	starved atomic.Bool // the latest request was refused

	mu        sync.Mutex
	ready     []readyLease
	held      []*fleet.Lease
	acquiring bool
	// failing: the latest request failed on Redis; only the first
	// failure in a row is logged at warn.
	failing bool
}

type readyLease struct {
	lease *fleet.Lease // nil: Redis failed and on_redis_error is allow
	at    time.Time
}

// holds reports whether one of the gate's leases counts against the budget
// key.
func (g *fleetGate) holds(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range g.held {
		if l == nil {
			continue
		}
		for _, b := range l.Budgets() {
			if b.Key == key {
				return true
			}
		}
	}
	return false
}

// forget drops lease from the gate's held leases, reporting whether it was
// there; its connection stays open, counted as without a lease.
func (g *fleetGate) forget(lease *fleet.Lease) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, l := range g.held {
		if l == lease {
			g.held[i] = nil
			return true
		}
	}
	return false
}

// fleetAdmit is the first half of the pool's Admit: true when the
// connection may be opened as far as the fleet budget goes (with a lease
// taken earlier, or none needed), false when a lease must be taken first,
// which it starts in the background. It runs under the pool's lock.
func (d *dbPool) fleetAdmit() bool {
	l, budgets := d.srv.fleet.budgets(d)
	g := &d.fleet
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := len(g.ready); n > 0 {
		r := g.ready[n-1]
		g.ready = g.ready[:n-1]
		g.held = append(g.held, r.lease)
		return true
	}
	if budgets == nil {
		g.held = append(g.held, nil)
		return true
	}
	if !g.acquiring {
		g.acquiring = true
		go d.fleetAcquire(l, budgets)
	}
	return false
}

// fleetUnadmit undoes fleetAdmit when the local limits refused the
// connection after all: its lease waits for the next try.
func (d *dbPool) fleetUnadmit() {
	g := &d.fleet
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := len(g.held); n > 0 {
		g.ready = append(g.ready, readyLease{lease: g.held[n-1], at: time.Now()})
		g.held = g.held[:n-1]
	}
}

// fleetRelease gives back the lease of a connection that closed (or
// failed to open), in the pool's Release goroutine.
func (d *dbPool) fleetRelease() {
	g := &d.fleet
	g.mu.Lock()
	var lease *fleet.Lease
	if n := len(g.held); n > 0 {
		// Connections without a lease go first: leases are what the
		// fleet counts.
		i := n - 1
		for j, l := range g.held {
			if l == nil {
				i = j
				break
			}
		}
		lease = g.held[i]
		g.held[i] = g.held[n-1]
		g.held = g.held[:n-1]
	}
	g.mu.Unlock()
	if lease == nil {
		return
	}
	// The connection is closed concurrently (pool.closeLocked), and its
	// backend lingers a moment after Terminate: another instance taking
	// the lease at once could have PostgreSQL see the fleet one over its
	// budget. The lease goes back once the backend has had time to go.
	time.AfterFunc(fleetReleaseGrace, func() {
		d.fleetGiveBack(lease)
		d.srv.fleet.nudgeStarved()
	})
}

// fleetReleaseGrace is how long a closed connection's lease is kept: a
// backend exits within milliseconds of Terminate (or of the closed socket).
const fleetReleaseGrace = 100 * time.Millisecond

// fleetGiveBack releases a lease in Redis; a failure leaves it to expire.
func (d *dbPool) fleetGiveBack(lease *fleet.Lease) {
	l := d.srv.fleet.leaserNow()
	if l == nil {
		return // shut down: every lease was given back
	}
	if err := l.Release(context.Background(), lease); err != nil {
		d.log.Warn("fleet lease not given back; it expires within fleet_lease_ttl", zap.Error(err))
	}
}

// fleetAcquire takes one lease for the pool and nudges it, or records why
// it could not and asks again later.
func (d *dbPool) fleetAcquire(l *fleet.Leaser, budgets []fleet.Budget) {
	// A warm pool asks as soon as it is created: wait until d.pool is set,
	// since the outcome nudges it.
	<-d.built
	lease, refusal, err := l.Acquire(d.srv.ctx, budgets)
	g := &d.fleet
	g.mu.Lock()
	g.acquiring = false
	level := zap.DebugLevel
	if err != nil && !g.failing {
		level = zap.WarnLevel
	}
	g.failing = err != nil
	switch {
	case err != nil && (d.srv.ctx.Err() != nil || errors.Is(err, fleet.ErrClosed)):
		g.mu.Unlock()
		return // shutting down
	case err != nil && d.srv.cfg().OnRedisError == "allow":
		g.ready = append(g.ready, readyLease{at: time.Now()})
		g.starved.Store(false)
		g.mu.Unlock()
		d.srv.fleet.unleased.Add(1)
		if ce := d.log.Check(level, "fleet lease could not be taken; opening the server connection without one (on_redis_error allow)"); ce != nil {
			ce.Write(zap.Error(err))
		}
		d.pool.Nudge()
		return
	case err != nil:
		g.starved.Store(true)
		g.mu.Unlock()
		d.srv.fleet.redisDenied.Add(1)
		d.limitHit.Store(&serverLimit{key: fleetKey, fleet: true, unavailable: true})
		if ce := d.log.Check(level, "fleet lease could not be taken; not opening a server connection (on_redis_error deny)"); ce != nil {
			ce.Write(zap.Error(err))
		}
		time.AfterFunc(fleetRetry+rand.N(fleetRetry), d.pool.Nudge)
		return
	case refusal != nil:
		g.starved.Store(true)
		g.mu.Unlock()
		d.limitHit.Store(&serverLimit{key: fleetKey, fleet: true, max: refusal.Budget.Limit,
			whose: fleetWhose(refusal.Budget.Key), count: refusal.Held})
		if ce := d.log.Check(zap.DebugLevel, "fleet budget spent; waiting for a lease"); ce != nil {
			ce.Write(zap.String("budget", refusal.Budget.Key), zap.Int("limit", refusal.Budget.Limit), zap.Int("held", refusal.Held))
		}
		time.AfterFunc(fleetRetry+rand.N(fleetRetry), d.pool.Nudge)
		return
	}
	g.starved.Store(false)
	g.ready = append(g.ready, readyLease{lease: lease, at: time.Now()})
	g.mu.Unlock()
	time.AfterFunc(fleetReadyHold, d.fleetDropStale)
	d.pool.Nudge()
}

// fleetDropStale gives back the leases taken for the pool that no
// connection used within fleetReadyHold.
func (d *dbPool) fleetDropStale() {
	g := &d.fleet
	g.mu.Lock()
	var stale []*fleet.Lease
	keep := g.ready[:0]
	for _, r := range g.ready {
		if time.Since(r.at) >= fleetReadyHold {
			if r.lease != nil {
				stale = append(stale, r.lease)
			}
			continue
		}
		keep = append(keep, r)
	}
	clear(g.ready[len(keep):])
	g.ready = keep
	g.mu.Unlock()
	for _, lease := range stale {
		d.fleetGiveBack(lease)
	}
	if len(stale) > 0 {
		d.srv.fleet.nudgeStarved()
	}
}

// fleetWhose names a budget by its key, for errors.
func fleetWhose(key string) string {
	kind, name, _ := strings.Cut(key, ":")
	switch kind {
	case "database":
		return fmt.Sprintf("database %q", name)
	case "user":
		return fmt.Sprintf("user %q", name)
	}
	return "the fleet"
}

// errFleetCheckout refuses a request that waited checkout_timeout while its
// pool could not open a server connection for want of a fleet lease.
func (d *dbPool) errFleetCheckout(st pool.Stats, hit *serverLimit) *wire.Error {
	timeout := d.route().Settings.CheckoutTimeout
	if hit.unavailable {
		return &wire.Error{Severity: "ERROR", Code: "53300",
			Message: fmt.Sprintf("no server connection available within checkout_timeout (%s): the fleet connection budget is unavailable", timeout),
			Detail: fmt.Sprintf("the fleet budget store (Redis) failed and on_redis_error is deny, so pool %s/%s could not take a lease to open a server connection: total %d, idle %d, active %d, waiting %d, max_size %d",
				d.key.database, d.key.user, st.Total, st.Idle, st.Active, st.Waiting, st.MaxSize),
			Hint: "retry shortly; the operator can check Redis (redis_url) or set on_redis_error allow to fall back to max_size"}
	}
	return &wire.Error{Severity: "ERROR", Code: "53300",
		Message: fmt.Sprintf("no server connection available within checkout_timeout (%s): %s reached", timeout, fleetKey),
		Detail: fmt.Sprintf("%s is at its %s (%d of %d server connections, every poolerd sharing the budget together), so pool %s/%s could not open one: total %d, idle %d, active %d, waiting %d, max_size %d",
			hit.whose, fleetKey, hit.count, hit.max, d.key.database, d.key.user, st.Total, st.Idle, st.Active, st.Waiting, st.MaxSize),
		Hint: fmt.Sprintf("raise %s for %s (the global key or its entry, on every poolerd) if PostgreSQL allows it, have the fleet's pools hold fewer idle connections (min_size, idle_timeout), or raise checkout_timeout", fleetKey, hit.whose)}
}

// FleetStats is the fleet-wide budget as seen by this process.
type FleetStats struct {
	// Enabled is set once a budget was configured (the counters below are
	// all zero before).
	Enabled bool
	// Held counts the leases held now, by budget kind (global, database,
	// user).
	Held map[string]int
	// Refused counts lease requests refused, by the kind of the budget
	// that was full.
	Refused map[string]uint64
	// Acquired, Renewed and Lost count leases taken, renewals, and leases
	// lost (expired while their budget filled up).
	Acquired, Renewed, Lost uint64
	// Errors counts failed Redis calls by operation (acquire, renew,
	// release).
	Errors map[string]uint64
	// Unleased counts server connections opened without a lease because
	// Redis failed and on_redis_error is allow; RedisDenied, lease
	// requests refused because Redis failed and on_redis_error is deny.
	Unleased, RedisDenied uint64
}

// FleetStats returns the fleet budget's counters; all zero while no budget
// was ever configured.
func (srv *Server) FleetStats() FleetStats {
	st := FleetStats{Held: map[string]int{}, Refused: map[string]uint64{}, Errors: map[string]uint64{}}
	for _, k := range fleetKinds {
		st.Held[k], st.Refused[k] = 0, 0
	}
	for _, op := range [...]string{"acquire", "renew", "release"} {
		st.Errors[op] = 0
	}
	st.Unleased, st.RedisDenied = srv.fleet.unleased.Load(), srv.fleet.redisDenied.Load()
	l := srv.fleet.leaserNow()
	if l == nil {
		return st
	}
	st.Enabled = true
	ls := l.Stats()
	kind := func(key string) string { k, _, _ := strings.Cut(key, ":"); return k }
	for key, n := range ls.Held {
		st.Held[kind(key)] += n
	}
	for key, n := range ls.Refused {
		st.Refused[kind(key)] += n
	}
	for op, n := range ls.Errors {
		st.Errors[op] += n
	}
	st.Acquired, st.Renewed, st.Lost = ls.Acquired, ls.Renewed, ls.Lost
	return st
}
