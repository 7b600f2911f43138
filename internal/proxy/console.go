package proxy

import (
	"context"
	"crypto/subtle"
	"net"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// The hand-off of admin console logins. The proxy reads the startup packet
// and authenticates a client of the console's virtual database like any
// other, then hands the connection to the Console set with SetConsole
// (internal/console), which reads and answers it from then on. The proxy
// keeps a registry of console connections, keyed like its sessions by the
// pid of the BackendKeyData it issued, so that cancel requests, Shutdown,
// Close, KILL_CLIENT, Clients and the client counts still find them.

// IsConsoleDatabase reports whether name is the admin console's virtual
// database: "pgbouncer", as PgBouncer's tools expect, or "poolerd".
func IsConsoleDatabase(name string) bool { return config.IsConsoleDatabase(name) }

// Console serves admin console connections.
//
// ServeConsole is called once per console login, on that connection's own
// goroutine, after authentication and before anything else is sent (no
// AuthenticationOk yet); calls for different connections run concurrently.
// It returns when the connection is over, after calling c.Close. ctx ends
// when the server is closed. While it runs, the proxy touches c.Conn only
// through c's methods and the ConsoleClient given to c.Register.
type Console interface {
	ServeConsole(ctx context.Context, c *ConsoleConn)
}

// ConsoleClient is what the proxy does to a registered console connection
// from other goroutines. Neither method may wait for the client.
type ConsoleClient interface {
	// Cancel is called for a cancel request with the connection's key: it
	// interrupts a PAUSE or WAIT_CLOSE in progress.
	Cancel()
	// Terminate ends the connection with werr as its final message
	// (Shutdown and Close send 57P01, KILL_CLIENT 08P01).
	Terminate(werr *wire.Error)
}

// ConsoleConn is an authenticated console connection handed to the
// Console. Its exported fields are set by the proxy and not changed.
type ConsoleConn struct {
	// Conn is the client's connection, its login deadline cleared.
	Conn net.Conn
	// User is the user the client authenticated as; Database is the name
	// it asked for (see IsConsoleDatabase).
	User, Database string
	// ID numbers the connection among clients and server connections
	// (SHOW CLIENTS' id, KILL_CLIENT).
	ID uint64
	// ConnectedAt is when the connection was accepted.
	ConnectedAt time.Time
	// LocalAdmin: user pgbouncer over the Unix socket from poolerd's own
	// operating-system user, an admin whatever admin_users says (as in
	// PgBouncer).
	LocalAdmin bool
	// Log writes with the connection's fields, as the proxy's lines about
	// its clients do.
	Log *zap.Logger

	srv      *Server
	pid, key uint32
	client   ConsoleClient // set by Register (srv.mu)
	lastReq  atomic.Int64  // nanotime of the last request (SHOW CLIENTS)
	finished atomic.Bool   // Finish was called: Close lingers
}

// SetConsole sets who serves console logins; call it before Serve.
// Without one, console logins are refused after authentication.
func (srv *Server) SetConsole(c Console) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.console = c
}

func (srv *Server) consoleServer() Console {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.console
}

// serveConsole hands a logged-in console client to the Console; it returns
// when the connection is over.
func (srv *Server) serveConsole(s *session, rest []byte) {
	con := srv.consoleServer()
	if con == nil { // SetConsole(nil) during the login
		_ = s.conn.Close()
		return
	}
	conn := s.conn
	if len(rest) > 0 { // sent right behind the login
		conn = &replayConn{Conn: conn, first: rest}
	}
	c := &ConsoleConn{Conn: conn, User: s.user, Database: s.database, ID: s.id, ConnectedAt: s.connectedAt, srv: srv,
		LocalAdmin: s.login != nil && s.login.localAdmin,
		Log: srv.log.With(zap.Uint64("session", s.id), zap.String("client", s.addr),
			zap.String("database", s.database), zap.String("user", s.user))}
	con.ServeConsole(srv.ctx, c)
}

// Register makes c a logged-in client: counted by ClientCount and
// max_client_conn, listed by Clients, ended by Shutdown, Close and
// KillClient, and found by cancel requests with the BackendKeyData it
// returns, all through cl. While the server shuts down it fails with the
// *wire.Error to send the client as its final message.
func (c *ConsoleConn) Register(cl ConsoleClient) (pid, key uint32, err error) {
	srv := c.srv
	srv.mu.Lock()
	defer srv.mu.Unlock()
	// A shutdown that keeps the Unix socket open takes console logins
	// there until its end (Close cancels ctx first).
	if srv.ctx.Err() != nil || srv.shutting.Load() && !srv.consoleOnly.Load() {
		return 0, 0, errShuttingDown()
	}
	c.client = cl
	c.pid, c.key = srv.newKeyLocked()
	srv.consoles[c.pid] = c
	return c.pid, c.key, nil
}

// NoteRequest records that the client sent a request (SHOW CLIENTS'
// request_time).
func (c *ConsoleConn) NoteRequest() { c.lastReq.Store(c.srv.nanotime()) }

// Finish follows the connection's final message: FIN (nothing more is
// sent), and a read in progress on the connection returns at once, so that
// its reader ends the session.
func (c *ConsoleConn) Finish() {
	c.finished.Store(true)
	halfClose(c.Conn)
	_ = c.Conn.SetReadDeadline(time.Now())
}

// Close takes c out of the registry and closes the connection: after
// Finish, only once the client has closed too or a second has passed, so
// that it reads the final message rather than a reset (see lingerClose);
// otherwise at once.
func (c *ConsoleConn) Close() {
	srv := c.srv
	srv.mu.Lock()
	registered := c.pid != 0 && srv.consoles[c.pid] == c
	if registered {
		delete(srv.consoles, c.pid)
	}
	srv.mu.Unlock()
	switch {
	case !c.finished.Load():
		_ = c.Conn.Close()
	case registered:
		srv.closeLingering(c.Conn)
	default:
		drainClose(c.Conn) // a refused login, on the login's goroutine
	}
}

// consoleClients returns the registered console connections' clients.
func (srv *Server) consoleClients() []ConsoleClient {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	out := make([]ConsoleClient, 0, len(srv.consoles))
	for _, c := range srv.consoles {
		out = append(out, c.client)
	}
	return out
}

// endConsoles ends every console connection with 57P01 (Shutdown, Close).
func (srv *Server) endConsoles() {
	for _, cl := range srv.consoleClients() {
		cl.Terminate(errShuttingDown())
	}
}

// cancelConsole delivers a cancel request to the console connection with
// pid if key is its key, and reports whether it did.
func (srv *Server) cancelConsole(pid, key uint32) bool {
	srv.mu.Lock()
	c := srv.consoles[pid]
	srv.mu.Unlock()
	if c == nil || subtle.ConstantTimeEq(int32(c.key), int32(key)) != 1 {
		return false
	}
	c.client.Cancel()
	return true
}
