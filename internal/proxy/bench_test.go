package proxy

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
	"github.com/poolerd/poolerd/test/cpustat"
)

// The relay benchmarks run everything in one process over loopback TCP: a
// raw-protocol client (benchClient), poolerd (a Server in transaction mode)
// and a minimal fake PostgreSQL (fakeBackend). One op is one round trip: a
// request written by the client, relayed to the backend, answered, relayed
// back, read by the client up to ReadyForQuery.
//
// Read the numbers this way:
//   - ns/op is the round-trip latency. With -cpu 1 everything shares one
//     core and a loopback write runs the receiver's network stack in the
//     writer's system call, so ns/op is close to the CPU time per round trip
//     of client + poolerd + backend together; cpu-ns/op (getrusage of the
//     process) says how close.
//   - poolerd's own cost per round trip is BenchmarkRelay minus
//     BenchmarkDirect (the same client and backend, no poolerd) at the same
//     size and -cpu.
//   - allocs/op and B/op are those of the whole process. The client and the
//     fake backend allocate nothing per round trip, so they are poolerd's.
//
// Sizes are the size of the one column value in the DataRow of each reply.
var relaySizes = []int{16, 128, 1024, 8192}

// relay is a poolerd instance in front of a fake backend.
type relay struct {
	srv  *Server
	addr string
}

// startRelay starts poolerd in transaction mode with a pool of poolSize
// server connections to fb, all opened before it returns, and client
// authentication trust. It is shut down when the benchmark ends (after the
// clients, which were registered later, have closed).
//
// Everything else is poolerd's default configuration, leak detection
// included, except what would make a long benchmark measure something other
// than the steady state: no recycling by max_queries or max_lifetime and no
// idle_timeout. Metrics are registered (on a private registry), as
// cmd/poolerd does; logging is off. mutate, if any, adjusts the
// configuration before it is validated (tests of other modes).
func startRelay(tb testing.TB, fb *fakeBackend, poolSize int, mutate ...func(*config.Config)) *relay {
	tb.Helper()
	return startRelayLog(tb, fb, poolSize, zap.NewNop(), mutate...)
}

// startRelayLog is startRelay logging to log.
func startRelayLog(tb testing.TB, fb *fakeBackend, poolSize int, log *zap.Logger, mutate ...func(*config.Config)) *relay {
	tb.Helper()
	return startRelayWith(tb, fb, poolSize, log, nil, mutate...)
}

// startRelayWith is startRelayLog with before, if not nil, called on the
// server before it serves (to set its test hooks).
func startRelayWith(tb testing.TB, fb *fakeBackend, poolSize int, log *zap.Logger, before func(*Server), mutate ...func(*config.Config)) *relay {
	tb.Helper()
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = "postgres://bench:bench@" + fb.Addr() + "/bench"
	cfg.AuthType = config.AuthTrust
	cfg.MaxSize = poolSize
	cfg.MinSize = poolSize
	cfg.MaxQueries = 0
	cfg.MaxLifetime = 0
	cfg.IdleTimeout = 0
	cfg.LogConnections = false
	cfg.LogDisconnections = false
	cfg.LogStats = false
	for _, m := range mutate {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatalf("benchmark configuration: %v", err)
	}
	srv := New(&cfg, log)
	if err := srv.Instrument(prometheus.NewRegistry()); err != nil {
		tb.Fatal(err)
	}
	if before != nil {
		before(srv)
	}
	srv.Warm()
	addr := serve(tb, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitWarm(ctx, 3); err != nil {
		tb.Fatalf("pool warm-up: %v", err)
	}
	return &relay{srv: srv, addr: addr}
}

// warmup is how many round trips each client makes before the clock starts:
// buffers, the pool's idle list and the scheduler settle.
const warmup = 200

// runSerial times b.N round trips of one client.
func runSerial(b *testing.B, c *benchClient) {
	for range warmup {
		if err := c.roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	cpu0 := cpustat.Process()
	b.ResetTimer()
	for range b.N {
		if err := c.roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRoundTrips(b, cpu0)
}

// runParallel times b.N round trips shared by the clients, each client in
// its own goroutine making one round trip after another.
func runParallel(b *testing.B, clients []*benchClient) {
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	run := func(n *atomic.Int64) {
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n.Add(-1) >= 0 {
					if err := c.roundTrip(); err != nil {
						e := err // only the failing iteration's error escapes
						firstErr.CompareAndSwap(nil, &e)
						n.Store(0)
						return
					}
				}
			}()
		}
		wg.Wait()
		if p := firstErr.Load(); p != nil {
			b.Fatal(*p)
		}
	}
	var n atomic.Int64
	n.Store(int64(warmup * len(clients)))
	run(&n)
	b.ReportAllocs()
	n.Store(int64(b.N))
	cpu0 := cpustat.Process()
	b.ResetTimer()
	run(&n)
	b.StopTimer()
	reportRoundTrips(b, cpu0)
}

func reportRoundTrips(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
	if cpu := cpustat.Process() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkDirect is the baseline: the client talks to the fake backend
// with no poolerd in between. One op is one simple-Query round trip.
func BenchmarkDirect(b *testing.B) {
	for _, size := range relaySizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			fb := startFakeBackend(b, size)
			runSerial(b, dialBench(b, fb.Addr(), simpleRequest))
		})
	}
}

