package takeover

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// With SO_REUSEPORT two listeners bind one address; without it the second
// is refused.
func TestListenReusePort(t *testing.T) {
	ctx := context.Background()
	a, err := Listen(ctx, "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Listen(ctx, a.Addr().String(), true)
	if err != nil {
		t.Fatalf("second listener with SO_REUSEPORT: %v", err)
	}
	b.Close()
	if c, err := Listen(ctx, a.Addr().String(), false); err == nil {
		c.Close()
		t.Fatal("second listener without SO_REUSEPORT bound the address")
	}
}

// The new process gets the old one's listening sockets, TCP and Unix, in
// order: both accept from them until the old one says it stopped; a
// connection made at any point is accepted by one of them; the Unix
// socket's file stays when the old process closes its listener; the
// takeover socket file is free for the new process's own offer afterwards.
func TestHandOver(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "takeover.sock")
	old, err := Listen(ctx, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	unixPath := filepath.Join(dir, ".s.PGSQL.6432")
	oldU, err := ListenUnix(unixPath, 0o770, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(unixPath); err != nil || st.Mode().Perm() != 0o770 || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("Unix socket file: %v, %v", st, err)
	}
	offer, err := NewOffer(path, []net.Listener{old, oldU}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer offer.Close()
	// Its owner's only: whoever connects takes the sockets and clients.
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("takeover socket file: %v, %v; want mode 0600", st, err)
	}
	if _, err := NewOffer(path, []net.Listener{old}, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "another poolerd") {
		t.Fatalf("second offer on a live socket: %v", err)
	}
	earlyU, err := net.Dial("unix", unixPath)
	if err != nil {
		t.Fatal(err)
	}
	defer earlyU.Close()
	// A client waits in the queue before the hand-over.
	early, err := net.Dial("tcp", old.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()

	lns, h, err := Take(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lns {
		defer l.Close()
	}
	if len(lns) != 2 || lns[0].Addr().String() != old.Addr().String() || lns[1].Addr().String() != unixPath {
		t.Fatalf("took %v, want %s and %s", lns, old.Addr(), unixPath)
	}
	ln, lnU := lns[0], lns[1]
	accepted := make(chan net.Conn, 4)
	acceptedU := make(chan net.Conn, 4)
	for _, x := range []struct {
		l  net.Listener
		ch chan net.Conn
	}{{ln, accepted}, {lnU, acceptedU}} {
		go func() {
			for {
				c, err := x.l.Accept()
				if err != nil {
					return
				}
				x.ch <- c
			}
		}()
	}
	served := make(chan error, 1)
	go func() { served <- h.Serving() }()
	var stop *Passer
	select {
	case stop = <-offer.Taken():
	case <-time.After(5 * time.Second):
		t.Fatal("the old side was not told")
	}
	old.Close() // the old process stops accepting; the socket stays open
	oldU.SetUnlinkOnClose(false)
	oldU.Close()
	stop.Stopped()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	// Client connections pass with their state, in order, and work on
	// the other side; Close ends the list.
	type got struct {
		f     *os.File
		state string
	}
	clients := make(chan got, 4)
	listed := make(chan error, 1)
	go func() {
		listed <- h.Clients(func(f *os.File, state []byte) { clients <- got{f, string(state)} })
	}()
	peers := make([]net.Conn, 2)
	for i := range peers {
		a, b := tcpPair(t)
		peers[i] = a
		f, err := b.(*net.TCPConn).File()
		if err != nil {
			t.Fatal(err)
		}
		if err := stop.Send(f, []byte(strings.Repeat("s", 100000*i+1))); err != nil {
			t.Fatal(err)
		}
		f.Close()
		b.Close() // the socket lives on in the passed descriptor
	}
	stop.Close()
	for i, peer := range peers {
		g := <-clients
		if len(g.state) != 100000*i+1 {
			t.Fatalf("client %d: state of %d bytes, want %d", i, len(g.state), 100000*i+1)
		}
		nc, err := net.FileConn(g.f)
		g.f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2)
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "hi" {
			t.Fatalf("client %d: read %q, %v through the passed socket", i, buf, err)
		}
		nc.Close()
		peer.Close()
	}
	if err := <-listed; err != nil {
		t.Fatal(err)
	}
	late, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	for i := 0; i < 2; i++ {
		select {
		case c := <-accepted:
			c.Close()
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 2 connections accepted by the new listener", i)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file after the hand-over: %v", err)
	}
	// The Unix socket: its file stayed; the client that waited before the
	// hand-over and one after it are accepted by the new listener.
	lateU, err := net.Dial("unix", unixPath)
	if err != nil {
		t.Fatalf("Unix socket after the old process closed its listener: %v", err)
	}
	defer lateU.Close()
	for i := range 2 {
		select {
		case c := <-acceptedU:
			c.Close()
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 2 Unix-socket connections accepted by the new listener", i)
		}
	}
	next, err := NewOffer(path, lns, zap.NewNop())
	if err != nil {
		t.Fatalf("the new process's own offer: %v", err)
	}
	next.Close()
}

// A socket file left by a process that is gone is replaced; Take with
// nobody offering says so.
func TestStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "takeover.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	ul.Close()
	if _, _, err := Take(context.Background(), path); err == nil || !strings.Contains(err.Error(), "no running poolerd") {
		t.Fatalf("Take from a stale socket: %v", err)
	}
	ln, err := Listen(context.Background(), "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	o, err := NewOffer(path, []net.Listener{ln}, zap.NewNop())
	if err != nil {
		t.Fatalf("offer over a stale socket file: %v", err)
	}
	o.Close()
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// ListenUnix: the file gets the mode and group asked for; a socket file
// nobody serves is replaced, one a live listener serves is refused, and
// the file goes when the listener is closed.
func TestListenUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".s.PGSQL.6432")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	gid := os.Getgid()
	ul, err := ListenUnix(path, 0o700, strconv.Itoa(gid))
	if err != nil {
		t.Fatalf("over a stale socket file: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 || int(st.Sys().(*syscall.Stat_t).Gid) != gid {
		t.Fatalf("mode %v gid %d, want 0700 and %d", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid, gid)
	}
	if _, err := ListenUnix(path, 0o777, ""); err == nil || !strings.Contains(err.Error(), "another process serves it") {
		t.Fatalf("a second listener on a live socket: %v", err)
	}
	if _, err := ListenUnix(filepath.Join(t.TempDir(), "x"), 0o777, "no-such-group-poolerd"); err == nil || !strings.Contains(err.Error(), "no such group") {
		t.Fatalf("an unknown group: %v", err)
	}
	ul.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file after Close: %v", err)
	}
}

// TestPeerAllowed: only the same user or root may take the sockets over.
func TestPeerAllowed(t *testing.T) {
	for _, tc := range []struct {
		uid  uint32
		self int
		ok   bool
	}{{1000, 1000, true}, {0, 1000, true}, {1001, 1000, false}, {1000, 0, false}, {0, 0, true}} {
		if got := peerAllowed(tc.uid, tc.self); got != tc.ok {
			t.Errorf("peerAllowed(%d, %d) = %v, want %v", tc.uid, tc.self, got, tc.ok)
		}
	}
}
