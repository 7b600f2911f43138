package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/hba"
	"github.com/poolerd/poolerd/internal/netopt"
	"github.com/poolerd/poolerd/internal/txstate"
	"github.com/poolerd/poolerd/internal/wire"
)

// serveConn runs one client connection from its first byte to its last.
//
// A TCP client's socket already has TCP_NODELAY and keepalive (every
// clientKeepAlive): Go's accept sets them (the listener's defaults), and
// setting them again would cost four system calls per connection; only
// tcp_* keys that ask for something else are applied here.
func (srv *Server) serveConn(nc net.Conn) {
	cfg := srv.cfg()
	if o := tcpOptions(cfg, clientKeepAlive); o != nil {
		_ = o.Apply(nc)
	}
	s := &session{srv: srv, conn: nc, id: srv.connIDs.Add(1), addr: clientAddr(nc), connectedAt: time.Now()}
	s.yieldFn = s.yieldLoop
	s.log = sessionLog{s}
	s.timeoutsP.Store(&s.srv.noTimeouts)
	s.login = &loginState{}
	s.handshaking.Store(true)
	if t := cfg.ClientLoginTimeout; t > 0 {
		s.login.deadline = time.Now().Add(t)
		_ = nc.SetDeadline(s.login.deadline)
	}
	if !srv.trackLogin(nc, true) {
		_ = nc.Close() // shutting down
		return
	}
	ok := s.handshake(cfg)
	srv.trackLogin(nc, false)
	rest := s.loginBuffered()
	if !ok {
		s.releaseClientSlot()
		if s.endErr.Load() != nil {
			lingerClose(nc) // refused: let the client read why
		} else {
			_ = nc.Close()
		}
		return
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		s.end(err)
		return
	}
	if p := s.login.replPair; p != nil {
		s.login = nil
		srv.serveReplication(p, rest)
		s.releaseClientSlot()
		return
	}
	if IsConsoleDatabase(s.database) {
		// The console sends its own AuthenticationOk: what authentication
		// left to send (SASLFinal) goes first.
		if len(s.login.out) > 0 {
			_, err := s.conn.Write(s.login.out)
			s.login.out = nil
			if err != nil {
				s.end(err)
				return
			}
		}
		srv.serveConsole(s, rest)
		s.releaseClientSlot()
		return
	}
	s.login = nil
	if len(rest) > 0 {
		s.login = &loginState{pending: rest} // the relay reads it first
	}
	s.startRelay()
}

// useRoute sets what the session's pool and route decide.
func (s *session) useRoute(dbp *dbPool, route config.Route, cfg *config.Config) {
	s.dbp = dbp
	s.mode = route.Settings.PoolMode
	s.stateful = s.mode != config.PoolSession
	s.maxPrepared.Store(int64(route.Settings.MaxPreparedStatements))
	s.maxPacket = int32(cfg.MaxPacketSize) // validated: below 2^30
	s.tracked = s.stateful && route.Settings.MaxPreparedStatements > 0
	s.refuseState = route.Settings.SessionState == config.SessionStateRefuse
	s.timeoutsP.Store(s.srv.timeoutsFor(route.Settings)) // the client's own: per-user overrides apply
}