// BenchmarkRelay measures one client through poolerd (transaction mode,
// pool of 4): every round trip checks a server connection out of the pool
// and back in. One op is one simple-Query round trip; compare with
// BenchmarkDirect at the same size and -cpu. allocs/op are the whole
// process's, which here means poolerd's (the client and the backend
// allocate nothing per round trip).
func BenchmarkRelay(b *testing.B) {
	for _, size := range relaySizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			fb := startFakeBackend(b, size)
			rl := startRelay(b, fb, 4)
			runSerial(b, dialBench(b, rl.addr, simpleRequest))
		})
	}
}

// BenchmarkDirectExtended is BenchmarkDirect with the extended protocol:
// Parse, Bind, Describe, Execute, Sync per round trip (pgbench -M extended).
func BenchmarkDirectExtended(b *testing.B) {
	b.Run("size=128", func(b *testing.B) {
		fb := startFakeBackend(b, 128)
		runSerial(b, dialBench(b, fb.Addr(), extendedRequest))
	})
}

// BenchmarkRelayExtended is BenchmarkRelay with the extended protocol
// (unnamed statements, which poolerd passes through).
func BenchmarkRelayExtended(b *testing.B) {
	b.Run("size=128", func(b *testing.B) {
		fb := startFakeBackend(b, 128)
		rl := startRelay(b, fb, 4)
		runSerial(b, dialBench(b, rl.addr, extendedRequest))
	})
}

// parallelShapes are the client and pool counts of the parallel benchmarks.
var parallelShapes = []struct{ clients, pool int }{{16, 4}, {64, 4}}

// BenchmarkRelayParallel measures throughput with many clients over a small
// pool: each client makes one round trip after another in its own
// goroutine, and clients queue for the pool's server connections. Run it
// with -cpu 1,2 to see how poolerd uses a second core (client, poolerd and
// backend all share the GOMAXPROCS cores). rt/s is the figure of merit;
// ns/op is wall time divided by round trips (1e9 / rt/s).
func BenchmarkRelayParallel(b *testing.B) {
	for _, sh := range parallelShapes {
		b.Run(fmt.Sprintf("clients=%d/pool=%d/size=128", sh.clients, sh.pool), func(b *testing.B) {
			fb := startFakeBackend(b, 128)
			rl := startRelay(b, fb, sh.pool)
			clients := make([]*benchClient, sh.clients)
			for i := range clients {
				clients[i] = dialBench(b, rl.addr, simpleRequest)
			}
			runParallel(b, clients)
		})
	}
}

// BenchmarkRelayParallelCalls is BenchmarkRelayParallel with a request
// that calls a function of the application's (callRequest): such a
// function may set the role, so a server connection that changes hands
// gets RESET ROLE ahead of the next client's request (pipelined, answer
// swallowed). The difference to BenchmarkRelayParallel is its cost.
func BenchmarkRelayParallelCalls(b *testing.B) {
	sh := parallelShapes[0]
	b.Run(fmt.Sprintf("clients=%d/pool=%d/size=128", sh.clients, sh.pool), func(b *testing.B) {
		fb := startFakeBackend(b, 128)
		rl := startRelay(b, fb, sh.pool)
		clients := make([]*benchClient, sh.clients)
		for i := range clients {
			clients[i] = dialBench(b, rl.addr, callRequest)
		}
		runParallel(b, clients)
	})
}

