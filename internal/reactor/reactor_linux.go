//go:build linux

package reactor

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/poolerd/poolerd/internal/wire"
)

// loopTick is how often the monitor looks for a loop whose handler blocks.
const loopTick = 5 * time.Millisecond

// loopBatch is how many ready sockets one epoll_wait returns at most.
const loopBatch = 128

// Item states (Item.state).
const (
	itemOff      int32 = iota // not (or no longer) in the loop
	itemArmed                 // registered; no handler running
	itemHandling              // a handler is running
	itemWaiting               // out of epoll, waiting on the loop (Suspend)
)

// An item's part in a wait on its loop (Item.wait): a handler that must
// wait for something another goroutine delivers (a pooled server
// connection) says so (Suspend) and returns; the loop takes the socket out
// of epoll (park), and the delivery (WakeUp) posts the item to the loop's
// mailbox, whose handling runs the item's resume step on the loop. The
// delivery may come before the handler has returned: whichever of park and
// WakeUp comes second posts.
const (
	waitNone       int32 = iota
	waitSuspending       // suspend called; the handler has not returned
	waitReady            // delivered before the handler returned
	waitParked           // parked; not delivered yet
)

// Item is a socket in a loop.
type Item struct {
	l      *loop
	h      Handler
	fd     int          // the loop's duplicate descriptor; closed by remove
	client bool         // a client session's socket (else a server's)
	state  atomic.Int32 // itemOff, itemArmed, itemHandling, itemWaiting

	// A wait on the loop: wait is waitNone … waitParked. aw is what a
	// wait needs beyond it (itemWait), made at the item's first wait, so
	// that a socket that never waits does not carry it; owned by whoever
	// runs the item's handler.
	wait atomic.Int32
	aw   *itemWait
	// out: a waiting item is out of epoll (taken out when an event for
	// it came, or by takeOver): its resume puts it back. Owned by the
	// loop's goroutine while the item waits, by its handler otherwise.
	// byEvent, set by the handler before it waits (Sleep) and read by
	// the loop once the item is parked, says that an event on its socket
	// wakes it. hangupOnly: the socket is in epoll for EPOLLRDHUP alone (a
	// sleep taken up again after an event that was data: the client's
	// leaving behind it still wakes it); owned as out is.
	out, byEvent, hangupOnly bool
	// flags are what the handler asked of its socket's registration
	// (flagOut: WantWrite, flagHold: HoldReads; see events); changed
	// under fdMu, which also orders closing fd (closeFD) with such a
	// change from another goroutine, so that it never reaches a
	// descriptor reused by another socket; fdClosed is set once fd is
	// closed.
	flags    atomic.Uint32
	fdMu     sync.Mutex
	fdClosed bool
}

const (
	flagOut  uint32 = 1 << iota // output waits for the socket (WantWrite)
	flagHold                    // nothing more is read for now (HoldReads)
)

// closeFD closes the item's descriptor.
func (it *Item) closeFD() {
	it.fdMu.Lock()
	it.fdClosed = true
	_ = syscall.Close(it.fd)
	it.fdMu.Unlock()
}

// events is what the item's socket is in epoll for, given its flags: what
// it sends and its peer's hang-up, unless its reads are held (HoldReads),
// or its output waits and it is a client's (a client's loop reads nothing
// more of it until it has taken what it was sent); and writability while
// its output waits (WantWrite). A level-triggered EPOLLIN that the handler
// would not read would wake the loop again and again.
func (it *Item) events(f uint32) uint32 {
	var ev uint32
	if f&flagOut != 0 {
		ev |= syscall.EPOLLOUT
	}
	if f&flagHold == 0 && (f&flagOut == 0 || !it.client) {
		ev |= syscall.EPOLLIN | syscall.EPOLLRDHUP
	}
	return ev
}

// epollSet adds the item to its loop's epoll (op EPOLL_CTL_ADD) or changes
// what it is there for (EPOLL_CTL_MOD), for its flags as last set, even if
// they change on another goroutine meanwhile.
func (it *Item) epollSet(op int) error {
	for {
		f := it.flags.Load()
		ev := syscall.EpollEvent{Events: it.events(f), Fd: int32(it.fd)}
		if err := syscall.EpollCtl(it.l.epfd, op, it.fd, &ev); err != nil {
			return err
		}
		if it.flags.Load() == f {
			return nil
		}
		op = syscall.EPOLL_CTL_MOD
	}
}

