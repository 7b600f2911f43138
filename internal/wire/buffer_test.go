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
