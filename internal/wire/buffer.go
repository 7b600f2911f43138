package wire

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
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
// It also writes (Write, Write2) with raw system calls in the poller's
// callback, so that a relay's reads and writes skip the runtime's system
// call bookkeeping (see rawio_linux.go).
//
// Reads are made by one goroutine at a time; writes may come from several
// goroutines (they are serialized). A writer that must not wait (an event
// loop) uses WriteOrKeep, which keeps what the socket does not take for
// Flush; every other write sends what is kept first.
type ConnReader struct {
	// plain is the connection when it has no file descriptor to make raw
	// system calls on (TLS): reads and writes then go through it, and a
	// read holds a buffer while it waits.
	plain net.Conn
	rc    syscall.RawConn
	pool  *BufferPool
	rfn   func(fd uintptr) bool // r.tryRead, bound once: no allocation per read
	idle  func() bool           // ReadUnlessIdle's: stop instead of waiting?
	buf   *[]byte
	into  []byte // ReadInto's buffer; nil when reading into a pooled one
	n     int
	err   error

	wmu  sync.Mutex            // held for a whole Write2: a, b, werr and iov are its state
	wfn  func(fd uintptr) bool // r.tryWrite
	a, b []byte                // what is left to write
	werr error
	// beforeWait is called once before the first wait (Write2Then).
	beforeWait func()
	iov        iovec
	// kept is what a write that does not wait (WriteOrKeep) could not
	// send yet, in order: Flush sends it when the socket takes more, and
	// every later write sends it first. nkept is its length, for looks
	// without the lock (Kept). keep: tryWrite keeps the rest of r.a and
	// r.b in kept instead of waiting.
	kept  []byte
	nkept atomic.Int64
	keep  bool
}

// errNoDescriptor: a write that does not wait needs a descriptor.
var errNoDescriptor = errors.New("wire: connection has no file descriptor")

// NewConnReader prepares reads and writes of conn. On a *net.TCPConn or a
// *net.UnixConn it reads and writes with raw system calls; on any other
// connection (TLS) through conn itself. pool may be nil if only ReadInto is
// used.
func NewConnReader(conn net.Conn, pool *BufferPool) (*ConnReader, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return &ConnReader{plain: conn, pool: pool}, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &ConnReader{rc: rc, pool: pool}
	r.rfn = r.tryRead
	r.wfn = r.tryWrite
	return r, nil
}

// Raw reports whether reads and writes are raw system calls on a file
// descriptor (which Control then gives).
func (r *ConnReader) Raw() bool { return r.plain == nil }

// Control calls f with the connection's file descriptor, which stays open
// during the call (see syscall.RawConn).
func (r *ConnReader) Control(f func(fd uintptr)) error {
	if r.plain != nil {
		return errNoDescriptor
	}
	return r.rc.Control(f)
}

// Read waits for data and returns a borrowed buffer holding n bytes at
// [Headroom:Headroom+n]. The caller returns the buffer with Put. At end of
// stream it returns io.EOF and no buffer. Read deadlines apply.
func (r *ConnReader) Read() (buf *[]byte, n int, err error) {
	if r.plain != nil {
		b := r.pool.Get()
		n, err := r.plain.Read((*b)[Headroom:])
		if n > 0 {
			return b, n, nil
		}
		r.pool.Put(b)
		if err == nil {
			err = io.ErrNoProgress
		}
		return nil, 0, err
	}
	r.buf, r.n, r.err = nil, 0, nil
	if err := r.rc.Read(r.rfn); err != nil {
		return nil, 0, err
	}
	buf, n, err = r.buf, r.n, r.err
	r.buf = nil
	return buf, n, err
}

// ErrIdle is ReadUnlessIdle's answer when it stopped instead of waiting.
var ErrIdle = errors.New("wire: nothing to read, and the reader stops")

// ReadUnlessIdle is Read, except that when nothing is there to read it asks
// idle (if not nil) whether to wait: if idle says no, it returns ErrIdle
// at once. Connections without a file descriptor (TLS) always wait.
func (r *ConnReader) ReadUnlessIdle(idle func() bool) (buf *[]byte, n int, err error) {
	r.idle = idle
	buf, n, err = r.Read()
	r.idle = nil
	return buf, n, err
}

// ReadInto waits for data and reads it into p, as net.Conn.Read does (0 and
// io.EOF at end of stream).
func (r *ConnReader) ReadInto(p []byte) (int, error) {
	if r.plain != nil {
		return r.plain.Read(p)
	}
	r.into, r.n, r.err = p, 0, nil
	err := r.rc.Read(r.rfn)
	r.into = nil
	if err != nil {
		return 0, err
	}
	return r.n, r.err
}

func (r *ConnReader) tryRead(fd uintptr) bool {
	var b *[]byte
	p := r.into
	if p == nil {
		b = r.pool.Get()
		p = (*b)[Headroom:]
	}
	for {
		n, errno := rawRead(fd, p)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
			r.putBack(b)
			if r.idle != nil && r.idle() {
				r.err = ErrIdle
				return true
			}
			return false // wait for readability without a buffer
		case errno != 0:
			r.putBack(b)
			r.err = errno
		case n == 0:
			r.putBack(b)
			r.err = io.EOF
		default:
			r.buf, r.n = b, n
		}
		return true
	}
}

func (r *ConnReader) putBack(b *[]byte) {
	if b != nil {
		r.pool.Put(b)
	}
}

