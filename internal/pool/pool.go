// Package pool keeps the server connections of one (database, user) pair:
// checkout with a deadline and a FIFO queue, reuse of the most recently used
// idle connection, validation before use, background connects with
// exponential backoff and a health state, a floor of open connections,
// recycling by age, query count and idleness, and statistics. It does not
// speak the PostgreSQL protocol and knows nothing of clients: connections are
// opened, probed and validated through functions its user gives it, and it
// never looks at what flows over them.
package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Conn is a connection a pool can hold. Implementations embed an Entry and
// return it from PoolEntry; the pool keeps its bookkeeping there so that a
// checkin needs no lookup.
type Conn interface {
	PoolEntry() *Entry
	// Close closes the connection. The pool calls it exactly once.
	Close() error
}

// Entry is the pool's bookkeeping inside a connection.
type Entry struct {
	// id is set when the pool adopts the connection, which may be after
	// the connection's own goroutines started (they may log it as 0).
	id       atomic.Uint64
	created  time.Time
	lastUsed time.Time
	jitter   float64 // this connection's max_lifetime factor, 0.9-1.1
	gen      uint64  // the pool's reconnect generation when opened
	idx      int     // position in the pool's list of open connections
	uses     uint64
	queries  atomic.Uint64
	state    entryState // guarded by the pool's mutex
	// share is the part of the pool the connection is in, as its user
	// says (SetShare; the proxy's event loops), for TryGetNear.
	share atomic.Int32
	// idleTimeout, when positive, replaces Settings.IdleTimeout for this
	// connection (SetIdleTimeout: a per-server idle_timeout).
	idleTimeout atomic.Int64
}

// SetIdleTimeout gives the connection an idle timeout of its own, in place
// of the pool's IdleTimeout; 0 goes back to the pool's.
func (e *Entry) SetIdleTimeout(d time.Duration) { e.idleTimeout.Store(int64(d)) }

// SetShare says which part of the pool the connection is in now (an event
// loop's share): TryGetNear prefers connections of the asker's share.
func (e *Entry) SetShare(n int32) { e.share.Store(n) }

// Share is the part of the pool the connection is in (SetShare; 0 until
// set).
func (e *Entry) Share() int32 { return e.share.Load() }

// ID is the connection's number, unique within the process.
func (e *Entry) ID() uint64 { return e.id.Load() }

// Created is when the connection was opened.
func (e *Entry) Created() time.Time { return e.created }

// Uses is how many times the connection has been checked out.
func (e *Entry) Uses() uint64 { return e.uses }

// AddQueries counts queries run on the connection (for max_queries).
func (e *Entry) AddQueries(n uint64) { e.queries.Add(n) }

// Queries is how many queries ran on the connection.
func (e *Entry) Queries() uint64 { return e.queries.Load() }

type entryState uint8

const (
	stateNew entryState = iota
	stateIdle
	stateActive
	stateClosed
)

// State is a pool's health.
type State int32

const (
	// Initializing: warming up, no connection opened yet.
	Initializing State = iota
	// Healthy: connects succeed and the pool holds what it should.
	Healthy
	// Degraded: connects fail, but at least half of max_size is open.
	Degraded
	// Unhealthy: connects fail and less than half of max_size is open.
	Unhealthy
	// Recovering: a connect succeeded after failures; refilling min_size.
	Recovering
	// ShuttingDown: closing; no new checkouts.
	ShuttingDown
	// Terminated: closed.
	Terminated
)

