package integration

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestHandOverClients: a poolerd handing its clients over (what
// --takeover's old process does) passes an idle client at once and one in a
// transaction after its COMMIT; both go on through the new poolerd with
// their session: pgx's cached prepared statements run there without being
// prepared again by the client, and the transaction's rows are committed.
// (The upgrade tests run the same through real processes and pgbench.)
func TestHandOverClients(t *testing.T) {
	t.Parallel()
	oldP := startPoolerd(t, nil)
	newP := startPoolerd(t, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	direct := appDirect(t)
	table := "handover_" + time.Now().Format("150405_000000000")
	if _, err := direct.Exec(ctx, "CREATE TABLE "+table+" (x int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = direct.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })

	idle := oldP.connect(t) // pgx's default: statements prepared and cached
	var n int
	if err := idle.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE x > $1", 0).Scan(&n); err != nil {
		t.Fatal(err)
	}
	busy := oldP.connect(t)
	tx, err := busy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}

	passed, done := handOver(ctx, oldP, newP)
	select {
	case <-passed:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle client was not handed over")
	}
	for i := range 3 {
		if err := idle.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE x > $1", 0).Scan(&n); err != nil {
			t.Fatalf("the idle client's query %d after the hand-over: %v", i, err)
		}
	}
	if k := newP.srv.ClientCount(); k != 1 {
		t.Fatalf("the new poolerd has %d clients, want the idle one", k)
	}
	select {
	case err := <-done:
		t.Fatalf("HandOver returned (%v) while a client is in a transaction", err)
	default:
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (2)"); err != nil {
		t.Fatalf("in the transaction during the hand-over: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("HandOver: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("HandOver did not return after the last transaction ended")
	}
	if err := busy.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 2 {
		t.Fatalf("after its COMMIT, through the new poolerd: %d rows, %v; want 2", n, err)
	}
	if k := newP.srv.ClientCount(); k != 2 {
		t.Fatalf("the new poolerd has %d clients, want 2", k)
	}
}

// TestHandOverAuthQueryUser: a client of a user known only through
// auth_query goes on through the new poolerd, whose pool for that user has
// never seen a login: the client's SCRAM ClientKey comes with it, so the new
// pool can log in to PostgreSQL as the user.
func TestHandOverAuthQueryUser(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	const userPW, authPW = "ho-user-pw", "ho-auth-pw"
	authQueryRoles(ctx, t, "ho_auth", authPW, userPW, "ho_user")
	withAuthQuery := func(c *config.Config) {
		c.AuthUser = "ho_auth"
		c.Users = []config.User{{Name: "ho_auth", Password: authPW}}
	}
	oldP := startPoolerd(t, withAuthQuery)
	newP := startPoolerd(t, withAuthQuery)
	c := connectDSN(t, oldP.dsn("ho_user", userPW, pgtest.DBApp)+"&default_query_exec_mode=simple_protocol")
	if got := scalarText(t, c, "SELECT current_user"); got != "ho_user" {
		t.Fatalf("current_user %q", got)
	}
	_, done := handOver(ctx, oldP, newP)
	if err := <-done; err != nil {
		t.Fatalf("HandOver: %v", err)
	}
	if got := scalarText(t, c, "SELECT current_user"); got != "ho_user" {
		t.Fatalf("through the new poolerd: current_user %q", got)
	}
}

// handOver runs oldP's HandOver to newP in-process (what --takeover does
// between two processes): passed gets a value per client passed, done
// HandOver's result.
func handOver(ctx context.Context, oldP, newP *instance) (passed <-chan int, done <-chan error) {
	p := make(chan int, 64)
	d := make(chan error, 1)
	go func() {
		d <- oldP.srv.HandOver(ctx, func(f *os.File, state []byte) error {
			fd, err := syscall.Dup(int(f.Fd())) // the caller closes f
			if err != nil {
				return err
			}
			newP.srv.AdoptClient(os.NewFile(uintptr(fd), "client"), state)
			p <- 1
			return nil
		})
	}()
	return p, d
}
