// Package faultproxy is a fault-injecting TCP proxy for integration tests.
//
// A Proxy sits between poolerd and PostgreSQL (poolerd is configured with the
// proxy's address as its upstream) and makes hung servers, dead peers, slow
// links and closed ports reproducible:
//
//	px, err := faultproxy.Start(pgAddr)
//	if err != nil { ... }
//	defer px.Close()
//	// point poolerd at px.Host(), px.Port()
//	px.HoldResponses(true) // backend receives queries but never answers
//
// # Data path
//
// Every accepted connection is paired with a fresh connection to the target.
// Each direction is served by a reader goroutine, which reads chunks from the
// source into a small bounded queue, and a writer goroutine, which takes the
// chunks in order, waits until forwarding is allowed (mode, hold, delay) and
// writes them to the destination. Chunks are therefore never reordered, and a
// chunk read while forwarding is not allowed is held (or discarded, in
// Blackhole) instead of being written. When the queue is full the reader
// stops reading, so further bytes stay in the kernel socket buffers and TCP
// flow control applies as usual.
//
// An end of stream (the peer's FIN) travels through the same queue as data:
// it is propagated with CloseWrite once every chunk before it has been
// forwarded, and it is held like data while a direction is held. When both
// directions have finished, both sockets are closed. A read or write error
// other than end of stream (for example a reset) aborts the connection and
// resets both sockets.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Mode selects how the proxy treats connections. It applies to connections,
// both new and existing, from the moment it is set with SetMode.
type Mode int

const (
	// Forward forwards bytes normally in both directions (subject to
	// SetDelay and HoldResponses).
	Forward Mode = iota
	// Hang accepts new connections and keeps existing ones open but
	// forwards nothing in either direction. Bytes read meanwhile, and end
	// of stream, are held, not dropped, and are released in order when the
	// mode returns to Forward.
	Hang
	// Blackhole accepts new connections and keeps existing ones open but
	// forwards nothing, and discards every byte read from either side
	// (including bytes held by an earlier Hang or HoldResponses): that
	// data is lost forever. End of stream is held, as in Hang, since there
	// is nothing to discard.
	Blackhole
	// Refuse accepts new connections and immediately resets them
	// (SetLinger(0) then Close). Existing connections keep the behaviour of
	// the mode that was in force before Refuse was set (Forward, Hang or
	// Blackhole).
	Refuse
)

// String returns the name of the mode.
func (m Mode) String() string {
	switch m {
	case Forward:
		return "Forward"
	case Hang:
		return "Hang"
	case Blackhole:
		return "Blackhole"
	case Refuse:
		return "Refuse"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// queueLen is the number of chunks a direction may hold in the proxy before
// its reader stops reading; chunkSize is the largest chunk read at once.
const (
	queueLen  = 16
	chunkSize = 32 << 10
)

// Proxy forwards TCP connections from its listener to a target address and
// can inject faults, globally and per connection. Safe for concurrent use.
type Proxy struct {
	target string
	addr   string // fixed at Start; Resume listens on it again

	mu         sync.Mutex
	changed    chan struct{} // closed and replaced whenever the state below changes
	mode       Mode          // as set by SetMode
	flow       Mode          // mode governing data flow: never Refuse
	delay      time.Duration //
	hold       bool          // hold target→client bytes
	closed     bool
	ln         net.Listener  // nil while paused or closed
	acceptDone chan struct{} // closed when the accept loop of ln exits
	conns      map[*conn]struct{}
	accepted   int
	discarded  int64

	wg sync.WaitGroup // every goroutine started by the proxy
}

// Start listens on 127.0.0.1:0 and forwards every accepted connection to
// target ("host:port"). The target is dialed once per accepted connection,
// when the connection is accepted; if that dial fails the accepted
// connection is reset.
func Start(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: bad target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{
		target:  target,
		addr:    ln.Addr().String(),
		changed: make(chan struct{}),
		conns:   make(map[*conn]struct{}),
	}
	p.mu.Lock()
	p.startAcceptLocked(ln)
	p.mu.Unlock()
	return p, nil
}

// Addr returns the address the proxy listens on, "127.0.0.1:port". It does
// not change across Pause and Resume.
func (p *Proxy) Addr() string { return p.addr }

// Host returns the host part of Addr ("127.0.0.1").
func (p *Proxy) Host() string {
	h, _, _ := net.SplitHostPort(p.addr)
	return h
}

// Port returns the port part of Addr.
func (p *Proxy) Port() int {
	_, ps, _ := net.SplitHostPort(p.addr)
	n, _ := strconv.Atoi(ps)
	return n
}

// SetMode sets the mode for new and existing connections. See Mode.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if m != Refuse {
		p.flow = m
	}
	p.notifyLocked()
}

