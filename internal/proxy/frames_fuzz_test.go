package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// FuzzSessionFrames writes arbitrary bytes, as frontend messages, on a
// logged-in client connection of a poolerd (transaction mode) in front of
// an in-process fake PostgreSQL (frameBackend), then half-closes the
// connection. Whatever the bytes (Query, Parse/Bind/Describe/Execute/Sync,
// COPY in both directions, FunctionCall, malformed lengths, unknown types,
// frames cut short), poolerd must not panic, must end the connection
// within a few seconds (no deadlock), and must send the client nothing but
// whole, well-formed backend messages; an ErrorResponse carries a severity
// and a SQLSTATE, and a frame poolerd cannot accept (a length under 4, a
// type no client may send) is answered with one before the connection
// ends. After each input a second client, logged in before the fuzzing
// started, still gets its answer: no input leaves a server connection in
// the pool in a state that breaks the next client.
func FuzzSessionFrames(f *testing.F) {
	fb := startFrameBackend(f)
	const maxPacket = 1 << 20
	cfg := unreachableConfig(f, func(c *config.Config) {
		c.Upstream = "postgres://fuzz:fuzz@" + fb.addr() + "/fuzz"
		c.AuthType = config.AuthTrust
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 2
		c.MaxPacketSize = maxPacket
		c.LogConnections = false
		c.LogDisconnections = false
		c.LogStats = false
	})
	srv := New(cfg, zap.NewNop())
	addr := serve(f, srv)
	probe := dialFrames(f, addr)

	q := func(sql string) []byte { return wire.AppendQuery(nil, sql) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	parse := func(name, sql string) []byte { return fbMsg(nil, 'P', name+"\x00"+sql+"\x00\x00\x00") }
	bind := func(portal, stmt string) []byte {
		return fbMsg(nil, 'B', portal+"\x00"+stmt+"\x00\x00\x00\x00\x01\x00\x00\x00\x01x\x00\x00")
	}
	describe := func(kind byte, name string) []byte { return fbMsg(nil, 'D', string(kind)+name+"\x00") }
	execute := func(portal string) []byte { return fbMsg(nil, 'E', portal+"\x00\x00\x00\x00\x00") }
	sync := fbMsg(nil, 'S', "")
	copyData := func(s string) []byte { return fbMsg(nil, 'd', s) }
	copyDone := fbMsg(nil, 'c', "")
	for _, seed := range [][]byte{
		q("SELECT 1"),
		cat(q("BEGIN"), q("SELECT 1"), q("COMMIT")),
		cat(q("BEGIN"), q("SELECT 1")), // left open: poolerd must not hand the server on
		cat(parse("", "SELECT $1"), bind("", ""), describe('P', ""), execute(""), sync),
		cat(parse("s1", "SELECT $1"), describe('S', "s1"), sync, bind("p1", "s1"), execute("p1"), fbMsg(nil, 'C', "Ss1\x00"), sync),
		cat(bind("", "never_prepared"), execute(""), sync, q("SELECT 2")),
		cat(parse("", "SELECT 1"), fbMsg(nil, 'H', ""), bind("", ""), execute(""), sync),
		cat(q("COPY t FROM STDIN"), copyData("1\tone\n"), copyData("2\ttwo\n"), copyDone, q("SELECT 3")),
		cat(q("COPY t FROM STDIN"), copyData("1\n"), fbMsg(nil, 'f', "client gave up\x00"), q("SELECT 4")),
		cat(q("COPY t FROM STDIN"), copyData("1\n")), // the client leaves in the middle of a COPY
		cat(q("COPY t TO STDOUT"), q("SELECT 5")),
		cat(parse("", "COPY t FROM STDIN"), bind("", ""), execute(""), copyData("7\n"), copyDone, sync),
		cat(copyData("stray"), copyDone, q("SELECT 6")), // COPY messages with no COPY in progress
		fbMsg(nil, 'F', "\x00\x00\x04\xd2\x00\x00\x00\x00\x00\x00"),
		cat(q("SELECT 1"), fbMsg(nil, 'X', "")),
		{'Q', 0, 0, 0, 2, 'x'},                      // length under 4
		{'Q', 0, 0, 0, 0},                           // length 0
		{'Q', 0xff, 0xff, 0xff, 0xff, 'x'},          // length far over max_packet_size
		{'Q', 0, 0, 0x10, 0, 'S', 'E'},              // a frame cut short
		cat(q("SELECT 1"), []byte{'Q', 0, 0, 0}),    // a header cut short
		cat(q("SELECT 1"), []byte{'z', 0, 0, 0, 4}), // a type no client sends
		cat(fbMsg(nil, 'p', "secret\x00"), q("SELECT 1")),
		cat(fbMsg(nil, 'B', "\x00\x00\x00\x05"), sync), // a Bind whose counts run past its end
		{},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := dialFrames(t, addr).conn
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		// The write may fail when poolerd has already refused the input
		// and closed; what it answered is still there to read.
		_, _ = c.Write(data)
		// Read the answers to the requests the input holds, until their
		// ReadyForQuery or a quiet moment (a COPY or a cut frame waits
		// for more), then close the client's side: poolerd must end the
		// session and close.
		owed, bad := owedReady(data, maxPacket)
		got := readAnswers(c, owed)
		_ = c.(*net.TCPConn).CloseWrite()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		rest, err := io.ReadAll(c)
		got = append(got, rest...)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection did not end within 2 s after the client closed its side (answered %q)", trim(got))
		}
		errs, ready, err := checkBackendFrames(got)
		if err != nil {
			t.Fatalf("answer %q: %v", trim(got), err)
		}
		if ready > owed {
			t.Fatalf("%d ReadyForQuery for %d requests (Query, Sync, FunctionCall): answer %q", ready, owed, trim(got))
		}
		if bad != "" && errs == 0 {
			t.Fatalf("input with %s: the connection ended without an ErrorResponse (answered %q)", bad, trim(got))
		}
		_ = probe.conn.SetDeadline(time.Now().Add(2 * time.Second))
		if err := probe.roundTrip(); err != nil {
			t.Fatalf("after this input another client's query failed: %v", err)
		}
	})
}

