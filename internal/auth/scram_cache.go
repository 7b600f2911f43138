package auth

import (
	"crypto/sha256"
	"sync"
)

// SCRAMKeyCache remembers the ClientKey and ServerKey that a password gives
// with a salt and an iteration count, so that logging in to PostgreSQL again
// as the same role (a pool growing, a reconnect storm after a restart,
// recycling) costs HMACs instead of a PBKDF2 of thousands of iterations.
// Entries are keyed by a SHA-256 of the normalized password, never the
// password itself. Safe for concurrent use; at most maxEntries are kept.
type SCRAMKeyCache struct {
	mu      sync.Mutex
	entries map[scramCacheKey]scramKeys
	max     int
}

type scramCacheKey struct {
	password   [32]byte // SHA-256 of the normalized password
	salt       string
	iterations int
}

type scramKeys struct{ client, server []byte }

// NewSCRAMKeyCache returns a cache of at most maxEntries (role, salt,
// iterations) keys; when full it starts over.
func NewSCRAMKeyCache(maxEntries int) *SCRAMKeyCache {
	return &SCRAMKeyCache{entries: map[scramCacheKey]scramKeys{}, max: max(maxEntries, 1)}
}

// keys returns the ClientKey and ServerKey of a normalized password, from
// the cache or computed (and kept). A nil cache computes every time.
func (c *SCRAMKeyCache) keys(password string, salt []byte, iterations int) (client, server []byte, err error) {
	if c == nil {
		return deriveKeys(password, salt, iterations)
	}
	k := scramCacheKey{password: sha256.Sum256([]byte(password)), salt: string(salt), iterations: iterations}
	c.mu.Lock()
	e, ok := c.entries[k]
	c.mu.Unlock()
	if ok {
		return e.client, e.server, nil
	}
	client, server, err = deriveKeys(password, salt, iterations)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[k] = scramKeys{client, server}
	c.mu.Unlock()
	return client, server, nil
}

// deriveKeys computes ClientKey and ServerKey from a normalized password.
func deriveKeys(password string, salt []byte, iterations int) (client, server []byte, err error) {
	salted, err := saltedPassword(password, salt, iterations)
	if err != nil {
		return nil, nil, err
	}
	return hmacSHA256(salted, "Client Key"), hmacSHA256(salted, "Server Key"), nil
}
