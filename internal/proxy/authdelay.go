package proxy

import (
	"net"
	"sync"
	"time"
)

// authDelays slows down password guessing: after a failed authentication,
// the next failure from the same client address is answered only after a
// delay that starts at auth_failure_delay and doubles with each failure in
// a row, up to auth_failure_delay_max. A successful login from the address,
// or authFailureMemory without a failure, starts it over. Only the guessing
// address waits (with the goroutine of its own login); other clients are
// not slowed.
type authDelays struct {
	mu    sync.Mutex
	fails map[string]authFail // by client IP
}

type authFail struct {
	count int
	last  time.Time
}

const (
	// authFailureMemory is how long failures from an address are
	// remembered: a guessing flood keeps its delay, a user who mistyped
	// once starts over after a while.
	authFailureMemory = 10 * time.Minute
	// maxAuthFailAddrs bounds the addresses remembered; when full, the
	// oldest half is forgotten (a flood from many addresses cannot grow
	// the map without bound).
	maxAuthFailAddrs = 100000
)

// failed records a failed authentication from addr and returns how long to
// wait before answering it, given the base delay and its ceiling.
func (d *authDelays) failed(addr net.Addr, now time.Time, base, ceiling time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	ip := addrIP(addr)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fails == nil {
		d.fails = map[string]authFail{}
	}
	f := d.fails[ip]
	if now.Sub(f.last) > authFailureMemory {
		f.count = 0
	}
	f.count++
	f.last = now
	if len(d.fails) >= maxAuthFailAddrs {
		d.forgetOldestLocked(now)
	}
	d.fails[ip] = f
	delay := base
	for i := 1; i < f.count && delay < ceiling; i++ {
		delay *= 2
	}
	return min(delay, max(ceiling, base))
}

// succeeded forgets the failures of addr.
func (d *authDelays) succeeded(addr net.Addr) {
	ip := addrIP(addr)
	d.mu.Lock()
	delete(d.fails, ip)
	d.mu.Unlock()
}

func (d *authDelays) forgetOldestLocked(now time.Time) {
	cutoff := now.Add(-authFailureMemory / 2)
	for ip, f := range d.fails {
		if f.last.Before(cutoff) || len(d.fails) >= maxAuthFailAddrs {
			delete(d.fails, ip)
		}
	}
}

func addrIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
