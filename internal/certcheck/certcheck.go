// Package certcheck verifies a TLS peer's certificate the way libpq
// (sslmode verify-ca and verify-full) and OpenLDAP's client library do, for
// poolerd's connections to PostgreSQL and to LDAP servers. It differs from
// crypto/tls's own check in one point: a certificate without any subject
// alternative name may name the host in its common name (RFC 6125's
// fallback, which Go dropped in 1.15 and libpq, OpenSSL-based poolers and
// many internal CAs still rely on). With a subject alternative name, only
// that counts, as in Go.
package certcheck

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
)

// Verify checks the peer's chain in cs against roots (nil: the system's
// CAs) and, when host is not empty, that the leaf names host.
func Verify(cs tls.ConnectionState, roots *x509.CertPool, host string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the server sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
		return err
	}
	if host == "" {
		return nil
	}
	err := leaf.VerifyHostname(host)
	if err != nil && len(leaf.DNSNames) == 0 && len(leaf.IPAddresses) == 0 && len(leaf.URIs) == 0 &&
		strings.EqualFold(leaf.Subject.CommonName, host) {
		return nil
	}
	return err
}

// Config sets c (a client configuration) to verify its peer with Verify:
// the chain against c.RootCAs, and host when not empty. crypto/tls's own
// check is turned off (InsecureSkipVerify), as Verify does it instead.
func Config(c *tls.Config, host string) {
	roots := c.RootCAs
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error { return Verify(cs, roots, host) }
}
