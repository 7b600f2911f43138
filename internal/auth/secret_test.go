package auth

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// sprintAll formats v with every common verb and flag.
func sprintAll(v any) string {
	return fmt.Sprintf("%v %+v %#v %s %q %x %X %d %10.3v %T", v, v, v, v, v, v, v, v, v, v)
}

func TestParseSecret(t *testing.T) {
	validSCRAM := NewSCRAMVerifier("pw", []byte("0123456789abcdef"), 4096).String()
	_, keys, _ := strings.Cut(strings.TrimPrefix(validSCRAM, scramSecretPrefix), "$")
	stored, server, _ := strings.Cut(keys, ":")
	tests := []struct {
		name    string
		in      string
		kind    SecretKind
		wantErr string
	}{
		{"empty", "", 0, "empty"},
		{"plain", "secret", SecretPlain, ""},
		{"plain with spaces", " pass word ", SecretPlain, ""},
		{"md5", "md539c4422cad2e8aa743c2904bf0925538", SecretMD5, ""},
		{"md5 uppercase is plain", "md539C4422CAD2E8AA743C2904BF0925538", SecretPlain, ""},
		{"md5 too short is plain", "md539c4422cad2e8aa743c2904bf092553", SecretPlain, ""},
		{"md5 too long is plain", "md539c4422cad2e8aa743c2904bf09255380", SecretPlain, ""},
		{"md5 non-hex is plain", "md539c4422cad2e8aa743c2904bf092553g", SecretPlain, ""},
		{"scram", validSCRAM, SecretSCRAM, ""},
		{"scram lowercase prefix is plain", strings.ToLower(validSCRAM[:13]) + validSCRAM[13:], SecretPlain, ""},
		{"scram sha1 is plain", "SCRAM-SHA-1$4096:AAAA$AAAA:AAAA", SecretPlain, ""},
		{"scram no dollar", "SCRAM-SHA-256$4096:MDEy", 0, `missing "$"`},
		{"scram no colon params", "SCRAM-SHA-256$4096$" + keys, 0, `iteration count and the salt`},
		{"scram no colon keys", "SCRAM-SHA-256$4096:MDEy$" + stored, 0, `stored key and the server key`},
		{"scram zero iter", "SCRAM-SHA-256$0:MDEy$" + keys, 0, "iteration count"},
		{"scram negative iter", "SCRAM-SHA-256$-1:MDEy$" + keys, 0, "iteration count"},
		{"scram huge iter", "SCRAM-SHA-256$2147483648:MDEy$" + keys, 0, "iteration count"},
		{"scram empty iter", "SCRAM-SHA-256$:MDEy$" + keys, 0, "iteration count"},
		{"scram bad salt", "SCRAM-SHA-256$4096:M$" + keys, 0, "salt is not valid base64"},
		{"scram empty salt", "SCRAM-SHA-256$4096:$" + keys, 0, "salt is empty"},
		{"scram bad stored", "SCRAM-SHA-256$4096:MDEy$!!!!:" + server, 0, "stored key is not valid base64"},
		{"scram short stored", "SCRAM-SHA-256$4096:MDEy$MDEy:" + server, 0, "stored key is 3 bytes"},
		{"scram bad server", "SCRAM-SHA-256$4096:MDEy$" + stored + ":x", 0, "server key is not valid base64"},
		{"scram short server", "SCRAM-SHA-256$4096:MDEy$" + stored + ":MDEy", 0, "server key is 3 bytes"},
		{"scram extra field", validSCRAM + ":AAAA", 0, "server key is not valid base64"},
		{"scram newline in salt", "SCRAM-SHA-256$4096:MD\nEy$" + keys, 0, "salt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseSecret(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("no error; kind %v", s.Kind())
				}
				if !errors.Is(err, ErrInvalidSecret) {
					t.Errorf("error %v does not wrap ErrInvalidSecret", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				if tt.in != "" && len(tt.in) > 8 && strings.Contains(err.Error(), tt.in[len(scramSecretPrefix):]) {
					t.Errorf("error %q contains the secret", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind() != tt.kind {
				t.Fatalf("Kind = %v, want %v", s.Kind(), tt.kind)
			}
		})
	}
}

func TestSecretAccessors(t *testing.T) {
	plain, _ := ParseSecret("secret")
	md5s, _ := ParseSecret("md539c4422cad2e8aa743c2904bf0925538")
	v := NewSCRAMVerifier("secret", nil, 0)
	scram, _ := ParseSecret(v.String())
	var zero Secret

	if p, ok := plain.Plain(); !ok || p != "secret" {
		t.Errorf("plain.Plain() = %q, %v", p, ok)
	}
	for _, s := range []Secret{md5s, scram, zero} {
		if _, ok := s.Plain(); ok {
			t.Errorf("%v.Plain() ok", s)
		}
	}
	if h, ok := plain.MD5("md5_user"); !ok || h != "md539c4422cad2e8aa743c2904bf0925538" {
		t.Errorf("plain.MD5 = %q, %v", h, ok)
	}
	if h, ok := md5s.MD5("ignored"); !ok || h != "md539c4422cad2e8aa743c2904bf0925538" {
		t.Errorf("md5.MD5 = %q, %v", h, ok)
	}
	for _, s := range []Secret{scram, zero} {
		if _, ok := s.MD5("u"); ok {
			t.Errorf("%v.MD5() ok", s)
		}
	}
	if got, ok := scram.SCRAM(); !ok || got.String() != v.String() {
		t.Errorf("scram.SCRAM() = %v, %v", got, ok)
	}
	for _, s := range []Secret{plain, md5s, zero} {
		if _, ok := s.SCRAM(); ok {
			t.Errorf("%v.SCRAM() ok", s)
		}
	}
	if zero.Kind() != 0 || zero.String() != "no secret" {
		t.Errorf("zero secret: kind %v, %q", zero.Kind(), zero.String())
	}

	fromV, ok := SecretFromSCRAMVerifier(v)
	if !ok || fromV.Kind() != SecretSCRAM {
		t.Fatal("SecretFromSCRAMVerifier failed")
	}
	if _, ok := SecretFromSCRAMVerifier(&SCRAMVerifier{}); ok {
		t.Fatal("SecretFromSCRAMVerifier accepted an empty verifier")
	}
	if _, ok := SecretFromSCRAMVerifier(nil); ok {
		t.Fatal("SecretFromSCRAMVerifier accepted nil")
	}
}

func TestSecretKindString(t *testing.T) {
	for k, want := range map[SecretKind]string{SecretPlain: "plain", SecretMD5: "md5", SecretSCRAM: "SCRAM-SHA-256", 9: "SecretKind(9)"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(k), k.String(), want)
		}
	}
}

