package proxy

import (
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
)

// TestTimeoutsShared: sessions with the same limits share one value (an
// idle client keeps no copy of its own), and other limits get their own.
func TestTimeoutsShared(t *testing.T) {
	srv := &Server{}
	a := config.PoolSettings{QueryTimeout: time.Second}
	b := config.PoolSettings{QueryTimeout: time.Second, PoolMode: config.PoolSession} // same limits
	c := config.PoolSettings{QueryTimeout: 2 * time.Second}
	if srv.timeoutsFor(a) != srv.timeoutsFor(b) {
		t.Error("the same limits gave two values")
	}
	if tc := srv.timeoutsFor(c); tc == srv.timeoutsFor(a) || tc.queryTimeout != int64(2*time.Second) {
		t.Errorf("other limits: %+v", *tc)
	}
	for i := range 2 * maxTimeoutSets { // reloads with ever new limits: bounded
		srv.timeoutsFor(config.PoolSettings{QueryTimeout: time.Duration(i+3) * time.Second})
	}
	if n := len(srv.timeoutsSet); n > maxTimeoutSets {
		t.Errorf("%d sets kept, limit %d", n, maxTimeoutSets)
	}
}
