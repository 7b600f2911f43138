// Command poolerd is a PostgreSQL connection pooler: it speaks the v3 wire
// protocol to clients and hands their sessions to pools of server
// connections, one pool per database and user. This package only parses
// flags, loads the configuration, builds the logger, wires the proxy, the
// console, observability and the HTTP endpoints together and turns signals
// into reloads and shutdowns; none of the pooling happens here.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/console"
	"github.com/poolerd/poolerd/internal/health"
	"github.com/poolerd/poolerd/internal/observe"
	"github.com/poolerd/poolerd/internal/pgbini"
	"github.com/poolerd/poolerd/internal/pgblog"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/internal/takeover"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// defaultGCPercent is poolerd's GOGC unless the environment sets one. The
// relay allocates nothing per message, so collections come from logins
// and are cheap; at Go's default of 100 the heap may grow to twice what is
// live before one, which for tens of thousands of idle clients is most of
// poolerd's memory (docs/operations.md, "Memory").
const defaultGCPercent = 50

// tuneGC applies defaultGCPercent when GOGC is not set.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "convert" {
		return convert(args[1:], stdout, stderr)
	}
	loader, err := config.NewLoader(args, stderr)
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "poolerd:", err)
		return 2
	}
	if loader.Version {
		fmt.Fprintf(stdout, "poolerd %s (%s)\n", version, runtime.Version())
		return 0
	}
	// --config may name a pgbouncer.ini, recognised by its form.
	loader.Translate = pgbini.Translate
	cfg, err := loader.Load()
	if err != nil {
		fmt.Fprintln(stderr, "poolerd: invalid configuration:")
		fmt.Fprintln(stderr, indent(err.Error()))
		var ie *config.InvalidError
		if errors.As(err, &ie) && ie.LogFile != "" && !loader.CheckOnly {
			logRefusal(ie, stderr)
		}
		return 2
	}
	if loader.CheckOnly {
		fmt.Fprintln(stdout, "configuration is valid")
		return 0
	}
	tuneGC(os.Getenv)
	logOut := stderr
	var lf *logFile
	if cfg.LogFile != "" {
		// PgBouncer's logfile: the log goes to the file as well as to
		// stderr; SIGHUP opens it again (log rotation).
		if lf, err = openLogFile(cfg.LogFile); err != nil {
			fmt.Fprintln(stderr, "poolerd:", err)
			return 1
		}
		logOut = io.MultiWriter(stderr, lf)
	}
	log, level, closeLog, err := newLoggerTo(cfg, logOut, "", "")
	if err != nil {
		fmt.Fprintln(stderr, "poolerd:", err)
		return 2
	}
	defer closeLog()
	warnIni(loader.File, log)
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	if err := serve(cfg, loader, log, level, lf); err != nil {
		log.Error("poolerd stopped", zap.Error(err))
		return 1
	}
	return 0
}

func indent(s string) string {
	out := "  "
	for _, r := range s {
		out += string(r)
		if r == '\n' {
			out += "  "
		}
	}
	return out
}

func newLogger(cfg *config.Config, w io.Writer) (*zap.Logger, zap.AtomicLevel, error) {
	log, level, _, err := newLoggerTo(cfg, w, "", "")
	return log, level, err
}

// newLoggerTo is the logger writing to w, and with syslog on to the syslog
// daemon at network and addr as well (empty: the local one); closeLog
// flushes it and closes the syslog connection.
// logRefusal writes a configuration refused at start to the log file it
// names, in its log format, as PgBouncer writes it to its logfile: where
// an operator of a daemon looks. A file that cannot be opened is said on
// stderr.
func logRefusal(ie *config.InvalidError, stderr io.Writer) {
	lf, err := openLogFile(ie.LogFile)
	if err != nil {
		fmt.Fprintln(stderr, "poolerd:", err)
		return
	}
	defer lf.Close()
	cfg := config.Defaults()
	if ie.LogFormat != "" {
		cfg.LogFormat = ie.LogFormat
	}
	log, _, closeLog, err := newLoggerTo(&cfg, lf, "", "")
	if err != nil {
		cfg.LogFormat = config.Defaults().LogFormat // an unknown log_format is among the errors
		if log, _, closeLog, err = newLoggerTo(&cfg, lf, "", ""); err != nil {
			return
		}
	}
	defer closeLog()
	// The error in the message, unquoted, as PgBouncer's line has it.
	log.Error("invalid configuration: " + strings.Join(strings.Fields(ie.Err.Error()), " "))
}

