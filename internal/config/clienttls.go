package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientTLS builds the TLS configuration poolerd serves clients with, from
// client_tls_sslmode and its files; nil when client_tls_sslmode is
// disable. Validate calls it, so that a file that does not load is a
// configuration error; the proxy calls it again at start and on reload.
func ClientTLS(c *Config) (*tls.Config, error) {
	mode := c.ClientTLSSSLMode
	switch mode {
	case "disable":
		return nil, nil
	case "allow", "prefer", "require", "verify-ca", "verify-full":
	default:
		return nil, fmt.Errorf("client_tls_sslmode %q is not disable, allow, prefer, require, verify-ca or verify-full", mode)
	}
	if c.ClientTLSCertFile == "" || c.ClientTLSKeyFile == "" {
		return nil, fmt.Errorf("client_tls_sslmode %s needs client_tls_cert_file and client_tls_key_file, the certificate poolerd presents to clients", mode)
	}
	cert, err := tls.LoadX509KeyPair(c.ClientTLSCertFile, c.ClientTLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("client_tls_cert_file / client_tls_key_file: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	if cfg.MinVersion, cfg.MaxVersion, err = TLSProtocols(c.ClientTLSProtocols); err != nil {
		return nil, fmt.Errorf("client_tls_protocols: %w", err)
	}
	if cfg.CipherSuites, err = TLSCiphers(c.ClientTLSCiphers); err != nil {
		return nil, fmt.Errorf("client_tls_ciphers: %w", err)
	}
	if cfg.CurvePreferences, err = TLSCurves(c.ClientTLSECDHCurve); err != nil {
		return nil, fmt.Errorf("client_tls_ecdhcurve: %w", err)
	}
	if c.ClientTLSCAFile != "" {
		pem, err := os.ReadFile(c.ClientTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("client_tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client_tls_ca_file %s holds no PEM certificate", c.ClientTLSCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if mode == "verify-ca" || mode == "verify-full" {
		if cfg.ClientCAs == nil {
			return nil, fmt.Errorf("client_tls_sslmode %s needs client_tls_ca_file, the CA that signs client certificates", mode)
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
