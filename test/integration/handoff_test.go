package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
)

// handoffLeftovers are session state a transaction-mode client can leave on
// its server connection without poolerd's scanner seeing it, each with the
// query by which the next client would notice it.
var handoffLeftovers = []struct {
	name, kind, leave, probe string
}{
	// A statement built inside a DO block: no scanner can read it.
	{"temp table", "temp_table", "DO $$BEGIN EXECUTE 'CREATE TEMP' || 'ORARY TABLE handoff_t (a int)'; END$$",
		"SELECT pg_catalog.count(*) FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()"},
	{"listen", "listen", "DO $$BEGIN EXECUTE 'LIS' || 'TEN handoff_ch'; END$$",
		"SELECT pg_catalog.count(*) FROM pg_catalog.pg_listening_channels()"},
	{"advisory lock", "advisory_lock", "DO $$BEGIN EXECUTE 'SELECT pg_advisory' || '_lock(4242)'; END$$",
		"SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()"},
}

// TestHandoffCheckClosesDirtyConnection: with verify_handoff always, a
// server connection a client left session state on that the scanner
// missed is closed before the next client gets it (a new backend, without
// that state), with a WARN naming the kind and the client, and counted in
// poolerd_handoff_dirty_total{kind}. With off, the next client gets the
// leftover (what the check is for).
//
// Both hand-offs: the client keeps its session and the connection goes back
// at the end of its transaction, or the client disconnects.
func TestHandoffCheckClosesDirtyConnection(t *testing.T) {
	for _, lo := range handoffLeftovers {
		for _, leaves := range []bool{false, true} {
			name := lo.name
			if leaves {
				name += " client leaves"
			}
			t.Run(name, func(t *testing.T) { handoffDirty(t, lo.kind, lo.leave, lo.probe, leaves) })
		}
	}
}

// handoffDirty runs one case of TestHandoffCheckClosesDirtyConnection.
func handoffDirty(t *testing.T, kind, leave, probe string, leaves bool) {
	t.Helper()
	p := obStart(t, obOpts{metrics: true, mutate: func(c *config.Config) {
		c.MaxSize = 1
		c.VerifyHandoff = config.VerifyHandoffAlways
	}})
	p.dirtyHandoffs = true
	ctx := ctxTimeout(t, 30*time.Second)
	a := connectDSN(t, p.appDSN("application_name=leaver"))
	var pidA int64
	if err := a.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()::int8").Scan(&pidA); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, leave); err != nil {
		t.Fatalf("%s: %v", leave, err)
	}
	if leaves {
		if err := a.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b := p.connect(t)
	var pidB, n int64
	if err := b.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()::int8, ("+probe+")").Scan(&pidB, &n); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if pidB == pidA || n != 0 {
		t.Errorf("client B got backend %d (A had %d) with %d of A's %s: want a new backend without it", pidB, pidA, n, kind)
	}
	eventually(t, 10*time.Second, "the hand-off WARN", func() bool {
		return strings.Contains(p.logs.String(), handoffDirtyLog)
	})
	var warn string
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(line, handoffDirtyLog) {
			warn = line
		}
	}
	for _, want := range []string{kind, `"left_by_application_name": "leaver"`, `"left_by_user": "app"`} {
		if !strings.Contains(warn, want) {
			t.Errorf("the WARN does not say %s: %s", want, warn)
		}
	}
	if got := handoffMetric(t, p, kind); got != 1 {
		t.Errorf("poolerd_handoff_dirty_total{kind=%q} = %v, want 1", kind, got)
	}
}

// TestHandoffOffHandsLeftovers shows what TestHandoffCheckClosesDirtyConnection
// guards against: with verify_handoff off the next client gets the same
// backend with the leftover on it.
func TestHandoffOffHandsLeftovers(t *testing.T) {
	for _, lo := range handoffLeftovers {
		t.Run(lo.name, func(t *testing.T) {
			p := startPoolerd(t, func(c *config.Config) {
				c.MaxSize = 1
				c.VerifyHandoff = config.VerifyHandoffOff
			})
			ctx := ctxTimeout(t, 30*time.Second)
			a := p.connect(t)
			var pidA int64
			if err := a.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()::int8").Scan(&pidA); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Exec(ctx, lo.leave); err != nil {
				t.Fatalf("%s: %v", lo.leave, err)
			}
			b := p.connect(t)
			var pidB, n int64
			if err := b.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()::int8, ("+lo.probe+")").Scan(&pidB, &n); err != nil {
				t.Fatalf("probe: %v", err)
			}
			if pidB != pidA || n == 0 {
				t.Errorf("client B got backend %d (A had %d) with %d of A's %s: want A's backend and its leftover (poolerd now sees %q: pick a leftover it misses)", pidB, pidA, n, lo.kind, lo.leave)
			}
		})
	}
}

// handoffMetric returns poolerd_handoff_dirty_total{kind}.
func handoffMetric(t *testing.T, p *obInst, kind string) float64 {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "poolerd_handoff_dirty_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no metric poolerd_handoff_dirty_total{kind=%q}", kind)
	return 0
}
