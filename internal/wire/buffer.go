package wire

import (
	"errors"
	"io"
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

// ConnReader reads a connection into buffers borrowed from a pool only when
// data has arrived: the read happens inside the runtime poller's callback,
// and a read that finds nothing gives the buffer back before waiting. An
// idle connection therefore holds no buffer, and a read costs the same
// system calls as net.Conn.Read (one that finds data, one that finds none).
//
// A ConnReader is used by one goroutine at a time.
type ConnReader struct {
	rc   syscall.RawConn
	pool *BufferPool
	fn   func(fd uintptr) bool // r.tryRead, bound once: no allocation per read
	buf  *[]byte
	n    int
	err  error
}

// NewConnReader prepares reads of conn, which must be a *net.TCPConn or a
// *net.UnixConn.
func NewConnReader(conn net.Conn, pool *BufferPool) (*ConnReader, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("wire: connection has no file descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &ConnReader{rc: rc, pool: pool}
	r.fn = r.tryRead
	return r, nil
}

// Read waits for data and returns a borrowed buffer holding n bytes at
// [Headroom:Headroom+n]. The caller returns the buffer with Put. At end of
// stream it returns io.EOF and no buffer. Read deadlines apply.
func (r *ConnReader) Read() (buf *[]byte, n int, err error) {
	r.buf, r.n, r.err = nil, 0, nil
	if err := r.rc.Read(r.fn); err != nil {
		return nil, 0, err
	}
	buf, n, err = r.buf, r.n, r.err
	r.buf = nil
	return buf, n, err
}

func (r *ConnReader) tryRead(fd uintptr) bool {
	b := r.pool.Get()
	for {
		n, err := syscall.Read(int(fd), (*b)[Headroom:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			r.pool.Put(b)
			return false // wait for readability without a buffer
		case err != nil:
			r.pool.Put(b)
			r.err = err
		case n == 0:
			r.pool.Put(b)
			r.err = io.EOF
		default:
			r.buf, r.n = b, n
		}
		return true
	}
}
