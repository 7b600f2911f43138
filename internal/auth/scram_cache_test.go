package auth

import (
	"bytes"
	"errors"
	"testing"
)

// TestSCRAMKeyCache: a cached client logs in (and fails with a wrong
// password) exactly like an uncached one, keeps one entry per (password,
// salt, iterations), gives the keys a fresh derivation gives, and starts
// over when full.
func TestSCRAMKeyCache(t *testing.T) {
	c := NewSCRAMKeyCache(2)
	v := NewSCRAMVerifier(testPassword, nil, 4096)
	for round := range 3 {
		if err := exchange(t, NewSCRAMClientCached(testPassword, nil, c), NewSCRAMServer(v, nil)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if len(c.entries) != 1 {
		t.Fatalf("%d entries after three logins with one password and salt, want 1", len(c.entries))
	}
	if err := exchange(t, NewSCRAMClientCached("wrong", nil, c), NewSCRAMServer(v, nil)); !errors.Is(err, ErrPasswordMismatch) {
		t.Fatalf("wrong password: %v", err)
	}
	want1, want2, err := deriveKeys(SASLprep(testPassword), v.Salt, v.Iterations)
	if err != nil {
		t.Fatal(err)
	}
	got1, got2, err := c.keys(SASLprep(testPassword), v.Salt, v.Iterations)
	if err != nil || !bytes.Equal(got1, want1) || !bytes.Equal(got2, want2) {
		t.Fatalf("cached keys differ from derived ones (%v)", err)
	}
	if len(c.entries) != 2 { // the wrong password's
		t.Fatalf("%d entries, want 2", len(c.entries))
	}
	if _, _, err := c.keys("third", []byte("salt"), 4096); err != nil || len(c.entries) != 1 {
		t.Fatalf("a full cache did not start over: %d entries, %v", len(c.entries), err)
	}
	for k := range c.entries {
		if bytes.Contains(k.password[:], []byte("third")) {
			t.Fatal("the cache key holds the password")
		}
	}
}

// BenchmarkSCRAMClientLogin is the client side of one upstream SCRAM login
// (PostgreSQL's default 4096 iterations), against poolerd's own server side
// for the other half: uncached, every login runs PBKDF2; cached, only the
// first one does.
func BenchmarkSCRAMClientLogin(b *testing.B) {
	v := NewSCRAMVerifier(testPassword, nil, 4096)
	for _, bc := range []struct {
		name  string
		cache *SCRAMKeyCache
	}{{"uncached", nil}, {"cached", NewSCRAMKeyCache(16)}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := exchange(b, NewSCRAMClientCached(testPassword, nil, bc.cache), NewSCRAMServer(v, nil)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