func newLoggerTo(cfg *config.Config, w io.Writer, network, addr string) (log *zap.Logger, level zap.AtomicLevel, closeLog func(), err error) {
	level, err = zap.ParseAtomicLevel(cfg.LogLevel)
	if err != nil {
		return nil, level, nil, err
	}
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "ts"
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	enc := logEncoder(cfg.LogFormat, ec, true)
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), level)
	closeSyslog := func() {}
	if cfg.Syslog {
		// syslog stamps the time itself.
		sec := ec
		sec.TimeKey = ""
		sysEnc := logEncoder(cfg.LogFormat, sec, false)
		sc, err := newSyslogCore(network, addr, cfg.SyslogIdent, cfg.SyslogFacility, sysEnc, level)
		if err != nil {
			// As PgBouncer, which logs on without its syslog: no
			// daemon (a container without /dev/log) is no reason to
			// stop.
			log = zap.New(core)
			log.Warn("syslog is on but unavailable: logging without it", zap.Error(err))
			return log, level, func() { _ = log.Sync() }, nil
		}
		core = zapcore.NewTee(core, sc)
		closeSyslog = func() { _ = sc.w.Close() }
	}
	log = zap.New(core)
	return log, level, func() { _ = log.Sync(); closeSyslog() }, nil
}

// logEncoder is log_format's encoder; withTime is false for syslog, which
// stamps the time itself.
func logEncoder(format string, ec zapcore.EncoderConfig, withTime bool) zapcore.Encoder {
	switch format {
	case "json":
		return zapcore.NewJSONEncoder(ec)
	case "pgbouncer":
		return pgblog.New(os.Getpid(), withTime)
	default:
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		return zapcore.NewConsoleEncoder(ec)
	}
}

