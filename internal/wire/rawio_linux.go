//go:build linux

package wire

import (
	"syscall"
	"unsafe"
)

// The hot path's reads and writes are made with raw system calls inside the
// runtime poller's callbacks (syscall.RawConn). The sockets are non-blocking,
// so these calls never block; skipping the runtime's entersyscall and
// exitsyscall saves their cost and, more importantly, keeps the system
// monitor from taking the processor away while a write to a busy loopback
// socket is running (it does so after 20 µs), which otherwise costs a thread
// hand-off (futex wake-ups and context switches) per write on a loaded
// machine.

// iovec is the scratch space of a two-buffer write.
type iovec = [2]syscall.Iovec

func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// rawWritev writes a then b in one system call; iov is scratch space that
// lives as long as the caller's writer, so the buffers it points to stay
// reachable during the call.
func rawWritev(fd uintptr, iov *iovec, a, b []byte) (int, syscall.Errno) {
	iov[0].Base, iov[1].Base = &a[0], &b[0]
	iov[0].SetLen(len(a))
	iov[1].SetLen(len(b))
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), 2)
	iov[0].Base, iov[1].Base = nil, nil
	return int(n), e
}

// ReadFD reads from a non-blocking descriptor with a raw system call
// (an event loop's own descriptor, which no runtime poller watches).
func ReadFD(fd int, p []byte) (int, syscall.Errno) { return rawRead(uintptr(fd), p) }
