package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/auth"
	"github.com/poolerd/poolerd/internal/authquery"
	"github.com/poolerd/poolerd/internal/backend"
	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/hba"
	"github.com/poolerd/poolerd/internal/netopt"
	"github.com/poolerd/poolerd/internal/wire"
)

// accessMethod is how this client authenticates: auth_type (with its LDAP
// options or PAM service), or with auth_type hba the first access rule
// that matches it (its method, ident map, LDAP options, PAM service). A
// client no rule matches, or whose rule is reject, is refused here
// (false), before any authentication, as PostgreSQL does.
func (s *session) accessMethod(cfg *config.Config) (hba.Rule, bool) {
	switch cfg.AuthType {
	case config.AuthHBA:
	case config.AuthPlain:
		return hba.Rule{Method: hba.Password}, true
	default:
		return hba.Rule{Method: cfg.AuthType, LDAP: cfg.LDAPOptions(), PAMService: cfg.AuthPAMService}, true
	}
	c := hba.Client{TLS: s.tls, Database: s.database, User: s.user, Replication: s.login.repl == replPhysical}
	host := "[local]"
	switch a := s.conn.RemoteAddr().(type) {
	case *net.TCPAddr:
		c.Addr, host = a.IP, a.IP.String()
	case *net.UnixAddr:
		c.Local = true
	}
	ssl := map[bool]string{true: "SSL on", false: "SSL off"}[s.tls]
	rule, ok := cfg.HBARules().Match(c)
	where := "auth_hba_file"
	if cfg.AuthHBAFile == "" {
		where = "auth_hba_rules"
	}
	switch {
	case !ok && c.Replication:
		s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "28000",
			Message: fmt.Sprintf("no pg_hba.conf entry for replication connection from host %q, user %q, %s", host, s.user, ssl),
			Hint:    fmt.Sprintf("no access rule in %s matches this connection: add one whose database is the keyword replication (the first matching rule decides)", where)})
		return hba.Rule{}, false
	case !ok:
		s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "28000",
			Message: fmt.Sprintf("no pg_hba.conf entry for host %q, user %q, database %q, %s", host, s.user, s.database, ssl),
			Hint:    fmt.Sprintf("no access rule in %s matches this connection: add one (the first matching rule decides)", where)})
		return hba.Rule{}, false
	case rule.Method == hba.Reject:
		s.refuseLogin(&wire.Error{Severity: "FATAL", Code: "28000",
			Message: fmt.Sprintf("pg_hba.conf rejects connection for host %q, user %q, database %q, %s", host, s.user, s.database, ssl),
			Hint:    fmt.Sprintf("the access rule at %s rejects it (%s)", rule.Source, where)})
		return hba.Rule{}, false
	}
	s.log.Debug("access rule matched", zap.String("rule", rule.Source), zap.String("method", rule.Method))
	return rule, true
}

// peerOK checks the peer method: the operating-system user of the
// Unix-socket client (SO_PEERCRED) is the user it logs in as or, with an
// ident map, one the map lets log in as that user. PostgreSQL's message.
func (s *session) peerOK(cfg *config.Config, identMap string) error {
	failed := func(detail, hint string) error {
		return &wire.Error{Severity: "FATAL", Code: "28000", Message: fmt.Sprintf("Peer authentication failed for user %q", s.user),
			Detail: detail, Hint: hint}
	}
	osUser, err := netopt.PeerUser(s.conn)
	if err != nil {
		return failed("could not get the client's operating-system user: "+err.Error(),
			"the matching access rule uses peer, which works on the Unix socket (unix_socket_dir) only")
	}
	switch {
	case identMap == "" && osUser == s.user:
		return nil
	case identMap == "":
		return failed(fmt.Sprintf("the client runs as operating-system user %q", osUser),
			"log in as the database user of your operating-system user's name, or give the access rule map= and an auth_ident_file line that allows it")
	case cfg.IdentMaps().Allows(identMap, osUser, s.user):
		return nil
	}
	return failed(fmt.Sprintf("ident map %q does not let operating-system user %q log in as %q", identMap, osUser, s.user),
		"add a line for them to auth_ident_file, or log in as a user the map allows")
}