// setFlag sets or clears one of the item's flags and changes its
// registration to match (any goroutine). An item out of epoll meanwhile
// (its handler waits) gets it when it is put back.
func (it *Item) setFlag(flag uint32, on bool) {
	if it == nil {
		return
	}
	it.fdMu.Lock()
	f := it.flags.Load()
	nf := f &^ flag
	if on {
		nf |= flag
	}
	if nf != f {
		it.flags.Store(nf)
		if !it.fdClosed {
			ev := syscall.EpollEvent{Events: it.events(nf), Fd: int32(it.fd)}
			_ = syscall.EpollCtl(it.l.epfd, syscall.EPOLL_CTL_MOD, it.fd, &ev) // ENOENT: out of epoll now
		}
	}
	it.fdMu.Unlock()
}

// WantWrite says whether the item's handler has output waiting for the
// socket to take it (any goroutine): while it has, the loop runs the
// handler's LoopReady when the socket is writable (a client's: not for
// what it sends).
func (it *Item) WantWrite(on bool) { it.setFlag(flagOut, on) }

// WantsWrite reports whether the item's output waits (WantWrite).
func (it *Item) WantsWrite() bool { return it != nil && it.flags.Load()&flagOut != 0 }

// HoldReads says whether the loop should stop running the item's handler
// for what its socket sends (any goroutine): while it holds, the handler
// runs only when its output waits and the socket is writable, or for the
// socket's hang-up or error (which epoll always reports).
func (it *Item) HoldReads(on bool) { it.setFlag(flagHold, on) }

// HoldsReads reports whether the item's reads are held (HoldReads).
func (it *Item) HoldsReads() bool { return it != nil && it.flags.Load()&flagHold != 0 }

// itemWait is what an item's wait needs beyond its state (Item.wait), made
// at the item's first wait and owned by whoever runs its handler: ready
// (WakeUp) and withdraw, made once, and the timer of a timed wait (Sleep).
type itemWait struct {
	ready    func()
	withdraw func(error)
	// when is the deadline of a timed wait (Sleep) in its loop's clock
	// (loop.now), hidx its place in the loop's timer heap (-1: not in
	// it); both under the loop's tmu. timer is a runtime timer, used
	// instead once the engine is closed (the loop no longer runs).
	when  int64
	hidx  int
	timer *time.Timer
}

// waits returns the item's wait state, made on its first wait.
func (it *Item) waits() *itemWait {
	if it.aw == nil {
		it.aw = &itemWait{hidx: -1}
	}
	return it.aw
}

// Sleep is Suspend for a wait that ends after d (its timer, one of its
// loop's: loop.schedule), or before, when byEvent, at an event on its
// socket: the handler's LoopResume runs then, and tells which by the time.
// A Sleep before the last one's timer fired moves that timer; a timer left
// set (no SleepDone) wakes a later wait early, so each resume checks why it
// woke.
func (it *Item) Sleep(d time.Duration, byEvent bool) {
	ready := it.Suspend()
	it.byEvent = byEvent
	if byEvent && it.out {
		// Woken by data it does not read yet: the socket goes back in
		// epoll for the peer's hang-up only (level-triggered, EPOLLIN
		// would wake it at once again).
		ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP, Fd: int32(it.fd)}
		if syscall.EpollCtl(it.l.epfd, syscall.EPOLL_CTL_ADD, it.fd, &ev) == nil {
			it.out, it.hangupOnly = false, true
		}
	}
	it.l.schedule(it, d, ready)
}

// WakeAfter sets a timer for the wait the handler has just suspended
// (Suspend): if nothing delivers before, the wait is woken after d (the
// handler's LoopResume then finds nothing delivered, and tells by the
// time). One timer per item: it replaces a timer still set (Sleep's).
func (it *Item) WakeAfter(d time.Duration) {
	w := it.waits()
	if w.ready == nil {
		w.ready = it.WakeUp
	}
	it.l.schedule(it, d, w.ready)
}

// WithdrawFunc returns a function that wakes the item's wait early (its
// resume then finds why), for whoever ends a session.
func (it *Item) WithdrawFunc() func(error) {
	w := it.waits()
	if w.withdraw == nil {
		w.withdraw = func(error) { it.WakeUp() }
	}
	return w.withdraw
}

// SleepDone stops the timer of a sleep that is over (a late firing would
// wake a later wait needlessly).
func (it *Item) SleepDone() {
	if it.aw != nil {
		it.l.unschedule(it)
	}
}

// PeerGone reports whether the peer of the item's socket has left (on a
// resume after an event: the handler has not read it yet).
func (it *Item) PeerGone() bool { return PeerGone(uintptr(it.fd)) }

// Suspend is called by a handler running on its loop's goroutine before it
// starts a wait whose end another goroutine delivers: it returns the
// function that delivery calls (wakeUp; it must not block). The handler's
// LoopResume runs on the loop once the wait is over. A handler that called
// Suspend and then finds it need not wait after all calls unsuspend; one
// that waits returns true at once.
func (it *Item) Suspend() (ready func()) {
	w := it.waits()
	if w.ready == nil {
		w.ready = it.WakeUp
	}
	it.byEvent = false
	it.wait.Store(waitSuspending)
	return w.ready
}

