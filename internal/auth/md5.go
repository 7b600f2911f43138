package auth

import (
	"crypto/md5"
	"crypto/subtle"
	"encoding/hex"
	"strings"
)

// md5SecretLen is the length of "md5" + 32 hex digits (PostgreSQL's
// MD5_PASSWD_LEN).
const md5SecretLen = 35

// MD5Hash returns the md5 secret PostgreSQL stores for user and password:
// "md5" + hex(md5(password + user)).
func MD5Hash(user, password string) string {
	h := md5.New()
	_, _ = h.Write([]byte(password))
	_, _ = h.Write([]byte(user))
	return "md5" + hex.EncodeToString(h.Sum(nil))
}

// MD5Response returns what a client sends in its PasswordMessage for the
// md5 method, given the md5 secret (as returned by [MD5Hash]) and the 4-byte
// salt from AuthenticationMD5Password: "md5" + hex(md5(md5hash[3:] + salt)).
// A md5hash without the "md5" prefix is used as is.
func MD5Response(md5hash string, salt [4]byte) string {
	h := md5.New()
	_, _ = h.Write([]byte(strings.TrimPrefix(md5hash, "md5")))
	_, _ = h.Write(salt[:])
	return "md5" + hex.EncodeToString(h.Sum(nil))
}

// VerifyMD5 reports whether response is the correct md5 password response
// of user for salt. It works with plain and md5 secrets and is always false
// for SCRAM secrets (an md5 response cannot be checked against a SCRAM
// verifier) and for the zero Secret. The comparison is constant-time.
func VerifyMD5(s Secret, user string, salt [4]byte, response string) bool {
	hash, ok := s.MD5(user)
	if !ok {
		return false
	}
	want := MD5Response(hash, salt)
	return subtle.ConstantTimeCompare([]byte(want), []byte(response)) == 1
}