// certOK checks the cert method: a TLS client certificate (verified
// against client_tls_ca_file in the handshake) whose common name is the
// user or, with an ident map, one the map lets log in as the user.
func (s *session) certOK(cfg *config.Config, identMap string) error {
	tc, ok := s.conn.(*tls.Conn)
	if !ok {
		return &wire.Error{Severity: "FATAL", Code: "28000", Message: fmt.Sprintf("certificate authentication failed for user %q", s.user),
			Hint: "cert authentication (auth_type cert, or the matching access rule's) needs TLS: connect with sslmode=require and a client certificate"}
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return &wire.Error{Severity: "FATAL", Code: "28000", Message: fmt.Sprintf("certificate authentication failed for user %q", s.user),
			Detail: "the client sent no certificate",
			Hint:   "cert authentication (auth_type cert, or the matching access rule's): connect with sslcert and sslkey, a certificate signed by client_tls_ca_file"}
	}
	if cn := certs[0].Subject.CommonName; identMap != "" && !cfg.IdentMaps().Allows(identMap, cn, s.user) {
		return &wire.Error{Severity: "FATAL", Code: "28000", Message: fmt.Sprintf("certificate authentication failed for user %q", s.user),
			Detail: fmt.Sprintf("ident map %q does not let the certificate's common name %q log in as %q", identMap, cn, s.user),
			Hint:   "add a line for them to auth_ident_file, or log in as a user the map allows"}
	} else if identMap == "" && cn != s.user {
		return &wire.Error{Severity: "FATAL", Code: "28000", Message: fmt.Sprintf("certificate authentication failed for user %q", s.user),
			Detail: fmt.Sprintf("the client certificate's common name is %q", cn),
			Hint:   "cert authentication (auth_type cert, or the matching access rule's): connect as the user your certificate names, or use a certificate for this user"}
	}
	return nil
}

// authPassword runs the password method: the client sends its password in
// clear (over TLS, one hopes). A SCRAM secret gives the ClientKey for
// pass-through.
func (s *session) authPassword(secret auth.Secret, known bool) (bool, error) {
	password, err := s.askPassword(&pgproto3.AuthenticationCleartextPassword{})
	if err != nil || !known {
		return false, err
	}
	ok, clientKey := auth.VerifyPassword(secret, s.user, password)
	if ok && clientKey != nil {
		s.clientKey = clientKey
	}
	return ok, nil
}

// lookupSecret finds the secret of a user the configuration does not know
// with auth_query, run as auth_user on the server of the client's
// database; answers are cached for auth_cache_ttl. A user with no row or a
// NULL secret is found with the zero Secret (trust admits it, a password
// never matches it). An error is a refusal to send.
func (srv *Server) lookupSecret(ctx context.Context, cfg *config.Config, database, user string) (auth.Secret, bool, *wire.Error) {
	if _, err := cfg.Route(database, user); err != nil && !IsConsoleDatabase(database) {
		return auth.Secret{}, false, nil // no such database: the login fails like a wrong password
	}
	look := cfg.AuthLookup(database)
	// auth_dbname: the query runs on that entry's server and database;
	// without one, on the client's (for the console's, that is refused).
	dbname := cmp.Or(look.DBName, database)
	route, err := cfg.Route(dbname, look.User)
	if look.DBName != "" || IsConsoleDatabase(dbname) {
		if werr := srv.authDBUnusable(dbname, err); werr != nil {
			return auth.Secret{}, false, werr
		}
	}
	if err != nil {
		return auth.Secret{}, false, nil
	}
	key := route.Host + "\x00" + strconv.Itoa(route.Port) + "\x00" + route.DBName + "\x00" + look.User + "\x00" + look.Query + "\x00" + user
	now := time.Now()
	if s, ok := srv.authCache.Get(key, cfg.AuthCacheTTL, now); ok {
		return s, true, nil
	}
	secret, found, err := srv.runAuthQuery(ctx, cfg, route, look, user)
	if err != nil {
		srv.log.Error("auth_query failed", zap.String("database", database), zap.String("user", user),
			zap.String("auth_user", look.User), zap.String("auth_dbname", route.DBName), zap.Error(err))
		var se *backend.ServerError
		if errors.As(err, &se) && se.Code == "3D000" && look.DBName == "" {
			// The client's database is not on the server: what a
			// direct login would be told (PgBouncer relays it too).
			return auth.Secret{}, false, &wire.Error{Severity: "FATAL", Code: se.Code, Message: se.Message,
				Hint: "connect to a database that exists on the server, or set auth_dbname so that auth_query runs in one"}
		}
		return auth.Secret{}, false, &wire.Error{Severity: "FATAL", Code: "28000",
			Message: fmt.Sprintf("could not look up the password of user %q (bouncer config error)", user),
			Hint:    "poolerd runs auth_query as auth_user for users it has no secret for, and that failed: see poolerd's log; check auth_user's password (users or auth_file), its right to read pg_authid, and auth_query"}
	}
	if found && cfg.AuthCacheTTL > 0 {
		srv.authCache.Put(key, secret, now)
	}
	return secret, found, nil
}

