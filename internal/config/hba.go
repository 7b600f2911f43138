package config

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/poolerd/poolerd/internal/hba"
	"github.com/poolerd/poolerd/internal/ldapauth"
	"github.com/poolerd/poolerd/internal/pamauth"
)

// validateHBA reads the access rules (auth_hba_file or auth_hba_rules):
// every reload reads the file again.
func (c *Config) validateHBA(bad func(string, ...any)) {
	c.hbaRules = nil
	switch {
	case c.AuthHBAFile != "" && len(c.AuthHBARules) > 0:
		bad("auth_hba_file and auth_hba_rules are both set: give the access rules in one of them")
		return
	case c.AuthHBAFile != "":
		data, err := os.ReadFile(c.AuthHBAFile)
		if err != nil {
			bad("auth_hba_file: %w", err)
			return
		}
		rules, err := hba.Parse(c.AuthHBAFile, data, hba.FileReader(filepath.Dir(c.AuthHBAFile), os.ReadFile))
		if err != nil {
			bad("auth_hba_file: %w", err)
			return
		}
		c.hbaRules = rules
	case len(c.AuthHBARules) > 0:
		rules, err := hba.FromSpecs("auth_hba_rules", c.AuthHBARules)
		if err != nil {
			bad("%w", err)
			return
		}
		c.hbaRules = rules
	case c.AuthType == AuthHBA:
		bad("auth_type hba needs access rules: set auth_hba_file (pg_hba.conf format) or auth_hba_rules")
	}
	if c.hbaRules.Methods()[hba.Cert] && c.ClientTLSCAFile == "" {
		// PgBouncer loads such rules too; the clients they match fail.
		c.comboWarnings = append(c.comboWarnings, "an access rule uses cert, which needs client certificates: without client_tls_ca_file (and client_tls_sslmode prefer or above) every client it matches fails authentication")
	}
	c.identMaps = nil
	if c.AuthIdentFile != "" {
		data, err := os.ReadFile(c.AuthIdentFile)
		if err != nil {
			bad("auth_ident_file: %w", err)
			return
		}
		if c.identMaps, err = hba.ParseIdent(c.AuthIdentFile, data); err != nil {
			bad("auth_ident_file: %w", err)
			return
		}
	}
	for _, r := range c.hbaRules {
		switch {
		case r.Map == "":
		case c.AuthIdentFile == "":
			bad("the access rule at %s uses map=%s: set auth_ident_file to the file of user-name maps (pg_ident.conf format)", r.Source, r.Map)
		case !c.identMaps.Names()[r.Map]:
			bad("the access rule at %s uses map=%s, which auth_ident_file %s does not define", r.Source, r.Map, c.AuthIdentFile)
		}
	}
}

// validateExternalAuth checks what auth_type ldap and pam, and ldap and pam
// access rules, need: the LDAP options, and a PAM library this build can
// load.
func (c *Config) validateExternalAuth(bad func(string, ...any)) {
	c.ldapOptions = nil
	if c.AuthType == AuthLDAP {
		if strings.TrimSpace(c.AuthLDAPOptions) == "" {
			bad("auth_type ldap needs auth_ldap_options (POOLERD_AUTH_LDAP_OPTIONS): the LDAP server and how to find users, e.g. ldapurl=\"ldap://ldap.example.net/dc=example,dc=net?uid?sub\"")
		} else if o, err := ldapauth.ParseString(c.AuthLDAPOptions); err != nil {
			bad("auth_ldap_options: %w", err)
		} else {
			c.ldapOptions = &o
		}
	}
	pam := c.AuthType == AuthPAM || c.AuthType == AuthHBA && c.hbaRules.Methods()[hba.PAM]
	if pam {
		if c.AuthType == AuthPAM && c.AuthPAMService == "" {
			bad("auth_type pam needs auth_pam_service (POOLERD_AUTH_PAM_SERVICE), the PAM service to ask (PgBouncer's is pgbouncer)")
		}
		if err := pamauth.Available(); err != nil {
			bad("auth_type pam (or a pam access rule): %w", err)
		}
	}
}

// LDAPOptions returns auth_ldap_options parsed (nil unless auth_type is
// ldap).
func (c *Config) LDAPOptions() *ldapauth.Options { return c.ldapOptions }

// IdentMaps returns auth_ident_file's user-name maps (nil without one).
func (c *Config) IdentMaps() hba.IdentMaps { return c.identMaps }

