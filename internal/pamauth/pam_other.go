//go:build !cgo || !linux

package pamauth

import "errors"

// Lib is the loaded PAM library; this build has none.
type Lib struct{}

// Open says why this build cannot use PAM.
func Open() (*Lib, error) {
	return nil, errors.New("PAM is not available: this poolerd was built without cgo (CGO_ENABLED=0, as the container image is) or not for Linux; build it with cgo to use auth_type pam")
}

// Close does nothing.
func (l *Lib) Close() {}

// Authenticate is never reached: Open fails.
func (l *Lib) Authenticate(service, user, password, rhost string) error {
	return errors.New("PAM is not available in this build")
}