// Unsuspend withdraws suspend when the handler does not wait after all
// (nothing will be delivered).
func (it *Item) Unsuspend() { it.wait.Store(waitNone) }

// Suspended reports whether the handler that just returned waits on the
// loop.
func (it *Item) Suspended() bool {
	w := it.wait.Load()
	return w == waitSuspending || w == waitReady
}

// WaitingOnLoop reports whether the item's handler waits on the loop (any
// goroutine).
func (it *Item) WaitingOnLoop() bool {
	return it != nil && (it.wait.Load() != waitNone || it.state.Load() == itemWaiting)
}

// OnLoop reports whether the caller is the handler the loop's goroutine is
// running for it (not handed over): only such a handler may suspend.
func (it *Item) OnLoop() bool { return it != nil && it.l.cur.Load() == it }

// WakeUp is the delivery of an item's wait (any goroutine, maybe under the
// deliverer's lock: it never blocks): the item is posted to its loop, or,
// if its handler has not returned yet, park posts it.
func (it *Item) WakeUp() {
	for {
		switch it.wait.Load() {
		case waitSuspending:
			if it.wait.CompareAndSwap(waitSuspending, waitReady) {
				return
			}
		case waitParked:
			if it.wait.CompareAndSwap(waitParked, waitNone) {
				it.l.post(it)
			}
			return
		default:
			return
		}
	}
}

// Yield is called by a handler about to block (from any goroutine: a yield
// by another than the loop's goroutine only costs a needless hand-over).
// If the loop is running it's handler, the loop goes on on a new goroutine
// without it, and the current one finishes the handler.
func (it *Item) Yield() {
	if it == nil {
		return
	}
	it.l.takeOver(it)
}

// Engine is the set of loops.
type Engine struct {
	loops []*loop
	next  atomic.Uint32 // round robin over loops
	// detaches counts sessions that left a loop for a goroutine after a
	// wait (LoopDetach), for tests.
	detaches atomic.Uint64
	// moves counts server connections moved to their client's loop at a
	// checkout (Item.MoveNear), for tests.
	moves atomic.Uint64
	// parks counts handlers that waited on their loop (loop.park), for
	// tests.
	parks atomic.Uint64
	// takeOvers counts loops handed to a new goroutine because a handler
	// was about to block (loop.takeOver), for tests.
	takeOvers atomic.Uint64
	// rescues counts the monitor's takeOvers (a handler that ran a whole
	// tick), for tests: on a loaded machine a loop's goroutine can be
	// kept off its CPU for that long.
	rescues atomic.Uint64

	mu     sync.Mutex
	closed bool
	stop   chan struct{}
	done   sync.WaitGroup // the monitor and every loop goroutine
}

// loop is one epoll instance and the goroutine running it.
type loop struct {
	e    *Engine
	idx  int32 // its place in engine.loops: its share of the pools
	epfd int
	file *os.File
	rc   syscall.RawConn

	// cur is the item whose handler the loop's goroutine is running (nil:
	// none; &taken: handed over, the handler's goroutine no longer runs the
	// loop). seq counts handlers, for the monitor.
	cur   atomic.Pointer[Item]
	taken Item
	seq   atomic.Uint64

	// mu guards items, indexed by the duplicate descriptor.
	mu      sync.Mutex
	items   []*Item
	count   int // sockets
	clients int // of which client sessions'

	// The mailbox: items whose wait is over (post), resumed by the loop's
	// goroutine in the order posted. efd is an eventfd in the loop's epoll
	// (the item mbox) that wakes the loop; mboxMu guards posts and
	// mboxClosed (the engine stopped: posts run on a goroutine each).
	efd        int
	mbox       Item
	mboxMu     sync.Mutex
	sleeping   bool // the loop may wait in epoll: a post must wake it
	posts      []*Item
	spare      []*Item // an emptied array for the next posts
	mboxClosed bool

	// The timers of timed waits (Sleep): a heap of the waiting items by
	// deadline, and a timerfd in the loop's epoll (the item tick) armed
	// for the earliest. A deadline is in the loop's own clock (now: the
	// runtime's monotonic time since start), so scheduling costs no
	// system call unless it is the new earliest. tmu guards the heap,
	// armed (the deadline the timerfd is set for, 0: none) and
	// timersClosed (the engine stopped: runtime timers instead).
	tfd          int
	tick         Item
	start        time.Time
	tmu          sync.Mutex
	timers       timerHeap
	armed        int64
	timersClosed bool
}