// dialFrames logs a client in to poolerd at addr (trust) and returns its
// connection, read up to the first ReadyForQuery.
func dialFrames(tb testing.TB, addr string) *benchClient {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	c := &benchClient{conn: conn, request: wire.AppendQuery(nil, "SELECT 1"), buf: make([]byte, 16<<10)}
	tb.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(rawStartup(wire.CodeProtocol30, "user", "fuzz", "database", "fuzz")); err != nil {
		tb.Fatal(err)
	}
	if err := c.readUntilReady(); err != nil {
		tb.Fatalf("login: %v", err)
	}
	_ = conn.SetDeadline(time.Time{})
	return c
}

// trim shortens an answer for a failure message.
func trim(b []byte) []byte {
	if len(b) > 400 {
		return b[:400]
	}
	return b
}

// readAnswers reads from c until the answer holds owed ReadyForQuery
// messages, the connection ends, or nothing arrives for 50 ms.
func readAnswers(c net.Conn, owed int) []byte {
	var got []byte
	buf := make([]byte, 16<<10)
	for ready := 0; ready < owed; {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
		ready = 0
		for off := 0; len(got)-off >= wire.HeaderLen; {
			l := int(binary.BigEndian.Uint32(got[off+1:]))
			if l < 4 || len(got)-off-1 < l {
				break
			}
			if got[off] == 'Z' {
				ready++
			}
			off += 1 + l
		}
	}
	return got
}

