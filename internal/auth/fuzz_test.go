package auth

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// fuzzVerifier is cheap to build once; the server never runs PBKDF2.
var fuzzVerifier = NewSCRAMVerifier(rfcPassword, []byte("W22ZaJ0SNY7soEsU"), 4096)

func FuzzSCRAMServerClientFirst(f *testing.F) {
	seeds := []struct {
		mech string
		data string
	}{
		{testMechanism, rfcClientFirst},
		{testMechanism, "n,,n=,r=" + zeroNonce24},
		{testMechanism, "y,,n=,r=abc"},
		{testMechanism, "p=tls-server-end-point,,n=,r=abc"},
		{testMechanism, "n,a=admin,n=,r=abc"},
		{testMechanism, "n,,m=x,n=,r=abc"},
		{testMechanism, "n,,n=,r=abc,x=ext"},
		{testMechanism, "n,,n=,r="},
		{testMechanism, "n,,"},
		{testMechanism, ",,,,"},
		{testMechanism, "n,,n=\x00,r=abc"},
		{"SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,n=,r=abc"},
		{"", ""},
	}
	for _, s := range seeds {
		f.Add(s.mech, []byte(s.data))
	}
	f.Fuzz(func(t *testing.T, mech string, data []byte) {
		srv := NewSCRAMServer(fuzzVerifier, repeatReader(3))
		out, err := srv.HandleClientFirst(mech, data)
		if err != nil {
			if out != nil {
				t.Fatalf("output %q with error %v", out, err)
			}
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("error does not wrap ErrProtocolViolation: %v", err)
			}
			return
		}
		if mech != testMechanism || !strings.HasPrefix(string(out), "r=") || !strings.HasSuffix(string(out), ",i=4096") {
			t.Fatalf("unexpected success: mech %q, out %q", mech, out)
		}
		// The server nonce must extend the client's.
		if !bytes.Contains(out, []byte(srv.clientNonce+srv.serverNonce)) {
			t.Fatalf("server-first %q lacks the combined nonce", out)
		}
	})
}

func FuzzSCRAMServerClientFinal(f *testing.F) {
	nonce := rfcClientNonce + rfcServerNonce
	seeds := []string{
		rfcClientFinal,
		"c=biws,r=" + nonce + ",p=AAAA",
		"c=eSws,r=" + nonce + ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
		"c=biws,r=" + nonce + ",x=1,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
		"c=biws,r=" + nonce + ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=,",
		"c=biws,r=" + nonce,
		"c=biws",
		"p=",
		",",
		"",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		srv := NewSCRAMServer(fuzzVerifier, nil)
		srv.fixedServerNonce = rfcServerNonce
		if _, err := srv.HandleClientFirst(testMechanism, []byte(rfcClientFirst)); err != nil {
			t.Fatal(err)
		}
		out, err := srv.HandleClientFinal(data)
		if err != nil {
			if out != nil || srv.ClientKey() != nil {
				t.Fatalf("output %q / client key with error %v", out, err)
			}
			if !errors.Is(err, ErrProtocolViolation) && !errors.Is(err, ErrPasswordMismatch) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		// Only the one correct message can succeed.
		if string(data) != rfcClientFinal || string(out) != rfcServerFinal {
			t.Fatalf("accepted %q -> %q", data, out)
		}
	})
}

func FuzzParseSecret(f *testing.F) {
	for _, s := range []string{
		"", "secret", "md539c4422cad2e8aa743c2904bf0925538", "md539C4422CAD2E8AA743C2904BF0925538",
		pgSecretVerifier, "SCRAM-SHA-256$", "SCRAM-SHA-256$1:$:", "SCRAM-SHA-256$4096:AAAA$AAAA:AAAA",
		"SCRAM-SHA-256$99999999999999999999:AAAA$AAAA:AAAA", "SCRAM-SHA-256$4096:A\nAAA$AAAA:AAAA",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSecret(in)
		if err != nil {
			if s.Kind() != 0 || !errors.Is(err, ErrInvalidSecret) {
				t.Fatalf("bad error result: kind %v, %v", s.Kind(), err)
			}
			if len(in) >= 16 && strings.Contains(err.Error(), in) {
				t.Fatalf("error %q contains the input", err)
			}
			return
		}
		// Formatting must not depend on the secret at all.
		ref := map[SecretKind]string{SecretPlain: "x", SecretMD5: MD5Hash("u", "x"), SecretSCRAM: pgSecretVerifier}[s.Kind()]
		refSecret, _ := ParseSecret(ref)
		if got, want := sprintAll(s), sprintAll(refSecret); got != want {
			t.Fatalf("formatted secret %q differs from %q", got, want)
		}
		switch s.Kind() {
		case SecretPlain:
			if p, ok := s.Plain(); !ok || p != in {
				t.Fatalf("Plain() = %q, %v", p, ok)
			}
		case SecretMD5:
			if h, ok := s.MD5("u"); !ok || h != in {
				t.Fatalf("MD5() = %q, %v", h, ok)
			}
		case SecretSCRAM:
			v, ok := s.SCRAM()
			if !ok {
				t.Fatal("SCRAM() not ok")
			}
			// Re-encoding may canonicalize (e.g. leading zeros, base64
			// padding bits), but must parse to the same verifier.
			s2, err := ParseSecret(v.String())
			if err != nil {
				t.Fatalf("re-parse of %q: %v", v.String(), err)
			}
			v2, _ := s2.SCRAM()
			if v2.String() != v.String() {
				t.Fatalf("round trip %q != %q", v2.String(), v.String())
			}
		default:
			t.Fatalf("kind %v", s.Kind())
		}
	})
}

func FuzzParseUserlist(f *testing.F) {
	for _, s := range []string{
		"", `"bob" "secret"`, "\"a\"\"b\" \"p\"\"w\"\n; c\n# c\n\n\"c\" \"\"\r\n",
		`"bob"`, `"bob" x`, `"bob" "x`, `"bob" "x" "y" z`, "\"a\" \"1\"\n\"a\" \"2\"",
		"\"a\" \"" + pgSecretVerifier + "\"", "\"a\" \"SCRAM-SHA-256$1:\"", "\uFEFF\"a\" \"b\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseUserlist(bytes.NewReader(data))
		if err != nil {
			var ue *UserlistError
			if !errors.As(err, &ue) || ue.Line < 1 {
				t.Fatalf("error %v lacks a line number", err)
			}
			return
		}
		seen := map[string]bool{}
		prev := 0
		for _, e := range entries {
			if e.Name == "" || seen[e.Name] || e.Line <= prev {
				t.Fatalf("bad entry %+v", e)
			}
			seen[e.Name] = true
			prev = e.Line
		}
	})
}