// authQueried reports whether a login to database of a user poolerd has no
// secret for looks the user up with auth_query: where an auth_user applies,
// the admin console's database included, as in PgBouncer (whose console
// login without a global auth_dbname is refused as a configuration error:
// the console has no server of its own to run the query on).
func authQueried(cfg *config.Config, database string) bool {
	return cfg.AuthLookup(database).User != ""
}

// authDBUnusable refuses a login whose auth_query would run in dbname
// (auth_dbname) when that database cannot run it: the admin console's,
// one poolerd does not serve (routeErr), or one DISABLEd, as PgBouncer
// refuses them ("bouncer config error"). The configuration warned at load.
func (srv *Server) authDBUnusable(dbname string, routeErr error) *wire.Error {
	var msg, hint string
	_, disabled := srv.dbFlags(dbname)
	switch {
	case IsConsoleDatabase(dbname):
		msg = fmt.Sprintf("cannot use the reserved %q database as an auth_dbname", dbname)
		hint = "set auth_dbname to a database poolerd serves from PostgreSQL"
	case routeErr != nil:
		msg = fmt.Sprintf("authentication database %q is not configured", dbname)
		hint = "add it under databases ([databases] in a pgbouncer.ini), or set auth_dbname to a database poolerd serves"
	case disabled:
		srv.log.Warn("auth_query refused: its database is disabled", zap.String("auth_dbname", dbname))
		return &wire.Error{Severity: "FATAL", Code: "08P01", Message: fmt.Sprintf("authentication database %q is disabled", dbname),
			Hint: fmt.Sprintf("an administrator ran DISABLE %s; ENABLE %s on the admin console lets its lookups run again", dbname, dbname)}
	default:
		return nil
	}
	srv.log.Error("auth_query cannot run: "+msg, zap.String("auth_dbname", dbname))
	// PgBouncer's words to the client; the why in DETAIL.
	return &wire.Error{Severity: "FATAL", Code: "08P01", Message: "bouncer config error", Detail: msg, Hint: hint}
}

// runAuthQuery logs in as look's auth_user to route's server and database
// and runs its auth_query once.
func (srv *Server) runAuthQuery(ctx context.Context, cfg *config.Config, route config.Route, look config.AuthLookupSettings, user string) (auth.Secret, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, route.Settings.ServerConnectTimeout)
	defer cancel()
	creds := backend.Credentials{User: look.User, KeyCache: srv.scramKeys}
	creds.Secret, _ = cfg.ClientSecret(look.User)
	target := backend.Target{Host: route.Host, Port: route.Port, TLS: srv.serverTLSFor(route.ServerTLSMode),
		TCP: tcpOptions(srv.cfg(), backend.ServerKeepAlive)}
	bc, err := backend.Connect(ctx, target, route.DBName, creds, nil)
	if err != nil {
		// The words pgblog recognizes (its PgBouncer line for a failed login).
		return auth.Secret{}, false, fmt.Errorf("log in as auth_user: %w", err)
	}
	defer bc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = bc.SetDeadline(dl)
	}
	secret, found, err := authquery.Lookup(bc, look.Query, user)
	if err == nil {
		term, _ := (&pgproto3.Terminate{}).Encode(nil)
		_, _ = bc.Write(term)
	}
	return secret, found, err
}

// clientAddr is how logs name a client's address: host:port over TCP,
// "unix" on the Unix socket (whose peers have no name).
func clientAddr(nc net.Conn) string {
	if _, ok := nc.RemoteAddr().(*net.UnixAddr); ok {
		return "unix"
	}
	return nc.RemoteAddr().String()
}
