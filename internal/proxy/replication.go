// Replication connections: a client that logs in with the startup parameter
// replication=true (physical: pg_basebackup, pg_receivewal, a standby) or
// replication=database (logical: pg_recvlogical, a subscription, CDC tools)
// gets a server connection of its own, opened for it with the same
// parameter and closed with it: never pooled, never shared, in any pool
// mode, as PgBouncer 1.23+ does. After the login the bytes pass through
// unread in both directions, except that the server's stream is followed
// message by message, so that poolerd can end a pair (shutdown, KILL) with a
// FATAL at a message boundary rather than a cut socket.

package proxy

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// replMode is what a client's replication startup parameter asks for.
type replMode uint8

const (
	replNone     replMode = iota
	replPhysical          // replication=true (or any other true boolean)
	replLogical           // replication=database
)

// String is the mode as PgBouncer's SHOW CLIENTS and SHOW SERVERS name it.
func (m replMode) String() string {
	switch m {
	case replPhysical:
		return "physical"
	case replLogical:
		return "logical"
	}
	return "none"
}

// startupValue is the replication parameter sent to PostgreSQL.
func (m replMode) startupValue() string {
	if m == replLogical {
		return "database"
	}
	return "true"
}

// parseReplication reads the replication startup parameter as PostgreSQL
// does: "database", or a boolean as parse_bool reads one (true, false, yes,
// no, on, off, 1, 0 and their unambiguous prefixes, in any case).
func parseReplication(v string) (replMode, error) {
	if v == "database" {
		return replLogical, nil
	}
	lower := strings.ToLower(v)
	prefixOf := func(word string, min int) bool {
		return len(lower) >= min && len(lower) <= len(word) && word[:len(lower)] == lower
	}
	switch {
	case lower == "1", prefixOf("true", 1), prefixOf("yes", 1), prefixOf("on", 2):
		return replPhysical, nil
	case lower == "0", prefixOf("false", 1), prefixOf("no", 1), prefixOf("off", 2):
		return replNone, nil
	}
	return replNone, &wire.Error{Severity: "FATAL", Code: "22023",
		Message: fmt.Sprintf("invalid value for parameter %q: %q", "replication", v),
		Hint:    `Valid values are: "false", 0, "true", 1, "database".`}
}

// replicationParams are the startup parameters a replication client's
// server connection is opened with: the client's own, options verbatim
// (its server connection is its alone, so any switch PostgreSQL takes is
// fine: a subscription's walreceiver sends several), but for user,
// database and replication, which poolerd sets, and protocol options.
func replicationParams(raw map[string]string) map[string]string {
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		if k != "user" && k != "database" && k != "replication" && !strings.HasPrefix(k, "_pq_.") {
			out[k] = v
		}
	}
	return out
}

// replPair is a replication client and the server connection opened for it.
type replPair struct {
	// Set before the pair is registered; read-only afterwards.
	srv                     *Server
	id                      uint64
	client                  net.Conn
	server                  *backend.Conn
	mode                    replMode
	database, user, appName string
	// serverID numbers the server connection among connections;
	// serverUser is the role it logged in as.
	serverID   uint64
	serverUser string
	// release gives back the place the pair's server connection holds in
	// its pool's size (pool.TakeSlot), and so under max_db_connections and
	// max_user_connections.
	release     func()
	connectedAt time.Time
	pid, key    uint32 // the client's BackendKeyData
	log         *zap.Logger

	// end, once set, is the FATAL that ends the pair: the server-to-client
	// copy sends it at the next message boundary (see endWith).
	end atomic.Pointer[wire.Error]
	// graced: the copy already gave the server's current message its
	// replEndGrace to complete (the copy's goroutine only).
	graced bool
}

// replEndGrace is how long an ended pair waits for the server's message in
// flight to complete before it closes without a final message.
const replEndGrace = time.Second

// errReplEnded is the copy's end when it sent the pair's end message.
var errReplEnded = errors.New("replication connection ended by poolerd")

