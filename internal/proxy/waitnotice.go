package proxy

import (
	"fmt"
	"sync"
	"time"

	"github.com/poolerd/poolerd/internal/wire"
)

// waitNotice tells a client whose request has waited query_wait_notify for
// a server connection, once per wait, with a NOTICE (PgBouncer's key and
// message), for a checkout that waits on a goroutine (dbPool.checkout; one
// that waits on its loop is told from the loop, at its timer: checkedOut). The NOTICE goes out while nothing else is written to the
// client: stop returns only once a notice being written is out, before the
// checkout's result is used.
type waitNotice struct {
	timer *time.Timer
	mu    sync.Mutex
	done  bool // under mu: the wait is over; write nothing
}

// noticeQueued is the NOTICE of query_wait_notify.
func noticeQueued(waited time.Duration, d *dbPool) []byte {
	return (&wire.Error{Severity: "NOTICE", Code: "00000",
		Message: "No server connection available in postgres backend, client being queued",
		Detail:  fmt.Sprintf("this request has waited %s for a server connection of pool %s/%s", waited, d.key.database, d.key.user),
		Hint:    "the request runs when a connection frees up, or fails at checkout_timeout; the operator can raise max_size"}).AppendNotice(nil)
}

// waitNotice arms the notice of a checkout that starts waiting; nil when
// query_wait_notify is off.
func (s *session) waitNotice() *waitNotice {
	after := s.srv.cfg().QueryWaitNotify
	if after <= 0 {
		return nil
	}
	n := &waitNotice{}
	n.timer = time.AfterFunc(after, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.done || s.closed.Load() {
			return
		}
		s.writeClientThen(noticeQueued(after, s.dbp), nil)
	})
	return n
}

// stop ends the wait's notice: after it returns, the notice is out or
// will not be sent.
func (n *waitNotice) stop() {
	if n == nil {
		return
	}
	n.timer.Stop()
	n.mu.Lock()
	n.done = true
	n.mu.Unlock()
}
