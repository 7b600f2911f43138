package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// MakeTLSFiles writes a new CA, a server certificate for localhost and
// 127.0.0.1, a client certificate for RoleApp, and a server certificate
// naming localhost in its common name only into dir.
func MakeTLSFiles(dir string) (TLSFiles, error) {
	f := TLSFiles{CA: filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
		CNOnlyCert: filepath.Join(dir, "cn-only.crt"), CNOnlyKey: filepath.Join(dir, "cn-only.key")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pgtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return f, err
	}
	issue := func(serial int64, tmpl *x509.Certificate, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "EC PRIVATE KEY", kder)
	}
	if err := issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		f.ServerCert, f.ServerKey); err != nil {
		return f, fmt.Errorf("pgtest: server certificate: %w", err)
	}
	if err := issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: RoleApp},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, f.ClientCert, f.ClientKey); err != nil {
		return f, fmt.Errorf("pgtest: client certificate: %w", err)
	}
	if err := issue(4, &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, f.CNOnlyCert, f.CNOnlyKey); err != nil {
		return f, fmt.Errorf("pgtest: common-name-only certificate: %w", err)
	}
	return f, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
