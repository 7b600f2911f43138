package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
)

// Peering (PgBouncer's peer_id and [peers]): poolers sharing a port pass a
// cancel request on to the one that issued its key. Here the two peers
// listen on ports of their own, and the test sends each cancel request to
// the peer the client is not connected to, as so_reuseport would now and
// then.

// peered starts two poolerds with peer ids 1 and 2, then reloads each with
// the other in its peers (as the suite's test adds entries and reloads).
func peered(t *testing.T, mutate func(c *config.Config)) (a, b *instance) {
	t.Helper()
	start := func(id int) *instance {
		return startPoolerd(t, func(c *config.Config) {
			c.PeerID = id
			if mutate != nil {
				mutate(c)
			}
		})
	}
	a, b = start(1), start(2)
	for _, p := range []struct {
		self, other *instance
		selfID, id  int
	}{{a, b, 1, 2}, {b, a, 2, 1}} {
		withReloader(p.self)
		// Our own entry too: PgBouncer lets one [peers] section serve
		// every member of the group.
		p.self.cfg.Peers = []config.Peer{peerAt(t, p.selfID, p.self.addr, 0), peerAt(t, p.id, p.other.addr, 1)}
		if err := p.self.srv.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func peerAt(t *testing.T, id int, addr string, poolSize int) config.Peer {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(port)
	if err != nil || err2 != nil {
		t.Fatalf("address %s", addr)
	}
	return config.Peer{ID: id, Host: host, Port: n, PoolSize: poolSize}
}

// longQuery starts pg_sleep(30) on c and returns its result channel once
// the query runs.
func longQuery(t *testing.T, c *pgx.Conn) <-chan error {
	t.Helper()
	errc := make(chan error, 1)
	sql := "SELECT pg_sleep(30), '" + relayName("peer") + "'"
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		_, err := c.Exec(ctx, sql)
		errc <- err
	}()
	direct := relayDirect(t)
	eventually(t, 10*time.Second, "pg_sleep to run", func() bool {
		var n int
		err := direct.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", sql).Scan(&n)
		return err == nil && n == 1
	})
	return errc
}

func wantCancelled(t *testing.T, errc <-chan error) {
	t.Helper()
	select {
	case err := <-errc:
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57014" || !strings.Contains(pe.Message, "due to user request") {
			t.Fatalf("the query ended with %v, want 57014 canceling statement due to user request", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the query was not cancelled")
	}
}

func TestPeeringForwardsCancel(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{config.PoolTransaction, config.PoolSession} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			a, b := peered(t, func(c *config.Config) { c.PoolMode = mode })
			for i, p := range []struct{ at, other *instance }{{a, b}, {b, a}} {
				c := p.at.connect(t, txExecMode)
				pid := c.PgConn().PID()
				// The key names the peer that issued it, PgBouncer's way, with
				// its time to live set.
				if got := int(pid>>16&0xff) | int(pid>>8&0xff)<<8; got != i+1 {
					t.Fatalf("pid %#x carries peer %d, want %d", pid, got, i+1)
				}
				if key := c.PgConn().SecretKey(); key[3]&3 != 3 {
					t.Fatalf("key %x: time to live not set", key)
				}
				errc := longQuery(t, c)
				sendCancel(t, p.other.addr, pid, c.PgConn().SecretKey())
				wantCancelled(t, errc)
				// The session goes on.
				var n int
				if err := c.QueryRow(ctxTimeout(t, 10*time.Second), "SELECT 7").Scan(&n); err != nil || n != 7 {
					t.Fatalf("after the cancel: %d %v", n, err)
				}
			}
		})
	}
}

// A cancel request whose time to live is spent is dropped by the peer it
// reaches, not passed on; one for a peer poolerd does not know is looked
// up here (and so finds nothing).
func TestPeeringTTLExhausted(t *testing.T) {
	t.Parallel()
	a, b := peered(t, nil)
	c := a.connect(t, txExecMode)
	errc := longQuery(t, c)
	key := c.PgConn().SecretKey()
	spent := binary.BigEndian.AppendUint32(nil, binary.BigEndian.Uint32(key)&^3)
	sendCancel(t, b.addr, c.PgConn().PID(), spent)
	eventually(t, 5*time.Second, "b to log the dropped request", func() bool {
		return strings.Contains(b.logs.String(), "TTL was exhausted")
	})
	unknown := c.PgConn().PID()&^0x00ffff00 | 9<<16
	sendCancel(t, b.addr, unknown, key)
	select {
	case err := <-errc:
		t.Fatalf("the query ended: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	// The real one still works.
	sendCancel(t, b.addr, c.PgConn().PID(), key)
	wantCancelled(t, errc)
}