// SetDelay adds latency d to every chunk forwarded, in each direction
// (0 = none). A chunk is written no earlier than d after it was read (or
// after it was released, if it was held), and chunks are never reordered, so
// a steady stream is shifted by d rather than slowed down per chunk. A change
// takes effect immediately, also for chunks already waiting out a delay.
func (p *Proxy) SetDelay(d time.Duration) {
	if d < 0 {
		d = 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
	p.notifyLocked()
}

// HoldResponses controls the target→client direction only, which is what a
// hung PostgreSQL backend looks like: it receives queries but never answers.
// With hold true, target→client bytes (and end of stream) stop being
// forwarded and are kept buffered; with hold false they are released in
// order. The client→target direction is not affected.
func (p *Proxy) HoldResponses(hold bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = hold
	p.notifyLocked()
}

// ResetAll abruptly resets every current connection, on both sides
// (SetLinger(0) then Close), like a dead peer. When it returns, Conns no
// longer counts those connections.
func (p *Proxy) ResetAll() {
	for _, c := range p.snapshot() {
		c.abort(true)
	}
}

// Conns returns the number of currently proxied connections, including
// connections whose target is still being dialed. Connections reset by
// Refuse are not counted.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted returns the total number of connections accepted so far,
// including those reset by Refuse.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Discarded returns the total number of bytes thrown away by Blackhole so
// far, in both directions. Tests can poll it to know that bytes written
// while blackholed have really been swallowed before switching back to
// Forward.
func (p *Proxy) Discarded() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.discarded
}

// Pause closes the listener, so that new connects fail with ECONNREFUSED;
// existing connections are unaffected. It returns once the proxy has
// stopped accepting. Pausing a paused proxy is a no-op; pausing a closed
// proxy returns net.ErrClosed.
func (p *Proxy) Pause() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return net.ErrClosed
	}
	ln, done := p.ln, p.acceptDone
	p.ln, p.acceptDone = nil, nil
	p.mu.Unlock()
	if ln == nil {
		return nil
	}
	err := ln.Close()
	<-done
	return err
}

// Resume listens again on the same address (Addr) after Pause. Resuming a
// proxy that is not paused is a no-op; resuming a closed proxy returns
// net.ErrClosed.
func (p *Proxy) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return net.ErrClosed
	}
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultproxy: resume: %w", err)
	}
	p.startAcceptLocked(ln)
	return nil
}

// Close stops listening, closes every connection (both sides) and waits
// for all goroutines of the proxy to exit. It is safe to call more than
// once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	ln := p.ln
	p.ln, p.acceptDone = nil, nil
	p.notifyLocked()
	p.mu.Unlock()

	var err error
	if ln != nil {
		err = ln.Close()
	}
	for _, c := range p.snapshot() {
		c.abort(false)
	}
	p.wg.Wait()
	return err
}

// notifyLocked wakes every goroutine waiting for a state change.
func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) snapshot() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	return cs
}

func (p *Proxy) startAcceptLocked(ln net.Listener) {
	done := make(chan struct{})
	p.ln, p.acceptDone = ln, done
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(done)
		p.acceptLoop(ln)
	}()
}

func (p *Proxy) acceptLoop(ln net.Listener) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.mu.Lock()
			stop := p.closed || p.ln != ln
			p.mu.Unlock()
			if stop {
				return
			}
			time.Sleep(5 * time.Millisecond) // e.g. EMFILE: back off, retry
			continue
		}
		p.mu.Lock()
		p.accepted++
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			continue
		}
		if p.mode == Refuse {
			p.mu.Unlock()
			resetConn(nc)
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		c := &conn{p: p, client: nc, ctx: ctx, cancel: cancel, done: make(chan struct{})}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go c.run()
	}
}

// conn is one proxied connection: client is the accepted socket, server the
// socket to the target.
type conn struct {
	p      *Proxy
	client net.Conn
	ctx    context.Context // cancels the dial to the target
	cancel context.CancelFunc
	done   chan struct{} // closed by abort

	// Guarded by p.mu.
	server  net.Conn
	aborted bool

	abortOnce sync.Once
	finished  atomic.Int32 // directions that completed with end of stream
}