// New starts n loops; n <= 0 starts none (every connection then has its
// own reader goroutine). The error says why fewer than n could start; the
// engine then runs those that did (maybe none: Enabled is false).
func New(n int) (*Engine, error) {
	e := &Engine{stop: make(chan struct{})}
	var err error
	for i := range n {
		var l *loop
		if l, err = newLoop(e, int32(i)); err != nil {
			err = fmt.Errorf("event loop %d: %w", i, err)
			break
		}
		e.loops = append(e.loops, l)
	}
	if len(e.loops) > 0 {
		for _, l := range e.loops {
			e.done.Add(1)
			go l.run()
		}
		e.done.Add(1)
		go e.monitor()
	}
	return e, err
}

func newLoop(e *Engine, idx int32) (*loop, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	l := &loop{e: e, idx: idx, epfd: fd, file: os.NewFile(uintptr(fd), "poolerd-event-loop")}
	l.taken.l = l
	if l.rc, err = l.file.SyscallConn(); err != nil {
		_ = l.file.Close()
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = l.file.Close()
		return nil, err
	}
	l.efd = efd
	l.mbox = Item{l: l, fd: efd}
	if !l.register(&l.mbox) {
		_ = syscall.Close(efd)
		_ = l.file.Close()
		return nil, errors.New("event loop: cannot watch its mailbox")
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		l.closeFDs()
		return nil, err
	}
	l.tfd, l.start = tfd, time.Now()
	l.tick = Item{l: l, fd: tfd}
	if !l.register(&l.tick) {
		_ = syscall.Close(tfd)
		l.closeFDs()
		return nil, errors.New("event loop: cannot watch its timer")
	}
	l.mu.Lock()
	l.count -= 2 // the mailbox and the timer are no sockets
	l.mu.Unlock()
	return l, nil
}

// closeFDs closes the mailbox's eventfd and the epoll instance of a loop
// that could not be made.
func (l *loop) closeFDs() {
	_ = syscall.Close(l.efd)
	_ = l.file.Close()
}

// post queues it, whose wait is over, for the loop to resume (WakeUp,
// park). After the engine stopped, it is resumed on a goroutine of its own.
func (l *loop) post(it *Item) {
	l.mboxMu.Lock()
	if l.mboxClosed {
		l.mboxMu.Unlock()
		go l.resumeOrphan(it)
		return
	}
	// A loop that is busy takes the posts before it waits again; only a
	// sleeping one is woken, once.
	wake := l.sleeping
	l.sleeping = false
	l.posts = append(l.posts, it)
	l.mboxMu.Unlock()
	if wake {
		var one = [8]byte{1}
		_, _ = unix.Write(l.efd, one[:])
	}
}

// takePosts empties the mailbox (the loop's goroutine).
func (l *loop) takePosts() []*Item {
	l.mboxMu.Lock()
	posts := l.posts
	l.posts, l.spare = l.spare, nil
	l.mboxMu.Unlock()
	return posts
}

// recyclePosts gives back the array of a mailbox the loop has handled (not
// one it was handed over in the middle of: the new goroutine may be
// filling the array the mailbox had then).
func (l *loop) recyclePosts(posts []*Item) {
	l.mboxMu.Lock()
	if l.spare == nil {
		l.spare = posts[:0]
	}
	l.mboxMu.Unlock()
}

// park marks waiting an item whose handler suspended (on the loop's
// goroutine, or on the one it was handed over to: out, takeOver took it out
// of epoll); if its wait is already over, it is posted. Its socket stays in
// epoll: a client that waits for its answer sends nothing meanwhile, and
// the loop takes it out only if an event for it comes.
func (l *loop) park(it *Item, out bool) {
	l.e.parks.Add(1)
	it.out = out
	it.state.Store(itemWaiting)
	if it.wait.CompareAndSwap(waitSuspending, waitParked) {
		return
	}
	it.wait.Store(waitNone) // waitReady: delivered meanwhile
	l.post(it)
}

// resumeOrphan resumes a waiting item after its engine stopped: on this
// goroutine, and its connection then goes on on a goroutine of its own
// (LoopDetach) or ends.
func (l *loop) resumeOrphan(it *Item) {
	keep := it.h.LoopResume(it)
	if keep && it.Suspended() {
		// Waits again (the pools are closed: it will not be long).
		it.state.Store(itemWaiting)
		if !it.wait.CompareAndSwap(waitSuspending, waitParked) {
			it.wait.Store(waitNone)
			go l.resumeOrphan(it)
		}
		return
	}
	if keep {
		it.h.LoopDetach()
	}
	if it.state.Swap(itemOff) != itemOff {
		l.forget(it)
		it.closeFD()
	}
}

