package config

import (
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/poolerd/poolerd/test/webtest"
)

// TestHTTPListenDefaultsToLoopback: without configuration the HTTP server
// (metrics, /stats, pprof) is reachable from this host only; deployments
// that need Prometheus to scrape the pod or host address say so.
func TestHTTPListenDefaultsToLoopback(t *testing.T) {
	c, err := load(t, "", "--upstream", "postgres://app:secret@127.0.0.1:5432/app")
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPListen != "127.0.0.1:9930" {
		t.Fatalf("http_listen defaults to %q, want 127.0.0.1:9930", c.HTTPListen)
	}
	host, _, err := net.SplitHostPort(c.HTTPListen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("http_listen default %q is not a loopback address", c.HTTPListen)
	}
	if c.HTTPProbeListen != "" || c.HTTPWebConfigFile != "" {
		t.Fatalf("http_probe_listen %q, http_web_config_file %q: want both empty by default", c.HTTPProbeListen, c.HTTPWebConfigFile)
	}
}

// TestWebConfigFile: the file is checked when the configuration is loaded
// (at startup and on every reload), with the same checks a Prometheus
// exporter makes; a broken file is a configuration error naming the key
// and the problem.
func TestWebConfigFile(t *testing.T) {
	dir := t.TempDir()
	cert, key, _ := webtest.SelfSigned(t, dir)
	hash := webtest.Hash(t, "s3cret")
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		webtest.Write(t, p, content)
		return p
	}
	const up = "upstream: postgres://app:secret@db/app\n"
	for _, tc := range []struct {
		name, content, want string
	}{
		{"basic auth", "basic_auth_users:\n  prometheus: " + hash + "\n", ""},
		{"TLS and basic auth", "tls_server_config:\n  cert_file: " + cert + "\n  key_file: " + key + "\n" +
			"basic_auth_users:\n  prometheus: " + hash + "\n", ""},
		{"TLS, paths relative to the file", "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n", ""},
		{"empty file", "", ""},
		{"unknown key", "basic_auth_user:\n  prometheus: " + hash + "\n", "basic_auth_user"},
		{"plain password", "basic_auth_users:\n  prometheus: s3cret\n", "bcrypt"},
		{"missing certificate", "tls_server_config:\n  cert_file: nosuch.crt\n  key_file: " + key + "\n", "nosuch.crt"},
		{"key without certificate", "tls_server_config:\n  key_file: " + key + "\n", "missing one of cert or cert_file"},
		{"bad YAML", "basic_auth_users: [\n", "yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := file(strings.ReplaceAll(tc.name, " ", "_")+".yml", tc.content)
			c, err := load(t, up+"http_web_config_file: "+p+"\n")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid web configuration refused: %v", err)
				}
				if c.HTTPWebConfigFile != p {
					t.Fatalf("http_web_config_file %q", c.HTTPWebConfigFile)
				}
				return
			}
			if err == nil {
				t.Fatal("broken web configuration accepted")
			}
			msg := err.Error()
			for _, w := range []string{"http_web_config_file " + p, "POOLERD_HTTP_WEB_CONFIG_FILE", tc.want} {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			if strings.Contains(msg, "s3cret") {
				t.Errorf("error %q shows the password", msg)
			}
		})
	}
	t.Run("no such file", func(t *testing.T) {
		_, err := load(t, "", "--upstream", "postgres://app:secret@db/app", "--http-web-config-file", filepath.Join(dir, "nope.yml"))
		if err == nil || !strings.Contains(err.Error(), "nope.yml") || !strings.Contains(err.Error(), "no such file") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestHTTPProbeListen(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	c, err := load(t, up+"http_listen: 0.0.0.0:9930\nhttp_probe_listen: 0.0.0.0:9931\n")
	if err != nil || c.HTTPProbeListen != "0.0.0.0:9931" {
		t.Fatalf("%v %q", err, c.HTTPProbeListen)
	}
	if _, err := load(t, up+"http_listen: \"\"\nhttp_probe_listen: 0.0.0.0:9931\n"); err != nil {
		t.Fatalf("probes without the main HTTP server: %v", err)
	}
	for yaml, want := range map[string]string{
		up + "http_probe_listen: 9931\n":                                    "http_probe_listen \"9931\" is not host:port",
		up + "http_listen: 0.0.0.0:9930\nhttp_probe_listen: 0.0.0.0:9930\n": "same address as http_listen",
	} {
		if _, err := load(t, yaml); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", yaml, err, want)
		}
	}
}

// listen takes several addresses and * for every address; the Unix
// socket's keys are checked.
func TestListenersConfig(t *testing.T) {
	const up = "upstream: postgres://app:secret@db/app\n"
	c, err := load(t, up+"listen: '127.0.0.1:6432, *:6433,[::1]:6434'\nunix_socket_dir: /run/poolerd\nunix_socket_mode: '0770'\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ListenAddrs(); !slices.Equal(got, []string{"127.0.0.1:6432", ":6433", "[::1]:6434"}) {
		t.Errorf("ListenAddrs %q", got)
	}
	if c.UnixSocketPerm() != 0o770 || c.UnixSocketPath(6432) != "/run/poolerd/.s.PGSQL.6432" {
		t.Errorf("Unix socket %v %q", c.UnixSocketPerm(), c.UnixSocketPath(6432))
	}
	if d := Defaults(); d.UnixSocketPath(6432) != "" || d.UnixSocketPerm() != 0o777 {
		t.Errorf("defaults: %q %v, want no Unix socket, mode 0777", d.UnixSocketPath(6432), d.UnixSocketPerm())
	}
	for yaml, want := range map[string]string{
		up + "listen: 127.0.0.1:6432,6433\n":                             `listen address "6433" is not host:port`,
		up + "listen: 127.0.0.1:6432,127.0.0.1:6432\n":                   `listen names "127.0.0.1:6432" twice`,
		up + "listen: ' , '\n":                                           "listen is empty",
		up + "unix_socket_dir: /run/x\nunix_socket_mode: rw\n":           `unix_socket_mode "rw" is not an octal file mode`,
		up + "unix_socket_dir: /run/x\nunix_socket_mode: '01777'\n":      `unix_socket_mode "01777" is not an octal file mode`,
		up + "unix_socket_dir: run/x\n":                                  `unix_socket_dir "run/x" is not an absolute path`,
		up + "unix_socket_group: staff\n":                                "unix_socket_group \"staff\" is set without unix_socket_dir",
		up + "peer_id: 16384\n":                                          "peer_id 16384 is out of range",
		up + "peers: [{id: 2, host: h}]\n":                               "peers is set but peer_id is 0",
		up + "peer_id: 1\npeers: [{id: 2, host: h}, {id: 2, host: g}]\n": "id 2 is listed twice",
		up + "peer_id: 1\npeers: [{id: 0, host: h}]\n":                   "id 0 is out of range",
		up + "peer_id: 1\npeers: [{id: 2}]\n":                            "host is empty",
		up + "peer_id: 1\npeers: [{id: 2, host: h, port: 70000}]\n":      "port 70000 is not a TCP port",
	} {
		if _, err := load(t, yaml); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", yaml, err, want)
		}
	}
}
