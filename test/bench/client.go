package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A minimal PostgreSQL client that only logs in (SCRAM-SHA-256, md5 or
// cleartext) and then holds its connection idle: the idle-clients test
// needs thousands of them, each costing the harness one socket and no
// goroutine. The connection-churn test also sends a simple query on it and
// abandons logins after the server's SASL request. The SCRAM salted
// password is cached per (salt, iterations), so that the harness's own
// PBKDF2 does not limit how fast clients log in to a server that keeps its
// salt (poolerd, PostgreSQL). PgBouncer with a plain-text auth_file sends a
// new salt every login: against it the harness derives the key every time
// (and the cache gains an entry per login).

var saltedCache sync.Map // string(salt)+"/"+iterations -> []byte

// login dials addr, authenticates as user on db and waits for
// ReadyForQuery. The returned connection is idle and authenticated. With
// useTLS it first asks for TLS (SSLRequest) and refuses a server that
// declines, as sslmode=require: the certificate is not verified.
func login(addr, user, password, db string, timeout time.Duration, useTLS bool) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if useTLS {
		if conn, err = startTLS(conn); err != nil {
			return nil, err
		}
	}
	if err := handshake(conn, user, password, db); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// startTLS sends an SSLRequest on conn and, when the server answers 'S',
// runs the TLS handshake (sslmode=require: no certificate check). It closes
// conn on failure.
func startTLS(conn net.Conn) (net.Conn, error) {
	req := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), 80877103)
	answer := make([]byte, 1)
	if _, err := conn.Write(req); err != nil {
		conn.Close()
		return nil, fmt.Errorf("SSLRequest: %w", err)
	}
	if _, err := io.ReadFull(conn, answer); err != nil {
		conn.Close()
		return nil, fmt.Errorf("SSLRequest answer: %w", err)
	}
	if answer[0] != 'S' {
		conn.Close()
		return nil, fmt.Errorf("the server declined TLS (answered %q to SSLRequest)", answer[0])
	}
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // sslmode=require
	if err := tc.Handshake(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

// startupMessage is a protocol 3.0 StartupMessage for user on db.
func startupMessage(user, db string) []byte {
	var startup []byte
	startup = binary.BigEndian.AppendUint32(startup, 0)
	startup = binary.BigEndian.AppendUint32(startup, 196608)
	for _, kv := range [][2]string{{"user", user}, {"database", db}, {"application_name", "bench-idle"}} {
		startup = append(startup, kv[0]...)
		startup = append(startup, 0)
		startup = append(startup, kv[1]...)
		startup = append(startup, 0)
	}
	startup = append(startup, 0)
	binary.BigEndian.PutUint32(startup, uint32(len(startup)))
	return startup
}

func handshake(conn net.Conn, user, password, db string) error {
	if _, err := conn.Write(startupMessage(user, db)); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, 1024)
	var sc *scramClient
	for {
		typ, body, err := readMsg(br)
		if err != nil {
			return err
		}
		switch typ {
		case 'R':
			if len(body) < 4 {
				return errors.New("short authentication message")
			}
			code := binary.BigEndian.Uint32(body)
			data := body[4:]
			switch code {
			case 0: // AuthenticationOk
			case 3: // cleartext
				if err := writeMsg(conn, 'p', append([]byte(password), 0)); err != nil {
					return err
				}
			case 5: // md5
				if len(data) < 4 {
					return errors.New("short md5 salt")
				}
				inner := md5.Sum([]byte(password + user))
				outer := md5.Sum(append([]byte(hex.EncodeToString(inner[:])), data[:4]...))
				if err := writeMsg(conn, 'p', append([]byte("md5"+hex.EncodeToString(outer[:])), 0)); err != nil {
					return err
				}
			case 10: // SASL
				if !strings.Contains(string(data), "SCRAM-SHA-256\x00") {
					return fmt.Errorf("no SCRAM-SHA-256 in SASL mechanisms %q", data)
				}
				sc = newSCRAM(password)
				first := sc.clientFirst()
				var b []byte
				b = append(b, "SCRAM-SHA-256\x00"...)
				b = binary.BigEndian.AppendUint32(b, uint32(len(first)))
				b = append(b, first...)
				if err := writeMsg(conn, 'p', b); err != nil {
					return err
				}
			case 11: // SASLContinue
				if sc == nil {
					return errors.New("SASLContinue without SASL")
				}
				final, err := sc.clientFinal(string(data))
				if err != nil {
					return err
				}
				if err := writeMsg(conn, 'p', []byte(final)); err != nil {
					return err
				}
			case 12: // SASLFinal
				if sc == nil || !sc.verifyServer(string(data)) {
					return errors.New("SCRAM server signature does not verify")
				}
			default:
				return fmt.Errorf("unsupported authentication request %d", code)
			}
		case 'E':
			return fmt.Errorf("server error: %s", errorText(body))
		case 'Z':
			return nil
		case 'S', 'K', 'N':
		default:
			return fmt.Errorf("unexpected message %q during login", typ)
		}
	}
}

