package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestPinPlaceBeforeConnection: a pinned client that leaves gives its place
// under max_pinned_clients back before its server connection. On a pool of
// one (max_pinned_clients 100%: one place), client B waits for the
// connection with a LISTEN while pinned client A leaves; B gets the
// connection the moment A's goes back to the pool, and must find the place
// free. The onReleased hook holds A's goroutine right after the check-in
// until B's LISTEN is answered, so the order is the one the fuzzer once hit
// by chance (53400 "too many pinned clients" for B).
func TestPinPlaceBeforeConnection(t *testing.T) {
	srv, _ := realPGServer(t, func(c *config.Config) {
		c.MaxSize = 1
		c.CheckoutTimeout = 20 * time.Second
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bFinished := make(chan struct{})
	released := make(chan struct{}, 1)
	srv.onReleased = func(*session) {
		select {
		case released <- struct{}{}:
		default:
		}
		select {
		case <-bFinished:
		case <-time.After(10 * time.Second):
		}
	}
	dsn := "postgres://app:" + pgtest.Password + "@" + serve(t, srv) + "/app?sslmode=disable"

	a, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "LISTEN pin_a").ReadAll(); err != nil {
		t.Fatal(err)
	}
	b, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	bErr := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "LISTEN pin_b").ReadAll()
		bErr <- err
		close(bFinished)
	}()
	time.Sleep(200 * time.Millisecond) // B is waiting for the connection
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(20 * time.Second):
		t.Fatal("the onReleased hook did not run: the test proves nothing")
	}
	select {
	case err := <-bErr:
		if err != nil {
			t.Fatalf("B's LISTEN after pinned A left: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("B's LISTEN got no answer")
	}
}
