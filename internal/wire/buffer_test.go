package wire

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestConnReader(t *testing.T) {
	client, server := tcpPair(t)
	pool := NewBufferPool(64)
	r, err := NewConnReader(server, pool)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond) // the reader waits first
		client.Write([]byte("hello"))
	}()
	bp, n, err := r.Read()
	if err != nil || string((*bp)[Headroom:Headroom+n]) != "hello" {
		t.Fatalf("read %q %v", (*bp)[Headroom:Headroom+n], err)
	}
	pool.Put(bp)

	server.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if _, _, err := r.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	server.SetReadDeadline(time.Time{})

	client.Close()
	if bp, _, err := r.Read(); err != io.EOF || bp != nil {
		t.Fatalf("EOF: %v %v", bp, err)
	}
}

func TestConnReaderAllocatesNothing(t *testing.T) {
	client, server := tcpPair(t)
	pool := NewBufferPool(64)
	r, err := NewConnReader(server, pool)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("x")
	allocs := testing.AllocsPerRun(200, func() {
		client.Write(msg)
		bp, _, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		pool.Put(bp)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per read", allocs)
	}
}

// TestConnReaderWrite2 writes more than the socket buffers hold, so that the
// writes are partial and wait for writability, from several goroutines at
// once: every Write2 must arrive whole and in order (a then b), and none may
// be interleaved with another.
func TestConnReaderWrite2(t *testing.T) {
	client, server := tcpPair(t)
	w, err := NewConnReader(server, nil)
	if err != nil {
		t.Fatal(err)
	}
	const writers, perWriter = 4, 8
	const half = 300 << 10 // larger than a loopback socket's buffers
	msg := func(id, i int) (a, b []byte) {
		a = make([]byte, half)
		b = make([]byte, half+id)
		for j := range a {
			a[j] = byte(id*31 + i + j)
		}
		for j := range b {
			b[j] = byte(id*17 + i + j*3)
		}
		// Each message starts with its writer, its number and its length.
		a[0], a[1] = byte(id), byte(i)
		return a, b
	}
	errs := make(chan error, writers)
	for id := range writers {
		go func() {
			for i := range perWriter {
				a, b := msg(id, i)
				if err := w.Write2(a, b); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	next := make([]int, writers)
	for range writers * perWriter {
		var head [2]byte
		if _, err := io.ReadFull(client, head[:]); err != nil {
			t.Fatal(err)
		}
		id, i := int(head[0]), int(head[1])
		if id >= writers || i != next[id] {
			t.Fatalf("message of writer %d number %d out of order (want %d)", id, i, next[id])
		}
		next[id]++
		a, b := msg(id, i)
		got := make([]byte, len(a)+len(b)-2)
		if _, err := io.ReadFull(client, got); err != nil {
			t.Fatal(err)
		}
		want := append(append([]byte(nil), a[2:]...), b...)
		if string(got) != string(want) {
			t.Fatalf("message of writer %d number %d corrupted", id, i)
		}
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}

	// An empty write writes nothing; a lone b is written.
	if err := w.Write2(nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write2(nil, []byte("zz")); err != nil {
		t.Fatal(err)
	}
	var zz [2]byte
	if _, err := io.ReadFull(client, zz[:]); err != nil || string(zz[:]) != "zz" {
		t.Fatalf("lone b: %q %v", zz, err)
	}

	// Deadlines apply, and a closed peer is an error, not a signal.
	server.SetWriteDeadline(time.Now().Add(-time.Second))
	if err := w.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	server.SetWriteDeadline(time.Time{})
	client.Close()
	big := make([]byte, 1<<20)
	var werr error
	for range 20 {
		if werr = w.Write(big); werr != nil {
			break
		}
	}
	if werr == nil {
		t.Fatal("writes to a closed peer kept succeeding")
	}
}

func TestConnReaderReadInto(t *testing.T) {
	client, server := tcpPair(t)
	r, err := NewConnReader(server, nil)
	if err != nil {
		t.Fatal(err)
	}
	client.Write([]byte("abc"))
	p := make([]byte, 8)
	n, err := r.ReadInto(p)
	if err != nil || string(p[:n]) != "abc" {
		t.Fatalf("read %q %v", p[:n], err)
	}
	x := []byte("x")
	allocs := testing.AllocsPerRun(100, func() {
		client.Write(x)
		if _, err := r.ReadInto(p); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per ReadInto", allocs)
	}
	client.Close()
	if n, err := r.ReadInto(p); n != 0 || err != io.EOF {
		t.Fatalf("EOF: %d %v", n, err)
	}
}
