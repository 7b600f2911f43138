package proxy

import (
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/hba"
	"github.com/poolerd/poolerd/internal/wire"
	"github.com/poolerd/poolerd/test/pgtest"
)

// FuzzNegotiation sends arbitrary first bytes (SSLRequest, GSSENCRequest,
// a TLS ClientHello for direct TLS, startup packets, garbage) to a poolerd
// with client TLS and access rules, then closes its side: the connection
// must end (the server neither panics nor hangs until the login timeout)
// and whatever poolerd answered in plain text starts like a valid answer
// ('S', 'N', 'E' or an authentication request).
func FuzzNegotiation(f *testing.F) {
	files, err := pgtest.MakeTLSFiles(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	cfg := unreachableConfig(f, func(c *config.Config) {
		c.ClientTLSSSLMode = "prefer"
		c.ClientTLSCertFile, c.ClientTLSKeyFile, c.ClientTLSCAFile = files.ServerCert, files.ServerKey, files.CA
		c.AuthType = config.AuthHBA
		c.AuthHBARules = []hba.RuleSpec{{Type: "host", Database: "all", User: "all", Address: "all", Method: "scram-sha-256"}}
		c.ClientLoginTimeout = 5 * time.Second
		c.AuthFailureDelay = 0
	})
	srv := New(cfg, zap.NewNop())
	addr := serve(f, srv)
	startup := rawStartup(wire.CodeProtocol30, "user", "app", "database", "app")
	f.Add(append(encryptionRequest(wire.CodeSSL), startup...))
	f.Add(append(encryptionRequest(wire.CodeGSSENC), startup...))
	f.Add(append(encryptionRequest(wire.CodeSSL), encryptionRequest(wire.CodeSSL)...))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Add(startup)
	f.Add(withLen(append([]byte{0x04, 0xd2, 0x16, 0x2e}, 0, 0, 0, 1, 0, 0, 0, 2)))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(4 * time.Second))
		_, _ = c.Write(data)
		_ = c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the connection did not end after the client closed its side (read %q)", got)
		}
		if len(got) > 0 {
			switch got[0] {
			case 'S', 'N', 'E', 'R', 'v', 0x15, 0x16: // v: NegotiateProtocolVersion; 0x15, 0x16: TLS alert or handshake record (direct TLS)
			default:
				t.Fatalf("answer starts with %q", got[0])
			}
		}
	})
}
