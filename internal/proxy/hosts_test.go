package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/config"
)

func TestHostOrder(t *testing.T) {
	a, b, c := config.HostPort{Host: "a", Port: 1}, config.HostPort{Host: "b", Port: 1}, config.HostPort{Host: "c", Port: 1}
	hosts := []config.HostPort{a, b, c}
	var hs hostSet
	now := time.Now()
	first := map[config.HostPort]int{}
	for range 6 {
		first[hs.order(hosts, config.BalanceRoundRobin, now)[0]]++
	}
	if first[a] != 2 || first[b] != 2 || first[c] != 2 {
		t.Errorf("round-robin starts: %v", first)
	}
	if got := hs.order(hosts, config.BalanceDisable, now); got[0] != a || got[1] != b || got[2] != c {
		t.Errorf("disable: %v", got)
	}
	// A failed server goes last until its backoff ends.
	hs.failed(a, errors.New("refused"), now, 100*time.Millisecond, time.Second)
	if got := hs.order(hosts, config.BalanceDisable, now); got[2] != a {
		t.Errorf("after a failure: %v, want a last", got)
	}
	if got := hs.order(hosts, config.BalanceDisable, now.Add(time.Second)); got[0] != a {
		t.Errorf("after its backoff: %v, want a first again", got)
	}
	hs.reached(a, false)
	// least-connections: fewest open first.
	hs.opened(a)
	hs.opened(a)
	hs.opened(b)
	if got := hs.order(hosts, config.BalanceLeastConns, now); got[0] != c || got[2] != a {
		t.Errorf("least-connections: %v", got)
	}
	snap := hs.snapshot(&config.Route{Hosts: hosts}, map[config.HostPort]int{a: 1})
	if snap[0].Role != "primary" || snap[0].Open != 2 || snap[0].Idle != 1 || snap[2].Role != "unknown" {
		t.Errorf("snapshot %+v", snap)
	}
}