// BenchmarkDirectParallel is the baseline of BenchmarkRelayParallel: the
// same clients straight to the fake backend (one backend connection each).
func BenchmarkDirectParallel(b *testing.B) {
	for _, sh := range parallelShapes {
		b.Run(fmt.Sprintf("clients=%d/size=128", sh.clients), func(b *testing.B) {
			fb := startFakeBackend(b, 128)
			clients := make([]*benchClient, sh.clients)
			for i := range clients {
				clients[i] = dialBench(b, fb.Addr(), simpleRequest)
			}
			runParallel(b, clients)
		})
	}
}

// TestBenchHarness checks the benchmarks' fake backend, client and relay
// setup with a few round trips of each kind (go test runs it; the
// benchmarks themselves run only with -bench), and that tearing them down
// leaves no goroutine behind.
func TestBenchHarness(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) }) // runs last
	const size = 1000
	fb := startFakeBackend(t, size)
	t.Cleanup(func() {
		if err := fb.Err(); err != nil {
			t.Errorf("fake backend: %v", err)
		}
	})
	rl := startRelay(t, fb, 2)
	for _, tc := range []struct {
		name, addr string
		request    []byte
	}{
		{"direct/simple", fb.Addr(), simpleRequest},
		{"direct/extended", fb.Addr(), extendedRequest},
		{"relay/simple", rl.addr, simpleRequest},
		{"relay/extended", rl.addr, extendedRequest},
	} {
		c := dialBench(t, tc.addr, tc.request)
		for i := range 50 {
			if err := c.roundTrip(); err != nil {
				t.Fatalf("%s: round trip %d: %v", tc.name, i, err)
			}
		}
	}
	// Several clients over a smaller pool: they queue for the servers.
	if err := roundTripsAtOnce(dialBenches(t, rl.addr, 8, simpleRequest), 50); err != nil {
		t.Fatalf("parallel relay: %v", err)
	}
	if st := rl.srv.Pools(); len(st) != 1 || st[0].Total > 2 {
		t.Fatalf("pools: %+v", st)
	}
}

// BenchmarkIdleClients measures what an idle, logged-in client costs
// poolerd: live heap and goroutine stack per client (runtime.MemStats after
// a GC, before and after opening them), with the idle clients parked as
// they are in production. The client side of the connections (in the same
// process) is included in heap-B/client: each is a net.Conn and its
// netFD, about 0.4 KB. One op opens and closes 1,000 clients.
func BenchmarkIdleClients(b *testing.B) {
	fb := startFakeBackend(b, 16)
	rl := startRelay(b, fb, 2)
	const n = 1000
	var heap, stack, objects float64
	for b.Loop() {
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		clients := make([]net.Conn, n)
		for i := range clients {
			clients[i] = dialIdle(b, rl.addr)
		}
		if runtime.GOOS == "linux" {
			deadline := time.Now().Add(10 * time.Second)
			for rl.srv.ParkedClients() < n && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&ms1)
		heap += float64(ms1.HeapAlloc) - float64(ms0.HeapAlloc)
		stack += float64(ms1.StackInuse) - float64(ms0.StackInuse)
		objects += float64(ms1.HeapObjects) - float64(ms0.HeapObjects)
		for _, c := range clients {
			_, _ = c.Write(wire.AppendTerminate(nil))
			_ = c.Close()
		}
		for rl.srv.clientSessions() > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	per := float64(b.N) * n
	b.ReportMetric(heap/per, "heap-B/client")
	b.ReportMetric(stack/per, "stack-B/client")
	b.ReportMetric(objects/per, "objects/client")
}

// dialIdle logs a client in (trust) with no buffers of its own kept.
func dialIdle(tb testing.TB, addr string) net.Conn {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Write(startupPacket("application_name", "bench")); err != nil {
		tb.Fatal(err)
	}
	var buf [1024]byte
	got := 0
	for got < 6 || buf[got-6] != 'Z' {
		k, err := conn.Read(buf[got:])
		if err != nil {
			tb.Fatalf("login: %v", err)
		}
		got += k
	}
	return conn
}
