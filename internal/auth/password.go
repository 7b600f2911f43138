package auth

import (
	"crypto/sha256"
	"crypto/subtle"
)

// VerifyPassword checks a cleartext password (the "password" method)
// against s, whatever its kind; the comparison is constant-time. For a
// SCRAM secret it also returns the ClientKey the password gives, with which
// poolerd can log in to PostgreSQL by SCRAM pass-through.
func VerifyPassword(s Secret, user, password string) (ok bool, clientKey []byte) {
	switch s.Kind() {
	case SecretPlain:
		pw, _ := s.Plain()
		return subtle.ConstantTimeCompare([]byte(pw), []byte(password)) == 1, nil
	case SecretMD5:
		hash, _ := s.MD5(user)
		return subtle.ConstantTimeCompare([]byte(hash), []byte(MD5Hash(user, password))) == 1, nil
	case SecretSCRAM:
		v, _ := s.SCRAM()
		salted, err := saltedPassword(SASLprep(password), v.Salt, v.Iterations)
		if err != nil {
			return false, nil
		}
		ck := hmacSHA256(salted, "Client Key")
		stored := sha256.Sum256(ck)
		if subtle.ConstantTimeCompare(stored[:], v.StoredKey) != 1 {
			return false, nil
		}
		return true, ck
	}
	return false, nil
}
