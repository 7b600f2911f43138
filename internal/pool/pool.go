// Package pool keeps the server connections of one (database, user) pair:
// checkout with a deadline and a FIFO queue, reuse of the most recently used
// idle connection, background connects, a floor of open connections, and
// statistics.
package pool

import (
	"context"
	"errors"
	"fmt"
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
	id       uint64
	created  time.Time
	lastUsed time.Time
	uses     uint64
	state    entryState // guarded by the pool's mutex
}

// ID is the connection's number, unique within the process.
func (e *Entry) ID() uint64 { return e.id }

// Created is when the connection was opened.
func (e *Entry) Created() time.Time { return e.created }

// Uses is how many times the connection has been checked out.
func (e *Entry) Uses() uint64 { return e.uses }

type entryState uint8

const (
	stateNew entryState = iota
	stateIdle
	stateActive
	stateClosed
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

// ConnectError wraps a failure to open a server connection.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return "connect to server: " + e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// Config configures a pool.
type Config[C Conn] struct {
	// MaxSize is the most connections open or opening at once.
	MaxSize int
	// MinSize is how many connections the pool keeps open.
	MinSize int
	// Connect opens one connection; ctx carries the connect deadline.
	Connect func(ctx context.Context) (C, error)
	// ConnectTimeout bounds one Connect call.
	ConnectTimeout time.Duration
	// RetryDelay is the pause after a failed background connect before the
	// pool tries again to reach MinSize.
	RetryDelay time.Duration
	// Logger receives lifecycle events; it should carry the pool's fields.
	Logger *zap.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Stats is a consistent snapshot of a pool.
type Stats struct {
	MaxSize, MinSize int
	// Total counts open connections plus those being opened.
	Total, Idle, Active, Opening, Waiting int
	// Acquisitions counts successful checkouts; Hits were served by an idle
	// connection, Misses had to wait for a new or returned one.
	Acquisitions, Hits, Misses uint64
	Releases                   uint64
	Timeouts                   uint64
	ConnectAttempts            uint64
	ConnectFailures            uint64
	// WaitTotal is the summed checkout wait; WaitMax the longest.
	WaitTotal, WaitMax time.Duration
	PeakActive         int
	Created            time.Time
}

type waiter[C Conn] struct {
	ch chan result[C] // buffered, capacity 1
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

	mu      sync.Mutex
	idle    []C // most recently used last
	total   int
	active  int
	opening int
	waiters []*waiter[C] // FIFO
	closed  bool
	stats   Stats

	wake    chan struct{} // nudges the maintainer
	done    chan struct{}
	stopped chan struct{}
}

// New creates a pool and starts its maintainer, which keeps MinSize
// connections open. ids numbers connections across pools.
func New[C Conn](cfg Config[C], ids *atomic.Uint64) *Pool[C] {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = time.Second
	}
	p := &Pool[C]{
		cfg:     cfg,
		log:     cfg.Logger,
		nextID:  ids,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	p.stats.MaxSize, p.stats.MinSize = cfg.MaxSize, cfg.MinSize
	p.stats.Created = cfg.Now()
	go p.maintain()
	return p
}

// TryGet checks out the most recently used idle connection if one is free
// and nobody is queued, without waiting or opening a connection.
func (p *Pool[C]) TryGet() (C, bool) {
	var zero C
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if p.closed || n == 0 || len(p.waiters) > 0 {
		return zero, false
	}
	c := p.idle[n-1]
	p.idle[n-1] = zero
	p.idle = p.idle[:n-1]
	p.checkoutLocked(c)
	p.stats.Hits++
	return c, true
}

// Get checks out a connection, waiting in FIFO order until one is free or
// ctx ends. A context deadline that passes yields *CheckoutTimeoutError.
func (p *Pool[C]) Get(ctx context.Context) (C, error) {
	var zero C
	start := p.cfg.Now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return zero, ErrClosed
	}
	if n := len(p.idle); n > 0 && len(p.waiters) == 0 {
		c := p.idle[n-1]
		p.idle[n-1] = zero
		p.idle = p.idle[:n-1]
		p.checkoutLocked(c)
		p.stats.Hits++
		p.mu.Unlock()
		return c, nil
	}
	w := &waiter[C]{ch: make(chan result[C], 1)}
	p.waiters = append(p.waiters, w)
	if p.total < p.cfg.MaxSize {
		p.startConnectLocked()
	}
	p.mu.Unlock()

	select {
	case r := <-w.ch:
		return p.received(r, start)
	case <-ctx.Done():
	}
	p.mu.Lock()
	if !p.removeWaiterLocked(w) {
		// Served between ctx.Done and the lock: take what was handed over.
		p.mu.Unlock()
		return p.received(<-w.ch, start)
	}
	waited := p.cfg.Now().Sub(start)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		p.stats.Timeouts++
		st := p.statsLocked()
		p.mu.Unlock()
		return zero, &CheckoutTimeoutError{Waited: waited, Stats: st}
	}
	p.mu.Unlock()
	return zero, ctx.Err()
}

