// Package fleet keeps a server connection budget shared by every poolerd
// instance that uses the same Redis: before an instance opens a server
// connection it takes a lease on each budget the connection counts against,
// renews its leases while the connections live, and gives them back when
// they close. An instance that dies stops renewing, and its leases expire
// within the lease TTL.
//
// # Model
//
// A budget is one Redis sorted set, Prefix + Budget.Key, whose members are
// the leases held against it, each scored by its expiry in milliseconds of
// the Redis server's clock. A lease is one member (a random instance id and
// a sequence number) in the sorted set of every budget of the connection
// (for example the global budget, its database's and its user's). Three Lua
// scripts do all the work, each atomic on Redis:
//
//   - acquire removes the expired members of every budget, counts the
//     others, and adds the lease to all of them if each has room, or to
//     none (naming the first budget that is full);
//   - renew pushes the expiry of an instance's leases forward; a lease that
//     has expired meanwhile (Redis was unreachable longer than the TTL, or
//     it restarted) is added again if its budgets still have room, and is
//     reported lost otherwise;
//   - release removes a lease from its budgets.
//
// Each sorted set also expires as a whole once its last lease would have,
// so Redis holds keys only for budgets in use. The limits are sent with
// every call: instances sharing a budget must be configured alike.
//
// It does not know pools, clients or configuration: the proxy decides which
// budgets a connection counts against and when to ask.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of Options.
const (
	// DefaultPrefix starts every Redis key of a budget.
	DefaultPrefix = "poolerd:fleet:"
	// DefaultTTL is how long a lease lives without being renewed: a
	// poolerd that dies frees its leases within it.
	DefaultTTL = 15 * time.Second
	// DefaultTimeout bounds each call to Redis.
	DefaultTimeout = 50 * time.Millisecond
	// MinTTL is the shortest TTL accepted; shorter ones are raised to it.
	MinTTL = time.Second
	// WantTTL is how long a refused Acquire's demand stays visible to
	// Wanted: a waiting instance asks again well within it.
	WantTTL = time.Second
)

// wantPrefix starts the demand key of a budget, after the Leaser's prefix:
// a Budget.Key must not start with it.
const wantPrefix = "want:"

// RenewInterval is how often leases with the given TTL are renewed: a third
// of the TTL, so that two renewals in a row can fail before a lease expires.
func RenewInterval(ttl time.Duration) time.Duration { return ttl / 3 }

// Budget is one limit on the number of leases held at once, fleet-wide.
type Budget struct {
	// Key names the budget; its Redis key is the Leaser's prefix + Key.
	// Instances share a budget by its Key.
	Key string
	// Limit is the most leases held at once; > 0.
	Limit int
}

// Lease is one server connection's place in its budgets.
type Lease struct {
	id      string
	budgets []Budget
	group   string // the budgets' keys, for batching renewals
}

// ID is the lease's member in the sorted sets of its budgets.
func (l *Lease) ID() string { return l.id }

// Budgets are the budgets the lease counts against (do not modify).
func (l *Lease) Budgets() []Budget { return l.budgets }

// Refusal says which budget had no room for a lease.
type Refusal struct {
	Budget Budget
	// Held is how many leases the budget held (counted after removing the
	// expired ones).
	Held int
}

