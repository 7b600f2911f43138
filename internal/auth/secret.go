package auth

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// SecretKind tells which form of a password a [Secret] holds.
type SecretKind int

const (
	// SecretPlain is a clear-text password.
	SecretPlain SecretKind = iota + 1
	// SecretMD5 is a PostgreSQL md5 hash: "md5" followed by 32 lowercase
	// hex digits of md5(password + username).
	SecretMD5
	// SecretSCRAM is a PostgreSQL SCRAM-SHA-256 verifier.
	SecretSCRAM
)

// String returns the name of the kind.
func (k SecretKind) String() string {
	switch k {
	case SecretPlain:
		return "plain"
	case SecretMD5:
		return "md5"
	case SecretSCRAM:
		return "SCRAM-SHA-256"
	default:
		return "SecretKind(" + strconv.Itoa(int(k)) + ")"
	}
}

// ErrInvalidSecret is wrapped by every error [ParseSecret] returns.
var ErrInvalidSecret = errors.New("invalid secret")

// scramSecretPrefix starts the text form of a SCRAM-SHA-256 verifier.
const scramSecretPrefix = "SCRAM-SHA-256$"

// Secret is what poolerd knows about one user's password.
//
// The zero Secret holds nothing: its Kind is 0 and it matches no password.
//
// A Secret never reveals its contents when formatted with the fmt package
// (String, GoString and Format all print only the kind). The secret
// material is reachable only through a function value, so even
// reflection-based printing of a struct holding a Secret in an unexported
// field (where fmt cannot call methods) shows nothing but an address.
type Secret struct {
	d hidden[*secretData]
}

type secretData struct {
	kind  SecretKind
	plain string         // SecretPlain
	md5   string         // SecretMD5: "md5" + 32 lowercase hex digits
	scram *SCRAMVerifier // SecretSCRAM
}

// hidden holds a value behind a function so that fmt's reflection-based
// printing cannot reach it: fmt prints function values as addresses, while
// it dereferences pointers and prints strings and byte slices verbatim,
// even in unexported fields. A nil hidden yields the zero value.
type hidden[T any] func() T

func hide[T any](v T) hidden[T] { return func() T { return v } }

func (h hidden[T]) get() T {
	if h == nil {
		var zero T
		return zero
	}
	return h()
}

func newSecret(d *secretData) Secret { return Secret{hide(d)} }

// ParseSecret parses a password as it may appear in pg_authid.rolpassword
// or in a PgBouncer auth_file:
//
//   - "md5" followed by exactly 32 lowercase hex digits is an md5 hash;
//   - "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>" (base64
//     salt and keys) is a SCRAM-SHA-256 verifier; a string with that prefix
//     that is not a valid verifier is an error;
//   - any other non-empty string is a plain-text password.
//
// Errors wrap [ErrInvalidSecret] and never include the secret.
func ParseSecret(s string) (Secret, error) {
	switch {
	case s == "":
		return Secret{}, fmt.Errorf("%w: empty", ErrInvalidSecret)
	case isMD5Hash(s):
		return newSecret(&secretData{kind: SecretMD5, md5: s}), nil
	case strings.HasPrefix(s, scramSecretPrefix):
		v, err := parseSCRAMSecret(s[len(scramSecretPrefix):])
		if err != nil {
			return Secret{}, fmt.Errorf("%w: SCRAM-SHA-256 secret: %s", ErrInvalidSecret, err.Error())
		}
		return newSecret(&secretData{kind: SecretSCRAM, scram: v}), nil
	default:
		return newSecret(&secretData{kind: SecretPlain, plain: s}), nil
	}
}

// PlainSecret returns the plain-text password p as a Secret, whatever its
// form (a password that looks like an md5 hash included); empty p is no
// secret.
func PlainSecret(p string) Secret {
	if p == "" {
		return Secret{}
	}
	return newSecret(&secretData{kind: SecretPlain, plain: p})
}

// SecretFromSCRAMVerifier returns a SCRAM Secret holding a copy of v.
// It reports false if v is not usable (nil, non-positive iteration count,
// empty salt, or keys that are not 32 bytes long).
func SecretFromSCRAMVerifier(v *SCRAMVerifier) (Secret, bool) {
	if v.validate() != nil {
		return Secret{}, false
	}
	return newSecret(&secretData{kind: SecretSCRAM, scram: v.clone()}), true
}

