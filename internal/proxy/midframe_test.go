package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/poolerd/poolerd/internal/config"
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

// TestServerConnLogLines: a server connection logs its opening (at info
// with log_connections) once it has its conn_id, and its close with the
// pool's reason and its age (log_disconnections): the lines PgBouncer's
// "new connection to server" and "closing because: server conn crashed?"
// come from (internal/pgblog).
func TestServerConnLogLines(t *testing.T) {
	fb := startFakeBackend(t, 1000)
	fb.mu.Lock()
	fb.cutQuery, fb.cutShort = []byte("CUT"), 20
	fb.mu.Unlock()
	core, logs := observer.New(zapcore.InfoLevel)
	rl := startRelayLog(t, fb, 1, zap.New(core), func(c *config.Config) { c.LogConnections, c.LogDisconnections = true, true })
	opened := logs.FilterMessage("server connection opened").All()
	if len(opened) != 1 {
		t.Fatalf("%d 'server connection opened' lines at info for a pool of 1, want 1", len(opened))
	}
	f := opened[0].ContextMap()
	if f["conn_id"] != uint64(1) || f["host"] != fb.Addr() || !strings.HasPrefix(fmt.Sprint(f["local"]), "127.0.0.1:") {
		t.Errorf("opened line's fields %v, want conn_id 1, host %s, local 127.0.0.1:…", f, fb.Addr())
	}
	c := dialBench(t, rl.addr, wire.AppendQuery(nil, "CUT"))
	if _, err := c.conn.Write(c.request); err != nil {
		t.Fatal(err)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.ReadAll(c.conn)
	waitFor(t, 5*time.Second, "the 'server connection closed' line", func() bool {
		return logs.FilterMessage("server connection closed").Len() > 0
	})
	f = logs.FilterMessage("server connection closed").All()[0].ContextMap()
	if f["conn_id"] != uint64(1) || f["reason"] != "server_closed" || f["host"] != fb.Addr() {
		t.Errorf("closed line's fields %v, want conn_id 1, reason server_closed, host %s", f, fb.Addr())
	}
	if _, ok := f["age"].(time.Duration); !ok {
		t.Errorf("closed line without its age: %v", f)
	}
}

// TestDisconnectLoggedBeforeFinalMessage: a client that poolerd ends with a
// FATAL (here a shutdown's 57P01) is logged as disconnected, with the
// reason, before the FATAL goes out, as PgBouncer logs "closing because":
// a watcher of the log that sees the client fail finds the line there. It
// is logged once, not again when the session ends.
func TestDisconnectLoggedBeforeFinalMessage(t *testing.T) {
	fb := startFakeBackend(t, 16)
	core, logs := observer.New(zapcore.InfoLevel)
	rl := startRelayLog(t, fb, 1, zap.New(core), func(c *config.Config) { c.LogDisconnections = true })
	c := dialBench(t, rl.addr, simpleRequest)
	if err := c.roundTrip(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- rl.srv.Shutdown(ctx)
	}()
	expectShutdownError(t, "idle client", []*benchClient{c})
	if n := logs.FilterMessage("client disconnected").Len(); n != 1 {
		t.Fatalf("%d 'client disconnected' lines when the client had its FATAL, want 1", n)
	}
	if f := logs.FilterMessage("client disconnected").All()[0].ContextMap(); f["sqlstate"] != "57P01" || f["detail"] != "poolerd is shutting down" {
		t.Errorf("the line's fields %v, want sqlstate 57P01 and the detail", f)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessage("client disconnected").Len(); n != 1 {
		t.Errorf("%d 'client disconnected' lines after the session ended, want 1", n)
	}
}
