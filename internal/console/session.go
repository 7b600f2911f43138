package console

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/internal/wire"
)

// session is one console connection. Its goroutine (ServeConsole) reads
// the client's commands and answers them; other goroutines reach it only
// through Cancel and Terminate (proxy.ConsoleClient).
type session struct {
	c    *Console
	pc   *proxy.ConsoleConn
	conn net.Conn
	user string
	log  *zap.Logger
	ctx  context.Context // ends when the proxy is closed
	// admin: the user is in admin_users and may change things; otherwise
	// it is in stats_users and may only look.
	admin bool

	// wmu serialises writes to the client; final, set under it, is the
	// final message sent, if any.
	wmu   sync.Mutex
	final atomic.Pointer[wire.Error]

	// waitCancel interrupts a PAUSE or WAIT_CLOSE in progress (a cancel
	// request, the connection's end).
	waitMu     sync.Mutex
	waitCancel context.CancelCauseFunc

	closed  atomic.Bool
	endOnce sync.Once
}

// ServeConsole finishes the login of a console client and serves its
// commands until it leaves: only admin_users and stats_users get in.
func (c *Console) ServeConsole(ctx context.Context, pc *proxy.ConsoleConn) {
	cfg := c.p.Config()
	s := &session{c: c, pc: pc, conn: pc.Conn, user: pc.User, log: pc.Log, ctx: ctx}
	s.admin = pc.LocalAdmin || slices.Contains(cfg.AdminUsers, s.user)
	if !s.admin && !slices.Contains(cfg.StatsUsers, s.user) {
		s.fail(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "not allowed",
			Hint: "the admin console is open to the users in admin_users and stats_users"})
		s.log.Info("admin console login refused: user not in admin_users or stats_users")
		pc.Close()
		return
	}
	welcome := wire.AppendAuthOk(nil)
	for _, kv := range [][2]string{
		{"server_version", pgbouncerVersion + "/bouncer"}, {"client_encoding", "UTF8"}, {"server_encoding", "UTF8"},
		{"DateStyle", "ISO"}, {"TimeZone", "GMT"}, {"standard_conforming_strings", "on"}, {"is_superuser", "on"},
	} {
		welcome = wire.AppendParameterStatus(welcome, kv[0], kv[1])
	}
	pid, key, err := pc.Register(s)
	if err != nil {
		var werr *wire.Error
		if !errors.As(err, &werr) {
			werr = &wire.Error{Severity: "FATAL", Code: "57P01", Message: err.Error()}
		}
		s.fail(werr)
		pc.Close()
		return
	}
	c.sessions.Add(1)
	welcome = wire.AppendBackendKeyData(welcome, pid, key)
	welcome = wire.AppendReadyForQuery(welcome, wire.TxIdle)
	if err := s.write(welcome); err != nil {
		c.sessions.Add(-1)
		pc.Close()
		return
	}
	if cfg.LogConnections {
		s.log.Info("admin console client connected", zap.Bool("admin", s.admin))
	}
	s.run()
}

// run serves console commands until the client leaves.
func (s *session) run() {
	for {
		typ, body, err := wire.ReadMessage(s.conn, 1<<20)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			s.end(err)
			return
		}
		s.pc.NoteRequest()
		switch typ {
		case 'Q':
			sql := string(body)
			if i := strings.IndexByte(sql, 0); i >= 0 {
				sql = sql[:i]
			}
			if quit := s.query(sql); quit {
				s.end(nil)
				return
			}
		case 'X':
			s.end(nil)
			return
		case 'P', 'B', 'E', 'D', 'S', 'H', 'C':
			s.fail(&wire.Error{Severity: "FATAL", Code: "08P01", Message: "extended query protocol not supported by admin console",
				Hint: "use the simple query protocol (psql does; in drivers, a simple-protocol or exec mode)"})
			s.end(nil)
			return
		default:
			s.fail(adminError("unsupported packet type for admin console: %d", typ))
			s.end(nil)
			return
		}
	}
}

// write sends p to the client. A failed write closes the connection,
// which ends the session at its next read.
func (s *session) write(p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.conn.Write(p)
	if err != nil && !s.closed.Load() {
		s.log.Debug("client write failed", zap.Error(err))
		_ = s.conn.Close()
	}
	return err
}

// fail sends a final error and has the connection closed: the first
// caller sends werr, a later one only closes.
func (s *session) fail(werr *wire.Error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// Bounds the final write, and a writer blocked on a client that does
	// not read.
	_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	if s.final.CompareAndSwap(nil, werr) {
		_, _ = s.conn.Write(werr.Append(nil))
	}
	s.pc.Finish()
}

// Cancel interrupts a PAUSE or WAIT_CLOSE in progress (a cancel request
// with the connection's key).
func (s *session) Cancel() { s.cancelWait(errCancelRequest) }

// Terminate ends the session from another goroutine (shutdown,
// KILL_CLIENT): the client gets werr, and its reader, woken, ends the
// session.
func (s *session) Terminate(werr *wire.Error) {
	if s.closed.Load() {
		return
	}
	s.cancelWait(errTerminated)
	s.fail(werr)
}

func (s *session) cancelWait(cause error) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waitCancel != nil {
		s.waitCancel(cause)
	}
}

// end cleans up after the client has gone or the session was ended.
func (s *session) end(err error) {
	s.endOnce.Do(func() {
		s.closed.Store(true)
		s.wmu.Lock() // a final message being written goes out first
		s.pc.Close()
		s.wmu.Unlock()
		s.c.sessions.Add(-1)
		s.cancelWait(errTerminated)
		if s.c.p.Config().LogDisconnections {
			fields := []zap.Field{zap.Duration("duration", time.Since(s.pc.ConnectedAt).Round(time.Millisecond))}
			if werr := s.final.Load(); werr != nil {
				fields = append(fields, zap.String("reason", werr.Message), zap.String("sqlstate", werr.Code))
			} else if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
				fields = append(fields, zap.Error(err))
			}
			s.log.Info("client disconnected", fields...)
		}
	})
}
