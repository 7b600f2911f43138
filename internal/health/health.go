// Package health serves poolerd's HTTP endpoints: liveness (/healthz),
// readiness (/readyz), the health report (/stats), Prometheus metrics
// (/metrics) and, when enabled, /debug/pprof/; behind TLS and basic auth
// when given a Prometheus web configuration file. It computes nothing itself:
// readiness, the report and the metrics come from what it is given.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"
	"go.uber.org/zap"
)

// Readiness tells whether poolerd should receive traffic, and why not.
type Readiness interface {
	// Ready returns true when clients are accepted, or false and a reason.
	Ready() (bool, string)
}

// Options configure the HTTP server.
type Options struct {
	// Ready answers /readyz.
	Ready Readiness
	// Gatherer answers /metrics.
	Gatherer prometheus.Gatherer
	// Report answers /stats with a JSON document built from memory; it
	// must not block on the network.
	Report func() any
	// Pprof serves /debug/pprof/.
	Pprof bool
	// WebConfigFile is a Prometheus web configuration file (TLS, basic
	// auth) applied to every endpoint, as exporter-toolkit's web package
	// reads it: the file is read again for every request and every TLS
	// handshake. Empty serves plain HTTP without authentication.
	WebConfigFile string
	// ProbesOnly serves /healthz and /readyz and nothing else (for
	// http_probe_listen).
	ProbesOnly bool
	// Log receives server errors.
	Log *zap.Logger
}

// Server is the HTTP server.
type Server struct {
	http    *http.Server
	webFile string
	log     *zap.Logger
}

// New builds the HTTP server.
func New(o Options) *Server {
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := o.Ready.Ready(); !ok {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": reason})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	srv := &Server{http: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: zap.NewStdLog(log)},
		webFile: o.WebConfigFile, log: log}
	if o.ProbesOnly {
		return srv
	}
	if o.Report != nil {
		mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, o.Report())
		})
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(log)}))
	if o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return srv
}

// Serve serves on ln until Shutdown: with the web configuration file, as
// every Prometheus exporter does (exporter-toolkit's web.Serve: TLS when
// the file configures it, basic auth when it lists users).
func (s *Server) Serve(ln net.Listener) error {
	var err error
	if s.webFile == "" {
		err = s.http.Serve(ln)
	} else {
		file := s.webFile
		addrs := []string{ln.Addr().String()}
		err = web.Serve(ln, s.http, &web.FlagConfig{WebConfigFile: &file, WebListenAddresses: &addrs},
			slog.New(zapHandler{log: s.log.Named("http")}))
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops the server, waiting for requests in progress until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
