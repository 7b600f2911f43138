package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/wire"
)

// Limits on what a client may send before it is authenticated. Each one,
// when broken, is answered with FATAL 08P01 naming the limit (see
// docs/operations.md, "Login refusals").
const (
	// maxAuthBody caps a client's password and SASL messages (the body,
	// after the type byte and the length field): PostgreSQL's
	// PG_MAX_AUTH_TOKEN_LENGTH, so that a long password that logs in
	// directly logs in through poolerd. A SCRAM message is about 100 bytes.
	maxAuthBody = 65535
	// maxStartupParams caps the parameters of a startup packet, each
	// setting of "options" counted on its own. libpq, pgx and JDBC send
	// fewer than 12.
	maxStartupParams = 64
)

// A refused client's connection is closed with a lingering close: see
// lingerClose.
const (
	lingerTime = time.Second
	lingerMax  = 256 << 10
)

// refuseLogin ends a login with werr: it logs one "client login refused" line
// (the SQLSTATE and werr's message, which never quotes the client's bytes)
// and sends werr. serveConn then closes the connection with lingerClose.
func (s *session) refuseLogin(err error) {
	werr := wireError(err)
	s.log.Info("client login refused", zap.String("sqlstate", werr.Code), zap.String("reason", werr.Message))
	s.fail(werr)
}

// lingerClose closes the connection of a client that was sent a refusal, so
// that the client reads the refusal instead of a reset. A socket closed
// with input still unread (the rest of an oversized message, a pipelined
// query) is reset by the kernel, and a reset may destroy the ErrorResponse
// before the client reads it. So: send FIN after the error, read and
// discard what the client still sends until it closes too (at most
// lingerMax bytes, for at most lingerTime), then close.
func lingerClose(nc net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := nc.(closeWriter); ok && cw.CloseWrite() == nil {
		drainClose(nc)
		return
	}
	_ = nc.Close()
}

// closeLingering is drainClose on a goroutine of its own that counts in
// sessWG, for a connection that has sent FIN after its final message:
// Shutdown, Drain and WaitClosed, and so the process's exit, wait for it. A
// process that exits while a linger is on closes the socket at once, and
// if the client has sent anything since (its next request), that close is
// a reset, which also throws away what the client's kernel had not taken
// yet: the final message, or the end of the answer before it, when the
// client had not been reading (issue #31, hole 7). The caller holds a
// count in sessWG (a session or login not yet over), so the count never
// rises from zero while Shutdown waits.
func (srv *Server) closeLingering(nc net.Conn) {
	srv.sessWG.Add(1)
	go func() {
		defer srv.sessWG.Done()
		drainClose(nc)
	}()
}

// drainClose is the second half of lingerClose, for a connection that has
// sent FIN already.
func drainClose(nc net.Conn) {
	if nc.SetReadDeadline(time.Now().Add(lingerTime)) == nil {
		_, _ = io.CopyN(io.Discard, nc, lingerMax)
	}
	_ = nc.Close()
}

// loginViolation is a FATAL 08P01 refusal of a malformed or oversized login.
func loginViolation(msg, hint string) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: msg, Hint: hint}
}

// startupLengthRefusal is the answer to a startup packet whose length is
// out of range. The four bytes read tell a TLS handshake or an HTTP request
// (sent to the wrong port) from a plain oversized packet.
func startupLengthRefusal(e *wire.StartupLengthError) *wire.Error {
	h := e.Header[:]
	switch {
	case h[0] == 0x16 && h[1] == 0x03:
		return loginViolation("invalid startup packet: a TLS handshake without SSLRequest",
			"poolerd does not take direct TLS connections (sslnegotiation=direct); connect with sslnegotiation=postgres")
	case bytes.HasPrefix(h, []byte("GET ")), bytes.HasPrefix(h, []byte("POST")), bytes.HasPrefix(h, []byte("HEAD")),
		bytes.HasPrefix(h, []byte("PUT ")):
		return loginViolation("invalid startup packet: an HTTP request on the PostgreSQL port",
			"health checks and metrics are served on http_listen, not on listen")
	case e.Len > wire.MaxStartupLen:
		return loginViolation(fmt.Sprintf("startup packet too large: %d bytes, limit %d", e.Len, wire.MaxStartupLen),
			"the limit is PostgreSQL's: send fewer or shorter startup parameters (set the rest with SET after connecting), or check that the client speaks the PostgreSQL protocol")
	}
	return loginViolation(fmt.Sprintf("invalid startup packet length %d: the minimum is 8", e.Len),
		"the client sent bytes that are not a PostgreSQL startup packet; check the driver")
}