// Enabled reports whether there are loops.
func (e *Engine) Enabled() bool { return e != nil && len(e.loops) > 0 }

// Add puts the socket behind control (its connection's) in a loop, with h
// as its handler. place is given the item before the loop can run its
// handler, and nil if it could not be added after all. add returns false if
// it cannot add it (the caller then reads the connection on a goroutine of
// its own).
func (e *Engine) Add(control func(func(fd uintptr)) error, h Handler, client bool, place func(*Item)) bool {
	if !e.Enabled() {
		return false
	}
	dup := -1
	if err := control(func(fd uintptr) {
		if d, err := syscall.Dup(int(fd)); err == nil {
			syscall.CloseOnExec(d)
			dup = d
		}
	}); err != nil || dup < 0 {
		return false
	}
	l := e.loops[int(e.next.Add(1))%len(e.loops)]
	it := &Item{l: l, h: h, fd: dup, client: client}
	place(it)
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed || !l.register(it) {
		place(nil)
		_ = syscall.Close(dup)
		return false
	}
	return true
}

// register adds it to the loop's table and to epoll.
func (l *loop) register(it *Item) bool {
	l.mu.Lock()
	for it.fd >= len(l.items) {
		l.items = append(l.items, make([]*Item, max(64, len(l.items)))...)
	}
	l.items[it.fd] = it
	l.count++
	if it.client {
		l.clients++
	}
	l.mu.Unlock()
	it.state.Store(itemArmed)
	if err := it.epollSet(syscall.EPOLL_CTL_ADD); err != nil {
		it.state.Store(itemOff)
		l.forget(it)
		return false
	}
	return true
}

// forget drops it from the table.
func (l *loop) forget(it *Item) {
	l.mu.Lock()
	if it.fd < len(l.items) && l.items[it.fd] == it {
		l.items[it.fd] = nil
		l.count--
		if it.client {
			l.clients--
		}
	}
	l.mu.Unlock()
}

// remove takes it out of the loop for good and closes the duplicate
// descriptor (the connection itself is its owner's to close). inEpoll says
// whether it is still registered.
func (l *loop) remove(it *Item, inEpoll bool) {
	it.state.Store(itemOff)
	if it.aw != nil {
		l.unschedule(it)
	}
	if inEpoll {
		_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, it.fd, nil)
	}
	l.forget(it)
	it.closeFD()
}

// takeOver hands the loop to a new goroutine if its goroutine is running
// it's handler: it is taken out of epoll first, so the new goroutine does not
// see it; the handler's goroutine puts it back when the handler returns.
func (l *loop) takeOver(it *Item) bool {
	if !l.cur.CompareAndSwap(it, &l.taken) {
		return false
	}
	_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, it.fd, nil)
	l.e.takeOvers.Add(1)
	l.e.done.Add(1)
	go l.run()
	return true
}

// run is the loop's goroutine: it waits through the runtime poller for the
// epoll descriptor to become readable, then handles what is ready until
// nothing is.
func (l *loop) run() {
	defer l.e.done.Done()
	var evs [loopBatch]syscall.EpollEvent
	var ready [loopBatch]*Item
	n := 0
	wait := func(fd uintptr) bool {
		for {
			k, errno := epollPoll(int(fd), evs[:])
			if errno == syscall.EINTR {
				continue
			}
			n = max(k, 0)
			// Nothing ready: park in the runtime poller, which watches
			// the epoll descriptor (edge-triggered: it was drained).
			return n > 0 || errno != 0
		}
	}
	for {
		// Posts made while the loop was busy are taken before it waits.
		l.mboxMu.Lock()
		pending := len(l.posts) > 0
		l.sleeping = !pending
		l.mboxMu.Unlock()
		if pending {
			if !l.runPosts() {
				return
			}
			continue
		}
		if err := l.rc.Read(wait); err != nil {
			return // closed
		}
		l.mboxMu.Lock()
		l.sleeping = false
		l.mboxMu.Unlock()
		l.mu.Lock()
		for i := range n {
			fd := int(evs[i].Fd)
			ready[i] = nil
			if fd < len(l.items) {
				ready[i] = l.items[fd]
			}
		}
		l.mu.Unlock()
		for i := range n {
			it := ready[i]
			ready[i] = nil
			stay := true
			switch {
			case it == nil:
			case it == &l.mbox:
				var b [8]byte
				_, _ = unix.Read(l.efd, b[:])
				stay = l.runPosts()
			case it == &l.tick:
				var b [8]byte
				_, _ = unix.Read(l.tfd, b[:])
				l.fireTimers()
			case it.state.Load() == itemWaiting && !it.out:
				// Its handler waits: out of epoll until it is resumed
				// (level-triggered, the event would come back at once).
				_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, it.fd, nil)
				it.out, it.hangupOnly = true, false
				if it.byEvent {
					it.WakeUp() // its resume looks at the socket
				}
			case it.state.CompareAndSwap(itemArmed, itemHandling):
				stay = l.handle(it, false)
			}
			if !stay {
				// Handed over while a handler ran: this goroutine is no
				// longer the loop's, and the rest of this batch is the
				// new goroutine's to see again (epoll is
				// level-triggered).
				for j := i + 1; j < n; j++ {
					ready[j] = nil
				}
				return
			}
		}
	}
}

