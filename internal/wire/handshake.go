package wire

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Startup request codes (the first four bytes of a startup packet's body).
const (
	CodeProtocol30 = 196608   // 3.0
	CodeCancel     = 80877102 // CancelRequest
	CodeSSL        = 80877103 // SSLRequest
	CodeGSSENC     = 80877104 // GSSENCRequest
)

// MaxStartupLen is PostgreSQL's MAX_STARTUP_PACKET_LENGTH.
const MaxStartupLen = 10000

// StartupLengthError reports a startup packet whose length field is out of
// range (under 8 or over MaxStartupLen). Header is the four bytes read, so
// that the caller can tell what the peer speaks instead (a TLS handshake, an
// HTTP request) without reading further.
type StartupLengthError struct {
	Len    int
	Header [4]byte
}

func (e *StartupLengthError) Error() string {
	return fmt.Sprintf("invalid startup packet length %d", e.Len)
}

// ReadStartup reads one startup-phase packet (length-prefixed, no type byte)
// with exact reads and returns its body, whose first four bytes are the
// request code. The length comes from an untrusted peer and is capped: a
// length out of range is a *StartupLengthError, and nothing past the length
// field is read.
func ReadStartup(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	l := int(int32(binary.BigEndian.Uint32(hdr[:])))
	if l < 8 || l > MaxStartupLen {
		return nil, &StartupLengthError{Len: l, Header: hdr}
	}
	body := make([]byte, l-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("read startup packet: %w", noEOF(err))
	}
	return body, nil
}

// ReadMessage reads one typed message with exact reads, refusing bodies over
// maxBody bytes. It is for handshakes; the relay uses Cursor. A length under
// 4 or a body over maxBody is a *FrameError, returned before the body is
// read (its Type says which message the peer meant to send).
func ReadMessage(r io.Reader, maxBody int) (typ byte, body []byte, err error) {
	var hdr [HeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	l := int(int32(binary.BigEndian.Uint32(hdr[1:])))
	if l < 4 || l-4 > maxBody {
		return 0, nil, &FrameError{Type: hdr[0], Len: l}
	}
	body = make([]byte, l-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, fmt.Errorf("read message %q: %w", hdr[0], noEOF(err))
	}
	return hdr[0], body, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