// Write writes all of p, after what WriteOrKeep kept (with p empty: only
// that). Write deadlines apply.
func (r *ConnReader) Write(p []byte) error { return r.Write2(p, nil) }

// Write2 writes a then b, in one system call when the socket takes both.
func (r *ConnReader) Write2(a, b []byte) error { return r.Write2Then(a, b, nil) }

// Write2Then is Write2 that calls beforeWait (when not nil) once, before it
// first waits for the socket to take more: an event loop running the write
// hands its other sockets to another goroutine then.
func (r *ConnReader) Write2Then(a, b []byte, beforeWait func()) error {
	if len(a) == 0 {
		a, b = b, nil
	}
	if len(a) == 0 && r.nkept.Load() == 0 {
		return nil
	}
	// The poller's write lock is not enough: it is released only when
	// tryWrite returns, and the data written may already have been answered
	// and the connection handed to another writer by then.
	r.wmu.Lock()
	if r.plain != nil {
		defer r.wmu.Unlock()
		if _, err := r.plain.Write(a); err != nil || len(b) == 0 {
			return err
		}
		_, err := r.plain.Write(b)
		return err
	}
	if len(r.kept) > 0 {
		// What an earlier write kept goes first.
		r.a, r.b, r.werr, r.beforeWait = r.kept, nil, nil, beforeWait
		err := r.rc.Write(r.wfn)
		if err == nil {
			err = r.werr
		}
		beforeWait = r.beforeWait // not called if that write did not wait
		r.kept = nil
		r.nkept.Store(0)
		if err != nil {
			r.a, r.b, r.werr, r.beforeWait = nil, nil, nil, nil
			r.wmu.Unlock()
			return err
		}
	}
	if len(a) == 0 {
		r.beforeWait = nil
		r.wmu.Unlock()
		return nil
	}
	r.a, r.b, r.werr, r.beforeWait = a, b, nil, beforeWait
	err := r.rc.Write(r.wfn)
	if err == nil {
		err = r.werr
	}
	r.a, r.b, r.werr, r.beforeWait = nil, nil, nil, nil
	r.wmu.Unlock()
	return err
}

// WriteOrKeep writes a then b without waiting: what the socket does not
// take now is kept, after anything kept before, for Flush (or the next
// Write) to send. It returns how many bytes are kept, and ok false (having
// written nothing) if another write is under way. Connections without a
// descriptor (TLS) cannot keep.
func (r *ConnReader) WriteOrKeep(a, b []byte) (kept int, ok bool, err error) {
	if len(a) == 0 {
		a, b = b, nil
	}
	if !r.wmu.TryLock() {
		return 0, false, nil
	}
	defer r.wmu.Unlock()
	if r.plain != nil {
		return 0, false, errNoDescriptor
	}
	if len(r.kept) > 0 {
		r.kept = append(append(r.kept, a...), b...)
		r.nkept.Store(int64(len(r.kept)))
		return len(r.kept), true, nil
	}
	if len(a) == 0 {
		return 0, true, nil
	}
	kept, err = r.writeKeeping(a, b)
	return kept, true, err
}

// Flush sends what WriteOrKeep kept, as much as the socket takes without
// waiting, and returns how many bytes are still kept. If another write is
// under way it sends nothing (that write sends the kept bytes first).
func (r *ConnReader) Flush() (kept int, err error) {
	if !r.wmu.TryLock() {
		return int(r.nkept.Load()), nil
	}
	defer r.wmu.Unlock()
	if len(r.kept) == 0 {
		return 0, nil
	}
	a := r.kept
	r.kept = r.kept[:0] // tryWrite moves an unsent rest to the front
	return r.writeKeeping(a, nil)
}

// Kept is how many bytes WriteOrKeep kept that are not sent yet (any
// goroutine).
func (r *ConnReader) Kept() int64 { return r.nkept.Load() }

// writeKeeping writes a then b, keeping in r.kept what the socket does not
// take now (r.wmu held).
func (r *ConnReader) writeKeeping(a, b []byte) (int, error) {
	r.a, r.b, r.werr, r.keep = a, b, nil, true
	err := r.rc.Write(r.wfn)
	if err == nil {
		err = r.werr
	}
	r.a, r.b, r.werr, r.keep = nil, nil, nil, false
	if len(r.kept) == 0 {
		r.kept = nil // a backlog's buffer is not held by an idle connection
	}
	if err != nil {
		r.kept = nil
	}
	r.nkept.Store(int64(len(r.kept)))
	return len(r.kept), err
}

func (r *ConnReader) tryWrite(fd uintptr) bool {
	for len(r.a) > 0 {
		var n int
		var errno syscall.Errno
		if len(r.b) > 0 {
			n, errno = rawWritev(fd, &r.iov, r.a, r.b)
		} else {
			n, errno = rawWrite(fd, r.a)
		}
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN && r.keep:
			// The rest is kept (r.a may be the tail of r.kept itself:
			// append moves it to the front).
			r.kept = append(append(r.kept[:0], r.a...), r.b...)
			r.a, r.b = nil, nil
			return true
		case errno == syscall.EAGAIN:
			if f := r.beforeWait; f != nil {
				r.beforeWait = nil
				f()
			}
			return false // wait for writability
		case errno != 0:
			r.werr = errno
			return true
		}
		if n < len(r.a) {
			r.a = r.a[n:]
			continue
		}
		n -= len(r.a)
		r.a, r.b = r.b[n:], nil
		if len(r.a) == 0 {
			r.a = nil
		}
	}
	return true
}
