package health

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

type readyFunc func() (bool, string)

func (f readyFunc) Ready() (bool, string) { return f() }

func TestEndpoints(t *testing.T) {
	ready := false
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "poolerd_test_gauge", Help: "x"}, func() float64 { return 7 }))
	s := New(Options{Ready: readyFunc(func() (bool, string) { return ready, "starting" }), Gatherer: reg,
		Report: func() any { return map[string]int{"clients": 3} }, Log: zap.NewNop()})
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		s.http.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "starting") {
		t.Fatalf("/readyz not ready: %d %s", code, body)
	}
	ready = true
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz ready: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "poolerd_test_gauge 7") {
		t.Fatalf("/metrics %d %s", code, body)
	}
	if code, body := get("/stats"); code != 200 || !strings.Contains(body, `"clients": 3`) {
		t.Fatalf("/stats %d %s", code, body)
	}
	if code, _ := get("/debug/pprof/"); code != 404 {
		t.Fatalf("pprof must not be served unless enabled: %d", code)
	}
	p := New(Options{Ready: readyFunc(func() (bool, string) { return true, "" }), Gatherer: reg, Pprof: true, Log: zap.NewNop()})
	rec := httptest.NewRecorder()
	p.http.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil))
	if rec.Code != 200 {
		t.Fatalf("pprof enabled: %d", rec.Code)
	}
}
