//go:build !linux

package proxy

// parker is linux-only (it needs epoll): elsewhere idle clients keep their
// goroutine.
type parker struct{}

func newParker(*Server) *parker { return &parker{} }

func (*parker) park(*session) bool { return false }

func (*parker) start() error { return nil }

func (*parker) wake(*session) {}

func (*parker) close() {}

func (*parker) parkedCount() int { return 0 }
