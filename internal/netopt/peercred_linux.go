package netopt

import (
	"fmt"
	"net"
	"os/user"
	"strconv"

	"golang.org/x/sys/unix"
)

// PeerUser is the operating-system user of the process at the other end of
// a Unix-socket connection (SO_PEERCRED), for peer authentication.
func PeerUser(c net.Conn) (string, error) {
	uid, err := PeerUID(c)
	if err != nil {
		return "", err
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return "", fmt.Errorf("uid %d: %w", uid, err)
	}
	return u.Username, nil
}

// PeerUID is the user id of the process at the other end of a Unix-socket
// connection (SO_PEERCRED).
func PeerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("not a Unix-socket connection (%T)", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("getsockopt SO_PEERCRED: %w", serr)
	}
	return cred.Uid, nil
}