var stateNames = [...]string{"initializing", "healthy", "degraded", "unhealthy", "recovering", "shutting_down", "terminated"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Usable reports whether the state serves clients normally.
func (s State) Usable() bool { return s == Healthy || s == Degraded || s == Recovering }

// Recycle reasons.
const (
	RecycleLifetime = "max_lifetime"
	RecycleQueries  = "max_queries"
	RecycleUses     = "max_uses"
	RecycleIdle     = "idle_timeout"
)

// Errors returned by Get.
var (
	// ErrClosed means the pool is shutting down.
	ErrClosed = errors.New("pool is closed")
)

// CheckoutTimeoutError is returned when no connection became available
// within the checkout deadline. It carries the pool's state at that moment.
type CheckoutTimeoutError struct {
	Waited time.Duration
	Stats  Stats
}

func (e *CheckoutTimeoutError) Error() string {
	return fmt.Sprintf("no server connection available after %s (total %d, idle %d, active %d, waiting %d, max %d)",
		e.Waited.Round(time.Millisecond), e.Stats.Total, e.Stats.Idle, e.Stats.Active, e.Stats.Waiting, e.Stats.MaxSize)
}

// UnavailableError is returned at once, instead of queueing, while connects
// fail and the pool holds no connection that could serve the request.
type UnavailableError struct {
	// RetryIn is when the next connect attempt is due.
	RetryIn time.Duration
	// Attempts is the number of failed attempts in a row.
	Attempts int
	// Err is the last connect failure.
	Err error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("upstream unavailable after %d failed connect attempts, next retry in %s: %v",
		e.Attempts, e.RetryIn.Round(100*time.Millisecond), e.Err)
}
func (e *UnavailableError) Unwrap() error { return e.Err }

// ValidationError is returned when validation failed on a connection and
// on the one tried after it.
type ValidationError struct{ Err error }

func (e *ValidationError) Error() string {
	return "server connection failed validation: " + e.Err.Error()
}
func (e *ValidationError) Unwrap() error { return e.Err }

// Settings are a pool's tunable limits. Reconfigure changes them while the
// pool runs.
type Settings struct {
	// MaxSize is the most connections open or opening at once.
	MaxSize int
	// MinSize is how many connections the pool keeps open.
	MinSize int
	// ConnectTimeout bounds one Connect call.
	ConnectTimeout time.Duration
	// BackoffBase and BackoffMax shape the pause after failed connects:
	// base, 2×base, 4×base ... capped at max, each with ±20 % jitter.
	BackoffBase, BackoffMax time.Duration
	// ValidationInterval: connections idle longer than this are validated
	// (when Config.Validate is set).
	ValidationInterval time.Duration
	// ValidationTimeout bounds one Validate call.
	ValidationTimeout time.Duration
	// MaxLifetime, MaxQueries and IdleTimeout recycle idle connections;
	// zero disables each. MaxLifetime gets ±10 % jitter per connection.
	MaxLifetime time.Duration
	MaxQueries  uint64
	IdleTimeout time.Duration
	// MaxUses closes a connection when it comes back from this many
	// checkouts, even when requests wait (one of them gets a new
	// connection); zero disables.
	MaxUses uint64
	// RecycleRate is the most connections recycled per second; 0 means 1.
	RecycleRate int
	// WaitUnavailable keeps checkouts queued (within their timeout) while
	// connects fail and nothing is open, instead of refusing them at once:
	// for a pool over several servers, whose next connect may find a
	// promoted replica.
	WaitUnavailable bool
	// WaitWarning: when the first queued checkout has waited this long,
	// Config.LongWait is told (at most once per LongWaitEvery); 0 never.
	WaitWarning time.Duration
	// ReserveSize connections may be opened beyond MaxSize for checkouts
	// that have waited ReserveTimeout (PgBouncer's reserve pool); such a
	// connection is closed when it comes back with nobody waiting. 0, or
	// a ReserveTimeout of 0, disables it.
	ReserveSize    int
	ReserveTimeout time.Duration
	// RoundRobin hands out the idle connection unused longest instead of
	// the one used last (PgBouncer's server_round_robin): every connection
	// gets its share, for servers behind a round-robin address, where
	// the default keeps the load on the fewest connections.
	RoundRobin bool
}

// reserve reports whether the reserve pool is on.
func (s *Settings) reserve() bool { return s.ReserveSize > 0 && s.ReserveTimeout > 0 }

// LongWaitEvery is the least time between two LongWait calls of a pool.
const LongWaitEvery = 10 * time.Second

func (s *Settings) normalize() {
	if s.BackoffBase <= 0 {
		s.BackoffBase = time.Second
	}
	if s.BackoffMax < s.BackoffBase {
		s.BackoffMax = s.BackoffBase
	}
	if s.RecycleRate <= 0 {
		s.RecycleRate = 1
	}
}

// Config configures a pool.
type Config[C Conn] struct {
	Settings
	// Warm makes the pool open at least one connection at start (and keep
	// retrying while that fails), so that its health is known before the
	// first client: set for pools named by the configuration.
	Warm bool
	// Connect opens one connection; ctx carries the connect deadline.
	Connect func(ctx context.Context) (C, error)
	// Unreachable reports whether a Connect error means the server did not
	// accept the TCP connection at all (as opposed to refusing the login).
	// While that is the case the pool calls Probe every ProbeInterval and,
	// when the server accepts connections again, retries at once.
	Unreachable func(error) bool
	// Refused reports whether a Connect error is the server refusing the
	// login for good (bad credentials, no such database): waiting does not
	// help, so queued checkouts are told at once even with
	// WaitUnavailable, as PgBouncer's kill_pool_logins tells its waiting
	// clients. Nil: none is.
	Refused func(error) bool
	// Probe checks cheaply whether the server accepts TCP connections.
	Probe func(ctx context.Context) error
	// ProbeInterval is how often Probe runs; 0 means 250ms.
	ProbeInterval time.Duration
	// Validate checks an idle connection before use; nil disables.
	Validate func(ctx context.Context, c C) error
	// Paused starts the pool paused (see Pause).
	Paused bool
	// Suspended starts the pool suspended (see Suspend).
	Suspended bool
	// Admit, when set, is asked before opening a connection (a limit
	// shared with other pools); false waits for Nudge. Release gives the
	// slot back when a connection closes or a connect fails; it runs in its
	// own goroutine. Admit runs under the pool's lock and must not call
	// into the pool.
	Admit   func() bool
	Release func()
	// Capacity, when set, reports whether a Connect error is the server
	// refusing a connection for lack of connection slots (PostgreSQL's
	// 53300), and names the limit. Such a refusal while the pool fills its
	// floor (min_size) with at least one connection open and nobody
	// waiting lowers the pool's effective floor to what is open, instead
	// of counting as a failure; see EffectiveMinSize.
	Capacity func(error) (limit string, ok bool)
	// CheckedOut, when set, is told of every checkout, fresh when the
	// connection was opened for it (a miss); Closed of every connection
	// the pool recycles or is told to discard, and of those it closes for
	// a pause, a reconnect or a lowered max_size, with the reason. Both
	// run under the pool's lock and must only count.
	CheckedOut func(c C, fresh bool)
	Closed     func(c C, reason string)
	// Opened, when set, is told of every connection that joins the pool,
	// once it has its ID (Entry.ID), under the pool's lock.
	Opened func(c C)
	// LongWait, when set, is called by the maintainer (without the pool's
	// lock) with a snapshot of the pool when its first queued checkout has
	// waited Settings.WaitWarning, at most once per LongWaitEvery.
	LongWait func(Stats)
	// Logger receives lifecycle events; it should carry the pool's fields.
	Logger *zap.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// Rand returns a float in [0,1) for jitter; nil means math/rand/v2.
	Rand func() float64
}

// Stats is a consistent snapshot of a pool.
type Stats struct {
	State State
	// Paused is set between Pause and Resume.
	Paused bool
	// Suspended is set between Suspend and Unsuspend.
	Suspended bool
	// OldestWait is how long the first queued checkout has waited.
	OldestWait       time.Duration
	MaxSize, MinSize int
	// EffectiveMinSize is the floor the pool keeps: MinSize (at least one
	// for a Warm pool), or less while the server refuses more connections
	// (Config.Capacity), raised again by one every BackoffMax.
	EffectiveMinSize int
	// Total counts open connections plus those being opened, plus the
	// places lent (Lent, TakeSlot).
	Total, Idle, Active, Opening, Waiting int
	// Lent counts places of the pool's size held by connections the pool
	// does not hold (replication connections: TakeSlot).
	Lent int
	// Acquisitions counts successful checkouts; Hits reused an open
	// connection, Misses got a newly opened one.
	Acquisitions, Hits, Misses uint64
	// ReserveOpened counts connects started beyond MaxSize, from the
	// reserve (Settings.ReserveSize).
	ReserveOpened uint64
	Releases      uint64
	Timeouts      uint64
	// ConnectAttempts and ConnectFailures count every connect; Failures is
	// the number of failures in a row now, NextRetry when the next attempt
	// is due while failing.
	ConnectAttempts, ConnectFailures uint64
	Failures                         int
	NextRetry                        time.Time
	LastError                        string
	// FastFailures counts checkouts refused at once while unavailable.
	FastFailures uint64
	// ValidationFailures counts connections that failed validation.
	ValidationFailures uint64
	// Evictions counts connections closed instead of reused, by reason.
	Evictions map[string]uint64
	// Recycled counts connections recycled, by reason.
	RecycledLifetime, RecycledQueries, RecycledIdle, RecycledUses uint64
	// WaitTotal is the summed checkout wait; WaitMax the longest.
	WaitTotal, WaitMax time.Duration
	PeakActive         int
	Created            time.Time
	// LastHealthCheck is when a connect or validation last succeeded, and
	// LastCheckLatency how long it took.
	LastHealthCheck  time.Time
	LastCheckLatency time.Duration
}

// AvgWait is the mean checkout wait.
func (s Stats) AvgWait() time.Duration {
	if s.Acquisitions == 0 {
		return 0
	}
	return s.WaitTotal / time.Duration(s.Acquisitions)
}

type waiter[C Conn] struct {
	ch    chan result[C] // buffered, capacity 1
	since time.Time
	// share is the part of the pool whose idle connections the checkout
	// prefers when one is free at once (Waiter.Prefer); -1: none.
	share int32
	// ready, for a waiter queued by Enqueue, is called once its result
	// is in ch (under the pool's lock); deadline is when its wait times
	// out (zero: never).
	ready    func()
	deadline time.Time
}

// deliverLocked gives w its result (w is out of the queue).
func (w *waiter[C]) deliverLocked(r result[C]) {
	w.ch <- r
	if w.ready != nil {
		w.ready()
	}
}

type result[C Conn] struct {
	conn  C
	err   error
	fresh bool // newly opened, not reused
}

// Pool is a set of interchangeable connections. All methods are safe for
// concurrent use.
type Pool[C Conn] struct {
	cfg    Config[C]
	log    *zap.Logger
	nextID *atomic.Uint64

	settings atomic.Pointer[Settings]

	mu     sync.Mutex
	idle   []C // most recently used last
	conns  []C // every open connection, idle or active
	gen    uint64
	paused bool
	// suspended: Suspend hands out nothing and opens nothing, but keeps
	// its connections (holdsBack says whether either holds).
	suspended bool
	total     int
	active    int
	opening   int
	lent      int          // places held by TakeSlot, counted in total
	waiters   []*waiter[C] // FIFO
	closed    bool
	stats     Stats

	failures    int // connect failures in a row
	backoffN    int // failures counted for the backoff; a probe resets it
	nextAttempt time.Time
	lastErr     error
	everOpened  bool
	recycledNow int       // recycled in the current second
	recycleSec  time.Time // start of that second
	lastLongW   time.Time // when LongWait was last called
	// floorCap, when not 0, lowers the floor to this many connections:
	// the server refused more (Config.Capacity). floorRetry is when the
	// maintainer next raises it by one (every BackoffMax), floorLogged the
	// floor last logged.
	floorCap, floorLogged int
	floorRetry            time.Time
	floorLimit            string // the limit that lowered it, and the
	floorErr              error  // refusal, for the log
	changed               chan struct{}

	wake    chan struct{} // nudges the maintainer
	done    chan struct{}
	stopped chan struct{}
}

// New creates a pool and starts its maintainer. ids numbers connections
// across pools.
func New[C Conn](cfg Config[C], ids *atomic.Uint64) *Pool[C] {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cfg.Settings.normalize()
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 250 * time.Millisecond
	}
	p := &Pool[C]{
		cfg:     cfg,
		log:     cfg.Logger,
		nextID:  ids,
		changed: make(chan struct{}),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	set := cfg.Settings
	p.settings.Store(&set)
	p.paused, p.suspended = cfg.Paused, cfg.Suspended
	p.stats.MaxSize, p.stats.MinSize = cfg.MaxSize, cfg.MinSize
	p.stats.Created = cfg.Now()
	p.stats.State = Initializing
	if !cfg.Warm && cfg.MinSize == 0 {
		p.stats.State = Healthy // nothing to warm up; connects happen on demand
	}
	go p.maintain()
	return p
}

// set returns the current settings.
func (p *Pool[C]) set() *Settings { return p.settings.Load() }

// Reconfigure changes the pool's settings while it runs: a larger max_size
// serves waiters at once, a smaller one closes idle connections above it
// now and busy ones when they come back; min_size is refilled by the
// maintainer; recycling and validation use the new values from now on.
func (p *Pool[C]) Reconfigure(s Settings) {
	s.normalize()
	p.settings.Store(&s)
	p.mu.Lock()
	p.stats.MaxSize, p.stats.MinSize = s.MaxSize, s.MinSize
	for len(p.idle) > 0 && p.total > s.MaxSize {
		p.closeLocked(p.idle[0]) // least recently used first
	}
	for len(p.waiters) > p.opening && p.total < s.MaxSize {
		before := p.opening
		p.startConnectLocked()
		if p.opening == before {
			break
		}
	}
	p.mu.Unlock()
	p.nudge()
}

// State returns the pool's health.
func (p *Pool[C]) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats.State
}

