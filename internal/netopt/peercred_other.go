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

// PeerUID is the peer's user id; poolerd reads it on Linux only.
func PeerUID(net.Conn) (uint32, error) {
	return 0, errors.New("peer credentials need Linux (SO_PEERCRED)")
}
