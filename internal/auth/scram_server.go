package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"strings"
)

type scramServerState int

const (
	serverStart scramServerState = iota
	serverSentFirst
	serverDone
	serverFailed
)

// SCRAMServer is the server side of one SCRAM-SHA-256 exchange: poolerd
// verifying a client's password against a verifier. It follows PostgreSQL's
// backend (src/backend/libpq/auth-scram.c), without channel binding: only
// the mechanism SCRAM-SHA-256 (not SCRAM-SHA-256-PLUS) is supported.
//
// Use one SCRAMServer per login attempt: after an error the exchange is
// over and every further call fails.
type SCRAMServer struct {
	// Key material is kept in hidden fields; see Secret.
	v     hidden[*SCRAMVerifier]
	rand  io.Reader
	state scramServerState

	gs2Header       string // "n,," or "y,,"
	clientNonce     string
	serverNonce     string
	clientFirstBare string
	serverFirst     string
	clientKey       hidden[[]byte]

	// fixedServerNonce replaces the random server nonce; tests only.
	fixedServerNonce string
}

// NewSCRAMServer returns a server exchange that checks the client against
// v (which is copied). nonceRand supplies the randomness of the server
// nonce: crypto/rand.Reader in production (nil means crypto/rand.Reader);
// tests may pass a deterministic reader.
func NewSCRAMServer(v *SCRAMVerifier, nonceRand io.Reader) *SCRAMServer {
	return &SCRAMServer{v: hide(v.clone()), rand: nonceRand}
}

// HandleClientFirst processes the SASLInitialResponse: the selected
// mechanism and the client-first-message. It returns the
// server-first-message to send in AuthenticationSASLContinue.
//
// The GS2 header must be "n,," (client does not support channel binding)
// or "y,," (client supports it but believes the server does not). The
// latter is accepted because poolerd never advertises SCRAM-SHA-256-PLUS;
// if it ever does (over TLS), "y" must be rejected there to prevent a
// downgrade, as PostgreSQL does. "p=..." (channel binding required), an
// authorization identity ("n,a=...") and mandatory extensions ("m=...")
// are rejected. The user name attribute (n=) is ignored, as PostgreSQL
// ignores it in favor of the startup packet's user; it may be empty.
// Well-formed extension attributes after the nonce are ignored, like
// PostgreSQL does.
//
// All errors wrap [ErrProtocolViolation], except for an unusable verifier
// (nil, or with wrong key lengths) and a failure to read the nonce
// randomness.
func (s *SCRAMServer) HandleClientFirst(mechanism string, data []byte) (out []byte, err error) {
	if s.state != serverStart {
		s.state = serverFailed
		return nil, protocolError("unexpected client-first-message")
	}
	defer func() {
		if err != nil {
			s.state = serverFailed
		}
	}()
	v := s.v.get()
	if err := v.validate(); err != nil {
		return nil, fmt.Errorf("cannot start SCRAM exchange: %w", err)
	}
	switch mechanism {
	case SCRAMMechanism:
	case SCRAMMechanism + "-PLUS":
		return nil, protocolError("client selected SCRAM-SHA-256-PLUS, which was not offered")
	default:
		return nil, protocolError("client selected an unsupported SASL authentication mechanism")
	}
	if err := checkMessage(data, "client-first-message"); err != nil {
		return nil, err
	}
	msg := string(data)

	// gs2-header = gs2-cbind-flag "," [ authzid ] ","
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok {
		return nil, protocolError("malformed client-first-message: missing GS2 header")
	}
	switch {
	case flag == "n" || flag == "y":
	case strings.HasPrefix(flag, "p="):
		return nil, protocolError("client requires SCRAM channel binding, but SCRAM-SHA-256-PLUS was not offered")
	default:
		return nil, protocolError("malformed client-first-message: unexpected channel-binding flag")
	}
	authzid, bare, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, protocolError("malformed client-first-message: missing GS2 header")
	}
	switch {
	case authzid == "":
	case strings.HasPrefix(authzid, "a="):
		return nil, protocolError("client uses an authorization identity, which is not supported")
	default:
		return nil, protocolError("malformed client-first-message: unexpected attribute in GS2 header")
	}

	// client-first-message-bare = [reserved-mext ","] username "," nonce ["," extensions]
	const what = "client-first-message"
	attrs, err := splitAttrs(bare, what)
	if err != nil {
		return nil, err
	}
	if attrs[0].name == 'm' {
		return nil, protocolError("client requires an unsupported SCRAM extension")
	}
	if _, err := expectAttr(attrs, 0, 'n', what); err != nil {
		return nil, err
	}
	nonce, err := expectAttr(attrs, 1, 'r', what)
	if err != nil {
		return nil, err
	}
	if !isPrintable(nonce) {
		return nil, protocolError("malformed client-first-message: nonce is empty or has non-printable characters")
	}
	// attrs[2:] are optional extensions; splitAttrs validated their syntax.

	serverNonce := s.fixedServerNonce
	if serverNonce == "" {
		serverNonce, err = newNonce(s.rand)
		if err != nil {
			return nil, err
		}
	}

	s.gs2Header = flag + ",,"
	s.clientNonce = nonce
	s.serverNonce = serverNonce
	s.clientFirstBare = bare
	s.serverFirst = "r=" + nonce + serverNonce +
		",s=" + base64.StdEncoding.EncodeToString(v.Salt) +
		",i=" + strconv.Itoa(v.Iterations)
	s.state = serverSentFirst
	return []byte(s.serverFirst), nil
}