// openReplication opens the server connection of a replication client that
// has authenticated, and sends the client its welcome: the server's own
// parameters, a BackendKeyData of poolerd's (cancel requests are forwarded
// with the backend's), ReadyForQuery. It returns false after refusing the
// client.
func (s *session) openReplication(ctx context.Context, params map[string]string) bool {
	dbp := s.dbp
	// The replication connection takes a place in its pool's size (and so
	// under max_db_connections and max_user_connections), as PgBouncer
	// counts it in pool_size: a free place, an idle connection's (closed
	// for it), or the first one freed, waiting as a checkout does, within
	// checkout_timeout.
	tctx := ctx
	if limit := dbp.route().Settings.CheckoutTimeout; limit > 0 {
		var cancel context.CancelFunc
		tctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	release, err := dbp.pool.TakeSlot(tctx)
	if err != nil {
		s.refuseLogin(asFatal(dbp.checkoutError(err)))
		return false
	}
	// The entry's server_parameters, under the client's own.
	sp := map[string]string{}
	for k, v := range dbp.route().ServerParams {
		sp[txstate.CanonicalParam(k)] = v
	}
	maps.Copy(sp, params)
	sp["replication"] = s.login.repl.startupValue()
	bc, err := dbp.dialDirect(ctx, sp)
	if err != nil {
		release()
		werr := wireError(asFatal(dbp.connectError(err)))
		if werr.Hint == "" {
			werr.Hint = fmt.Sprintf("PostgreSQL refused the replication connection poolerd opened for this client as %q: that role needs the REPLICATION attribute, and pg_hba.conf a line for it (database replication for physical replication, the database for logical)", dbp.route().ServerUser)
		}
		// PgBouncer's words, with the server's in DETAIL.
		s.srv.log.Warn("replication server login failed", zap.String("database", s.database), zap.String("user", dbp.route().ServerUser),
			zap.String("error", werr.Message))
		werr = &wire.Error{Severity: werr.Severity, Code: werr.Code, Message: "login failed", Detail: werr.Message, Hint: werr.Hint}
		s.refuseLogin(werr)
		return false
	}
	p := &replPair{srv: s.srv, id: s.id, client: s.conn, server: bc, mode: s.login.repl, database: s.database, user: s.user,
		appName: params["application_name"], serverID: s.srv.connIDs.Add(1), serverUser: dbp.route().ServerUser, release: release,
		connectedAt: s.connectedAt, log: s.srv.log.With(zap.Uint64("client_id", s.id), zap.String("database", s.database),
			zap.String("user", s.user), zap.String("replication", s.login.repl.String()))}
	s.srv.registerRepl(p)
	welcome := append([]byte(nil), s.login.out...)
	s.login.out = nil
	names := slices.Sorted(maps.Keys(bc.Params))
	for _, k := range names {
		welcome = wire.AppendParameterStatus(welcome, k, bc.Params[k])
	}
	welcome = wire.AppendBackendKeyData(welcome, p.pid, p.key)
	welcome = wire.AppendReadyForQuery(welcome, wire.TxIdle)
	if _, err := s.conn.Write(welcome); err != nil {
		p.close()
		return false
	}
	s.login.replPair = p
	p.log.Info("replication connection opened", zap.String("server", bc.Target.String()), zap.Uint32("backend_pid", bc.PID))
	return true
}

// dialDirect opens a server connection outside the pool with the startup
// parameters params (a replication connection): to the entry's first host
// that accepts it, in the order the entry lists them.
func (d *dbPool) dialDirect(ctx context.Context, params map[string]string) (*backend.Conn, error) {
	r := d.route()
	creds := d.credentials()
	var errs []error
	for _, h := range r.Hosts {
		t := d.target()
		t.Host, t.Port = h.Host, h.Port
		bc, err := backend.Connect(ctx, t, r.DBName, creds, params)
		if err == nil {
			return bc, nil
		}
		var se *backend.ServerError
		var ae *backend.AuthError
		if errors.As(err, &se) && !transientRefusal(se.Code) || errors.As(err, &ae) || ctx.Err() != nil {
			return nil, err // a refusal of this login: another host would refuse it too
		}
		errs = append(errs, fmt.Errorf("%s: %w", h, err))
	}
	return nil, errors.Join(errs...)
}

// serveReplication copies the pair's bytes until either side closes or
// poolerd ends it; rest are bytes the client sent after its startup
// message, read with it.
func (srv *Server) serveReplication(p *replPair, rest []byte) {
	fromClient := make(chan error, 1)
	go func() {
		var err error
		if len(rest) > 0 {
			_, err = p.server.Write(rest)
		}
		if err == nil {
			_, err = io.Copy(p.server, p.client)
		}
		// The client left (or poolerd stopped this copy): the backend
		// ends its stream when its connection closes.
		_ = p.server.Close()
		fromClient <- err
	}()
	err := p.toClient()
	_ = p.server.Close()
	// Stop the other copy, which may be waiting for the client.
	_ = p.client.SetReadDeadline(time.Now())
	<-fromClient
	srv.forgetRepl(p)
	// The client reads what it was sent last (poolerd's FATAL, or the
	// server's own) before the connection closes: a close with its
	// standby status updates unread would reset the connection.
	_ = p.client.SetReadDeadline(time.Time{})
	lingerClose(p.client)
	fields := []zap.Field{zap.Duration("duration", time.Since(p.connectedAt).Round(time.Millisecond))}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		fields = append(fields, zap.Error(err))
	}
	p.log.Info("replication connection closed", fields...)
}

