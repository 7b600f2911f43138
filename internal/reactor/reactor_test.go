//go:build linux

package reactor

import (
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// testHandler records what its loop calls it for.
type testHandler struct {
	mu      sync.Mutex
	reads   []string
	resumes int
	ended   atomic.Bool
	// onReady, if set, runs in LoopReady after the read; its result is
	// LoopReady's.
	onReady  func(it *Item) bool
	onResume func(it *Item) bool
	resumed  chan struct{}
	readCh   chan string
}

func newTestHandler() *testHandler {
	return &testHandler{resumed: make(chan struct{}, 16), readCh: make(chan string, 16)}
}

func (h *testHandler) LoopReady(it *Item) bool {
	var b [64]byte
	n, err := it.Read(b[:])
	if err != nil {
		return false
	}
	if n == 0 {
		return true
	}
	h.mu.Lock()
	h.reads = append(h.reads, string(b[:n]))
	h.mu.Unlock()
	h.readCh <- string(b[:n])
	if h.onReady != nil {
		return h.onReady(it)
	}
	return true
}

func (h *testHandler) LoopResume(it *Item) bool {
	h.mu.Lock()
	h.resumes++
	h.mu.Unlock()
	keep := true
	if h.onResume != nil {
		keep = h.onResume(it)
	}
	h.resumed <- struct{}{}
	return keep
}

func (h *testHandler) LoopStale() bool  { return h.ended.Load() }
func (h *testHandler) LoopEnd()         { h.ended.Store(true) }
func (h *testHandler) LoopDetach() bool { return false }

// sleeper is a handler that sleeps for an hour at each read (byEvent: an
// event on its socket wakes it) and, resumed, keeps its socket or not.
func sleeper(byEvent, keep bool) *testHandler {
	h := newTestHandler()
	h.onReady = func(it *Item) bool {
		it.Sleep(time.Hour, byEvent)
		return true
	}
	h.onResume = func(it *Item) bool {
		it.SleepDone()
		return keep
	}
	return h
}

// pair is a connected socket pair: the loop gets one end, the test writes
// to the other.
func pair(t *testing.T) (loopSide, testSide int) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Close(fds[0])
		_ = syscall.Close(fds[1])
	})
	return fds[0], fds[1]
}

func control(fd int) func(func(uintptr)) error {
	return func(f func(uintptr)) error { f(uintptr(fd)); return nil }
}

func newEngine(t *testing.T, n int) *Engine {
	t.Helper()
	e, err := New(n)
	if err != nil || !e.Enabled() {
		t.Fatalf("New(%d): %v", n, err)
	}
	t.Cleanup(e.Close)
	return e
}

func add(t *testing.T, e *Engine, h Handler) (it *Item, peer int) {
	t.Helper()
	fd, peer := pair(t)
	if !e.Add(control(fd), h, true, func(i *Item) { it = i }) || it == nil {
		t.Fatal("Add refused the socket")
	}
	return it, peer
}

