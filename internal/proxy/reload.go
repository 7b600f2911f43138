package proxy

import (
	"errors"
	"fmt"
	"maps"
	"reflect"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
)

// RestartRequired reports whether key is one a running poolerd cannot
// change: the listening sockets and how the process was set up.
func RestartRequired(key string) bool {
	switch key {
	case "listen", "unix_socket_dir", "unix_socket_mode", "unix_socket_group", "http_listen", "http_probe_listen", "http_web_config_file", "http_pprof", "log_format", "log_file":
		return true
	}
	return false
}

// ReloadFunc loads the configuration again from its sources (file,
// environment, flags).
type ReloadFunc func() (*config.Config, error)

// SetReloader sets where RELOAD and SIGHUP read the configuration from,
// and a function that applies a new log level.
func (srv *Server) SetReloader(load ReloadFunc, setLevel func(string) error) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.reload, srv.setLevel = load, setLevel
}

// Reload re-reads the configuration and applies it; values changed with
// SET are dropped, as the file is the reference again. On error the
// running configuration stays and the error says why.
func (srv *Server) Reload() error {
	srv.mu.Lock()
	load := srv.reload
	srv.mu.Unlock()
	if load == nil {
		return errors.New("this poolerd has no configuration source to reload from")
	}
	next, err := load()
	if err == nil {
		err = srv.apply(next)
	}
	if err != nil {
		srv.log.Error("configuration reload failed; keeping the running configuration", zap.Error(err))
		return err
	}
	srv.log.Info("configuration reloaded")
	return nil
}

// Set changes one top-level key of the running configuration. TLS
// settings that do not load (a certificate set before its key, say) are
// kept as values while the running TLS settings stay in use, as in
// PgBouncer: notice says so.
func (srv *Server) Set(key, value string) (notice string, err error) {
	next := *srv.cfg()
	if err := config.SetValue(&next, key, value); err != nil {
		return "", err
	}
	tlsErr, err := next.ValidateApartFromTLS()
	if err != nil {
		return "", err
	}
	if err := srv.apply(&next); err != nil {
		return "", err
	}
	if tlsErr != nil {
		return "TLS settings could not be applied, still using old configuration: " + tlsErr.Error(), nil
	}
	return "", nil
}

