//go:build !linux

package proxy

import "time"

// The event loops need epoll (loops_linux.go): elsewhere every server
// connection has a reader goroutine of its own.

type engine struct{}

type loopItem struct{ aw *itemWait }

func (it *loopItem) waits() *itemWait {
	if it.aw == nil {
		it.aw = new(itemWait)
	}
	return it.aw
}

// A session is never on a loop here: nothing waits on one.

func (*loopItem) onLoop() bool { return false }

func (*loopItem) suspend() func() { return func() {} }

func (*loopItem) unsuspend() {}

func (*loopItem) sleep(time.Duration, bool) {}

func (*loopItem) peerGone() bool { return false }

func (*loopItem) sleepDone() {}

func (*loopItem) withdrawFunc() func(error) { return func(error) {} }

func (*loopItem) waitingOnLoop() bool { return false }

func (*loopItem) yield() {}

func (*loopItem) share() int32 { return -1 }

func (*loopItem) moveNear(*loopItem, func(*loopItem)) bool { return false }

func newEngine(*Server, int) *engine { return &engine{} }

func (*engine) enabled() bool { return false }

func (*engine) add(func(func(fd uintptr)) error, any, bool, func(*loopItem)) bool { return false }

func (*engine) close() {}

func (*engine) counts() (sockets, clients int) { return 0, 0 }

func (*engine) clientCount() int { return 0 }

func (*engine) idleClients() int { return 0 }

func readItem(*loopItem, []byte) (int, error) { return 0, nil }

func shutdownSocket(func(func(fd uintptr)) error) {}

func (*engine) wake(*loopItem) {}
