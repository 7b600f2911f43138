package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// poolerd convert prints the YAML of a pgbouncer.ini, lists what it does
// not honour, and says when the result would not start.
func TestConvertCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"convert", "../../internal/pgbini/testdata/debian-pgbouncer.ini"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"listen: localhost:6432\n", "pool_mode: session\n", "pidfile: /var/run/postgresql/pgbouncer.pid\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(errOut.String(), "settings poolerd does not honour") {
		t.Errorf("stderr: %s", errOut.String())
	}
	// Valid as it stands where its auth_file exists (the pgbouncer package
	// installs it): it starts, and convert says what it lacks.
	if _, err := os.Stat("/etc/pgbouncer/userlist.txt"); err == nil &&
		(strings.Contains(errOut.String(), "not valid") || !strings.Contains(errOut.String(), "it starts, but: no databases")) {
		t.Errorf("stderr: %s", errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"convert"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "Usage: poolerd convert") {
		t.Errorf("convert without a file: exit %d, %s", code, errOut.String())
	}
	if code := run([]string{"convert", "/nonexistent.ini"}, &out, &errOut); code != 1 {
		t.Errorf("convert of a missing file: exit %d", code)
	}
}
