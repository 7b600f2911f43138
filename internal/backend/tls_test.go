package backend

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/pgtest"
)

// negotiateWith runs TLS negotiation against a server that answers the
// SSLRequest with 'S' and presents cert; host is the name dialled.
func negotiateWith(t *testing.T, tl *TLS, cert tls.Certificate, host string) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
			return
		}
		if _, err := c.Write([]byte{'S'}); err != nil {
			return
		}
		_ = tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake()
	}()
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = tl.negotiate(nc, host)
	return err
}

// verify-full accepts a certificate that names the host in its common name
// when it has no subject alternative name, as libpq does (PgBouncer's
// suite, and many internal CAs, issue such certificates); verify-ca checks
// the chain only.
func TestVerifyFullCommonName(t *testing.T) {
	files, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := pgtest.MakeTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cnOnly, err := tls.LoadX509KeyPair(files.CNOnlyCert, files.CNOnlyKey)
	if err != nil {
		t.Fatal(err)
	}
	withSAN, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	policy := func(mode, ca string) *TLS {
		tl, err := NewTLS(mode, ca, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return tl
	}
	for _, tc := range []struct {
		name string
		tl   *TLS
		cert tls.Certificate
		host string
		ok   bool
	}{
		{"verify-full, common name only, the host", policy(TLSVerifyFull, files.CA), cnOnly, "localhost", true},
		{"verify-full, common name only, another host", policy(TLSVerifyFull, files.CA), cnOnly, "db.example", false},
		{"verify-full, SAN, the host", policy(TLSVerifyFull, files.CA), withSAN, "localhost", true},
		{"verify-full, SAN, another host", policy(TLSVerifyFull, files.CA), withSAN, "db.example", false},
		{"verify-full, another CA", policy(TLSVerifyFull, other.CA), cnOnly, "localhost", false},
		{"verify-ca, common name only, another host", policy(TLSVerifyCA, files.CA), cnOnly, "db.example", true},
		{"verify-ca, another CA", policy(TLSVerifyCA, other.CA), withSAN, "localhost", false},
	} {
		err := negotiateWith(t, tc.tl, tc.cert, tc.host)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && errors.Is(err, ErrTLSRefused) {
			t.Errorf("%s: the server's 'S' was taken for a refusal", tc.name)
		}
	}
}