// isMD5Hash reports whether s has PostgreSQL's md5 secret form; like
// PostgreSQL only lowercase hex digits are accepted.
func isMD5Hash(s string) bool {
	if len(s) != md5SecretLen || !strings.HasPrefix(s, "md5") {
		return false
	}
	for i := 3; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// parseSCRAMSecret parses "<iter>:<salt>$<stored>:<server>". Error messages
// describe the problem without quoting the input.
func parseSCRAMSecret(s string) (*SCRAMVerifier, error) {
	params, keys, ok := strings.Cut(s, "$")
	if !ok {
		return nil, errors.New(`missing "$" between the parameters and the keys`)
	}
	iterStr, saltStr, ok := strings.Cut(params, ":")
	if !ok {
		return nil, errors.New(`missing ":" between the iteration count and the salt`)
	}
	storedStr, serverStr, ok := strings.Cut(keys, ":")
	if !ok {
		return nil, errors.New(`missing ":" between the stored key and the server key`)
	}
	iter, ok := parseDecimal(iterStr, math.MaxInt32)
	if !ok || iter < 1 {
		return nil, errors.New("iteration count is not a positive integer")
	}
	salt, err := decodeBase64(saltStr)
	if err != nil {
		return nil, errors.New("salt is not valid base64")
	}
	if len(salt) == 0 {
		return nil, errors.New("salt is empty")
	}
	stored, err := decodeBase64(storedStr)
	if err != nil {
		return nil, errors.New("stored key is not valid base64")
	}
	if len(stored) != scramKeyLen {
		return nil, fmt.Errorf("stored key is %d bytes, want %d", len(stored), scramKeyLen)
	}
	server, err := decodeBase64(serverStr)
	if err != nil {
		return nil, errors.New("server key is not valid base64")
	}
	if len(server) != scramKeyLen {
		return nil, fmt.Errorf("server key is %d bytes, want %d", len(server), scramKeyLen)
	}
	return &SCRAMVerifier{Iterations: iter, Salt: salt, StoredKey: stored, ServerKey: server}, nil
}

// parseDecimal parses a non-empty string of ASCII digits (no sign, no
// spaces) whose value is at most max.
func parseDecimal(s string, max int) (int, bool) {
	if s == "" {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
		if n > max {
			return 0, false
		}
	}
	return n, true
}

// decodeBase64 decodes standard, padded base64 the way PostgreSQL's
// pg_b64_decode does: unlike encoding/base64 it rejects embedded newlines.
func decodeBase64(s string) ([]byte, error) {
	if strings.ContainsAny(s, "\r\n") {
		return nil, errors.New("illegal newline in base64 data")
	}
	return base64.StdEncoding.DecodeString(s)
}

// Equal reports whether s and o are the same secret (same kind and value).
func (s Secret) Equal(o Secret) bool {
	a, b := s.d.get(), o.d.get()
	switch {
	case a == nil || b == nil:
		return a == b
	case a.kind != b.kind:
		return false
	case a.kind == SecretSCRAM:
		return a.scram.String() == b.scram.String()
	}
	return a.plain == b.plain && a.md5 == b.md5
}

// Kind returns the kind of secret, or 0 for the zero Secret.
func (s Secret) Kind() SecretKind {
	if d := s.d.get(); d != nil {
		return d.kind
	}
	return 0
}

// Plain returns the clear-text password, if the secret is one.
func (s Secret) Plain() (string, bool) {
	if s.Kind() != SecretPlain {
		return "", false
	}
	return s.d.get().plain, true
}

// MD5 returns the PostgreSQL md5 hash ("md5" + 32 hex digits) for user:
// the stored hash for an md5 secret (which is bound to the user name it was
// created for; user is then ignored), or md5(password + user) computed from
// a plain secret. It reports false for SCRAM secrets.
func (s Secret) MD5(user string) (string, bool) {
	switch s.Kind() {
	case SecretMD5:
		return s.d.get().md5, true
	case SecretPlain:
		return MD5Hash(user, s.d.get().plain), true
	default:
		return "", false
	}
}

// SCRAM returns a copy of the stored SCRAM-SHA-256 verifier. It reports
// false for other kinds; for a plain secret build one with
// [NewSCRAMVerifier].
func (s Secret) SCRAM() (*SCRAMVerifier, bool) {
	if s.Kind() != SecretSCRAM {
		return nil, false
	}
	return s.d.get().scram.clone(), true
}

// String describes the kind of secret without revealing it.
func (s Secret) String() string {
	switch s.Kind() {
	case SecretPlain:
		return "plain secret"
	case SecretMD5:
		return "md5 secret"
	case SecretSCRAM:
		return "SCRAM-SHA-256 secret"
	default:
		return "no secret"
	}
}

// GoString is like String; it keeps %#v from printing the secret.
func (s Secret) GoString() string {
	return "auth.Secret(" + s.String() + ")"
}

// Format implements fmt.Formatter so that no verb or flag prints the
// secret: %#v prints GoString, %q a quoted String, everything else String.
func (s Secret) Format(f fmt.State, verb rune) {
	switch {
	case verb == 'v' && f.Flag('#'):
		_, _ = io.WriteString(f, s.GoString())
	case verb == 'q':
		_, _ = io.WriteString(f, strconv.Quote(s.String()))
	default:
		_, _ = io.WriteString(f, s.String())
	}
}