// abandonLogin dials addr (with TLS first when useTLS), sends a
// StartupMessage for user on db, waits for the server's
// AuthenticationSASL request and closes the connection without answering
// it: a client that gives up in the middle of its login.
func abandonLogin(addr, user, db string, timeout time.Duration, useTLS bool) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if useTLS {
		if conn, err = startTLS(conn); err != nil {
			return err
		}
	}
	defer conn.Close()
	if _, err := conn.Write(startupMessage(user, db)); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, 256)
	for {
		typ, body, err := readMsg(br)
		if err != nil {
			return err
		}
		switch {
		case typ == 'R' && len(body) >= 4 && binary.BigEndian.Uint32(body) == 10:
			return nil // AuthenticationSASL: hang up
		case typ == 'E':
			return fmt.Errorf("server error: %s", errorText(body))
		case typ == 'N':
		default:
			return fmt.Errorf("unexpected message %q before the SASL request", typ)
		}
	}
}

// simpleQuery sends sql as a simple Query on an idle, logged-in conn and
// reads the answer up to ReadyForQuery, within timeout. An ErrorResponse
// is an error (after ReadyForQuery was read).
func simpleQuery(conn net.Conn, sql string, timeout time.Duration) error {
	_ = conn.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	if err := writeMsg(conn, 'Q', append([]byte(sql), 0)); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, 512)
	var qerr error
	for {
		typ, body, err := readMsg(br)
		if err != nil {
			return err
		}
		switch typ {
		case 'E':
			qerr = fmt.Errorf("server error: %s", errorText(body))
		case 'Z':
			return qerr
		}
	}
}

// terminate sends Terminate ('X') and closes conn.
func terminate(conn net.Conn) {
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeMsg(conn, 'X', nil)
	conn.Close()
}

func readMsg(br *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
	if n < 0 || n > 1<<20 {
		return 0, nil, fmt.Errorf("bad message length %d", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}

func writeMsg(w io.Writer, typ byte, body []byte) error {
	b := make([]byte, 0, 5+len(body))
	b = append(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(body)))
	b = append(b, body...)
	_, err := w.Write(b)
	return err
}

// errorText renders the severity, code and message of an ErrorResponse.
func errorText(body []byte) string {
	var sev, code, msg string
	for _, f := range strings.Split(string(body), "\x00") {
		if f == "" {
			continue
		}
		switch f[0] {
		case 'S':
			sev = f[1:]
		case 'C':
			code = f[1:]
		case 'M':
			msg = f[1:]
		}
	}
	return fmt.Sprintf("%s %s %s", sev, code, msg)
}

type scramClient struct {
	password    string
	nonce       string
	firstBare   string
	authMessage string
	saltedPass  []byte
}

func newSCRAM(password string) *scramClient {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return &scramClient{password: password, nonce: base64.StdEncoding.EncodeToString(b)}
}

func (s *scramClient) clientFirst() string {
	s.firstBare = "n=,r=" + s.nonce
	return "n,," + s.firstBare
}

func (s *scramClient) clientFinal(serverFirst string) (string, error) {
	var nonce, salt64 string
	iters := 0
	for _, attr := range strings.Split(serverFirst, ",") {
		switch {
		case strings.HasPrefix(attr, "r="):
			nonce = attr[2:]
		case strings.HasPrefix(attr, "s="):
			salt64 = attr[2:]
		case strings.HasPrefix(attr, "i="):
			iters, _ = strconv.Atoi(attr[2:])
		}
	}
	if !strings.HasPrefix(nonce, s.nonce) || salt64 == "" || iters <= 0 {
		return "", fmt.Errorf("bad SCRAM server-first-message %q", serverFirst)
	}
	salt, err := base64.StdEncoding.DecodeString(salt64)
	if err != nil {
		return "", err
	}
	key := salt64 + "/" + strconv.Itoa(iters) + "/" + s.password
	if v, ok := saltedCache.Load(key); ok {
		s.saltedPass = v.([]byte)
	} else {
		s.saltedPass, err = pbkdf2.Key(sha256.New, s.password, salt, iters, 32)
		if err != nil {
			return "", err
		}
		saltedCache.Store(key, s.saltedPass)
	}
	withoutProof := "c=biws,r=" + nonce
	s.authMessage = s.firstBare + "," + serverFirst + "," + withoutProof
	clientKey := hmacSHA256(s.saltedPass, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	sig := hmacSHA256(storedKey[:], s.authMessage)
	proof := make([]byte, len(clientKey))
	for i := range clientKey {
		proof[i] = clientKey[i] ^ sig[i]
	}
	return withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
}

func (s *scramClient) verifyServer(serverFinal string) bool {
	v, ok := strings.CutPrefix(serverFinal, "v=")
	if !ok {
		return false
	}
	want := hmacSHA256(hmacSHA256(s.saltedPass, "Server Key"), s.authMessage)
	got, err := base64.StdEncoding.DecodeString(v)
	return err == nil && hmac.Equal(got, want)
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
