package integration

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/test/pgtest"
)

// feConn is a raw frontend connection to poolerd, for tests that send or
// expect exact protocol messages.
type feConn struct {
	t    *testing.T
	nc   net.Conn
	fe   *pgproto3.Frontend
	user string
}

// dialFE opens a TCP connection to addr; it is closed when the test ends.
// Every read and write must finish within 20s.
func dialFE(t *testing.T, addr string) *feConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return &feConn{t: t, nc: nc, fe: pgproto3.NewFrontend(nc, nc)}
}

// write sends raw bytes.
func (c *feConn) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// send encodes and sends messages.
func (c *feConn) send(msgs ...pgproto3.FrontendMessage) {
	c.t.Helper()
	for _, m := range msgs {
		c.fe.Send(m)
	}
	if err := c.fe.Flush(); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// recv reads the next message. The message is only valid until the next
// call.
func (c *feConn) recv() pgproto3.BackendMessage {
	c.t.Helper()
	m, err := c.fe.Receive()
	if err != nil {
		c.t.Fatalf("receive: %v", err)
	}
	return m
}

// startupParamsFor builds the parameters of a startup message for user and
// database app; extra are name=value pairs (a "database=x" pair replaces
// the database).
func startupParamsFor(user string, extra ...string) map[string]string {
	params := map[string]string{"database": pgtest.DBApp}
	if user != "" {
		params["user"] = user
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		params[k] = v
	}
	return params
}

// startup sends a protocol 3.0 StartupMessage.
func (c *feConn) startup(user string, extra ...string) {
	c.t.Helper()
	c.user = user
	c.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: startupParamsFor(user, extra...)})
}

// authenticate answers the authentication requests with password and reads
// everything up to the first ReadyForQuery. It returns the ParameterStatus
// values the client was sent.
func (c *feConn) authenticate(password string) map[string]string {
	c.t.Helper()
	var sc *auth.SCRAMClient
	params := map[string]string{}
	gotKey := false
	for {
		switch m := c.recv().(type) {
		case *pgproto3.AuthenticationOk:
		case *pgproto3.AuthenticationCleartextPassword:
			c.send(&pgproto3.PasswordMessage{Password: password})
		case *pgproto3.AuthenticationMD5Password:
			c.send(&pgproto3.PasswordMessage{Password: auth.MD5Response(auth.MD5Hash(c.user, password), m.Salt)})
		case *pgproto3.AuthenticationSASL:
			sc = auth.NewSCRAMClient(password, rand.Reader)
			c.send(&pgproto3.SASLInitialResponse{AuthMechanism: auth.SCRAMMechanism, Data: sc.ClientFirst()})
		case *pgproto3.AuthenticationSASLContinue:
			if sc == nil {
				c.t.Fatal("SASLContinue before SASL")
			}
			out, err := sc.HandleServerFirst(m.Data)
			if err != nil {
				c.t.Fatalf("SCRAM server-first: %v", err)
			}
			c.send(&pgproto3.SASLResponse{Data: out})
		case *pgproto3.AuthenticationSASLFinal:
			if sc == nil {
				c.t.Fatal("SASLFinal before SASL")
			}
			if err := sc.HandleServerFinal(m.Data); err != nil {
				c.t.Fatalf("SCRAM server-final: %v", err)
			}
		case *pgproto3.ParameterStatus:
			params[m.Name] = m.Value
		case *pgproto3.BackendKeyData:
			gotKey = true
		case *pgproto3.ReadyForQuery:
			if !gotKey {
				c.t.Fatal("login ended without BackendKeyData")
			}
			if m.TxStatus != 'I' {
				c.t.Fatalf("ReadyForQuery after login has status %q, want 'I'", m.TxStatus)
			}
			return params
		case *pgproto3.ErrorResponse:
			c.t.Fatalf("login failed: %s: %s (SQLSTATE %s)", m.Severity, m.Message, m.Code)
		default:
			c.t.Fatalf("unexpected %T during login", m)
		}
	}
}

// login sends a startup message and authenticates.
func (c *feConn) login(user, password string, extra ...string) map[string]string {
	c.t.Helper()
	c.startup(user, extra...)
	return c.authenticate(password)
}

