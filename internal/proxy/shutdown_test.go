package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// TestConcurrentLoginsDuringShutdown ends many logins at once while each
// waits for a server connection to check its startup parameters: each gets
// its own FATAL 57P01, and (under -race) no two of them share an error
// value that one of them changes, as prepareLogin once did when it made the
// shared shutdown error FATAL in place.
func TestConcurrentLoginsDuringShutdown(t *testing.T) {
	fb := startFakeBackend(t, 16)
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = "postgres://app:app@" + fb.Addr() + "/app"
	cfg.AuthType = config.AuthTrust
	cfg.PoolMode = config.PoolSession
	cfg.MaxSize = 1
	cfg.CheckoutTimeout = time.Minute
	cfg.ClientLoginTimeout = time.Minute
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := New(&cfg, zap.NewNop())
	addr := serve(t, srv)

	// A session-mode client takes the pool's only server connection and
	// keeps it.
	holder := dialRaw(t, addr)
	holder.sendNow(rawStartup(wire.CodeProtocol30, "user", "app", "database", "app"))
	holder.expect('R')
	var err error
	for typ := byte(0); typ != 'Z'; {
		typ, _, err = holder.next()
		if err != nil {
			t.Fatal(err)
		}
	}
	holder.sendNow(wire.AppendQuery(nil, "SELECT 1"))
	for typ := byte(0); typ != 'Z'; {
		typ, _, err = holder.next()
		if err != nil {
			t.Fatal(err)
		}
	}

	// Each login brings a startup parameter value the pool has not seen,
	// so it must check out a connection to learn what the server makes of
	// it: they all wait.
	const logins = 24
	clients := make([]*rawClient, logins)
	for i := range clients {
		clients[i] = dialRaw(t, addr)
		clients[i].sendNow(rawStartup(wire.CodeProtocol30, "user", "app", "database", "app",
			"extra_float_digits", fmt.Sprint(i%4-1), "search_path", fmt.Sprintf("s%d", i)))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ps := srv.Pools(); len(ps) == 1 && ps[0].Waiting == logins {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logins not all waiting for a server: %+v", srv.Pools())
		}
		time.Sleep(5 * time.Millisecond)
	}

	srv.Close()
	for i, c := range clients {
		f := c.refusal() // alone: AuthenticationOk comes with the welcome
		if f['S'] != "FATAL" || f['C'] != "57P01" || f['H'] == "" {
			t.Errorf("login %d: got %v, want FATAL 57P01 with a hint", i, f)
		}
	}
}

// TestShutdownWithReusePort: with so_reuseport a new poolerd serves the
// port while this one shuts down (SIGINT), so no client this one accepted
// is refused for it: a login in progress completes, and a client that has
// just logged in gets its first request answered, then 57P01. Without
// so_reuseport both get 57P01 instead of an answer.
func TestShutdownWithReusePort(t *testing.T) {
	for _, reuse := range []bool{true, false} {
		t.Run(fmt.Sprintf("so_reuseport=%v", reuse), func(t *testing.T) {
			fb := startFakeBackend(t, 4)
			cfg := config.Defaults()
			cfg.Listen = "127.0.0.1:0"
			cfg.HTTPListen = ""
			cfg.Upstream = "postgres://app:app@" + fb.Addr() + "/app"
			cfg.AuthType = config.AuthTrust
			cfg.PoolMode = config.PoolTransaction
			cfg.SOReusePort = reuse
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			srv := New(&cfg, zap.NewNop())
			addr := serve(t, srv)
			toReady := func(c *rawClient) {
				t.Helper()
				for typ := byte(0); typ != 'Z'; {
					var err error
					if typ, _, err = c.next(); err != nil {
						t.Fatal(err)
					}
				}
			}
			fresh := dialRaw(t, addr)
			fresh.login()
			toReady(fresh)
			mid := dialRaw(t, addr) // accepted, startup not sent yet
			deadline := time.Now().Add(5 * time.Second)
			for srv.clientSessions() < 2 {
				if time.Now().After(deadline) {
					t.Fatal("second connection not accepted")
				}
				time.Sleep(time.Millisecond)
			}

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				done <- srv.Shutdown(ctx)
			}()
			for !srv.shuttingDown() {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // Shutdown has seen the sessions

			fresh.sendNow(wire.AppendQuery(nil, "SELECT 1"))
			if !reuse {
				if f := fresh.refusal(); f['C'] != "57P01" {
					t.Fatalf("idle client: %v, want 57P01", f)
				}
				// Ended: with 57P01, or closed when it is ended before its
				// first byte was read.
				if typ, body, err := mid.next(); err == nil && (typ != 'E' || !strings.Contains(string(body), "57P01")) {
					t.Fatalf("login in progress: message %q %q, want 57P01 or the end", typ, body)
				}
				<-done
				return
			}
			toReady(fresh)
			if f := fresh.refusal(); f['C'] != "57P01" {
				t.Fatalf("after its answer: %v, want 57P01", f)
			}
			mid.login()
			toReady(mid)
			mid.sendNow(wire.AppendQuery(nil, "SELECT 1"))
			toReady(mid)
			if f := mid.refusal(); f['C'] != "57P01" {
				t.Fatalf("after its answer: %v, want 57P01", f)
			}
			if err := <-done; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
		})
	}
}
