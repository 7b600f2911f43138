package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/takeover"
)

// openListener binds listen, with SO_REUSEPORT when so_reuseport is set,
// or, with --takeover, takes the listening socket over from the poolerd
// offering it on takeover_socket (docs/operations.md, "Restarts and
// upgrades that drop nobody"). The hand-over, when there is one, is
// finished with its Serving once this process accepts.
func openListener(cfg *config.Config, take bool, log *zap.Logger) (net.Listener, *takeover.Handover, error) {
	if !take {
		ln, err := takeover.Listen(context.Background(), cfg.Listen, cfg.SOReusePort)
		if err != nil {
			return nil, nil, fmt.Errorf("listen on %s (listen / POOLERD_LISTEN): %w", cfg.Listen, err)
		}
		return ln, nil, nil
	}
	if cfg.TakeoverSocket == "" {
		return nil, nil, errors.New("--takeover needs takeover_socket (POOLERD_TAKEOVER_SOCKET): the Unix socket the running poolerd offers its listener on")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ln, h, err := takeover.Take(ctx, cfg.TakeoverSocket)
	if err != nil {
		return nil, nil, err
	}
	log.Info("took the listening socket over from the running poolerd", zap.String("address", ln.Addr().String()),
		zap.String("listen", cfg.Listen), zap.String("takeover_socket", cfg.TakeoverSocket))
	return ln, h, nil
}

// listenHTTP binds an HTTP endpoint. While a new poolerd starts beside the
// old one (so_reuseport, takeover_socket) both hold it for a while, so it
// gets SO_REUSEPORT then.
func listenHTTP(cfg *config.Config, addr string) (net.Listener, error) {
	return takeover.Listen(context.Background(), addr, cfg.SOReusePort || cfg.TakeoverSocket != "")
}

// offerListener offers ln on takeover_socket, if set, for the next
// upgrade; the channel (nil without an offer) delivers the hand-over.
func offerListener(cfg *config.Config, ln net.Listener, log *zap.Logger) (<-chan *takeover.Passer, func()) {
	if cfg.TakeoverSocket == "" {
		return nil, func() {}
	}
	o, err := takeover.NewOffer(cfg.TakeoverSocket, ln, log)
	if err != nil {
		log.Warn("not offering the listening socket for a hand-over", zap.Error(err))
		return nil, func() {}
	}
	return o.Taken(), func() { _ = o.Close() }
}
