//go:build cgo && linux

package pamauth

import (
	"errors"
	"testing"

	"github.com/poolerd/poolerd/test/pamtest"
)

func TestAuthenticate(t *testing.T) {
	service := pamtest.Service(t, "alice", "alice-pw")
	lib, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Authenticate(service, "alice", "alice-pw", "127.0.0.1"); err != nil {
		t.Fatalf("the right password: %v", err)
	}
	for _, tc := range []struct{ user, pw string }{{"alice", "wrong"}, {"bob", "alice-pw"}, {"alice", ""}} {
		if err := lib.Authenticate(service, tc.user, tc.pw, ""); !errors.Is(err, ErrFailed) {
			t.Errorf("%s with %q: %v, want ErrFailed", tc.user, tc.pw, err)
		}
	}
	// A service PAM does not know falls back to its "other" service,
	// which refuses on Debian.
	if err := lib.Authenticate("poolerd-no-such-service", "alice", "alice-pw", ""); err == nil {
		t.Error("an unknown service accepted the password")
	}
}
