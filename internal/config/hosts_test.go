package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseHostPort(t *testing.T) {
	for _, c := range []struct {
		in   string
		want HostPort
		err  string
	}{
		{"db.example.com", HostPort{"db.example.com", 5432}, ""},
		{"DB.Example.COM:6543", HostPort{"db.example.com", 6543}, ""},
		{"[::1]:5433", HostPort{"::1", 5433}, ""},
		{"::1", HostPort{"::1", 5432}, ""},
		{"[fe80::1]", HostPort{"fe80::1", 5432}, ""},
		{"/var/run/postgresql", HostPort{"/var/run/postgresql", 5432}, ""},
		{"a:0", HostPort{}, "not a port number"},
		{"a:x", HostPort{}, "not a port number"},
		{"[::1", HostPort{}, "missing ]"},
		{"", HostPort{}, "empty"},
		{":5432", HostPort{}, "no name"},
	} {
		got, err := ParseHostPort(c.in, 5432)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseHostPort(%q) = %v, %v; want an error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseHostPort(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestHostsValidation(t *testing.T) {
	for _, c := range []struct {
		db   Database
		want string
	}{
		{Database{Name: "a", Host: "x", Hosts: []string{"y"}}, "both host and hosts"},
		{Database{Name: "a", Hosts: []string{"y:5432", "Y"}}, "listed twice"},
		{Database{Name: "a", Hosts: []string{"y"}, TargetSessionAttrs: "primary-only"}, "target_session_attrs"},
		{Database{Name: "a", Hosts: []string{"y"}, LoadBalanceHosts: "fastest"}, "load_balance_hosts"},
	} {
		cfg := Defaults()
		cfg.Databases = []Database{c.db}
		cfg.AuthType = AuthTrust
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.db, err, c.want)
		}
	}
	cfg := Defaults()
	cfg.AuthType = AuthTrust
	cfg.Databases = []Database{{Name: "a", Port: 6000, Hosts: []string{"p", "r:7000"}, TargetSessionAttrs: TargetReadWrite}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := cfg.Route("a", "u")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Hosts) != 2 || r.Hosts[0] != (HostPort{"p", 6000}) || r.Hosts[1] != (HostPort{"r", 7000}) || !r.MultiHost() ||
		r.Attrs != TargetReadWrite || r.Balance != BalanceRoundRobin {
		t.Fatalf("route %+v", r)
	}
}

func TestAttrsMatch(t *testing.T) {
	type role struct{ standby, ro bool }
	primary, standby, roPrimary := role{}, role{true, true}, role{false, true}
	for _, c := range []struct {
		attrs string
		r     role
		want  bool
	}{
		{TargetAny, standby, true}, {TargetReadWrite, primary, true}, {TargetReadWrite, roPrimary, false},
		{TargetReadWrite, standby, false}, {TargetReadOnly, roPrimary, true}, {TargetReadOnly, primary, false},
		{TargetPrimary, roPrimary, true}, {TargetPrimary, standby, false}, {TargetStandby, standby, true},
		{TargetStandby, primary, false}, {TargetPreferStandby, standby, true}, {TargetPreferStandby, primary, false},
	} {
		if got := AttrsMatch(c.attrs, c.r.standby, c.r.ro, false); got != c.want {
			t.Errorf("AttrsMatch(%s, %+v) = %v", c.attrs, c.r, got)
		}
	}
	if !AttrsMatch(TargetPreferStandby, false, false, true) {
		t.Error("prefer-standby's fallback refuses a primary")
	}
}

func TestUpstreamHostList(t *testing.T) {
	u, err := ParseUpstream("postgres://app:s3cret@PG-A:5432,pg-b,[::1]:5433/app?target_session_attrs=read-write&load_balance_hosts=disable")
	if err != nil {
		t.Fatal(err)
	}
	want := []HostPort{{"pg-a", 5432}, {"pg-b", 5432}, {"::1", 5433}}
	if len(u.Hosts) != 3 || u.Hosts[0] != want[0] || u.Hosts[1] != want[1] || u.Hosts[2] != want[2] ||
		u.User != "app" || u.Password != "s3cret" || u.Database != "app" || u.Attrs != TargetReadWrite || u.Balance != BalanceDisable {
		t.Fatalf("parsed %+v", u)
	}
	if s := u.String(); strings.Contains(s, "s3cret") || !strings.Contains(s, "pg-a:5432,pg-b:5432,[::1]:5433") {
		t.Errorf("String() = %q", s)
	}
	cfg := Defaults()
	cfg.Upstream = "postgres://app:s3cret@pg-a,pg-b/app?target_session_attrs=primary"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := cfg.Route("app", "app")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Hosts) != 2 || r.Attrs != TargetPrimary || !r.MultiHost() {
		t.Fatalf("route %+v", r)
	}
	for _, bad := range []string{
		"postgres://app@a,b:0/app",
		"postgres://app@a,b/app?target_session_attrs=master",
		"postgres://app@a,b/app?load_balance_hosts=fastest",
	} {
		if _, err := ParseUpstream(bad); err == nil {
			t.Errorf("ParseUpstream(%q) accepted", bad)
		}
	}
}

// host_settings names servers of hosts (matched as hosts are: default port,
// case), once each, with no negative value; the route gives each server its
// own cap and idle timeout, the entry's cap to the others.
func TestHostSettings(t *testing.T) {
	hs := func(host string, idle time.Duration, max int) HostSetting {
		return HostSetting{Host: host, IdleTimeout: idle, MaxSizePerHost: max}
	}
	for _, c := range []struct {
		db   Database
		want string
	}{
		{Database{Name: "a", Host: "x", HostSettings: []HostSetting{hs("x", time.Second, 0)}}, "no hosts"},
		{Database{Name: "a", Hosts: []string{"p", "r"}, HostSettings: []HostSetting{hs("q", time.Second, 0)}}, "not one of its hosts"},
		{Database{Name: "a", Hosts: []string{"p", "r"}, HostSettings: []HostSetting{hs("r", time.Second, 0), hs("R:5432", 0, 1)}}, "listed twice"},
		{Database{Name: "a", Hosts: []string{"p", "r"}, HostSettings: []HostSetting{hs("r", -time.Second, 0)}}, "idle_timeout -1s is negative"},
		{Database{Name: "a", Hosts: []string{"p", "r"}, HostSettings: []HostSetting{hs("r", 0, -1)}}, "max_size_per_host -1 is negative"},
		{Database{Name: "a", Hosts: []string{"p", "r"}, HostSettings: []HostSetting{hs("r:x", 0, 1)}}, "not a port number"},
	} {
		cfg := Defaults()
		cfg.Databases = []Database{c.db}
		cfg.AuthType = AuthTrust
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.db, err, c.want)
		}
	}
	cfg := Defaults()
	cfg.AuthType = AuthTrust
	cfg.Databases = []Database{{Name: "a", Port: 6000, Hosts: []string{"p", "R:7000"}, MaxSizePerHost: 4,
		HostSettings: []HostSetting{hs("r:7000", 30*time.Second, 2)}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := cfg.Route("a", "u")
	if err != nil {
		t.Fatal(err)
	}
	p, rr := HostPort{"p", 6000}, HostPort{"r", 7000}
	if r.HostCap(p) != 4 || r.HostCap(rr) != 2 || r.HostIdleTimeout(p) != 0 || r.HostIdleTimeout(rr) != 30*time.Second || !r.HostCapped() {
		t.Errorf("route: caps %d, %d; idle timeouts %s, %s", r.HostCap(p), r.HostCap(rr), r.HostIdleTimeout(p), r.HostIdleTimeout(rr))
	}
}
