package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// RFC 7677 section 3 example.
const (
	rfcPassword    = "pencil"
	rfcClientNonce = "rOprNGfwEbeRWgbNEkqO"
	rfcServerNonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	rfcSaltB64     = "W22ZaJ0SNY7soEsUEjb6gQ=="
	rfcClientFirst = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
	rfcServerFirst = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
	rfcClientFinal = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
	rfcServerFinal = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
	rfcIterations  = 4096
	testMechanism  = "SCRAM-SHA-256"
	testPassword   = "secret"
	zeroNonce24    = "AAAAAAAAAAAAAAAAAAAAAAAA" // base64 of 18 zero bytes
	onesNonce24    = "AQEBAQEBAQEBAQEBAQEBAQEB" // base64 of 18 0x01 bytes
)

func mustB64(t testing.TB, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// repeatReader returns an endless stream of b.
type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

func rfcVerifier(t testing.TB) *SCRAMVerifier {
	return NewSCRAMVerifier(rfcPassword, mustB64(t, rfcSaltB64), rfcIterations)
}

func TestSCRAMRFC7677(t *testing.T) {
	srv := NewSCRAMServer(rfcVerifier(t), repeatReader(0))
	srv.fixedServerNonce = rfcServerNonce

	cli := NewSCRAMClient(rfcPassword, repeatReader(0))
	cli.fixedNonce = rfcClientNonce
	cli.username = "user"

	if got := cli.Mechanism(); got != testMechanism {
		t.Fatalf("Mechanism() = %q", got)
	}
	first := cli.ClientFirst()
	if string(first) != rfcClientFirst {
		t.Fatalf("client-first = %q, want %q", first, rfcClientFirst)
	}
	sfirst, err := srv.HandleClientFirst(cli.Mechanism(), first)
	if err != nil {
		t.Fatal(err)
	}
	if string(sfirst) != rfcServerFirst {
		t.Fatalf("server-first = %q, want %q", sfirst, rfcServerFirst)
	}
	cfinal, err := cli.HandleServerFirst(sfirst)
	if err != nil {
		t.Fatal(err)
	}
	if string(cfinal) != rfcClientFinal {
		t.Fatalf("client-final = %q, want %q", cfinal, rfcClientFinal)
	}
	sfinal, err := srv.HandleClientFinal(cfinal)
	if err != nil {
		t.Fatal(err)
	}
	if string(sfinal) != rfcServerFinal {
		t.Fatalf("server-final = %q, want %q", sfinal, rfcServerFinal)
	}
	if err := cli.HandleServerFinal(sfinal); err != nil {
		t.Fatal(err)
	}
	if !cli.Done() || !srv.Done() {
		t.Fatal("exchange not done")
	}

	// The recovered ClientKey is HMAC(SaltedPassword, "Client Key").
	salted, err := saltedPassword(rfcPassword, mustB64(t, rfcSaltB64), rfcIterations)
	if err != nil {
		t.Fatal(err)
	}
	if want := hmacSHA256(salted, "Client Key"); !bytes.Equal(srv.ClientKey(), want) {
		t.Fatalf("ClientKey = %x, want %x", srv.ClientKey(), want)
	}
}

// The RFC messages fed directly to the server, independently of SCRAMClient.
func TestSCRAMServerRFC7677Messages(t *testing.T) {
	srv := NewSCRAMServer(rfcVerifier(t), nil)
	srv.fixedServerNonce = rfcServerNonce
	out, err := srv.HandleClientFirst(testMechanism, []byte(rfcClientFirst))
	if err != nil || string(out) != rfcServerFirst {
		t.Fatalf("HandleClientFirst = %q, %v", out, err)
	}
	out, err = srv.HandleClientFinal([]byte(rfcClientFinal))
	if err != nil || string(out) != rfcServerFinal {
		t.Fatalf("HandleClientFinal = %q, %v", out, err)
	}
}

func TestNonceFromReader(t *testing.T) {
	cli := NewSCRAMClient("pw", repeatReader(0))
	if got, want := string(cli.ClientFirst()), "n,,n=,r="+zeroNonce24; got != want {
		t.Fatalf("ClientFirst = %q, want %q", got, want)
	}
	// Repeated calls return the same message.
	if got, want := string(cli.ClientFirst()), "n,,n=,r="+zeroNonce24; got != want {
		t.Fatalf("second ClientFirst = %q, want %q", got, want)
	}
	srv := NewSCRAMServer(NewSCRAMVerifier("pw", []byte("0123456789abcdef"), 4096), repeatReader(1))
	out, err := srv.HandleClientFirst(testMechanism, cli.ClientFirst())
	if err != nil {
		t.Fatal(err)
	}
	want := "r=" + zeroNonce24 + onesNonce24 + ",s=MDEyMzQ1Njc4OWFiY2RlZg==,i=4096"
	if string(out) != want {
		t.Fatalf("server-first = %q, want %q", out, want)
	}
}

func TestNonceReaderFailure(t *testing.T) {
	cli := NewSCRAMClient("pw", bytes.NewReader([]byte{1, 2, 3}))
	if first := cli.ClientFirst(); first != nil {
		t.Fatalf("ClientFirst = %q, want nil", first)
	}
	if _, err := cli.HandleServerFirst([]byte("r=x,s=AAAA,i=1")); err == nil || !strings.Contains(err.Error(), "nonce") {
		t.Fatalf("HandleServerFirst err = %v, want nonce generation error", err)
	}

	srv := NewSCRAMServer(NewSCRAMVerifier("pw", nil, 0), bytes.NewReader(nil))
	if _, err := srv.HandleClientFirst(testMechanism, []byte("n,,n=,r=abc")); err == nil {
		t.Fatal("HandleClientFirst succeeded with an empty nonce reader")
	}
}

func TestVerifierRoundTrip(t *testing.T) {
	v := NewSCRAMVerifier(testPassword, nil, 0)
	if v.Iterations != DefaultSCRAMIterations || len(v.Salt) != DefaultSCRAMSaltLen {
		t.Fatalf("defaults: iterations %d, salt %d bytes", v.Iterations, len(v.Salt))
	}
	s, err := ParseSecret(v.String())
	if err != nil {
		t.Fatal(err)
	}
	if s.Kind() != SecretSCRAM {
		t.Fatalf("Kind = %v", s.Kind())
	}
	got, ok := s.SCRAM()
	if !ok {
		t.Fatal("SCRAM() not ok")
	}
	if got.Iterations != v.Iterations || !bytes.Equal(got.Salt, v.Salt) ||
		!bytes.Equal(got.StoredKey, v.StoredKey) || !bytes.Equal(got.ServerKey, v.ServerKey) {
		t.Fatalf("round trip mismatch: %s vs %s", got, v)
	}
	if got.String() != v.String() {
		t.Fatalf("String mismatch")
	}
	// SCRAM() returns a copy.
	got.Salt[0] ^= 0xFF
	again, _ := s.SCRAM()
	if !bytes.Equal(again.Salt, v.Salt) {
		t.Fatal("SCRAM() exposes internal state")
	}
}

// A verifier for "secret" computed by PostgreSQL 15 (CREATE ROLE ...
// PASSWORD 'secret' with password_encryption = scram-sha-256).
const pgSecretVerifier = "SCRAM-SHA-256$4096:wPx1caiNaHEzSzPJZXnjLA==$dbtvijuHBYwjLQDMazhgWp2HB/hAl7/bZw7VCd1ujCU=:d7Uxr+KKdsFRaw87Q0F6LPN/Eysk1SCawhVyGYkOMtg="

func TestVerifierKnownPostgres(t *testing.T) {
	s, err := ParseSecret(pgSecretVerifier)
	if err != nil {
		t.Fatal(err)
	}
	pv, _ := s.SCRAM()
	v := NewSCRAMVerifier(testPassword, pv.Salt, pv.Iterations)
	if v.String() != pgSecretVerifier {
		t.Fatalf("NewSCRAMVerifier = %s, want %s", v, pgSecretVerifier)
	}
}

// exchange runs a full exchange between cli and srv.
func exchange(t testing.TB, cli *SCRAMClient, srv *SCRAMServer) error {
	t.Helper()
	sfirst, err := srv.HandleClientFirst(cli.Mechanism(), cli.ClientFirst())
	if err != nil {
		t.Fatalf("HandleClientFirst: %v", err)
	}
	cfinal, err := cli.HandleServerFirst(sfirst)
	if err != nil {
		return err
	}
	sfinal, err := srv.HandleClientFinal(cfinal)
	if err != nil {
		return err
	}
	return cli.HandleServerFinal(sfinal)
}

func TestSCRAMClientServer(t *testing.T) {
	v := NewSCRAMVerifier(testPassword, nil, 4096)
	tests := []struct {
		name     string
		password string
		wantErr  error
	}{
		{"correct password", testPassword, nil},
		{"wrong password", "Secret", ErrPasswordMismatch},
		{"empty password", "", ErrPasswordMismatch},
		{"non-ascii password", "sécret", ErrPasswordMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := NewSCRAMServer(v, nil)
			cli := NewSCRAMClient(tt.password, nil)
			err := exchange(t, cli, srv)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if (err == nil) != (srv.ClientKey() != nil) {
				t.Fatalf("ClientKey() = %x with err %v", srv.ClientKey(), err)
			}
			if err == nil && !cli.Done() {
				t.Fatal("client not done")
			}
		})
	}
}

