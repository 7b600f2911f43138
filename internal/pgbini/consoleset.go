package pgbini

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/poolerd/poolerd/internal/config"
)

// setKey translates an admin console SET written for PgBouncer into
// poolerd's key and value: one of PgBouncer's [pgbouncer] settings becomes
// the poolerd key it maps to (server_idle_timeout: idle_timeout), with its
// value converted from PgBouncer's units (seconds, 0/1); a poolerd key is
// kept, and a plain number for one of its durations is taken as seconds,
// as PgBouncer's console does (query_timeout = 1 is one second). Any other
// key is returned unchanged, for the caller to refuse. An error says why a
// PgBouncer setting cannot be set at run time.
func setKey(key, value string) (string, string, error) {
	key = strings.ToLower(key)
	// A PgBouncer setting of the same name as poolerd's key is read in
	// PgBouncer's unit (tcp_user_timeout: milliseconds).
	for _, r := range Rules() {
		if r.Section == "pgbouncer" && r.Key == key && r.To == key && r.Honoured() && r.kind != kindSpecial && r.kind != kindPath {
			v, err := setValue(r, value)
			if err != nil {
				return "", "", fmt.Errorf("%s: %w", key, err)
			}
			return key, v, nil
		}
	}
	if hasKey(key) {
		if config.IsDurationKey(key) {
			if _, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				d, err := seconds(value)
				if err != nil {
					return "", "", fmt.Errorf("%s: %w", key, err)
				}
				return key, fmtDuration(d), nil
			}
		}
		return key, value, nil
	}
	for _, r := range Rules() {
		if r.Section != "pgbouncer" || r.Key != key {
			continue
		}
		if !r.Honoured() {
			return "", "", fmt.Errorf("PgBouncer's %s has no equivalent in poolerd: %s", key, r.Note)
		}
		v, err := setValue(r, value)
		if err != nil {
			return "", "", fmt.Errorf("%s (poolerd's %s): %w", key, r.To, err)
		}
		return r.To, v, nil
	}
	return key, value, nil
}

// SetKeys translates an admin console SET written for PgBouncer into
// poolerd's keys and values, in the order to set them: one key (setKey),
// or more for a PgBouncer setting that becomes more than one of poolerd's
// (server_lifetime: max_lifetime and max_uses).
func SetKeys(key, value string) ([]Setting, error) {
	if strings.EqualFold(key, "server_lifetime") {
		kv, err := lifetime(value)
		if err != nil {
			return nil, fmt.Errorf("server_lifetime: %w", err)
		}
		return kv, nil
	}
	k, v, err := setKey(key, value)
	if err != nil {
		return nil, err
	}
	return []Setting{{k, v}}, nil
}

// setValue converts a console value of PgBouncer's setting r into the text
// of poolerd's key r.To.
func setValue(r Rule, value string) (string, error) {
	switch r.kind {
	case kindSpecial:
		switch r.Key {
		case "verbose":
			n, err := strconv.Atoi(strings.TrimSpace(value))
			if err != nil || n < 0 {
				return "", fmt.Errorf("%q is not a verbosity (0, 1, 2)", value)
			}
			if n > 0 {
				return "debug", nil
			}
			return "info", nil
		case "server_login_retry":
			d, err := seconds(value)
			if err != nil {
				return "", err
			}
			return fmtDuration(d), nil
		case "server_check_delay":
			return checkDelay(value)
		}
		return "", fmt.Errorf("set it in the configuration file (it becomes %s) and RELOAD", r.To)
	case kindPath:
		return "", fmt.Errorf("a file name: set it in the configuration file and RELOAD")
	}
	v, err := convert(r.kind, value, "")
	if err != nil {
		return "", err
	}
	switch v := v.(type) {
	case []string:
		return strings.Join(v, ","), nil
	default:
		return fmt.Sprint(v), nil
	}
}
