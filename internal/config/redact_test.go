package config

import (
	"strings"
	"testing"
)

func TestRedactHidesPasswords(t *testing.T) {
	for _, c := range []struct{ key, in, secret string }{
		{"redis_url", "redis://:s3cret@redis:6379/0", "s3cret"},
		{"redis_url", "redis://user:s3cret@redis:6379/0", "s3cret"},
		{"upstream", "postgres://app:s3cret@db:5432/app", "s3cret"},
		{"auth_ldap_options", `ldapserver=h ldapbasedn="dc=x" ldapbinddn="cn=a" ldapbindpasswd=s3cret`, "s3cret"},
		{"auth_ldap_options", `ldapserver=h ldapbindpasswd="s3 ""cret" ldapbasedn="dc=x"`, "cret"},
	} {
		got := Redact(c.key, c.in)
		if strings.Contains(got, c.secret) {
			t.Errorf("Redact(%s) = %q shows the password", c.key, got)
		}
		if got == "" {
			t.Errorf("Redact(%s) is empty", c.key)
		}
	}
	if got := Redact("listen", "127.0.0.1:1"); got != "127.0.0.1:1" {
		t.Errorf("Redact(listen) = %q", got)
	}
	c := Defaults()
	c.RedisURL = "redis://:s3cret@redis:6379/0"
	if v := FormatValue(&c, "redis_url"); strings.Contains(v, "s3cret") {
		t.Errorf("FormatValue(redis_url) = %q", v)
	}
}
