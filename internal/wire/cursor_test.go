package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func frame(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

type seen struct {
	typ  byte
	body string // captured body
	fwd  int    // header+body bytes consumed for the frame
}

// walk feeds stream to a cursor in chunks of the given sizes, carrying
// partial headers like the relay does, and records every frame.
func walk(t *testing.T, stream []byte, chunk int) []seen {
	t.Helper()
	var c Cursor
	var out []seen
	var carry []byte
	for off := 0; off < len(stream); off += chunk {
		p := append(append([]byte(nil), carry...), stream[off:min(off+chunk, len(stream))]...)
		carry = nil
		for i := 0; i < len(p) || !c.AtBoundary(); {
			n, ev, err := c.Next(p[i:])
			if err != nil {
				t.Fatal(err)
			}
			switch ev {
			case EvPartial:
				carry = p[i:]
				i = len(p)
			case EvHeader:
				c.Capture(1 << 20)
				out = append(out, seen{typ: c.Type, fwd: n})
			case EvBody:
				out[len(out)-1].fwd += n
			case EvEnd:
				out[len(out)-1].body = string(c.Body())
			}
			i += n
			if ev == EvBody && i >= len(p) && !c.AtBoundary() && c.Remaining() > 0 {
				break
			}
			if ev == EvPartial {
				break
			}
		}
	}
	if len(carry) > 0 {
		t.Fatalf("stream ended inside a header: %q", carry)
	}
	return out
}

func TestCursorEveryChunkSize(t *testing.T) {
	var stream []byte
	want := []seen{}
	for _, f := range []struct {
		typ  byte
		body string
	}{{'Q', "SELECT 1\x00"}, {'S', ""}, {'d', string(bytes.Repeat([]byte("x"), 300))}, {'Z', "I"}, {'X', ""}} {
		stream = append(stream, frame(f.typ, f.body)...)
		want = append(want, seen{typ: f.typ, body: f.body, fwd: HeaderLen + len(f.body)})
	}
	for chunk := 1; chunk <= len(stream); chunk++ {
		got := walk(t, stream, chunk)
		if len(got) != len(want) {
			t.Fatalf("chunk %d: %d frames, want %d", chunk, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("chunk %d frame %d: got %+v want %+v", chunk, i, got[i], want[i])
			}
		}
	}
}

func TestCursorRejectsBadLength(t *testing.T) {
	for _, l := range []uint32{0, 3, 1 << 31, MaxFrameLen + 1} {
		var c Cursor
		b := []byte{'Q', 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], l)
		_, _, err := c.Next(b)
		var fe *FrameError
		if !errors.As(err, &fe) {
			t.Errorf("length %d: want FrameError, got %v", l, err)
		}
	}
}

func TestCursorCaptureLimit(t *testing.T) {
	var c Cursor
	f := frame('E', "0123456789")
	n, ev, _ := c.Next(f)
	if ev != EvHeader || n != HeaderLen {
		t.Fatalf("got %v %d", ev, n)
	}
	c.Capture(4)
	n, ev, _ = c.Next(f[HeaderLen:])
	if ev != EvBody || n != 10 {
		t.Fatalf("got %v %d", ev, n)
	}
	if _, ev, _ = c.Next(nil); ev != EvEnd {
		t.Fatalf("want end, got %v", ev)
	}
	if string(c.Body()) != "0123" || !c.Truncated() {
		t.Fatalf("body %q truncated %v", c.Body(), c.Truncated())
	}
}

func FuzzCursor(f *testing.F) {
	f.Add(append(frame('Q', "SELECT 1\x00"), frame('S', "")...), 3)
	f.Add([]byte{'Z', 0, 0, 0, 5, 'I', 'X'}, 1)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff}, 7)
	f.Fuzz(func(t *testing.T, stream []byte, chunk int) {
		if chunk <= 0 || chunk > 64 {
			chunk = 1 + (chunk&63+64)%64
		}
		var c Cursor
		consumed := 0
		var carry []byte
		for off := 0; off < len(stream); off += chunk {
			p := append(carry, stream[off:min(off+chunk, len(stream))]...)
			carry = nil
			i := 0
			for i < len(p) {
				n, ev, err := c.Next(p[i:])
				if err != nil {
					return
				}
				if n < 0 || i+n > len(p) {
					t.Fatalf("consumed %d of %d", n, len(p)-i)
				}
				if ev == EvPartial {
					carry = append([]byte(nil), p[i:]...)
					if len(carry) >= HeaderLen && c.AtBoundary() {
						t.Fatalf("partial with a full header available")
					}
					break
				}
				if ev == EvHeader {
					c.Capture(16)
				}
				i += n
				consumed += n
			}
		}
		if consumed+len(carry) != len(stream) {
			t.Fatalf("consumed %d + carry %d != %d", consumed, len(carry), len(stream))
		}
	})
}

// TestCursorEndsAtTheEndOfInput pins the contract the relay loops rely on:
// a frame that ends exactly where a read ends reports EvEnd without more
// input, as long as the caller asks while Ending() holds.
func TestCursorEndsAtTheEndOfInput(t *testing.T) {
	for _, f := range [][]byte{frame('Z', "I"), frame('S', "")} {
		var c Cursor
		var events []Event
		for off := 0; off < len(f) || c.Ending(); {
			n, ev, err := c.Next(f[off:])
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, ev)
			off += n
		}
		if events[len(events)-1] != EvEnd || !c.AtBoundary() {
			t.Fatalf("frame %q: events %v, boundary %v", f, events, c.AtBoundary())
		}
	}
}
