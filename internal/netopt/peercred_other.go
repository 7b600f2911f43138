//go:build !linux

package netopt

import (
	"errors"
	"net"
)

// PeerUser is the operating-system user of the process at the other end of
// a Unix-socket connection; poolerd reads it (SO_PEERCRED) on Linux only.
func PeerUser(net.Conn) (string, error) {
	return "", errors.New("peer authentication needs Linux (SO_PEERCRED)")
}