// query runs a simple query and returns the first column of each row (as
// text) and the error the server sent, if any.
func (c *feConn) query(sql string) ([]string, *pgproto3.ErrorResponse) {
	c.t.Helper()
	c.send(&pgproto3.Query{String: sql})
	var rows []string
	var perr *pgproto3.ErrorResponse
	for {
		switch m := c.recv().(type) {
		case *pgproto3.DataRow:
			rows = append(rows, string(m.Values[0]))
		case *pgproto3.ErrorResponse:
			e := *m
			perr = &e
		case *pgproto3.ReadyForQuery:
			return rows, perr
		case *pgproto3.RowDescription, *pgproto3.CommandComplete, *pgproto3.NoticeResponse,
			*pgproto3.ParameterStatus, *pgproto3.EmptyQueryResponse:
		default:
			c.t.Fatalf("unexpected %T in query response", m)
		}
	}
}

// mustQuery is query that fails the test on an error.
func (c *feConn) mustQuery(sql string) []string {
	c.t.Helper()
	rows, perr := c.query(sql)
	if perr != nil {
		c.t.Fatalf("%s: %s: %s (SQLSTATE %s)", sql, perr.Severity, perr.Message, perr.Code)
	}
	return rows
}

// expectError reads the next message, which must be an ErrorResponse.
func (c *feConn) expectError() *pgproto3.ErrorResponse {
	c.t.Helper()
	switch m := c.recv().(type) {
	case *pgproto3.ErrorResponse:
		e := *m
		return &e
	default:
		c.t.Fatalf("got %T, want ErrorResponse", m)
		return nil
	}
}

// expectFatal reads an ErrorResponse with severity FATAL and code, and
// then expects the connection to be closed.
func (c *feConn) expectFatal(code string) *pgproto3.ErrorResponse {
	c.t.Helper()
	e := c.expectError()
	if e.Code != code || e.Severity != "FATAL" {
		c.t.Fatalf("got %s %s (%s), want FATAL %s", e.Severity, e.Code, e.Message, code)
	}
	c.expectClosed(3 * time.Second)
	return e
}

// expectClosed checks that the server closes the connection within d. Error
// responses before the end are allowed and returned; any other message
// fails the test.
func (c *feConn) expectClosed(d time.Duration) []*pgproto3.ErrorResponse {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	var errs []*pgproto3.ErrorResponse
	for {
		m, err := c.fe.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatalf("connection still open after %s", d)
			}
			return errs
		}
		e, ok := m.(*pgproto3.ErrorResponse)
		if !ok {
			c.t.Fatalf("got %T, want the connection to be closed", m)
		}
		cp := *e
		errs = append(errs, &cp)
	}
}

// startupPacket encodes a startup-phase packet: length, code, body.
func startupPacket(code uint32, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, body...)
}

// Request codes of the startup phase.
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
)

func TestProtocolSSLRequestRefused(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)

	t.Run("raw", func(t *testing.T) {
		c := dialFE(t, p.addr)
		c.write(startupPacket(codeSSLRequest, nil))
		var b [1]byte
		if _, err := c.nc.Read(b[:]); err != nil {
			t.Fatalf("read SSLRequest answer: %v", err)
		}
		if b[0] != 'N' {
			t.Fatalf("SSLRequest answered %q, want 'N'", b[0])
		}
		c.login(pgtest.RoleApp, pgtest.Password)
		if rows := c.mustQuery("SELECT 40 + 2"); len(rows) != 1 || rows[0] != "42" {
			t.Fatalf("got %v", rows)
		}
	})

	t.Run("pgx sslmode=prefer", func(t *testing.T) {
		c := connectDSN(t, p.appDSN("sslmode=prefer"))
		if got := scalarText(t, c, "SELECT 42"); got != "42" {
			t.Fatalf("got %q", got)
		}
	})

	t.Run("pgx sslmode=require", func(t *testing.T) {
		c, err := pgx.Connect(ctxTimeout(t, 10*time.Second), p.appDSN("sslmode=require"))
		if err == nil {
			c.Close(context.Background())
			t.Fatal("sslmode=require connected, but poolerd does not offer TLS")
		}
	})
}

