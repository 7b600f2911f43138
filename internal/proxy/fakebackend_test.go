package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/poolerd/poolerd/internal/wire"
)

// fakeBackend is a minimal in-process PostgreSQL server for benchmarks: it
// speaks just enough of the v3 protocol for poolerd and the benchmark
// client, and as little else as possible, so that a benchmark measures
// poolerd and not the server.
//
//   - Startup: any user and database, trust (AuthenticationOk), a few
//     ParameterStatus, BackendKeyData, ReadyForQuery 'I'. SSLRequest and
//     GSSENCRequest are answered 'N'; a CancelRequest is read and closed.
//   - Query: RowDescription (one text column), one DataRow whose value is
//     size bytes, CommandComplete "SELECT 1", ReadyForQuery 'I', whatever
//     the query says (poolerd's own queries get the same answer), except
//     cutQuery and streamQuery (below).
//   - Parse, Bind, Describe, Execute, Close, Sync, Flush: ParseComplete,
//     BindComplete, (ParameterDescription +) RowDescription, the DataRow and
//     CommandComplete, CloseComplete, ReadyForQuery 'I'; Flush is a no-op
//     (everything is written at the end of each read anyway).
//   - Terminate closes the connection.
//
// Each connection is served by one goroutine that reads into a fixed
// buffer, answers every complete message of the read, and writes all the
// answers of one read with one write: no allocation per message.
type fakeBackend struct {
	ln   net.Listener
	size int

	// Canned answers, built once.
	queryReply, rowDesc, execReply []byte

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	pids   atomic.Uint32
	errs   atomic.Pointer[error] // first protocol error seen, for the harness test
	// onRead, if set (under mu) before the first connection, sees the
	// bytes of each read of a connection after its startup (tests of
	// what poolerd sends).
	onRead func(p []byte)
	// cutQuery, if set (under mu) before the first connection: a Query
	// with this text is answered with its reply cut cutShort bytes before
	// the end of the DataRow, and the connection then ends (a backend
	// dying in the middle of a frame).
	cutQuery []byte
	cutShort int
	// streamQuery, if set (under mu) before the first connection: a Query
	// with this text is answered with a RowDescription and then DataRows
	// without end, until a write fails (a backend sending a large result
	// to a client that does not read it); streamEnded then gets the
	// write's error and the connection ends.
	streamQuery []byte
	streamEnded chan error
	// stallQuery, if set (under mu) before the first connection: after
	// answering a Query with this text the connection reads nothing more
	// until stallRelease is closed (a backend busy with a long query while
	// its client sends more).
	stallQuery   []byte
	stallRelease chan struct{}
}

// startFakeBackend listens on a loopback port and serves until the
// benchmark or test ends.
func startFakeBackend(tb testing.TB, size int) *fakeBackend {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	fb := &fakeBackend{ln: ln, size: size, conns: map[net.Conn]struct{}{}}
	fb.rowDesc = fbRowDescription(nil)
	value := make([]byte, size)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	fb.execReply = fbDataRow(nil, value)
	fb.execReply = wire.AppendCommandComplete(fb.execReply, "SELECT 1")
	fb.queryReply = append(append([]byte(nil), fb.rowDesc...), fb.execReply...)
	fb.queryReply = wire.AppendReadyForQuery(fb.queryReply, wire.TxIdle)
	fb.wg.Add(1)
	go fb.accept()
	tb.Cleanup(fb.Close)
	return fb
}

// Addr is the backend's host:port.
func (fb *fakeBackend) Addr() string { return fb.ln.Addr().String() }