// Options configures New.
type Options struct {
	// Client is the Redis client; it remains the caller's to close. A
	// *redis.Client created with ContextTimeoutEnabled and MaxRetries -1
	// is best: the timeout then reaches the socket and a script is never
	// run twice.
	Client redis.UniversalClient
	// Prefix starts every key; "" means DefaultPrefix.
	Prefix string
	// TTL is a lease's lifetime without renewal; 0 means DefaultTTL,
	// anything below MinTTL is raised to it.
	TTL time.Duration
	// Timeout bounds each call to Redis; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Stats are a Leaser's counters since it was created.
type Stats struct {
	// Held is the number of leases held now, per budget key.
	Held map[string]int
	// Acquired counts leases taken; Refused, acquisitions refused for a
	// full budget, per budget key (the one that was full); Renewed, lease
	// renewals that succeeded (one per lease per renewal); Lost, leases a
	// renewal found expired and could not take again; Released, leases
	// given back.
	Acquired uint64
	Refused  map[string]uint64
	Renewed  uint64
	Lost     uint64
	Released uint64
	// Errors counts failed Redis calls by operation: acquire, renew,
	// release.
	Errors map[string]uint64
}

// Leaser takes, renews and releases leases. It is safe for concurrent use.
type Leaser struct {
	prefix   string
	instance string
	seq      atomic.Uint64

	mu      sync.Mutex
	client  redis.UniversalClient
	ttl     time.Duration
	timeout time.Duration
	held    map[*Lease]struct{}
	stats   Stats
	// closed is set by ReleaseAll: Acquire takes no more leases.
	closed bool
	// inflight is read-locked by each Acquire and Release call under way
	// (taken before mu, never while holding it), which ReleaseAll waits
	// for (write lock): a lease an Acquire under way takes is given back
	// too, and a shutdown does not close the client under them.
	inflight sync.RWMutex
}

// ErrClosed is returned by Acquire after ReleaseAll.
var ErrClosed = errors.New("fleet: leaser closed (shutting down)")

// New returns a Leaser with a fresh random instance id.
func New(opts Options) *Leaser {
	var b [8]byte
	_, _ = rand.Read(b[:])
	l := &Leaser{
		prefix:   opts.Prefix,
		instance: hex.EncodeToString(b[:]),
		held:     map[*Lease]struct{}{},
		stats:    Stats{Refused: map[string]uint64{}, Errors: map[string]uint64{}},
	}
	if l.prefix == "" {
		l.prefix = DefaultPrefix
	}
	l.Configure(opts.Client, opts.TTL, opts.Timeout)
	return l
}

// Configure replaces the client, the TTL and the timeout; leases held stay
// held (a renewal with a new client takes them again on that Redis, if
// their budgets have room there). Zero values mean the defaults.
func (l *Leaser) Configure(client redis.UniversalClient, ttl, timeout time.Duration) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	ttl = max(ttl, MinTTL)
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	l.mu.Lock()
	l.client, l.ttl, l.timeout = client, ttl, timeout
	l.mu.Unlock()
}

// TTL is the lease lifetime in force.
func (l *Leaser) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

func (l *Leaser) settings() (redis.UniversalClient, time.Duration, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.client, l.ttl, l.timeout
}

// acquireScript: KEYS[1..n] are the budgets' sorted sets and KEYS[n+i]
// the demand key of KEYS[i]; ARGV[1] the TTL in ms, ARGV[2] the lease's
// member, ARGV[3] how long a demand key lives (ms), ARGV[3+i] the limit of
// KEYS[i]. The reply is {1} when the lease was added to every set, or
// {0, i, held} naming the first full budget; then nothing is added but
// that budget's demand key, set to the member, so that instances holding
// idle connections can make room (Wanted). Times are the Redis server's
// (Redis 5 and later replicate scripts by their effects, so reading TIME
// before writing is allowed).
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local n = #ARGV - 3
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  local held = redis.call('ZCARD', KEYS[i])
  if held >= tonumber(ARGV[3 + i]) and not redis.call('ZSCORE', KEYS[i], ARGV[2]) then
    redis.call('SET', KEYS[n + i], ARGV[2], 'PX', ARGV[3])
    return {0, i, held}
  end
end
for i = 1, n do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[2])
  if redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return {1}
`)

// renewScript: KEYS and ARGV[1] as acquireScript's, ARGV[1+i] the limit of
// KEYS[i], then the members of the leases to renew (all counting against
// exactly these budgets). A member present in every set gets a new expiry;
// one missing from a set is added back if every set it is missing from has
// room, and removed from all of them otherwise. The reply lists the
// 1-based positions (among the members) of the leases lost.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local nk = #KEYS
for i = 1, nk do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
end
local lost = {}
for m = 2 + nk, #ARGV do
  local member = ARGV[m]
  local ok = true
  for i = 1, nk do
    if not redis.call('ZSCORE', KEYS[i], member) and redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[1 + i]) then
      ok = false
      break
    end
  end
  for i = 1, nk do
    if ok then
      redis.call('ZADD', KEYS[i], now + ttl, member)
    else
      redis.call('ZREM', KEYS[i], member)
    end
  end
  if not ok then
    lost[#lost + 1] = m - 1 - nk
  end
end
for i = 1, nk do
  if redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return lost
`)

// releaseScript removes the member ARGV[1] from every set of KEYS.
var releaseScript = redis.NewScript(`
for i = 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[1])
end
return 1
`)

// ErrNoBudget is returned by Acquire when given no budget.
var ErrNoBudget = errors.New("fleet: no budget to lease from")

