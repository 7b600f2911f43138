package faultproxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/poolerd/poolerd/test/faultproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoServer echoes every connection back and records every byte it receives.
type echoServer struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	recv  bytes.Buffer
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					c.Close()
				}()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.mu.Lock()
						s.recv.Write(buf[:n])
						s.mu.Unlock()
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if errors.Is(err, io.EOF) {
							_ = c.(*net.TCPConn).CloseWrite()
							// Wait for the peer to close.
							_, _ = io.Copy(io.Discard, c)
						}
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

func (s *echoServer) received() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recv.String()
}

func (s *echoServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// setup starts an echo server and a proxy in front of it.
func setup(t *testing.T) (*echoServer, *faultproxy.Proxy) {
	t.Helper()
	echo := startEcho(t)
	px, err := faultproxy.Start(echo.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := px.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return echo, px
}

func dial(t *testing.T, px *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", px.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

// readN reads exactly n bytes within timeout.
func readN(t *testing.T, c net.Conn, n int, timeout time.Duration) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %d bytes: %v (got %q)", n, err, buf)
	}
	return string(buf)
}

// expectSilence asserts that nothing arrives on c for d.
func expectSilence(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected nothing for %v, got %q, err=%v", d, buf[:n], err)
	}
}

// roundTrip writes s and expects it echoed back.
func roundTrip(t *testing.T, c net.Conn, s string) {
	t.Helper()
	write(t, c, s)
	if got := readN(t, c, len(s), 2*time.Second); got != s {
		t.Fatalf("echo: got %q, want %q", got, s)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// expectClosed asserts that c is closed or reset by the peer promptly.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected EOF or reset, got %q, err=%v", buf[:n], err)
	}
}

func TestAddr(t *testing.T) {
	_, px := setup(t)
	if px.Host() != "127.0.0.1" {
		t.Errorf("Host = %q", px.Host())
	}
	if want := fmt.Sprintf("127.0.0.1:%d", px.Port()); px.Addr() != want || px.Port() == 0 {
		t.Errorf("Addr = %q, Port = %d", px.Addr(), px.Port())
	}
	if _, err := faultproxy.Start("no-port"); err == nil {
		t.Error("Start with a bad target succeeded")
	}
}

func TestForward(t *testing.T) {
	_, px := setup(t)
	c := dial(t, px)
	roundTrip(t, c, "hello")
	roundTrip(t, c, "world")
	if px.Conns() != 1 || px.Accepted() != 1 {
		t.Errorf("Conns = %d, Accepted = %d; want 1, 1", px.Conns(), px.Accepted())
	}

	// A large transfer arrives intact.
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		errc <- err
	}()
	got := readN(t, c, len(data), 5*time.Second)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got != string(data) {
		t.Fatal("large transfer corrupted")
	}
}

func TestHalfClose(t *testing.T) {
	_, px := setup(t)
	c := dial(t, px)
	write(t, c, "bye")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "bye" {
		t.Fatalf("ReadAll = %q, %v; want \"bye\", EOF", got, err)
	}
	c.Close()
	eventually(t, "Conns() == 0", func() bool { return px.Conns() == 0 })
}