func TestProtocolGSSENCRequestRefused(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	c := dialFE(t, p.addr)
	c.write(startupPacket(codeGSSENCRequest, nil))
	var b [1]byte
	if _, err := c.nc.Read(b[:]); err != nil {
		t.Fatalf("read GSSENCRequest answer: %v", err)
	}
	if b[0] != 'N' {
		t.Fatalf("GSSENCRequest answered %q, want 'N'", b[0])
	}
	// libpq then sends an SSLRequest, then the startup packet.
	c.write(startupPacket(codeSSLRequest, nil))
	if _, err := c.nc.Read(b[:]); err != nil || b[0] != 'N' {
		t.Fatalf("SSLRequest after GSSENCRequest: %q, %v", b[0], err)
	}
	c.login(pgtest.RoleApp, pgtest.Password)
	c.mustQuery("SELECT 1")
}

func TestProtocolNegotiateVersion(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	for _, tc := range []struct {
		name    string
		version uint32
		extra   []string
		want    []string
	}{
		{"3.2 with _pq_.foo", pgproto3.ProtocolVersion32, []string{"_pq_.foo=bar"}, []string{"_pq_.foo"}},
		{"3.2 without options", pgproto3.ProtocolVersion32, nil, nil},
		{"3.1 without options", 3<<16 | 1, nil, nil},
		{"3.9 with _pq_.x", 3<<16 | 9, []string{"_pq_.x=1"}, []string{"_pq_.x"}},
		{"3.0 with options", pgproto3.ProtocolVersion30, []string{"_pq_.b=1", "_pq_.a=2"}, []string{"_pq_.a", "_pq_.b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFE(t, p.addr)
			c.user = pgtest.RoleApp
			c.send(&pgproto3.StartupMessage{ProtocolVersion: tc.version, Parameters: startupParamsFor(pgtest.RoleApp, tc.extra...)})
			m := c.recv()
			nego, ok := m.(*pgproto3.NegotiateProtocolVersion)
			if !ok {
				t.Fatalf("got %T, want NegotiateProtocolVersion", m)
			}
			if nego.NewestMinorProtocol != 0 {
				t.Fatalf("newest minor version %d, want 0", nego.NewestMinorProtocol)
			}
			got := append([]string(nil), nego.UnrecognizedOptions...)
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("unrecognized options %q, want %q", got, tc.want)
			}
			// Authentication proceeds in protocol 3.0.
			c.authenticate(pgtest.Password)
			if rows := c.mustQuery("SELECT current_user"); len(rows) != 1 || rows[0] != pgtest.RoleApp {
				t.Fatalf("got %v", rows)
			}
		})
	}
}

func TestProtocolUnsupportedVersion(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	for _, tc := range []struct {
		name string
		code uint32
		body []byte
	}{
		// A protocol 2 startup packet is 296 bytes long.
		{"2.0", 2 << 16, make([]byte, 296-8)},
		{"1.0", 1 << 16, []byte("user\x00app\x00\x00")},
		{"4.0", 4 << 16, []byte("user\x00app\x00\x00")},
		{"garbage", 0x12345678, []byte("garbage!")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFE(t, p.addr)
			c.write(startupPacket(tc.code, tc.body))
			e := c.expectFatal("0A000")
			if !strings.Contains(e.Message, "protocol") {
				t.Errorf("message %q does not mention the protocol", e.Message)
			}
		})
	}
	// Still serving.
	c := p.connect(t)
	if _, err := c.Exec(ctxTimeout(t, 10*time.Second), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

func TestProtocolStartupByteByByte(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	c := dialFE(t, p.addr)
	c.user = pgtest.RoleApp
	sm := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: startupParamsFor(pgtest.RoleApp, "application_name=slowpoke")}
	pkt, err := sm.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	// A leading SSLRequest, also one byte at a time.
	ssl := startupPacket(codeSSLRequest, nil)
	for _, b := range ssl {
		c.write([]byte{b})
		time.Sleep(2 * time.Millisecond)
	}
	var n [1]byte
	if _, err := c.nc.Read(n[:]); err != nil || n[0] != 'N' {
		t.Fatalf("SSLRequest answer %q, %v", n[0], err)
	}
	for _, b := range pkt {
		c.write([]byte{b})
		time.Sleep(2 * time.Millisecond)
	}
	params := c.authenticate(pgtest.Password)
	if params["application_name"] != "slowpoke" {
		t.Errorf("application_name reported %q, want slowpoke", params["application_name"])
	}
	if rows := c.mustQuery("SHOW application_name"); len(rows) != 1 || rows[0] != "slowpoke" {
		t.Fatalf("got %v", rows)
	}
}