// HandleClientFinal processes the client-final-message (SASLResponse) and,
// if the proof is correct, returns the server-final-message ("v=...") to
// send in AuthenticationSASLFinal.
//
// The message must be exactly c=...,r=...,p=...: the channel-binding
// attribute must be the base64 of the GS2 header the client sent, the nonce
// must be the client nonce followed by the server nonce, and the proof must
// be 32 bytes. Extension attributes before p= are rejected (PostgreSQL
// ignores them; no known client sends any). These problems wrap
// [ErrProtocolViolation]. A wrong proof (wrong password) returns
// [ErrPasswordMismatch]. The proof is checked in constant time.
func (s *SCRAMServer) HandleClientFinal(data []byte) (out []byte, err error) {
	if s.state != serverSentFirst {
		s.state = serverFailed
		return nil, protocolError("unexpected client-final-message")
	}
	defer func() {
		if err != nil {
			s.state = serverFailed
		}
	}()
	const what = "client-final-message"
	msg, attrs, err := parseMessage(data, what)
	if err != nil {
		return nil, err
	}
	cbind, err := expectAttr(attrs, 0, 'c', what)
	if err != nil {
		return nil, err
	}
	if cbind != base64.StdEncoding.EncodeToString([]byte(s.gs2Header)) {
		return nil, protocolError("unexpected SCRAM channel-binding attribute in client-final-message")
	}
	nonce, err := expectAttr(attrs, 1, 'r', what)
	if err != nil {
		return nil, err
	}
	if nonce != s.clientNonce+s.serverNonce {
		return nil, protocolError("nonce in client-final-message does not match")
	}
	if len(attrs) > 2 && attrs[2].name != 'p' {
		return nil, protocolError("unsupported attribute %q in client-final-message", string(attrs[2].name))
	}
	proofB64, err := expectAttr(attrs, 2, 'p', what)
	if err != nil {
		return nil, err
	}
	if len(attrs) > 3 {
		return nil, protocolError("malformed client-final-message: garbage after the proof")
	}
	proof, err := decodeBase64(proofB64)
	if err != nil || len(proof) != scramKeyLen {
		return nil, protocolError("malformed client-final-message: malformed proof")
	}

	// client-final-message-without-proof is everything before ",p=".
	withoutProof := msg[:len(msg)-len(proofB64)-len(",p=")]
	authMessage := s.clientFirstBare + "," + s.serverFirst + "," + withoutProof

	v := s.v.get()
	clientSignature := hmacSHA256(v.StoredKey, authMessage)
	clientKey := xorBytes(proof, clientSignature)
	storedKey := sha256.Sum256(clientKey)
	if subtle.ConstantTimeCompare(storedKey[:], v.StoredKey) != 1 {
		return nil, ErrPasswordMismatch
	}

	s.clientKey = hide(clientKey)
	s.state = serverDone
	serverSignature := hmacSHA256(v.ServerKey, authMessage)
	return []byte("v=" + base64.StdEncoding.EncodeToString(serverSignature)), nil
}

// ClientKey returns the ClientKey recovered from a successful proof
// (ClientProof XOR HMAC(StoredKey, AuthMessage)), or nil before the
// exchange has succeeded. With it and the verifier's ServerKey,
// [NewSCRAMClientFromKeys] can log in to PostgreSQL on the client's behalf
// ("SCRAM pass-through"). It is as sensitive as a password.
func (s *SCRAMServer) ClientKey() []byte {
	if s.state != serverDone {
		return nil
	}
	return append([]byte(nil), s.clientKey.get()...)
}

// Done reports whether the exchange completed successfully.
func (s *SCRAMServer) Done() bool { return s.state == serverDone }

// String describes the exchange without revealing any key.
func (s *SCRAMServer) String() string { return "SCRAM-SHA-256 server exchange" }

// Format implements fmt.Formatter so that printing a SCRAMServer never
// reveals key material.
func (s *SCRAMServer) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }
