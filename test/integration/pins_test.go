package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// Pins that let go (issue 24): a client pinned by session state returns to
// transaction pooling once that state is gone; pins are capped and can be
// ended when idle.

// pinLeftSQL lists, on the connection it runs on, every kind of session
// state that pins a client, as "kind=count" pairs; "" when none is left.
const pinLeftSQL = `SELECT concat_ws(' ',
	nullif('cursor=' || (SELECT count(*) FROM pg_cursors WHERE is_holdable), 'cursor=0'),
	nullif('listen=' || (SELECT count(*) FROM pg_listening_channels()), 'listen=0'),
	nullif('advisory=' || (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()), 'advisory=0'),
	nullif('temp=' || (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()), 'temp=0'),
	nullif('prepare=' || (SELECT count(*) FROM pg_prepared_statements WHERE from_sql), 'prepare=0'),
	CASE WHEN current_user <> session_user THEN 'role=' || current_user END)`

// pinRole creates a role the app role may SET ROLE to, dropped when the
// test is over (after poolerd's shutdown).
func pinRole(t *testing.T) string {
	t.Helper()
	role := relayName("pin_role")
	ctx := ctxTimeout(t, 30*time.Second)
	if err := pg.Exec(ctx, "postgres", "CREATE ROLE "+role+" NOLOGIN; GRANT "+role+" TO "+pgtest.RoleApp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := pg.Exec(ctx, "postgres", "DROP ROLE IF EXISTS "+role); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	return role
}

// TestPinUndo pins a client with each kind of session state, undoes the
// state, and checks that the client is unpinned, that its server
// connection went back to the pool with nothing left on it (the pool has
// one connection, so the next client gets that one), and that undoing only
// part of the state keeps the pin.
func TestPinUndo(t *testing.T) {
	t.Parallel()
	role := pinRole(t)
	cases := []struct {
		reason      string
		pin, undo   []string
		partialUndo string // undoes part of the state: the client stays pinned
	}{
		{"cursor_with_hold",
			[]string{"DECLARE pin_c1 CURSOR WITH HOLD FOR SELECT 1", "DECLARE pin_c2 CURSOR WITH HOLD FOR SELECT 2"},
			[]string{"CLOSE pin_c2"}, "CLOSE pin_c1"},
		{"listen", []string{"LISTEN pin_a", "LISTEN pin_b"}, []string{"UNLISTEN *"}, "UNLISTEN pin_a"},
		{"advisory_lock", []string{"SELECT pg_advisory_lock(7240001)", "SELECT pg_advisory_lock(7240002)"},
			[]string{"SELECT pg_advisory_unlock(7240002)"}, "SELECT pg_advisory_unlock(7240001)"},
		{"temp_table", []string{"CREATE TEMP TABLE pin_t1 (x int)", "CREATE TEMP TABLE pin_t2 (x int)"},
			[]string{"DISCARD TEMP"}, "DROP TABLE pin_t1"},
		{"sql_prepare", []string{"PREPARE pin_p1 AS SELECT 1", "PREPARE pin_p2 AS SELECT 2"},
			[]string{"DEALLOCATE pin_p2"}, "DEALLOCATE pin_p1"},
		{"set_role", []string{"SET ROLE " + role}, []string{"RESET ROLE"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			p := tsStart(t, 1, nil)
			a := tsConn(t, p, "pin_a")
			for _, q := range tc.pin {
				tsExec(t, a, q)
			}
			tsWantPinned(t, p, tc.reason, 1)
			if tc.partialUndo != "" {
				tsExec(t, a, tc.partialUndo)
				time.Sleep(50 * time.Millisecond) // the check, if any, is answered
				tsWantPinned(t, p, tc.reason, 1)
				if got := tsMetric(t, p, "poolerd_unpins_total", tc.reason); got != 0 {
					t.Fatalf("unpinned after a partial undo (%s)", tc.partialUndo)
				}
			}
			for _, q := range tc.undo {
				tsExec(t, a, q)
			}
			tsWantPinned(t, p, tc.reason, 0)
			tsShowClients(t, p, a, "")
			if got := tsMetric(t, p, "poolerd_unpins_total", tc.reason); got != 1 {
				t.Fatalf("poolerd_unpins_total{reason=%q} = %v, want 1", tc.reason, got)
			}
			// The pool's one connection, now idle, serves another client,
			// which finds nothing of A's and is not pinned.
			b := tsConn(t, p, "pin_b")
			if left := scalarText(t, b, pinLeftSQL); left != "" {
				t.Fatalf("the next client finds %q on the connection", left)
			}
			tsShowClients(t, p, b, "")
			// A is back to transaction pooling and can pin again.
			for _, q := range tc.pin {
				tsExec(t, a, q)
			}
			tsWantPinned(t, p, tc.reason, 1)
			if ps := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); ps.Total != 1 {
				t.Fatalf("pool has %d connections, want 1", ps.Total)
			}
		})
	}
}

// TestPinUndoReasonChanges: a client with two kinds of state that undoes
// one stays pinned for the other, and is unpinned when that goes too.
func TestPinUndoReasonChanges(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, nil)
	a := tsConn(t, p, "pin_two")
	tsExec(t, a, "DECLARE pin_two CURSOR WITH HOLD FOR SELECT 1")
	tsExec(t, a, "LISTEN pin_two")
	tsWantPinned(t, p, "cursor_with_hold", 1)
	tsExec(t, a, "CLOSE pin_two")
	tsWantPinned(t, p, "listen", 1)
	tsShowClients(t, p, a, "listen")
	tsExec(t, a, "UNLISTEN pin_two")
	tsWantPinned(t, p, "", 0)
	tsShowClients(t, p, a, "")
}

// TestPinUndoThenPinAgainInOneQuery: a statement that undoes state and
// creates it again in the same request keeps the pin.
func TestPinUndoThenPinAgainInOneQuery(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, nil)
	a := tsConn(t, p, "pin_again")
	tsExec(t, a, "LISTEN pin_again")
	tsExec(t, a, "UNLISTEN pin_again; LISTEN pin_again2")
	time.Sleep(50 * time.Millisecond)
	tsWantPinned(t, p, "listen", 1)
	if left := scalarText(t, a, pinLeftSQL); left != "listen=1" {
		t.Fatalf("A has %q, want listen=1", left)
	}
}

// TestPinDjangoIterator replays what Django 3.2+ sends for QuerySet.iterator()
// with persistent connections (psycopg2 named cursors WITH HOLD, in
// autocommit, over the simple protocol): 8 clients on a pool of 4, 20
// iterations each. Each cursor is closed when its loop ends, so no client
// stays pinned and no client waits out checkout_timeout.
func TestPinDjangoIterator(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 120*time.Second)
	if err := pg.Exec(ctx, pgtest.DBApp, `CREATE TABLE IF NOT EXISTS pin_django (id int PRIMARY KEY, v text);
		INSERT INTO pin_django SELECT g, md5(g::text) FROM generate_series(1, 5000) g ON CONFLICT DO NOTHING;
		GRANT SELECT ON pin_django TO `+pgtest.RoleApp); err != nil {
		t.Fatal(err)
	}
	p := tsStart(t, 4, func(c *config.Config) { c.CheckoutTimeout = 5 * time.Second })
	const clients, iterations = 8, 20
	var timeouts, failures atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for i := range clients {
		c := connectDSN(t, p.appDSN("application_name=django", "default_query_exec_mode=simple_protocol"))
		wg.Go(func() {
			for it := range iterations {
				name := fmt.Sprintf("_django_curs_%d_sync_%d", i, it)
				err := func() error {
					if _, err := c.Exec(ctx, `DECLARE "`+name+`" NO SCROLL CURSOR WITH HOLD FOR SELECT id, v FROM pin_django ORDER BY id`); err != nil {
						return err
					}
					for {
						rows, err := c.Query(ctx, `FETCH FORWARD 2000 FROM "`+name+`"`)
						if err != nil {
							return err
						}
						n := 0
						for rows.Next() {
							n++
						}
						if err := rows.Err(); err != nil {
							return err
						}
						if n < 2000 {
							break
						}
					}
					_, err := c.Exec(ctx, `CLOSE "`+name+`"`)
					return err
				}()
				if err != nil {
					var pe *pgconn.PgError
					if errors.As(err, &pe) && pe.Code == "53300" {
						timeouts.Add(1)
					} else {
						failures.Add(1)
						firstErr.CompareAndSwap(nil, &err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Errorf("%d clients failed; the first: %v", failures.Load(), *e)
	}
	t.Logf("8 clients × 20 .iterator() loops on a pool of 4: %d checkout timeouts, %d unpins",
		timeouts.Load(), int(tsMetric(t, p, "poolerd_unpins_total", "cursor_with_hold")))
	if n := timeouts.Load(); n != 0 {
		t.Fatalf("%d clients got a checkout timeout", n)
	}
	tsWantPinned(t, p, "", 0)
}

// TestPinCap: with max_pinned_clients 1, a second client's statement that
// would pin is refused with 53400 naming the cap (its session goes on, and
// a refusal inside a transaction fails the transaction as the statement's
// own error would); once the first client's state is gone, it may pin.
func TestPinCap(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 3, func(c *config.Config) { c.MaxPinnedClients = "1" })
	a := tsConn(t, p, "pin_cap_a")
	b := tsConn(t, p, "pin_cap_b")
	tsExec(t, a, "LISTEN pin_cap")
	tsWantPinned(t, p, "listen", 1)

	pe := tsErr(t, b, "53400", "LISTEN pin_cap")
	for _, want := range []string{"max_pinned_clients 1", "LISTEN", "pinned already"} {
		if !strings.Contains(pe.Message, want) {
			t.Errorf("message %q lacks %q", pe.Message, want)
		}
	}
	if !strings.Contains(pe.Hint, "max_pinned_clients") || !strings.Contains(pe.Hint, "POOLERD_MAX_PINNED_CLIENTS") {
		t.Errorf("hint %q does not name the setting", pe.Hint)
	}
	if got := scalarText(t, b, "SELECT 'still here'"); got != "still here" {
		t.Fatalf("B after the refusal: %q", got)
	}
	ctx := ctxTimeout(t, 30*time.Second)
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE pin_cap_t (x int)"); err == nil {
		t.Fatal("CREATE TEMP TABLE over the cap succeeded")
	}
	var pe2 *pgconn.PgError
	if _, err := tx.Exec(ctx, "SELECT 1"); !errors.As(err, &pe2) || pe2.Code != "25P02" {
		t.Fatalf("after the refusal in a transaction: %v, want 25P02", err)
	}
	_ = tx.Rollback(ctx)
	tsShowClients(t, p, b, "")

	tsExec(t, a, "UNLISTEN pin_cap")
	tsWantPinned(t, p, "", 0)
	tsExec(t, b, "LISTEN pin_cap")
	tsWantPinned(t, p, "listen", 1)
}

// TestPinnedIdleTimeout: a pinned client idle outside a transaction for
// pinned_idle_timeout is ended with 57P05 naming the limit; its connection
// is cleaned (DISCARD ALL) and reused. An unpinned idle client is left
// alone.
func TestPinnedIdleTimeout(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 1, func(c *config.Config) { c.PinnedIdleTimeout = 300 * time.Millisecond })
	idle := tsConn(t, p, "pin_idle_plain")
	tsExec(t, idle, "SELECT 1")
	a := tsConn(t, p, "pin_idle")
	tsExec(t, a, "LISTEN pin_idle")
	tsWantPinned(t, p, "listen", 1)
	time.Sleep(time.Second)
	_, err := a.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57P05" || !strings.Contains(pe.Message, "pinned_idle_timeout") {
		t.Fatalf("A after idling pinned: %v, want 57P05 naming pinned_idle_timeout", err)
	}
	tsWantPinned(t, p, "", 0)
	if left := scalarText(t, idle, pinLeftSQL); left != "" {
		t.Fatalf("the next client finds %q on the connection", left)
	}
	if ps := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); ps.SessionTimeouts["pinned_idle"] != 1 {
		t.Fatalf("pinned_idle timeouts: %v", ps.SessionTimeouts)
	}
}

