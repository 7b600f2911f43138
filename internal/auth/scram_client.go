package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
)

type scramClientState int

const (
	clientStart scramClientState = iota
	clientSentFirst
	clientSentFinal
	clientDone
	clientFailed
)

// maxServerErrorLen bounds how much of a server's "e=" message is put into
// an error.
const maxServerErrorLen = 256

// SCRAMClient is the client side of one SCRAM-SHA-256 exchange: poolerd
// authenticating to PostgreSQL, like libpq (src/interfaces/libpq/
// fe-auth-scram.c) without channel binding.
//
// Call ClientFirst, send it in SASLInitialResponse with Mechanism; pass the
// AuthenticationSASLContinue data to HandleServerFirst and send the result
// in SASLResponse; pass the AuthenticationSASLFinal data to
// HandleServerFinal. Use one SCRAMClient per connection attempt.
type SCRAMClient struct {
	// Key material is kept in hidden fields; see Secret.
	password hidden[string]
	cache    *SCRAMKeyCache // nil: derive the keys every time

	// Pass-through: keys instead of a password.
	fromKeys  bool
	verifier  hidden[*SCRAMVerifier]
	clientKey hidden[[]byte]

	rand  io.Reader
	state scramClientState
	err   error // nonce generation failure, reported by HandleServerFirst

	nonce           string
	clientFirst     string
	clientFirstBare string
	serverSignature hidden[[]byte] // expected

	// Tests only: fixed client nonce and user name (the RFC 7677 example
	// uses n=user; PostgreSQL clients send an empty user name).
	fixedNonce string
	username   string
}

// NewSCRAMClient returns a client exchange that authenticates with
// password (normalized with [SASLprep] like libpq does). nonceRand supplies
// the randomness of the client nonce: crypto/rand.Reader in production (nil
// means crypto/rand.Reader).
func NewSCRAMClient(password string, nonceRand io.Reader) *SCRAMClient {
	return &SCRAMClient{password: hide(password), rand: nonceRand}
}

// NewSCRAMClientCached is NewSCRAMClient taking the keys the password gives
// with the server's salt and iteration count from cache (computing and
// keeping them the first time).
func NewSCRAMClientCached(password string, nonceRand io.Reader, cache *SCRAMKeyCache) *SCRAMClient {
	return &SCRAMClient{password: hide(password), rand: nonceRand, cache: cache}
}

// NewSCRAMClientFromKeys returns a client exchange that authenticates with
// a ClientKey (recovered by [SCRAMServer.ClientKey]) and the ServerKey of
// verifier v, instead of a password: SCRAM pass-through. It only works if
// the server's verifier is v: its salt and iteration count must be the
// same, otherwise HandleServerFirst fails with an error wrapping
// [ErrStoredSCRAMMismatch]. v and clientKey are copied.
func NewSCRAMClientFromKeys(v *SCRAMVerifier, clientKey []byte, nonceRand io.Reader) *SCRAMClient {
	return &SCRAMClient{
		fromKeys:  true,
		verifier:  hide(v.clone()),
		clientKey: hide(append([]byte(nil), clientKey...)),
		rand:      nonceRand,
	}
}

// Mechanism returns the SASL mechanism to select: "SCRAM-SHA-256".
func (c *SCRAMClient) Mechanism() string { return SCRAMMechanism }

// ClientFirst returns the client-first-message: "n,,n=,r=<nonce>". Like
// libpq the user name is empty (PostgreSQL uses the startup packet's).
// Repeated calls return the same message. If the nonce cannot be
// generated, ClientFirst returns nil and HandleServerFirst reports the
// error.
func (c *SCRAMClient) ClientFirst() []byte {
	switch c.state {
	case clientStart:
	case clientSentFirst:
		return []byte(c.clientFirst)
	default:
		return nil
	}
	nonce := c.fixedNonce
	if nonce == "" {
		var err error
		nonce, err = newNonce(c.rand)
		if err != nil {
			c.err = err
			c.state = clientFailed
			return nil
		}
	}
	c.nonce = nonce
	c.clientFirstBare = "n=" + c.username + ",r=" + nonce
	c.clientFirst = "n,," + c.clientFirstBare
	c.state = clientSentFirst
	return []byte(c.clientFirst)
}