// WaitWarm waits until the pool has opened its warm-up connections
// (max(min_size, 1)), or maxFailures connects in a row have failed, or ctx
// ends. It returns the last connect error in the second case.
func (p *Pool[C]) WaitWarm(ctx context.Context, maxFailures int) error {
	for {
		p.mu.Lock()
		st, fails, last, ch := p.stats.State, p.failures, p.lastErr, p.changed
		open, target := p.total-p.opening, max(p.warmTarget(), 1)
		p.mu.Unlock()
		switch {
		case st == Healthy && open >= target:
			return nil
		case fails >= maxFailures:
			return fmt.Errorf("%d connect attempts failed: %w", fails, last)
		case st == ShuttingDown || st == Terminated:
			return ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Changed returns a channel closed at the next state change or connect
// outcome.
func (p *Pool[C]) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// TryGet checks out the most recently used idle connection if one is free,
// nobody is queued and it needs no validation, without waiting or opening a
// connection.
func (p *Pool[C]) TryGet() (C, bool) { return p.TryGetNear(-1) }

// nearScan is how many of the most recently used idle connections
// TryGetNear looks through for one of the asker's share.
const nearScan = 16

// TryGetNear is TryGet preferring a connection of the given share (see
// Entry.SetShare): the most recently used idle one of that share among the
// nearScan most recently used, else the most recently used of any share. A
// negative share has no preference.
func (p *Pool[C]) TryGetNear(share int32) (C, bool) {
	var zero C
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if p.closed || p.holdsBack() || n == 0 || len(p.waiters) > 0 {
		return zero, false
	}
	i := p.nearIdleLocked(share)
	c := p.idle[i]
	if p.needsValidation(c) {
		return zero, false
	}
	p.takeIdleLocked(i)
	return c, true
}

// nearIdleLocked is the index in idle (not empty) of the most recently used
// connection of share among the nearScan most recently used, else of the
// most recently used; a negative share has no preference. With RoundRobin
// the same from the other end: the least recently used.
func (p *Pool[C]) nearIdleLocked(share int32) int {
	n := len(p.idle)
	if p.set().RoundRobin {
		if share >= 0 {
			for j := range min(n, nearScan) {
				if p.idle[j].PoolEntry().share.Load() == share {
					return j
				}
			}
		}
		return 0
	}
	if share >= 0 {
		for j := n - 1; j >= max(0, n-nearScan); j-- {
			if p.idle[j].PoolEntry().share.Load() == share {
				return j
			}
		}
	}
	return n - 1
}

// takeIdleLocked checks out idle connection i.
func (p *Pool[C]) takeIdleLocked(i int) {
	var zero C
	c := p.idle[i]
	n := len(p.idle)
	copy(p.idle[i:], p.idle[i+1:])
	p.idle[n-1] = zero
	p.idle = p.idle[:n-1]
	p.checkoutLocked(c, false)
	p.stats.Hits++
}

// Get checks out a connection, waiting in FIFO order until one is free or
// ctx ends. A connection idle longer than the validation interval is
// validated first; one that fails is closed and another tried, once. A
// context deadline that passes yields *CheckoutTimeoutError. While connects
// fail and no connection is open, it returns *UnavailableError at once.
func (p *Pool[C]) Get(ctx context.Context) (C, error) {
	var zero C
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		c, fresh, err := p.get(ctx)
		if err != nil {
			return zero, err // a timeout or outage says more than the validation before it
		}
		if fresh || !p.needsValidation(c) {
			return c, nil
		}
		if err := p.validate(ctx, c); err != nil {
			lastErr = err
			continue
		}
		return c, nil
	}
	return zero, &ValidationError{Err: lastErr}
}

func (p *Pool[C]) needsValidation(c C) bool {
	return p.cfg.Validate != nil && p.set().ValidationInterval > 0 &&
		p.cfg.Now().Sub(c.PoolEntry().lastUsed) > p.set().ValidationInterval
}

func (p *Pool[C]) validate(ctx context.Context, c C) error {
	vctx, cancel := context.WithTimeout(ctx, p.set().ValidationTimeout)
	start := p.cfg.Now()
	err := p.cfg.Validate(vctx, c)
	took := p.cfg.Now().Sub(start)
	cancel()
	if err != nil {
		p.mu.Lock()
		p.stats.ValidationFailures++
		p.mu.Unlock()
		p.log.Warn("server connection failed validation; closing it", zap.Uint64("conn_id", c.PoolEntry().ID()), zap.Error(err))
		p.Discard(c, "validation_failed")
		return err
	}
	p.mu.Lock()
	p.stats.LastHealthCheck = p.cfg.Now()
	p.stats.LastCheckLatency = took
	p.mu.Unlock()
	return nil
}

func (p *Pool[C]) get(ctx context.Context) (C, bool, error) {
	w := &waiter[C]{ch: make(chan result[C], 1), share: -1}
	return p.wait(w, ctx.Done(), nil, ctx.Err)
}

// Waiter is a reusable place in a pool's queue. A client that may wait for
// connections many times keeps one, so that waiting (GetWith) allocates
// nothing. A Waiter is used by one checkout at a time.
type Waiter[C Conn] struct {
	w     waiter[C]
	timer *time.Timer
}

// NewWaiter returns a Waiter.
func NewWaiter[C Conn]() *Waiter[C] {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &Waiter[C]{w: waiter[C]{ch: make(chan result[C], 1), share: -1}, timer: t}
}

// Prefer makes the waiter's next checkouts prefer, among the idle
// connections free at once, one of the given share (Entry.SetShare), as
// TryGetNear does, validated first if it must be; -1: no preference.
func (w *Waiter[C]) Prefer(share int32) { w.w.share = share }

// errDone is what GetWith returns when its done channel closes.
var errDone = errors.New("checkout abandoned")

// ErrDone reports whether err says that a GetWith's done channel closed.
func ErrDone(err error) bool { return errors.Is(err, errDone) }

// GetWith is Get for a caller that keeps a Waiter: it waits at most timeout
// (0: no limit), or until done closes (the error then satisfies ErrDone),
// or until CancelWait withdraws it (the error is the one given to
// CancelWait). Unlike Get, waiting allocates nothing.
func (p *Pool[C]) GetWith(w *Waiter[C], timeout time.Duration, done <-chan struct{}) (C, error) {
	return p.getWith(w, timeout, done, 0, nil)
}

// GetAfterFailed is GetWith for a caller whose connection from Enqueue
// failed its validation (failed, Validate's error): the second connection
// GetWith would try, and a *ValidationError if it fails too.
func (p *Pool[C]) GetAfterFailed(w *Waiter[C], timeout time.Duration, done <-chan struct{}, failed error) (C, error) {
	var ve *ValidationError
	if errors.As(failed, &ve) {
		failed = ve.Err
	}
	return p.getWith(w, timeout, done, 1, failed)
}

func (p *Pool[C]) getWith(w *Waiter[C], timeout time.Duration, done <-chan struct{}, from int, lastErr error) (C, error) {
	var zero C
	for attempt := from; attempt < 2; attempt++ {
		var expired <-chan time.Time
		if timeout > 0 {
			w.timer.Reset(timeout)
			expired = w.timer.C
		}
		c, fresh, err := p.wait(&w.w, done, expired, nil)
		if timeout > 0 {
			w.timer.Stop()
		}
		if err != nil {
			return zero, err
		}
		if fresh || !p.needsValidation(c) {
			return c, nil
		}
		if err := p.validate(context.Background(), c); err != nil {
			lastErr = err
			continue
		}
		return c, nil
	}
	return zero, &ValidationError{Err: lastErr}
}

// Enqueue is GetWith for a caller that must not block (an event loop):
// an idle connection free at once is returned (ok); a checkout that cannot
// be served now is refused (err, as GetWith's); otherwise w is queued, in
// the same FIFO order as GetWith's waiters, and ready is called once its
// outcome is known: a connection handed over, Expire after timeout (0: no
// limit), CancelWait, the pool failing or closing. ready is called with the
// pool's lock held: it must neither block nor call the pool. Collect then
// returns the outcome. The caller times the wait (its own timer, an event
// loop's): at or after timeout it calls Expire. A connection returned here or by Collect has not
// been validated: the caller runs Validate, where it may block, if it is
// Due.
func (p *Pool[C]) Enqueue(w *Waiter[C], timeout time.Duration, ready func()) (c C, ok bool, err error) {
	var zero C
	start := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return zero, false, ErrClosed
	}
	ww := &w.w
	if len(p.idle) > 0 && len(p.waiters) == 0 && !p.holdsBack() {
		i := p.nearIdleLocked(ww.share)
		c := p.idle[i]
		p.takeIdleLocked(i)
		return c, true, nil
	}
	if uerr := p.unavailableLocked(start); uerr != nil {
		p.stats.FastFailures++
		return zero, false, uerr
	}
	ww.since, ww.ready, ww.deadline = start, ready, time.Time{}
	p.waiters = append(p.waiters, ww)
	if p.total < p.set().MaxSize && !p.holdsBack() {
		p.startConnectLocked()
	}
	if p.set().reserve() && len(p.waiters) == 1 && p.total >= p.set().MaxSize {
		p.nudge() // the maintainer times the reserve from this first waiter
	}
	if timeout > 0 {
		// The real clock, as the caller's timer's: an early or stale
		// Expire finds the deadline not passed.
		ww.deadline = time.Now().Add(timeout)
	}
	return zero, false, nil
}

// Expire times out w's Enqueue if it still waits and its deadline passed:
// ready is called, and Collect returns a *CheckoutTimeoutError. It reports
// whether it did; false also when the deadline is still to come (its left
// is how long), or the wait is over or has none (left 0).
func (p *Pool[C]) Expire(w *Waiter[C]) (expired bool, left time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ww := &w.w
	if ww.ready == nil || ww.deadline.IsZero() {
		return false, 0
	}
	if left := time.Until(ww.deadline); left > 0 {
		return false, left
	}
	if !p.removeWaiterLocked(ww) {
		return false, 0
	}
	p.stats.Timeouts++
	st := p.statsLocked()
	ww.deliverLocked(result[C]{err: &CheckoutTimeoutError{Waited: p.cfg.Now().Sub(ww.since), Stats: st}})
	return true, 0
}

// Collect returns the outcome of an Enqueue whose ready was called: the
// connection and whether it was newly opened, or the error. It does not
// wait: ok is false if nothing has been delivered yet (a wake-up that was
// not ready's; the wait goes on, and ready is still called once).
func (p *Pool[C]) Collect(w *Waiter[C]) (c C, fresh, ok bool, err error) {
	var r result[C]
	select {
	case r = <-w.w.ch:
	default:
		return c, false, false, nil
	}
	c, fresh, err = p.received(r, w.w.since)
	return c, fresh, true, err
}

// Due reports whether a connection from Enqueue or Collect must be
// validated before use, as GetWith would: idle past the validation
// interval (fresh: newly opened, never due).
func (p *Pool[C]) Due(c C, fresh bool) bool { return !fresh && p.needsValidation(c) }

// Validate runs the validation query on c (Due), waiting for it; a
// connection that fails it is closed, and the error is a *ValidationError.
func (p *Pool[C]) Validate(c C) error {
	if err := p.validate(context.Background(), c); err != nil {
		return &ValidationError{Err: err}
	}
	return nil
}

// CancelWait withdraws w from the queue: its GetWith returns err. It does
// nothing if w is not waiting.
func (p *Pool[C]) CancelWait(w *Waiter[C], err error) {
	p.mu.Lock()
	if p.removeWaiterLocked(&w.w) {
		w.w.deliverLocked(result[C]{err: err})
	}
	p.mu.Unlock()
}

// wait takes an idle connection or queues w until one is handed over, done
// closes (doneErr says why; errDone if nil) or expired fires (a
// *CheckoutTimeoutError).
func (p *Pool[C]) wait(w *waiter[C], done <-chan struct{}, expired <-chan time.Time, doneErr func() error) (C, bool, error) {
	var zero C
	start := p.cfg.Now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return zero, false, ErrClosed
	}
	if len(p.idle) > 0 && len(p.waiters) == 0 && !p.holdsBack() {
		// A connection of the preferred share even if it must be
		// validated first (TryGetNear declines one that must): the
		// others' connections would otherwise serve this share for as
		// long as its own stay idle past the validation interval.
		i := p.nearIdleLocked(w.share)
		c := p.idle[i]
		p.takeIdleLocked(i)
		p.mu.Unlock()
		return c, false, nil
	}
	if uerr := p.unavailableLocked(start); uerr != nil {
		p.stats.FastFailures++
		p.mu.Unlock()
		return zero, false, uerr
	}
	w.since, w.ready, w.deadline = start, nil, time.Time{}
	p.waiters = append(p.waiters, w)
	if p.total < p.set().MaxSize && !p.holdsBack() {
		p.startConnectLocked()
	}
	reserveWatch := p.set().reserve() && len(p.waiters) == 1 && p.total >= p.set().MaxSize
	p.mu.Unlock()
	if reserveWatch {
		p.nudge() // the maintainer times the reserve from this first waiter
	}

	timedOut := false
	select {
	case r := <-w.ch:
		return p.received(r, start)
	case <-done:
	case <-expired:
		timedOut = true
	}
	p.mu.Lock()
	if !p.removeWaiterLocked(w) {
		// Served between the wake-up and the lock: take what was handed over.
		p.mu.Unlock()
		return p.received(<-w.ch, start)
	}
	waited := p.cfg.Now().Sub(start)
	var err error
	if !timedOut {
		err = errDone
		if doneErr != nil {
			err = doneErr()
		}
	}
	if timedOut || errors.Is(err, context.DeadlineExceeded) {
		p.stats.Timeouts++
		st := p.statsLocked()
		p.mu.Unlock()
		return zero, false, &CheckoutTimeoutError{Waited: waited, Stats: st}
	}
	p.mu.Unlock()
	return zero, false, err
}