// checkBackendFrames checks that b is a sequence of whole backend messages
// of known types, each ErrorResponse with a severity and a five-character
// SQLSTATE. It returns the number of ErrorResponses and ReadyForQuery.
func checkBackendFrames(b []byte) (errs, ready int, err error) {
	for off := 0; off < len(b); {
		if len(b)-off < wire.HeaderLen {
			return errs, ready, fmt.Errorf("%d bytes at offset %d are not a whole message header", len(b)-off, off)
		}
		typ, l := b[off], int(binary.BigEndian.Uint32(b[off+1:]))
		if !strings.ContainsRune("RKSZTDCEN I123ntsGHWdcAVv", rune(typ)) || typ == ' ' {
			return errs, ready, fmt.Errorf("message type %q at offset %d is not a backend message", typ, off)
		}
		if l < 4 || len(b)-off-1 < l {
			return errs, ready, fmt.Errorf("message %q at offset %d: length %d, %d bytes left", typ, off, l, len(b)-off-1)
		}
		if typ == 'Z' {
			ready++
		}
		if typ == 'E' {
			errs++
			severity, code, msg := wire.ErrorFields(b[off+wire.HeaderLen : off+1+l])
			if severity == "" || len(code) != 5 || msg == "" {
				return errs, ready, fmt.Errorf("ErrorResponse at offset %d without severity, SQLSTATE or message: %q %q %q", off, severity, code, msg)
			}
		}
		off += 1 + l
	}
	return errs, ready, nil
}

// owedReady walks data as frontend messages up to the end, a Terminate,
// a frame cut short or the first frame poolerd must refuse. It returns how
// many ReadyForQuery the whole frames before that can earn at most (one
// per Query, Sync and FunctionCall), and describes the frame to refuse (a
// length under 4 or far past max_packet_size, a type no client may send),
// "" if there is none.
func owedReady(data []byte, maxPacket int) (owed int, bad string) {
	for off := 0; len(data)-off >= wire.HeaderLen; {
		typ, l := data[off], int64(binary.BigEndian.Uint32(data[off+1:]))
		switch {
		case l < 4:
			return owed, fmt.Sprintf("length %d at offset %d", l, off)
		case !isFrontendType(typ):
			return owed, fmt.Sprintf("type %q at offset %d", typ, off)
		case l > 2*int64(maxPacket):
			return owed, fmt.Sprintf("length %d over max_packet_size at offset %d", l, off)
		case typ == 'X', int64(len(data)-off-1) < l:
			return owed, ""
		case typ == 'Q', typ == 'S', typ == 'F':
			owed++
		}
		off += int(1 + l)
	}
	return owed, ""
}

// frameBackend is a fake PostgreSQL for FuzzSessionFrames, written with
// pgproto3 and closer to the real server than the benchmarks' fakeBackend:
// trust login, ParameterStatus, BackendKeyData; simple queries (BEGIN,
// COMMIT and ROLLBACK move the transaction status, COPY ... FROM STDIN and
// TO STDOUT run a COPY, anything else returns one row); the extended
// protocol with named statements and portals (an unknown name is an error,
// and messages are then skipped until Sync, as PostgreSQL does);
// FunctionCall; COPY messages outside a COPY are ignored, and any other
// message during a COPY, like anything pgproto3 cannot decode, ends the
// connection with FATAL 08P01.
type frameBackend struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startFrameBackend(tb testing.TB) *frameBackend {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	fb := &frameBackend{ln: ln, conns: map[net.Conn]struct{}{}}
	fb.wg.Add(1)
	go fb.accept()
	tb.Cleanup(func() {
		_ = ln.Close()
		fb.mu.Lock()
		for c := range fb.conns {
			_ = c.Close()
		}
		fb.mu.Unlock()
		fb.wg.Wait()
	})
	return fb
}

func (fb *frameBackend) addr() string { return fb.ln.Addr().String() }

func (fb *frameBackend) accept() {
	defer fb.wg.Done()
	for pid := uint32(1); ; pid++ {
		c, err := fb.ln.Accept()
		if err != nil {
			return
		}
		fb.mu.Lock()
		fb.conns[c] = struct{}{}
		fb.wg.Add(1)
		fb.mu.Unlock()
		go func() {
			defer fb.wg.Done()
			_ = (&frameConn{conn: c, be: pgproto3.NewBackend(c, c), pid: pid}).serve()
			_ = c.Close()
			fb.mu.Lock()
			delete(fb.conns, c)
			fb.mu.Unlock()
		}()
	}
}

