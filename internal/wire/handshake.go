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

// ReadStartup reads one startup-phase packet (length-prefixed, no type byte)
// with exact reads and returns its body, whose first four bytes are the
// request code. The length comes from an untrusted peer and is capped.
func ReadStartup(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	l := int(int32(binary.BigEndian.Uint32(hdr[:])))
	if l < 8 || l > MaxStartupLen {
		return nil, fmt.Errorf("invalid startup packet length %d", l)
	}
	body := make([]byte, l-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("read startup packet: %w", noEOF(err))
	}
	return body, nil
}

// ReadMessage reads one typed message with exact reads, refusing bodies over
// maxBody bytes. It is for handshakes; the relay uses Cursor.
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