// unavailableLocked returns the error for a checkout that cannot be served:
// connects are failing (in backoff) and no usable connection is open or
// opening.
func (p *Pool[C]) unavailableLocked(now time.Time) *UnavailableError {
	if p.failures == 0 || p.usableLocked() > 0 || p.holdsBack() || !now.Before(p.nextAttempt) || p.waitsLocked(p.lastErr) {
		return nil
	}
	return &UnavailableError{RetryIn: p.nextAttempt.Sub(now), Attempts: p.failures, Err: p.lastErr}
}

// waitsLocked reports whether checkouts keep waiting, within their
// timeout, through connect failures ending with err: WaitUnavailable,
// unless the server refused the login for good.
func (p *Pool[C]) waitsLocked(err error) bool {
	return p.set().WaitUnavailable && (p.cfg.Refused == nil || !p.cfg.Refused(err))
}

// usableLocked counts the connections that can serve a queued checkout:
// those being opened and the open ones not marked for closing by
// Reconnect (they close when they come back; PgBouncer's kill_pool_logins
// does not count them either). Places lent (TakeSlot) serve no checkout.
func (p *Pool[C]) usableLocked() int {
	n := p.opening
	for _, c := range p.conns {
		if c.PoolEntry().gen == p.gen {
			n++
		}
	}
	return n
}