// Acquire takes a lease on every budget of budgets at once (their keys must
// differ and their limits be positive): it returns the lease, or the
// refusal of the first budget that was full (then nothing was taken), or
// an error when Redis failed or did not answer within the timeout (the
// lease may then have been taken on Redis; unrenewed, it expires within
// the TTL).
func (l *Leaser) Acquire(ctx context.Context, budgets []Budget) (*Lease, *Refusal, error) {
	if len(budgets) == 0 {
		return nil, nil, ErrNoBudget
	}
	for i, b := range budgets {
		if b.Key == "" || b.Limit <= 0 {
			return nil, nil, fmt.Errorf("fleet: budget %q: limit %d: a budget needs a key and a positive limit", b.Key, b.Limit)
		}
		for _, o := range budgets[:i] {
			if o.Key == b.Key {
				return nil, nil, fmt.Errorf("fleet: budget %q given twice", b.Key)
			}
		}
	}
	l.inflight.RLock()
	defer l.inflight.RUnlock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil, nil, ErrClosed
	}
	client, ttl, timeout := l.settings()
	lease := &Lease{
		id:      l.instance + ":" + fmt.Sprint(l.seq.Add(1)),
		budgets: append([]Budget(nil), budgets...),
	}
	keys := make([]string, 2*len(budgets))
	args := make([]any, 0, 3+len(budgets))
	args = append(args, ttl.Milliseconds(), lease.id, WantTTL.Milliseconds())
	names := make([]string, len(budgets))
	for i, b := range budgets {
		keys[i] = l.prefix + b.Key
		keys[len(budgets)+i] = l.prefix + wantPrefix + b.Key
		names[i] = b.Key
		args = append(args, b.Limit)
	}
	sort.Strings(names)
	lease.group = strings.Join(names, "\x00")
	res, err := call(ctx, timeout, "acquire", func(ctx context.Context) (any, error) {
		return acquireScript.Run(ctx, client, keys, args...).Result()
	})
	var vals []any
	if err == nil {
		var ok bool
		if vals, ok = res.([]any); !ok || len(vals) == 0 {
			err = fmt.Errorf("fleet: redis acquire: unexpected script reply %v", res)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.stats.Errors["acquire"]++
		return nil, nil, err
	}
	if ok, _ := vals[0].(int64); ok == 1 {
		l.held[lease] = struct{}{}
		l.stats.Acquired++
		return lease, nil, nil
	}
	i, _ := vals[1].(int64)
	n, _ := vals[2].(int64)
	if len(vals) != 3 || i < 1 || int(i) > len(budgets) {
		l.stats.Errors["acquire"]++
		return nil, nil, fmt.Errorf("fleet: redis acquire: unexpected script reply %v", res)
	}
	b := budgets[i-1]
	l.stats.Refused[b.Key]++
	return nil, &Refusal{Budget: b, Held: int(n)}, nil
}

// Release gives a lease back: it is no longer renewed, and is removed from
// its budgets on Redis. On error (Redis failed) it expires within the TTL.
// Releasing a lease twice, or nil, does nothing.
func (l *Leaser) Release(ctx context.Context, lease *Lease) error {
	if lease == nil {
		return nil
	}
	l.inflight.RLock()
	defer l.inflight.RUnlock()
	l.mu.Lock()
	if _, ok := l.held[lease]; !ok {
		l.mu.Unlock()
		return nil
	}
	delete(l.held, lease)
	l.stats.Released++
	client, timeout := l.client, l.timeout
	l.mu.Unlock()
	keys := make([]string, len(lease.budgets))
	for i, b := range lease.budgets {
		keys[i] = l.prefix + b.Key
	}
	_, err := call(ctx, timeout, "release", func(ctx context.Context) (any, error) {
		return releaseScript.Run(ctx, client, keys, lease.id).Result()
	})
	if err != nil {
		l.mu.Lock()
		l.stats.Errors["release"]++
		l.mu.Unlock()
	}
	return err
}

// Held reports whether lease is held (taken, neither released nor lost).
func (l *Leaser) Held(lease *Lease) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.held[lease]
	return ok
}

