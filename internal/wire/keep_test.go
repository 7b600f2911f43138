package wire

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// TestConnReaderKeep: a write that does not wait (WriteOrKeep) keeps what
// the socket does not take, later ones queue behind it, Flush sends what
// the socket takes once the peer reads, and a waiting Write sends the kept
// bytes first: the peer reads everything once, in order. A pipe (no
// descriptor) cannot keep.
func TestConnReaderKeep(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		peer <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := <-peer
	defer p.Close()
	_ = c.(*net.TCPConn).SetWriteBuffer(64 << 10)
	_ = p.(*net.TCPConn).SetReadBuffer(64 << 10)
	r, err := NewConnReader(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	chunk := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 64<<10) }
	// Until the socket takes no more, then twice more: kept, in order.
	var kept int
	for i := 0; kept == 0 || i < 3; i++ {
		if i > 64 {
			t.Fatalf("64 writes of 64 KB never filled the socket")
		}
		b := chunk(i)
		want = append(want, b...)
		var err error
		var ok bool
		if kept, ok, err = r.WriteOrKeep(b[:1000], b[1000:]); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if i > 0 && kept > 0 && int64(kept) != r.Kept() {
			t.Fatalf("WriteOrKeep says %d kept, Kept %d", kept, r.Kept())
		}
	}
	if left, err := r.Flush(); err != nil || left == 0 {
		t.Fatalf("Flush with a peer that does not read: %d left, %v", left, err)
	}
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(p)
		got <- b
	}()
	// The peer reads: Flush sends the rest, in steps.
	for deadline := time.Now().Add(10 * time.Second); r.Kept() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("Flush: %d bytes still kept", r.Kept())
		}
		if _, err := r.Flush(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	// Kept again, then a waiting Write: the kept bytes go first.
	for i := 0; r.Kept() == 0; i++ {
		b := chunk(100 + i)
		want = append(want, b...)
		if _, ok, err := r.WriteOrKeep(b, nil); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	tail := []byte("the end")
	want = append(want, tail...)
	if err := r.Write(tail); err != nil || r.Kept() != 0 {
		t.Fatalf("Write after kept bytes: %v, %d kept", err, r.Kept())
	}
	c.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, want %d in order", len(b), len(want))
	}

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	pr, _ := NewConnReader(a, nil)
	if _, _, err := pr.WriteOrKeep([]byte("x"), nil); err == nil {
		t.Fatal("WriteOrKeep on a pipe succeeded")
	}
}
