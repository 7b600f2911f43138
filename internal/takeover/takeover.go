package takeover

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/poolerd/poolerd/internal/netopt"
)

// The hand-over, on one connection to takeover_socket:
//
//	new → old  "poolerd takeover 1\n"
//	old → new  "listener <address> ...\n" with the listening sockets, one
//	           address each, in one message (SCM_RIGHTS, in that order)
//	new → old  "serving\n"   once it accepts on the sockets
//	old → new  "bye\n"       once it has stopped accepting and no longer
//	                         offers on takeover_socket
//	old → new  client connections, each as one message: a 4-byte length,
//	           that many bytes of state (the session, as the proxy encodes
//	           it), and the client's socket (SCM_RIGHTS); a length of 0
//	           ends the list
//
// Both accept from the one socket (the same kernel queue) until "bye": no
// connection waits in a queue nobody reads, and none is refused. Then the
// old process hands its idle clients over, each at its next idle point,
// and exits once none is left; the new one offers on takeover_socket for
// the next upgrade. A new process that does not read client connections
// (an older poolerd) closes the socket after "bye": the old one then drains
// its clients itself.
const (
	hello   = "poolerd takeover 1\n"
	serving = "serving\n"
	bye     = "bye\n"
)

// exchangeTimeout bounds each side's part of the hand-over.
const exchangeTimeout = 10 * time.Second

// maxListeners bounds the listening sockets one hand-over carries.
const maxListeners = 32

// Offer serves takeover_socket for a running poolerd: the first new
// poolerd that asks gets its listening sockets.
type Offer struct {
	ul    *net.UnixListener
	files []*os.File // duplicates of the listening sockets
	log   *zap.Logger
	taken chan *Passer // the hand-over, once the new process serves
	wg    sync.WaitGroup
}

// NewOffer offers lns (TCP and Unix-socket listeners) on the Unix socket
// path. A socket file left by a process that is gone is replaced; one a
// running poolerd still serves is an error.
func NewOffer(path string, lns []net.Listener, log *zap.Logger) (*Offer, error) {
	if len(lns) == 0 || len(lns) > maxListeners {
		return nil, fmt.Errorf("takeover: %d listeners (1 to %d can be handed over)", len(lns), maxListeners)
	}
	var files []*os.File
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, ln := range lns {
		fl, ok := ln.(interface{ File() (*os.File, error) })
		if !ok {
			closeFiles()
			return nil, fmt.Errorf("takeover: the listener is a %T, not TCP or Unix", ln)
		}
		f, err := fl.File()
		if err != nil {
			closeFiles()
			return nil, fmt.Errorf("takeover: duplicate the listening socket %s: %w", ln.Addr(), err)
		}
		files = append(files, f)
	}
	ul, err := listenUnix(path)
	if err != nil {
		closeFiles()
		return nil, err
	}
	o := &Offer{ul: ul, files: files, log: log, taken: make(chan *Passer, 1)}
	o.wg.Add(1)
	go o.serve()
	return o, nil
}

func listenUnix(path string) (*net.UnixListener, error) {
	ul, live, err := bindUnix(path)
	switch {
	case live:
		return nil, fmt.Errorf("takeover_socket %s: another poolerd offers its listener there (start this one with --takeover, or give it another takeover_socket)", path)
	case err != nil:
		return nil, fmt.Errorf("takeover_socket %s: %w", path, err)
	}
	// Whoever connects gets the listening sockets and the clients: the
	// owner only (and the peer check in handOver).
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ul.Close()
		return nil, fmt.Errorf("takeover_socket %s: %w", path, err)
	}
	return ul, nil
}

// peerAllowed reports whether a process of user id uid may take over the
// sockets of a poolerd running as user id self: the same user, or root.
func peerAllowed(uid uint32, self int) bool {
	return uid == 0 || int64(uid) == int64(self)
}

// bindUnix listens on the Unix socket path. A socket file there that no
// process serves (left by one that is gone) is replaced; one that a live
// process serves is left alone, and live is true.
func bindUnix(path string) (ul *net.UnixListener, live bool, err error) {
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	ul, err = net.ListenUnix("unix", addr)
	if !errors.Is(err, syscall.EADDRINUSE) {
		return ul, false, err
	}
	if c, derr := net.DialTimeout("unix", path, time.Second); derr == nil {
		c.Close()
		return nil, true, err
	}
	if rerr := os.Remove(path); rerr != nil {
		return nil, false, fmt.Errorf("remove the stale socket file: %w", rerr)
	}
	ul, err = net.ListenUnix("unix", addr)
	return ul, false, err
}

