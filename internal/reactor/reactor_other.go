//go:build !linux

package reactor

import "time"

// Elsewhere than on Linux there are no loops: New starts none, Add always
// refuses, and an Item is never on a loop (its methods do nothing).

// Engine is the set of loops: empty here.
type Engine struct{}

// Item is a socket in a loop: none here.
type Item struct{}

// CanWatch is false: PeerGone cannot tell a peer that left.
const CanWatch = false

// New starts no loops.
func New(int) (*Engine, error) { return &Engine{}, nil }

func (*Engine) Enabled() bool { return false }

func (*Engine) Add(func(func(fd uintptr)) error, Handler, bool, func(*Item)) bool { return false }

func (*Engine) Wake(*Item) {}

func (*Engine) Close() {}

func (*Engine) Counts() (sockets, clients int) { return 0, 0 }

func (*Engine) ClientCount() int { return 0 }

func (*Engine) CountIdle(func(Handler) bool) int { return 0 }

func (*Engine) Stats() Stats { return Stats{} }

func (*Item) OnLoop() bool { return false }

func (*Item) Suspend() func() { return func() {} }

func (*Item) Unsuspend() {}

func (*Item) Suspended() bool { return false }

func (*Item) Sleep(time.Duration, bool) {}

func (*Item) SleepDone() {}

func (*Item) WakeAfter(time.Duration) {}

func (*Item) PeerGone() bool { return false }

func (*Item) WithdrawFunc() func(error) { return func(error) {} }

func (*Item) WakeUp() {}

func (*Item) WaitingOnLoop() bool { return false }

func (*Item) Yield() {}

func (*Item) WantWrite(bool) {}

func (*Item) WantsWrite() bool { return false }

func (*Item) HoldReads(bool) {}

func (*Item) HoldsReads() bool { return false }

func (*Item) Share() int32 { return -1 }

func (*Item) Armed() bool { return false }

func (*Item) MoveNear(*Item, func(*Item)) bool { return false }

func (*Item) Read([]byte) (int, error) { return 0, nil }

// ShutdownSocket does nothing: no loop holds a duplicate here.
func ShutdownSocket(func(func(fd uintptr)) error) {}

// PeerGone cannot tell here.
func PeerGone(uintptr) bool { return false }