// toClient copies the server's stream to the client a message at a time,
// flushing whenever the server has nothing more buffered. It returns
// errReplEnded once it sent the pair's end message, or the error that ended
// the stream (io.EOF: the server closed at a message boundary).
func (p *replPair) toClient() error {
	br := bufio.NewReaderSize(p.server, 32<<10)
	bw := bufio.NewWriterSize(p.client, 32<<10)
	for {
		if werr := p.end.Load(); werr != nil {
			if err := p.sendEnd(bw, werr); err != nil {
				return err
			}
			return errReplEnded
		}
		err := p.need(br, bw, wire.HeaderLen, true)
		if errors.Is(err, errReplEnded) {
			continue // at a boundary: send the end message
		}
		if err != nil {
			return err
		}
		hdr, _ := br.Peek(wire.HeaderLen)
		var cur wire.Cursor
		if _, _, err := cur.Next(hdr); err != nil {
			return fmt.Errorf("from the server: %w", err)
		}
		if _, err := bw.Write(hdr); err != nil {
			return err
		}
		_, _ = br.Discard(wire.HeaderLen)
		for left := cur.Len; left > 0; {
			if err := p.need(br, bw, 1, false); err != nil {
				return err
			}
			chunk, _ := br.Peek(min(left, br.Buffered()))
			if _, err := bw.Write(chunk); err != nil {
				return err
			}
			_, _ = br.Discard(len(chunk))
			left -= len(chunk)
		}
	}
}

