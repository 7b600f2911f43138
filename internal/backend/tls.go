package backend

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/poolerd/poolerd/internal/certcheck"
)

// Values of server_tls_sslmode, as libpq's sslmode and PgBouncer's
// server_tls_sslmode.
const (
	TLSDisable    = "disable"     // plain TCP only
	TLSAllow      = "allow"       // plain first; TLS if the server refuses plain
	TLSPrefer     = "prefer"      // TLS if the server offers it, else plain
	TLSRequire    = "require"     // TLS, the certificate not checked
	TLSVerifyCA   = "verify-ca"   // TLS, the certificate signed by the CA
	TLSVerifyFull = "verify-full" // verify-ca, and the certificate names the host
)

// TLS is how poolerd protects its connections to PostgreSQL.
type TLS struct {
	// Mode is one of the TLS* constants; empty means TLSDisable.
	Mode string
	// Config holds the CA pool (verify-ca, verify-full) and the client
	// certificate, if any; NewTLS builds it. The server name is set per
	// connection.
	Config *tls.Config
}

// NewTLS loads the files of a TLS policy: caFile (for verify-ca and
// verify-full; without it the system's CA certificates are trusted, as
// PgBouncer does) and a client certificate (certFile and keyFile, both or
// neither), for PostgreSQL's cert authentication.
func NewTLS(mode, caFile, certFile, keyFile string) (*TLS, error) {
	t := &TLS{Mode: mode, Config: &tls.Config{MinVersion: tls.VersionTLS12}}
	switch mode {
	case "", TLSDisable, TLSAllow, TLSPrefer, TLSRequire, TLSVerifyCA, TLSVerifyFull:
	default:
		return nil, fmt.Errorf("server_tls_sslmode %q is not disable, allow, prefer, require, verify-ca or verify-full", mode)
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("server_tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("server_tls_ca_file %s holds no PEM certificate", caFile)
		}
		t.Config.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("server_tls_cert_file and server_tls_key_file go together: set both or neither")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("server_tls_cert_file / server_tls_key_file: %w", err)
		}
		t.Config.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

func (t *TLS) mode() string {
	if t == nil || t.Mode == "" {
		return TLSDisable
	}
	return t.Mode
}

// ErrTLSRefused means the server does not accept TLS where the policy
// requires it.
var ErrTLSRefused = errors.New("the server does not accept TLS connections")

// negotiate asks the server for TLS on nc (SSLRequest) and, when it
// agrees, returns the TLS connection after the handshake. When the server
// declines, it returns nc unchanged in modes that allow plain TCP, and
// ErrTLSRefused in the others.
func (t *TLS) negotiate(nc net.Conn, host string) (net.Conn, error) {
	req := []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f} // SSLRequest
	if _, err := nc.Write(req); err != nil {
		return nil, err
	}
	var b [1]byte
	if _, err := nc.Read(b[:]); err != nil {
		return nil, err
	}
	switch b[0] {
	case 'S':
	case 'N':
		if t.mode() == TLSPrefer || t.mode() == TLSAllow {
			return nc, nil
		}
		return nil, fmt.Errorf("%w (server_tls_sslmode %s)", ErrTLSRefused, t.mode())
	default:
		return nil, fmt.Errorf("unexpected answer %q to SSLRequest", b[0])
	}
	cfg := t.Config.Clone()
	switch t.mode() {
	case TLSVerifyFull:
		// The chain, and the host in a subject alternative name or, in a
		// certificate without any, in the common name (as libpq).
		cfg.ServerName = host
		certcheck.Config(cfg, host)
	case TLSVerifyCA:
		// The chain is checked, the host name is not (as libpq's
		// verify-ca).
		certcheck.Config(cfg, "")
	default: // prefer, allow (on retry), require: encrypted, not verified
		cfg.InsecureSkipVerify = true
	}
	tc := tls.Client(nc, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("TLS handshake with the server: %w", err)
	}
	return tc, nil
}

// TLSState describes a connection's TLS ("TLSv1.3/TLS_AES_128_GCM_SHA256",
// as PgBouncer's SHOW SERVERS), or "" for plain TCP.
func TLSState(c net.Conn) string {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return ""
	}
	cs := tc.ConnectionState()
	version := map[uint16]string{tls.VersionTLS12: "TLSv1.2", tls.VersionTLS13: "TLSv1.3"}[cs.Version]
	if version == "" {
		version = tls.VersionName(cs.Version)
	}
	return version + "/" + tls.CipherSuiteName(cs.CipherSuite)
}
