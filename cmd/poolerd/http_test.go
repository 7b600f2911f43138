package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/webtest"
)

// The tests of the HTTP server's web configuration run the real binary, as
// an operator would, and scrape it as Prometheus would.

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binary builds poolerd once for the package's tests.
func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "poolerd-bin-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "poolerd"), ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "poolerd")
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a running poolerd.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan error
}

// startPoolerd runs the binary with args (and an unreachable upstream: the
// HTTP server does not need one), without any POOLERD_ variable of the
// test's environment. It is stopped with SIGTERM when the test ends, and
// must exit 0.
func startPoolerd(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"--upstream", "postgres://app:secret@127.0.0.1:1/app",
		"--listen", freeAddr(t)}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, config.EnvPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	p := &proc{t: t, cmd: cmd, logs: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("poolerd exit: %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("no exit after SIGTERM")
		}
		if t.Failed() {
			t.Logf("poolerd output:\n%s", p.logs.String())
		}
	})
	return p
}

// get fetches url with basic auth user:password (none when user is empty).
func get(t *testing.T, c *http.Client, url, user, password string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// waitHTTP waits until url answers at all.
func (p *proc) waitHTTP(c *http.Client, url string) {
	p.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case err := <-p.done:
			p.t.Fatalf("poolerd exited: %v\n%s", err, p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s does not answer: %v\n%s", url, err, p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkScrape parses a /metrics answer as Prometheus does, and with
// promtool when it is installed.
func checkScrape(t *testing.T, header http.Header, body string) {
	t.Helper()
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("/metrics Content-Type %q", ct)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus exposition: %v", err)
	}
	for _, name := range []string{"poolerd_build_info", "poolerd_ready", "go_goroutines"} {
		if _, ok := families[name]; !ok {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	}
}

// TestHTTPBasicAuth: with a web configuration file listing a user, every
// endpoint of http_listen needs that user's password (401 without it or
// with a wrong one), /metrics with it is a valid scrape, and
// http_probe_listen serves /healthz and /readyz, and nothing else, without
// credentials. A reload with a broken file is refused and says why.
func TestHTTPBasicAuth(t *testing.T) {
	dir := t.TempDir()
	webFile := filepath.Join(dir, "web-config.yml")
	good := "basic_auth_users:\n  prometheus: " + webtest.Hash(t, "s3cret-pw") + "\n"
	webtest.Write(t, webFile, good)
	haddr, paddr := freeAddr(t), freeAddr(t)
	p := startPoolerd(t, "--http-listen", haddr, "--http-probe-listen", paddr, "--http-web-config-file", webFile)
	c := &http.Client{Timeout: 10 * time.Second}
	base, probes := "http://"+haddr, "http://"+paddr
	p.waitHTTP(c, base+"/healthz")
	p.waitHTTP(c, probes+"/healthz")

	for _, tc := range []struct{ user, password string }{{"", ""}, {"prometheus", "wrong"}, {"nobody", "s3cret-pw"}} {
		for _, path := range []string{"/metrics", "/stats", "/healthz", "/readyz"} {
			code, h, _ := get(t, c, base+path, tc.user, tc.password)
			if code != http.StatusUnauthorized {
				t.Errorf("%s as %q/%q: %d, want 401", path, tc.user, tc.password, code)
			}
			if h.Get("WWW-Authenticate") == "" {
				t.Errorf("%s: 401 without WWW-Authenticate", path)
			}
		}
	}
	code, h, body := get(t, c, base+"/metrics", "prometheus", "s3cret-pw")
	if code != http.StatusOK {
		t.Fatalf("/metrics with the right password: %d %s", code, body)
	}
	checkScrape(t, h, body)
	if code, _, body := get(t, c, base+"/healthz", "prometheus", "s3cret-pw"); code != http.StatusOK {
		t.Errorf("/healthz with the right password: %d %s", code, body)
	}

	// The probe listener: no credentials, only the probes.
	if code, _, body := get(t, c, probes+"/healthz", "", ""); code != http.StatusOK || !strings.Contains(body, "alive") {
		t.Errorf("probe /healthz: %d %s", code, body)
	}
	// Not ready (PostgreSQL is unreachable) but answered: 503 with the reason.
	if code, _, body := get(t, c, probes+"/readyz", "", ""); (code != http.StatusOK && code != http.StatusServiceUnavailable) || !strings.Contains(body, "status") {
		t.Errorf("probe /readyz: %d %s", code, body)
	}
	for _, path := range []string{"/metrics", "/stats", "/debug/pprof/"} {
		if code, _, _ := get(t, c, probes+path, "", ""); code != http.StatusNotFound {
			t.Errorf("probe listener %s: %d, want 404", path, code)
		}
	}

	// A broken file: SIGHUP reports it and keeps the running configuration.
	webtest.Write(t, webFile, "basic_auth_users:\n  prometheus: s3cret-pw\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.logs.String(), "configuration reload failed") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload failure logged:\n%s", p.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if logs := p.logs.String(); !strings.Contains(logs, "http_web_config_file "+webFile) || !strings.Contains(logs, "bcrypt") {
		t.Errorf("the reload failure does not say what is wrong with the file:\n%s", logs)
	}
	webtest.Write(t, webFile, good)
	if code, _, _ := get(t, c, base+"/metrics", "prometheus", "s3cret-pw"); code != http.StatusOK {
		t.Errorf("/metrics after the file was repaired: %d", code)
	}
	if strings.Contains(p.logs.String(), "s3cret-pw") {
		t.Errorf("the password was logged:\n%s", p.logs.String())
	}
}

// TestHTTPTLS: with tls_server_config, http_listen speaks HTTPS only, with
// the configured certificate, and basic auth on top.
func TestHTTPTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key, pool := webtest.SelfSigned(t, dir)
	webFile := filepath.Join(dir, "web-config.yml")
	webtest.Write(t, webFile, fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n  prometheus: %s\n",
		filepath.Base(cert), filepath.Base(key), webtest.Hash(t, "s3cret-pw")))
	haddr := freeAddr(t)
	p := startPoolerd(t, "--http-listen", haddr, "--http-web-config-file", webFile)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + haddr
	p.waitHTTP(c, base+"/healthz")

	if code, _, _ := get(t, c, base+"/metrics", "", ""); code != http.StatusUnauthorized {
		t.Errorf("HTTPS /metrics without credentials: %d, want 401", code)
	}
	code, h, body := get(t, c, base+"/metrics", "prometheus", "s3cret-pw")
	if code != http.StatusOK {
		t.Fatalf("HTTPS /metrics: %d %s", code, body)
	}
	checkScrape(t, h, body)

	// Plain HTTP is not served.
	if code, _, _ := get(t, &http.Client{Timeout: 10 * time.Second}, "http://"+haddr+"/metrics", "prometheus", "s3cret-pw"); code != http.StatusBadRequest {
		t.Errorf("plain HTTP to the TLS port: %d, want 400", code)
	}
	// A client that does not trust the certificate fails the handshake.
	_, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}}).Get(base + "/healthz")
	if err == nil {
		t.Error("an untrusted certificate was accepted")
	}
}

// TestBrokenWebConfigAtStartup: poolerd refuses to start with a broken web
// configuration file, and says which key and what is wrong.
func TestBrokenWebConfigAtStartup(t *testing.T) {
	webFile := filepath.Join(t.TempDir(), "web-config.yml")
	webtest.Write(t, webFile, "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
	var out, errb bytes.Buffer
	code := run([]string{"--upstream", "postgres://app:secret@127.0.0.1:1/app", "--listen", freeAddr(t),
		"--http-listen", freeAddr(t), "--http-web-config-file", webFile}, &out, &errb)
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, errb.String())
	}
	for _, want := range []string{"http_web_config_file " + webFile, "missing.crt"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("error output does not mention %q:\n%s", want, errb.String())
		}
	}
}