// Err returns the first protocol error any connection ran into.
func (fb *fakeBackend) Err() error {
	if p := fb.errs.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops accepting, closes every connection and waits for their
// goroutines to end. It may be called more than once.
func (fb *fakeBackend) Close() {
	fb.mu.Lock()
	if !fb.closed {
		fb.closed = true
		_ = fb.ln.Close()
		for c := range fb.conns {
			_ = c.Close()
		}
	}
	fb.mu.Unlock()
	fb.wg.Wait()
}

func (fb *fakeBackend) accept() {
	defer fb.wg.Done()
	for {
		c, err := fb.ln.Accept()
		if err != nil {
			return
		}
		fb.mu.Lock()
		if fb.closed {
			fb.mu.Unlock()
			_ = c.Close()
			return
		}
		fb.conns[c] = struct{}{}
		fb.wg.Add(1)
		fb.mu.Unlock()
		go fb.serve(c)
	}
}

func (fb *fakeBackend) fail(err error) {
	fb.errs.CompareAndSwap(nil, &err)
}

func (fb *fakeBackend) serve(c net.Conn) {
	defer fb.wg.Done()
	defer func() {
		_ = c.Close()
		fb.mu.Lock()
		delete(fb.conns, c)
		fb.mu.Unlock()
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if !fb.startup(c) {
		return
	}
	in := make([]byte, 64<<10)
	out := make([]byte, 0, 64<<10)
	r, w := 0, 0
	for {
		n, err := c.Read(in[w:])
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				fb.fail(err)
			}
			return
		}
		if fb.onRead != nil {
			fb.onRead(in[w : w+n])
		}
		w += n
		out = out[:0]
		quit, stall := false, false
		for w-r >= wire.HeaderLen {
			l := int(binary.BigEndian.Uint32(in[r+1:]))
			if l < 4 {
				fb.fail(fmt.Errorf("fake backend: bad length %d", l))
				return
			}
			total := 1 + l
			if w-r < total {
				if total > len(in) {
					grown := make([]byte, total)
					w = copy(grown, in[r:w])
					r, in = 0, grown
				}
				break
			}
			if in[r] == 'Q' && fb.streamQuery != nil && bytes.Equal(bytes.TrimSuffix(in[r+wire.HeaderLen:r+total], []byte{0}), fb.streamQuery) {
				fb.stream(c, out)
				return
			}
			if in[r] == 'Q' && fb.stallQuery != nil && bytes.Equal(bytes.TrimSuffix(in[r+wire.HeaderLen:r+total], []byte{0}), fb.stallQuery) {
				stall = true
			}
			var ok bool
			out, ok = fb.answer(out, in[r], in[r+wire.HeaderLen:r+total])
			r += total
			if !ok {
				quit = true
				break
			}
		}
		if len(out) > 0 {
			if _, err := c.Write(out); err != nil {
				return
			}
		}
		if quit {
			return
		}
		if stall {
			<-fb.stallRelease
		}
		if r == w {
			r, w = 0, 0
		} else if w == len(in) {
			w = copy(in, in[r:w])
			r = 0
		}
	}
}

// stream writes out, a RowDescription and then DataRows until a write
// fails, and reports the failure on streamEnded.
func (fb *fakeBackend) stream(c net.Conn, out []byte) {
	row := fbDataRow(nil, make([]byte, 1000))
	var rows []byte
	for len(rows) < 4<<20 {
		rows = append(rows, row...)
	}
	chunk := append(append(out, fb.rowDesc...), rows...)
	for {
		if _, err := c.Write(chunk); err != nil {
			fb.streamEnded <- err
			return
		}
		chunk = rows
	}
}

// startup runs the startup phase; false ends the connection.
func (fb *fakeBackend) startup(c net.Conn) bool {
	for {
		body, err := wire.ReadStartup(c)
		if err != nil {
			return false
		}
		switch code := binary.BigEndian.Uint32(body); {
		case code == wire.CodeSSL || code == wire.CodeGSSENC:
			if _, err := c.Write([]byte{'N'}); err != nil {
				return false
			}
		case code == wire.CodeCancel:
			return false // nothing runs long enough to cancel
		case code>>16 == 3:
			welcome := wire.AppendAuthOk(nil)
			for _, p := range [][2]string{
				{"application_name", ""},
				{"client_encoding", "UTF8"},
				{"DateStyle", "ISO, MDY"},
				{"integer_datetimes", "on"},
				{"IntervalStyle", "postgres"},
				{"server_encoding", "UTF8"},
				{"server_version", "16.0 (poolerd fake backend)"},
				{"standard_conforming_strings", "on"},
				{"TimeZone", "UTC"},
			} {
				welcome = wire.AppendParameterStatus(welcome, p[0], p[1])
			}
			welcome = wire.AppendBackendKeyData(welcome, fb.pids.Add(1), 0x5eed)
			welcome = wire.AppendReadyForQuery(welcome, wire.TxIdle)
			_, err := c.Write(welcome)
			return err == nil
		default:
			fb.fail(fmt.Errorf("fake backend: startup code %d", code))
			return false
		}
	}
}

