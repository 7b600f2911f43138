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
	if err := ctx.Err(); err != nil {
		return Decision{}, 0, err
	}
	clock, ok := l.(Clock)
	if !ok {
		clock = systemClock{}
	}
	var start time.Time
	var waited time.Duration
	for {
		d, err := l.Allow(ctx, req)
		if err != nil || d.Allowed {
			return d, waited, err
		}
		if start.IsZero() {
			// Only a denied request reads the clock, so that the common
			// case costs exactly one Allow.
			start = clock.Now()
		}
		sleep := d.RetryAfter
		if sleep <= 0 {
			sleep = minRetry
		}
		if waited+sleep > maxWait {
			return d, waited, nil
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < sleep {
			return d, waited, nil
		}
		err = clock.Sleep(ctx, sleep)
		waited = clock.Now().Sub(start)
		if err != nil {
			return d, waited, err
		}
	}
}
