package main

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/poolerd/poolerd/test/pgtest"
)

// TestTLSTargets: with -tls's certificate files, poolerd and PgBouncer are
// configured to require TLS from clients and to use it to PostgreSQL, and
// pgbench runs with PGSSLMODE=require; without them, nothing changes.
func TestTLSTargets(t *testing.T) {
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pg := &pgtest.Server{Host: "127.0.0.1", Port: 5432}
	work := t.TempDir()
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	pd, err := poolerdTarget("/bin/poolerd", work, pg, 100, &files)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"POOLERD_CLIENT_TLS_SSLMODE=require", "POOLERD_SERVER_TLS_SSLMODE=require",
		"POOLERD_CLIENT_TLS_CERT_FILE=" + files.ServerCert, "POOLERD_CLIENT_TLS_KEY_FILE=" + files.ServerKey} {
		if !strings.Contains(pd.cmdline, want) {
			t.Errorf("poolerd's command line lacks %s: %s", want, pd.cmdline)
		}
	}
	if !pd.tls {
		t.Error("poolerd target: tls not set")
	}
	plain, err := poolerdTarget("/bin/poolerd", work, pg, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if plain.tls || strings.Contains(plain.cmdline, "TLS") {
		t.Errorf("plain poolerd target: %s", plain.cmdline)
	}

	pb, err := pgbouncerTarget("/bin/pgbouncer", work, pg, 100, &files, "")
	if err != nil {
		t.Skipf("pgbouncer target: %v", err) // as root without a postgres OS user
	}
	ini, err := os.ReadFile(filepath.Join(work, "pgbouncer", "pgbouncer.ini"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"client_tls_sslmode = require", "server_tls_sslmode = require",
		"client_tls_cert_file = " + filepath.Join(work, "pgbouncer", "server.crt"),
		"client_tls_key_file = " + filepath.Join(work, "pgbouncer", "server.key")} {
		if !strings.Contains(string(ini), want+"\n") {
			t.Errorf("pgbouncer.ini lacks %q:\n%s", want, ini)
		}
	}
	key, err := os.ReadFile(filepath.Join(work, "pgbouncer", "server.key"))
	if want, _ := os.ReadFile(files.ServerKey); err != nil || string(key) != string(want) {
		t.Errorf("PgBouncer's copy of the key: %v", err)
	}
	if !pb.tls {
		t.Error("pgbouncer target: tls not set")
	}

	if env := pgbenchEnv("pw", "require"); !slices.Contains(env, "PGSSLMODE=require") {
		t.Errorf("pgbench environment with TLS: %v", env)
	}
	if env := pgbenchEnv("pw", ""); !slices.Contains(env, "PGSSLMODE=disable") {
		t.Errorf("pgbench environment without TLS: %v", env)
	}
}

// TestStartTLS: the harness's own client asks for TLS with an SSLRequest,
// runs the handshake when the server answers 'S', and fails when it
// answers 'N'.
func TestStartTLS(t *testing.T) {
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, answer := range []byte{'S', 'N'} {
		client, server := net.Pipe()
		done := make(chan error, 1)
		go func() {
			defer server.Close()
			req := make([]byte, 8)
			if _, err := io.ReadFull(server, req); err != nil {
				done <- err
				return
			}
			if _, err := server.Write([]byte{answer}); err != nil || answer != 'S' {
				done <- err
				return
			}
			done <- tls.Server(server, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake()
		}()
		c, err := startTLS(client)
		switch {
		case answer == 'S' && err != nil:
			t.Fatalf("answer S: %v", err)
		case answer == 'S':
			if _, ok := c.(*tls.Conn); !ok {
				t.Fatalf("answer S: got a %T, want a TLS connection", c)
			}
			c.Close()
		case err == nil || !strings.Contains(err.Error(), "declined TLS"):
			t.Fatalf("answer N: got %v, want an error saying the server declined TLS", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("server side (answer %c): %v", answer, err)
		}
	}
}
