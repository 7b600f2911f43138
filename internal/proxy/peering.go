package proxy

import (
	"context"
	"encoding/binary"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
)

// Peering (PgBouncer's peer_id and [peers]): several poolers serve one
// port with so_reuseport, so a client's cancel request reaches any of
// them. With peer_id set, every BackendKeyData poolerd issues carries the
// peer id in its pid, as PgBouncer lays it out (the pid's second and third
// bytes, low byte first), and its key's lowest two bits are a time to live
// (both set at issue). A cancel request whose pid names another peer of
// the peers list is sent on to that peer with the time to live lowered by
// one (none left: dropped, so that a misconfigured group cannot pass a
// request around for ever); one naming this poolerd, or no known peer, is
// looked up here. The layout is PgBouncer's, so a group may mix poolerd
// and PgBouncer processes while one replaces the other.

// cancelTTLMask is the time to live of a cancel request's key.
const cancelTTLMask = 0x3

// pidPeer returns the peer id a pid carries.
func pidPeer(pid uint32) int {
	return int(pid>>16&0xff) | int(pid>>8&0xff)<<8
}

// withPeer returns pid carrying peer id (0: pid unchanged).
func withPeer(pid uint32, id int) uint32 {
	if id == 0 {
		return pid
	}
	return pid&^0x00ffff00 | uint32(id&0xff)<<16 | uint32(id>>8&0xff)<<8
}

// peering forwards cancel requests to the other peers and counts them.
type peering struct {
	mu sync.Mutex
	// slots bounds the requests in flight to each peer (its pool_size):
	// one token per request being sent, by peer id and size, so that a
	// reload that changes the size starts a new bound.
	slots map[peerSlots]*peerSlot

	forwarded *prometheus.CounterVec // peer_id, outcome
}

type peerSlots struct{ id, size int }

type peerSlot struct {
	sem     chan struct{}
	waiting int // requests waiting for a token (peering.mu)
}

func newPeering() *peering {
	return &peering{
		slots: map[peerSlots]*peerSlot{},
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poolerd_peer_cancel_requests_total",
			Help: "Cancel requests for clients of another peer (peer_id, peers) by peer and outcome: forwarded, failed (the peer could not be reached), ttl_exhausted (passed on three times already; dropped).",
		}, []string{"peer_id", "outcome"}),
	}
}

func (p *peering) slot(id, size int) *peerSlot {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := peerSlots{id, size}
	s, ok := p.slots[k]
	if !ok {
		s = &peerSlot{sem: make(chan struct{}, size)}
		p.slots[k] = s
	}
	return s
}

// PeerPoolStats is one row of SHOW PEER_POOLS: the cancel requests for a
// peer in flight (Active) and waiting for their turn (Waiting).
type PeerPoolStats struct {
	ID              int
	Active, Waiting int
}

// PeerPools lists the peers of the running configuration with the cancel
// requests being forwarded to each.
func (srv *Server) PeerPools() []PeerPoolStats {
	cfg := srv.cfg()
	p := srv.peering
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PeerPoolStats
	for _, peer := range cfg.Peers {
		if peer.ID == cfg.PeerID {
			continue
		}
		st := PeerPoolStats{ID: peer.ID}
		for k, s := range p.slots {
			if k.id == peer.ID {
				st.Active += len(s.sem)
				st.Waiting += s.waiting
			}
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PeerPoolStats) int { return a.ID - b.ID })
	return out
}

// issueKey gives a BackendKeyData poolerd issues the peering layout of
// cfg (unchanged without peer_id).
func issueKey(cfg *config.Config, pid, key uint32) (uint32, uint32) {
	if cfg.PeerID == 0 {
		return pid, key
	}
	return withPeer(pid, cfg.PeerID), key | cancelTTLMask
}

// peerOf returns the peer of cfg's list a cancel request for pid belongs
// to, when that is not this poolerd.
func peerOf(cfg *config.Config, pid uint32) (config.Peer, bool) {
	if cfg.PeerID == 0 {
		return config.Peer{}, false
	}
	id := pidPeer(pid)
	if id == cfg.PeerID {
		return config.Peer{}, false
	}
	for _, p := range cfg.Peers {
		if p.ID == id {
			return p, true
		}
	}
	return config.Peer{}, false
}

// forwardCancel sends a cancel request on to peer, its time to live
// lowered, waiting for its turn among the peer's pool_size requests in
// flight; server_connect_timeout bounds the connect, cancelGrace the
// whole.
func (srv *Server) forwardCancel(cfg *config.Config, peer config.Peer, pid, key uint32) {
	id := strconv.Itoa(peer.ID)
	if key&cancelTTLMask == 0 {
		srv.peering.forwarded.WithLabelValues(id, "ttl_exhausted").Inc()
		srv.log.Info("failed to forward cancel request because its TTL was exhausted", zap.Int("peer_id", peer.ID))
		return
	}
	key--
	size := peer.PoolSize
	if size == 0 {
		size = cfg.MaxSize
	}
	ctx, cancel := context.WithTimeout(srv.ctx, cancelGrace)
	defer cancel()
	s := srv.peering.slot(peer.ID, max(size, 1))
	srv.peering.mu.Lock()
	s.waiting++
	srv.peering.mu.Unlock()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
	}
	srv.peering.mu.Lock()
	s.waiting--
	srv.peering.mu.Unlock()
	if ctx.Err() != nil {
		srv.peering.forwarded.WithLabelValues(id, "failed").Inc()
		srv.log.Warn("cancel request for a peer's client dropped: too many in flight to the peer", zap.Int("peer_id", peer.ID), zap.Int("pool_size", size))
		return
	}
	defer func() { <-s.sem }()
	srv.log.Debug("forwarding cancellation request to peer", zap.Int("peer_id", peer.ID))
	if d := cfg.ServerConnectTimeout; d > 0 && d < cancelGrace {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, d)
		defer c2()
	}
	var k [4]byte
	binary.BigEndian.PutUint32(k[:], key)
	if err := backend.Cancel(ctx, backend.Target{Host: peer.Host, Port: peer.Port}, pid, k[:]); err != nil {
		srv.peering.forwarded.WithLabelValues(id, "failed").Inc()
		srv.log.Warn("forwarding a cancel request to a peer failed", zap.Int("peer_id", peer.ID),
			zap.String("peer", backend.Target{Host: peer.Host, Port: peer.Port}.String()), zap.Error(err))
		return
	}
	srv.peering.forwarded.WithLabelValues(id, "forwarded").Inc()
}