func (p *Pool[C]) received(r result[C], start time.Time) (C, bool, error) {
	if r.err != nil {
		return r.conn, false, r.err
	}
	p.mu.Lock()
	if r.fresh {
		p.stats.Misses++
	} else {
		p.stats.Hits++
	}
	p.noteWaitLocked(p.cfg.Now().Sub(start))
	p.mu.Unlock()
	return r.conn, r.fresh, nil
}

// Put returns a clean connection: the next waiter gets it, or it becomes the
// most recently used idle connection. A connection due for recycling is
// closed instead, within the recycle rate.
func (p *Pool[C]) Put(c C) {
	e := c.PoolEntry()
	p.mu.Lock()
	if e.state != stateActive {
		p.mu.Unlock()
		return
	}
	p.active--
	p.stats.Releases++
	now := p.cfg.Now()
	e.lastUsed = now
	set := p.set()
	over := p.total > set.MaxSize
	// A reserve connection serves whoever waits, and closes when nobody
	// does.
	reserveBusy := over && set.reserve() && p.total <= set.MaxSize+set.ReserveSize && len(p.waiters) > 0
	if p.closed || p.paused || e.gen < p.gen || over && !reserveBusy {
		// Shutting down, paused, reconnecting, over a lowered max_size, or
		// a reserve connection nobody waits for.
		switch {
		case p.paused:
			p.countEvictionLocked(c, "paused")
		case e.gen < p.gen:
			p.countEvictionLocked(c, "reconnect")
		case !p.closed && set.reserve() && p.total <= set.MaxSize+set.ReserveSize:
			p.countEvictionLocked(c, "reserve_idle")
		case !p.closed:
			p.countEvictionLocked(c, "over_max_size")
		}
		p.closeLocked(c)
		p.mu.Unlock()
		p.nudge()
		return
	}
	if reason := p.recycleReason(e, now, false); reason == RecycleUses || reason != "" && len(p.waiters) == 0 && p.recycleBudgetLocked(now) {
		// Used up (max_uses) goes whoever waits, and outside the
		// recycle rate: a waiter gets a new connection.
		p.recycleLocked(c, reason, now)
		if reason == RecycleUses && !p.closed && len(p.waiters) > p.opening && p.total < set.MaxSize {
			p.startConnectLocked()
		}
		p.mu.Unlock()
		p.nudge()
		return
	}
	p.handOffLocked(c, false)
	p.mu.Unlock()
}

// Discard closes a connection that must not be reused, whether it is checked
// out or idle. Discarding twice is harmless.
func (p *Pool[C]) Discard(c C, reason string) {
	e := c.PoolEntry()
	p.mu.Lock()
	switch e.state {
	case stateActive:
		p.active--
		p.stats.Releases++
	case stateIdle:
	default:
		p.mu.Unlock()
		return
	}
	p.countEvictionLocked(c, reason)
	p.closeLocked(c)
	if !p.closed && len(p.waiters) > p.opening && p.total < p.set().MaxSize {
		p.startConnectLocked()
	} else if !p.closed && p.set().reserve() {
		p.fillReserveLocked(p.cfg.Now())
	}
	p.mu.Unlock()
	p.log.Debug("server connection discarded", zap.Uint64("conn_id", e.ID()), zap.String("reason", reason))
	p.nudge()
}

// Stats returns a consistent snapshot.
func (p *Pool[C]) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsLocked()
}

// Close stops the pool: waiters get ErrClosed, idle connections are closed,
// and connections checked out are closed when they come back.
func (p *Pool[C]) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.setStateLocked(ShuttingDown, "pool closing")
	for _, w := range p.waiters {
		w.deliverLocked(result[C]{err: ErrClosed})
	}
	p.waiters = nil
	for len(p.idle) > 0 {
		p.closeLocked(p.idle[len(p.idle)-1])
	}
	p.setStateLocked(Terminated, "pool closed")
	p.mu.Unlock()
	close(p.done)
	<-p.stopped
}

// Pause stops handing out connections: new checkouts wait (within their
// deadline), idle connections are closed now and checked-out ones when they
// come back. It returns at once; WaitEmpty waits for the last to close.
func (p *Pool[C]) Pause() {
	p.mu.Lock()
	p.paused = true
	for len(p.idle) > 0 {
		p.countEvictionLocked(p.idle[len(p.idle)-1], "paused")
		p.closeLocked(p.idle[len(p.idle)-1])
	}
	p.broadcastLocked()
	p.mu.Unlock()
}

// Suspend stops handing out connections (SUSPEND): new checkouts wait
// (within their deadline) and no connection is opened, but the open ones
// stay, idle or checked out, and those that come back are kept for
// Unsuspend.
func (p *Pool[C]) Suspend() {
	p.mu.Lock()
	p.suspended = true
	p.broadcastLocked()
	p.mu.Unlock()
}

// Unsuspend ends a Suspend: the idle connections go to the waiting
// checkouts in their order, and connects start for the rest.
func (p *Pool[C]) Unsuspend() {
	p.mu.Lock()
	p.suspended = false
	for len(p.idle) > 0 && len(p.waiters) > 0 && !p.paused {
		c := p.idle[len(p.idle)-1]
		p.removeIdleLocked(c)
		p.handOffLocked(c, false)
	}
	p.broadcastLocked()
	p.mu.Unlock()
	p.nudge()
}

// holdsBack reports whether the pool hands out and opens nothing (Pause,
// Suspend). Call with p.mu held.
func (p *Pool[C]) holdsBack() bool { return p.paused || p.suspended }

// Resume ends a pause: waiting checkouts are served again.
func (p *Pool[C]) Resume() {
	p.mu.Lock()
	p.paused = false
	p.broadcastLocked()
	p.mu.Unlock()
	p.nudge()
}

// Reconnect marks every open connection to be closed: idle ones now,
// checked-out ones when they come back. New connections replace them as
// needed; a connect backoff in progress ends (the next connect is due now).
func (p *Pool[C]) Reconnect() {
	p.mu.Lock()
	p.gen++
	if p.failures > 0 {
		// Connects that failed did so with what is being replaced: the
		// next one is due now, backing off from the base if it fails.
		p.backoffN = 0
		p.nextAttempt = p.cfg.Now()
	}
	for i := 0; i < len(p.idle); {
		if c := p.idle[i]; c.PoolEntry().gen < p.gen {
			p.countEvictionLocked(c, "reconnect")
			p.closeLocked(c)
			continue
		}
		i++
	}
	p.mu.Unlock()
	p.nudge()
}

// CloseNeeded reports whether c will be closed when it comes back
// (after Reconnect).
func (p *Pool[C]) CloseNeeded(c C) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return c.PoolEntry().gen < p.gen
}

// WaitEmpty waits until no connection is open or opening (after Pause).
// Places lent (TakeSlot) do not count: a replication connection does not
// pause.
func (p *Pool[C]) WaitEmpty(ctx context.Context) error {
	return p.waitFor(ctx, func() bool { return p.total-p.lent == 0 })
}

