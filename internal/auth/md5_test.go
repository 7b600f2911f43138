package auth

import (
	"crypto/md5"
	"encoding/hex"
	"testing"
)

func TestMD5Hash(t *testing.T) {
	// Computed independently: "md5" + hex(md5(password + user)).
	sum := md5.Sum([]byte("secret" + "md5_user"))
	want := "md5" + hex.EncodeToString(sum[:])
	if got := MD5Hash("md5_user", "secret"); got != want {
		t.Fatalf("MD5Hash = %q, want %q", got, want)
	}
	// What PostgreSQL 15 stored for ALTER ROLE md5_user PASSWORD 'secret'
	// with password_encryption = md5.
	if want != "md539c4422cad2e8aa743c2904bf0925538" {
		t.Fatalf("independent hash %q differs from PostgreSQL's", want)
	}
	if got := MD5Hash("", ""); got != "md5d41d8cd98f00b204e9800998ecf8427e" {
		t.Fatalf("MD5Hash empty = %q", got)
	}
}

func TestMD5Response(t *testing.T) {
	hash := "md539c4422cad2e8aa743c2904bf0925538"
	tests := []struct {
		hash string
		salt [4]byte
	}{
		{hash, [4]byte{0x01, 0x02, 0x03, 0x04}},
		{hash, [4]byte{}},
		{hash, [4]byte{0xff, 0x00, 0x80, 0x7f}},
		{MD5Hash("postgres", "postgres"), [4]byte{'a', 'b', 'c', 'd'}},
	}
	for _, tt := range tests {
		sum := md5.Sum(append([]byte(tt.hash[3:]), tt.salt[:]...))
		want := "md5" + hex.EncodeToString(sum[:])
		if got := MD5Response(tt.hash, tt.salt); got != want {
			t.Errorf("MD5Response(%q, %x) = %q, want %q", tt.hash, tt.salt, got, want)
		}
	}
	// Known answers computed independently (Python hashlib).
	known := []struct {
		hash string
		salt [4]byte
		want string
	}{
		{hash, [4]byte{0x01, 0x02, 0x03, 0x04}, "md530d9d09f02a72e0bbede8eccf68ddabc"},
		{hash, [4]byte{0xde, 0xad, 0xbe, 0xef}, "md5766f569539680f780cc8d29aedc12c0a"},
		{"md53175bce1d3201d16594cebf9d7eb3f9d", [4]byte{'a', 'b', 'c', 'd'}, "md50800ba833a175e428fc0110c29998942"},
	}
	for _, k := range known {
		if got := MD5Response(k.hash, k.salt); got != k.want {
			t.Errorf("MD5Response(%q, %x) = %q, want %q", k.hash, k.salt, got, k.want)
		}
	}
	if got := MD5Hash("postgres", "postgres"); got != "md53175bce1d3201d16594cebf9d7eb3f9d" {
		t.Errorf("MD5Hash(postgres, postgres) = %q", got)
	}
	// Without the md5 prefix the hash is used as is; short input does not panic.
	if MD5Response(hash[3:], [4]byte{1, 2, 3, 4}) != MD5Response(hash, [4]byte{1, 2, 3, 4}) {
		t.Error("prefix-less hash gives a different response")
	}
	_ = MD5Response("", [4]byte{})
	_ = MD5Response("m", [4]byte{})
}

func TestVerifyMD5(t *testing.T) {
	salt := [4]byte{0xde, 0xad, 0xbe, 0xef}
	plain, _ := ParseSecret("secret")
	hashed, _ := ParseSecret(MD5Hash("md5_user", "secret"))
	scram, _ := ParseSecret(NewSCRAMVerifier("secret", nil, 0).String())
	good := MD5Response(MD5Hash("md5_user", "secret"), salt)

	tests := []struct {
		name     string
		s        Secret
		user     string
		salt     [4]byte
		response string
		want     bool
	}{
		{"plain ok", plain, "md5_user", salt, good, true},
		{"md5 ok", hashed, "md5_user", salt, good, true},
		{"plain wrong user", plain, "other", salt, good, false},
		{"plain wrong salt", plain, "md5_user", [4]byte{}, good, false},
		{"md5 wrong salt", hashed, "md5_user", [4]byte{}, good, false},
		{"wrong password", plain, "md5_user", salt, MD5Response(MD5Hash("md5_user", "Secret"), salt), false},
		{"truncated response", hashed, "md5_user", salt, good[:len(good)-1], false},
		{"uppercase response", hashed, "md5_user", salt, "MD5" + good[3:], false},
		{"empty response", hashed, "md5_user", salt, "", false},
		{"hash instead of response", hashed, "md5_user", salt, MD5Hash("md5_user", "secret"), false},
		{"scram secret", scram, "md5_user", salt, good, false},
		{"zero secret", Secret{}, "md5_user", salt, good, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := VerifyMD5(tt.s, tt.user, tt.salt, tt.response); got != tt.want {
				t.Fatalf("VerifyMD5 = %v, want %v", got, tt.want)
			}
		})
	}
}
