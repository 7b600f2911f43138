// Package backend opens connections to PostgreSQL as a client: dial, startup
// message, authentication (SCRAM-SHA-256, md5, cleartext, trust, and SCRAM
// pass-through with a client's recovered key), the server's parameters and
// cancel key; and it sends cancel requests. It does not pool, retry or relay:
// a *Conn is handed to internal/pool once logged in, and what flows over it
// afterwards is the proxy's.
package backend

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/netopt"
	"github.com/poolerd/poolerd/internal/wire"
)

// maxStartupBody caps any message the server sends during startup.
const maxStartupBody = 64 << 10

// Target locates a PostgreSQL server.
type Target struct {
	// Host is a host name, an IP address, or a directory holding the
	// server's Unix socket (starting with "/").
	Host string
	Port int
	// TLS is how connections to it are protected; nil means plain TCP.
	// Cancel requests are sent in plain TCP (PostgreSQL reads them before
	// any pg_hba.conf rule applies).
	TLS *TLS
	// TCP sets the socket's keepalive and user timeout; nil means
	// keepalive every 30 s.
	TCP *netopt.TCP
}

// Network returns the network and address to dial.
func (t Target) Network() (network, address string) {
	if filepath.IsAbs(t.Host) {
		return "unix", filepath.Join(t.Host, ".s.PGSQL."+strconv.Itoa(t.Port))
	}
	return "tcp", net.JoinHostPort(t.Host, strconv.Itoa(t.Port))
}

// String is host:port (no secrets).
func (t Target) String() string { _, a := t.Network(); return a }

// Credentials are what poolerd proves to the server.
type Credentials struct {
	User string
	// Secret is the user's secret; the zero value means none (trust).
	Secret auth.Secret
	// ClientKey, with the SCRAM verifier in Secret, authenticates with
	// SCRAM pass-through when no plain password is known.
	ClientKey []byte
	// KeyCache, if set, keeps the SCRAM keys a plain password gives, so
	// that logging in again as the role costs no PBKDF2.
	KeyCache *auth.SCRAMKeyCache
}

// Conn is an authenticated server connection, ready for queries.
type Conn struct {
	net.Conn
	// PID and Key identify the backend for cancel requests.
	PID uint32
	Key []byte
	// Params are the ParameterStatus values reported at startup.
	Params map[string]string
	// Target is where the connection goes.
	Target Target
}

// ServerError is an ErrorResponse received from the server.
type ServerError struct {
	Severity, Code, Message string
	// Body is the raw ErrorResponse body, to relay to a client unchanged.
	Body []byte
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("server: %s: %s (SQLSTATE %s)", e.Severity, e.Message, e.Code)
}

// ErrUnsupportedAuth is returned for authentication methods poolerd cannot
// perform (GSSAPI, SSPI, ...).
var ErrUnsupportedAuth = errors.New("unsupported authentication method")

// AuthError means poolerd could not log in with what it was configured
// with (no usable secret, a SCRAM verifier that is not the server's, a method
// it cannot perform): a configuration problem, not an outage.
type AuthError struct{ Err error }

