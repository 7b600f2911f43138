package proxy

import (
	"testing"

	"github.com/poolerd/poolerd/internal/config"
)

// The peering layout is PgBouncer's: the peer id in the pid's second and
// third bytes (cancel_key[1] + cancel_key[2]<<8), the time to live in the
// key's lowest two bits, both set at issue.
func TestPeeringKeyLayout(t *testing.T) {
	for _, id := range []int{1, 2, 255, 256, 4660, config.MaxPeerID} {
		pid := withPeer(0x7abbcc11, id)
		if got := pidPeer(pid); got != id {
			t.Errorf("peer %d: pid %#x carries %d", id, pid, got)
		}
		var b [4]byte
		b[0], b[1], b[2], b[3] = byte(pid>>24), byte(pid>>16), byte(pid>>8), byte(pid)
		if int(b[1])+int(b[2])<<8 != id || b[0] != 0x7a || b[3] != 0x11 {
			t.Errorf("peer %d: pid bytes %x", id, b)
		}
	}
	cfg := &config.Config{PeerID: 3, Peers: []config.Peer{{ID: 3}, {ID: 7, Host: "/run/b", Port: 6432}}}
	pid, key := issueKey(cfg, 0x12345678, 0xfffffff0)
	if pidPeer(pid) != 3 || key != 0xfffffff3 || pid>>24 != 0x12 || pid&0xff != 0x78 {
		t.Errorf("issued %#x %#x", pid, key)
	}
	if p, k := issueKey(&config.Config{}, 0x12345678, 0xfffffff0); p != 0x12345678 || k != 0xfffffff0 {
		t.Errorf("without peer_id: %#x %#x", p, k)
	}
	// Our own id and unknown ids are looked up here; a listed peer's are
	// forwarded; without peer_id nothing is.
	for _, c := range []struct {
		pid  uint32
		cfg  *config.Config
		peer int
	}{
		{withPeer(0x40000001, 3), cfg, 0},
		{withPeer(0x40000001, 9), cfg, 0},
		{withPeer(0x40000001, 7), cfg, 7},
		{withPeer(0x40000001, 7), &config.Config{Peers: cfg.Peers}, 0},
	} {
		p, ok := peerOf(c.cfg, c.pid)
		if ok != (c.peer != 0) || ok && p.ID != c.peer {
			t.Errorf("pid %#x (peer %d): peerOf %v %v, want %d", c.pid, pidPeer(c.pid), p, ok, c.peer)
		}
	}
}
