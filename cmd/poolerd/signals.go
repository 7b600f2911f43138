package main

import (
	"context"
	"errors"
	"os"
	"syscall"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/proxy"
)

// pauser is what SIGUSR1 and SIGUSR2 act on: the proxy's PAUSE and RESUME.
type pauser interface {
	Pause(ctx context.Context, database string) error
	Resume(database string) error
	// ShuttingDown reports a shutdown or drain in progress: SIGUSR2 is
	// then ignored, as PgBouncer does (there is nothing to resume to).
	ShuttingDown() bool
}

// pauseOnSignals turns SIGUSR1 into PAUSE and SIGUSR2 into RESUME of every
// pool, as PgBouncer does, until sigs is closed. A pause waits for busy
// server connections to be released; a SIGUSR2 during that wait ends it.
func pauseOnSignals(srv pauser, sigs <-chan os.Signal, log *zap.Logger) {
	// pending is the pause in progress, if any.
	type pausing struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var pending *pausing
	stopPausing := func() {
		if pending != nil {
			pending.cancel()
			<-pending.done
			pending = nil
		}
	}
	defer stopPausing()
	for sig := range sigs {
		switch sig {
		case syscall.SIGUSR1:
			log.Info("SIGUSR1 received: pausing every pool (PAUSE)")
			stopPausing()
			ctx, cancel := context.WithCancel(context.Background())
			pending = &pausing{cancel: cancel, done: make(chan struct{})}
			go func(ctx context.Context, done chan struct{}) {
				defer close(done)
				err := srv.Pause(ctx, "")
				switch {
				case err == nil:
				case errors.Is(err, proxy.ErrPaused):
					log.Info("SIGUSR1: already paused")
				case ctx.Err() != nil:
					// SIGUSR2 came first: Resume ends the pause.
				default:
					log.Warn("SIGUSR1: pause failed", zap.Error(err))
				}
			}(ctx, pending.done)
		case syscall.SIGUSR2:
			if srv.ShuttingDown() {
				log.Info("got SIGUSR2 while shutting down, ignoring")
				continue
			}
			log.Info("SIGUSR2 received: resuming (RESUME)")
			stopPausing()
			if err := srv.Resume(""); err != nil {
				log.Info("SIGUSR2: nothing to resume", zap.Error(err))
			}
		}
	}
}
