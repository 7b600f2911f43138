package config

import (
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SetValue sets the top-level key of c from its text form, as SET in the
// admin console gives it: durations with a unit, booleans, integers,
// comma-separated lists. Call Validate afterwards.
func SetValue(c *Config, key, value string) error {
	f, ok := fieldByTag(reflect.ValueOf(c).Elem(), key)
	if !ok || !isKey(key) {
		return fmt.Errorf("unknown key %q", key)
	}
	switch f.Interface().(type) {
	case string:
		f.SetString(value)
	case int:
		n, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not an integer", key, value)
		}
		f.SetInt(int64(n))
	case bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not true or false", key, value)
		}
		f.SetBool(b)
	case float64:
		x, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not a number", key, value)
		}
		f.SetFloat(x)
	case time.Duration:
		if n, err := strconv.Atoi(value); err == nil && n != 0 {
			return fmt.Errorf("%s: duration %q has no unit: write it like 30s, 500ms or 2m", key, value)
		}
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not a duration like 30s", key, value)
		}
		f.SetInt(int64(d))
	case []string:
		var list []string
		for _, s := range strings.Split(value, ",") {
			if s = strings.TrimSpace(s); s != "" {
				list = append(list, s)
			}
		}
		f.Set(reflect.ValueOf(list))
	default:
		return fmt.Errorf("%s cannot be set", key)
	}
	return nil
}

// IsDurationKey reports whether the top-level key name holds a duration.
func IsDurationKey(name string) bool {
	var c Config
	f, ok := fieldByTag(reflect.ValueOf(&c).Elem(), name)
	return ok && isKey(name) && f.Type() == reflect.TypeFor[time.Duration]()
}

func isKey(name string) bool {
	for _, k := range Keys() {
		if k.Name == name {
			return true
		}
	}
	return false
}

// CopyValue sets key of dst to src's value of it (a reload keeps the
// running value of a key that only a restart can change).
func CopyValue(dst, src *Config, key string) {
	d, ok := fieldByTag(reflect.ValueOf(dst).Elem(), key)
	if !ok {
		return
	}
	sv, _ := fieldByTag(reflect.ValueOf(src).Elem(), key)
	d.Set(sv)
}

// FormatValue returns the text form of a top-level key's value, with the
// upstream URL's password hidden.
func FormatValue(c *Config, key string) string {
	switch v := defaultValue(c, key).(type) {
	case nil:
		return ""
	case time.Duration:
		return v.String()
	case []string:
		return strings.Join(v, ",")
	case string:
		return Redact(key, v)
	default:
		return fmt.Sprint(v)
	}
}

// bindPasswd matches auth_ldap_options' ldapbindpasswd and its value.
var bindPasswd = regexp.MustCompile(`ldapbindpasswd=("(?:[^"]|"")*"|\S*)`)

// Redact returns a key's value as it may be shown or logged: the
// passwords of the upstream and Redis URLs and auth_ldap_options'
// ldapbindpasswd hidden.
func Redact(key, value string) string {
	if value == "" {
		return value
	}
	switch key {
	case "upstream":
		if u, err := ParseUpstream(value); err == nil {
			return u.String()
		}
		return "(invalid URL)"
	case "redis_url":
		u, err := url.Parse(value)
		if err != nil {
			return "(invalid URL)"
		}
		return u.Redacted()
	case "auth_ldap_options":
		return bindPasswd.ReplaceAllString(value, "ldapbindpasswd=xxxxx")
	}
	return value
}

// UserNames lists the users poolerd knows: from users, auth_file and the
// upstream URL, sorted.
func (c *Config) UserNames() []string {
	seen := map[string]bool{}
	for n := range c.secrets {
		seen[n] = true
	}
	for _, u := range c.Users {
		seen[u.Name] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