func (e *AuthError) Error() string { return e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// ServerKeepAlive is the keepalive period of server connections whose
// Target sets no TCP options.
const ServerKeepAlive = 30 * time.Second

// Connect dials t and logs in as creds to database with the given extra
// startup parameters, over TLS as t.TLS says. ctx bounds the whole exchange.
func Connect(ctx context.Context, t Target, database string, creds Credentials, params map[string]string) (*Conn, error) {
	mode := t.TLS.mode()
	c, err := connect(ctx, t, database, creds, params, mode != TLSDisable && mode != TLSAllow)
	var se *ServerError
	if mode == TLSAllow && errors.As(err, &se) && se.Code == "28000" {
		// allow: the server refused plain TCP (hostssl rules); try TLS.
		return connect(ctx, t, database, creds, params, true)
	}
	return c, err
}

// connect is one attempt of Connect, asking for TLS first if useTLS.
func connect(ctx context.Context, t Target, database string, creds Credentials, params map[string]string, useTLS bool) (*Conn, error) {
	network, address := t.Network()
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		if t.TCP != nil {
			_ = t.TCP.Apply(tc)
		} else {
			_ = tc.SetKeepAlive(true)
			_ = tc.SetKeepAlivePeriod(ServerKeepAlive)
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	plain := nc
	stop := context.AfterFunc(ctx, func() { _ = plain.SetDeadline(time.Unix(1, 0)) })
	if useTLS {
		nc, err = t.TLS.negotiate(plain, t.Host)
	}
	var c *Conn
	if err == nil {
		c, err = startup(nc, t, database, creds, params)
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		plain.Close()
		return nil, err
	}
	if err := plain.SetDeadline(time.Time{}); err != nil {
		plain.Close()
		return nil, err
	}
	return c, nil
}

func startup(nc net.Conn, t Target, database string, creds Credentials, params map[string]string) (*Conn, error) {
	sm := pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters:      map[string]string{"user": creds.User, "database": database},
	}
	for k, v := range params {
		sm.Parameters[k] = v
	}
	buf, err := sm.Encode(nil)
	if err != nil {
		return nil, err
	}
	if _, err := nc.Write(buf); err != nil {
		return nil, err
	}
	if err := authenticate(nc, creds); err != nil {
		var se *ServerError
		var ne net.Error
		if !errors.As(err, &se) && !errors.As(err, &ne) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			err = &AuthError{Err: err}
		}
		return nil, err
	}
	c := &Conn{Conn: nc, Params: map[string]string{}, Target: t}
	for {
		typ, body, err := wire.ReadMessage(nc, maxStartupBody)
		if err != nil {
			return nil, err
		}
		switch typ {
		case 'S':
			if name, value, ok := wire.ParseParameterStatus(body); ok {
				c.Params[name] = value
			}
		case 'K':
			if len(body) < 8 {
				return nil, errors.New("short BackendKeyData from server")
			}
			c.PID = binary.BigEndian.Uint32(body)
			c.Key = append([]byte(nil), body[4:]...)
		case 'N', 'v':
		case 'E':
			return nil, serverError(body)
		case 'Z':
			return c, nil
		default:
			return nil, fmt.Errorf("unexpected message %q from server during startup", typ)
		}
	}
}

func serverError(body []byte) *ServerError {
	sev, code, msg := wire.ErrorFields(body)
	return &ServerError{Severity: sev, Code: code, Message: msg, Body: append([]byte(nil), body...)}
}

func authenticate(nc net.Conn, creds Credentials) error {
	var scram *auth.SCRAMClient
	for {
		typ, body, err := wire.ReadMessage(nc, maxStartupBody)
		if err != nil {
			return err
		}
		switch typ {
		case 'E':
			return serverError(body)
		case 'v', 'N':
			continue
		case 'R':
		default:
			return fmt.Errorf("unexpected message %q from server during authentication", typ)
		}
		if len(body) < 4 {
			return errors.New("short authentication request from server")
		}
		code := binary.BigEndian.Uint32(body)
		data := body[4:]
		var reply []byte
		switch code {
		case pgproto3.AuthTypeOk:
			return nil
		case pgproto3.AuthTypeCleartextPassword:
			pw, ok := creds.Secret.Plain()
			if !ok && creds.Secret.Kind() == 0 {
				return fmt.Errorf("server asks user %q for a password, and poolerd has none for it: configure its plain password", creds.User)
			}
			if !ok {
				return fmt.Errorf("server asks user %q for a cleartext password, and poolerd knows only a %s: configure the plain password", creds.User, creds.Secret)
			}
			reply = passwordMessage(pw)
		case pgproto3.AuthTypeMD5Password:
			if len(data) < 4 {
				return errors.New("short md5 salt from server")
			}
			hash, ok := creds.Secret.MD5(creds.User)
			if !ok && creds.Secret.Kind() == 0 {
				return fmt.Errorf("server asks user %q for an md5 password, and poolerd has none for it: configure its plain or md5 password", creds.User)
			}
			if !ok {
				return fmt.Errorf("wrong password type: server asks user %q for md5 authentication, and poolerd knows only a %s: configure the plain or md5 password", creds.User, creds.Secret)
			}
			reply = passwordMessage(auth.MD5Response(hash, [4]byte(data[:4])))
		case pgproto3.AuthTypeSASL:
			if !hasMechanism(data, "SCRAM-SHA-256") {
				return fmt.Errorf("%w: server offers no SCRAM-SHA-256", ErrUnsupportedAuth)
			}
			scram, err = scramClient(creds)
			if err != nil {
				return err
			}
			first := scram.ClientFirst()
			reply = saslInitial(scram.Mechanism(), first)
		case pgproto3.AuthTypeSASLContinue:
			if scram == nil {
				return errors.New("server sent SASLContinue before SASL")
			}
			final, err := scram.HandleServerFirst(data)
			if err != nil {
				return fmt.Errorf("SCRAM with server: %w", err)
			}
			reply = saslResponse(final)
		case pgproto3.AuthTypeSASLFinal:
			if scram == nil {
				return errors.New("server sent SASLFinal before SASL")
			}
			if err := scram.HandleServerFinal(data); err != nil {
				return fmt.Errorf("SCRAM with server: %w", err)
			}
			continue
		default:
			return fmt.Errorf("%w (code %d) requested by server for user %q: use scram-sha-256, md5, password or trust in pg_hba.conf", ErrUnsupportedAuth, code, creds.User)
		}
		if _, err := nc.Write(reply); err != nil {
			return err
		}
	}
}

