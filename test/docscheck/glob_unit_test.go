package docscheck

import "testing"

func TestMatches(t *testing.T) {
	for _, c := range []struct {
		code, doc string
		want      bool
	}{
		{"no server connection available within checkout_timeout (%s)", "no server connection available within checkout_timeout (30s)", true},
		{"no server connection available within checkout_timeout (%s)", "no server connection available within checkout_timeout (X)", true},
		{"no server connection available within checkout_timeout (%s)", "no server connection available within checkout_timeout", false},
		{"no server connection available within checkout_timeout (%s)", "no connection available within checkout_timeout (30s)", false},
		{"rate limit exceeded: rule %q, bucket %s", `rate limit exceeded: rule "…", bucket …`, true},
		{"rate limit exceeded: rule %q, bucket %s", `rate limit exceeded: rule "NAME", bucket BUCKET`, true},
		{"possible connection leak: client has held a server connection for a long time", "possible connection leak: …", true},
		{"possible connection leak: client has held a server connection for a long time", "possible leak: …", false},
		{"shutting down: no new clients; transactions in progress may finish", "shutting down: …", true},
		{"pool %s/%s is %s%s", "pool DB/USER is STATE[: last connect error]", true},
		{"SIGHUP received: reloading the configuration", "SIGHUP received: reloading the configuration", true},
		{"SIGHUP received: reloading the configuration", "SIGHUP received: reloading configuration", false},
		{"100%% sure %d", "100% sure 7", true},
		{"a%sb%sc", "a…c", true},
		{"abc", "a…d", false},
	} {
		if got := matches(fromCode(c.code), fromDoc(c.doc)); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.code, c.doc, got, c.want)
		}
		if got := matches(fromDoc(c.doc), fromCode(c.code)); got != c.want {
			t.Errorf("matches(%q, %q) reversed = %v, want %v", c.doc, c.code, got, c.want)
		}
	}
}

func TestValuePlaceholders(t *testing.T) {
	for _, c := range []struct {
		code, doc string
		want      bool
	}{
		{"pool %s/%s is paused", "pool DB/USER paused", false},
		{"pool %s/%s is paused", "pool DB/USER is paused", true},
		{"the server did not answer the cancel request within 5s", "the server did not answer the cancel request within 5s", true},
		{"database %q does not exist", `database "app" does not exist`, true},
		{"database %q does not exist", `database "…" does not exist`, true},
		{"canceling statement due to query_timeout (%s)", "canceling statement due to query_timeout (5m0s)", true},
	} {
		if got := matches(fromCode(c.code), fromDoc(c.doc)); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.code, c.doc, got, c.want)
		}
	}
}
