package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/cpustat"
)

// benchSizes are the message body sizes of the frame benchmarks: a
// CommandComplete or ReadyForQuery-sized message, a small row, a wide row,
// and a message longer than half a pooled read buffer (so frames straddle
// reads).
var benchSizes = []int{16, 128, 1024, 8192}

// benchTCPPair returns the two ends of a loopback TCP connection, closed
// when the benchmark ends.
func benchTCPPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	accepted := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		accepted <- res{c, err}
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	r := <-accepted
	if r.err != nil {
		client.Close()
		tb.Fatal(r.err)
	}
	server = r.c
	tb.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// appendFrame appends one frame of type typ whose body is body.
func appendFrame(dst []byte, typ byte, body []byte) []byte {
	dst = append(dst, typ, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(4+len(body)))
	return append(dst, body...)
}

// frameWriter writes n frames of body size size to w, framing them into a
// reused batch buffer of about 64 KiB (the way the relay batches what one
// read brought), and reports the first error.
func frameWriter(w io.Writer, n, size int, done chan<- error) {
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	per := max(1, (64<<10)/(HeaderLen+size))
	batch := make([]byte, 0, per*(HeaderLen+size))
	for n > 0 {
		k := min(n, per)
		batch = batch[:0]
		for range k {
			batch = appendFrame(batch, 'D', body)
		}
		if _, err := w.Write(batch); err != nil {
			done <- err
			return
		}
		n -= k
	}
	done <- nil
}

// BenchmarkFrames measures the frame reader over loopback TCP: a writer
// goroutine frames b.N messages of the given body size and writes them in
// batches; the reader reads them with ConnReader (into buffers borrowed
// from a BufferPool inside the poller's callback) and walks them with a
// Cursor, as the relay does. One op is one message; bytes/s counts header
// and body; allocs/op counts the whole process (writer included) and is 0
// in steady state.
func BenchmarkFrames(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			client, server := benchTCPPair(b)
			pool := NewBufferPool(BufferSize)
			rd, err := NewConnReader(server, pool)
			if err != nil {
				b.Fatal(err)
			}
			fr := &frameReader{rd: rd, pool: pool}
			// Warm up: the pool's first buffer, the connection's poller
			// registration, the writer's batch buffer.
			done := make(chan error, 1)
			go frameWriter(client, 64, size, done)
			if got, err := fr.readFrames(64); err != nil || got != 64 {
				b.Fatalf("warm-up: %d frames, %v", got, err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}

			b.SetBytes(int64(HeaderLen + size))
			b.ReportAllocs()
			fr.reads = 0
			cpu0 := cpustat.Process()
			b.ResetTimer()
			go frameWriter(client, b.N, size, done)
			got, err := fr.readFrames(b.N)
			b.StopTimer()
			if err != nil || got != b.N {
				b.Fatalf("read %d of %d frames: %v", got, b.N, err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(b.N)/float64(max(fr.reads, 1)), "msgs/read")
			reportCPU(b, cpu0)
		})
	}
}

// reportCPU reports the process's CPU time per op since cpu0: on a shared
// machine it is steadier than ns/op, which also counts time spent waiting
// for a CPU.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu := cpustat.Process() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// frameReader reads frames the way the relay does: a header split across
// two reads is kept (at most HeaderLen-1 bytes) and put back in the
// headroom in front of the next read.
type frameReader struct {
	rd     *ConnReader
	pool   *BufferPool
	cur    Cursor
	carry  [HeaderLen]byte
	ncarry int
	reads  int // successful reads so far
}

// readFrames reads until want frames have ended, capturing the body of
// every frame of type 'Z' (as the relay inspects ReadyForQuery).
func (fr *frameReader) readFrames(want int) (int, error) {
	got := 0
	cur := &fr.cur
	for got < want {
		bp, n, err := fr.rd.Read()
		if err != nil {
			return got, err
		}
		fr.reads++
		start := Headroom
		if fr.ncarry > 0 {
			start -= fr.ncarry
			copy((*bp)[start:], fr.carry[:fr.ncarry])
			fr.ncarry = 0
		}
		p := (*bp)[start : Headroom+n]
		for len(p) > 0 || cur.Ending() {
			k, ev, err := cur.Next(p)
			if err != nil {
				fr.pool.Put(bp)
				return got, err
			}
			switch ev {
			case EvPartial:
				fr.ncarry = copy(fr.carry[:], p)
				k = len(p)
			case EvHeader:
				if cur.Type == 'Z' {
					cur.Capture(1)
				}
			case EvEnd:
				got++
			}
			p = p[k:]
		}
		fr.pool.Put(bp)
	}
	return got, nil
}

// BenchmarkCursor walks a buffer of frames in memory: the Cursor's own cost
// per message, without system calls.
func BenchmarkCursor(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			body := make([]byte, size)
			per := max(1, BufferSize/(HeaderLen+size))
			var chunk []byte
			for range per {
				chunk = appendFrame(chunk, 'D', body)
			}
			var cur Cursor
			b.SetBytes(int64(HeaderLen + size))
			b.ReportAllocs()
			cpu0 := cpustat.Process()
			b.ResetTimer()
			for n := 0; n < b.N; {
				p := chunk
				for len(p) > 0 || cur.Ending() {
					k, ev, err := cur.Next(p)
					if err != nil {
						b.Fatal(err)
					}
					if ev == EvEnd {
						n++
					}
					p = p[k:]
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			reportCPU(b, cpu0)
		})
	}
}
