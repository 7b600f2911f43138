package proxy

import (
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/poolerd/poolerd/internal/wire"
)

// TestServerLostMidFrame: when the server connection ends in the middle of
// a frame poolerd is forwarding, the client's connection ends without
// poolerd's FATAL 08006. Written after the partial frame, the FATAL would be
// read as the rest of it (here: the last bytes of a DataRow, handed to the
// application as column data) and what follows as garbage. The client must
// see its stream end inside the frame, as after a backend crash.
func TestServerLostMidFrame(t *testing.T) {
	const size, short = 1000, 20
	fb := startFakeBackend(t, size)
	fb.mu.Lock()
	fb.cutQuery, fb.cutShort = []byte("CUT"), short
	fb.mu.Unlock()
	rl := startRelay(t, fb, 1)
	c := dialBench(t, rl.addr, wire.AppendQuery(nil, "CUT"))
	if _, err := c.conn.Write(c.request); err != nil {
		t.Fatal(err)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c.conn)
	if err != nil {
		t.Fatalf("read: %v (after %d bytes)", err, len(got))
	}
	// RowDescription, then the DataRow the server did not finish.
	rd := fbRowDescription(nil)
	if len(got) < len(rd)+wire.HeaderLen || string(got[:len(rd)]) != string(rd) || got[len(rd)] != 'D' {
		t.Fatalf("the client did not get the RowDescription and the start of the DataRow: %q", got[:min(len(got), 64)])
	}
	rowLen := 1 + int(binary.BigEndian.Uint32(got[len(rd)+1:]))
	if rest := got[len(rd):]; len(rest) >= rowLen {
		t.Fatalf("the client got a whole DataRow of %d bytes, %d bytes of which the server never sent, then %d more bytes: %q",
			rowLen, short, len(rest)-rowLen, rest[rowLen-short:])
	}
	if want := len(rd) + rowLen - short; len(got) != want {
		t.Fatalf("the client got %d bytes, want the %d the server sent", len(got), want)
	}
}
