package wire

import (
	"errors"
	"net"
	"sync"
	"syscall"
)

// Headroom is the space kept free in front of every pooled buffer, so that a
// frame header split across two reads can be put back in front of the next
// read without copying the read itself.
const Headroom = 8

// BufferSize is the usable size of a pooled buffer.
const BufferSize = 16 << 10

// BufferPool hands out fixed-size buffers. Sessions borrow one only while
// data is in flight, so an idle client holds none.
type BufferPool struct{ p sync.Pool }

// NewBufferPool returns a pool of buffers of Headroom+size bytes.
func NewBufferPool(size int) *BufferPool {
	bp := &BufferPool{}
	bp.p.New = func() any {
		b := make([]byte, Headroom+size)
		return &b
	}
	return bp
}

// Get borrows a buffer.
func (bp *BufferPool) Get() *[]byte { return bp.p.Get().(*[]byte) }

// Put returns a buffer.
func (bp *BufferPool) Put(b *[]byte) { bp.p.Put(b) }

// WaitReadable blocks until conn has data to read, is closed by the peer, or
// its read deadline passes, without reading anything: it peeks one byte into
// a stack variable. It lets an idle session wait without holding a buffer.
// Connections that are not *net.TCPConn or *net.UnixConn return at once.
func WaitReadable(conn net.Conn) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, e := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if errors.Is(e, syscall.EAGAIN) || errors.Is(e, syscall.EINTR) {
			return false // wait for readability
		}
		perr = e // nil with data or EOF (the Read that follows reports EOF)
		return true
	})
	if err != nil {
		return err
	}
	return perr
}