// apply switches to a validated configuration without dropping clients:
// pools take their new sizes, limits and recycling settings (and reconnect
// when where or how they log in changed), connected clients their new
// timeouts, new configured pools warm up, and pools of databases no longer
// configured are closed once their last client leaves. The pool mode of a
// connected client does not change.
func (srv *Server) apply(next *config.Config) error {
	cur := srv.cfg()
	// A key only a restart can change keeps its running value, and the
	// rest applies (as PostgreSQL and PgBouncer reload): SHOW CONFIG
	// shows what runs. SET refuses such keys before this.
	var restart []string
	for _, k := range config.Keys() {
		if RestartRequired(k.Name) && config.FormatValue(cur, k.Name) != config.FormatValue(next, k.Name) {
			restart = append(restart, fmt.Sprintf("%s (running %q, file %q)", k.Name, config.FormatValue(cur, k.Name), config.FormatValue(next, k.Name)))
			config.CopyValue(next, cur, k.Name)
		}
	}
	if len(restart) > 0 {
		srv.log.Warn("settings that can only change with a restart keep their running values until then", zap.Strings("settings", restart))
	}
	srv.mu.Lock()
	setLevel := srv.setLevel
	srv.mu.Unlock()
	if setLevel != nil && next.LogLevel != cur.LogLevel {
		if err := setLevel(next.LogLevel); err != nil {
			return fmt.Errorf("log_level: %w", err)
		}
	}
	srv.conf.Store(next)
	srv.mu.Lock()
	clear(srv.verifiers)
	srv.mu.Unlock()
	srv.authCache.Clear()  // auth_user or auth_query may have changed
	srv.setServerTLS(next) // certificates are read again
	srv.setClientTLS(next)
	if rateConfigChanged(cur, next) {
		srv.setRates(next) // budgets start over when the rules change
	}
	srv.fleet.configure(next)

	var reconnected []string
	for _, p := range srv.poolList() {
		old := p.route()
		user := p.key.user
		route, err := next.Route(p.key.database, user)
		// Other server_parameters are other defaults for the pool's
		// clients: a new pool takes the new clients.
		if err != nil || route.ForcedUser != old.ForcedUser || route.ForcedUser && route.ServerUser != user ||
			!maps.Equal(old.ServerParams, route.ServerParams) {
			srv.retire(p)
			continue
		}
		p.routeP.Store(&route)
		// Where or how it logs in changed, TLS included (as PgBouncer
		// recycles every server connection on a TLS change).
		if old.Host != route.Host || old.Port != route.Port || old.DBName != route.DBName ||
			old.ServerUser != route.ServerUser || !old.ServerSecret.Equal(route.ServerSecret) ||
			old.ServerTLSMode != route.ServerTLSMode || serverTLSChanged(cur, next) {
			p.pool.Reconnect()
			reconnected = append(reconnected, p.key.database)
		}
		p.pool.Reconfigure(poolSettings(next, &route))
	}
	srv.mu.Lock()
	sessions := make([]*session, 0, len(srv.sessions))
	for _, s := range srv.sessions {
		sessions = append(sessions, s)
	}
	srv.mu.Unlock()
	rl := srv.rates.Load()
	for _, s := range sessions {
		if route, err := next.Route(s.database, s.user); err == nil {
			s.timeoutsP.Store(srv.timeoutsFor(route.Settings))
			if n := route.Settings.MaxPreparedStatements; n > 0 {
				s.maxPrepared.Store(int64(n))
			}
		}
		rates := rl.forSession(s.database, s.user, s.appName(), s.conn.RemoteAddr())
		s.rates.Store(&rates)
	}
	for _, db := range reconnected {
		srv.wakeForFastClose(db)
	}
	srv.mu.Lock()
	srv.warm = nil // the pools the new configuration names, from Warm below
	srv.mu.Unlock()
	srv.Warm()
	srv.scheduleReap()
	return nil
}

// retire takes a pool out of service after its database left the
// configuration: new clients cannot reach it, connected ones keep it until
// they leave, and then it is closed.
func (srv *Server) retire(p *dbPool) {
	srv.mu.Lock()
	if srv.pools[p.key] == p {
		delete(srv.pools, p.key)
	}
	srv.warm = removePools(srv.warm, []*dbPool{p})
	srv.mu.Unlock()
	p.retired.Store(true)
	srv.log.Info("pool retired: its database is no longer configured", zap.String("database", p.key.database), zap.String("user", p.key.user))
	p.closeIfUnused()
}

// closeIfUnused closes a retired pool once no client uses it.
func (p *dbPool) closeIfUnused() {
	if p.retired.Load() && p.clients.Load() == 0 && p.closing.CompareAndSwap(false, true) {
		go func() {
			p.pool.Close()
			p.srv.metrics.forget(p.key.database, p.key.user)
		}()
	}
}

// serverTLSChanged reports whether next connects to PostgreSQL with other
// TLS files, protocols or ciphers than cur.
func serverTLSChanged(cur, next *config.Config) bool {
	return cur.ServerTLSCAFile != next.ServerTLSCAFile || cur.ServerTLSCertFile != next.ServerTLSCertFile ||
		cur.ServerTLSKeyFile != next.ServerTLSKeyFile || cur.ServerTLSProtocols != next.ServerTLSProtocols ||
		cur.ServerTLSCiphers != next.ServerTLSCiphers
}

// rateConfigChanged reports whether a reload changes the rate limits; if
// not, the running budgets (and the Redis client) are kept.
func rateConfigChanged(cur, next *config.Config) bool {
	return !reflect.DeepEqual(cur.RateLimits, next.RateLimits) || cur.RateLimitBackend != next.RateLimitBackend ||
		cur.RedisURL != next.RedisURL || cur.RedisTimeout != next.RedisTimeout || cur.OnRedisError != next.OnRedisError
}