// Renew renews every lease held, in one script call per set of budgets.
// It returns the leases lost (expired, and their budgets full meanwhile:
// they are no longer held) and the first error; leases whose renewal
// failed stay held and are tried again at the next Renew.
func (l *Leaser) Renew(ctx context.Context) (lost []*Lease, err error) {
	client, ttl, timeout := l.settings()
	l.mu.Lock()
	groups := map[string][]*Lease{}
	for lease := range l.held {
		groups[lease.group] = append(groups[lease.group], lease)
	}
	l.mu.Unlock()
	for _, leases := range groups {
		budgets := leases[0].budgets
		keys := make([]string, len(budgets))
		args := make([]any, 0, 1+len(budgets)+len(leases))
		args = append(args, ttl.Milliseconds())
		for i, b := range budgets {
			keys[i] = l.prefix + b.Key
			args = append(args, b.Limit)
		}
		for _, lease := range leases {
			args = append(args, lease.id)
		}
		res, cerr := call(ctx, timeout, "renew", func(ctx context.Context) (any, error) {
			return renewScript.Run(ctx, client, keys, args...).Result()
		})
		vals, ok := res.([]any)
		if cerr == nil && !ok {
			cerr = fmt.Errorf("fleet: redis renew: unexpected script reply %v", res)
		}
		l.mu.Lock()
		if cerr != nil {
			l.stats.Errors["renew"]++
			l.mu.Unlock()
			if err == nil {
				err = cerr
			}
			continue
		}
		gone := 0
		for _, v := range vals {
			if i, ok := v.(int64); ok && i >= 1 && int(i) <= len(leases) {
				lease := leases[i-1]
				if _, held := l.held[lease]; held {
					delete(l.held, lease)
					l.stats.Lost++
					lost = append(lost, lease)
				}
				gone++
			}
		}
		l.stats.Renewed += uint64(len(leases) - gone)
		l.mu.Unlock()
	}
	return lost, err
}

// Run renews the leases every RenewInterval of the TTL until ctx ends,
// calling onLost with each lease lost and onError with each failure.
func (l *Leaser) Run(ctx context.Context, onLost func(*Lease), onError func(error)) {
	for {
		t := time.NewTimer(RenewInterval(l.TTL()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		lost, err := l.Renew(ctx)
		if err != nil && onError != nil && ctx.Err() == nil {
			onError(err)
		}
		for _, lease := range lost {
			if onLost != nil {
				onLost(lease)
			}
		}
	}
}

// ReleaseAll releases every lease held, for a clean shutdown: from its
// start Acquire takes no more leases, and the leases that the Acquire calls
// under way take are released too. It returns once no Acquire or Release
// call is under way, so that the caller may close the client.
func (l *Leaser) ReleaseAll(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.waitInflight()
	defer l.waitInflight()
	l.mu.Lock()
	leases := make([]*Lease, 0, len(l.held))
	for lease := range l.held {
		leases = append(leases, lease)
	}
	l.mu.Unlock()
	var first error
	for _, lease := range leases {
		if err := l.Release(ctx, lease); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Wanted returns which of the budgets keys another instance was refused a
// lease on within the last WantTTL: an instance holding idle connections
// under such a budget can close one to make room.
func (l *Leaser) Wanted(ctx context.Context, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	client, _, timeout := l.settings()
	rkeys := make([]string, len(keys))
	for i, k := range keys {
		rkeys[i] = l.prefix + wantPrefix + k
	}
	res, err := call(ctx, timeout, "wanted", func(ctx context.Context) (any, error) {
		return client.MGet(ctx, rkeys...).Result()
	})
	if err != nil {
		return nil, err
	}
	vals, _ := res.([]any)
	var out []string
	for i, v := range vals {
		if s, ok := v.(string); ok && i < len(keys) && !strings.HasPrefix(s, l.instance+":") {
			out = append(out, keys[i])
		}
	}
	return out, nil
}

// waitInflight waits until no Acquire or Release call is under way.
func (l *Leaser) waitInflight() {
	l.inflight.Lock()
	l.inflight.Unlock() // an empty critical section: it only waits
}

// Stats returns a copy of the counters and the leases held per budget.
func (l *Leaser) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.Held = map[string]int{}
	for lease := range l.held {
		for _, b := range lease.budgets {
			s.Held[b.Key]++
		}
	}
	s.Refused = copyMap(l.stats.Refused)
	s.Errors = copyMap(l.stats.Errors)
	return s
}

func copyMap(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// call runs fn with a context bounded by timeout and wraps its error.
func call(parent context.Context, timeout time.Duration, op string, fn func(context.Context) (any, error)) (any, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	v, err := fn(ctx)
	if err == nil {
		return v, nil
	}
	var ne net.Error
	if parent.Err() == nil && (ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("fleet: redis %s: no answer within %v: %w: %w", op, timeout, context.DeadlineExceeded, err)
	}
	if parent.Err() == nil && ctx.Err() != nil {
		return nil, fmt.Errorf("fleet: redis %s: no answer within %v: %w", op, timeout, err)
	}
	return nil, fmt.Errorf("fleet: redis %s: %w", op, err)
}