// handshake answers encryption requests, reads the startup message,
// authenticates the client and sends the session's welcome. It returns
// false if the connection is done (cancel request, refusal, timeout).
func (s *session) handshake(cfg *config.Config) bool {
	var sslDone, gssDone bool
	for first := true; ; first = false {
		r := s.loginReader()
		if first {
			// PostgreSQL 17's direct TLS (sslnegotiation=direct): the
			// client starts with a TLS ClientHello instead of an
			// SSLRequest. Its first byte, a TLS handshake record (0x16),
			// cannot begin a startup packet (its length would be over
			// 369 MB).
			b, err := r.Peek(1)
			if err != nil {
				s.loginFailed(err)
				return false
			}
			if b[0] == tlsHandshakeRecord {
				if tc := s.srv.clientTLSDirect.Load(); tc != nil {
					if !s.startDirectTLS(tc, s.loginBuffered()) {
						return false
					}
					sslDone = true
					continue
				}
			}
		}
		body, err := wire.ReadStartup(r)
		if err != nil {
			s.loginFailed(err)
			return false
		}
		code := binary.BigEndian.Uint32(body)
		switch {
		case code == wire.CodeSSL || code == wire.CodeGSSENC:
			name, done := "SSLRequest", &sslDone
			if code == wire.CodeGSSENC {
				name, done = "GSSENCRequest", &gssDone
			}
			if len(body) != 4 {
				s.refuseLogin(loginViolation(fmt.Sprintf("invalid %s length %d: it is 8", name, len(body)+4),
					"the client sent a malformed encryption request; check the driver"))
				return false
			}
			// Each request is answered once, as PostgreSQL does: a client
			// repeating one would otherwise loop until the login timeout.
			if *done {
				s.refuseLogin(loginViolation("duplicate "+name+": encryption was already negotiated on this connection",
					"a client sends SSLRequest and GSSENCRequest at most once each, before its startup message; check the driver"))
				return false
			}
			*done = true
			if code == wire.CodeSSL {
				if tc := s.srv.clientTLS.Load(); tc != nil {
					// As PostgreSQL (CVE-2021-23214): bytes sent after
					// the SSLRequest, before its answer, would be taken
					// as if they had come over TLS.
					if r.Buffered() > 0 {
						s.refuseLogin(loginViolation("received unencrypted data after SSL request",
							"the client (or something between it and poolerd) sent data before poolerd answered its SSLRequest; check the driver and the network path"))
						return false
					}
					if !s.startTLS(tc) {
						return false
					}
					continue
				}
			}
			// No TLS here (client_tls_sslmode disable), no GSS encryption:
			// 'N' tells the client to go on in plain text (or give up, if
			// it requires encryption).
			if _, err := s.conn.Write([]byte{'N'}); err != nil {
				return false
			}
		case code == wire.CodeCancel:
			s.srv.handleCancel(body)
			return false
		case code>>16 == 3:
			return s.startup(cfg, body)
		default:
			s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "0A000",
				Message: fmt.Sprintf("unsupported frontend protocol %d.%d: server supports 3.0 to 3.0", code>>16, code&0xffff),
				Hint:    "use a client that speaks PostgreSQL protocol version 3"})
			return false
		}
	}
}

// startTLS answers an SSLRequest with 'S' and runs the TLS handshake (bounded
// by the login deadline already on the socket); the session then talks TLS.
// A failed handshake ends the connection without a message: there is no
// channel left to send one on (the client's TLS library reports why).
func (s *session) startTLS(tc *tls.Config) bool {
	if _, err := s.conn.Write([]byte{'S'}); err != nil {
		return false
	}
	conn := tls.Server(s.conn, tc)
	if err := conn.Handshake(); err != nil {
		s.log.Info("client TLS handshake failed", zap.Error(err))
		return false
	}
	s.conn, s.tls = conn, true
	return true
}

// tlsHandshakeRecord is the first byte of a TLS ClientHello.
const tlsHandshakeRecord = 0x16

// alpnPostgreSQL is the ALPN protocol of PostgreSQL, which direct TLS
// requires.
const alpnPostgreSQL = "postgresql"

// startDirectTLS runs the TLS handshake of a client that started with a
// ClientHello (first, already read). As PostgreSQL 17 does, the client
// must have negotiated the ALPN protocol "postgresql"; one that offered
// other protocols only fails the handshake (no_application_protocol
// alert), one that offered none is refused with an ErrorResponse over
// TLS.
func (s *session) startDirectTLS(tc *tls.Config, first []byte) bool {
	conn := tls.Server(&replayConn{Conn: s.conn, first: first}, tc)
	if err := conn.Handshake(); err != nil {
		s.log.Info("client direct TLS handshake failed", zap.Error(err))
		return false
	}
	s.conn, s.tls = conn, true
	if conn.ConnectionState().NegotiatedProtocol != alpnPostgreSQL {
		s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "08P01",
			Message: "received direct SSL connection request without ALPN protocol negotiation extension",
			Hint:    `a client using sslnegotiation=direct must offer the ALPN protocol "postgresql" (libpq 17 does); or connect with sslnegotiation=postgres`})
		return false
	}
	return true
}

// loginState is what a login keeps until the relay starts.
type loginState struct {
	deadline time.Time // client_login_timeout's; zero: none
	// out is what the login has still to send once it succeeds (after
	// authentication, with the welcome).
	out []byte
	// r reads the login's messages (buffered), from rConn; pending is
	// what it had read beyond them, for the relay's first read.
	r       *bufio.Reader
	rConn   net.Conn
	pending []byte
	// localAdmin: the console login of user pgbouncer over the Unix
	// socket from poolerd's own operating-system user (localConsoleAdmin).
	localAdmin bool
	// repl is what the replication startup parameter asks for; replPair,
	// once the login succeeded, the pair serveConn then serves.
	repl     replMode
	replPair *replPair
}

// loginBufSize is the size of a login's read buffer: a startup message
// or an authentication message of a usual client fits (larger ones are
// read through it).
const loginBufSize = 1024

