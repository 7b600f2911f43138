package integration

import (
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
)

// A reload that leaves the rate-limit keys alone keeps the budgets: a client
// that used up its budget is still refused after SET log_level, and a change
// of the rules starts the budgets over.
func TestRateLimitBudgetSurvivesUnrelatedSet(t *testing.T) {
	p := startPoolerd(t, func(c *config.Config) {
		c.RateLimits = []config.RateLimitRule{rlQueries("slow", 2, time.Hour, "reject", 0)}
	})
	c := p.connect(t)
	ctx := ctxTimeout(t, 20*time.Second)
	refused := func() bool {
		_, err := c.Exec(ctx, "SELECT 1")
		_, ok := rlLimited(err)
		return ok
	}
	// GCRA: a limit of 2 per hour admits a burst of 2, then refuses.
	n := 0
	for !refused() {
		if n++; n > 10 {
			t.Fatal("the budget never ran out")
		}
	}
	if _, err := p.srv.Set("log_level", "info"); err != nil {
		t.Fatal(err)
	}
	if !refused() {
		t.Fatal("SET log_level gave the client a fresh budget")
	}
	if _, err := p.srv.Set("on_redis_error", "deny"); err != nil {
		t.Fatal(err)
	}
	if refused() {
		t.Fatal("a change of a rate-limit key did not start the budgets over")
	}
}