// WaitReconnected waits until every connection open at the last
// Reconnect has been closed.
func (p *Pool[C]) WaitReconnected(ctx context.Context) error {
	return p.waitFor(ctx, func() bool {
		for _, c := range p.conns {
			if c.PoolEntry().gen < p.gen {
				return false
			}
		}
		return true
	})
}

func (p *Pool[C]) waitFor(ctx context.Context, done func() bool) error {
	for {
		p.mu.Lock()
		ok, ch := done(), p.changed
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ConnInfo describes one open connection for inspection.
type ConnInfo struct {
	ID          uint64
	Created     time.Time
	LastUsed    time.Time // last checkin
	Idle        bool      // in the pool, not checked out
	Stale       bool      // idle longer than the validation interval
	CloseNeeded bool      // will be closed when it comes back (Reconnect)
}

// Info describes c.
func (p *Pool[C]) Info(c C) ConnInfo {
	e := c.PoolEntry()
	p.mu.Lock()
	defer p.mu.Unlock()
	return ConnInfo{ID: e.ID(), Created: e.created, LastUsed: e.lastUsed, Idle: e.state == stateIdle,
		Stale: e.state == stateIdle && p.needsValidation(c), CloseNeeded: e.gen < p.gen}
}

// All returns every open connection (for inspection); the pool keeps them.
func (p *Pool[C]) All() []C {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]C(nil), p.conns...)
}

// Idle returns the idle connections (for inspection); the pool keeps them.
func (p *Pool[C]) Idle() []C {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]C(nil), p.idle...)
}

func (p *Pool[C]) checkoutLocked(c C, fresh bool) {
	if p.cfg.CheckedOut != nil {
		p.cfg.CheckedOut(c, fresh)
	}
	e := c.PoolEntry()
	e.state = stateActive
	e.uses++
	p.active++
	p.stats.Acquisitions++
	if p.active > p.stats.PeakActive {
		p.stats.PeakActive = p.active
	}
}

func (p *Pool[C]) noteWaitLocked(d time.Duration) {
	p.stats.WaitTotal += d
	if d > p.stats.WaitMax {
		p.stats.WaitMax = d
	}
}

// handOffLocked gives c to the first waiter, or makes it idle.
func (p *Pool[C]) handOffLocked(c C, fresh bool) {
	if p.paused {
		c.PoolEntry().state = stateIdle // so closeLocked finds it in conns
		p.idle = append(p.idle, c)
		p.closeLocked(c)
		return
	}
	if len(p.waiters) > 0 && !p.suspended {
		w := p.waiters[0]
		p.removeWaiterLocked(w)
		p.checkoutLocked(c, fresh)
		w.deliverLocked(result[C]{conn: c, fresh: fresh})
		return
	}
	c.PoolEntry().state = stateIdle
	p.idle = append(p.idle, c)
	if p.total > p.set().MaxSize && p.set().reserve() {
		// A reserve connection whose waiter was served meanwhile.
		p.countEvictionLocked(c, "reserve_idle")
		p.closeLocked(c)
	}
}

func (p *Pool[C]) removeWaiterLocked(w *waiter[C]) bool {
	for i, x := range p.waiters {
		if x == w {
			copy(p.waiters[i:], p.waiters[i+1:])
			p.waiters[len(p.waiters)-1] = nil
			p.waiters = p.waiters[:len(p.waiters)-1]
			return true
		}
	}
	return false
}

func (p *Pool[C]) removeIdleLocked(c C) {
	e := c.PoolEntry()
	for i, x := range p.idle {
		if x.PoolEntry() == e {
			copy(p.idle[i:], p.idle[i+1:])
			var zero C
			p.idle[len(p.idle)-1] = zero
			p.idle = p.idle[:len(p.idle)-1]
			return
		}
	}
}

// closeLocked closes c and forgets it.
func (p *Pool[C]) closeLocked(c C) {
	p.forgetLocked(c)
	p.total--
	p.releaseSlot()
	p.broadcastLocked()
	p.evalLocked("connection closed")
}

// forgetLocked closes c and takes it out of the pool's lists, its place in
// total (and in the shared limits) left to the caller.
func (p *Pool[C]) forgetLocked(c C) {
	e := c.PoolEntry()
	if e.state == stateIdle {
		p.removeIdleLocked(c)
	}
	if e.state == stateIdle || e.state == stateActive {
		last := len(p.conns) - 1
		moved := p.conns[last]
		p.conns[e.idx] = moved
		moved.PoolEntry().idx = e.idx
		var zero C
		p.conns[last] = zero
		p.conns = p.conns[:last]
	}
	e.state = stateClosed
	// Close may block briefly on a socket; it never calls back into the pool.
	go c.Close()
}

// TakeSlot takes a place in the pool's size for a connection the pool does
// not hold (a replication connection, which PgBouncer counts in pool_size):
// a free place at once, else the place of an idle connection, which is
// closed (evicted), else the place of the first connection freed for it in
// FIFO order with the checkouts, waiting until ctx ends as Get does. The
// place counts in MaxSize and in the shared limits (Admit) until release
// runs; Pause does not wait for it (WaitEmpty).
func (p *Pool[C]) TakeSlot(ctx context.Context) (release func(), err error) {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return nil, ErrClosed
	case len(p.waiters) > 0 || p.holdsBack():
		// Behind the queue (or the pause), as any checkout.
	case p.total < p.set().MaxSize && (p.cfg.Admit == nil || p.cfg.Admit()):
		p.total++
		p.lent++
		p.broadcastLocked()
		p.mu.Unlock()
		return p.slotRelease(), nil
	case len(p.idle) > 0:
		p.lendLocked(p.idle[0])
		p.mu.Unlock()
		return p.slotRelease(), nil
	}
	p.mu.Unlock()
	c, err := p.Get(ctx) // checked out: ours to turn into a place
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.active--
	p.stats.Releases++
	p.lendLocked(c)
	p.mu.Unlock()
	return p.slotRelease(), nil
}

// lendLocked closes c (idle, or checked out by TakeSlot) and keeps its
// place, and its share of the shared limits, as a place lent.
func (p *Pool[C]) lendLocked(c C) {
	p.countEvictionLocked(c, "evicted")
	p.forgetLocked(c)
	p.lent++
	p.broadcastLocked()
}

// slotRelease gives back a place TakeSlot took (once, however often it is
// called): the next waiter gets a connection opened in it.
func (p *Pool[C]) slotRelease() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			p.lent--
			p.total--
			p.releaseSlot()
			p.broadcastLocked()
			if !p.closed && len(p.waiters) > p.opening && p.total < p.set().MaxSize {
				p.startConnectLocked()
			}
			p.evalLocked("replication connection closed")
			p.mu.Unlock()
			p.nudge()
		})
	}
}

func (p *Pool[C]) statsLocked() Stats {
	s := p.stats
	s.Total, s.Idle, s.Active, s.Opening, s.Waiting, s.Lent = p.total, len(p.idle), p.active, p.opening, len(p.waiters), p.lent
	s.Paused, s.Suspended = p.paused, p.suspended
	s.EffectiveMinSize = p.warmTarget()
	if len(p.waiters) > 0 {
		s.OldestWait = p.cfg.Now().Sub(p.waiters[0].since)
	}
	s.Evictions = maps.Clone(p.stats.Evictions)
	s.Failures = p.failures
	if p.failures > 0 {
		s.NextRetry = p.nextAttempt
	}
	if p.lastErr != nil {
		s.LastError = p.lastErr.Error()
	}
	return s
}

// startConnectLocked opens one connection in the background (unless connects
// are in backoff); it goes to the first waiter, or becomes idle.
func (p *Pool[C]) startConnectLocked() {
	if p.failures > 0 && p.cfg.Now().Before(p.nextAttempt) {
		return // backing off: the maintainer retries when due
	}
	if (p.failures > 0 || !p.everOpened) && p.opening > 0 {
		return // one attempt at a time until the server is known to answer
	}
	if p.cfg.Admit != nil && !p.cfg.Admit() {
		return // at a shared limit: Nudge retries when a slot frees up
	}
	p.total++
	p.opening++
	p.stats.ConnectAttempts++
	attempt := p.failures + 1
	go func() {
		start := p.cfg.Now()
		c, err := p.dial()
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			p.connectFailedLocked(err, attempt)
			return
		}
		p.stats.LastCheckLatency = p.cfg.Now().Sub(start)
		p.adoptLocked(c)
	}()
}