// answer appends the reply to one message; false ends the connection.
func (fb *fakeBackend) answer(out []byte, typ byte, body []byte) ([]byte, bool) {
	switch typ {
	case 'Q':
		if fb.cutQuery != nil && bytes.Equal(bytes.TrimSuffix(body, []byte{0}), fb.cutQuery) {
			return append(out, fb.queryReply[:len(fb.rowDesc)+wire.HeaderLen+6+fb.size-fb.cutShort]...), false
		}
		return append(out, fb.queryReply...), true
	case 'P':
		return append(out, '1', 0, 0, 0, 4), true
	case 'B':
		return append(out, '2', 0, 0, 0, 4), true
	case 'D':
		if len(body) > 0 && body[0] == 'S' {
			out = append(out, 't', 0, 0, 0, 6, 0, 0) // no parameters
		}
		return append(out, fb.rowDesc...), true
	case 'E':
		return append(out, fb.execReply...), true
	case 'C':
		return append(out, '3', 0, 0, 0, 4), true
	case 'S':
		return wire.AppendReadyForQuery(out, wire.TxIdle), true
	case 'H':
		return out, true
	case 'X':
		return out, false
	default:
		fb.fail(fmt.Errorf("fake backend: unexpected message %q", typ))
		return out, false
	}
}

