package proxy

import (
	"testing"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
)

// TestSessionKeys: a session that holds its server connection from login
// (session mode) is registered under its backend's own pid, any other under
// a pid poolerd makes up, above the pids of real processes; the key is
// always poolerd's, fresh for each session, so that the backend's next
// client does not share it. Real pids repeat (backends of two servers, or
// one equal to an issued pid): cancel requests find a session by pid and
// key together.
func TestSessionKeys(t *testing.T) {
	cfg := config.Defaults()
	cfg.Upstream = "postgres://app:app@127.0.0.1:1/app"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := New(&cfg, zap.NewNop())
	held := func(pid uint32) *serverConn {
		return &serverConn{Conn: &backend.Conn{PID: pid, Key: []byte{0, 0, 0, 7}}}
	}
	var nextID uint64
	register := func(sc *serverConn) *session {
		nextID++
		s := &session{srv: srv, id: nextID}
		srv.register(s, sc)
		return s
	}

	a := register(held(42))
	b := register(held(42)) // another server's backend 42
	tx := register(nil)
	if a.pid != 42 || b.pid != 42 {
		t.Fatalf("session-mode pids %d and %d, want their backends' (42)", a.pid, b.pid)
	}
	if a.key == b.key || a.key == 7 {
		t.Fatalf("session-mode keys %d and %d: want two of poolerd's own", a.key, b.key)
	}
	if tx.pid < minIssuedPID {
		t.Fatalf("issued pid %d, want at least %d", tx.pid, minIssuedPID)
	}
	c := register(held(tx.pid)) // a backend whose pid poolerd issued too
	if c.key == tx.key {
		t.Fatalf("two sessions with pid %d got key %d", tx.pid, c.key)
	}

	for _, tc := range []struct {
		pid, key uint32
		want     *session
	}{
		{42, a.key, a}, {42, b.key, b}, {42, 7, nil},
		{tx.pid, tx.key, tx}, {tx.pid, c.key, c}, {tx.pid, tx.key ^ c.key ^ 1, nil},
	} {
		if tc.want == nil && (tc.key == a.key || tc.key == b.key || tc.key == tx.key || tc.key == c.key) {
			continue // a random key happened to be the one tried
		}
		if got := srv.lookupSession(tc.pid, tc.key); got != tc.want {
			t.Errorf("lookupSession(%d, %d) = %p, want %p", tc.pid, tc.key, got, tc.want)
		}
	}

	srv.forget(a)
	srv.forget(a)                                     // twice is harmless
	srv.forget(&session{srv: srv, id: 1000, pid: 42}) // never registered
	if srv.lookupSession(42, a.key) != nil || srv.lookupSession(42, b.key) != b {
		t.Fatal("forgetting one of two sessions with pid 42 lost the other, or kept it")
	}
	// The backend's next client gets a key of its own: a late cancel
	// request with the old one matches nothing.
	next := register(held(42))
	if next.key != a.key && srv.lookupSession(42, a.key) != nil {
		t.Fatal("a cancel request with the key of a client that left found a session")
	}
	srv.forget(b)
	srv.forget(next)
	if _, ok := srv.keys[42]; ok {
		t.Error("pid 42 still indexed with no session left")
	}
	if n := srv.clientSessions(); n != 2 {
		t.Errorf("%d sessions registered, want 2", n)
	}
}
