package auth

import "testing"

func TestVerifyPassword(t *testing.T) {
	v := NewSCRAMVerifier("pencil", nil, 4096)
	scram, _ := SecretFromSCRAMVerifier(v)
	plain, _ := ParseSecret("pencil")
	md5, _ := ParseSecret(MD5Hash("alice", "pencil"))
	for name, s := range map[string]Secret{"plain": plain, "md5": md5, "scram": scram} {
		if ok, _ := VerifyPassword(s, "alice", "pencil"); !ok {
			t.Errorf("%s: the right password refused", name)
		}
		if ok, _ := VerifyPassword(s, "alice", "pen"); ok {
			t.Errorf("%s: a wrong password accepted", name)
		}
	}
	if ok, ck := VerifyPassword(scram, "alice", "pencil"); !ok || len(ck) != 32 {
		t.Errorf("no ClientKey from a SCRAM secret")
	}
	if ok, _ := VerifyPassword(Secret{}, "alice", ""); ok {
		t.Error("the zero Secret accepted a password")
	}
}
