package config

import (
	"log/syslog"
	"strings"
)

// SyslogFacility returns the syslog facility syslog_facility names
// (PgBouncer's: auth, authpriv, daemon, user, local0 to local7).
func SyslogFacility(name string) (syslog.Priority, bool) {
	switch strings.ToLower(name) {
	case "auth":
		return syslog.LOG_AUTH, true
	case "authpriv":
		return syslog.LOG_AUTHPRIV, true
	case "daemon":
		return syslog.LOG_DAEMON, true
	case "user":
		return syslog.LOG_USER, true
	}
	if n, ok := strings.CutPrefix(strings.ToLower(name), "local"); ok && len(n) == 1 && n[0] >= '0' && n[0] <= '7' {
		return syslog.LOG_LOCAL0 + syslog.Priority(n[0]-'0')<<3, true
	}
	return 0, false
}