func (p *Pool[C]) received(r result[C], start time.Time) (C, error) {
	if r.err != nil {
		return r.conn, r.err
	}
	p.mu.Lock()
	if r.fresh {
		p.stats.Misses++
	} else {
		p.stats.Hits++
	}
	p.noteWaitLocked(p.cfg.Now().Sub(start))
	p.mu.Unlock()
	return r.conn, nil
}

// Put returns a clean connection: the next waiter gets it, or it becomes the
// most recently used idle connection.
func (p *Pool[C]) Put(c C) {
	e := c.PoolEntry()
	p.mu.Lock()
	if e.state != stateActive {
		p.mu.Unlock()
		return
	}
	p.active--
	p.stats.Releases++
	e.lastUsed = p.cfg.Now()
	if p.closed {
		p.closeLocked(c)
		p.mu.Unlock()
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
		p.removeIdleLocked(c)
	default:
		p.mu.Unlock()
		return
	}
	p.closeLocked(c)
	if !p.closed && len(p.waiters) > p.opening && p.total < p.cfg.MaxSize {
		p.startConnectLocked()
	}
	p.mu.Unlock()
	p.log.Debug("server connection discarded", zap.Uint64("conn_id", e.id), zap.String("reason", reason))
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
	for _, w := range p.waiters {
		w.ch <- result[C]{err: ErrClosed}
	}
	p.waiters = nil
	idle := p.idle
	p.idle = nil
	for _, c := range idle {
		c.PoolEntry().state = stateNew // so closeLocked does not look in idle
		p.closeLocked(c)
	}
	p.mu.Unlock()
	close(p.done)
	<-p.stopped
}

// Idle returns the idle connections (for inspection by tests and the admin
// console); the pool keeps ownership.
func (p *Pool[C]) Idle() []C {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]C(nil), p.idle...)
}

func (p *Pool[C]) checkoutLocked(c C) {
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
	if len(p.waiters) > 0 {
		w := p.waiters[0]
		p.removeWaiterLocked(w)
		p.checkoutLocked(c)
		w.ch <- result[C]{conn: c, fresh: fresh}
		return
	}
	c.PoolEntry().state = stateIdle
	p.idle = append(p.idle, c)
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

// closeLocked closes c and forgets it. c must not be in the idle list.
func (p *Pool[C]) closeLocked(c C) {
	e := c.PoolEntry()
	if e.state == stateIdle {
		p.removeIdleLocked(c)
	}
	e.state = stateClosed
	p.total--
	// Close may block briefly on a socket; it never calls back into the pool.
	go c.Close()
}

func (p *Pool[C]) statsLocked() Stats {
	s := p.stats
	s.Total, s.Idle, s.Active, s.Opening, s.Waiting = p.total, len(p.idle), p.active, p.opening, len(p.waiters)
	return s
}

// startConnectLocked opens one connection in the background; it goes to the
// first waiter, or becomes idle.
func (p *Pool[C]) startConnectLocked() {
	p.total++
	p.opening++
	p.stats.ConnectAttempts++
	go func() {
		c, err := p.dial()
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			p.connectFailedLocked()
			// The waiter this attempt was started for learns why at once,
			// instead of waiting out its checkout timeout.
			if len(p.waiters) > p.opening {
				w := p.waiters[0]
				p.removeWaiterLocked(w)
				w.ch <- result[C]{err: &ConnectError{Err: err}}
			}
			p.log.Warn("server connect failed", zap.Error(err))
			return
		}
		p.adoptLocked(c)
	}()
}

func (p *Pool[C]) dial() (C, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ConnectTimeout)
	defer cancel()
	return p.cfg.Connect(ctx)
}

func (p *Pool[C]) connectFailedLocked() {
	p.opening--
	p.total--
	p.stats.ConnectFailures++
}

// adoptLocked takes a newly opened connection into the pool.
func (p *Pool[C]) adoptLocked(c C) {
	p.opening--
	e := c.PoolEntry()
	e.id = p.nextID.Add(1)
	e.created = p.cfg.Now()
	e.lastUsed = e.created
	if p.closed {
		e.state = stateActive
		p.closeLocked(c)
		return
	}
	p.handOffLocked(c, true)
}

func (p *Pool[C]) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// maintain keeps MinSize connections open, retrying after failures.
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
		p.mu.Lock()
		need := p.cfg.MinSize - p.total
		p.mu.Unlock()
		for range max(need, 0) {
			if err := p.openIdle(); err != nil {
				p.log.Warn("could not open min_size server connections; retrying",
					zap.Int("min_size", p.cfg.MinSize), zap.Duration("retry_in", p.cfg.RetryDelay), zap.Error(err))
				break
			}
		}
		t.Reset(p.cfg.RetryDelay)
	}
}

// openIdle opens one connection synchronously for the maintainer.
func (p *Pool[C]) openIdle() error {
	p.mu.Lock()
	if p.closed || p.total >= p.cfg.MinSize || p.total >= p.cfg.MaxSize {
		p.mu.Unlock()
		return nil
	}
	p.total++
	p.opening++
	p.stats.ConnectAttempts++
	p.mu.Unlock()
	c, err := p.dial()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.connectFailedLocked()
		return err
	}
	p.adoptLocked(c)
	return nil
}