// direction of a pump.
type direction int

const (
	toServer direction = iota // client → target
	toClient                  // target → client
)

// chunk is a unit of the per-direction queue; eof marks end of stream.
type chunk struct {
	data []byte
	at   time.Time // when it was read
	eof  bool
}

func (c *conn) run() {
	p := c.p
	defer p.wg.Done()
	var d net.Dialer
	srv, err := d.DialContext(c.ctx, "tcp", p.target)
	if err != nil {
		c.abort(true)
		return
	}
	p.mu.Lock()
	if c.aborted {
		p.mu.Unlock()
		srv.Close()
		return
	}
	c.server = srv
	p.wg.Add(4)
	p.mu.Unlock()

	up := make(chan chunk, queueLen)
	down := make(chan chunk, queueLen)
	go c.read(c.client, up)
	go c.write(srv, up, toServer)
	go c.read(srv, down)
	go c.write(c.client, down, toClient)
}

// read reads src into q until end of stream or error.
func (c *conn) read(src net.Conn, q chan<- chunk) {
	p := c.p
	defer p.wg.Done()
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			discard := p.flow == Blackhole
			if discard {
				p.discarded += int64(n)
			}
			p.mu.Unlock()
			if !discard {
				data := make([]byte, n)
				copy(data, buf[:n])
				select {
				case q <- chunk{data: data, at: time.Now()}:
				case <-c.done:
					return
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				select {
				case q <- chunk{eof: true, at: time.Now()}:
				case <-c.done:
				}
				return
			}
			c.abort(true) // reset or other failure: a no-op if already aborted
			return
		}
	}
}

// write forwards the chunks of q to dst, in order, as the proxy state allows.
func (c *conn) write(dst net.Conn, q <-chan chunk, dir direction) {
	defer c.p.wg.Done()
	for {
		var ch chunk
		select {
		case ch = <-q:
		case <-c.done:
			return
		}
		forward, ok := c.await(ch, dir)
		if !ok {
			return
		}
		if !forward {
			continue
		}
		if ch.eof {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				if err := cw.CloseWrite(); err != nil {
					c.abort(true)
					return
				}
			}
			if c.finished.Add(1) == 2 {
				c.abort(false)
			}
			return
		}
		if _, err := dst.Write(ch.data); err != nil {
			c.abort(true)
			return
		}
	}
}

// await blocks until ch may be forwarded in direction dir. It reports
// whether to forward (false: discard it) and ok=false if the connection is
// gone.
func (c *conn) await(ch chunk, dir direction) (forward, ok bool) {
	p := c.p
	start := ch.at // latency counts from here; reset when released from a hold
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		p.mu.Lock()
		if p.closed || c.aborted {
			p.mu.Unlock()
			return false, false
		}
		if p.flow == Blackhole && !ch.eof {
			p.discarded += int64(len(ch.data))
			p.mu.Unlock()
			return false, true
		}
		held := p.flow == Hang || p.flow == Blackhole || (dir == toClient && p.hold)
		delay := p.delay
		changed := p.changed
		p.mu.Unlock()

		var tc <-chan time.Time
		if held {
			start = time.Time{}
		} else {
			now := time.Now()
			if start.IsZero() {
				start = now
			}
			wait := start.Add(delay).Sub(now)
			if wait <= 0 {
				return true, true
			}
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			tc = timer.C
		}
		select {
		case <-changed:
		case <-tc:
		case <-c.done:
			return false, false
		}
	}
}

// abort tears the connection down once: it stops counting it, wakes its
// goroutines and closes both sockets, resetting them if reset is true.
func (c *conn) abort(reset bool) {
	c.abortOnce.Do(func() {
		p := c.p
		p.mu.Lock()
		c.aborted = true
		delete(p.conns, c)
		srv := c.server
		p.mu.Unlock()
		close(c.done)
		c.cancel()
		for _, nc := range []net.Conn{c.client, srv} {
			if nc == nil {
				continue
			}
			if reset {
				resetConn(nc)
			} else {
				nc.Close()
			}
		}
	})
}

// resetConn closes nc with an RST instead of a FIN where possible.
func resetConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	nc.Close()
}
