package certcheck

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

func TestVerify(t *testing.T) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	other := x509.NewCertPool()
	leaf := func(serial int64, cn string, dns []string, ips []net.IP) tls.ConnectionState {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
			IPAddresses: ips, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}
	}
	for _, tc := range []struct {
		name  string
		cs    tls.ConnectionState
		roots *x509.CertPool
		host  string
		ok    bool
	}{
		{"no SAN, common name is the host", leaf(2, "localhost", nil, nil), roots, "localhost", true},
		{"no SAN, common name is the host in other case", leaf(3, "LocalHost", nil, nil), roots, "localhost", true},
		{"no SAN, common name is the IP", leaf(4, "127.0.0.1", nil, nil), roots, "127.0.0.1", true},
		{"no SAN, another common name", leaf(5, "db.example", nil, nil), roots, "localhost", false},
		{"a SAN that is not the host, common name the host", leaf(6, "localhost", []string{"db.example"}, nil), roots, "localhost", false},
		{"an IP SAN that is not the host, common name the host", leaf(7, "localhost", nil, []net.IP{net.ParseIP("10.0.0.1")}), roots, "localhost", false},
		{"the SAN names the host", leaf(8, "whatever", []string{"localhost"}, nil), roots, "localhost", true},
		{"another CA", leaf(9, "localhost", nil, nil), other, "localhost", false},
		{"chain only (verify-ca), any name", leaf(10, "db.example", nil, nil), roots, "", true},
		{"no certificate", tls.ConnectionState{}, roots, "", false},
	} {
		err := Verify(tc.cs, tc.roots, tc.host)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
