package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLSFiles are the PEM files of a throwaway certificate authority and the
// certificates it signed for an SSL-enabled test server (Options.SSL).
type TLSFiles struct {
	// CA is the authority's certificate (sslrootcert, server_tls_ca_file).
	CA string
	// ServerCert and ServerKey are PostgreSQL's, for "localhost" and
	// 127.0.0.1.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate for RoleApp (CN),
	// for PostgreSQL's cert authentication.
	ClientCert, ClientKey string
	// CNOnlyCert and CNOnlyKey are a server certificate that names
	// "localhost" in its common name only, without a subject alternative
	// name (as older internal CAs issue them).
	CNOnlyCert, CNOnlyKey string
}

// CA is a throwaway certificate authority: it signs certificates for
// tests (MakeTLSFiles, and tests that need a certificate of a given shape).
type CA struct {
	// Cert and DER are the authority's own certificate.
	Cert *x509.Certificate
	DER  []byte
	key  *ecdsa.PrivateKey
	// serial numbers the certificates it issues.
	serial int64
}

// NewCA makes a new authority, valid from an hour ago for a day.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pgtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, DER: der, key: key, serial: 1}, nil
}

// Pool is a certificate pool holding the authority.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteFile writes the authority's certificate to path (PEM).
func (ca *CA) WriteFile(path string) error { return writePEM(path, "CERTIFICATE", ca.DER) }

// Issue signs a certificate with common name cn, the subject alternative
// names dns and ips (none: a certificate that names its host in its common
// name only), for usage (server or client authentication). The result's
// Leaf is set.
func (ca *CA) Issue(cn string, dns []string, ips []net.IP, usage x509.ExtKeyUsage) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	ca.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: cn},
		DNSNames: dns, IPAddresses: ips, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// issueFiles is Issue written to certFile and keyFile (PEM).
func (ca *CA) issueFiles(cn string, dns []string, ips []net.IP, usage x509.ExtKeyUsage, certFile, keyFile string) error {
	c, err := ca.Issue(cn, dns, ips, usage)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", c.Certificate[0]); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", kder)
}

// MakeTLSFiles writes a new CA, a server certificate for localhost and
// 127.0.0.1, a client certificate for RoleApp, and a server certificate
// naming localhost in its common name only into dir.
func MakeTLSFiles(dir string) (TLSFiles, error) {
	f := TLSFiles{CA: filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
		CNOnlyCert: filepath.Join(dir, "cn-only.crt"), CNOnlyKey: filepath.Join(dir, "cn-only.key")}
	ca, err := NewCA()
	if err != nil {
		return f, err
	}
	if err := ca.WriteFile(f.CA); err != nil {
		return f, err
	}
	if err := ca.issueFiles("localhost", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")},
		x509.ExtKeyUsageServerAuth, f.ServerCert, f.ServerKey); err != nil {
		return f, fmt.Errorf("pgtest: server certificate: %w", err)
	}
	if err := ca.issueFiles(RoleApp, nil, nil, x509.ExtKeyUsageClientAuth, f.ClientCert, f.ClientKey); err != nil {
		return f, fmt.Errorf("pgtest: client certificate: %w", err)
	}
	if err := ca.issueFiles("localhost", nil, nil, x509.ExtKeyUsageServerAuth, f.CNOnlyCert, f.CNOnlyKey); err != nil {
		return f, fmt.Errorf("pgtest: common-name-only certificate: %w", err)
	}
	return f, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