// TestPinAge: SHOW PINNED lists each pinned client with its reason and
// how long it has been pinned, and poolerd_pinned_client_age_seconds gives
// the longest pin per reason.
func TestPinAge(t *testing.T) {
	t.Parallel()
	p := tsStart(t, 2, nil)
	a := tsConn(t, p, "pin_age")
	tsExec(t, a, "LISTEN pin_age")
	tsWantPinned(t, p, "listen", 1)
	time.Sleep(300 * time.Millisecond)
	if age := tsMetric(t, p, "poolerd_pinned_client_age_seconds", "listen"); age < 0.25 || age > 60 {
		t.Fatalf("poolerd_pinned_client_age_seconds{reason=listen} = %v, want about 0.3", age)
	}
	if age := tsMetric(t, p, "poolerd_pinned_client_age_seconds", "temp_table"); age != 0 {
		t.Fatalf("age for a reason nobody is pinned for: %v", age)
	}
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	defer adm.Close(context.Background())
	tb := obShow(t, adm, "SHOW PINNED")
	i := tb.must(t, "SHOW PINNED", "port", tsPort(a))
	if tb.val(i, "reason") != "listen" || tb.val(i, "application_name") != "pin_age" {
		t.Fatalf("SHOW PINNED row: %v", tb)
	}
	var secs float64
	if _, err := fmt.Sscan(tb.val(i, "pinned_seconds"), &secs); err != nil || secs < 0.25 {
		t.Fatalf("pinned_seconds %q", tb.val(i, "pinned_seconds"))
	}
	tsExec(t, a, "UNLISTEN pin_age")
	tsWantPinned(t, p, "", 0)
	if tb := obShow(t, adm, "SHOW PINNED"); tb.find("port", tsPort(a)) >= 0 {
		t.Fatalf("SHOW PINNED still lists the unpinned client: %v", tb)
	}
}