// authFrameRefusal is the answer to an authentication message whose header
// ReadMessage refused. expected names the message the exchange waits for.
func authFrameRefusal(expected string, fe *wire.FrameError) *wire.Error {
	switch {
	case fe.Type != 'p':
		return unexpectedAuthMessage(expected, fe.Type)
	case fe.Len < 4:
		return loginViolation(fmt.Sprintf("invalid message length %d for %s: the minimum is 4", fe.Len, expected),
			"the client sent a malformed authentication message; check the driver")
	}
	return loginViolation(fmt.Sprintf("authentication message too large: %d bytes, limit %d", fe.Len-4, maxAuthBody),
		"password, SASLInitialResponse and SASLResponse messages are capped at 8192 bytes (a SCRAM message is about 100); use a shorter password, or check the driver")
}

func unexpectedAuthMessage(expected string, typ byte) *wire.Error {
	return loginViolation(fmt.Sprintf("expected %s, got message type %s", expected, quoteByte(typ)),
		"a client sends nothing but authentication messages until it is logged in; check the driver")
}

// readAuthMessage reads the client's next authentication message (type
// 'p'; expected names it for the refusal). The type is checked before the
// length, so that a query sent too early is refused as one whatever its
// size. A Terminate is errClientLeft.
func (s *session) readAuthMessage(expected string) ([]byte, error) {
	typ, body, err := wire.ReadMessage(s.loginReader(), maxAuthBody)
	var fe *wire.FrameError
	switch {
	case errors.As(err, &fe) && fe.Type == 'X':
		return nil, errClientLeft
	case errors.As(err, &fe):
		return nil, authFrameRefusal(expected, fe)
	case err != nil:
		return nil, err
	case typ == 'X':
		return nil, errClientLeft
	case typ != 'p':
		return nil, unexpectedAuthMessage(expected, typ)
	}
	return body, nil
}

// parseStartup decodes the body of a StartupMessage (protocol 3.x): the
// version, then pairs of NUL-terminated name and value, then a NUL. It
// checks the layout as PostgreSQL does, and the number of parameters.
func parseStartup(body []byte) (version uint32, params map[string]string, err error) {
	version = binary.BigEndian.Uint32(body)
	rest := body[4:]
	params = map[string]string{}
	n := 0
	for len(rest) > 0 && rest[0] != 0 {
		name, after, ok := bytes.Cut(rest, []byte{0})
		if !ok {
			break
		}
		value, after, ok := bytes.Cut(after, []byte{0})
		if !ok {
			rest = nil
			break
		}
		n++
		if n <= maxStartupParams {
			params[string(name)] = string(value)
		}
		rest = after
	}
	if len(rest) != 1 {
		return 0, nil, loginViolation("invalid startup packet layout: expected terminator as last byte",
			"the client sent a malformed startup message; check the driver")
	}
	if n > maxStartupParams {
		return 0, nil, tooManyParams(n)
	}
	return version, params, nil
}

func tooManyParams(n int) *wire.Error {
	return loginViolation(fmt.Sprintf("too many startup parameters: %d, limit %d", n, maxStartupParams),
		"send fewer parameters in the connection settings (each -c of options counts); set the rest with SET after connecting")
}
