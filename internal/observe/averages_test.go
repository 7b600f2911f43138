package observe

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/proxy"
)

func TestAverages(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur proxy.Totals
		period    time.Duration
		want      Averages
	}{
		{name: "rates and means over 2s",
			prev: proxy.Totals{ServerAssignments: 10, Xacts: 10, Queries: 20, Received: 1000, Sent: 4000,
				XactTimeUs: 500, QueryTimeUs: 400, WaitTimeUs: 100, ClientParses: 2, ServerParses: 1, Binds: 4},
			cur: proxy.Totals{ServerAssignments: 30, Xacts: 30, Queries: 60, Received: 3000, Sent: 8000,
				XactTimeUs: 2500, QueryTimeUs: 2400, WaitTimeUs: 300, ClientParses: 12, ServerParses: 5, Binds: 24},
			period: 2 * time.Second,
			want: Averages{ServerAssignments: 10, Xacts: 10, Queries: 20, Received: 1000, Sent: 2000,
				XactTimeUs: 100, QueryTimeUs: 50, WaitTimeUs: 10, ClientParses: 5, ServerParses: 2, Binds: 10}},
		{name: "no traffic gives zeros, not a division by zero",
			prev:   proxy.Totals{Xacts: 5, XactTimeUs: 50},
			cur:    proxy.Totals{Xacts: 5, XactTimeUs: 50},
			period: time.Second},
		{name: "totals that went down (a pool removed) count as zero",
			prev:   proxy.Totals{Xacts: 50, Queries: 50, XactTimeUs: 500, Sent: 100},
			cur:    proxy.Totals{Xacts: 10, Queries: 60, XactTimeUs: 100, QueryTimeUs: 0, Sent: 10},
			period: time.Second,
			want:   Averages{Queries: 10}},
		{name: "zero period", cur: proxy.Totals{Xacts: 10}, period: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := averages(tc.prev, tc.cur, tc.period); got != tc.want {
				t.Errorf("averages = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestStatsRun: the first period ends one stats_period after Run starts;
// the averages are per database; the stats line sums the databases with
// exactly the documented fields (docs/observability.md, "The stats log
// line"), and is not logged without log_stats; a changed stats_period
// applies from the next tick.
func TestStatsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := config.Defaults()
		cfg.StatsPeriod = 10 * time.Second
		cfg.LogStats = true
		src := &fakeSource{cfg: &cfg, clients: 3, totals: map[string]proxy.Totals{}}
		core, logs := observer.New(zapcore.InfoLevel)
		s := NewStats(src, zap.New(core))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		synctest.Wait() // Run took its first totals (none)

		src.setTotals(map[string]proxy.Totals{
			"a": {ServerAssignments: 10, Xacts: 100, Queries: 200, Received: 1000, Sent: 2000, XactTimeUs: 1000, QueryTimeUs: 4000, WaitTimeUs: 50},
			"b": {ServerAssignments: 10, Xacts: 100, Queries: 200, Received: 1000, Sent: 2000, XactTimeUs: 3000, QueryTimeUs: 4000, WaitTimeUs: 150},
		})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := logs.Len(); n != 0 {
			t.Fatalf("%d log lines before the first period ended", n)
		}
		if a := s.DatabaseAverages(); len(a) != 0 {
			t.Fatalf("averages before the first period ended: %+v", a)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		want := Averages{ServerAssignments: 1, Xacts: 10, Queries: 20, Received: 100, Sent: 200, XactTimeUs: 10, QueryTimeUs: 20, WaitTimeUs: 5}
		if got := s.DatabaseAverages()["a"]; got != want {
			t.Errorf("averages of a = %+v, want %+v", got, want)
		}
		entries := logs.TakeAll()
		if len(entries) != 1 {
			t.Fatalf("%d stats lines after one period, want 1", len(entries))
		}
		e := entries[0]
		if e.Message != "stats" || e.Level != zapcore.InfoLevel {
			t.Errorf("logged %s %q, want info \"stats\"", e.Level, e.Message)
		}
		wantFields := []struct {
			key string
			v   int64
		}{{"xacts_per_s", 20}, {"queries_per_s", 40}, {"in_bytes_per_s", 200}, {"out_bytes_per_s", 400},
			{"xact_us", 20}, {"query_us", 20}, {"wait_us", 10}, {"clients", 3}}
		if len(e.Context) != len(wantFields) {
			t.Fatalf("stats line fields %v, want %v", e.Context, wantFields)
		}
		for i, f := range e.Context {
			if f.Key != wantFields[i].key || f.Integer != wantFields[i].v {
				t.Errorf("field %d = %s=%d, want %s=%d", i, f.Key, f.Integer, wantFields[i].key, wantFields[i].v)
			}
		}

		// Without log_stats, the averages go on and nothing is logged;
		// the new stats_period applies from the next tick.
		next := cfg
		next.LogStats = false
		next.StatsPeriod = 2 * time.Second
		src.setConfig(&next)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := s.DatabaseAverages()["a"]; got != (Averages{}) {
			t.Errorf("averages of a period without traffic = %+v, want zeros", got)
		}
		src.setTotals(map[string]proxy.Totals{"a": {Xacts: 120}})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := s.DatabaseAverages()["a"].Xacts; got != 10 {
			t.Errorf("xacts/s over the new 2s period = %d, want 10", got)
		}
		if _, ok := s.DatabaseAverages()["b"]; ok {
			t.Errorf("a database without pools still has averages")
		}
		if n := logs.Len(); n != 0 {
			t.Errorf("%d stats lines with log_stats off", n)
		}
		cancel()
		<-done
	})
}