func TestSecretNeverPrinted(t *testing.T) {
	const password = "hunter2-very-secret"
	v := NewSCRAMVerifier(password, nil, 0)
	md5hash := MD5Hash("bob", password)
	tests := []struct {
		in       string
		forbid   []string
		wantDesc string
	}{
		{password, []string{password, "hunter2"}, "plain secret"},
		{md5hash, []string{md5hash, md5hash[3:20]}, "md5 secret"},
		{v.String(), []string{v.String(), v.String()[20:40]}, "SCRAM-SHA-256 secret"},
	}
	for _, tt := range tests {
		s, err := ParseSecret(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		type holder struct {
			Exported   Secret
			unexported Secret
			ptr        *Secret
		}
		h := holder{s, s, &s}
		outputs := []string{
			sprintAll(s), sprintAll(&s), sprintAll(h), sprintAll(&h), sprintAll([]Secret{s}),
			sprintAll(map[string]Secret{"k": s}), sprintAll(UserlistEntry{Name: "bob", Secret: s}),
			fmt.Sprint(s), fmt.Sprintln(s), s.String(), s.GoString(),
		}
		for _, out := range outputs {
			for _, f := range tt.forbid {
				if strings.Contains(out, f) {
					t.Fatalf("formatted output leaks the secret: %s", out)
				}
			}
		}
		if got := fmt.Sprintf("%v|%+v|%s", s, s, s); got != tt.wantDesc+"|"+tt.wantDesc+"|"+tt.wantDesc {
			t.Errorf("formatted = %q", got)
		}
		if got := fmt.Sprintf("%#v", s); got != "auth.Secret("+tt.wantDesc+")" {
			t.Errorf("%%#v = %q", got)
		}
	}
}

func TestSecretEqual(t *testing.T) {
	a, _ := ParseSecret("secret")
	b, _ := ParseSecret("secret")
	c, _ := ParseSecret("other")
	m, _ := ParseSecret(MD5Hash("u", "secret"))
	if !a.Equal(b) || a.Equal(c) || a.Equal(m) || a.Equal(Secret{}) || !(Secret{}).Equal(Secret{}) {
		t.Fatal("Equal")
	}
}