func send(t *testing.T, fd int, s string) {
	t.Helper()
	if _, err := syscall.Write(fd, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func recv[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// A readable socket runs its handler on the loop; a handler that says the
// connection ended takes the socket out, and the loop's counts follow.
func TestReadyAndRemove(t *testing.T) {
	e := newEngine(t, 1)
	h := newTestHandler()
	h.onReady = func(*Item) bool { return len(h.reads) < 2 }
	_, peer := add(t, e, h)
	if s, c := e.Counts(); s != 1 || c != 1 {
		t.Fatalf("Counts = %d, %d after one Add; want 1, 1", s, c)
	}
	send(t, peer, "one")
	if got := recv(t, h.readCh, "the first read"); got != "one" {
		t.Fatalf("read %q, want one", got)
	}
	send(t, peer, "two")
	recv(t, h.readCh, "the second read")
	waitFor(t, "the socket to leave the loop", func() bool { s, _ := e.Counts(); return s == 0 })
}

// A handler that suspends is resumed on its loop once another goroutine
// delivers (WakeUp), whether the delivery comes before or after the handler
// returned, and items posted together are resumed in the order posted.
func TestSuspendWakeUpInOrder(t *testing.T) {
	e := newEngine(t, 1)
	const n = 8
	var order []int
	var orderMu sync.Mutex
	items := make([]*Item, n)
	peers := make([]int, n)
	suspended := make(chan func(), n)
	for i := range n {
		h := newTestHandler()
		early := i%2 == 0
		h.onReady = func(it *Item) bool {
			ready := it.Suspend()
			if early {
				ready() // delivered before the handler returned
			} else {
				suspended <- ready
			}
			return true
		}
		h.onResume = func(it *Item) bool {
			if !it.OnLoop() {
				t.Error("LoopResume ran off the loop")
			}
			orderMu.Lock()
			order = append(order, i)
			orderMu.Unlock()
			return true
		}
		items[i], peers[i] = add(t, e, h)
		send(t, peers[i], "x")
		recv(t, h.readCh, "the read")
		if early {
			recv(t, h.resumed, "the early delivery's resume")
		}
	}
	var late []func()
	for range n / 2 {
		late = append(late, recv(t, suspended, "a suspended handler"))
	}
	waitFor(t, "the late waits to park", func() bool {
		for i := 1; i < n; i += 2 {
			if !items[i].WaitingOnLoop() {
				return false
			}
		}
		return true
	})
	orderMu.Lock()
	order = order[:0]
	orderMu.Unlock()
	for k := len(late) - 1; k >= 0; k-- { // deliver in reverse
		late[k]()
	}
	waitFor(t, "every late resume", func() bool { orderMu.Lock(); defer orderMu.Unlock(); return len(order) == n/2 })
	for k, i := range order {
		if want := 2*(n/2-1-k) + 1; i != want {
			t.Fatalf("resumed in order %v, want the order delivered", order)
		}
	}
	if st := e.Stats(); st.Parks < n/2 {
		t.Fatalf("Stats().Parks = %d, want at least %d", st.Parks, n/2)
	}
	for i := range n {
		if items[i].WaitingOnLoop() {
			t.Fatalf("item %d still waits after its resume", i)
		}
	}
}

// A timed wait (Sleep) is resumed by its timer, on the loop; one that asks
// for it is resumed early by an event on its socket.
func TestSleep(t *testing.T) {
	e := newEngine(t, 1)
	h := newTestHandler()
	var slept time.Time
	var woke atomic.Int64
	h.onReady = func(it *Item) bool {
		if len(h.reads) == 1 {
			slept = time.Now()
			it.Sleep(30*time.Millisecond, false)
		}
		return true
	}
	h.onResume = func(it *Item) bool {
		woke.Store(int64(time.Since(slept)))
		it.SleepDone()
		return true
	}
	_, peer := add(t, e, h)
	send(t, peer, "a")
	recv(t, h.readCh, "the read")
	recv(t, h.resumed, "the timer's resume")
	if d := time.Duration(woke.Load()); d < 30*time.Millisecond {
		t.Fatalf("resumed after %v, before the sleep's 30ms", d)
	}

	h2 := sleeper(true, true)
	it2, peer2 := add(t, e, h2)
	send(t, peer2, "b")
	recv(t, h2.readCh, "the read")
	waitFor(t, "the sleep to park", it2.WaitingOnLoop)
	send(t, peer2, "c") // an event on the socket ends the hour-long sleep
	recv(t, h2.resumed, "the event's resume")
}

// A handler about to block says so (Yield): the loop goes on on a new
// goroutine, and the other sockets are handled while it blocks; the
// blocked one goes back in the loop afterwards.
func TestYieldKeepsTheLoopGoing(t *testing.T) {
	e := newEngine(t, 1)
	release := make(chan struct{})
	slow := newTestHandler()
	slow.onReady = func(it *Item) bool {
		if len(slow.reads) == 1 {
			it.Yield()
			<-release
		}
		return true
	}
	fast := newTestHandler()
	_, sp := add(t, e, slow)
	_, fp := add(t, e, fast)
	send(t, sp, "block")
	recv(t, slow.readCh, "the slow read")
	send(t, fp, "go")
	recv(t, fast.readCh, "the other socket's read while one handler blocks")
	close(release)
	send(t, sp, "again")
	recv(t, slow.readCh, "the blocked socket's next read, back in the loop")
	if st := e.Stats(); st.TakeOvers == 0 {
		t.Fatal("Stats().TakeOvers = 0 after a Yield")
	}
}

// A handler that blocks without saying so is handed over by the monitor.
func TestMonitorTakesOver(t *testing.T) {
	e := newEngine(t, 1)
	release := make(chan struct{})
	defer close(release)
	slow := newTestHandler()
	slow.onReady = func(*Item) bool { <-release; return true }
	fast := newTestHandler()
	_, sp := add(t, e, slow)
	_, fp := add(t, e, fast)
	send(t, sp, "block")
	recv(t, slow.readCh, "the slow read")
	send(t, fp, "go")
	recv(t, fast.readCh, "the other socket's read after the monitor's hand-over")
}

// Wake ends an item no handler runs: its LoopEnd runs and the socket
// leaves the loop.
func TestWake(t *testing.T) {
	e := newEngine(t, 1)
	h := newTestHandler()
	it, _ := add(t, e, h)
	e.Wake(it)
	waitFor(t, "LoopEnd", h.ended.Load)
	waitFor(t, "the socket to leave the loop", func() bool { s, _ := e.Counts(); return s == 0 })
}

// MoveNear moves an idle socket to another item's loop, where its handler
// runs from then on.
func TestMoveNear(t *testing.T) {
	e := newEngine(t, 2)
	var a, b *Item
	ha, hb := newTestHandler(), newTestHandler()
	a, pa := add(t, e, ha)
	b, _ = add(t, e, hb)
	if a.Share() == b.Share() {
		t.Fatalf("both items on loop %d: round robin should spread them", a.Share())
	}
	var moved *Item
	if !a.MoveNear(b, func(it *Item) { moved = it }) || moved == nil {
		t.Fatal("MoveNear did not move an idle socket")
	}
	if moved.Share() != b.Share() || !moved.Armed() {
		t.Fatalf("moved to loop %d (armed %v), want loop %d", moved.Share(), moved.Armed(), b.Share())
	}
	if e.Stats().Moves != 1 {
		t.Fatalf("Stats().Moves = %d, want 1", e.Stats().Moves)
	}
	send(t, pa, "here")
	recv(t, ha.readCh, "the moved socket's read")
}

// Timed waits are the loop's own timers: they fire in deadline order
// whatever the order they were set in, and leave the loop's heap once
// done; a Sleep taken again moves its timer.
func TestTimersInOrder(t *testing.T) {
	e := newEngine(t, 1)
	delays := []time.Duration{50, 10, 40, 20, 30}
	var mu sync.Mutex
	var order []time.Duration
	done := make(chan struct{}, len(delays))
	for _, d := range delays {
		h := newTestHandler()
		h.onReady = func(it *Item) bool {
			it.Sleep(time.Hour, false) // moved by the next Sleep
			it.Sleep(d*time.Millisecond, false)
			return true
		}
		h.onResume = func(it *Item) bool {
			it.SleepDone()
			mu.Lock()
			order = append(order, d)
			mu.Unlock()
			done <- struct{}{}
			return true
		}
		_, peer := add(t, e, h)
		send(t, peer, "x")
		recv(t, h.readCh, "the read")
	}
	for range delays {
		recv(t, done, "a timer's resume")
	}
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			t.Fatalf("timers fired in the order %v (ms), not by deadline", order)
		}
	}
	l := e.loops[0]
	l.tmu.Lock()
	left := len(l.timers)
	l.tmu.Unlock()
	if left != 0 {
		t.Fatalf("%d timers left in the loop's heap after every wait ended", left)
	}
}

// A socket that leaves the loop takes its timer with it.
func TestRemoveDropsTimer(t *testing.T) {
	e := newEngine(t, 1)
	h := newTestHandler()
	var it *Item
	h.onReady = func(i *Item) bool {
		if len(h.reads) == 1 {
			i.Sleep(time.Hour, true)
			return true
		}
		return false
	}
	h.onResume = func(*Item) bool { return false } // ends at the event
	it, peer := add(t, e, h)
	send(t, peer, "x")
	recv(t, h.readCh, "the read")
	waitFor(t, "the sleep to park", it.WaitingOnLoop)
	send(t, peer, "y")
	recv(t, h.resumed, "the event's resume")
	waitFor(t, "the socket to leave the loop", func() bool { s, _ := e.Counts(); return s == 0 })
	l := e.loops[0]
	l.tmu.Lock()
	left := len(l.timers)
	l.tmu.Unlock()
	if left != 0 {
		t.Fatal("a removed socket's timer is still in the loop's heap")
	}
}

// When the engine stops, a timed wait is woken at once (its resume runs on
// a goroutine), not left to a timer nobody runs.
func TestCloseWakesSleepers(t *testing.T) {
	e, err := New(1)
	if err != nil {
		t.Fatal(err)
	}
	h := sleeper(false, false)
	it, peer := add(t, e, h)
	send(t, peer, "x")
	recv(t, h.readCh, "the read")
	waitFor(t, "the sleep to park", it.WaitingOnLoop)
	e.Close()
	recv(t, h.resumed, "the sleeper's resume at Close")
}

// outputWaiter is a handler with output waiting (WantWrite): LoopReady
// counts the calls that find the item waiting to write, and takes the
// output as sent when send is set; otherwise it reads as testHandler does.
// A read of "wait" suspends it (ready is then its delivery).
type outputWaiter struct {
	*testHandler
	writable atomic.Int32
	send     atomic.Bool
	ready    chan func()
}

func (h *outputWaiter) LoopReady(it *Item) bool {
	if it.WantsWrite() {
		h.writable.Add(1)
		if h.send.Load() {
			it.WantWrite(false)
		}
		return true
	}
	var b [64]byte
	n, err := it.Read(b[:])
	if err != nil {
		return false
	}
	if string(b[:n]) == "wait" {
		h.ready <- it.Suspend()
	}
	if n > 0 {
		h.readCh <- string(b[:n])
	}
	return true
}

// TestWantWrite: an item whose output waits is run when its socket is
// writable and not for what its peer sends, which it reads once its
// output is sent; asked from another goroutine while the handler waits
// out of epoll, the wait for writability comes with its resume.
func TestWantWrite(t *testing.T) {
	e := newEngine(t, 1)
	h := &outputWaiter{testHandler: newTestHandler(), ready: make(chan func(), 1)}
	it, peer := add(t, e, h)
	h.send.Store(true)
	it.WantWrite(true)
	waitFor(t, "the writable socket's handler run", func() bool { return !it.WantsWrite() })
	send(t, peer, "after")
	if got := recv(t, h.readCh, "the read after the output"); got != "after" {
		t.Fatalf("read %q", got)
	}
	if n := h.writable.Load(); n != 1 {
		t.Fatalf("run %d times for writability, want 1", n)
	}

	// While its output waits, data from the peer does not run it.
	h.send.Store(false)
	it.WantWrite(true)
	send(t, peer, "held")
	waitFor(t, "runs for writability", func() bool { return h.writable.Load() > 10 })
	select {
	case got := <-h.readCh:
		t.Fatalf("read %q while the output waits", got)
	default:
	}
	h.send.Store(true)
	if got := recv(t, h.readCh, "the read once the output is sent"); got != "held" {
		t.Fatalf("read %q", got)
	}

	// Asked while the handler waits (out of epoll): it gets it when it
	// is put back.
	send(t, peer, "wait")
	recv(t, h.readCh, "the read that suspends")
	ready := recv(t, h.ready, "the suspension")
	send(t, peer, "x") // the event takes the waiting item out of epoll
	time.Sleep(20 * time.Millisecond)
	h.writable.Store(0)
	it.WantWrite(true)
	ready()
	recv(t, h.resumed, "the resume")
	if got := recv(t, h.readCh, "the read after"); got != "x" {
		t.Fatalf("read %q", got)
	}
	if n := h.writable.Load(); n != 1 {
		t.Fatalf("run %d times for writability after the resume, want 1", n)
	}
}

// TestHoldReads: while an item's reads are held what its peer sends does
// not run its handler, its peer's leaving does (epoll reports a hang-up
// whatever the registration), and once released it reads what came.
func TestHoldReads(t *testing.T) {
	e := newEngine(t, 1)
	h := newTestHandler()
	it, peer := add(t, e, h)
	it.HoldReads(true)
	if !it.HoldsReads() {
		t.Fatal("HoldReads(true) not recorded")
	}
	send(t, peer, "one")
	time.Sleep(20 * time.Millisecond)
	select {
	case got := <-h.readCh:
		t.Fatalf("read %q while held", got)
	default:
	}
	it.HoldReads(false)
	if got := recv(t, h.readCh, "the read once released"); got != "one" {
		t.Fatalf("read %q", got)
	}
	it.HoldReads(true)
	send(t, peer, "two")
	_ = syscall.Shutdown(peer, syscall.SHUT_RDWR) // pair's cleanup closes it
	if got := recv(t, h.readCh, "the read at the peer's leaving, held"); got != "two" {
		t.Fatalf("read %q", got)
	}
	waitFor(t, "the item's end after the hang-up", func() bool { return it.state.Load() == itemOff })
}
