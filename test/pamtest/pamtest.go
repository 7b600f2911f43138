// Package pamtest writes throwaway PAM services for tests.
package pamtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Service writes a PAM service whose password check is a script (pam_exec
// with expose_authtok) accepting one user and password, and returns its
// name; it is removed when t ends. PAM reads services from /etc/pam.d
// only, so Service needs root: without it, it skips t (CI runs as root).
func Service(t testing.TB, user, password string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("writing a PAM service in /etc/pam.d needs root")
	}
	if _, err := os.Stat("/etc/pam.d"); err != nil {
		t.Skip("no /etc/pam.d")
	}
	script := filepath.Join(t.TempDir(), "check.sh")
	body := fmt.Sprintf("#!/bin/sh\npw=$(tr -d '\\000')\n[ \"$PAM_USER\" = %q ] && [ \"$pw\" = %q ]\n", user, password)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	// One service per test (and process): its name from the test's.
	// (Linux-PAM looks the service up in lower case.)
	name := fmt.Sprintf("poolerd-test-%d-%s", os.Getpid(), strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '_'
	}, strings.ToLower(t.Name())))
	file := filepath.Join("/etc/pam.d", name)
	conf := fmt.Sprintf("auth required pam_exec.so expose_authtok quiet %s\naccount required pam_permit.so\n", script)
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(file) })
	return name
}