// need waits until br holds n bytes, flushing bw first if it must wait. A
// read cut short by endWith returns errReplEnded at a message boundary
// (boundary, nothing of the next message read yet); inside a message it
// gives the message replEndGrace to complete, once.
func (p *replPair) need(br *bufio.Reader, bw *bufio.Writer, n int, boundary bool) error {
	if br.Buffered() < n && bw.Buffered() > 0 {
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	for {
		_, err := br.Peek(n)
		if err == nil {
			return nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || p.end.Load() == nil {
			if boundary && br.Buffered() == 0 && errors.Is(err, io.ErrUnexpectedEOF) {
				err = io.EOF
			}
			return err
		}
		if boundary && br.Buffered() == 0 {
			return errReplEnded
		}
		if p.graced {
			return err
		}
		p.graced = true
		_ = p.server.SetReadDeadline(time.Now().Add(replEndGrace))
	}
}

// sendEnd writes the pair's end message after what the client was sent.
func (p *replPair) sendEnd(bw *bufio.Writer, werr *wire.Error) error {
	_ = p.client.SetWriteDeadline(time.Now().Add(replEndGrace))
	if _, err := bw.Write(werr.Append(nil)); err != nil {
		return err
	}
	return bw.Flush()
}

// endWith ends the pair with werr, sent at the next boundary of the server's
// stream (a kill, a shutdown). Later calls do nothing.
func (p *replPair) endWith(werr *wire.Error) {
	if p.end.CompareAndSwap(nil, werr) {
		_ = p.server.SetReadDeadline(time.Now()) // wakes the copy
	}
}

// close closes both connections of a pair that never started copying.
func (p *replPair) close() {
	p.srv.forgetRepl(p)
	_ = p.server.Close()
	_ = p.client.Close()
}

// cancel forwards a client's cancel request to its backend.
func (p *replPair) cancel() {
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	if err := backend.Cancel(ctx, p.server.Target, p.server.PID, p.server.Key); err != nil {
		p.log.Warn("cancel request to server failed", zap.Error(err))
	}
}

// registerRepl gives p its BackendKeyData and makes it known: counted as a
// client, listed, reachable by cancel requests, KILL and shutdown.
func (srv *Server) registerRepl(p *replPair) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	p.pid, p.key = srv.newKeyLocked()
	srv.repl[p.id] = p
}

// replPIDLocked reports whether a pair has pid in its BackendKeyData
// (srv.mu held).
func (srv *Server) replPIDLocked(pid uint32) bool {
	for _, p := range srv.repl {
		if p.pid == pid {
			return true
		}
	}
	return false
}

// forgetRepl removes p and gives back its server connection's place in its
// pool. Later calls do nothing.
func (srv *Server) forgetRepl(p *replPair) {
	srv.mu.Lock()
	_, ok := srv.repl[p.id]
	delete(srv.repl, p.id)
	srv.mu.Unlock()
	if ok {
		p.release()
	}
}

// replPairs returns the replication pairs of database ("" for all).
func (srv *Server) replPairs(database string) []*replPair {
	srv.mu.Lock()
	out := make([]*replPair, 0, len(srv.repl))
	for _, p := range srv.repl {
		if database == "" || p.database == database {
			out = append(out, p)
		}
	}
	srv.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// lookupRepl returns the pair whose BackendKeyData is (pid, key), or nil.
// Keys are compared in constant time (as lookupSession).
func (srv *Server) lookupRepl(pid, key uint32) *replPair {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var found *replPair
	for _, p := range srv.repl {
		if p.pid == pid && subtle.ConstantTimeEq(int32(p.key), int32(key)) == 1 {
			found = p
		}
	}
	return found
}

// endReplication ends the replication pairs of database ("" for all) with
// werr.
func (srv *Server) endReplication(database string, werr *wire.Error) {
	for _, p := range srv.replPairs(database) {
		p.endWith(werr)
	}
}

// ReplicationCount is how many replication connections a database and user
// have in one mode.
type ReplicationCount struct {
	Database, User, Mode string
	Count                int
}

// ReplicationCounts counts the replication connections by database, user
// and mode.
func (srv *Server) ReplicationCounts() []ReplicationCount {
	counts := map[ReplicationCount]int{}
	for _, p := range srv.replPairs("") {
		counts[ReplicationCount{Database: p.database, User: p.user, Mode: p.mode.String()}]++
	}
	out := make([]ReplicationCount, 0, len(counts))
	for k, n := range counts {
		k.Count = n
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Database != b.Database {
			return a.Database < b.Database
		}
		if a.User != b.User {
			return a.User < b.User
		}
		return a.Mode < b.Mode
	})
	return out
}