// runPosts resumes the items posted to the loop, in order. It returns false
// if the loop was handed over meanwhile: the rest is posted again, for the
// new goroutine.
func (l *loop) runPosts() bool {
	posts := l.takePosts()
	for k, p := range posts {
		posts[k] = nil
		if !p.state.CompareAndSwap(itemWaiting, itemHandling) {
			continue // ended meanwhile (the engine closing)
		}
		if !l.handle(p, true) {
			for _, q := range posts[k+1:] {
				l.post(q)
			}
			return false
		}
	}
	l.recyclePosts(posts)
	return true
}

// handle runs the handler of it (its LoopReady, or its LoopResume after a
// wait: resumed, the socket is then out of epoll), and puts the socket back
// in the loop, parks it or removes it. It returns false if the loop was
// handed over while the handler ran: the caller's goroutine is then no
// longer the loop's.
func (l *loop) handle(it *Item, resumed bool) bool {
	l.cur.Store(it)
	l.seq.Add(1)
	var keep bool
	if resumed {
		keep = it.h.LoopResume(it)
	} else {
		keep = it.h.LoopReady(it)
	}
	if l.cur.CompareAndSwap(it, nil) {
		switch {
		case !keep:
			l.remove(it, true)
		case it.Suspended():
			l.park(it, resumed && it.out)
		case resumed && it.out:
			it.out = false
			if !l.rearm(it) {
				l.detach(it)
			}
		case it.hangupOnly:
			// Back from a sleep that watched for the hang-up alone.
			it.hangupOnly = false
			if it.epollSet(syscall.EPOLL_CTL_MOD) != nil {
				l.detach(it)
				break
			}
			it.state.Store(itemArmed)
			if it.h.LoopStale() {
				l.e.Wake(it)
			}
		default:
			it.state.Store(itemArmed)
			if it.h.LoopStale() {
				l.e.Wake(it)
			}
		}
		return true
	}
	it.out, it.hangupOnly = false, false // takeOver took it out of epoll
	switch {
	case keep && it.Suspended():
		l.park(it, true)
	case keep && it.h.LoopDetach():
		l.remove(it, false) // after LoopDetach took it off its owner
		l.e.detaches.Add(1)
	case keep && l.rearm(it):
	default:
		l.remove(it, false)
	}
	return false
}

// detach lets a kept socket that cannot go back in the loop (the engine is
// closing) go on on a goroutine of its own, or removes it.
func (l *loop) detach(it *Item) {
	if it.h.LoopDetach() {
		l.e.detaches.Add(1)
	}
	l.remove(it, false)
}

// Share is the loop of the item the caller's handler runs for: its share
// of a pool (pool.Entry.SetShare), -1 for none (it is nil: not on a loop).
func (it *Item) Share() int32 {
	if it == nil {
		return -1
	}
	return it.l.idx
}

// MoveNear moves a socket no handler is running for to the loop of near,
// so that its handler runs there from now on. place is given its item there
// before the new loop can run its handler (not called if it did not move:
// already there, or being handled); the old item is left off for good, so
// that a batch of its old loop that still names it skips it. place gets nil
// if the socket could be put in neither loop (the engine is closing): it is
// then read by no one and its connection must be closed. moveNear reports
// whether place was called.
func (it *Item) MoveNear(near *Item, place func(*Item)) bool {
	from, to := it.l, near.l
	if from == to || !it.state.CompareAndSwap(itemArmed, itemHandling) {
		return false
	}
	_ = syscall.EpollCtl(from.epfd, syscall.EPOLL_CTL_DEL, it.fd, nil)
	from.forget(it)
	it.state.Store(itemOff)
	to.e.mu.Lock()
	closed := to.e.closed
	to.e.mu.Unlock()
	for _, l := range [2]*loop{to, from} {
		moved := &Item{l: l, h: it.h, fd: it.fd, client: it.client}
		moved.flags.Store(it.flags.Load())
		place(moved)
		if !closed && l.register(moved) {
			if l == to {
				to.e.moves.Add(1)
			}
			return true
		}
	}
	place(nil)
	it.closeFD()
	return true
}