func TestProtocolInvalidMessageAfterLogin(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	for _, tc := range []struct {
		name  string
		inTx  bool
		bytes []byte
	}{
		{"unknown type", false, []byte{'z', 0, 0, 0, 4}},
		{"length below 4", false, []byte{'Q', 0, 0, 0, 2}},
		{"negative length", false, []byte{'Q', 0xff, 0xff, 0xff, 0xf0}},
		{"unknown type in transaction", true, []byte{'z', 0, 0, 0, 4}},
		{"length below 4 in transaction", true, []byte{'P', 0, 0, 0, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFE(t, p.addr)
			app := "badmsg_" + strings.NewReplacer(" ", "_").Replace(tc.name)
			c.login(pgtest.RoleApp, pgtest.Password, "application_name="+app)
			c.mustQuery("SELECT 1")
			if tc.inTx {
				c.mustQuery("BEGIN")
				c.mustQuery("SELECT 1")
				if n := countBackends(t, "application_name = '"+app+"' AND state LIKE 'idle in transaction%'"); n != 1 {
					t.Fatalf("%d backends of the client in a transaction before the bad message, want 1", n)
				}
			}
			c.write(tc.bytes)
			e := c.expectFatal("08P01")
			t.Logf("poolerd said: %s (hint: %s)", e.Message, e.Hint)

			// The server connection the session held is not leaked: no
			// active connection remains, and no backend is left in the
			// client's transaction.
			eventually(t, 5*time.Second, "no active server connection", func() bool {
				return p.poolStats(t, pgtest.DBApp, pgtest.RoleApp).Active == 0
			})
			if tc.inTx {
				eventually(t, 5*time.Second, "no backend idle in transaction", func() bool {
					return countBackends(t, "application_name = '"+app+"' AND state LIKE 'idle in transaction%'") == 0
				})
			}
			// poolerd still serves other clients.
			other := p.connect(t)
			if got := scalarText(t, other, "SELECT 7"); got != "7" {
				t.Fatalf("other client: got %q", got)
			}
		})
	}
}

// countBackends counts the rows of pg_stat_activity matching where, asked
// directly of PostgreSQL.
func countBackends(t *testing.T, where string) int {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	conn, err := pgx.Connect(ctx, pg.SuperDSN("postgres"))
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+where).Scan(&n); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	return n
}

func TestProtocolOversizedStartupPacket(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	for _, tc := range []struct {
		name   string
		length uint32
		msg    string
	}{
		{"over 10000", 20000, "startup packet too large: 20000 bytes, limit 10000"},
		{"huge", 0x7fffffff, "startup packet too large: 2147483647 bytes, limit 10000"},
		{"negative", 0xfffffff0, "invalid startup packet length -16: the minimum is 8"},
		{"below 8", 4, "invalid startup packet length 4: the minimum is 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFE(t, p.addr)
			b := binary.BigEndian.AppendUint32(nil, tc.length)
			b = binary.BigEndian.AppendUint32(b, pgproto3.ProtocolVersion30)
			b = append(b, make([]byte, 1000)...)
			if _, err := c.nc.Write(b); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Logf("write: %v (connection already closed)", err)
			}
			// A refusal naming the limit, then a graceful close (the
			// unread rest of the packet does not turn it into a reset).
			if e := c.expectFatal("08P01"); e.Message != tc.msg || e.Hint == "" {
				t.Errorf("got %q (hint %q), want %q and a hint", e.Message, e.Hint, tc.msg)
			}
		})
	}
	// No crash: poolerd still serves clients.
	c := dialFE(t, p.addr)
	c.login(pgtest.RoleApp, pgtest.Password)
	c.mustQuery("SELECT 1")
}

func TestProtocolMissingUser(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	c := dialFE(t, p.addr)
	c.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"database": pgtest.DBApp}})
	c.expectFatal("28000")

	c = dialFE(t, p.addr)
	c.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "", "database": pgtest.DBApp}})
	c.expectFatal("28000")
}