// Taken delivers the hand-over once a new poolerd serves the listening
// socket: the old process calls its Stopped after it has stopped accepting,
// which tells the new one that it is alone on the socket, then passes
// client connections (Send) and ends with Close.
func (o *Offer) Taken() <-chan *Passer { return o.taken }

// Passer is the old process's end of a hand-over, once the listening
// socket is the new process's.
type Passer struct {
	mu     sync.Mutex
	c      *net.UnixConn
	broken bool
}

// Stopped tells the new process that this one no longer accepts.
func (p *Passer) Stopped() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.c.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := p.c.Write([]byte(bye)); err != nil {
		p.broken = true
	}
}

// ErrNoTaker says that the new process takes no client connections.
var ErrNoTaker = errors.New("takeover: the new poolerd takes no client connections")

// Send passes a client connection (its socket, f) and its state to the new
// process. After an error, every later Send fails too.
func (p *Passer) Send(f *os.File, state []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken {
		return ErrNoTaker
	}
	msg := make([]byte, 4, 4+len(state))
	binary.BigEndian.PutUint32(msg, uint32(len(state)))
	msg = append(msg, state...)
	_ = p.c.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, _, err := p.c.WriteMsgUnix(msg, unix.UnixRights(int(f.Fd())), nil); err != nil {
		p.broken = true
		return fmt.Errorf("%w: %w", ErrNoTaker, err)
	}
	return nil
}

// Close ends the list of client connections and the hand-over.
func (p *Passer) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.broken {
		_ = p.c.SetDeadline(time.Now().Add(exchangeTimeout))
		_, _ = p.c.Write(make([]byte, 4))
	}
	p.broken = true
	_ = p.c.Close()
}

// Close stops offering and removes the socket file.
func (o *Offer) Close() error {
	err := o.ul.Close()
	o.wg.Wait()
	for _, f := range o.files {
		f.Close()
	}
	return err
}

func (o *Offer) serve() {
	defer o.wg.Done()
	for {
		c, err := o.ul.AcceptUnix()
		if err != nil {
			return // closed
		}
		if err := o.handOver(c); err != nil {
			c.Close()
			o.log.Warn("takeover: a hand-over failed; still serving", zap.Error(err))
			continue
		}
		// Handed over: no second taker; the socket file goes, so that the
		// new process can offer on it.
		_ = o.ul.Close()
		o.taken <- &Passer{c: c}
		return
	}
}

// handOver sends the listening sockets to the new process on c and waits
// until it says it serves them.
func (o *Offer) handOver(c *net.UnixConn) error {
	// SO_PEERCRED where the system has it (Linux); elsewhere the socket
	// file's mode alone keeps other users out.
	if uid, err := netopt.PeerUID(c); err == nil && !peerAllowed(uid, os.Geteuid()) {
		return fmt.Errorf("a process of uid %d asked for the listening sockets: only this poolerd's user (uid %d) or root may take them over", uid, os.Geteuid())
	}
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("read the request: %w", err)
	}
	if line != hello {
		return fmt.Errorf("unexpected request %q", strings.TrimSpace(line))
	}
	msg := []byte("listener")
	fds := make([]int, len(o.files))
	for i, f := range o.files {
		msg = append(append(msg, ' '), sockAddr(f)...)
		fds[i] = int(f.Fd())
	}
	msg = append(msg, '\n')
	if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(fds...), nil); err != nil {
		return fmt.Errorf("send the listening sockets: %w", err)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("wait for the new process to serve: %w", err)
	}
	if line != serving {
		return fmt.Errorf("unexpected answer %q", strings.TrimSpace(line))
	}
	_ = c.SetDeadline(time.Time{})
	return nil
}

// sockAddr is a listening socket's address, for the new process's log.
func sockAddr(f *os.File) string {
	sa, err := unix.Getsockname(int(f.Fd()))
	if err != nil {
		return "?"
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return (&net.TCPAddr{IP: a.Addr[:], Port: a.Port}).String()
	case *unix.SockaddrInet6:
		return (&net.TCPAddr{IP: a.Addr[:], Port: a.Port}).String()
	case *unix.SockaddrUnix:
		return "unix:" + a.Name
	}
	return "?"
}