// loginReader is the buffered reader of the login's messages: one read
// takes in a whole message (or several), where exact reads take two (a
// header, a body). It reads s.conn (TLS once that is on). What it holds
// when the login is over goes to the relay (loginBuffered).
func (s *session) loginReader() *bufio.Reader {
	if s.login.r == nil {
		s.login.r = s.srv.loginReaders.Get().(*bufio.Reader)
		s.login.r.Reset(s.conn)
		s.login.rConn = s.conn
	} else if s.login.rConn != s.conn {
		// TLS started: nothing was buffered (refused otherwise).
		s.login.r.Reset(s.conn)
		s.login.rConn = s.conn
	}
	return s.login.r
}

// loginBuffered ends the login's buffered reading: it returns what the
// reader holds beyond the login's messages (nil if nothing) and gives the
// reader back.
func (s *session) loginBuffered() []byte {
	if s.login.r == nil {
		return nil
	}
	var rest []byte
	if n := s.login.r.Buffered(); n > 0 {
		b, _ := s.login.r.Peek(n)
		rest = bytes.Clone(b)
	}
	s.login.r.Reset(nil)
	s.srv.loginReaders.Put(s.login.r)
	s.login.r, s.login.rConn = nil, nil
	return rest
}

// replayConn gives back the bytes already read from Conn before reading
// more.
type replayConn struct {
	net.Conn
	first []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// tlsRefusal is the refusal of a login that client_tls_sslmode does not
// allow: a plain connection where TLS is required, or a client certificate
// whose common name is not the user (verify-full); nil if it may go on.
// The Unix socket is exempt, as in PgBouncer and PostgreSQL: it carries no
// TLS, and its peers are local.
func (s *session) tlsRefusal(mode string) error {
	_, unix := s.conn.RemoteAddr().(*net.UnixAddr)
	switch {
	case unix:
	case !s.tls && (mode == "require" || mode == "verify-ca" || mode == "verify-full"):
		return &wire.Error{Severity: "FATAL", Code: "28000", Message: "SSL required",
			Hint: fmt.Sprintf("client_tls_sslmode is %s: connect with sslmode=require (or verify-ca, verify-full)", mode)}
	case s.tls && mode == "verify-full":
		certs := s.conn.(*tls.Conn).ConnectionState().PeerCertificates
		if len(certs) == 0 || certs[0].Subject.CommonName != s.user {
			cn := ""
			if len(certs) > 0 {
				cn = certs[0].Subject.CommonName
			}
			return &wire.Error{Severity: "FATAL", Code: "28000",
				Message: fmt.Sprintf("certificate authentication failed for user %q", s.user),
				Detail:  fmt.Sprintf("the client certificate's common name is %q", cn),
				Hint:    "client_tls_sslmode is verify-full: connect as the user your certificate names, or use a certificate for this user"}
		}
	}
	return nil
}

// loginFailed ends a login that failed with err: a refusal (a *wire.Error,
// or an impossible startup length) is sent and logged, a timeout is the
// login timeout, and a client that went away is only logged at debug.
func (s *session) loginFailed(err error) {
	var ne net.Error
	var werr *wire.Error
	var le *wire.StartupLengthError
	switch {
	case errors.As(err, &ne) && ne.Timeout() && s.srv.shuttingDown():
		s.fail(errShuttingDown()) // woken by stopAccepting
	case errors.As(err, &ne) && ne.Timeout():
		s.srv.loginTimeouts.Add(1)
		s.fail(errLoginTimeout())
		s.log.Info("client login timed out")
	case errors.As(err, &werr):
		s.refuseLogin(werr)
	case errors.As(err, &le):
		s.refuseLogin(startupLengthRefusal(le))
	default:
		s.log.Debug("client handshake failed", zap.Error(err))
	}
}

func (s *session) startup(cfg *config.Config, body []byte) bool {
	version, raw, werr := parseStartup(body)
	if werr != nil {
		s.refuseLogin(werr)
		return false
	}
	s.user = raw["user"]
	if s.user == "" {
		s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "28000", Message: "no PostgreSQL user name specified in startup packet",
			Hint: "set the user in the connection settings"})
		return false
	}
	s.database = raw["database"]
	if s.database == "" {
		s.database = s.user
	}
	s.logged.Store(true) // log lines name the database and user from now on
	if s.srv.consoleOnly.Load() && onUnixSocket(s.conn) && !IsConsoleDatabase(s.database) {
		// A shutdown or drain keeps the Unix socket for the console only.
		s.refuseLogin(errShuttingDown())
		return false
	}
	if err := s.tlsRefusal(cfg.ClientTLSSSLMode); err != nil {
		s.refuseLogin(err)
		return false
	}
	var params map[string]string
	var err error
	if v, ok := raw["replication"]; ok {
		s.login.repl, err = parseReplication(v)
	}
	switch {
	case err != nil:
	case s.login.repl != replNone:
		params = replicationParams(raw)
	default:
		params, err = txstate.StartupParams(raw, cfg.IgnoreStartupParameters)
	}
	if err == nil && s.login.repl == replNone && cfg.ApplicationNameAddHost && !IsConsoleDatabase(s.database) {
		// As PgBouncer: at login only; a later SET is the client's.
		params["application_name"] = cmp.Or(params["application_name"], "app") + " - " + s.addr
	}
	if err == nil && s.login.repl != replNone && IsConsoleDatabase(s.database) {
		err = &wire.Error{Severity: "FATAL", Code: "0A000", Message: "the admin console does not take replication connections",
			Hint: "connect to the console without the replication parameter"}
	}
	if err == nil && len(params) > maxStartupParams {
		err = tooManyParams(len(params))
	}
	if err != nil {
		s.refuseLogin(err)
		return false
	}
	if nego := negotiation(version, raw); nego != nil {
		if _, err := s.conn.Write(nego); err != nil {
			return false
		}
	}
	// The limits on what the client is (max_client_conn, login rates by
	// address) come before any authentication work, so that a login storm
	// costs little; those on who it claims to be, after it (admitUser).
	if !IsConsoleDatabase(s.database) && !s.admitLogin(raw["application_name"]) {
		return false
	}
	// With no database configured at all (PgBouncer's packaged sample)
	// there is nothing to hide: the refusal comes before authentication, as
	// PgBouncer's does, and so even without a password to check.
	if !IsConsoleDatabase(s.database) && cfg.ServesNoDatabase() {
		s.refuseLogin(errNoSuchDatabase(s.database))
		return false
	}
	// Authenticate before looking at the database, as PostgreSQL does, so
	// that an anonymous client cannot learn which databases exist.
	authOK, queried := s.authenticate(cfg)
	if !authOK {
		return false
	}
	if IsConsoleDatabase(s.database) {
		if s.srv.consoleServer() == nil {
			s.refuseLogin(errNoConsole())
			return false
		}
		// Console logins count under the client limits of their user
		// (and of the console's database), as PgBouncer's do; an admin
		// is counted but never refused by them, so that the console
		// stays open to whoever must raise them.
		if s.login.localAdmin || slices.Contains(cfg.AdminUsers, s.user) {
			s.srv.countClient(s.database, s.user)
			s.admitted.Store(true)
			return true
		}
		return s.admitUser() // serveConn hands the connection to the console
	}
	if !s.admitUser() {
		return false
	}
	if _, disabled := s.srv.dbFlags(s.database); disabled {
		s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "08P01", Message: fmt.Sprintf("database %q is disabled", s.database),
			Hint: "an administrator ran DISABLE on it; ENABLE on the admin console lets clients in again"})
		return false
	}
	route, err := cfg.Route(s.database, s.user)
	if err != nil {
		s.refuseLogin(errNoSuchDatabase(s.database))
		return false
	}
	dbp, err := s.srv.joinPool(s.database, s.user)
	if err != nil {
		s.refuseLogin(errNoSuchDatabase(s.database))
		return false
	}
	defer dbp.joining.Add(-1) // counted in clients by then, or failed
	s.useRoute(dbp, route, cfg)
	if s.user == route.ServerUser {
		// SCRAM pass-through logs in as the client's own role: the key
		// of a client of a forced user's pool that logged in as another
		// user would not open that role's connections (and would
		// replace a key that does).
		dbp.setClientKey(s.clientKey)
	}
	dbp.setQuerySecret(queried)
	s.login.out, _ = (&pgproto3.AuthenticationOk{}).Encode(s.login.out)
	ctx, cancel := context.WithCancel(s.srv.ctx)
	defer cancel()
	if !s.login.deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, s.login.deadline)
		defer cancel()
	}
	if s.login.repl != replNone {
		return s.openReplication(ctx, params)
	}
	// A session-mode client holds its server connection from login on, so
	// that its BackendKeyData can carry that backend's pid (see register):
	// it is checked out here, through the pool's one checkout path, and a
	// refusal (checkout_timeout, PostgreSQL unreachable) ends the login.
	reported, held, werr := dbp.prepareLogin(ctx, params, s.mode == config.PoolSession)
	switch {
	case werr != nil && s.srv.ctx.Err() != nil:
		// poolerd closed while the login waited for the server: that is
		// the shutdown, whatever the cut-short wait left behind (a
		// connection handed over just before, whose parameter check then
		// failed).
		werr = errShuttingDown()
	case werr != nil && !s.login.deadline.IsZero() && !time.Now().Before(s.login.deadline):
		// The login ran out of time waiting for the server: that is the
		// login timeout, whatever limit the wait itself reported.
		s.srv.loginTimeouts.Add(1)
		werr = errLoginTimeout()
	}
	if werr != nil {
		s.refuseLogin(werr)
		return false
	}
	// The session's parameters: the server's defaults for those kept per
	// client, with the client's own values over them.
	s.params = map[string]string{}
	defaults := dbp.defaultParams()
	for k, v := range defaults {
		if txstate.SyncedParam(k) {
			s.params[k] = v
		}
	}
	maps.Copy(s.params, reported)
	// Clients of one application have the same parameters: they share one
	// map (copied before a change, see ownParams), which an idle client
	// would otherwise hold alone.
	s.pkey = txstate.ParamsKey(s.params)
	if set, ok := dbp.shareParams(s.pkey, s.params); ok {
		s.params, s.pkey, s.paramsShared = set.params, set.key, true
	}
	if s.srv.shuttingDown() && !s.srv.loginsFinish() {
		if held != nil {
			dbp.checkin(held)
		}
		s.fail(errShuttingDown())
		return false
	}
	s.srv.register(s, held)
	if s.timeouts().idleTracked() {
		s.noteActive(s.srv.nanotime())
	}
	// What authentication left to send (SASLFinal, AuthenticationOk) goes
	// with the welcome: one write, one wake-up of the client, where a
	// write each cost three. A refusal before this point sends the error
	// alone, as PostgreSQL's clients take it at any step of a login.
	welcome := append(make([]byte, 0, 512+len(s.login.out)), s.login.out...)
	s.login.out = nil
	names := make([]string, 0, len(defaults))
	for k := range defaults {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := defaults[k]
		if cv, ok := s.params[k]; ok {
			v = cv
		}
		welcome = wire.AppendParameterStatus(welcome, k, v)
	}
	welcome = wire.AppendBackendKeyData(welcome, s.pid, s.key)
	if msg := cfg.LoginNotifyMessage; msg != "" {
		welcome = (&wire.Error{Severity: "NOTICE", Code: "00000", Message: msg}).AppendNotice(welcome)
	}
	welcome = wire.AppendReadyForQuery(welcome, wire.TxIdle)
	if _, err := s.conn.Write(welcome); err != nil {
		s.srv.forget(s)
		if held != nil {
			dbp.checkin(held)
		}
		return false
	}
	dbp.clients.Add(1) // logged in; end() takes it back
	dbp.ctr.logins.Add(1)
	if s.srv.shuttingDown() {
		// Logged in during a shutdown that lets logins finish: its first
		// request is answered, if it comes soon (Server.loginsFinish).
		time.AfterFunc(max(firstRequestGrace-time.Since(s.connectedAt), 0), s.terminateIfIdle)
	}
	if held != nil {
		// The session takes the connection the welcome named, as it would
		// at a first request, and brings the server's parameters in line
		// with the client's now (application_name in pg_stat_activity
		// included) rather than ahead of the first request. Should the
		// backend have gone meanwhile, the client gets 08006 as from a
		// backend that died just after login; the relay then ends the
		// session.
		if err := s.attach(held); err != nil {
			s.fail(err)
		} else if s.flush(nil, batch{}) && s.srv.endAtIdle() {
			s.terminateIfIdle() // a shutdown found it busy attaching
		}
	}
	if cfg.LogConnections {
		s.log.Info("client connected", zap.String("pool_mode", s.mode),
			zap.String("application_name", s.params["application_name"]))
	}
	return true
}

