package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/takeover"
)

// openListeners binds every listen address, with SO_REUSEPORT when
// so_reuseport is set, and the Unix socket in unix_socket_dir, if set, at
// .s.PGSQL.<port> (the first address's port, as bound: a port of 0 gets
// one); or, with --takeover, takes the listening sockets over from the
// poolerd offering them on takeover_socket (docs/operations.md, "Restarts
// and upgrades that drop nobody"). The hand-over, when there is one, is
// finished with its Serving once this process accepts.
func openListeners(cfg *config.Config, take bool, log *zap.Logger) ([]net.Listener, *takeover.Handover, error) {
	if take {
		return takeListeners(cfg, log)
	}
	var lns []net.Listener
	fail := func(err error) ([]net.Listener, *takeover.Handover, error) {
		closeListeners(lns)
		return nil, nil, err
	}
	for _, addr := range cfg.ListenAddrs() {
		ln, err := takeover.Listen(context.Background(), addr, cfg.SOReusePort)
		if err != nil {
			return fail(fmt.Errorf("listen on %s (listen / POOLERD_LISTEN): %w", addr, err))
		}
		lns = append(lns, ln)
	}
	if cfg.UnixSocketDir != "" {
		path := cfg.UnixSocketPath(lns[0].Addr().(*net.TCPAddr).Port)
		ul, err := takeover.ListenUnix(path, cfg.UnixSocketPerm(), cfg.UnixSocketGroup)
		if err != nil {
			return fail(fmt.Errorf("unix_socket_dir (POOLERD_UNIX_SOCKET_DIR): %w", err))
		}
		lns = append(lns, ul)
	}
	return lns, nil, nil
}

// takeListeners takes the running poolerd's listening sockets: the new
// process serves what the old one had (its listen, its Unix socket); a
// configuration that asks for other ones is served as the old one's until
// the next restart without --takeover, and the log says so.
func takeListeners(cfg *config.Config, log *zap.Logger) ([]net.Listener, *takeover.Handover, error) {
	if cfg.TakeoverSocket == "" {
		return nil, nil, errors.New("--takeover needs takeover_socket (POOLERD_TAKEOVER_SOCKET): the Unix socket the running poolerd offers its listeners on")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lns, h, err := takeover.Take(ctx, cfg.TakeoverSocket)
	if err != nil {
		return nil, nil, err
	}
	var took []string
	for _, ln := range lns {
		took = append(took, ln.Addr().String())
	}
	log.Info("took the listening sockets over from the running poolerd", zap.Strings("addresses", took),
		zap.String("listen", cfg.Listen), zap.String("unix_socket_dir", cfg.UnixSocketDir), zap.String("takeover_socket", cfg.TakeoverSocket))
	if want := wantListeners(cfg); len(want) != len(took) {
		log.Warn("the configuration names other listeners than the running poolerd's; serving the ones taken over until a restart without --takeover",
			zap.Strings("configured", want), zap.Strings("taken", took))
	}
	return lns, h, nil
}

// wantListeners describes the configured listeners, for the hand-over's
// comparison.
func wantListeners(cfg *config.Config) []string {
	want := cfg.ListenAddrs()
	if cfg.UnixSocketDir != "" {
		want = append(want, "unix:"+cfg.UnixSocketDir)
	}
	return want
}

// closeListeners closes lns.
func closeListeners(lns []net.Listener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// handedOver closes lns once a new poolerd serves them: a Unix socket's
// file is the new process's now, and stays.
func handedOver(lns []net.Listener) {
	for _, ln := range lns {
		if ul, ok := ln.(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(false)
		}
		_ = ln.Close()
	}
}

// ownUnixSockets makes the Unix-socket listeners taken over remove their
// file when closed, once the old process has stopped (it no longer would).
func ownUnixSockets(lns []net.Listener) {
	for _, ln := range lns {
		if ul, ok := ln.(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(true)
		}
	}
}

// listenerAddrs lists lns' addresses, for the log.
func listenerAddrs(lns []net.Listener) string {
	var out []string
	for _, ln := range lns {
		out = append(out, ln.Addr().String())
	}
	return strings.Join(out, ", ")
}

// listenHTTP binds an HTTP endpoint. While a new poolerd starts beside the
// old one (so_reuseport, takeover_socket) both hold it for a while, so it
// gets SO_REUSEPORT then.
func listenHTTP(cfg *config.Config, addr string) (net.Listener, error) {
	return takeover.Listen(context.Background(), addr, cfg.SOReusePort || cfg.TakeoverSocket != "")
}

// offerListeners offers lns on takeover_socket, if set, for the next
// upgrade; the channel (nil without an offer) delivers the hand-over.
func offerListeners(cfg *config.Config, lns []net.Listener, log *zap.Logger) (<-chan *takeover.Passer, func()) {
	if cfg.TakeoverSocket == "" {
		return nil, func() {}
	}
	o, err := takeover.NewOffer(cfg.TakeoverSocket, lns, log)
	if err != nil {
		log.Warn("not offering the listening sockets for a hand-over", zap.Error(err))
		return nil, func() {}
	}
	return o.Taken(), func() { _ = o.Close() }
}
