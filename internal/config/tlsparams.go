package config

import (
	"crypto/tls"
	"fmt"
	"strings"
)

// tlsVersion is a TLS version by the name client_tls_protocols gives it.
type tlsVersion struct {
	name    string
	version uint16
}

// tlsVersions are the names client_tls_protocols takes, PgBouncer's.
func tlsVersions() [4]tlsVersion {
	return [4]tlsVersion{{"tlsv1.0", tls.VersionTLS10}, {"tlsv1.1", tls.VersionTLS11}, {"tlsv1.2", tls.VersionTLS12}, {"tlsv1.3", tls.VersionTLS13}}
}

// TLSProtocols reads client_tls_protocols: TLS versions separated by
// commas or blanks (tlsv1.0, tlsv1.1, tlsv1.2, tlsv1.3), or secure
// (tlsv1.2 and tlsv1.3), all or legacy (every version), as PgBouncer
// takes them. Go sets a range of versions, so the versions named must be
// contiguous.
func TLSProtocols(v string) (minV, maxV uint16, err error) {
	versions := tlsVersions()
	var on [4]bool
	words := strings.FieldsFunc(strings.ToLower(v), func(r rune) bool { return r == ',' || r == ' ' || r == ':' })
	if len(words) == 0 {
		return 0, 0, fmt.Errorf("empty: use secure (TLS 1.2 and 1.3), all, or versions like tlsv1.2,tlsv1.3")
	}
	for _, w := range words {
		switch w {
		case "secure", "default":
			on[2], on[3] = true, true
		case "all", "legacy":
			on = [4]bool{true, true, true, true}
		default:
			found := false
			for i, tv := range versions {
				if tv.name == w {
					on[i], found = true, true
				}
			}
			if !found {
				return 0, 0, fmt.Errorf("%q is not tlsv1.0, tlsv1.1, tlsv1.2, tlsv1.3, secure, all or legacy", w)
			}
		}
	}
	first, last := -1, -1
	for i, b := range on {
		if b {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	for i := first; i <= last; i++ {
		if !on[i] {
			return 0, 0, fmt.Errorf("client_tls_protocols %q leaves out %s between the versions it names: poolerd (Go's crypto/tls) accepts a range of versions; name %s too", v, versions[i].name, versions[i].name)
		}
	}
	return versions[first].version, versions[last].version, nil
}

// openSSLSuites maps OpenSSL's names of the TLS 1.2 (and older) cipher
// suites Go implements to Go's.
func openSSLSuites() map[string]uint16 {
	return map[string]uint16{
		"ECDHE-ECDSA-AES128-GCM-SHA256": tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		"ECDHE-RSA-AES128-GCM-SHA256":   tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		"ECDHE-ECDSA-AES256-GCM-SHA384": tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		"ECDHE-RSA-AES256-GCM-SHA384":   tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		"ECDHE-ECDSA-CHACHA20-POLY1305": tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		"ECDHE-RSA-CHACHA20-POLY1305":   tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
		"ECDHE-ECDSA-AES128-SHA":        tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA,
		"ECDHE-RSA-AES128-SHA":          tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
		"ECDHE-ECDSA-AES256-SHA":        tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
		"ECDHE-RSA-AES256-SHA":          tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA,
		"ECDHE-ECDSA-AES128-SHA256":     tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256,
		"ECDHE-RSA-AES128-SHA256":       tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256,
		"AES128-GCM-SHA256":             tls.TLS_RSA_WITH_AES_128_GCM_SHA256,
		"AES256-GCM-SHA384":             tls.TLS_RSA_WITH_AES_256_GCM_SHA384,
		"AES128-SHA":                    tls.TLS_RSA_WITH_AES_128_CBC_SHA,
		"AES256-SHA":                    tls.TLS_RSA_WITH_AES_256_CBC_SHA,
		"AES128-SHA256":                 tls.TLS_RSA_WITH_AES_128_CBC_SHA256,
		"ECDHE-RSA-DES-CBC3-SHA":        tls.TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA,
		"DES-CBC3-SHA":                  tls.TLS_RSA_WITH_3DES_EDE_CBC_SHA,
	}
}

// TLSCiphers reads client_tls_ciphers: PgBouncer's keywords, or a list of
// cipher suite names (OpenSSL's, like ECDHE-RSA-AES128-GCM-SHA256, or
// Go's and IANA's, like TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256) separated
// by colons, commas or blanks. nil means Go's default suites. They apply
// to TLS 1.2 and older: Go does not let TLS 1.3 suites be chosen.
func TLSCiphers(v string) ([]uint16, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "default", "normal", "":
		return nil, nil
	case "secure", "fast":
		// Forward secrecy and AEAD only (libtls's secure set).
		return []uint16{
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		}, nil
	case "all", "legacy", "compat", "insecure":
		var out []uint16
		for _, s := range tls.CipherSuites() {
			out = append(out, s.ID)
		}
		for _, s := range tls.InsecureCipherSuites() {
			out = append(out, s.ID)
		}
		return out, nil
	}
	byName := map[string]uint16{}
	for _, s := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		byName[s.Name] = s.ID
	}
	openSSL := openSSLSuites()
	var out []uint16
	for _, w := range strings.FieldsFunc(v, func(r rune) bool { return r == ':' || r == ',' || r == ' ' }) {
		if id, ok := openSSL[strings.ToUpper(w)]; ok {
			out = append(out, id)
			continue
		}
		if id, ok := byName[strings.ToUpper(w)]; ok {
			if isTLS13Suite(id) {
				return nil, fmt.Errorf("%s is a TLS 1.3 suite, which Go's crypto/tls does not let poolerd choose (all three are always on): list TLS 1.2 suites only", w)
			}
			out = append(out, id)
			continue
		}
		return nil, fmt.Errorf("%q is not a cipher suite poolerd knows: use default, secure, fast, normal, all, or OpenSSL names like ECDHE-RSA-AES128-GCM-SHA256 (OpenSSL's HIGH, !aNULL and other expressions are not supported)", w)
	}
	return out, nil
}

func isTLS13Suite(id uint16) bool {
	switch id {
	case tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384, tls.TLS_CHACHA20_POLY1305_SHA256:
		return true
	}
	return false
}

// TLSCurves reads client_tls_ecdhcurve: auto (Go's choice: X25519, P-256,
// P-384, P-521 and the post-quantum hybrid) or a list of curves by
// OpenSSL's or Go's names, in order of preference (PgBouncer takes one).
func TLSCurves(v string) ([]tls.CurveID, error) {
	if w := strings.ToLower(strings.TrimSpace(v)); w == "" || w == "auto" {
		return nil, nil
	}
	names := map[string]tls.CurveID{
		"x25519": tls.X25519, "prime256v1": tls.CurveP256, "secp256r1": tls.CurveP256, "p-256": tls.CurveP256,
		"secp384r1": tls.CurveP384, "p-384": tls.CurveP384, "secp521r1": tls.CurveP521, "p-521": tls.CurveP521,
	}
	var out []tls.CurveID
	for _, w := range strings.FieldsFunc(v, func(r rune) bool { return r == ':' || r == ',' || r == ' ' }) {
		id, ok := names[strings.ToLower(w)]
		if !ok {
			return nil, fmt.Errorf("%q is not a curve poolerd knows: use auto, or x25519, prime256v1 (secp256r1), secp384r1, secp521r1", w)
		}
		out = append(out, id)
	}
	return out, nil
}
