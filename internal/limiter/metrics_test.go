package limiter

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		metrics := NewMetrics()
		reg.MustRegister(metrics)
		l := Instrument(NewMemory(MemoryOptions{}), metrics)
		ctx := context.Background()
		req := Request{Key: "k", Buckets: []Bucket{
			{Name: "queries", Limit: 100, Per: time.Second},
			{Name: "transactions", Limit: 2, Per: time.Second},
		}}

		for range 3 { // 2 allowed, 1 denied by transactions
			if _, err := l.Allow(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		// Waits 500ms then allowed: one decision, not one per attempt.
		if d, _, err := l.Wait(ctx, req, time.Second); err != nil || !d.Allowed {
			t.Fatalf("Wait: %+v, %v", d, err)
		}
		// Refused at once (needs 500ms).
		if d, _, err := l.Wait(ctx, req, 100*time.Millisecond); err != nil || d.Allowed {
			t.Fatalf("Wait: %+v, %v", d, err)
		}
		// Canceled after 100ms.
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		if _, _, err := l.Wait(cctx, req, time.Second); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: %v", err)
		}
		// Backend error.
		failing := Instrument(&scripted{err: errors.New("down")}, metrics)
		if _, err := failing.Allow(ctx, req); err == nil {
			t.Fatal("no error")
		}

		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		counters := map[string]float64{}
		type hist struct {
			count uint64
			sum   float64
		}
		got := map[string]hist{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				name := mf.GetName() + "{" + m.GetLabel()[0].GetName() + "=" + m.GetLabel()[0].GetValue() + "}"
				if h := m.GetHistogram(); h != nil {
					got[name] = hist{h.GetSampleCount(), h.GetSampleSum()}
				} else {
					counters[name] = m.GetCounter().GetValue()
				}
			}
		}
		wantCounters := map[string]float64{
			"poolerd_ratelimit_decisions_total{result=allowed}":   3,
			"poolerd_ratelimit_decisions_total{result=denied}":    2,
			"poolerd_ratelimit_decisions_total{result=canceled}":  1,
			"poolerd_ratelimit_decisions_total{result=error}":     1,
			"poolerd_ratelimit_denied_total{bucket=transactions}": 2,
		}
		if len(counters) != len(wantCounters) {
			t.Errorf("counters %v, want %v", counters, wantCounters)
		}
		for name, w := range wantCounters {
			if counters[name] != w {
				t.Errorf("%s = %v, want %v", name, counters[name], w)
			}
		}
		for result, w := range map[string]hist{"allowed": {1, 0.5}, "denied": {1, 0}, "canceled": {1, 0.1}, "error": {0, 0}} {
			name := "poolerd_ratelimit_wait_seconds{result=" + result + "}"
			if got[name] != w {
				t.Errorf("%s: got %+v, want %+v", name, got[name], w)
			}
		}
	})
}

func TestNilMetrics(t *testing.T) {
	l := Instrument(NewMemory(MemoryOptions{}), nil)
	if d, err := l.Allow(context.Background(), one("k", 1, time.Second, 1)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if d, _, err := l.Wait(context.Background(), one("k", 1, time.Second, 1), 0); err != nil || d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
}