// SASLprep makes equivalent spellings of a password interchangeable.
func TestSCRAMSASLprepInterop(t *testing.T) {
	v := NewSCRAMVerifier("pa\u00A0ss\u00AD", nil, 4096) // NBSP, soft hyphen
	srv := NewSCRAMServer(v, nil)
	if err := exchange(t, NewSCRAMClient("pa ss", nil), srv); err != nil {
		t.Fatal(err)
	}
}

func TestSCRAMPassThrough(t *testing.T) {
	v := NewSCRAMVerifier(testPassword, nil, 4096)
	stored, err := ParseSecret(v.String())
	if err != nil {
		t.Fatal(err)
	}
	sv, _ := stored.SCRAM()

	// 1. The client logs in to poolerd, which only has the verifier.
	front := NewSCRAMServer(sv, nil)
	if err := exchange(t, NewSCRAMClient(testPassword, nil), front); err != nil {
		t.Fatal(err)
	}
	clientKey := front.ClientKey()
	if len(clientKey) != 32 {
		t.Fatalf("ClientKey length %d", len(clientKey))
	}

	// 2. poolerd logs in to "PostgreSQL" (with the same verifier) using the keys.
	t.Run("same verifier", func(t *testing.T) {
		back := NewSCRAMServer(v, nil)
		cli := NewSCRAMClientFromKeys(sv, clientKey, nil)
		if err := exchange(t, cli, back); err != nil {
			t.Fatal(err)
		}
		if !cli.Done() {
			t.Fatal("client not done")
		}
	})

	// 3. The server's verifier has a different salt (same password).
	t.Run("different salt", func(t *testing.T) {
		back := NewSCRAMServer(NewSCRAMVerifier(testPassword, nil, 4096), nil)
		cli := NewSCRAMClientFromKeys(sv, clientKey, nil)
		err := exchange(t, cli, back)
		if !errors.Is(err, ErrStoredSCRAMMismatch) {
			t.Fatalf("err = %v, want ErrStoredSCRAMMismatch", err)
		}
		for _, want := range []string{"does not match the server's", "salt or iterations", "plain password", "pg_authid"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	})

	t.Run("different iterations", func(t *testing.T) {
		back := NewSCRAMServer(NewSCRAMVerifier(testPassword, sv.Salt, 4097), nil)
		err := exchange(t, NewSCRAMClientFromKeys(sv, clientKey, nil), back)
		if !errors.Is(err, ErrStoredSCRAMMismatch) {
			t.Fatalf("err = %v, want ErrStoredSCRAMMismatch", err)
		}
	})

	t.Run("key not matching verifier", func(t *testing.T) {
		bad := append([]byte(nil), clientKey...)
		bad[0] ^= 1
		err := exchange(t, NewSCRAMClientFromKeys(sv, bad, nil), NewSCRAMServer(v, nil))
		if err == nil || !strings.Contains(err.Error(), "client key does not belong") {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("short key", func(t *testing.T) {
		err := exchange(t, NewSCRAMClientFromKeys(sv, clientKey[:5], nil), NewSCRAMServer(v, nil))
		if err == nil {
			t.Fatal("short key accepted")
		}
	})
}

func TestSCRAMMockVerifier(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	a, b := NewSCRAMMockVerifier("nobody", key), NewSCRAMMockVerifier("nobody", key)
	if a.String() != b.String() {
		t.Fatal("mock verifier not deterministic")
	}
	if NewSCRAMMockVerifier("other", key).String() == a.String() {
		t.Fatal("mock verifier does not depend on the user")
	}
	if err := a.validate(); err != nil {
		t.Fatal(err)
	}
	for _, pw := range []string{"", "nobody", testPassword} {
		err := exchange(t, NewSCRAMClient(pw, nil), NewSCRAMServer(a, nil))
		if !errors.Is(err, ErrPasswordMismatch) {
			t.Fatalf("password %q: err = %v, want ErrPasswordMismatch", pw, err)
		}
	}
}

func TestSCRAMServerClientFirstErrors(t *testing.T) {
	tests := []struct {
		name      string
		mechanism string
		data      string
		want      string // substring of the error; "" means success
	}{
		{"ok n", testMechanism, "n,,n=,r=abc", ""},
		{"ok y", testMechanism, "y,,n=,r=abc", ""},
		{"ok user name ignored", testMechanism, "n,,n=someone,r=abc", ""},
		{"ok extension ignored", testMechanism, "n,,n=,r=abc,x=1", ""},
		{"wrong mechanism", "SCRAM-SHA-1", "n,,n=,r=abc", "unsupported SASL"},
		{"plus mechanism", "SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,n=,r=abc", "PLUS"},
		{"empty", testMechanism, "", "empty"},
		{"nul byte", testMechanism, "n,,n=,r=a\x00b", "NUL"},
		{"channel binding required", testMechanism, "p=tls-server-end-point,,n=,r=abc", "channel binding"},
		{"bad flag", testMechanism, "x,,n=,r=abc", "channel-binding flag"},
		{"flag too long", testMechanism, "nn,,n=,r=abc", "channel-binding flag"},
		{"no header", testMechanism, "n", "GS2 header"},
		{"one comma", testMechanism, "n,", "GS2 header"},
		{"authzid", testMechanism, "n,a=admin,n=,r=abc", "authorization identity"},
		{"junk authzid", testMechanism, "n,x,n=,r=abc", "GS2 header"},
		{"mandatory ext", testMechanism, "n,,m=ext,n=,r=abc", "extension"},
		{"missing nonce", testMechanism, "n,,n=", "\"r\" missing"},
		{"empty bare", testMechanism, "n,,", "not of the form"},
		{"nonce first", testMechanism, "n,,r=abc,n=", "expected attribute \"n\""},
		{"empty nonce", testMechanism, "n,,n=,r=", "nonce"},
		{"nonprintable nonce", testMechanism, "n,,n=,r=a b", "nonce"},
		{"high byte nonce", testMechanism, "n,,n=,r=a\xffb", "nonce"},
		{"trailing comma", testMechanism, "n,,n=,r=abc,", "not of the form"},
		{"bad extension", testMechanism, "n,,n=,r=abc,1=x", "not of the form"},
		{"no equals", testMechanism, "n,,n,r=abc", "not of the form"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := NewSCRAMServer(rfcVerifier(t), repeatReader(7))
			out, err := srv.HandleClientFirst(tt.mechanism, []byte(tt.data))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				if !strings.HasPrefix(string(out), "r=abc") {
					t.Fatalf("server-first = %q", out)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, got %q", out)
			}
			if !errors.Is(err, ErrProtocolViolation) {
				t.Errorf("error %v does not wrap ErrProtocolViolation", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			// The exchange is over after an error.
			if _, err := srv.HandleClientFinal([]byte("c=biws,r=abc,p=x")); err == nil {
				t.Error("HandleClientFinal succeeded after a failed client-first")
			}
		})
	}
}

func TestSCRAMServerClientFinalErrors(t *testing.T) {
	v := rfcVerifier(t)
	// Valid pieces for the RFC exchange.
	nonce := rfcClientNonce + rfcServerNonce
	proof := "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
	wrongProof := base64.StdEncoding.EncodeToString(make([]byte, 32))
	tests := []struct {
		name    string
		header  string // gs2 header used in client-first
		data    string
		want    string
		wantErr error
	}{
		{"ok", "n,,", "c=biws,r=" + nonce + ",p=" + proof, "", nil},
		{"wrong proof", "n,,", "c=biws,r=" + nonce + ",p=" + wrongProof, "", ErrPasswordMismatch},
		{"empty", "n,,", "", "empty", ErrProtocolViolation},
		{"nul", "n,,", "c=biws,r=" + nonce + ",p=" + proof + "\x00", "NUL", ErrProtocolViolation},
		{"cbind mismatch y vs n", "n,,", "c=eSws,r=" + nonce + ",p=" + proof, "channel-binding", ErrProtocolViolation},
		{"cbind mismatch n vs y", "y,,", "c=biws,r=" + nonce + ",p=" + proof, "channel-binding", ErrProtocolViolation},
		{"cbind garbage", "n,,", "c=xxxx,r=" + nonce + ",p=" + proof, "channel-binding", ErrProtocolViolation},
		{"missing cbind", "n,,", "r=" + nonce + ",p=" + proof, "expected attribute \"c\"", ErrProtocolViolation},
		{"wrong nonce", "n,,", "c=biws,r=" + rfcClientNonce + "X,p=" + proof, "nonce", ErrProtocolViolation},
		{"client nonce only", "n,,", "c=biws,r=" + rfcClientNonce + ",p=" + proof, "nonce", ErrProtocolViolation},
		{"nonce prefix", "n,,", "c=biws,r=" + nonce[:len(nonce)-1] + ",p=" + proof, "nonce", ErrProtocolViolation},
		{"missing proof", "n,,", "c=biws,r=" + nonce, "\"p\" missing", ErrProtocolViolation},
		{"extension before proof", "n,,", "c=biws,r=" + nonce + ",x=1,p=" + proof, "unsupported attribute", ErrProtocolViolation},
		{"garbage after proof", "n,,", "c=biws,r=" + nonce + ",p=" + proof + ",x=1", "garbage", ErrProtocolViolation},
		{"short proof", "n,,", "c=biws,r=" + nonce + ",p=AAAA", "malformed proof", ErrProtocolViolation},
		{"bad base64 proof", "n,,", "c=biws,r=" + nonce + ",p=!!!!", "malformed proof", ErrProtocolViolation},
		{"proof with newline", "n,,", "c=biws,r=" + nonce + ",p=" + proof[:20] + "\n" + proof[20:], "malformed proof", ErrProtocolViolation},
		{"trailing comma", "n,,", "c=biws,r=" + nonce + ",p=" + proof + ",", "not of the form", ErrProtocolViolation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := NewSCRAMServer(v, nil)
			srv.fixedServerNonce = rfcServerNonce
			if _, err := srv.HandleClientFirst(testMechanism, []byte(tt.header+"n=user,r="+rfcClientNonce)); err != nil {
				t.Fatal(err)
			}
			out, err := srv.HandleClientFinal([]byte(tt.data))
			if tt.wantErr == nil {
				if err != nil || string(out) != rfcServerFinal {
					t.Fatalf("HandleClientFinal = %q, %v", out, err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.want != "" && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if srv.ClientKey() != nil {
				t.Error("ClientKey set after failure")
			}
			if _, err := srv.HandleClientFinal([]byte(rfcClientFinal)); err == nil {
				t.Error("second HandleClientFinal succeeded after failure")
			}
		})
	}
}

func TestSCRAMServerOrder(t *testing.T) {
	srv := NewSCRAMServer(rfcVerifier(t), nil)
	if _, err := srv.HandleClientFinal([]byte(rfcClientFinal)); !errors.Is(err, ErrProtocolViolation) {
		t.Fatalf("final before first: %v", err)
	}
	if srv.ClientKey() != nil {
		t.Fatal("ClientKey before success")
	}

	srv = NewSCRAMServer(rfcVerifier(t), nil)
	if _, err := srv.HandleClientFirst(testMechanism, []byte(rfcClientFirst)); err != nil {
		t.Fatal(err)
	}
	if srv.ClientKey() != nil {
		t.Fatal("ClientKey before success")
	}
	if _, err := srv.HandleClientFirst(testMechanism, []byte(rfcClientFirst)); !errors.Is(err, ErrProtocolViolation) {
		t.Fatalf("second first: %v", err)
	}

	for _, bad := range []*SCRAMVerifier{nil, {}, {Iterations: 1, Salt: []byte{1}, StoredKey: make([]byte, 31), ServerKey: make([]byte, 32)}} {
		srv = NewSCRAMServer(bad, nil)
		if _, err := srv.HandleClientFirst(testMechanism, []byte(rfcClientFirst)); err == nil {
			t.Fatalf("unusable verifier %+v accepted", bad)
		}
	}
}

func TestSCRAMClientServerFirstErrors(t *testing.T) {
	cn := zeroNonce24
	tests := []struct {
		name string
		data string
		want string
	}{
		{"empty", "", "empty"},
		{"nul", "r=" + cn + "x,s=AAAA,i=1\x00", "NUL"},
		{"mandatory ext", "m=x,r=" + cn + "x,s=AAAA,i=1", "extension"},
		{"missing nonce", "s=AAAA,i=1", "expected attribute \"r\""},
		{"foreign nonce", "r=" + strings.Repeat("B", 24) + "x,s=AAAA,i=1", "client nonce"},
		{"no server part", "r=" + cn + ",s=AAAA,i=1", "client nonce"},
		{"short nonce", "r=AAA,s=AAAA,i=1", "client nonce"},
		{"nonprintable", "r=" + cn + "x\x7f,s=AAAA,i=1", "non-printable"},
		{"missing salt", "r=" + cn + "x,i=1", "expected attribute \"s\""},
		{"empty salt", "r=" + cn + "x,s=,i=1", "salt"},
		{"bad salt", "r=" + cn + "x,s=A,i=1", "salt"},
		{"missing iterations", "r=" + cn + "x,s=AAAA", "\"i\" missing"},
		{"zero iterations", "r=" + cn + "x,s=AAAA,i=0", "iteration"},
		{"negative iterations", "r=" + cn + "x,s=AAAA,i=-1", "iteration"},
		{"plus iterations", "r=" + cn + "x,s=AAAA,i=+1", "iteration"},
		{"huge iterations", "r=" + cn + "x,s=AAAA,i=10000001", "iteration"},
		{"overflow iterations", "r=" + cn + "x,s=AAAA,i=99999999999999999999999", "iteration"},
		{"garbage", "r=" + cn + "x,s=AAAA,i=1,x=y", "garbage"},
		{"not attrs", "hello", "not of the form"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cli := NewSCRAMClient("pw", repeatReader(0))
			cli.ClientFirst()
			_, err := cli.HandleServerFirst([]byte(tt.data))
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("err = %v, want ErrProtocolViolation", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if err := cli.HandleServerFinal([]byte("v=x")); err == nil {
				t.Error("HandleServerFinal succeeded after failure")
			}
		})
	}
}

func TestSCRAMClientServerFinal(t *testing.T) {
	setup := func(t *testing.T) *SCRAMClient {
		cli := NewSCRAMClient(rfcPassword, nil)
		cli.fixedNonce = rfcClientNonce
		cli.username = "user"
		cli.ClientFirst()
		if _, err := cli.HandleServerFirst([]byte(rfcServerFirst)); err != nil {
			t.Fatal(err)
		}
		return cli
	}
	badSig := "v=" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	tests := []struct {
		name    string
		data    string
		wantErr error
		want    string
	}{
		{"ok", rfcServerFinal, nil, ""},
		{"wrong signature", badSig, ErrServerSignatureMismatch, ""},
		{"server error", "e=invalid-proof", ErrServerRejected, `"invalid-proof"`},
		{"empty", "", ErrProtocolViolation, "empty"},
		{"short signature", "v=AAAA", ErrProtocolViolation, "signature"},
		{"bad base64", "v=!!", ErrProtocolViolation, "signature"},
		{"garbage", rfcServerFinal + ",x=1", ErrProtocolViolation, "garbage"},
		{"wrong attr", "x=1", ErrProtocolViolation, "expected attribute \"v\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cli := setup(t)
			err := cli.HandleServerFinal([]byte(tt.data))
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if cli.Done() != (err == nil) {
				t.Errorf("Done() = %v with err %v", cli.Done(), err)
			}
		})
	}
}

func TestSCRAMClientOrder(t *testing.T) {
	cli := NewSCRAMClient("pw", nil)
	if _, err := cli.HandleServerFirst([]byte(rfcServerFirst)); err == nil {
		t.Fatal("HandleServerFirst before ClientFirst succeeded")
	}
	cli = NewSCRAMClient("pw", nil)
	if err := cli.HandleServerFinal([]byte(rfcServerFinal)); err == nil {
		t.Fatal("HandleServerFinal before HandleServerFirst succeeded")
	}
}

// The client-final's proof must be computed over the server-first exactly
// as received; check AuthMessage construction independently.
func TestSCRAMClientProofIndependent(t *testing.T) {
	salt := mustB64(t, rfcSaltB64)
	salted, err := saltedPassword(rfcPassword, salt, rfcIterations)
	if err != nil {
		t.Fatal(err)
	}
	mac := func(key []byte, msg string) []byte {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(msg))
		return m.Sum(nil)
	}
	clientKey := mac(salted, "Client Key")
	stored := sha256.Sum256(clientKey)
	authMessage := "n=user,r=" + rfcClientNonce + "," + rfcServerFirst + ",c=biws,r=" + rfcClientNonce + rfcServerNonce
	sig := mac(stored[:], authMessage)
	proof := make([]byte, 32)
	for i := range proof {
		proof[i] = clientKey[i] ^ sig[i]
	}
	if got := base64.StdEncoding.EncodeToString(proof); "c=biws,r="+rfcClientNonce+rfcServerNonce+",p="+got != rfcClientFinal {
		t.Fatalf("independent proof %s does not match RFC", got)
	}
}

func TestSCRAMTypesDoNotLeak(t *testing.T) {
	cli := NewSCRAMClient("hunter2-password", nil)
	srv := NewSCRAMServer(rfcVerifier(t), nil)
	type holder struct {
		c *SCRAMClient
		s *SCRAMServer
	}
	keysCli := NewSCRAMClientFromKeys(rfcVerifier(t), []byte("hunter2-client-key"), nil)
	for _, s := range []string{sprintAll(cli), sprintAll(srv), sprintAll(holder{cli, srv}), sprintAll(&holder{keysCli, srv}), sprintAll(keysCli)} {
		if strings.Contains(s, "hunter2") || strings.Contains(s, rfcSaltB64) {
			t.Fatalf("leak: %s", s)
		}
	}
}
