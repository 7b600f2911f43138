// Package wire moves PostgreSQL v3 protocol frames: a cursor that walks a
// byte stream frame by frame without copying, exact reads for the startup
// handshake, builders for the few messages poolerd writes itself, and reads
// into pooled buffers borrowed only while data is in flight. It does not
// decide anything about a session: which frames matter, and what they mean
// for a transaction or a pool, is the proxy's business; message types it does
// not build come from pgproto3.
package wire

import (
	"encoding/binary"
	"fmt"
)

// HeaderLen is the size of a frame header: one type byte and a four-byte
// length that counts itself but not the type.
const HeaderLen = 5

// MaxFrameLen is the largest frame length poolerd accepts (PostgreSQL's
// PQ_LARGE_MESSAGE_LIMIT is 1 GB - 1).
const MaxFrameLen = 1<<30 - 1

// Event is what Cursor.Next found.
type Event uint8

const (
	// EvPartial: the input ends inside a frame header. Next consumed nothing;
	// the caller must keep the remaining bytes (fewer than HeaderLen) and
	// present them again, followed by more input.
	EvPartial Event = iota
	// EvHeader: a frame header was consumed; Type and Len describe the frame.
	EvHeader
	// EvBody: body bytes of the current frame were consumed.
	EvBody
	// EvEnd: the current frame is complete (consumes nothing). Body holds its
	// captured bytes if capture was requested.
	EvEnd
)

// FrameError reports an impossible frame header.
type FrameError struct {
	Type byte
	Len  int
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("invalid length %d for message type %q", e.Len, e.Type)
}

// Cursor walks a stream of frames in the chunks it arrives in. It never
// copies the stream; it only remembers where the current frame ends and,
// when asked, captures up to a limit of its body for inspection.
//
// The zero Cursor is ready at a frame boundary.
type Cursor struct {
	// Type is the current frame's type byte.
	Type byte
	// Len is the current frame's body length (the length field minus 4).
	Len int

	left    int // body bytes still to come
	inFrame bool
	capture []byte
	capMax  int
}

// Capture asks the cursor to keep up to max bytes of the current frame's
// body (call it on EvHeader). The bytes are in Body on EvEnd.
func (c *Cursor) Capture(max int) {
	c.capMax = max
	c.capture = c.capture[:0]
}

// Body returns the captured body of the frame that just ended, truncated to
// the Capture limit. It is valid until the next call to Next.
func (c *Cursor) Body() []byte { return c.capture }

// Truncated reports whether Body is shorter than the frame's body.
func (c *Cursor) Truncated() bool { return len(c.capture) < c.Len }

// AtBoundary reports whether the cursor is between frames.
func (c *Cursor) AtBoundary() bool { return !c.inFrame }

// Ending reports whether the current frame's bytes have all been consumed
// but its EvEnd has not been reported yet. Loops over a chunk must keep
// calling Next while this holds, even when the chunk is used up, or the
// last frame of a read would end only with the next read.
func (c *Cursor) Ending() bool { return c.inFrame && c.left == 0 }

// Remaining is the number of body bytes of the current frame not yet seen.
func (c *Cursor) Remaining() int { return c.left }

// Reset returns the cursor to a frame boundary.
func (c *Cursor) Reset() {
	c.inFrame = false
	c.left = 0
	c.capMax = 0
	c.capture = c.capture[:0]
}

// Next consumes the start of p and reports what it found. n is the number of
// bytes consumed. A header with an impossible length returns a *FrameError.
func (c *Cursor) Next(p []byte) (n int, ev Event, err error) {
	if c.inFrame {
		if c.left == 0 {
			c.inFrame = false
			return 0, EvEnd, nil
		}
		if len(p) == 0 {
			return 0, EvPartial, nil
		}
		n = min(c.left, len(p))
		if room := c.capMax - len(c.capture); room > 0 {
			c.capture = append(c.capture, p[:min(n, room)]...)
		}
		c.left -= n
		return n, EvBody, nil
	}
	if len(p) < HeaderLen {
		return 0, EvPartial, nil
	}
	l := int(int32(binary.BigEndian.Uint32(p[1:5])))
	if l < 4 || l > MaxFrameLen {
		return 0, EvPartial, &FrameError{Type: p[0], Len: l}
	}
	c.Type = p[0]
	c.Len = l - 4
	c.left = c.Len
	c.inFrame = true
	c.capMax = 0
	c.capture = c.capture[:0]
	return HeaderLen, EvHeader, nil
}

// Trim drops a capture buffer grown beyond max bytes, so that a connection
// that once sent a large frame does not keep its size while idle. Call it
// between frames.
func (c *Cursor) Trim(max int) {
	if cap(c.capture) > max {
		c.capture = nil
	}
}
