// Package pamauth checks a user's password with the system's PAM library
// (auth_type pam, and pam lines of auth_hba_file): pam_authenticate and
// pam_acct_mgmt of a service (PgBouncer's "pgbouncer" by default), the
// password given to every prompt of the service's modules. libpam is
// loaded when first needed (dlopen of libpam.so.0), so poolerd builds
// without PAM's headers and runs where PAM is not installed until PAM is
// asked for; a poolerd built without cgo cannot use PAM and Open says so.
package pamauth

import "errors"

// Available reports why PAM cannot be used here, or nil if it can: it
// loads the library and lets it go again.
func Available() error {
	l, err := Open()
	if err != nil {
		return err
	}
	l.Close()
	return nil
}

// ErrFailed is a password PAM did not accept (or a user it does not know,
// or an account it refused).
var ErrFailed = errors.New("PAM authentication failed")
