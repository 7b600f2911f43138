//go:build !linux

package wire

import "syscall"

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}

// iovec is unused: the second buffer is written by the caller's loop.
type iovec struct{}

func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return n, errno(err)
}

func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return n, errno(err)
}

func rawWritev(fd uintptr, _ *iovec, a, _ []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), a)
	return n, errno(err)
}