// frameConn is one connection of a frameBackend.
type frameConn struct {
	conn net.Conn
	be   *pgproto3.Backend
	pid  uint32

	tx       byte              // transaction status: 'I', 'T' or 'E'
	copying  int               // 0, or 1 for a simple COPY FROM STDIN, 2 for an extended one
	skipping bool              // after an error in the extended protocol, until Sync
	stmts    map[string]string // prepared statements: name -> query
	portals  map[string]string // portals: name -> query
}

// serve runs the connection until the client leaves or breaks the protocol.
func (c *frameConn) serve() error {
	c.be.SetMaxBodyLen(4 << 20)
	if err := c.startup(); err != nil {
		return err
	}
	c.tx, c.stmts, c.portals = 'I', map[string]string{}, map[string]string{}
	for {
		msg, err := c.be.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return c.fatal(fmt.Sprintf("invalid frontend message: %v", err))
		}
		if _, ok := msg.(*pgproto3.Terminate); ok {
			return nil
		}
		if err := c.handle(msg); err != nil {
			return err
		}
		if err := c.be.Flush(); err != nil {
			return fmt.Errorf("fake backend: flush: %w", err)
		}
	}
}

func (c *frameConn) startup() error {
	for {
		msg, err := c.be.ReceiveStartupMessage()
		if err != nil {
			return fmt.Errorf("fake backend: startup: %w", err)
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.conn.Write([]byte{'N'}); err != nil {
				return fmt.Errorf("fake backend: %w", err)
			}
		case *pgproto3.StartupMessage:
			c.be.Send(&pgproto3.AuthenticationOk{})
			for _, p := range [][2]string{{"client_encoding", "UTF8"}, {"DateStyle", "ISO, MDY"},
				{"server_version", "16.0 (poolerd frame fuzz backend)"}, {"standard_conforming_strings", "on"}, {"TimeZone", "UTC"}} {
				c.be.Send(&pgproto3.ParameterStatus{Name: p[0], Value: p[1]})
			}
			c.be.Send(&pgproto3.BackendKeyData{ProcessID: c.pid, SecretKey: []byte{0, 0, 0x5e, 0xed}})
			c.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if err := c.be.Flush(); err != nil {
				return fmt.Errorf("fake backend: %w", err)
			}
			return nil
		default:
			return errors.New("fake backend: cancel request or unknown startup")
		}
	}
}

// fatal ends the connection as PostgreSQL does after a protocol violation.
func (c *frameConn) fatal(msg string) error {
	c.be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "08P01", Message: msg})
	_ = c.be.Flush()
	return errors.New("fake backend: " + msg)
}

// fail answers an error in the current request: a simple query ends with
// ReadyForQuery, an extended one skips to its Sync.
func (c *frameConn) fail(code, msg string, simple bool) {
	c.be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: code, Message: msg})
	if c.tx == 'T' {
		c.tx = 'E'
	}
	if simple {
		c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.tx})
	} else {
		c.skipping = true
	}
}

func (c *frameConn) handle(msg pgproto3.FrontendMessage) error {
	if c.copying != 0 {
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			return nil
		case *pgproto3.CopyDone:
			c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 1")})
			if c.copying == 1 {
				c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.tx})
			}
			c.copying = 0
			return nil
		case *pgproto3.CopyFail:
			simple := c.copying == 1
			c.copying = 0
			c.fail("57014", "COPY from stdin failed: "+m.Message, simple)
			return nil
		case *pgproto3.Flush, *pgproto3.Sync:
			return nil // ignored during a COPY, as PostgreSQL does
		}
		return c.fatal(fmt.Sprintf("unexpected message type %T during COPY from stdin", msg))
	}
	switch m := msg.(type) {
	case *pgproto3.Query:
		c.query(m.String)
	case *pgproto3.FunctionCall:
		c.be.Send(&pgproto3.FunctionCallResponse{Result: []byte("42")})
		c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.tx})
	case *pgproto3.CopyData, *pgproto3.CopyDone, *pgproto3.CopyFail:
		// Ignored outside a COPY, as PostgreSQL does.
	case *pgproto3.Sync:
		c.skipping = false
		c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.tx})
	case *pgproto3.Flush:
	default:
		if !c.skipping {
			return c.extended(msg)
		}
	}
	return nil
}