// rearm puts back in epoll an item taken out for a handler that blocked.
func (l *loop) rearm(it *Item) bool {
	l.e.mu.Lock()
	closed := l.e.closed
	l.e.mu.Unlock()
	if closed {
		return false
	}
	if it.epollSet(syscall.EPOLL_CTL_ADD) != nil {
		return false
	}
	it.state.Store(itemArmed)
	if it.h.LoopStale() {
		l.e.Wake(it)
	}
	return true
}

// Wake ends the connection of an item that no handler is running: it is
// taken out of its loop and its handler's LoopEnd runs on a goroutine of its
// own. An item whose handler is running is ended by its loop when the
// handler returns (LoopStale).
func (e *Engine) Wake(it *Item) {
	if it == nil || !it.state.CompareAndSwap(itemArmed, itemHandling) {
		return
	}
	l := it.l
	_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, it.fd, nil)
	go func() {
		it.h.LoopEnd()
		l.remove(it, false)
	}()
}

// monitor hands over a loop whose goroutine has run one handler for a whole
// tick: a handler that blocks without saying so (Yield) holds up the other
// sockets of its loop for at most two ticks.
func (e *Engine) monitor() {
	defer e.done.Done()
	t := time.NewTicker(loopTick)
	defer t.Stop()
	last := make([]uint64, len(e.loops))
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		for i, l := range e.loops {
			seq := l.seq.Load()
			if it := l.cur.Load(); it != nil && it != &l.taken && seq == last[i] && l.takeOver(it) {
				e.rescues.Add(1)
			}
			last[i] = seq
		}
	}
}

// Close stops the loops (after the pools are closed: their connections have
// been shut down) and closes what they still hold.
func (e *Engine) Close() {
	if !e.Enabled() {
		return
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	close(e.stop)
	for _, l := range e.loops {
		_ = l.file.Close()
	}
	e.done.Wait()
	for _, l := range e.loops {
		// What waits on the loop still is resumed on goroutines.
		l.mboxMu.Lock()
		l.mboxClosed = true
		posts := l.posts
		l.posts = nil
		l.mboxMu.Unlock()
		for _, it := range posts {
			go l.resumeOrphan(it)
		}
		l.closeTimers()
	}
	for _, l := range e.loops {
		l.mu.Lock()
		items := l.items
		l.items, l.count, l.clients = nil, 0, 0
		l.mu.Unlock()
		for _, it := range items {
			if it != nil && it.state.Swap(itemOff) != itemOff {
				it.closeFD()
			}
		}
	}
}

// Counts is how many sockets the loops hold, and how many of them are
// client sessions'.
func (e *Engine) Counts() (sockets, clients int) {
	if e == nil {
		return 0, 0
	}
	for _, l := range e.loops {
		l.mu.Lock()
		sockets += l.count
		clients += l.clients
		l.mu.Unlock()
	}
	return sockets, clients
}

// CountIdle is how many client sockets the loops hold that no handler is
// running for and whose handler idle says is idle.
func (e *Engine) CountIdle(idle func(Handler) bool) int {
	if e == nil {
		return 0
	}
	n := 0
	for _, l := range e.loops {
		l.mu.Lock()
		for _, it := range l.items {
			if it != nil && it.client && it.state.Load() == itemArmed && idle(it.h) {
				n++
			}
		}
		l.mu.Unlock()
	}
	return n
}

// ClientCount is how many client sessions the loops hold.
func (e *Engine) ClientCount() int {
	_, n := e.Counts()
	return n
}

// ShutdownSocket shuts down both directions of the socket behind control,
// so that a loop reading it (through its own descriptor) sees its end.
func ShutdownSocket(control func(func(fd uintptr)) error) {
	_ = control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
}

// epollPoll asks epoll what is ready without waiting. It is a raw system
// call: with a zero timeout it never blocks, and the runtime's system call
// bookkeeping would let its monitor (sysmon) take the loop's P away whenever
// the call was slowed by the kernel, waking another thread to run it.
func epollPoll(epfd int, evs []syscall.EpollEvent) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
	return int(n), e
}

