package wire

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// TestConnReaderPlain: on a connection without a file descriptor (TLS, a
// pipe), reads and writes go through the connection itself.
func TestConnReaderPlain(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	r, err := NewConnReader(a, NewBufferPool(BufferSize))
	if err != nil {
		t.Fatal(err)
	}
	if r.Raw() {
		t.Fatal("a pipe reported raw")
	}
	if err := r.Control(func(uintptr) {}); err == nil {
		t.Fatal("Control on a pipe succeeded")
	}
	go func() { _, _ = b.Write([]byte("hello")) }()
	bp, n, err := r.Read()
	if err != nil || string((*bp)[Headroom:Headroom+n]) != "hello" {
		t.Fatalf("Read: %q %v", (*bp)[Headroom:Headroom+n], err)
	}
	got := make(chan []byte)
	go func() {
		p := make([]byte, 10)
		_, _ = io.ReadFull(b, p)
		got <- p
	}()
	if err := r.Write2([]byte("01234"), []byte("56789")); err != nil {
		t.Fatal(err)
	}
	if p := <-got; !bytes.Equal(p, []byte("0123456789")) {
		t.Fatalf("Write2 sent %q", p)
	}
	b.Close()
	if _, _, err := r.Read(); err != io.EOF {
		t.Fatalf("after close: %v, want EOF", err)
	}
}