func TestDelay(t *testing.T) {
	const delay = 100 * time.Millisecond
	_, px := setup(t)
	c := dial(t, px)
	roundTrip(t, c, "warmup")
	px.SetDelay(delay)

	start := time.Now()
	roundTrip(t, c, "x")
	if rt := time.Since(start); rt < 2*delay {
		t.Fatalf("round trip took %v, want >= %v", rt, 2*delay)
	}

	// Many small writes: order is preserved and the latency is shifted,
	// not accumulated per chunk.
	var want bytes.Buffer
	start = time.Now()
	for i := range 200 {
		s := fmt.Sprintf("<%d>", i)
		want.WriteString(s)
		write(t, c, s)
		if i%20 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	got := readN(t, c, want.Len(), 5*time.Second)
	if got != want.String() {
		t.Fatalf("order not preserved:\n got %q\nwant %q", got, want.String())
	}
	if el := time.Since(start); el < 2*delay || el > 2*time.Second {
		t.Fatalf("burst took %v", el)
	}

	// Lowering the delay takes effect for chunks already waiting.
	px.SetDelay(time.Hour)
	write(t, c, "late")
	time.Sleep(20 * time.Millisecond)
	px.SetDelay(0)
	if got := readN(t, c, 4, 2*time.Second); got != "late" {
		t.Fatalf("got %q", got)
	}
	start = time.Now()
	roundTrip(t, c, "fast")
	if rt := time.Since(start); rt > delay {
		t.Fatalf("round trip without delay took %v", rt)
	}
}

func TestHang(t *testing.T) {
	echo, px := setup(t)
	c := dial(t, px)
	roundTrip(t, c, "before;")
	px.SetMode(faultproxy.Hang)

	for _, s := range []string{"a1", "b22", "c333"} {
		write(t, c, s)
		time.Sleep(5 * time.Millisecond)
	}
	expectSilence(t, c, 200*time.Millisecond)
	if got := echo.received(); got != "before;" {
		t.Fatalf("target received %q while hung", got)
	}

	// A connection opened while hung is accepted but forwards nothing.
	c2 := dial(t, px)
	write(t, c2, "new")
	eventually(t, "second connection", func() bool { return px.Conns() == 2 })

	px.SetMode(faultproxy.Forward)
	if got := readN(t, c, 9, 2*time.Second); got != "a1b22c333" {
		t.Fatalf("released %q, want %q", got, "a1b22c333")
	}
	if got := readN(t, c2, 3, 2*time.Second); got != "new" {
		t.Fatalf("released %q on new connection", got)
	}
	roundTrip(t, c, "after")
}

func TestHoldResponses(t *testing.T) {
	echo, px := setup(t)
	c := dial(t, px)
	roundTrip(t, c, "q0;")
	px.HoldResponses(true)

	write(t, c, "q1;")
	write(t, c, "q2;")
	eventually(t, "target to receive the queries", func() bool {
		return echo.received() == "q0;q1;q2;"
	})
	expectSilence(t, c, 200*time.Millisecond)

	px.HoldResponses(false)
	if got := readN(t, c, 6, 2*time.Second); got != "q1;q2;" {
		t.Fatalf("released %q", got)
	}
	roundTrip(t, c, "q3;")
}

func TestBlackhole(t *testing.T) {
	echo, px := setup(t)
	c := dial(t, px)
	roundTrip(t, c, "kept;")
	px.SetMode(faultproxy.Blackhole)

	write(t, c, "lost;")
	eventually(t, "bytes to be discarded", func() bool { return px.Discarded() >= 5 })
	expectSilence(t, c, 100*time.Millisecond)

	px.SetMode(faultproxy.Forward)
	roundTrip(t, c, "new;")
	expectSilence(t, c, 200*time.Millisecond)
	if got := echo.received(); got != "kept;new;" {
		t.Fatalf("target received %q", got)
	}

	// Responses held by HoldResponses are discarded too by Blackhole.
	px.HoldResponses(true)
	write(t, c, "held;")
	eventually(t, "target to receive", func() bool { return echo.received() == "kept;new;held;" })
	px.SetMode(faultproxy.Blackhole)
	eventually(t, "held bytes to be discarded", func() bool { return px.Discarded() >= 10 })
	px.HoldResponses(false)
	px.SetMode(faultproxy.Forward)
	roundTrip(t, c, "end")
}

func TestRefuse(t *testing.T) {
	_, px := setup(t)
	old := dial(t, px)
	roundTrip(t, old, "established")

	px.SetMode(faultproxy.Refuse)
	c, err := net.DialTimeout("tcp", px.Addr(), 2*time.Second)
	if err == nil {
		defer c.Close()
		expectClosed(t, c)
	} else if !errors.Is(err, syscall.ECONNRESET) { // the reset can already be seen by connect
		t.Fatalf("dial: %v", err)
	}
	eventually(t, "Accepted() == 2", func() bool { return px.Accepted() == 2 })
	if px.Conns() != 1 {
		t.Errorf("Conns = %d, want 1", px.Conns())
	}
	roundTrip(t, old, "still works")

	px.SetMode(faultproxy.Forward)
	roundTrip(t, dial(t, px), "accepted again")
}

func TestResetAll(t *testing.T) {
	_, px := setup(t)
	c1 := dial(t, px)
	c2 := dial(t, px)
	roundTrip(t, c1, "one")
	roundTrip(t, c2, "two")
	px.SetMode(faultproxy.Hang) // a reset also hits hung connections
	write(t, c2, "pending")

	start := time.Now()
	px.ResetAll()
	if n := px.Conns(); n != 0 {
		t.Fatalf("Conns = %d after ResetAll", n)
	}
	expectClosed(t, c1)
	expectClosed(t, c2)
	if el := time.Since(start); el > time.Second {
		t.Fatalf("reset noticed after %v", el)
	}

	px.SetMode(faultproxy.Forward)
	roundTrip(t, dial(t, px), "fresh")
}

func TestPauseResume(t *testing.T) {
	_, px := setup(t)
	addr := px.Addr()
	old := dial(t, px)
	roundTrip(t, old, "x")

	if err := px.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := px.Pause(); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	_, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while paused: %v, want connection refused", err)
	}
	roundTrip(t, old, "existing unaffected")

	if err := px.Resume(); err != nil {
		t.Fatal(err)
	}
	if px.Addr() != addr {
		t.Fatalf("Addr changed from %s to %s", addr, px.Addr())
	}
	roundTrip(t, dial(t, px), "resumed")
	if err := px.Resume(); err != nil {
		t.Fatalf("second Resume: %v", err)
	}
}

func TestClose(t *testing.T) {
	echo := startEcho(t)
	px, err := faultproxy.Start(echo.addr())
	if err != nil {
		t.Fatal(err)
	}

	// Connections in every kind of blocked state.
	conns := make([]net.Conn, 0, 4)
	for range 4 {
		c, err := net.Dial("tcp", px.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		roundTrip(t, c, "hi")
		conns = append(conns, c)
	}
	px.HoldResponses(true)
	write(t, conns[0], "held")
	eventually(t, "target to receive", func() bool { return echo.received() == "hihihihiheld" })
	px.SetDelay(time.Hour)
	write(t, conns[1], "delayed")
	px.SetMode(faultproxy.Hang)
	write(t, conns[2], "hung")
	// conns[3] floods the proxy until its queue and the socket buffers
	// are full, so that both the reader and the client block.
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		_, _ = conns[3].Write(make([]byte, 32<<20))
	}()
	time.Sleep(50 * time.Millisecond)
	if err := px.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := px.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, c := range conns {
		expectClosed(t, c)
	}
	if _, err := net.DialTimeout("tcp", px.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
	if err := px.Resume(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Resume after Close: %v", err)
	}
	for _, c := range conns {
		c.Close()
	}
	<-flooded
	echo.close()
	goleak.VerifyNone(t)
}

func TestDeadTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there any more
	px, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	// The reset can already be seen by connect.
	if c, err := net.DialTimeout("tcp", px.Addr(), 2*time.Second); err == nil {
		defer c.Close()
		expectClosed(t, c)
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("dial: %v", err)
	}
	eventually(t, "Conns() == 0", func() bool { return px.Conns() == 0 })
}