func (p *Pool[C]) dial() (C, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.set().ConnectTimeout)
	defer cancel()
	return p.cfg.Connect(ctx)
}

// retryInLocked is how long until the next connect attempt is due, for the
// logs: never negative (an attempt that is overdue is due now, or already
// in flight), rounded to the millisecond.
func (p *Pool[C]) retryInLocked() time.Duration {
	return max(p.nextAttempt.Sub(p.cfg.Now()), 0).Round(time.Millisecond)
}

// backoff is the pause after n failures in a row, with ±20 % jitter.
func (p *Pool[C]) backoff(n int) time.Duration {
	d := p.set().BackoffBase
	for i := 1; i < n && d < p.set().BackoffMax; i++ {
		d *= 2
	}
	d = min(d, p.set().BackoffMax)
	return time.Duration(float64(d) * (0.8 + 0.4*p.cfg.Rand()))
}

func (p *Pool[C]) connectFailedLocked(err error, attempt int) {
	p.opening--
	p.total--
	p.releaseSlot()
	p.stats.ConnectFailures++
	if open := p.total - p.opening; p.cfg.Capacity != nil && len(p.waiters) == 0 && open > 0 && !p.closed {
		if limit, ok := p.cfg.Capacity(err); ok {
			// Filling the floor, and the server has no slot for it:
			// serve with what is open rather than back off as if
			// the server were failing.
			p.lowerFloorLocked(p.total, limit, err) // those being opened may fit
			p.evalLocked("min_size lowered")
			p.broadcastLocked()
			return
		}
	}
	p.lastErr = err
	if attempt <= p.failures {
		// Started before the last failure (connects in flight together when
		// the server went away): the same round, not a reason to back off
		// further.
		p.log.Warn("server connect failed", zap.Int("attempt", p.failures), zap.Bool("same_round", true),
			zap.Duration("next_retry_in", p.retryInLocked()), zap.Error(err))
		p.evalLocked("connect failed: " + err.Error())
		return
	}
	p.failures++
	p.backoffN++
	wait := p.backoff(p.backoffN)
	p.nextAttempt = p.cfg.Now().Add(wait)
	p.log.Warn("server connect failed",
		zap.Int("attempt", p.failures), zap.Duration("next_retry_in", wait.Round(time.Millisecond)), zap.Error(err))
	// Nothing usable open means nothing can serve the queue before the
	// next attempt: tell every waiter now instead of letting them time
	// out.
	if p.usableLocked() == 0 && !p.waitsLocked(err) {
		uerr := &UnavailableError{RetryIn: wait, Attempts: p.failures, Err: err}
		for _, w := range p.waiters {
			w.deliverLocked(result[C]{err: uerr})
		}
		p.waiters = p.waiters[:0]
	}
	p.evalLocked("connect failed: " + err.Error())
	p.broadcastLocked()
	p.nudge()
}

// adoptLocked takes a newly opened connection into the pool.
func (p *Pool[C]) adoptLocked(c C) {
	p.opening--
	now := p.cfg.Now()
	e := c.PoolEntry()
	e.id.Store(p.nextID.Add(1))
	e.created = now
	e.lastUsed = now
	e.jitter = 0.9 + 0.2*p.cfg.Rand()
	e.gen = p.gen
	e.idx = len(p.conns)
	p.conns = append(p.conns, c)
	if p.cfg.Opened != nil {
		p.cfg.Opened(c)
	}
	p.stats.LastHealthCheck = now
	p.everOpened = true
	if p.failures > 0 {
		p.log.Info("server connect succeeded; backoff ended", zap.Int("failed_attempts", p.failures))
	}
	p.failures, p.backoffN, p.lastErr = 0, 0, nil
	p.logFloorLocked()
	if p.closed {
		e.state = stateActive
		p.closeLocked(c)
		return
	}
	p.handOffLocked(c, true)
	p.evalLocked("connected")
	p.broadcastLocked()
	p.nudge()
}

// warmTarget is how many connections the pool wants open regardless of
// demand.
func (p *Pool[C]) warmTarget() int {
	t := p.configuredFloor()
	if p.floorCap > 0 && p.floorCap < t {
		t = p.floorCap
	}
	return t
}

// configuredFloor is the floor the settings ask for.
func (p *Pool[C]) configuredFloor() int {
	if p.cfg.Warm {
		return max(p.set().MinSize, 1)
	}
	return p.set().MinSize
}

// lowerFloorLocked lowers the floor to open connections (those open and
// being opened): the server refused one more for lack of connection slots
// (limit names which).
func (p *Pool[C]) lowerFloorLocked(open int, limit string, err error) {
	p.floorCap = open
	p.floorRetry = p.cfg.Now().Add(p.set().BackoffMax)
	p.floorLimit, p.floorErr = limit, err
	p.logFloorLocked()
}

// logFloorLocked logs a lowered floor once the connects in flight have
// settled it, unless it is the floor logged last (a retry refused again).
func (p *Pool[C]) logFloorLocked() {
	if p.floorCap == 0 || p.opening > 0 || p.floorCap == p.floorLogged {
		return
	}
	p.floorLogged = p.floorCap
	p.log.Warn("min_size lowered: PostgreSQL refuses more connections",
		zap.Int("min_size", p.set().MinSize), zap.Int("effective_min_size", p.floorCap), zap.String("limit", p.floorLimit),
		zap.Duration("retry_every", p.set().BackoffMax), zap.Error(p.floorErr))
}

// raiseFloorLocked lets a lowered floor try one connection more every
// BackoffMax, and lifts the cap once it reaches the configured floor.
func (p *Pool[C]) raiseFloorLocked(now time.Time) {
	if p.floorCap == 0 || now.Before(p.floorRetry) {
		return
	}
	p.floorCap++
	p.floorRetry = now.Add(p.set().BackoffMax)
	if p.floorCap >= p.configuredFloor() {
		p.floorCap, p.floorLogged, p.floorErr = 0, 0, nil
		p.log.Info("min_size restored: PostgreSQL accepts connections again", zap.Int("min_size", p.set().MinSize))
	}
}

// evalLocked recomputes the health state after an event.
func (p *Pool[C]) evalLocked(reason string) {
	st := p.stats.State
	if st == ShuttingDown || st == Terminated {
		return
	}
	open := p.total - p.opening
	var next State
	switch {
	case p.failures > 0 && 2*open >= p.set().MaxSize:
		next = Degraded
	case p.failures > 0:
		next = Unhealthy
	case open >= p.warmTarget() && (st == Initializing || st == Recovering || st == Unhealthy || st == Degraded):
		next = Healthy
	case st == Unhealthy || st == Degraded:
		next = Recovering
	default:
		next = st
	}
	p.setStateLocked(next, reason)
}

func (p *Pool[C]) setStateLocked(next State, reason string) {
	prev := p.stats.State
	if next == prev {
		return
	}
	p.stats.State = next
	p.broadcastLocked()
	fields := []zap.Field{zap.Stringer("from", prev), zap.Stringer("to", next), zap.String("reason", reason),
		zap.Int("open", p.total-p.opening), zap.Int("max_size", p.set().MaxSize)}
	if p.failures > 0 && next != ShuttingDown && next != Terminated {
		fields = append(fields, zap.Duration("next_retry_in", p.retryInLocked()))
	}
	if next == Unhealthy || next == Degraded {
		p.log.Warn("pool health changed", fields...)
	} else {
		p.log.Info("pool health changed", fields...)
	}
}

func (p *Pool[C]) countEvictionLocked(c C, reason string) {
	if p.cfg.Closed != nil {
		p.cfg.Closed(c, reason)
	}
	if p.stats.Evictions == nil {
		p.stats.Evictions = map[string]uint64{}
	}
	p.stats.Evictions[reason]++
}

