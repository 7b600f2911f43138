package certcheck

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"github.com/poolerd/poolerd/test/pgtest"
)

func TestVerify(t *testing.T) {
	ca, err := pgtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other, err := pgtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(cn string, dns []string, ips []net.IP) tls.ConnectionState {
		c, err := ca.Issue(cn, dns, ips, x509.ExtKeyUsageServerAuth)
		if err != nil {
			t.Fatal(err)
		}
		return tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.Leaf}}
	}
	for _, tc := range []struct {
		name  string
		cs    tls.ConnectionState
		roots *x509.CertPool
		host  string
		ok    bool
	}{
		{"no SAN, common name is the host", leaf("localhost", nil, nil), ca.Pool(), "localhost", true},
		{"no SAN, common name is the host in other case", leaf("LocalHost", nil, nil), ca.Pool(), "localhost", true},
		{"no SAN, common name is the IP", leaf("127.0.0.1", nil, nil), ca.Pool(), "127.0.0.1", true},
		{"no SAN, another common name", leaf("db.example", nil, nil), ca.Pool(), "localhost", false},
		{"a SAN that is not the host, common name the host", leaf("localhost", []string{"db.example"}, nil), ca.Pool(), "localhost", false},
		{"an IP SAN that is not the host, common name the host", leaf("localhost", nil, []net.IP{net.ParseIP("10.0.0.1")}), ca.Pool(), "localhost", false},
		{"the SAN names the host", leaf("whatever", []string{"localhost"}, nil), ca.Pool(), "localhost", true},
		{"another CA", leaf("localhost", nil, nil), other.Pool(), "localhost", false},
		{"chain only (verify-ca), any name", leaf("db.example", nil, nil), ca.Pool(), "", true},
		{"no certificate", tls.ConnectionState{}, ca.Pool(), "", false},
	} {
		err := Verify(tc.cs, tc.roots, tc.host)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