// negotiation returns a NegotiateProtocolVersion message when the client
// asked for a newer minor version or protocol options (_pq_.*); poolerd
// speaks 3.0 and no options, as PostgreSQL 15 does.
func negotiation(version uint32, raw map[string]string) []byte {
	var opts []string
	for k := range raw {
		if strings.HasPrefix(k, "_pq_.") {
			opts = append(opts, k)
		}
	}
	if version == pgproto3.ProtocolVersion30 && len(opts) == 0 {
		return nil
	}
	sort.Strings(opts)
	msg, _ := (&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: 0, UnrecognizedOptions: opts}).Encode(nil)
	return msg
}

// authenticate runs the client's authentication method (auth_type, or
// the matching access rule's). It returns false after sending the failure,
// and the secret auth_query found, if it ran.
func (s *session) authenticate(cfg *config.Config) (bool, auth.Secret) {
	if s.localConsoleAdmin() {
		s.login.localAdmin = true
		return true, auth.Secret{}
	}
	rule, ok := s.accessMethod(cfg)
	if !ok {
		return false, auth.Secret{}
	}
	method, identMap := rule.Method, rule.Map
	switch method {
	case config.AuthAny:
		return true, auth.Secret{}
	case config.AuthTrust:
		return s.authTrust(cfg)
	case hba.Cert, hba.Peer:
		check := s.certOK
		if method == hba.Peer {
			check = s.peerOK
		}
		if err := check(cfg, identMap); err != nil {
			s.srv.authFailures.Add(1)
			s.refuseLogin(err)
			return false, auth.Secret{}
		}
		return true, auth.Secret{}
	case hba.LDAP, hba.PAM:
		return s.authExternal(cfg, rule)
	}
	secret, known := cfg.ClientSecret(s.user)
	var queried auth.Secret
	if !known && authQueried(cfg, s.database) {
		var werr *wire.Error
		secret, known, werr = s.querySecret(cfg)
		if werr != nil {
			s.refuseLogin(werr)
			return false, auth.Secret{}
		}
		known = known && secret.Kind() != 0 // found without a password: no password passes
		if known {
			queried = secret
		}
	}
	useSCRAM := method == config.AuthSCRAM || method != hba.Password && secret.Kind() == auth.SecretSCRAM
	var err error
	switch {
	case method == hba.Password:
		ok, err = s.authPassword(secret, known)
	case useSCRAM:
		ok, err = s.authSCRAM(secret, known)
	default:
		ok, err = s.authMD5(secret, known)
	}
	if err != nil {
		s.loginFailed(err)
		return false, auth.Secret{}
	}
	if !ok {
		werr := errBadPassword(s.user)
		if useSCRAM {
			method = config.AuthSCRAM
			// PgBouncer's words for it, for every user alike.
			werr.Detail = "SASL authentication failed"
		}
		s.authFailed(cfg, werr, zap.String("method", method))
		return false, auth.Secret{}
	}
	s.srv.authDelays.succeeded(s.conn.RemoteAddr())
	return true, queried
}

