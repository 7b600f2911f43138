package pgbini

import (
	"fmt"
	"strings"
	"testing"
)

// SetKeys takes PgBouncer's names and units for the console's SET.
func TestSetKeys(t *testing.T) {
	for _, c := range []struct{ key, value, wantKey, wantValue, err string }{
		{"server_idle_timeout", "30", "idle_timeout", "30s", ""},
		{"query_timeout", "1", "query_timeout", "1s", ""},
		{"query_timeout", "1.5", "query_timeout", "1.5s", ""},
		{"query_timeout", "500ms", "query_timeout", "500ms", ""},
		{"query_wait_timeout", "120", "checkout_timeout", "2m", ""},
		{"default_pool_size", "20", "max_size", "20", ""},
		{"max_size", "20", "max_size", "20", ""},
		{"log_connections", "0", "log_connections", "false", ""},
		{"verbose", "2", "log_level", "debug", ""},
		{"verbose", "0", "log_level", "info", ""},
		{"server_login_retry", "5", "reconnect_backoff_max", "5s", ""},
		{"admin_users", "a, b", "admin_users", "a,b", ""},
		{"no_such_key", "1", "no_such_key", "1", ""},
		{"tcp_user_timeout", "2500", "tcp_user_timeout", "2.5s", ""}, // PgBouncer's milliseconds
		{"tcp_keepidle", "60", "tcp_keepidle", "1m", ""},
		{"tcp_keepalive", "0", "tcp_keepalive", "false", ""},
		{"tcp_user_timeout", "soon", "", "", "not a time in milliseconds"},
		{"query_timeout", "-1", "", "", "not a time in seconds"},
		{"unix_socket_dir", "/tmp", "unix_socket_dir", "/tmp", ""}, // then refused: restart only
		{"pkt_buf", "4096", "", "", "no equivalent in poolerd"},
		{"listen_port", "7000", "", "", "configuration file"},
		{"verbose", "lots", "", "", "not a verbosity"},
	} {
		var k, v string
		kv, err := SetKeys(c.key, c.value)
		if err == nil {
			k, v = kv[0].Key, fmt.Sprint(kv[0].Value)
		}
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("SetKeys(%q, %q) = %q, %q, %v; want an error with %q", c.key, c.value, k, v, err, c.err)
			}
			continue
		}
		if err != nil || k != c.wantKey || v != c.wantValue {
			t.Errorf("SetKeys(%q, %q) = %q, %q, %v; want %q, %q", c.key, c.value, k, v, err, c.wantKey, c.wantValue)
		}
	}
	// server_lifetime 0 is PgBouncer's single use; a number of seconds
	// is a lifetime, and turns single use off again.
	for value, want := range map[string]string{"3600": "[{max_lifetime 1h} {max_uses 0}]", "0": "[{max_lifetime 0s} {max_uses 1}]"} {
		kv, err := SetKeys("SERVER_LIFETIME", value)
		if got := fmt.Sprint(kv); err != nil || got != want {
			t.Errorf("SetKeys(server_lifetime, %s) = %s, %v; want %s", value, got, err, want)
		}
	}
}