func (p *Pool[C]) releaseSlot() {
	if p.cfg.Release != nil {
		go p.cfg.Release()
	}
}

// Nudge makes the maintainer look again at what the pool needs (a slot of
// a shared limit may have freed up).
func (p *Pool[C]) Nudge() { p.nudge() }

// CloseIdle closes the least recently used idle connection, to make room
// under a limit shared with other pools. It reports whether it closed one.
func (p *Pool[C]) CloseIdle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) == 0 {
		return false
	}
	p.countEvictionLocked(p.idle[0], "make_room")
	p.closeLocked(p.idle[0])
	return true
}

// broadcastLocked wakes everyone waiting on Changed.
func (p *Pool[C]) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Pool[C]) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// maintain keeps the pool's floor of connections open, retries failed
// connects with backoff (probing for the server's return), and recycles
// idle connections.
func (p *Pool[C]) maintain() {
	defer close(p.stopped)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-p.wake:
		case <-t.C:
		}
		now := p.cfg.Now()
		p.probeIfDown(now)
		p.mu.Lock()
		p.recycleIdleLocked(now)
		p.raiseFloorLocked(now)
		p.fillLocked(now)
		long := p.longWaitLocked(now)
		tick := time.Second
		if p.failures > 0 {
			tick = min(p.cfg.ProbeInterval, max(p.nextAttempt.Sub(now), time.Millisecond))
		}
		tick = p.reserveTickLocked(now, tick)
		p.mu.Unlock()
		if long {
			p.cfg.LongWait(p.Stats())
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(tick)
	}
}

// longWaitLocked reports whether LongWait is due: the first queued checkout
// has waited WaitWarning, and the last call is LongWaitEvery ago.
func (p *Pool[C]) longWaitLocked(now time.Time) bool {
	limit := p.set().WaitWarning
	if p.cfg.LongWait == nil || limit <= 0 || len(p.waiters) == 0 || now.Sub(p.waiters[0].since) < limit {
		return false
	}
	if !p.lastLongW.IsZero() && now.Sub(p.lastLongW) < LongWaitEvery {
		return false
	}
	p.lastLongW = now
	return true
}

// probeIfDown checks, while the server refuses TCP connections, whether it
// accepts them again; if so the backoff starts over and a connect is due at
// once.
func (p *Pool[C]) probeIfDown(now time.Time) {
	p.mu.Lock()
	down := p.failures > 0 && p.lastErr != nil && p.cfg.Probe != nil && p.cfg.Unreachable != nil &&
		p.cfg.Unreachable(p.lastErr) && now.Before(p.nextAttempt)
	p.mu.Unlock()
	if !down {
		return
	}
	// A dial, not a login: a second is plenty even for a distant server,
	// and bounds how long the maintainer waits on a blackholed one.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := p.cfg.Probe(ctx)
	cancel()
	if err != nil {
		return
	}
	p.mu.Lock()
	if p.failures > 0 {
		p.log.Info("server accepts connections again; retrying now", zap.Int("failed_attempts", p.failures))
		p.backoffN = 0 // the next failure backs off from the base again
		p.nextAttempt = now
	}
	p.mu.Unlock()
}

// fillLocked starts connects the pool needs: its floor (min_size, or one
// while warming up or failing after it had connections) and the waiters
// not yet covered by a connect in progress.
func (p *Pool[C]) fillLocked(now time.Time) {
	if p.closed || p.holdsBack() {
		return
	}
	target := p.warmTarget()
	need := max(target-p.total, len(p.waiters)-p.opening)
	if p.failures > 0 && p.everOpened {
		// Keep trying (under backoff) until a connect succeeds again, even
		// with connections open and nobody waiting: otherwise the pool
		// would stay degraded or unhealthy after the server recovered.
		need = max(need, 1)
	}
	for range min(need, p.set().MaxSize-p.total) {
		before := p.opening
		p.startConnectLocked()
		if p.opening == before {
			break // backing off
		}
	}
	p.fillReserveLocked(now)
}

// fillReserveLocked opens reserve connections, beyond MaxSize, for the
// checkouts that have waited ReserveTimeout and no connect in progress
// covers, up to ReserveSize.
func (p *Pool[C]) fillReserveLocked(now time.Time) {
	set := p.set()
	if !set.reserve() || p.closed || p.holdsBack() || p.total < set.MaxSize {
		return
	}
	due := 0
	for _, w := range p.waiters {
		if now.Sub(w.since) >= set.ReserveTimeout {
			due++
		}
	}
	for range min(due-p.opening, set.MaxSize+set.ReserveSize-p.total) {
		before := p.opening
		p.startConnectLocked()
		if p.opening == before {
			break // backing off, or a shared limit said no
		}
		p.stats.ReserveOpened++
		p.log.Info("taking connection from reserve_pool: a request waited reserve_pool_timeout",
			zap.Int("open", p.total), zap.Int("max_size", set.MaxSize), zap.Int("reserve_pool_size", set.ReserveSize))
	}
}

// reserveTickLocked is how long until the first queued checkout is due a
// reserve connection, when that is sooner than tick.
func (p *Pool[C]) reserveTickLocked(now time.Time, tick time.Duration) time.Duration {
	set := p.set()
	if !set.reserve() || len(p.waiters) == 0 || p.total < set.MaxSize {
		return tick
	}
	return min(tick, max(set.ReserveTimeout-now.Sub(p.waiters[0].since), time.Millisecond))
}

// recycleReason says why an idle connection should be closed now, if it
// should. idle is true for the janitor's scan of idle connections.
func (p *Pool[C]) recycleReason(e *Entry, now time.Time, idle bool) string {
	set := p.set()
	switch {
	case set.MaxUses > 0 && e.uses >= set.MaxUses:
		return RecycleUses
	case set.MaxLifetime > 0 && now.Sub(e.created) >= time.Duration(float64(set.MaxLifetime)*e.jitter):
		return RecycleLifetime
	case set.MaxQueries > 0 && e.queries.Load() >= set.MaxQueries:
		return RecycleQueries
	case idle && e.idleFor(set) > 0 && now.Sub(e.lastUsed) >= e.idleFor(set) && p.total > p.warmTarget():
		return RecycleIdle
	}
	return ""
}

// idleFor is the connection's idle timeout: its own, or the pool's.
func (e *Entry) idleFor(set *Settings) time.Duration {
	if d := time.Duration(e.idleTimeout.Load()); d > 0 {
		return d
	}
	return set.IdleTimeout
}

func (p *Pool[C]) recycleBudgetLocked(now time.Time) bool {
	if now.Sub(p.recycleSec) >= time.Second {
		p.recycleSec, p.recycledNow = now, 0
	}
	return p.recycledNow < p.set().RecycleRate
}

// recycleIdleLocked closes idle connections due for recycling, oldest use
// first, within the recycle rate.
func (p *Pool[C]) recycleIdleLocked(now time.Time) {
	if p.closed {
		return
	}
	for i := 0; i < len(p.idle) && p.recycleBudgetLocked(now); {
		c := p.idle[i] // least recently used first
		if reason := p.recycleReason(c.PoolEntry(), now, true); reason != "" {
			p.recycleLocked(c, reason, now)
			continue
		}
		i++
	}
}

func (p *Pool[C]) recycleLocked(c C, reason string, now time.Time) {
	e := c.PoolEntry()
	if reason != RecycleUses {
		p.recycledNow++
	}
	switch reason {
	case RecycleUses:
		p.stats.RecycledUses++
	case RecycleLifetime:
		p.stats.RecycledLifetime++
	case RecycleQueries:
		p.stats.RecycledQueries++
	case RecycleIdle:
		p.stats.RecycledIdle++
	}
	if p.cfg.Closed != nil {
		p.cfg.Closed(c, reason)
	}
	p.log.Info("server connection recycled", zap.Uint64("conn_id", e.ID()), zap.String("reason", reason),
		zap.Duration("lifetime", now.Sub(e.created).Round(time.Millisecond)), zap.Uint64("queries", e.queries.Load()))
	p.closeLocked(c)
}