// serve runs poolerd until a signal or the admin console stops it.
func serve(cfg *config.Config, loader *config.Loader, log *zap.Logger, level zap.AtomicLevel, lf *logFile) error {
	if cfg.PIDFile != "" {
		removePID, err := writePIDFile(cfg.PIDFile, loader.Takeover)
		if err != nil {
			return err
		}
		defer removePID()
	}
	lns, handover, err := openListeners(cfg, loader.Takeover, log)
	if err != nil {
		return err
	}
	srv := proxy.New(cfg, log)
	srv.SetVersion(version)
	srv.SetReloader(loader.Load, func(l string) error {
		lvl, err := zapcore.ParseLevel(l)
		if err == nil {
			level.SetLevel(lvl)
		}
		return err
	})
	stats := observe.NewStats(srv, log)
	srv.SetConsole(console.New(srv, stats))
	statsCtx, stopStats := context.WithCancel(context.Background())
	defer stopStats()
	go stats.Run(statsCtx)

	// The relay's own instruments, then what observe reads at scrape time.
	reg := prometheus.NewRegistry()
	err = srv.Instrument(reg)
	if err == nil {
		err = observe.Register(reg, srv)
	}
	if err != nil {
		closeListeners(lns)
		return fmt.Errorf("metrics: %w", err)
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "poolerd_build_info",
			Help:        "poolerd's version; always 1.",
			ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
		}, func() float64 { return 1 }),
	)
	var hs []*health.Server
	for _, h := range []struct {
		addr, key string
		opts      health.Options
	}{
		{cfg.HTTPListen, "http_listen / POOLERD_HTTP_LISTEN", health.Options{Ready: srv, Gatherer: reg,
			Report: func() any { return observe.Report(srv) }, Pprof: cfg.HTTPPprof, WebConfigFile: cfg.HTTPWebConfigFile, Log: log}},
		{cfg.HTTPProbeListen, "http_probe_listen / POOLERD_HTTP_PROBE_LISTEN", health.Options{Ready: srv, ProbesOnly: true, Log: log}},
	} {
		if h.addr == "" {
			continue
		}
		hln, err := listenHTTP(cfg, h.addr)
		if err != nil && h.addr == cfg.HTTPListen && cfg.HTTPListenOptional() && errors.Is(err, syscall.EADDRINUSE) {
			log.Warn("http_listen is in use: serving without the HTTP endpoint (health, metrics); a pgbouncer.ini configuration takes it only when free: set http_listen (POOLERD_HTTP_LISTEN, --http-listen) to choose an address",
				zap.String("http_listen", h.addr))
			continue
		}
		if err != nil {
			closeListeners(lns)
			stopHTTP(hs)
			return fmt.Errorf("listen on %s (%s): %w", h.addr, h.key, err)
		}
		s := health.New(h.opts)
		hs = append(hs, s)
		go func() {
			if err := s.Serve(hln); err != nil {
				log.Error("HTTP server stopped", zap.String("address", h.addr), zap.Error(err))
			}
		}()
	}
	// The shutdown signals, as PgBouncer 1.23+: SIGTERM waits for the
	// clients to leave, SIGINT for the transactions to end, SIGQUIT
	// waits for nothing (docs/operations.md, "Graceful shutdown").
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
	// SIGUSR1 and SIGUSR2 are PAUSE and RESUME.
	usr := make(chan os.Signal, 2)
	signal.Notify(usr, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(usr)
	go pauseOnSignals(srv, usr, log)
	// SIGHUP reloads the configuration, like RELOAD on the console; a
	// broken file keeps the running configuration (and says why).
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	go func() {
		for range hups {
			if lf != nil {
				if err := lf.reopen(); err != nil {
					log.Error("log_file could not be opened again; writing to the old file", zap.Error(err))
				}
			}
			log.Info("SIGHUP received: reloading the configuration")
			_ = srv.Reload()
		}
	}()

	logSummary(cfg, listenerAddrs(lns), log)
	srv.Warm()
	if cfg.StartupMode == config.StartupFailFast {
		// Seed 004 Q2: refuse to start in a degraded state.
		warm := make(chan error, 1)
		go func() { warm <- srv.WaitWarm(context.Background(), 3) }()
		select {
		case err := <-warm:
			if err != nil {
				srv.Close()
				closeListeners(lns)
				return fmt.Errorf("startup_mode fail-fast: could not open the configured pools' connections: %w", err)
			}
			log.Info("configured pools are warm")
		case sig := <-sigs:
			log.Info("stopped during warm-up", zap.String("signal", sig.String()))
			srv.Close()
			closeListeners(lns)
			return nil
		}
	}

	serveErr := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { serveErr <- srv.Serve(ln) }()
	}
	if handover != nil {
		// Both processes accept from the socket until the old one has
		// stopped: no connection is refused or left in the queue.
		if err := handover.Serving(); err != nil {
			handover.Close()
			log.Warn("the old poolerd did not confirm the hand-over; serving anyway", zap.Error(err))
		} else {
			log.Info("hand-over done: the old poolerd no longer accepts clients")
			ownUnixSockets(lns)
			// Its clients follow, each at its next idle point.
			go func() {
				if err := handover.Clients(srv.AdoptClient); err != nil {
					log.Warn("taking the old poolerd's clients over stopped", zap.Error(err))
				}
			}()
		}
	}
	taken, stopOffer := offerListeners(cfg, lns, log)
	defer stopOffer()

	drain := false
	var passer *takeover.Passer // the hand-over of clients to a new poolerd
	select {
	case err := <-serveErr:
		srv.Close()
		return err
	case passer = <-taken:
		// A poolerd started with --takeover accepts on the socket now:
		// this one stops accepting, lets it know, and passes it its
		// clients, each at its next idle point (those it cannot pass
		// drain as on SIGTERM).
		handedOver(lns)
		passer.Stopped()
		log.Info("listening socket handed over to a new poolerd (--takeover): no new clients here; passing the connected ones over, exiting when none is left")
		drain = true
	case sig := <-sigs:
		switch sig {
		case syscall.SIGQUIT:
			// PgBouncer's immediate shutdown: every client gets 57P01 now
			// and open transactions roll back with their server
			// connections.
			log.Info("SIGQUIT: immediate shutdown; every client is ended now, open transactions roll back")
			closeNow(srv)
			stopHTTP(hs)
			log.Info("poolerd stopped")
			return nil
		case syscall.SIGTERM:
			// PgBouncer 1.23's "super safe shutdown", for rolling restarts.
			log.Info("SIGTERM: no new clients; exiting when the connected ones have left")
			drain = true
		default:
			// SIGINT, PgBouncer's safe shutdown.
			log.Info("shutting down: no new clients; transactions in progress may finish",
				zap.String("signal", sig.String()), zap.Duration("shutdown_timeout", srv.Config().ShutdownTimeout))
		}
	case mode := <-srv.ShutdownRequests():
		switch mode {
		case "":
			log.Warn("SHUTDOWN on the admin console: exiting at once")
			closeNow(srv)
			stopHTTP(hs)
			log.Info("poolerd stopped")
			return nil
		case "WAIT_FOR_CLIENTS":
			log.Info("SHUTDOWN WAIT_FOR_CLIENTS: no new clients; exiting when the connected ones have left")
			drain = true
		default:
			log.Info("SHUTDOWN WAIT_FOR_SERVERS: no new clients; transactions in progress may finish",
				zap.Duration("shutdown_timeout", srv.Config().ShutdownTimeout))
		}
	}
	// The offer holds a duplicate of the listening socket: closed now, so
	// that new connections are refused while this process drains, not
	// queued on a socket nobody accepts on.
	stopOffer()
	ctx, cancel := context.WithTimeout(context.Background(), srv.Config().ShutdownTimeout)
	if drain {
		// Clients leave when they want; only a signal cuts this short.
		cancel()
		ctx, cancel = context.WithCancel(context.Background())
	}
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if passer != nil {
			err := srv.HandOver(ctx, passer.Send)
			passer.Close()
			done <- err
			return
		}
		if drain {
			done <- srv.Drain(ctx)
			return
		}
		done <- srv.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		if err != nil {
			log.Warn("shutdown deadline passed; remaining connections were closed")
		}
	case sig := <-sigs:
		log.Warn("second signal: exiting at once", zap.String("signal", sig.String()))
		closeNow(srv)
	}
	stopHTTP(hs)
	log.Info("poolerd stopped")
	return nil
}