// authFailed refuses a client whose password did not pass: counted, and
// delayed the longer the more its address failed in a row (the login
// deadline still applies), then refused with werr.
func (s *session) authFailed(cfg *config.Config, werr *wire.Error, fields ...zap.Field) {
	s.srv.authFailures.Add(1)
	if d := s.srv.authDelays.failed(s.conn.RemoteAddr(), time.Now(), cfg.AuthFailureDelay, cfg.AuthFailureDelayMax); d > 0 {
		if dl := s.login.deadline; !dl.IsZero() {
			d = min(d, max(time.Until(dl), 0))
		}
		time.Sleep(d)
	}
	// Logged before the client reads its error, as PgBouncer does: what
	// watches the log for a refusal finds it there once the client knows.
	s.log.Info("client authentication failed", fields...)
	s.fail(werr)
}

// authExternal asks the client for its password in clear text (as
// PostgreSQL's ldap and pam methods do: use TLS) and has an LDAP server or
// PAM check it. The password, accepted, is the secret the pool logs in to
// PostgreSQL with when the configuration has none for the user, as in
// PgBouncer.
func (s *session) authExternal(cfg *config.Config, rule hba.Rule) (bool, auth.Secret) {
	password, err := s.askPassword(&pgproto3.AuthenticationCleartextPassword{})
	if err != nil {
		s.loginFailed(err)
		return false, auth.Secret{}
	}
	ctx := s.srv.ctx
	if !s.login.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, s.login.deadline)
		defer cancel()
	}
	name := "LDAP"
	if rule.Method == hba.PAM {
		name = "PAM"
		err = s.pamCheck(rule, password)
	} else {
		err = rule.LDAP.Authenticate(ctx, s.user, password)
	}
	if err != nil {
		// PostgreSQL's message, whatever the reason: the reason (a wrong
		// password, an unknown user, a server that did not answer) is
		// for the log.
		s.authFailed(cfg, &wire.Error{Severity: "FATAL", Code: "28P01",
			Message: fmt.Sprintf("%s authentication failed for user %q", name, s.user)},
			zap.String("method", rule.Method), zap.Error(err))
		return false, auth.Secret{}
	}
	s.srv.authDelays.succeeded(s.conn.RemoteAddr())
	return true, auth.PlainSecret(password)
}