// Handover is the new process's side once it holds the listening sockets.
type Handover struct {
	c *net.UnixConn
}

// Take asks the poolerd serving the Unix socket path for its listening
// sockets, in its order. Once the caller accepts on them, it calls Serving.
// A Unix-socket listener taken over does not remove its file when closed.
func Take(ctx context.Context, path string) ([]net.Listener, *Handover, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("takeover: no running poolerd answers on takeover_socket %s: %w", path, err)
	}
	c := nc.(*net.UnixConn)
	fail := func(err error) ([]net.Listener, *Handover, error) {
		c.Close()
		return nil, nil, fmt.Errorf("takeover from %s: %w", path, err)
	}
	_ = c.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := c.Write([]byte(hello)); err != nil {
		return fail(fmt.Errorf("send the request: %w", err))
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*maxListeners))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return fail(fmt.Errorf("receive the listening sockets: %w", err))
	}
	if !strings.HasPrefix(string(buf[:n]), "listener ") {
		return fail(fmt.Errorf("unexpected answer %q", strings.TrimSpace(string(buf[:n]))))
	}
	fds, err := socketRights(oob[:oobn])
	if err != nil {
		return fail(err)
	}
	var lns []net.Listener
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "poolerd-listener")
		ln, err := net.FileListener(f)
		f.Close() // FileListener holds its own duplicate
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			closeAll(fds[i+1:])
			return fail(fmt.Errorf("use the listening socket: %w", err))
		}
		if ul, ok := ln.(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(false) // the file is the old process's too until it exits
		}
		lns = append(lns, ln)
	}
	return lns, &Handover{c: c}, nil
}

func socketRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse the control message: %w", err)
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		if len(fds) > 0 {
			return fds, nil
		}
	}
	return nil, errors.New("the answer carries no socket")
}

// Serving tells the old process that this one accepts on the socket and
// waits until the old one has stopped accepting. Then Clients takes the
// old process's client connections; if not called, Close.
func (h *Handover) Serving() error {
	_ = h.c.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := h.c.Write([]byte(serving)); err != nil {
		return fmt.Errorf("takeover: tell the old process: %w", err)
	}
	// Read exactly "bye\n": what follows carries sockets, which a read
	// without room for them would drop.
	line := make([]byte, len(bye))
	if _, err := io.ReadFull(h.c, line); err != nil {
		return fmt.Errorf("takeover: wait for the old process to stop accepting: %w", err)
	}
	if string(line) != bye {
		return fmt.Errorf("takeover: unexpected answer %q", strings.TrimSpace(string(line)))
	}
	return nil
}

// maxState bounds one client's state (a sanity check on the length).
const maxState = 64 << 20

// Clients receives the old process's client connections until it has
// passed them all, calling adopt with each socket (which adopt owns) and
// its state. The old process passes each at its client's next idle point,
// so this lasts as long as its drain; idle waits have no deadline.
func (h *Handover) Clients(adopt func(f *os.File, state []byte)) error {
	defer h.c.Close()
	_ = h.c.SetDeadline(time.Time{})
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := h.c.ReadMsgUnix(hdr[:], oob)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil // an older poolerd: it drains its clients itself
			}
			return fmt.Errorf("takeover: receive a client: %w", err)
		}
		var fds []int
		if oobn > 0 {
			if fds, err = socketRights(oob[:oobn]); err != nil {
				return err
			}
		}
		if n < len(hdr) {
			if _, err := io.ReadFull(h.c, hdr[n:]); err != nil {
				closeAll(fds)
				return fmt.Errorf("takeover: receive a client: %w", err)
			}
		}
		size := binary.BigEndian.Uint32(hdr[:])
		if size == 0 {
			closeAll(fds)
			return nil // all passed
		}
		if size > maxState || len(fds) != 1 {
			closeAll(fds)
			return fmt.Errorf("takeover: malformed client message (%d bytes, %d sockets)", size, len(fds))
		}
		state := make([]byte, size)
		if _, err := io.ReadFull(h.c, state); err != nil {
			closeAll(fds)
			return fmt.Errorf("takeover: receive a client's state: %w", err)
		}
		adopt(os.NewFile(uintptr(fds[0]), "poolerd-client"), state)
	}
}

// Close ends the hand-over without taking client connections.
func (h *Handover) Close() { _ = h.c.Close() }

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
