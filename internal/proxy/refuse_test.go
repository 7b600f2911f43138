package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// payloadMark is in every byte string the tests send that poolerd must not
// log.
const payloadMark = "PAYLOAD-MARK-e3b0c442"

// startLoginServer starts poolerd with client authentication authType for
// user app (password secret), in front of an upstream that is never
// reached: the tests end before any login gets that far. The logs are
// observed.
func startLoginServer(t *testing.T, authType string) (addr string, logs *observer.ObservedLogs) {
	t.Helper()
	cfg := unreachableConfig(t, func(c *config.Config) {
		c.AuthType = authType
		c.ClientLoginTimeout = 10 * time.Second
	})
	core, logs := observer.New(zapcore.DebugLevel)
	return serve(t, New(cfg, zap.New(core))), logs
}

// rawClient is a client that writes raw bytes and reads backend messages.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
	werr chan error
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawClient{t: t, conn: c, r: bufio.NewReader(c), werr: make(chan error, 8)}
}

// send writes p from another goroutine: poolerd refuses a message after
// its header, and a large body must not block the test before it reads.
func (c *rawClient) send(p []byte) {
	go func() {
		_, err := c.conn.Write(p)
		c.werr <- err
	}()
}

// sendNow writes p and waits for the write.
func (c *rawClient) sendNow(p []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(p); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// readByte reads the one-byte answer to an SSLRequest or GSSENCRequest.
func (c *rawClient) readByte() byte {
	c.t.Helper()
	b, err := c.r.ReadByte()
	if err != nil {
		c.t.Fatalf("read encryption answer: %v", err)
	}
	return b
}

// next reads one backend message.
func (c *rawClient) next() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}

// expect reads the next message, which must be of type typ, and returns
// its body.
func (c *rawClient) expect(typ byte) []byte {
	c.t.Helper()
	got, body, err := c.next()
	if err != nil {
		c.t.Fatalf("waiting for %q: %v", typ, err)
	}
	if got != typ {
		c.t.Fatalf("got message %q, want %q", got, typ)
	}
	return body
}

// errorFields reads the next message, which must be an ErrorResponse, and
// the end of the connection after it: a FIN, not a reset.
func (c *rawClient) refusal() map[byte]string {
	c.t.Helper()
	typ, body, err := c.next()
	if err != nil {
		c.t.Fatalf("want an ErrorResponse, got %v", err)
	}
	if typ != 'E' {
		c.t.Fatalf("want an ErrorResponse, got message %q", typ)
	}
	f := map[byte]string{}
	for len(body) > 1 {
		end := strings.IndexByte(string(body[1:]), 0)
		if end < 0 {
			c.t.Fatalf("malformed ErrorResponse")
		}
		f[body[0]] = string(body[1 : 1+end])
		body = body[2+end:]
	}
	if _, err := c.r.ReadByte(); err != io.EOF {
		c.t.Fatalf("after the ErrorResponse: want EOF (a graceful close), got %v", err)
	}
	return f
}

func rawStartup(version uint32, kv ...string) []byte {
	b := []byte{0, 0, 0, 0}
	b = binary.BigEndian.AppendUint32(b, version)
	for _, s := range kv {
		b = append(append(b, s...), 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	return b
}

// withLen sets the length field of a startup packet.
func withLen(p []byte) []byte {
	binary.BigEndian.PutUint32(p, uint32(len(p)))
	return p
}

func encryptionRequest(code uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{0, 0, 0, 8}, code)
}

func message(typ byte, body []byte) []byte {
	b := append([]byte{typ}, binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))...)
	return append(b, body...)
}

