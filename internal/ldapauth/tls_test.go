package ldapauth

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/poolerd/poolerd/test/pgtest"
)

// The server's certificate may name the host in its common name when it
// has no subject alternative name, as OpenLDAP's client library allows
// (PgBouncer's suite runs ldaps to 127.0.0.1 with such a certificate); with
// a subject alternative name, only that counts, as in Go.
func TestTLSCommonNameFallback(t *testing.T) {
	caFile, leaf, handshake := tlsFixture(t)
	t.Setenv("LDAPTLS_CACERT", caFile)
	t.Setenv("LDAPTLS_REQCERT", "")
	if err := handshake(leaf("127.0.0.1", nil)); err != nil {
		t.Errorf("no SAN, common name 127.0.0.1: %v", err)
	}
	if err := handshake(leaf("other.example", nil)); err == nil {
		t.Error("no SAN, another common name: accepted")
	}
	if err := handshake(leaf("127.0.0.1", []string{"ldap.example"})); err == nil {
		t.Error("a SAN that is not the host, common name 127.0.0.1: accepted")
	}
}

// OpenLDAP's configuration files count as its environment does: TLS_CACERT
// and TLS_REQCERT in the file $LDAPCONF names (PgBouncer's suite sets
// TLS_REQCERT never there), the environment over the file.
func TestTLSSettingsFromLDAPCONF(t *testing.T) {
	caFile, leaf, handshake := tlsFixture(t)
	t.Setenv("LDAPTLS_CACERT", "")
	t.Setenv("LDAPTLS_REQCERT", "")
	conf := filepath.Join(t.TempDir(), "ldap.conf")
	t.Setenv("LDAPCONF", conf)
	write := func(text string) {
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert := leaf("127.0.0.1", nil)
	write("# the test CA\nTLS_CACERT " + caFile + "\n")
	if err := handshake(cert); err != nil {
		t.Errorf("TLS_CACERT in $LDAPCONF: %v", err)
	}
	write("URI ldap://127.0.0.1\n")
	if err := handshake(cert); err == nil {
		t.Error("a certificate of an unknown CA accepted")
	}
	write("TLS_REQCERT\tnever\n")
	if err := handshake(cert); err != nil {
		t.Errorf("TLS_REQCERT never: %v", err)
	}
	t.Setenv("LDAPTLS_REQCERT", "demand")
	if err := handshake(cert); err == nil {
		t.Error("LDAPTLS_REQCERT demand over the file's never: a certificate of an unknown CA accepted")
	}
	t.Setenv("LDAPNOINIT", "1")
	t.Setenv("LDAPTLS_REQCERT", "")
	if err := handshake(cert); err == nil {
		t.Error("LDAPNOINIT: the file was read")
	}
}

// tlsFixture makes a CA (its file), a function that issues a server
// certificate from it, and one that runs a TLS handshake with tlsConfig
// against a server presenting a certificate.
func tlsFixture(t *testing.T) (string, func(string, []string) tls.Certificate, func(tls.Certificate) error) {
	ca, err := pgtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := ca.WriteFile(caFile); err != nil {
		t.Fatal(err)
	}
	leaf := func(cn string, dns []string) tls.Certificate {
		c, err := ca.Issue(cn, dns, nil, x509.ExtKeyUsageServerAuth)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	handshake := func(cert tls.Certificate) error {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				_ = c.(*tls.Conn).Handshake()
				c.Close()
			}
		}()
		tc, err := tlsConfig("127.0.0.1")
		if err != nil {
			return err
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), tc)
		if err == nil {
			c.Close()
		}
		return err
	}
	return caFile, leaf, handshake
}