// pamCheck has PAM check the client's password, with the rule's service
// (pamservice) or auth_pam_service.
func (s *session) pamCheck(rule hba.Rule, password string) error {
	lib, err := s.srv.pamLib()
	if err != nil {
		return err
	}
	service := cmp.Or(rule.PAMService, s.srv.cfg().AuthPAMService, "pgbouncer")
	rhost := ""
	if a, ok := s.conn.RemoteAddr().(*net.TCPAddr); ok {
		rhost = a.IP.String()
	}
	return lib.Authenticate(service, s.user, password, rhost)
}

// localConsoleAdmin reports whether this is PgBouncer's local admin: user
// pgbouncer logging in to the admin console over the Unix socket from a
// process of poolerd's own operating-system user, which PgBouncer admits
// without a password and as an admin, whatever auth_type and admin_users
// say (its own tools and init scripts rely on it).
func (s *session) localConsoleAdmin() bool {
	if s.user != "pgbouncer" || !IsConsoleDatabase(s.database) {
		return false
	}
	uid, err := netopt.PeerUID(s.conn)
	return err == nil && int64(uid) == int64(os.Getuid())
}

// querySecret runs auth_query for the client's user (under the login
// deadline): its secret, and whether it found the user.
func (s *session) querySecret(cfg *config.Config) (auth.Secret, bool, *wire.Error) {
	ctx := s.srv.ctx
	if !s.login.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, s.login.deadline)
		defer cancel()
	}
	return s.srv.lookupSecret(ctx, cfg, s.database, s.user)
}

