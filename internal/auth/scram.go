package auth

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

const (
	// SCRAMMechanism is the SASL mechanism name poolerd implements.
	SCRAMMechanism = "SCRAM-SHA-256"

	// DefaultSCRAMIterations is the iteration count of verifiers poolerd
	// builds itself (PostgreSQL's default scram_iterations).
	DefaultSCRAMIterations = 4096

	// DefaultSCRAMSaltLen is the salt length, in bytes, of verifiers poolerd
	// builds itself (PostgreSQL's SCRAM_DEFAULT_SALT_LEN).
	DefaultSCRAMSaltLen = 16

	// MaxSCRAMIterations is the largest iteration count a [SCRAMClient]
	// accepts from a server, to bound the CPU a (malicious or misconfigured)
	// server can make poolerd spend on PBKDF2.
	MaxSCRAMIterations = 10_000_000

	// scramKeyLen is the SHA-256 output length (SCRAM_KEY_LEN).
	scramKeyLen = sha256.Size

	// scramRawNonceLen is the number of random bytes in a nonce
	// (PostgreSQL's SCRAM_RAW_NONCE_LEN); base64 makes 24 characters.
	scramRawNonceLen = 18
)

var (
	// ErrPasswordMismatch is returned by [SCRAMServer.HandleClientFinal]
	// when the client's proof is wrong, i.e. the client does not know the
	// password. The network code should report it like PostgreSQL does
	// (SQLSTATE 28P01, "password authentication failed for user ...").
	ErrPasswordMismatch = errors.New("password does not match")

	// ErrProtocolViolation is wrapped by errors about malformed or
	// unexpected SCRAM messages and out-of-order calls (PostgreSQL reports
	// those with SQLSTATE 08P01).
	ErrProtocolViolation = errors.New("SCRAM protocol violation")

	// ErrServerSignatureMismatch is returned by
	// [SCRAMClient.HandleServerFinal] when the server's signature is wrong:
	// the server does not know the verifier, so it may be an impostor.
	ErrServerSignatureMismatch = errors.New("SCRAM server signature does not match")

	// ErrServerRejected is wrapped by the error [SCRAMClient.HandleServerFinal]
	// returns when the server-final-message carries an error ("e=...").
	ErrServerRejected = errors.New("SCRAM authentication rejected by server")

	// ErrStoredSCRAMMismatch is wrapped by the error
	// [SCRAMClient.HandleServerFirst] returns for a client built with
	// [NewSCRAMClientFromKeys] when the server's salt or iteration count
	// differ from the stored verifier's, so the keys cannot work.
	ErrStoredSCRAMMismatch = errors.New("the stored SCRAM secret does not match the server's (different salt or iterations); " +
		"use the plain password, or copy the SCRAM verifier from pg_authid.rolpassword on the server")
)

// protocolError returns an error wrapping ErrProtocolViolation.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocolViolation}, args...)...)
}

// SCRAMVerifier is a SCRAM-SHA-256 verifier as PostgreSQL stores it: enough
// to check a client's proof and to sign the server's answer, but not to log
// in as the user.
//
// It is still sensitive: String returns the full text form, and together
// with a ClientKey recovered by [SCRAMServer.ClientKey] it allows logging in
// to PostgreSQL. Do not log it.
type SCRAMVerifier struct {
	// Iterations is the PBKDF2 iteration count.
	Iterations int
	// Salt is the PBKDF2 salt.
	Salt []byte
	// StoredKey is SHA-256(ClientKey).
	StoredKey []byte
	// ServerKey is HMAC-SHA-256(SaltedPassword, "Server Key").
	ServerKey []byte
}

// NewSCRAMVerifier builds the verifier PostgreSQL would store for password,
// salt and iterations. The password is normalized with [SASLprep] first,
// like PostgreSQL does. An empty salt means a random salt of
// [DefaultSCRAMSaltLen] bytes; iterations <= 0 means
// [DefaultSCRAMIterations].
//
// NewSCRAMVerifier panics only if PBKDF2 fails, which happens only in FIPS
// 140-only mode (GODEBUG=fips140=only) with a salt shorter than 16 bytes;
// use [DeriveSCRAMVerifier] to get an error instead.
func NewSCRAMVerifier(password string, salt []byte, iterations int) *SCRAMVerifier {
	v, err := DeriveSCRAMVerifier(password, salt, iterations)
	if err != nil {
		panic("auth: " + err.Error())
	}
	return v
}

// DeriveSCRAMVerifier is like [NewSCRAMVerifier] but returns an error
// instead of panicking when PBKDF2 fails.
func DeriveSCRAMVerifier(password string, salt []byte, iterations int) (*SCRAMVerifier, error) {
	if len(salt) == 0 {
		salt = make([]byte, DefaultSCRAMSaltLen)
		_, _ = rand.Read(salt) // never fails; see crypto/rand.Read
	} else {
		salt = append([]byte(nil), salt...)
	}
	if iterations <= 0 {
		iterations = DefaultSCRAMIterations
	}
	salted, err := saltedPassword(SASLprep(password), salt, iterations)
	if err != nil {
		return nil, err
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	return &SCRAMVerifier{
		Iterations: iterations,
		Salt:       salt,
		StoredKey:  storedKey[:],
		ServerKey:  hmacSHA256(salted, "Server Key"),
	}, nil
}

// NewSCRAMMockVerifier returns a verifier for a user that does not exist,
// so that poolerd can run a full SCRAM exchange that always ends in
// [ErrPasswordMismatch] instead of revealing that the user is unknown
// (PostgreSQL does the same with its "mock" authentication).
//
// The salt is derived from user and key, so repeated attempts for the same
// user see the same salt, as for a real user. key must be a secret that
// stays the same for the lifetime of the process (for example 32 random
// bytes generated at start-up).
func NewSCRAMMockVerifier(user string, key []byte) *SCRAMVerifier {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, key)
		m.Write([]byte("poolerd SCRAM mock " + label + "\x00"))
		m.Write([]byte(user))
		return m.Sum(nil)
	}
	// The keys only need to be unguessable: no client can produce a
	// ClientKey whose SHA-256 is an unrelated random value.
	return &SCRAMVerifier{
		Iterations: DefaultSCRAMIterations,
		Salt:       derive("salt")[:DefaultSCRAMSaltLen],
		StoredKey:  derive("stored key"),
		ServerKey:  derive("server key"),
	}
}