// saslInitial is a SASLInitialResponse for SCRAM-SHA-256 carrying data.
func saslInitial(data []byte) []byte {
	b := append([]byte("SCRAM-SHA-256"), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return message('p', append(b, data...))
}

// filler is n bytes of the payload mark.
func filler(n int) []byte {
	return []byte(strings.Repeat(payloadMark, n/len(payloadMark)+1)[:n])
}

// login sends the startup message of user app and reads the
// authentication request that answers it.
func (c *rawClient) login() {
	c.t.Helper()
	c.sendNow(rawStartup(wire.CodeProtocol30, "user", "app", "database", "app"))
	c.expect('R')
}

// TestPreAuthLimits breaks every limit on what a client may send before it
// is logged in, and checks that each refusal is an ErrorResponse naming the
// limit, with a hint, followed by a graceful close; and that poolerd logs
// one "client login refused" line with the client's address, the SQLSTATE
// and the reason, and never the client's bytes.
func TestPreAuthLimits(t *testing.T) {
	many := make([]string, 0, 2*(maxStartupParams+1))
	for i := range maxStartupParams + 1 {
		many = append(many, fmt.Sprintf("p%d", i), "v")
	}
	opts := ""
	for i := range maxStartupParams {
		opts += fmt.Sprintf("-c g%d=1 ", i)
	}
	bigStartup := binary.BigEndian.AppendUint32(nil, 70000)
	bigStartup = append(bigStartup, filler(70000-4)...)

	for _, tc := range []struct {
		name     string
		auth     string
		run      func(c *rawClient)
		code     string
		msg      string // the whole message, or its start when it ends with "…"
		noAnswer bool   // no refusal: the client left
	}{
		{name: "startup packet too large", run: func(c *rawClient) { c.send(bigStartup) },
			code: "08P01", msg: "startup packet too large: 70000 bytes, limit 10000"},
		{name: "startup packet too short", run: func(c *rawClient) { c.send([]byte{0, 0, 0, 4}) },
			code: "08P01", msg: "invalid startup packet length 4: the minimum is 8"},
		{name: "negative startup length", run: func(c *rawClient) { c.send([]byte{0xff, 0xff, 0xff, 0xf0}) },
			code: "08P01", msg: "invalid startup packet length -16: the minimum is 8"},
		{name: "TLS without SSLRequest", run: func(c *rawClient) { c.send(append([]byte{0x16, 0x03, 0x01, 0x02, 0x00}, filler(512)...)) },
			code: "08P01", msg: "invalid startup packet: a TLS handshake without SSLRequest"},
		{name: "HTTP request", run: func(c *rawClient) { c.send([]byte("GET /metrics HTTP/1.1\r\nHost: " + payloadMark + "\r\n\r\n")) },
			code: "08P01", msg: "invalid startup packet: an HTTP request on the PostgreSQL port"},
		{name: "SSLRequest with a body", run: func(c *rawClient) {
			p := binary.BigEndian.AppendUint32([]byte{0, 0, 0, 12}, wire.CodeSSL)
			c.send(append(p, 1, 2, 3, 4))
		}, code: "08P01", msg: "invalid SSLRequest length 12: it is 8"},
		{name: "duplicate SSLRequest", run: func(c *rawClient) {
			c.sendNow(encryptionRequest(wire.CodeSSL))
			if b := c.readByte(); b != 'N' {
				c.t.Fatalf("SSLRequest answered %q", b)
			}
			c.send(encryptionRequest(wire.CodeSSL))
		}, code: "08P01", msg: "duplicate SSLRequest: encryption was already negotiated on this connection"},
		{name: "duplicate GSSENCRequest", run: func(c *rawClient) {
			for _, code := range []uint32{wire.CodeGSSENC, wire.CodeSSL} {
				c.sendNow(encryptionRequest(code))
				if b := c.readByte(); b != 'N' {
					c.t.Fatalf("request %d answered %q", code, b)
				}
			}
			c.send(encryptionRequest(wire.CodeGSSENC))
		}, code: "08P01", msg: "duplicate GSSENCRequest: encryption was already negotiated on this connection"},
		{name: "protocol 2", run: func(c *rawClient) { c.send(rawStartup(2<<16, "user", "app")) },
			code: "0A000", msg: "unsupported frontend protocol 2.0: server supports 3.0 to 3.0"},
		{name: "startup packet without terminator", run: func(c *rawClient) {
			p := rawStartup(wire.CodeProtocol30, "user", "app", "database", payloadMark)
			c.send(withLen(p[:len(p)-1]))
		}, code: "08P01", msg: "invalid startup packet layout: expected terminator as last byte"},
		{name: "startup parameter without value", run: func(c *rawClient) {
			p := rawStartup(wire.CodeProtocol30, "user", "app", payloadMark)
			c.send(withLen(p[:len(p)-1]))
		}, code: "08P01", msg: "invalid startup packet layout: expected terminator as last byte"},
		{name: "garbage after the terminator", run: func(c *rawClient) {
			p := rawStartup(wire.CodeProtocol30, "user", "app")
			c.send(withLen(append(p, payloadMark...)))
		}, code: "08P01", msg: "invalid startup packet layout: expected terminator as last byte"},
		{name: "too many startup parameters", run: func(c *rawClient) {
			c.send(rawStartup(wire.CodeProtocol30, append([]string{"user", "app"}, many...)...))
		}, code: "08P01", msg: fmt.Sprintf("too many startup parameters: %d, limit %d", maxStartupParams+2, maxStartupParams)},
		{name: "too many settings in options", run: func(c *rawClient) {
			c.send(rawStartup(wire.CodeProtocol30, "user", "app", "application_name", "a", "options", opts))
		}, code: "08P01", msg: fmt.Sprintf("too many startup parameters: %d, limit %d", maxStartupParams+1, maxStartupParams)},
		{name: "malformed options", run: func(c *rawClient) {
			c.send(rawStartup(wire.CodeProtocol30, "user", "app", "options", "-c a=1 "+payloadMark))
		}, code: "08P01", msg: "options: word 3 is not a switch: only -c name=value and --name=value are accepted"},
		{name: "unsupported switch in options", run: func(c *rawClient) {
			c.send(rawStartup(wire.CodeProtocol30, "user", "app", "options", "-x"+payloadMark))
		}, code: "08P01", msg: `options: switch "-x" is not supported: only -c name=value and --name=value are`},
		{name: "no user", run: func(c *rawClient) { c.send(rawStartup(wire.CodeProtocol30, "database", "app")) },
			code: "28000", msg: "no PostgreSQL user name specified in startup packet"},

		{name: "SASLInitialResponse too large", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.send(saslInitial(filler(100 << 10)))
		}, code: "08P01", msg: fmt.Sprintf("authentication message too large: %d bytes, limit 65535", len("SCRAM-SHA-256")+1+4+100<<10)},
		{name: "SASLInitialResponse just over the limit", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.send(message('p', filler(65536)))
		}, code: "08P01", msg: "authentication message too large: 65536 bytes, limit 65535"},
		{name: "SASLInitialResponse with a bad length", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.send([]byte{'p', 0, 0, 0, 3})
		}, code: "08P01", msg: "invalid message length 3 for SASLInitialResponse: the minimum is 4"},
		{name: "malformed SASLInitialResponse", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.send(message('p', []byte(payloadMark)))
		}, code: "08P01", msg: "malformed SASLInitialResponse"},
		{name: "query before authentication", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.send(message('Q', append([]byte("SELECT '"+payloadMark+"'"), 0)))
		}, code: "08P01", msg: "expected SASLInitialResponse, got message type 'Q'"},
		{name: "huge query before authentication", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.send(message('Q', filler(64<<10)))
		}, code: "08P01", msg: "expected SASLInitialResponse, got message type 'Q'"},
		{name: "SASLResponse too large", auth: config.AuthSCRAM, run: func(c *rawClient) {
			c.login()
			c.sendNow(saslInitial([]byte("n,,n=,r=abcdefghijklmnopqrstuvwx")))
			c.expect('R') // AuthenticationSASLContinue
			c.send(message('p', filler(70000)))
		}, code: "08P01", msg: "authentication message too large: 70000 bytes, limit 65535"},
		{name: "PasswordMessage too large", auth: config.AuthMD5, run: func(c *rawClient) {
			c.login()
			c.send(message('p', filler(80000)))
		}, code: "08P01", msg: "authentication message too large: 80000 bytes, limit 65535"},
		{name: "PasswordMessage not terminated", auth: config.AuthMD5, run: func(c *rawClient) {
			c.login()
			c.send(message('p', []byte(payloadMark)))
		}, code: "08P01", msg: "malformed PasswordMessage: not a NUL-terminated string"},
		{name: "Terminate during authentication", auth: config.AuthMD5, run: func(c *rawClient) {
			c.login()
			c.send(wire.AppendTerminate(nil))
		}, noAnswer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auth := tc.auth
			if auth == "" {
				auth = config.AuthSCRAM
			}
			addr, logs := startLoginServer(t, auth)
			c := dialRaw(t, addr)
			tc.run(c)
			client := c.conn.LocalAddr().String()
			if tc.noAnswer {
				if typ, _, err := c.next(); err != io.EOF {
					t.Fatalf("want the connection closed, got %q %v", typ, err)
				}
			} else {
				f := c.refusal()
				if f['S'] != "FATAL" || f['C'] != tc.code || f['M'] != tc.msg {
					t.Errorf("got %s %s %q, want FATAL %s %q", f['S'], f['C'], f['M'], tc.code, tc.msg)
				}
				if f['H'] == "" {
					t.Errorf("refusal %q has no hint", f['M'])
				}
			}
			// The write may fail once poolerd has closed; it must not
			// hang.
			select {
			case <-c.werr:
			case <-time.After(5 * time.Second):
				t.Fatal("the client's write did not end")
			}
			// The session's goroutine logs before it sends the refusal;
			// Shutdown (at Cleanup) waits for it, but the log is read
			// now.
			refused := logs.FilterMessage("client login refused").All()
			if tc.noAnswer {
				if len(refused) != 0 {
					t.Errorf("a client that left was logged as refused: %v", refused[0].ContextMap())
				}
			} else if len(refused) != 1 {
				t.Errorf("want one \"client login refused\" line, got %d", len(refused))
			} else {
				e := refused[0]
				m := e.ContextMap()
				if e.Level != zapcore.InfoLevel || m["client"] != client || m["sqlstate"] != tc.code || m["reason"] != tc.msg {
					t.Errorf("log line %s %v, want info with client %s, sqlstate %s, reason %q", e.Level, m, client, tc.code, tc.msg)
				}
			}
			for _, e := range logs.All() {
				if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, payloadMark) {
					t.Errorf("the client's bytes were logged: %s", line)
				}
			}
		})
	}
}

