package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// A min_size PostgreSQL cannot give (issue 34 item 4): the role's
// CONNECTION LIMIT is 2 and the pool's min_size 4. The pool fills what it
// can, logs one WARN naming the limit, keeps serving with its floor lowered
// to 2 (healthy, no backoff, the effective value in the pool's stats), and
// once the limit is lifted climbs back to 4 and says so.
func TestMinSizeLoweredToWhatServerGives(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 60*time.Second)
	role := relayName("minsize_role")
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD '" + pgtest.Password + "' CONNECTION LIMIT 2",
		"GRANT CONNECT ON DATABASE " + pgtest.DBApp + " TO " + role,
	} {
		if err := pg.Exec(ctx, "postgres", q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pg.Exec(c, "postgres", "REVOKE CONNECT ON DATABASE "+pgtest.DBApp+" FROM "+role)
		_ = pg.Exec(c, "postgres", "DROP ROLE IF EXISTS "+role)
	})
	four := 4
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 6
		c.ReconnectBackoffBase = 100 * time.Millisecond
		c.ReconnectBackoffMax = time.Second // the lowered floor tries one more each second
		c.Users = []config.User{{Name: role, Password: pgtest.Password, Overrides: config.Overrides{MinSize: &four}}}
	})
	c := connectDSN(t, p.dsn(role, pgtest.Password, pgtest.DBApp))
	eventually(t, 10*time.Second, "the min_size lowered WARN", func() bool {
		return len(toLogEntries(t, p, "min_size lowered")) > 0
	})
	// PostgreSQL checks CONNECTION LIMIT against the backends it sees at
	// login, so two logins at once may both pass: the pool may get 3 of
	// the 2 on a loaded machine. The floor is what it got.
	w := toLogEntries(t, p, "min_size lowered")[0]
	if eff := w.str("effective_min_size"); w.Level != "WARN" || !strings.Contains(w.str("limit"), "role's CONNECTION LIMIT") ||
		eff != "2" && eff != "3" || w.str("min_size") != "4" {
		t.Errorf("min_size lowered: want WARN naming the role's CONNECTION LIMIT, effective 2 (or 3) of 4: %s", w.Raw)
	}
	time.Sleep(2500 * time.Millisecond) // retries, each refused again
	st := p.poolStats(t, pgtest.DBApp, role)
	if st.Total < 2 || st.Total > 3 || st.EffectiveMinSize != st.Total || st.Failures != 0 || st.State.String() != "healthy" {
		t.Errorf("pool at the role's limit: total %d, effective min_size %d, failures %d, state %s; want 2 (or 3), the same, 0, healthy",
			st.Total, st.EffectiveMinSize, st.Failures, st.State)
	}
	if n := len(toLogEntries(t, p, "min_size lowered")); n != 1 {
		t.Errorf("%d min_size lowered warnings for one floor, want 1 (the retries refused again say nothing new)", n)
	}
	var n int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil {
		t.Fatalf("the pool at its lowered floor does not serve: %v", err)
	}

	if err := pg.Exec(ctx, "postgres", "ALTER ROLE "+role+" CONNECTION LIMIT -1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the floor back at min_size", func() bool {
		st := p.poolStats(t, pgtest.DBApp, role)
		return st.EffectiveMinSize == 4 && st.Total >= 4
	})
	if len(toLogEntries(t, p, "min_size restored")) != 1 {
		t.Errorf("no single min_size restored line")
	}
}
