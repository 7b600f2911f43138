package proxy

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/wire"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestLoginReadAhead: a login reads whole buffers, so what a client sends
// right behind its login, in the same packet, is read with the login's
// last message; the relay still answers it, after the welcome, on the
// event loops and without them. (With exact reads it stayed in the
// socket; a login that dropped what it read ahead would leave the client
// waiting here.)
func TestLoginReadAhead(t *testing.T) {
	for _, loops := range []string{"off", "1"} {
		t.Run("event_loops="+loops, func(t *testing.T) {
			fb := startFakeBackend(t, 64)
			rl := startRelay(t, fb, 1, func(c *config.Config) { c.EventLoops = loops })
			c := dialRaw(t, rl.addr)
			login := rawStartup(wire.CodeProtocol30, "user", "bench", "database", "bench")
			c.sendNow(append(append(login, simpleRequest...), simpleRequest...))
			c.expect('R')
			for range 3 { // the welcome, then both answers
				rows := 0
				for typ := byte(0); typ != 'Z'; {
					var err error
					if typ, _, err = c.next(); err != nil {
						t.Fatalf("after %d rows: %v", rows, err)
					}
					if typ == 'D' {
						rows++
					}
				}
			}
			if err := fb.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSSLRequestWithDataBehind: bytes that follow an SSLRequest before
// poolerd answers it would otherwise be read as if they had come over TLS
// (PostgreSQL's CVE-2021-23214): the login is refused, as PostgreSQL
// refuses it.
func TestSSLRequestWithDataBehind(t *testing.T) {
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := unreachableConfig(t, func(c *config.Config) {
		c.ClientTLSSSLMode = "prefer"
		c.ClientTLSCertFile, c.ClientTLSKeyFile, c.ClientTLSCAFile = files.ServerCert, files.ServerKey, files.CA
		c.ClientLoginTimeout = 10 * time.Second
	})
	addr := serve(t, New(cfg, zap.NewNop()))
	c := dialRaw(t, addr)
	c.sendNow(append(encryptionRequest(wire.CodeSSL), rawStartup(wire.CodeProtocol30, "user", "app", "database", "app")...))
	f := c.refusal()
	if f['S'] != "FATAL" || f['C'] != "08P01" || f['M'] != "received unencrypted data after SSL request" || f['H'] == "" {
		t.Fatalf("got %v, want FATAL 08P01 \"received unencrypted data after SSL request\" with a hint", f)
	}
}