// TestRefusalNotReset checks the lingering close: a client that sent more
// than poolerd read (here a startup packet far over the limit, still being
// written when poolerd refuses it) reads the whole refusal, and then EOF
// rather than a connection reset.
func TestRefusalNotReset(t *testing.T) {
	addr, _ := startLoginServer(t, config.AuthSCRAM)
	for i := range 3 {
		c := dialRaw(t, addr)
		p := binary.BigEndian.AppendUint32(nil, 1<<20)
		c.send(append(p, filler(128<<10)...))
		f := c.refusal()
		if f['M'] != "startup packet too large: 1048576 bytes, limit 10000" {
			t.Fatalf("try %d: got %q", i, f['M'])
		}
		if err := <-c.werr; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("try %d: the client's write ended with %v", i, err)
		}
	}
}

// FuzzParseStartup: any startup body is parsed or refused with 08P01,
// never a panic, and what is accepted stays within the parameter limit.
func FuzzParseStartup(f *testing.F) {
	f.Add(rawStartup(wire.CodeProtocol30, "user", "app", "database", "app")[4:])
	f.Add([]byte{0, 3, 0, 0, 0})
	f.Add([]byte{0, 3, 0, 0, 'u', 0, 'v', 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) < 4 {
			return // ReadStartup never returns a body this short
		}
		_, params, err := parseStartup(body)
		if err != nil {
			if werr := wireError(err); werr.Code != "08P01" || werr.Hint == "" {
				t.Fatalf("refusal %v", err)
			}
			return
		}
		if len(params) > maxStartupParams {
			t.Fatalf("%d parameters accepted", len(params))
		}
	})
}
