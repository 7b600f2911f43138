// Package authquery looks up a client's secret in PostgreSQL, as
// PgBouncer's auth_user and auth_query do: it runs the query on a
// connection logged in as auth_user, with the user name as $1, and reads
// (name, secret) from the answer; Cache keeps the answers for
// auth_cache_ttl.
package authquery

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/auth"
)

// maxBody caps any message of the answer: a secret is a few hundred bytes.
const maxBody = 1 << 20

// ServerError is an ErrorResponse the query got (a missing right on
// pg_authid, a typo in auth_query).
type ServerError struct{ Code, Message string }

func (e *ServerError) Error() string {
	return fmt.Sprintf("auth_query: %s (SQLSTATE %s)", e.Message, e.Code)
}

// Lookup runs query on rw, a connection logged in to PostgreSQL and idle,
// with user as $1 (extended protocol, text format), and returns the secret
// in the second column of its only row. found is false when there is no
// row. A NULL (or empty) secret (no password, or one whose VALID UNTIL has
// passed with the default query) is found with the zero Secret: such a
// user never logs in with a password, but auth_type trust admits it, as
// PgBouncer and PostgreSQL's trust do. The connection is idle again after
// a nil error.
func Lookup(rw io.ReadWriter, query, user string) (secret auth.Secret, found bool, err error) {
	fe := pgproto3.NewFrontend(rw, rw)
	fe.SetMaxBodyLen(maxBody)
	fe.Send(&pgproto3.Parse{Query: query})
	fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte(user)}})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		return auth.Secret{}, false, fmt.Errorf("auth_query: send: %w", err)
	}
	var rows [][][]byte
	var qerr error
	for {
		msg, err := fe.Receive()
		if err != nil {
			return auth.Secret{}, false, fmt.Errorf("auth_query: read the answer: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if len(rows) < 2 {
				row := make([][]byte, len(m.Values))
				for i, v := range m.Values {
					if v != nil {
						row[i] = append([]byte{}, v...)
					}
				}
				rows = append(rows, row)
			}
		case *pgproto3.ErrorResponse:
			if qerr == nil {
				qerr = &ServerError{Code: m.Code, Message: m.Message}
			}
		case *pgproto3.ReadyForQuery:
			if qerr != nil {
				return auth.Secret{}, false, qerr
			}
			return secretOf(rows, user)
		case *pgproto3.ParseComplete, *pgproto3.BindComplete, *pgproto3.CommandComplete, *pgproto3.EmptyQueryResponse,
			*pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse, *pgproto3.PortalSuspended:
		default:
			return auth.Secret{}, false, fmt.Errorf("auth_query: unexpected %T in the answer", msg)
		}
	}
}

// secretOf reads the answer's rows.
func secretOf(rows [][][]byte, user string) (auth.Secret, bool, error) {
	switch {
	case len(rows) == 0:
		return auth.Secret{}, false, nil
	case len(rows) > 1:
		return auth.Secret{}, false, errors.New("auth_query returned more than one row: it must return at most one (name, secret) row for $1")
	case len(rows[0]) != 2:
		return auth.Secret{}, false, fmt.Errorf("auth_query returned %d columns: it must return two, the name and the secret", len(rows[0]))
	case string(rows[0][0]) != user:
		return auth.Secret{}, false, errors.New("auth_query returned another user's row: its first column must be the name given as $1")
	case rows[0][1] == nil || len(rows[0][1]) == 0:
		return auth.Secret{}, true, nil // no password, or expired
	}
	s, err := auth.ParseSecret(string(rows[0][1]))
	if err != nil {
		// The error says what is wrong with the form, never the value.
		return auth.Secret{}, false, fmt.Errorf("auth_query returned a secret poolerd cannot use: %w", err)
	}
	return s, true, nil
}

// Cache keeps what Lookup found, by key (the server database and user),
// for a time to live. Misses (no row, NULL) are not kept: a role created
// or given a password logs in at once.
type Cache struct {
	mu sync.Mutex
	m  map[string]cached
}

type cached struct {
	secret auth.Secret
	at     time.Time
}

// maxEntries bounds the cache; when full it starts over.
const maxEntries = 10000

// Get returns the secret kept for key if it is younger than ttl.
func (c *Cache) Get(key string, ttl time.Duration, now time.Time) (auth.Secret, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || now.Sub(e.at) >= ttl {
		return auth.Secret{}, false
	}
	return e.secret, true
}

// Put keeps a secret for key.
func (c *Cache) Put(key string, s auth.Secret, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxEntries {
		c.m = map[string]cached{}
	}
	c.m[key] = cached{secret: s, at: now}
}

// Clear forgets everything (a reload: auth_query or auth_user may have
// changed).
func (c *Cache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
}
