package proxy

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
)

// fakeConsole registers each connection, sends a minimal welcome, then
// reads until the client leaves or the proxy terminates it; it reports
// what the proxy did to the connections.
type fakeConsole struct {
	served  chan *ConsoleConn
	cancels chan uint64
	terms   chan *wire.Error
}

type fakeConsoleClient struct {
	fc *fakeConsole
	c  *ConsoleConn
}

func (cl fakeConsoleClient) Cancel() { cl.fc.cancels <- cl.c.ID }

func (cl fakeConsoleClient) Terminate(werr *wire.Error) {
	_, _ = cl.c.Conn.Write(werr.Append(nil))
	cl.c.Finish()
	cl.fc.terms <- werr
}

func (fc *fakeConsole) ServeConsole(ctx context.Context, c *ConsoleConn) {
	pid, key, err := c.Register(fakeConsoleClient{fc, c})
	if err != nil {
		c.Close()
		return
	}
	welcome := wire.AppendAuthOk(nil)
	welcome = wire.AppendBackendKeyData(welcome, pid, key)
	welcome = wire.AppendReadyForQuery(welcome, wire.TxIdle)
	if _, err := c.Conn.Write(welcome); err != nil {
		c.Close()
		return
	}
	fc.served <- c
	for {
		if _, _, err := wire.ReadMessage(c.Conn, 1<<10); err != nil {
			break
		}
		c.NoteRequest()
	}
	c.Close()
}

// startConsoleServer starts poolerd with trust authentication and con as
// its console (none if nil), in front of an upstream that is never reached.
func startConsoleServer(t *testing.T, con Console) (*Server, string) {
	t.Helper()
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.HTTPListen = ""
	cfg.Upstream = "postgres://app:secret@127.0.0.1:1/app"
	cfg.AuthType = config.AuthTrust
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := New(&cfg, zap.NewNop())
	if con != nil {
		srv.SetConsole(con)
	}
	return srv, serve(t, srv)
}

// consoleLogin logs in to the console database and returns the
// BackendKeyData.
func consoleLogin(t *testing.T, addr, database string) (c *rawClient, pid, key uint32) {
	t.Helper()
	c = dialRaw(t, addr)
	c.sendNow(rawStartup(wire.CodeProtocol30, "user", "admin", "database", database))
	c.expect('R')
	kd := c.expect('K')
	c.expect('Z')
	return c, binary.BigEndian.Uint32(kd), binary.BigEndian.Uint32(kd[4:])
}

func sendCancel(t *testing.T, addr string, pid, key uint32) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b := binary.BigEndian.AppendUint32([]byte{0, 0, 0, 16}, wire.CodeCancel)
	b = binary.BigEndian.AppendUint32(b, pid)
	b = binary.BigEndian.AppendUint32(b, key)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
}

func TestConsoleNotSet(t *testing.T) {
	_, addr := startConsoleServer(t, nil)
	c := dialRaw(t, addr)
	c.sendNow(rawStartup(wire.CodeProtocol30, "user", "admin", "database", "pgbouncer"))
	f := c.refusal()
	if f['S'] != "FATAL" || f['C'] != "08P01" || f['M'] != errNoConsole().Message || f['H'] == "" {
		t.Errorf("refusal %v", f)
	}
}

// TestConsoleHandOff: a console login reaches the Console; the proxy
// counts and lists it as a client (not one Drain waits for), delivers a
// cancel request with its key, and ends it for KillClient and Shutdown.
func TestConsoleHandOff(t *testing.T) {
	fc := &fakeConsole{served: make(chan *ConsoleConn, 2), cancels: make(chan uint64, 2), terms: make(chan *wire.Error, 2)}
	srv, addr := startConsoleServer(t, fc)
	c1, pid, key := consoleLogin(t, addr, "pgbouncer")
	cc := <-fc.served
	if cc.User != "admin" || cc.Database != "pgbouncer" || cc.ID == 0 {
		t.Errorf("handed over %+v", cc)
	}
	c2, _, _ := consoleLogin(t, addr, "poolerd")
	cc2 := <-fc.served
	if n := srv.ClientCount(); n != 2 {
		t.Errorf("ClientCount %d, want 2", n)
	}
	if n := srv.clientSessions(); n != 0 {
		t.Errorf("clientSessions %d: console connections must not hold up Drain", n)
	}
	clients := srv.Clients()
	if len(clients) != 2 || !clients[0].Console || clients[0].ID != cc.ID || clients[1].Database != "poolerd" {
		t.Errorf("Clients %+v", clients)
	}

	sendCancel(t, addr, pid, key+1) // wrong key: nothing
	sendCancel(t, addr, pid, key)
	select {
	case id := <-fc.cancels:
		if id != cc.ID {
			t.Errorf("cancel reached connection %d, want %d", id, cc.ID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel request did not reach the console")
	}
	select {
	case id := <-fc.cancels:
		t.Errorf("a cancel request with a wrong key reached connection %d", id)
	case <-time.After(100 * time.Millisecond):
	}

	if !srv.KillClient(cc2.ID) {
		t.Fatal("KillClient did not find the console connection")
	}
	if werr := <-fc.terms; werr.Code != "08P01" || werr.Message != "admin forced disconnect" {
		t.Errorf("KillClient sent %+v", werr)
	}
	if f := c2.refusal(); f['M'] != "admin forced disconnect" {
		t.Errorf("killed console client got %v", f)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if werr := <-fc.terms; werr.Code != "57P01" {
		t.Errorf("Shutdown sent %+v, want 57P01", werr)
	}
	if f := c1.refusal(); f['C'] != "57P01" {
		t.Errorf("console client got %v at shutdown", f)
	}
	if n := srv.ClientCount(); n != 0 {
		t.Errorf("ClientCount %d after shutdown", n)
	}
}