// closeWait bounds how long closeNow waits for the client connections to
// close: each session ends as soon as it is told to, and a connection ended
// with a final message closes once its client has closed it too, or after a
// second (the lingering close, internal/proxy).
const closeWait = 2 * time.Second

// closeNow ends every client at once and waits, at most closeWait, until
// their connections are closed: an exit closes the sockets still open, and
// a socket closed with input from the client unread is reset, which throws
// away the final message if the client has not taken it yet.
func closeNow(srv *proxy.Server) {
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	_ = srv.WaitClosed(ctx)
}

func stopHTTP(hs []*health.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range hs {
		_ = s.Shutdown(ctx)
	}
}

// logSummary logs the effective configuration, without secrets.
func logSummary(cfg *config.Config, listening string, log *zap.Logger) {
	fields := []zap.Field{
		zap.String("version", version),
		zap.String("listen", cfg.Listen),
		zap.String("listening_on", listening),
		zap.String("http_listen", cfg.HTTPListen),
		zap.String("http_probe_listen", cfg.HTTPProbeListen),
		zap.String("http_web_config_file", cfg.HTTPWebConfigFile),
		zap.String("pool_mode", cfg.PoolMode),
		zap.Int("max_size", cfg.MaxSize),
		zap.Int("min_size", cfg.MinSize),
		zap.Duration("checkout_timeout", cfg.CheckoutTimeout),
		zap.String("auth_type", cfg.AuthType),
		zap.Int("databases", len(cfg.Databases)),
		zap.Int("users", len(cfg.Users)),
	}
	if u := cfg.UpstreamInfo(); u != nil {
		fields = append(fields, zap.Stringer("upstream", u))
	}
	log.Info("poolerd starting", fields...)
}