// query answers a simple Query.
func (c *frameConn) query(sql string) {
	word := strings.ToUpper(strings.TrimSpace(sql))
	switch {
	case word == "":
		c.be.Send(&pgproto3.EmptyQueryResponse{})
	case strings.HasPrefix(word, "BEGIN"):
		c.tx = 'T'
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")})
	case strings.HasPrefix(word, "COMMIT"), strings.HasPrefix(word, "ROLLBACK"), strings.HasPrefix(word, "DISCARD"):
		c.tx = 'I'
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte(strings.Fields(word)[0])})
	case c.tx == 'E':
		c.fail("25P02", "current transaction is aborted, commands ignored until end of transaction block", true)
		return
	case strings.HasPrefix(word, "COPY") && strings.Contains(word, "FROM STDIN"):
		c.copying = 1
		c.be.Send(&pgproto3.CopyInResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0}})
		return
	case strings.HasPrefix(word, "COPY") && strings.Contains(word, "TO STDOUT"):
		c.copyOut()
	case strings.HasPrefix(word, "FAIL"):
		c.fail("22012", "division by zero", true)
		return
	default:
		c.be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("x"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}})
		c.be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte("1")}})
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
	}
	c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.tx})
}

func (c *frameConn) copyOut() {
	c.be.Send(&pgproto3.CopyOutResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0}})
	c.be.Send(&pgproto3.CopyData{Data: []byte("1\tone\n")})
	c.be.Send(&pgproto3.CopyData{Data: []byte("2\ttwo\n")})
	c.be.Send(&pgproto3.CopyDone{})
	c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 2")})
}

// extended answers Parse, Bind, Describe, Execute and Close; any other
// message ends the connection.
func (c *frameConn) extended(msg pgproto3.FrontendMessage) error {
	rowDesc := &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("x"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}}
	switch m := msg.(type) {
	case *pgproto3.Parse:
		if _, ok := c.stmts[m.Name]; ok && m.Name != "" {
			c.fail("42P05", fmt.Sprintf("prepared statement %q already exists", m.Name), false)
			return nil
		}
		c.stmts[m.Name] = m.Query
		c.be.Send(&pgproto3.ParseComplete{})
	case *pgproto3.Bind:
		sql, ok := c.stmts[m.PreparedStatement]
		if !ok {
			c.fail("26000", fmt.Sprintf("prepared statement %q does not exist", m.PreparedStatement), false)
			return nil
		}
		c.portals[m.DestinationPortal] = sql
		c.be.Send(&pgproto3.BindComplete{})
	case *pgproto3.Describe:
		names := c.portals
		if m.ObjectType == 'S' {
			names = c.stmts
		}
		if _, ok := names[m.Name]; !ok {
			c.fail("26000", fmt.Sprintf("%q does not exist", m.Name), false)
			return nil
		}
		if m.ObjectType == 'S' {
			c.be.Send(&pgproto3.ParameterDescription{})
		}
		c.be.Send(rowDesc)
	case *pgproto3.Execute:
		sql, ok := c.portals[m.Portal]
		if !ok {
			c.fail("34000", fmt.Sprintf("portal %q does not exist", m.Portal), false)
			return nil
		}
		word := strings.ToUpper(strings.TrimSpace(sql))
		switch {
		case strings.HasPrefix(word, "COPY") && strings.Contains(word, "FROM STDIN"):
			c.copying = 2
			c.be.Send(&pgproto3.CopyInResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0}})
		case strings.HasPrefix(word, "COPY") && strings.Contains(word, "TO STDOUT"):
			c.copyOut()
		default:
			c.be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte("1")}})
			c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
		}
	case *pgproto3.Close:
		if m.ObjectType == 'S' {
			delete(c.stmts, m.Name)
		} else {
			delete(c.portals, m.Name)
		}
		c.be.Send(&pgproto3.CloseComplete{})
	default:
		return c.fatal(fmt.Sprintf("unexpected message %T", msg))
	}
	return nil
}
