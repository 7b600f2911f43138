package limiter

import (
	"context"
	"time"
)

// minRetry is how long Wait sleeps after a denial without a RetryAfter,
// so that such a limiter cannot make it spin.
const minRetry = time.Millisecond

// Wait blocks until l allows req, ctx ends, or maxWait would be exceeded,
// and returns the last Decision and how long it waited.
//
// When l denies req, Wait sleeps for the Decision's RetryAfter (on l's
// Clock if l implements Clock, on a timer otherwise) and tries again: the
// capacity it waited for may have been taken by another client meanwhile.
// Before sleeping it checks that the time already waited plus RetryAfter
// fits in maxWait and before ctx's deadline; if not, it returns the
// denying Decision at once, with a nil error, instead of sleeping in vain.
// So a first RetryAfter longer than maxWait returns immediately, and a
// maxWait ≤ 0 makes Wait a single Allow.
//
// If ctx ends while waiting, Wait returns ctx.Err() with the last denying
// Decision; if ctx has already ended when Wait is called, it returns
// ctx.Err() without consulting l. An error from l is returned as is.
func Wait(ctx context.Context, l Limiter, req Request, maxWait time.Duration) (Decision, time.Duration, error) {
	reqs := [1]Request{req}
	var ds [1]Decision
	maxWaits := [1]time.Duration{maxWait}
	_, waited, err := WaitAll(ctx, l, reqs[:], ds[:], WaitOptions{MaxWait: maxWaits[:]})
	return ds[0], waited, err
}

// WaitOptions are the bounds of WaitAll.
type WaitOptions struct {
	// MaxWait[i] is how long request i may hold the whole up: WaitAll
	// sleeps only if the time already waited plus the next sleep fits in
	// the MaxWait of every request denying at that moment. 0, or no
	// element for i, means that a denial of request i ends the wait at
	// once.
	MaxWait []time.Duration
	// Watch, if not nil, is called once, before the first sleep, with
	// WaitAll's ctx; the sleeps and decisions after it use the context it
	// returns, and stop is called when WaitAll returns. It lets a caller
	// end a wait on an event of its own (its client leaving) and pay for
	// watching that event only when a wait happens.
	Watch func(ctx context.Context) (watched context.Context, stop func())
}

// maxWait returns request i's MaxWait.
func (o *WaitOptions) maxWait(i int) time.Duration {
	if i < len(o.MaxWait) {
		return o.MaxWait[i]
	}
	return 0
}

// WaitAll blocks until l allows all of reqs at once (AllowAll), ctx ends,
// or a maximum wait would be exceeded. It returns whether they were
// allowed (and debited, all of them) and how long it waited; ds (at least
// len(reqs) elements) holds each request's last Decision, as AllowAll
// leaves them.
//
// When some requests deny, WaitAll sleeps for the longest RetryAfter among
// them, the time after which all of them would have room, and tries
// again; nothing is debited while it waits. Before sleeping it checks that
// the time already waited plus that sleep fits in the MaxWait of every
// denying request (see WaitOptions) and before ctx's deadline; if not, it
// returns false at once, with a nil error. Context and limiter errors are
// as for Wait.
func WaitAll(ctx context.Context, l Limiter, reqs []Request, ds []Decision, opts WaitOptions) (bool, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	clock, ok := l.(Clock)
	if !ok {
		clock = systemClock{}
	}
	var start time.Time
	var waited time.Duration
	for {
		allowed, err := l.AllowAll(ctx, reqs, ds)
		if err != nil || allowed {
			return allowed, waited, err
		}
		if start.IsZero() {
			// Only a denied request reads the clock, so that the common
			// case costs exactly one decision.
			start = clock.Now()
		}
		sleep := time.Duration(0)
		for i := range reqs {
			if !ds[i].Allowed {
				sleep = max(sleep, ds[i].RetryAfter)
			}
		}
		if sleep <= 0 {
			sleep = minRetry
		}
		for i := range reqs {
			if !ds[i].Allowed && waited+sleep > opts.maxWait(i) {
				return false, waited, nil
			}
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < sleep {
			return false, waited, nil
		}
		if opts.Watch != nil {
			var stop func()
			ctx, stop = opts.Watch(ctx)
			defer stop()
			opts.Watch = nil
		}
		err = clock.Sleep(ctx, sleep)
		waited = clock.Now().Sub(start)
		if err != nil {
			return false, waited, err
		}
	}
}