// HandleServerFirst processes the server-first-message (the data of
// AuthenticationSASLContinue) and returns the client-final-message.
//
// The message must be exactly r=...,s=...,i=...: the nonce must start with
// the client nonce and add a non-empty server part, the salt must be
// non-empty valid base64 and the iteration count between 1 and
// [MaxSCRAMIterations]. Malformed messages wrap [ErrProtocolViolation].
func (c *SCRAMClient) HandleServerFirst(data []byte) (out []byte, err error) {
	if c.state != clientSentFirst {
		if c.err != nil {
			return nil, c.err
		}
		c.state = clientFailed
		return nil, errors.New("SCRAM client: HandleServerFirst called out of order (call ClientFirst first, once)")
	}
	defer func() {
		if err != nil {
			c.state = clientFailed
		}
	}()
	const what = "server-first-message"
	msg, attrs, err := parseMessage(data, what)
	if err != nil {
		return nil, err
	}
	if attrs[0].name == 'm' {
		return nil, protocolError("server requires an unsupported SCRAM extension")
	}
	nonce, err := expectAttr(attrs, 0, 'r', what)
	if err != nil {
		return nil, err
	}
	if len(nonce) <= len(c.nonce) || nonce[:len(c.nonce)] != c.nonce {
		return nil, protocolError("nonce in server-first-message does not start with the client nonce")
	}
	if !isPrintable(nonce) {
		return nil, protocolError("malformed server-first-message: nonce has non-printable characters")
	}
	saltB64, err := expectAttr(attrs, 1, 's', what)
	if err != nil {
		return nil, err
	}
	salt, err := decodeBase64(saltB64)
	if err != nil || len(salt) == 0 {
		return nil, protocolError("malformed server-first-message: invalid salt")
	}
	iterStr, err := expectAttr(attrs, 2, 'i', what)
	if err != nil {
		return nil, err
	}
	iterations, ok := parseDecimal(iterStr, MaxSCRAMIterations)
	if !ok || iterations < 1 {
		return nil, protocolError("malformed server-first-message: invalid iteration count (must be 1 to %d)", MaxSCRAMIterations)
	}
	if len(attrs) > 3 {
		return nil, protocolError("malformed server-first-message: garbage after the iteration count")
	}

	var clientKey, serverKey []byte
	if c.fromKeys {
		v, key := c.verifier.get(), c.clientKey.get()
		if err := v.validate(); err != nil {
			return nil, fmt.Errorf("SCRAM pass-through: %w", err)
		}
		if len(key) != scramKeyLen {
			return nil, fmt.Errorf("SCRAM pass-through: client key is %d bytes, want %d", len(key), scramKeyLen)
		}
		if stored := sha256.Sum256(key); subtle.ConstantTimeCompare(stored[:], v.StoredKey) != 1 {
			return nil, errors.New("SCRAM pass-through: client key does not belong to the stored SCRAM secret")
		}
		if iterations != v.Iterations || !bytes.Equal(salt, v.Salt) {
			return nil, fmt.Errorf("SCRAM pass-through: %w", ErrStoredSCRAMMismatch)
		}
		clientKey, serverKey = key, v.ServerKey
	} else {
		clientKey, serverKey, err = c.cache.keys(SASLprep(c.password.get()), salt, iterations)
		if err != nil {
			return nil, err
		}
	}

	// c=biws is base64("n,,").
	withoutProof := "c=" + base64.StdEncoding.EncodeToString([]byte("n,,")) + ",r=" + nonce
	authMessage := c.clientFirstBare + "," + msg + "," + withoutProof
	storedKey := sha256.Sum256(clientKey)
	clientSignature := hmacSHA256(storedKey[:], authMessage)
	proof := xorBytes(clientKey, clientSignature)
	c.serverSignature = hide(hmacSHA256(serverKey, authMessage))
	c.state = clientSentFinal
	return []byte(withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof)), nil
}

// HandleServerFinal processes the server-final-message (the data of
// AuthenticationSASLFinal) and verifies the server's signature in
// constant time. A wrong signature returns [ErrServerSignatureMismatch]; an
// "e=..." message returns an error wrapping [ErrServerRejected] that
// includes the server's message; malformed messages wrap
// [ErrProtocolViolation].
func (c *SCRAMClient) HandleServerFinal(data []byte) (err error) {
	if c.state != clientSentFinal {
		c.state = clientFailed
		return errors.New("SCRAM client: HandleServerFinal called out of order")
	}
	defer func() {
		if err != nil {
			c.state = clientFailed
		}
	}()
	const what = "server-final-message"
	if err := checkMessage(data, what); err != nil {
		return err
	}
	msg := string(data)
	if len(msg) >= 2 && msg[0] == 'e' && msg[1] == '=' {
		text := msg[2:]
		if len(text) > maxServerErrorLen {
			text = text[:maxServerErrorLen] + "..."
		}
		return fmt.Errorf("%w: %q", ErrServerRejected, text)
	}
	attrs, err := splitAttrs(msg, what)
	if err != nil {
		return err
	}
	sigB64, err := expectAttr(attrs, 0, 'v', what)
	if err != nil {
		return err
	}
	if len(attrs) > 1 {
		return protocolError("malformed server-final-message: garbage after the server signature")
	}
	sig, err := decodeBase64(sigB64)
	if err != nil || len(sig) != scramKeyLen {
		return protocolError("malformed server-final-message: malformed server signature")
	}
	if subtle.ConstantTimeCompare(sig, c.serverSignature.get()) != 1 {
		return ErrServerSignatureMismatch
	}
	c.state = clientDone
	return nil
}

// Done reports whether the exchange completed successfully, including the
// verification of the server's signature.
func (c *SCRAMClient) Done() bool { return c.state == clientDone }

// String describes the exchange without revealing the password or keys.
func (c *SCRAMClient) String() string { return "SCRAM-SHA-256 client exchange" }

// Format implements fmt.Formatter so that printing a SCRAMClient never
// reveals the password or keys.
func (c *SCRAMClient) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, c.String()) }
