package proxy

import (
	"net"
	"testing"
	"time"
)

func TestAuthDelays(t *testing.T) {
	var d authDelays
	a := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 1}
	b := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 2} // same address, another port
	now := time.Unix(1000, 0)
	base, ceiling := 100*time.Millisecond, time.Second
	var got []time.Duration
	for i := range 6 {
		addr := a
		if i%2 == 1 {
			addr = b
		}
		got = append(got, d.failed(addr, now, base, ceiling))
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", got, want)
		}
	}
	if g := d.failed(a, now.Add(authFailureMemory+time.Second), base, ceiling); g != base {
		t.Fatalf("after %v without failures: %v, want the base again", authFailureMemory, g)
	}
	d.succeeded(b)
	if g := d.failed(a, now.Add(authFailureMemory+2*time.Second), base, ceiling); g != base {
		t.Fatalf("after a success: %v, want the base", g)
	}
	if g := d.failed(a, now, 0, ceiling); g != 0 {
		t.Fatalf("disabled: %v", g)
	}
}
