package limiter

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/redistest"
)

// benchRequest returns a request of n buckets that stays allowed (the
// limits are far above what a benchmark reaches), so that every decision
// does the full work: lookups and stores.
func benchRequest(key string, n int) Request {
	names := []string{"queries", "transactions", "connections", "bytes"}
	req := Request{Key: key}
	for i := range n {
		// 460µs per unit, but a burst of 2^36: each decision leaves a
		// TAT in the future, so state is never evicted (as in steady
		// state), yet a benchmark never runs out of capacity.
		req.Buckets = append(req.Buckets, Bucket{Name: names[i%len(names)], Limit: 1 << 36, Per: MaxPer})
	}
	return req
}

func BenchmarkMemoryAllow(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			m := NewMemory(MemoryOptions{})
			req := benchRequest("rule|user=alice", n)
			b.ReportAllocs()
			for b.Loop() {
				if d, err := m.Allow(ctx, req); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
	}
	b.Run("buckets=3/denied", func(b *testing.B) {
		m := NewMemory(MemoryOptions{})
		req := benchRequest("rule|user=alice", 3)
		req.Buckets[2].Limit, req.Buckets[2].Per = 1, time.Hour
		m.Allow(ctx, req)
		b.ReportAllocs()
		for b.Loop() {
			if d, err := m.Allow(ctx, req); err != nil || d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
}

// BenchmarkMemoryAllowParallel measures contention: every goroutine on one
// key (one shard, the worst case), or spread over 1024 keys.
func BenchmarkMemoryAllowParallel(b *testing.B) {
	ctx := context.Background()
	for _, keys := range []int{1, 1024} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			m := NewMemory(MemoryOptions{})
			reqs := make([]Request, keys)
			for i := range reqs {
				reqs[i] = benchRequest(fmt.Sprint("rule|user=", i), 3)
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(7919)) // spread goroutines over the keys
				for pb.Next() {
					i++
					if _, err := m.Allow(ctx, reqs[i%keys]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkRedisAllow measures a decision against a redis-server on
// loopback: one EVALSHA round trip.
func BenchmarkRedisAllow(b *testing.B) {
	srv := redistest.StartTB(b)
	c := srv.Client()
	defer c.Close()
	l := NewRedis(c, RedisOptions{Timeout: time.Second})
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			req := benchRequest("rule|user=alice", n)
			b.ReportAllocs()
			for b.Loop() {
				if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
	}
	b.Run("buckets=3/parallel", func(b *testing.B) {
		var next atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req := benchRequest(fmt.Sprint("rule|user=", next.Add(1)), 3)
			for pb.Next() {
				if _, err := l.Allow(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