// fbRowDescription appends a RowDescription of one text column "x".
func fbRowDescription(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, 'T', 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint16(dst, 1)
	dst = append(dst, "x\x00"...)
	dst = binary.BigEndian.AppendUint32(dst, 0)          // table OID
	dst = binary.BigEndian.AppendUint16(dst, 0)          // column number
	dst = binary.BigEndian.AppendUint32(dst, 25)         // text
	dst = binary.BigEndian.AppendUint16(dst, 0xffff)     // typlen -1
	dst = binary.BigEndian.AppendUint32(dst, 0xffffffff) // typmod -1
	dst = binary.BigEndian.AppendUint16(dst, 0)          // text format
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// fbDataRow appends a DataRow with one column holding value.
func fbDataRow(dst, value []byte) []byte {
	start := len(dst)
	dst = append(dst, 'D', 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint16(dst, 1)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	dst = append(dst, value...)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// benchClient is a raw-protocol client as cheap as it can be: it logs in
// with trust, and each round trip writes one prebuilt request in one write
// and reads until ReadyForQuery into a fixed buffer, looking at nothing but
// frame headers (and the body of an ErrorResponse). No allocation per round
// trip.
type benchClient struct {
	conn    net.Conn
	request []byte
	buf     []byte
	r, w    int
}

// Requests the benchmark client sends.
var (
	// simpleRequest is one simple-protocol Query.
	simpleRequest = wire.AppendQuery(nil, "SELECT x FROM bench")
	// extendedRequest is what pgbench -M extended sends per statement:
	// Parse, Bind, Describe portal, Execute, Sync, all unnamed.
	extendedRequest = func() []byte {
		var b []byte
		b = fbMsg(b, 'P', "\x00SELECT x FROM bench\x00\x00\x00") // name, query, 0 param types
		b = fbMsg(b, 'B', "\x00\x00\x00\x00\x00\x00\x00\x00")    // portal, stmt, 0 formats, 0 params, 0 result formats
		b = fbMsg(b, 'D', "P\x00")                               // describe unnamed portal
		b = fbMsg(b, 'E', "\x00\x00\x00\x00\x00")                // unnamed portal, no row limit
		b = fbMsg(b, 'S', "")                                    // Sync
		return b
	}()
)

func fbMsg(dst []byte, typ byte, body string) []byte {
	dst = append(dst, typ, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(4+len(body)))
	return append(dst, body...)
}

// startupPacket is a protocol 3.0 startup message for user and database
// bench, with the given extra parameters (name, value pairs).
func startupPacket(params ...string) []byte {
	startup := binary.BigEndian.AppendUint32(nil, 0)
	startup = binary.BigEndian.AppendUint32(startup, wire.CodeProtocol30)
	for _, p := range append([]string{"user", "bench", "database", "bench"}, params...) {
		startup = append(append(startup, p...), 0)
	}
	startup = append(startup, 0)
	binary.BigEndian.PutUint32(startup, uint32(len(startup)))
	return startup
}

// dialBench connects to addr and logs in as bench to database bench.
func dialBench(tb testing.TB, addr string, request []byte) *benchClient {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	_ = conn.(*net.TCPConn).SetNoDelay(true)
	c := &benchClient{conn: conn, request: request, buf: make([]byte, 64<<10)}
	tb.Cleanup(c.close)
	if _, err := conn.Write(startupPacket()); err != nil {
		tb.Fatal(err)
	}
	if err := c.readUntilReady(); err != nil {
		tb.Fatalf("login: %v", err)
	}
	return c
}

// dialBenches logs n clients in, each sending request.
func dialBenches(tb testing.TB, addr string, n int, request []byte) []*benchClient {
	tb.Helper()
	clients := make([]*benchClient, n)
	for i := range clients {
		clients[i] = dialBench(tb, addr, request)
	}
	return clients
}

func (c *benchClient) close() {
	_, _ = c.conn.Write(wire.AppendTerminate(nil))
	_ = c.conn.Close()
}

// roundTrip sends the request and waits for its ReadyForQuery.
func (c *benchClient) roundTrip() error {
	if _, err := c.conn.Write(c.request); err != nil {
		return err
	}
	return c.readUntilReady()
}

// readUntilReady reads messages until a ReadyForQuery has been read whole.
// Authentication requests other than AuthenticationOk are errors (the
// benchmarks use trust).
func (c *benchClient) readUntilReady() error {
	skip := 0 // body bytes of the current message not yet read
	ready := false
	for {
		for {
			if skip > 0 {
				k := min(skip, c.w-c.r)
				c.r += k
				skip -= k
				if skip > 0 {
					break
				}
			}
			if ready {
				if c.r != c.w {
					return errors.New("bytes after ReadyForQuery")
				}
				c.r, c.w = 0, 0
				return nil
			}
			if c.w-c.r < wire.HeaderLen {
				break
			}
			typ := c.buf[c.r]
			l := int(binary.BigEndian.Uint32(c.buf[c.r+1:])) - 4
			switch typ {
			case 'E':
				if c.w-c.r-wire.HeaderLen >= l {
					_, code, msg := wire.ErrorFields(c.buf[c.r+wire.HeaderLen : c.r+wire.HeaderLen+l])
					return fmt.Errorf("server error %s: %s", code, msg)
				}
				return errors.New("server error (truncated)")
			case 'R':
				if c.w-c.r-wire.HeaderLen >= 4 && binary.BigEndian.Uint32(c.buf[c.r+wire.HeaderLen:]) != 0 {
					return errors.New("server asks for a password; the benchmarks use trust")
				}
			case 'Z':
				ready = true
			}
			c.r += wire.HeaderLen
			skip = l
		}
		// Keep a partial header; bodies are skipped, never kept.
		if c.r > 0 {
			c.w = copy(c.buf, c.buf[c.r:c.w])
			c.r = 0
		}
		n, err := c.conn.Read(c.buf[c.w:])
		if err != nil {
			return err
		}
		c.w += n
	}
}

// roundTripsAtOnce runs rounds round trips on every client, the clients at
// once, and returns the first error.
func roundTripsAtOnce(clients []*benchClient, rounds int) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(clients))
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := c.roundTrip(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
