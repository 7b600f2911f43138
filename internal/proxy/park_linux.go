//go:build linux

package proxy

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/poolerd/poolerd/internal/wire"
)

// parkSweep is how often idle clients are looked for: a client that sent
// nothing for a whole sweep interval, and holds no server connection, is
// parked (so within one to two intervals of its last message).
const parkSweep = time.Second

// parker holds idle client sessions without a goroutine. A goroutine costs
// at least a 2 KiB stack; with tens of thousands of idle clients that is
// most of poolerd's memory. A parked session's socket is watched by the
// parker's own epoll instance (one-shot, level-triggered); when the client
// sends something or hangs up, a new goroutine resumes the session. The
// epoll descriptor is itself watched by the runtime's poller, so waiting
// for parked clients blocks no thread.
//
// Sessions park right after login (most clients wait a round trip before
// their first query, and many pooled application connections sit idle for
// long) and when a sweep finds them idle. Parking and resuming cost a few
// system calls each, never on the path of a session that is busy.
type parker struct {
	srv *Server

	// Set once, by start (under once); read-only afterwards.
	once sync.Once
	err  error    // from starting; parking is off when set
	epfd int      // the epoll instance
	file *os.File // epfd, for the runtime poller
	stop chan struct{}
	done sync.WaitGroup

	// mu guards the parked sessions (and their epollReg).
	mu     sync.Mutex
	parked map[uint64]*session
	closed bool
}

func newParker(srv *Server) *parker {
	return &parker{srv: srv, parked: map[uint64]*session{}, stop: make(chan struct{})}
}

// start creates the epoll instance and the goroutines on first use.
func (p *parker) start() error {
	p.once.Do(func() {
		fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			p.err = err
			return
		}
		if err := syscall.SetNonblock(fd, true); err != nil {
			_ = syscall.Close(fd)
			p.err = err
			return
		}
		p.epfd = fd
		p.file = os.NewFile(uintptr(fd), "poolerd-parked-clients")
		p.done.Add(2)
		go p.watch()
		go p.sweep()
	})
	return p.err
}

// park registers s, whose goroutine is about to end, with the epoll
// instance. It returns false (and s goes on reading) if it cannot. The
// session's reader and writer are dropped while it is parked (run makes
// new ones); a parked client is written to only to be refused, which
// writeClient does without them.
func (p *parker) park(s *session) bool {
	if p.start() != nil {
		return false
	}
	s.wmu.Lock()
	cio := s.cio
	s.cio = nil
	s.wmu.Unlock()
	if cio == nil {
		return false
	}
	op := syscall.EPOLL_CTL_ADD
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		s.restoreIO(cio)
		return false
	}
	if s.epollReg {
		op = syscall.EPOLL_CTL_MOD
	}
	s.epollReg = true
	p.parked[s.id] = s
	s.parked.Store(true)
	p.mu.Unlock()
	if s.endErr.Load() != nil {
		// Ended between parkable and the mark above: its wake-up may have
		// found it not parked yet. Go on, to end it.
		return p.unpark(s, cio, op)
	}

	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT,
		Fd: int32(uint32(s.id)), Pad: int32(uint32(s.id >> 32))}
	var errno error
	err := cio.Control(func(fd uintptr) {
		errno = syscall.EpollCtl(p.epfd, op, int(fd), &ev)
	})
	if err == nil && errno == nil {
		return true // from here on, s may already be running again
	}
	return p.unpark(s, cio, op)
}

// unpark takes back a park that cannot stand (the socket could not be
// registered, or the session ended meanwhile). It returns what park
// returns: true if a wake-up took the session meanwhile (the goroutine it
// started goes on), false if the caller's goroutine keeps it.
func (p *parker) unpark(s *session, cio *wire.ConnReader, op int) bool {
	p.mu.Lock()
	mine := p.parked[s.id] == s
	if mine {
		delete(p.parked, s.id)
		s.parked.Store(false)
		if op == syscall.EPOLL_CTL_ADD {
			s.epollReg = false
		}
	}
	p.mu.Unlock()
	if !mine {
		return true
	}
	s.restoreIO(cio)
	return false
}

// wake resumes s if it is parked: the session's goroutine starts again
// (for a terminated session, it finds the connection closed and ends).
func (p *parker) wake(s *session) {
	if !s.parked.Load() {
		return
	}
	p.mu.Lock()
	resume := p.parked[s.id] == s
	if resume {
		delete(p.parked, s.id)
		s.parked.Store(false)
	}
	p.mu.Unlock()
	if resume {
		go s.resume()
	}
}

// watch resumes the sessions whose clients sent something or hung up.
func (p *parker) watch() {
	defer p.done.Done()
	rc, err := p.file.SyscallConn()
	if err != nil {
		p.srv.log.Error("parked clients: no poller for the epoll descriptor")
		return
	}
	var events [128]syscall.EpollEvent
	n := 0
	wait := func(fd uintptr) bool {
		for {
			k, err := syscall.EpollWait(int(fd), events[:], 0)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			n = max(k, 0)
			return n > 0 || err != nil
		}
	}
	var resume []*session
	for {
		if err := rc.Read(wait); err != nil {
			return // closed
		}
		p.mu.Lock()
		for _, ev := range events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if s := p.parked[id]; s != nil {
				delete(p.parked, id)
				s.parked.Store(false)
				resume = append(resume, s)
			}
		}
		p.mu.Unlock()
		for i, s := range resume {
			go s.resume()
			resume[i] = nil
		}
		resume = resume[:0]
	}
}

// sweep parks the clients that were idle for a whole interval: it sets a
// read deadline in the past, which returns their goroutine from its read;
// the goroutine parks the session if it is still idle (run).
func (p *parker) sweep() {
	defer p.done.Done()
	t := time.NewTicker(parkSweep)
	defer t.Stop()
	var idle []*session
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.srv.mu.Lock()
		for _, s := range p.srv.sessions {
			if s.parkable() && !s.active.Swap(false) {
				idle = append(idle, s)
			}
		}
		p.srv.mu.Unlock()
		past := time.Unix(1, 0)
		for i, s := range idle {
			_ = s.conn.SetReadDeadline(past)
			idle[i] = nil
		}
		idle = idle[:0]
	}
}

// parkedCount is how many sessions are parked.
func (p *parker) parkedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parked)
}

// close stops the parker once every session has ended.
func (p *parker) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.once.Do(func() { p.err = errors.New("closed") }) // never started: nothing to stop
	if p.file == nil {
		return
	}
	close(p.stop)
	_ = p.file.Close()
	p.done.Wait()
}
