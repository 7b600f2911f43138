package netopt

import (
	"net"
	"testing"
	"time"
)

// TestAcceptQueued: connections the kernel completed and nobody accepted
// are counted, and an accept takes one off.
func TestAcceptQueued(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if n := AcceptQueued(ln); n != 0 {
		t.Fatalf("a new listener has %d queued", n)
	}
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for AcceptQueued(ln) != 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := AcceptQueued(ln); n != 3 {
		t.Fatalf("3 connections not accepted: %d queued", n)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := AcceptQueued(ln); n != 2 {
		t.Fatalf("after an accept: %d queued, want 2", n)
	}
	if n := AcceptQueued(nil); n != 0 {
		t.Fatalf("no listener: %d", n)
	}
}