func scramClient(creds Credentials) (*auth.SCRAMClient, error) {
	if pw, ok := creds.Secret.Plain(); ok {
		return auth.NewSCRAMClientCached(pw, rand.Reader, creds.KeyCache), nil
	}
	if v, ok := creds.Secret.SCRAM(); ok && creds.ClientKey != nil {
		return auth.NewSCRAMClientFromKeys(v, creds.ClientKey, rand.Reader), nil
	}
	if _, ok := creds.Secret.SCRAM(); ok {
		return nil, fmt.Errorf("wrong password type: server asks user %q for SCRAM and poolerd holds only a SCRAM secret without the client's key: the client must log in with scram-sha-256 (pass-through), or configure the plain password", creds.User)
	}
	return nil, fmt.Errorf("wrong password type: server asks user %q for SCRAM and poolerd knows no password for it (%s): configure the plain password", creds.User, creds.Secret)
}

func hasMechanism(data []byte, mech string) bool {
	for len(data) > 0 {
		i := 0
		for i < len(data) && data[i] != 0 {
			i++
		}
		if string(data[:i]) == mech {
			return true
		}
		if i >= len(data) {
			break
		}
		data = data[i+1:]
	}
	return false
}

func passwordMessage(pw string) []byte {
	b := []byte{'p', 0, 0, 0, 0}
	b = append(b, pw...)
	b = append(b, 0)
	binary.BigEndian.PutUint32(b[1:], uint32(len(b)-1))
	return b
}

func saslInitial(mech string, data []byte) []byte {
	b := []byte{'p', 0, 0, 0, 0}
	b = append(b, mech...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	b = append(b, data...)
	binary.BigEndian.PutUint32(b[1:], uint32(len(b)-1))
	return b
}

func saslResponse(data []byte) []byte {
	b := []byte{'p', 0, 0, 0, 0}
	b = append(b, data...)
	binary.BigEndian.PutUint32(b[1:], uint32(len(b)-1))
	return b
}

// Cancel sends a CancelRequest for the backend (pid, key) at t and waits
// until the server has read it and closed the socket, so that when Cancel
// returns the signal has been delivered (or ctx ended).
func Cancel(ctx context.Context, t Target, pid uint32, key []byte) error {
	network, address := t.Network()
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, address)
	if err != nil {
		return err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if _, err := nc.Write(wire.AppendCancelRequest(nil, pid, key)); err != nil {
		return err
	}
	// The server answers nothing and closes the connection once the
	// request is processed.
	var b [1]byte
	if _, err := nc.Read(b[:]); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// QueryValue runs sql, a simple query, on a connection nobody else reads
// yet (before it is handed to a reader) and returns the first column of the
// first row ("" for NULL or no row). ctx's deadline bounds it.
func (c *Conn) QueryValue(ctx context.Context, sql string) (string, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.Conn.SetDeadline(dl)
		defer c.Conn.SetDeadline(time.Time{})
	}
	fe := pgproto3.NewFrontend(c.Conn, c.Conn)
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		return "", fmt.Errorf("send query: %w", err)
	}
	var value string
	var row bool
	var qerr error
	for {
		msg, err := fe.Receive()
		if err != nil {
			return "", fmt.Errorf("read the answer: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if !row && len(m.Values) > 0 && m.Values[0] != nil {
				value = string(m.Values[0])
			}
			row = true
		case *pgproto3.ErrorResponse:
			if qerr == nil {
				qerr = &ServerError{Severity: m.Severity, Code: m.Code, Message: m.Message}
			}
		case *pgproto3.ParameterStatus:
			c.Params[m.Name] = m.Value
		case *pgproto3.ReadyForQuery:
			return value, qerr
		}
	}
}
