// Package health serves poolerd's HTTP endpoints: liveness (/healthz),
// readiness (/readyz) and Prometheus metrics (/metrics).
package health

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Readiness tells whether poolerd should receive traffic, and why not.
type Readiness interface {
	// Ready returns true when clients are accepted, or false and a reason.
	Ready() (bool, string)
}

// Server is the HTTP server.
type Server struct {
	http *http.Server
	log  *zap.Logger
}

// New builds the HTTP server. Metrics come from gatherer.
func New(ready Readiness, gatherer prometheus.Gatherer, log *zap.Logger) *Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := ready.Ready(); !ok {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": reason})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(log)}))
	return &Server{
		http: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		log:  log,
	}
}

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(ln)
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
	_ = json.NewEncoder(w).Encode(v)
}
