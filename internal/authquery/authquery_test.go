package authquery

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/auth"
)

// fakeConn answers with canned server messages and records what was sent.
type fakeConn struct {
	in  io.Reader
	out bytes.Buffer
}

func (f *fakeConn) Read(p []byte) (int, error)  { return f.in.Read(p) }
func (f *fakeConn) Write(p []byte) (int, error) { return f.out.Write(p) }

func answer(msgs ...pgproto3.BackendMessage) *fakeConn {
	var b []byte
	for _, m := range msgs {
		b, _ = m.Encode(b)
	}
	return &fakeConn{in: bytes.NewReader(b)}
}

const scramSecret = "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0c2FsdA==$" +
	"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="

func TestLookup(t *testing.T) {
	ok := []pgproto3.BackendMessage{&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}}
	rfq := &pgproto3.ReadyForQuery{TxStatus: 'I'}
	for _, tc := range []struct {
		name  string
		msgs  []pgproto3.BackendMessage
		found bool
		kind  auth.SecretKind
		err   string
	}{
		{"scram", append(ok, &pgproto3.DataRow{Values: [][]byte{[]byte("alice"), []byte(scramSecret)}}, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, rfq), true, auth.SecretSCRAM, ""},
		{"md5", append(ok, &pgproto3.DataRow{Values: [][]byte{[]byte("alice"), []byte("md5" + strings.Repeat("a", 32))}}, rfq), true, auth.SecretMD5, ""},
		{"expired", append(ok, &pgproto3.DataRow{Values: [][]byte{[]byte("alice"), nil}}, rfq), true, 0, ""},
		{"no row", append(ok, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 0")}, rfq), false, 0, ""},
		{"two rows", append(ok, &pgproto3.DataRow{Values: [][]byte{[]byte("alice"), []byte("x")}}, &pgproto3.DataRow{Values: [][]byte{[]byte("alice"), []byte("y")}}, rfq), false, 0, "more than one row"},
		{"one column", append(ok, &pgproto3.DataRow{Values: [][]byte{[]byte("alice")}}, rfq), false, 0, "columns"},
		{"another user", append(ok, &pgproto3.DataRow{Values: [][]byte{[]byte("bob"), []byte("x")}}, rfq), false, 0, "another user"},
		{"error", []pgproto3.BackendMessage{&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42501", Message: "permission denied for table pg_authid"}, rfq}, false, 0, "42501"},
		{"cut short", ok, false, 0, "read the answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := answer(tc.msgs...)
			s, found, err := Lookup(c, "SELECT $1", "alice")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || found != tc.found || s.Kind() != tc.kind {
				t.Fatalf("got %v %v %v", s.Kind(), found, err)
			}
			if !bytes.Contains(c.out.Bytes(), []byte("alice")) {
				t.Error("the user was not sent as $1")
			}
		})
	}
}

func TestCache(t *testing.T) {
	var c Cache
	now := time.Now()
	s, _ := auth.ParseSecret("pw")
	c.Put("k", s, now)
	if _, ok := c.Get("k", time.Minute, now.Add(59*time.Second)); !ok {
		t.Error("missing before the TTL")
	}
	if _, ok := c.Get("k", time.Minute, now.Add(time.Minute)); ok {
		t.Error("kept past the TTL")
	}
	if _, ok := c.Get("k", 0, now); ok {
		t.Error("a TTL of 0 kept it")
	}
	c.Clear()
	if _, ok := c.Get("k", time.Hour, now); ok {
		t.Error("kept after Clear")
	}
}

// FuzzLookup: no answer from a (hostile or broken) server makes Lookup
// panic or hang; it ends with a result or an error.
func FuzzLookup(f *testing.F) {
	var seed []byte
	for _, m := range []pgproto3.BackendMessage{&pgproto3.ParseComplete{}, &pgproto3.BindComplete{},
		&pgproto3.DataRow{Values: [][]byte{[]byte("alice"), []byte(scramSecret)}}, &pgproto3.ReadyForQuery{TxStatus: 'I'}} {
		seed, _ = m.Encode(seed)
	}
	f.Add(seed)
	f.Add([]byte("E\x00\x00\x00\x08S\x00\x00\x00Z\x00\x00\x00\x05I"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _, _ = Lookup(&fakeConn{in: bytes.NewReader(data)}, "SELECT $1", "alice")
	})
}