// HBARules returns the access rules that decide logins with auth_type hba
// (nil for other auth_type values).
func (c *Config) HBARules() hba.Rules {
	if c.AuthType != AuthHBA {
		return nil
	}
	return c.hbaRules
}

// validateAuthQuery checks auth_user, auth_query, auth_dbname and
// auth_cache_ttl, globally and per database.
func (c *Config) validateAuthQuery(bad func(string, ...any)) {
	if c.AuthCacheTTL < 0 {
		bad("auth_cache_ttl must not be negative (0 runs auth_query for every login)")
	}
	// As PgBouncer, a lookup that cannot work is reported, and the
	// logins that need it are refused: the configuration still starts.
	warn := func(format string, args ...any) {
		c.comboWarnings = append(c.comboWarnings, fmt.Sprintf(format, args...))
	}
	check := func(where, user, query, dbname string) {
		if user != "" && !strings.Contains(query, "$1") {
			warn("%sauth_query %q has no $1: it must take the user name as its parameter $1 (the default is %s); every login that needs it fails", where, query, DefaultAuthQuery)
		}
		if dbname == "" {
			return
		}
		switch {
		case dbname == WildcardDatabase:
			bad("%sauth_dbname %q: name a database entry, not the wildcard", where, dbname)
		case IsConsoleDatabase(dbname) && where == "":
			// PgBouncer refuses this one setting at start (a database
			// entry's is refused at login, below).
			bad("auth_dbname %q: cannot use the reserved %q database as an auth_dbname: it is the admin console's, which cannot run auth_query; name a database entry", dbname, dbname)
		case IsConsoleDatabase(dbname):
			warn("%sauth_dbname %q is the admin console's database, which cannot run auth_query: logins that need it are refused", where, dbname)
		case c.entry(dbname) == nil && c.entry(WildcardDatabase) == nil && (c.upstream == nil || c.upstream.Database != dbname):
			warn("%sauth_dbname %q is not a database entry (or upstream's database): auth_query runs on that entry's server and database, so logins that need it are refused; add it under databases", where, dbname)
		}
	}
	check("", c.AuthUser, c.AuthQuery, c.AuthDBName)
	for _, d := range c.Databases {
		l := c.AuthLookup(d.Name)
		check(fmt.Sprintf("database %q ", d.Name), l.User, l.Query, l.DBName)
	}
}

// IsConsoleDatabase reports whether name is the admin console's database:
// "pgbouncer", as PgBouncer's tools expect, or "poolerd".
func IsConsoleDatabase(name string) bool { return name == "pgbouncer" || name == "poolerd" }

// AutoDatabase reports whether name has no entry of its own and is served
// by the * entry or upstream (PgBouncer's auto-database).
func (c *Config) AutoDatabase(name string) bool {
	_, ok := c.database(name)
	return ok && c.entry(name) == nil
}

// entry returns the entry named exactly name, or nil.
func (c *Config) entry(name string) *Database {
	for i := range c.Databases {
		if c.Databases[i].Name == name {
			return &c.Databases[i]
		}
	}
	return nil
}

// AuthLookupSettings say how auth_query finds the secret of a user the
// configuration does not know, for the clients of one database.
type AuthLookupSettings struct {
	// User runs Query ($1: the user name); empty: no lookup.
	User, Query string
	// DBName is the database entry the query runs in; empty: the
	// client's database.
	DBName string
}

// AuthLookup returns the auth_query settings for the clients of database:
// its entry's auth_user, auth_query and auth_dbname, each falling back to
// the global one (PgBouncer's per-database auth_user).
func (c *Config) AuthLookup(database string) AuthLookupSettings {
	l := AuthLookupSettings{User: c.AuthUser, Query: c.AuthQuery, DBName: c.AuthDBName}
	if IsConsoleDatabase(database) {
		return l // the global ones, as PgBouncer's admin database
	}
	if d, ok := c.database(database); ok { // its entry, or the wildcard's
		l.User = cmp.Or(d.AuthUser, l.User)
		l.Query = cmp.Or(d.AuthQuery, l.Query)
		l.DBName = cmp.Or(d.AuthDBName, l.DBName)
	}
	return l
}

// AnyAuthUser reports whether auth_query is set up anywhere (globally or
// for a database).
func (c *Config) AnyAuthUser() bool {
	if c.AuthUser != "" {
		return true
	}
	for _, d := range c.Databases {
		if d.AuthUser != "" {
			return true
		}
	}
	return false
}