// authTrust admits a client without a password. As PgBouncer's trust
// ("the user name must still exist in auth_file"), once auth_file or
// auth_user is set only a user the configuration lists (auth_file, users
// with a password, upstream) or auth_query finds is admitted; the others
// get 28000 (PgBouncer closes with '"trust" authentication failed', or
// with auth_query 'no such user': poolerd's message has both; trust tells
// who exists anyway, by letting them in).
// Without either, every user name is admitted (Config.TrustListsUsers).
// It returns the secret auth_query found, if it ran: the server login
// uses it.
func (s *session) authTrust(cfg *config.Config) (bool, auth.Secret) {
	if !cfg.TrustListsUsers() {
		return true, auth.Secret{}
	}
	if _, known := cfg.ClientSecret(s.user); known {
		return true, auth.Secret{}
	}
	queried := authQueried(cfg, s.database)
	if queried {
		secret, found, werr := s.querySecret(cfg)
		if werr != nil {
			s.refuseLogin(werr)
			return false, auth.Secret{}
		}
		if found { // with or without a password: trust does not ask
			return true, secret
		}
	}
	s.srv.authFailures.Add(1)
	s.refuseLogin(errTrustUnlisted(s.user, cfg.AuthFile != "", queried))
	return false, auth.Secret{}
}

// errTrustUnlisted refuses a user trust does not admit: one that is not in
// auth_file (withFile) and that auth_query did not find (queried).
func errTrustUnlisted(user string, withFile, queried bool) *wire.Error {
	detail := fmt.Sprintf("user %q has no password entry in poolerd's configuration (auth_file, users, upstream)", user)
	if queried {
		detail += " and auth_query did not find it"
	}
	hint := "with auth_type trust, as in PgBouncer, the user name must exist in auth_file: add a line for it (\"name\" \"\" will do) and RELOAD"
	if !withFile {
		hint = "with auth_type trust and auth_user set, only users auth_query finds may log in, as in PgBouncer: create the role in PostgreSQL, or set auth_file and give the user a line there"
	}
	return &wire.Error{Severity: "FATAL", Code: "28000",
		Message: fmt.Sprintf("\"trust\" authentication failed for user %q: no such user", user),
		Detail:  detail, Hint: hint}
}

// authSCRAM runs SCRAM-SHA-256. An unknown user, or one whose secret SCRAM
// cannot check, goes through the same exchange against a mock verifier and
// fails at the end, so the answer does not reveal which users exist.
func (s *session) authSCRAM(secret auth.Secret, known bool) (bool, error) {
	v := s.srv.verifier(s.user, secret, known)
	mock := v == nil
	if mock {
		v = auth.NewSCRAMMockVerifier(s.user, s.srv.mockKey[:])
	}
	msg, _ := (&pgproto3.AuthenticationSASL{AuthMechanisms: []string{auth.SCRAMMechanism}}).Encode(nil)
	if _, err := s.conn.Write(msg); err != nil {
		return false, err
	}
	body, err := s.readAuthMessage("SASLInitialResponse")
	if err != nil {
		return false, err
	}
	var init pgproto3.SASLInitialResponse
	if err := init.Decode(body); err != nil {
		return false, protocolViolation("malformed SASLInitialResponse")
	}
	exch := auth.NewSCRAMServer(v, rand.Reader)
	first, err := exch.HandleClientFirst(init.AuthMechanism, init.Data)
	if err != nil {
		return false, protocolViolation("SCRAM: " + err.Error())
	}
	msg, _ = (&pgproto3.AuthenticationSASLContinue{Data: first}).Encode(nil)
	if _, err := s.conn.Write(msg); err != nil {
		return false, err
	}
	body, err = s.readAuthMessage("SASLResponse")
	if err != nil {
		return false, err
	}
	final, err := exch.HandleClientFinal(body)
	if errors.Is(err, auth.ErrPasswordMismatch) || (err == nil && mock) {
		return false, nil
	}
	if err != nil {
		return false, protocolViolation("SCRAM: " + err.Error())
	}
	// Sent with AuthenticationOk and the welcome, in one write (login.out).
	s.login.out, _ = (&pgproto3.AuthenticationSASLFinal{Data: final}).Encode(s.login.out)
	if secret.Kind() == auth.SecretSCRAM {
		s.clientKey = exch.ClientKey()
	}
	return true, nil
}