// Read reads once from the item's descriptor (the loop's duplicate): 0 and
// nil when nothing is there (the readiness was stale), io.EOF at the end of
// the stream.
func (it *Item) Read(p []byte) (int, error) {
	for {
		n, errno := wire.ReadFD(it.fd, p)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
			return 0, nil
		case errno != 0:
			return 0, errno
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// Stats returns the engine's counts so far.
func (e *Engine) Stats() Stats {
	return Stats{Parks: e.parks.Load(), Moves: e.moves.Load(), TakeOvers: e.takeOvers.Load(), Rescues: e.rescues.Load(), Detaches: e.detaches.Load()}
}

// Armed reports whether the item is in its loop with no handler running.
func (it *Item) Armed() bool { return it != nil && it.state.Load() == itemArmed }

// CanWatch says that PeerGone can tell a peer that left.
const CanWatch = true

// tcpEstablished is TCP_ESTABLISHED of the kernel's tcp_states.h.
const tcpEstablished = 1

// PeerGone reports, without reading, whether the peer of the socket fd has
// closed or reset the connection. A peek at the next byte tells end of
// stream and errors; behind unread data the TCP state tells whether the
// peer has closed since (CLOSE_WAIT).
func PeerGone(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return false // nothing to read: the peer is just quiet
	case err != nil:
		return true // reset, or any other failure of the connection
	case n == 0:
		return true // end of stream
	}
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && info.State != tcpEstablished
}

// now is the loop's clock: nanoseconds of the runtime's monotonic time
// since the loop started (no system call).
func (l *loop) now() int64 { return int64(time.Since(l.start)) }

// schedule sets the timer of it's timed wait to d from now: ready runs
// then, on the loop's goroutine (the timerfd's event). A wait scheduled
// again moves in the heap; the timerfd is set again only for a new
// earliest deadline. After the engine stopped, a runtime timer runs ready.
func (l *loop) schedule(it *Item, d time.Duration, ready func()) {
	w := it.waits()
	l.tmu.Lock()
	if l.timersClosed {
		l.tmu.Unlock()
		if w.timer == nil {
			w.timer = time.AfterFunc(d, ready)
		} else {
			w.timer.Reset(d)
		}
		return
	}
	now := l.now()
	w.when = now + max(int64(d), 1)
	if w.hidx >= 0 {
		heap.Fix(&l.timers, w.hidx)
	} else {
		heap.Push(&l.timers, it)
	}
	l.armLocked(now)
	l.tmu.Unlock()
}

// unschedule takes it's timer out of the heap (its wait is over, or its
// socket leaves the loop).
func (l *loop) unschedule(it *Item) {
	w := it.aw
	l.tmu.Lock()
	if w.hidx >= 0 {
		heap.Remove(&l.timers, w.hidx)
	}
	l.tmu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
	}
}

// armLocked sets the timerfd for the earliest deadline if it is not set
// for it already (a later setting is left: its firing finds nothing due
// and sets it again). l.tmu is held.
func (l *loop) armLocked(now int64) {
	if len(l.timers) == 0 {
		return
	}
	// The timerfd is set for the end of the timerSlack window the
	// earliest deadline falls in, so that the waits due within one window
	// fire together, in one wake-up of the loop (the runtime's own timers
	// have the same millisecond grain, from epoll_wait's timeout).
	first := (l.timers[0].aw.when + timerSlack - 1) / timerSlack * timerSlack
	if l.armed != 0 && l.armed <= first {
		return
	}
	l.armed = first
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(first-now, 1))}
	_ = unix.TimerfdSettime(l.tfd, 0, &spec, nil)
}

// fireTimers wakes every timed wait that is due (on the loop's goroutine,
// at the timerfd's event): their resumes run from the mailbox, after
// this batch. The timerfd is set again for what is left.
func (l *loop) fireTimers() {
	var due []*Item
	l.tmu.Lock()
	now := l.now()
	l.armed = 0
	for len(l.timers) > 0 && l.timers[0].aw.when <= now {
		due = append(due, heap.Pop(&l.timers).(*Item))
	}
	l.armLocked(now)
	l.tmu.Unlock()
	for _, it := range due {
		it.WakeUp()
	}
}

// closeTimers ends the loop's timers when the engine stops: every timed
// wait is woken (its resume runs on a goroutine, and a wait taken up
// again gets a runtime timer).
func (l *loop) closeTimers() {
	l.tmu.Lock()
	l.timersClosed = true
	due := make([]*Item, 0, len(l.timers))
	for len(l.timers) > 0 {
		due = append(due, heap.Pop(&l.timers).(*Item))
	}
	l.tmu.Unlock()
	for _, it := range due {
		it.WakeUp()
	}
}

// timerSlack is the grain of a loop's timers: a timed wait ends up to this
// much after its deadline, with the others due in the same window.
const timerSlack = int64(time.Millisecond)

// timerHeap is a loop's timed waits by deadline (container/heap).
type timerHeap []*Item

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].aw.when < h[j].aw.when }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].aw.hidx, h[j].aw.hidx = i, j
}
func (h *timerHeap) Push(x any) {
	it := x.(*Item)
	it.aw.hidx = len(*h)
	*h = append(*h, it)
}
func (h *timerHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	it.aw.hidx = -1
	*h = old[:len(old)-1]
	return it
}