// String returns the text form PostgreSQL stores in pg_authid.rolpassword:
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, all base64.
// The result is sensitive; do not log it.
func (v *SCRAMVerifier) String() string {
	if v == nil {
		return "<nil>"
	}
	b64 := base64.StdEncoding.EncodeToString
	return scramSecretPrefix + strconv.Itoa(v.Iterations) + ":" + b64(v.Salt) +
		"$" + b64(v.StoredKey) + ":" + b64(v.ServerKey)
}

// validate checks that v can be used by a SCRAMServer or SCRAMClient.
func (v *SCRAMVerifier) validate() error {
	switch {
	case v == nil:
		return errors.New("no SCRAM verifier")
	case v.Iterations <= 0:
		return errors.New("SCRAM verifier has a non-positive iteration count")
	case len(v.Salt) == 0:
		return errors.New("SCRAM verifier has an empty salt")
	case len(v.StoredKey) != scramKeyLen:
		return fmt.Errorf("SCRAM verifier stored key is %d bytes, want %d", len(v.StoredKey), scramKeyLen)
	case len(v.ServerKey) != scramKeyLen:
		return fmt.Errorf("SCRAM verifier server key is %d bytes, want %d", len(v.ServerKey), scramKeyLen)
	}
	return nil
}

func (v *SCRAMVerifier) clone() *SCRAMVerifier {
	if v == nil {
		return nil
	}
	return &SCRAMVerifier{
		Iterations: v.Iterations,
		Salt:       append([]byte(nil), v.Salt...),
		StoredKey:  append([]byte(nil), v.StoredKey...),
		ServerKey:  append([]byte(nil), v.ServerKey...),
	}
}

// saltedPassword computes Hi(password, salt, i) = PBKDF2-HMAC-SHA-256.
// password must already be normalized.
func saltedPassword(password string, salt []byte, iterations int) ([]byte, error) {
	k, err := pbkdf2.Key(sha256.New, password, salt, iterations, scramKeyLen)
	if err != nil {
		return nil, fmt.Errorf("computing SCRAM salted password: %w", err)
	}
	return k, nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// newNonce reads scramRawNonceLen bytes from r and returns them base64
// encoded, like PostgreSQL and libpq do.
func newNonce(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	var raw [scramRawNonceLen]byte
	if _, err := io.ReadFull(r, raw[:]); err != nil {
		return "", fmt.Errorf("generating SCRAM nonce: %w", err)
	}
	return base64.StdEncoding.EncodeToString(raw[:]), nil
}

// isPrintable reports whether s is a valid, non-empty SCRAM nonce:
// printable ASCII except ',' (RFC 5802 "printable").
func isPrintable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7E || c == ',' {
			return false
		}
	}
	return true
}

// attr is one "x=value" attribute of a SCRAM message.
type attr struct {
	name  byte
	value string
}

// splitAttrs splits a SCRAM message (or the part of it after the GS2
// header) into attributes. Every attribute must be an ASCII letter followed
// by '='; values cannot contain ',' by construction. Error messages name
// attributes by position and never quote the peer's data.
func splitAttrs(msg, what string) ([]attr, error) {
	parts := strings.Split(msg, ",")
	attrs := make([]attr, len(parts))
	for i, p := range parts {
		if len(p) < 2 || p[1] != '=' || !isASCIILetter(p[0]) {
			return nil, protocolError("malformed %s: attribute %d is not of the form x=value", what, i+1)
		}
		attrs[i] = attr{name: p[0], value: p[2:]}
	}
	return attrs, nil
}

func isASCIILetter(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// expectAttr checks that attrs[i] exists and is named name.
func expectAttr(attrs []attr, i int, name byte, what string) (string, error) {
	if i >= len(attrs) {
		return "", protocolError("malformed %s: attribute %q missing", what, string(name))
	}
	if attrs[i].name != name {
		return "", protocolError("malformed %s: expected attribute %q, found %q", what, string(name), string(attrs[i].name))
	}
	return attrs[i].value, nil
}

// parseMessage checks a whole SCRAM message (checkMessage) and splits it
// into attributes (splitAttrs); it returns the message as text too, for the
// signatures computed over it.
func parseMessage(data []byte, what string) (string, []attr, error) {
	if err := checkMessage(data, what); err != nil {
		return "", nil, err
	}
	msg := string(data)
	attrs, err := splitAttrs(msg, what)
	return msg, attrs, err
}

// checkMessage rejects empty payloads and payloads with NUL bytes (which
// PostgreSQL rejects as a length mismatch since it handles C strings).
func checkMessage(data []byte, what string) error {
	if len(data) == 0 {
		return protocolError("empty %s", what)
	}
	for _, c := range data {
		if c == 0 {
			return protocolError("%s contains a NUL byte", what)
		}
	}
	return nil
}

// xorBytes returns a XOR b; a and b have the same length.
func xorBytes(a, b []byte) []byte {
	out := make([]byte, len(a))
	for i := range a {
		out[i] = a[i] ^ b[i]
	}
	return out
}