// authMD5 runs md5 password authentication.
func (s *session) authMD5(secret auth.Secret, known bool) (bool, error) {
	var salt [4]byte
	_, _ = rand.Read(salt[:])
	password, err := s.askPassword(&pgproto3.AuthenticationMD5Password{Salt: salt})
	if err != nil || !known {
		return false, err
	}
	return auth.VerifyMD5(secret, s.user, salt, password), nil
}

// askPassword sends the authentication request req and reads the client's
// PasswordMessage: the password (cleartext, or MD5's hash) it carries.
func (s *session) askPassword(req pgproto3.BackendMessage) (string, error) {
	msg, err := req.Encode(nil)
	if err != nil {
		return "", err
	}
	if _, err := s.conn.Write(msg); err != nil {
		return "", err
	}
	body, err := s.readAuthMessage("PasswordMessage")
	if err != nil {
		return "", err
	}
	if len(body) == 0 || body[len(body)-1] != 0 {
		return "", protocolViolation("malformed PasswordMessage: not a NUL-terminated string")
	}
	return string(body[:len(body)-1]), nil
}

func protocolViolation(msg string) *wire.Error {
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: msg,
		Hint: "the client broke the authentication exchange; check the driver"}
}

// verifier returns the SCRAM verifier for a user's secret, deriving (once)
// one from a plain password. nil means SCRAM cannot check this user.
func (srv *Server) verifier(user string, secret auth.Secret, known bool) *auth.SCRAMVerifier {
	if !known {
		return nil
	}
	if v, ok := secret.SCRAM(); ok {
		return v
	}
	pw, ok := secret.Plain()
	if !ok {
		return nil
	}
	srv.mu.Lock()
	v, ok := srv.verifiers[user]
	srv.mu.Unlock()
	if ok {
		return v
	}
	// Derived without srv.mu held: 4096 rounds of PBKDF2 take milliseconds,
	// and every accept, login and snapshot takes that lock.
	v, err := auth.DeriveSCRAMVerifier(pw, nil, auth.DefaultSCRAMIterations)
	if err != nil {
		return nil
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if first, ok := srv.verifiers[user]; ok {
		return first // a concurrent login derived one first
	}
	srv.verifiers[user] = v
	return v
}

// handleCancel forwards a client's CancelRequest to the backend its session
// holds right now. Anything else about the request is ignored, as
// PostgreSQL does (it never answers a cancel request). A session-mode
// client's pid is its backend's own, its key poolerd's (see
// Server.register): its cancel requests come here too, and poolerd forwards
// them with the backend's key. With peer_id, a request for another peer's
// client is passed on to that peer (peering.go).
func (srv *Server) handleCancel(body []byte) {
	if len(body) != 12 {
		return
	}
	pid := binary.BigEndian.Uint32(body[4:])
	key := binary.BigEndian.Uint32(body[8:])
	cfg := srv.cfg()
	if peer, ok := peerOf(cfg, pid); ok {
		srv.forwardCancel(cfg, peer, pid, key)
		return
	}
	if srv.cancelLocal(pid, key) {
		return
	}
	// With peer_id, the keys poolerd issued have their time to live set
	// (peering.go); one forwarded here by a peer has it lowered.
	if cfg.PeerID == 0 || key|cancelTTLMask == key || !srv.cancelLocal(pid, key|cancelTTLMask) {
		srv.log.Debug("cancel request for an unknown session")
	}
}

// cancelLocal cancels what the session, replication connection or console
// connection with the key pid, key runs, reporting whether there is one.
func (srv *Server) cancelLocal(pid, key uint32) bool {
	if s := srv.lookupSession(pid, key); s != nil {
		s.cancel()
		return true
	}
	if p := srv.lookupRepl(pid, key); p != nil {
		p.cancel()
		return true
	}
	return srv.cancelConsole(pid, key)
}
