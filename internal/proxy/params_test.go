package proxy

import (
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/poolerd/poolerd/internal/txstate"
)

// parseReplication reads the replication parameter as PostgreSQL does.
func TestParseReplication(t *testing.T) {
	for v, want := range map[string]replMode{
		"database": replLogical, "true": replPhysical, "TRUE": replPhysical, "t": replPhysical, "yes": replPhysical,
		"on": replPhysical, "1": replPhysical, "false": replNone, "f": replNone, "no": replNone, "off": replNone,
		"of": replNone, "0": replNone,
	} {
		if got, err := parseReplication(v); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", v, got, err, want)
		}
	}
	// "o" is ambiguous (on, off); "Database" is not the keyword.
	for _, v := range []string{"", "o", "maybe", "Database", "2", "truex"} {
		if _, err := parseReplication(v); err == nil || wireError(err).Code != "22023" {
			t.Errorf("%q: %v, want 22023", v, err)
		}
	}
	got := replicationParams(map[string]string{"user": "u", "database": "d", "replication": "database", "_pq_.x": "1",
		"options": "-c extra_float_digits=3 -B 1", "application_name": "sub"})
	if want := map[string]string{"options": "-c extra_float_digits=3 -B 1", "application_name": "sub"}; !reflect.DeepEqual(got, want) {
		t.Errorf("replicationParams: %v, want %v (options verbatim)", got, want)
	}
}

// TestSyncParamsRemembersMatchingKey: a connection found in line with one
// client's parameters is not compared again for a client with the same
// parameters, until its own parameters change (a ParameterStatus, a sync).
func TestSyncParamsRemembersMatchingKey(t *testing.T) {
	sc := &serverConn{
		params:  map[string]string{"application_name": "app", "TimeZone": "UTC"},
		applied: map[string]string{"work_mem": "8MB"},
	}
	newSession := func() *session {
		return &session{params: map[string]string{"application_name": "app", "TimeZone": "UTC", "work_mem": "8MB"}}
	}
	a, b := newSession(), newSession()
	if q, _ := a.syncParams(sc); q != nil {
		t.Fatalf("in line, but got %q", q)
	}
	if sc.syncedKey == "" || sc.syncedKey != a.pkey {
		t.Fatal("the matching key was not remembered")
	}
	// Same parameters: no comparison. Prove it by changing the server's
	// map behind the generation's back: the fast path must not see it.
	sc.params["TimeZone"] = "hidden"
	if q, _ := b.syncParams(sc); q != nil {
		t.Fatalf("same key, but compared: %q", q)
	}
	// A ParameterStatus bumps the generation: compared again.
	sc.paramGen++
	if q, _ := b.syncParams(sc); q == nil || !strings.Contains(string(q), "TimeZone") {
		t.Fatalf("after a change: %q", q)
	}
	// The sync itself changed the connection: the next client is compared.
	sc.params["TimeZone"] = "UTC" // the server's ParameterStatus answer
	sc.paramGen++
	c := newSession()
	c.params["application_name"] = "other"
	if q, _ := c.syncParams(sc); q == nil || !strings.Contains(string(q), "other") {
		t.Fatalf("different key: %q", q)
	}
	// A client's own change (noteParameter) drops its key.
	a.noteParameter("application_name", "renamed")
	if a.pkey != "" {
		t.Fatal("key kept after a parameter change")
	}
}

// TestSharedParamsCopiedOnWrite: clients with the same parameters share one
// map; a change made for one client copies it first, so the others keep
// theirs.
func TestSharedParamsCopiedOnWrite(t *testing.T) {
	d := &dbPool{}
	login := func(app string) *session {
		s := &session{params: map[string]string{"application_name": app, "TimeZone": "UTC"}}
		s.pkey = txstate.ParamsKey(s.params)
		if set, ok := d.shareParams(s.pkey, s.params); ok {
			s.params, s.pkey, s.paramsShared = set.params, set.key, true
		}
		return s
	}
	a, b := login("app"), login("app")
	if reflect.ValueOf(a.params).UnsafePointer() != reflect.ValueOf(b.params).UnsafePointer() {
		t.Fatal("equal parameters are not shared")
	}
	if unsafe.StringData(a.pkey) != unsafe.StringData(b.pkey) {
		t.Fatal("equal parameter keys are not shared")
	}
	b.noteParameter("TimeZone", "UTC") // unchanged: no copy
	if !b.paramsShared {
		t.Fatal("an unchanged parameter copied the map")
	}
	b.noteParameter("TimeZone", "Europe/Paris")
	if a.params["TimeZone"] != "UTC" || b.params["TimeZone"] != "Europe/Paris" || b.paramsShared {
		t.Fatalf("after one client's change: a %v, b %v", a.params, b.params)
	}
	b.noteParameter("extra_float_digits", "") // a new parameter, even empty, is recorded
	if _, ok := b.params["extra_float_digits"]; !ok {
		t.Fatal("a new empty parameter was not recorded")
	}
	for i := range maxParamSets {
		login(strings.Repeat("x", i+1))
	}
	if s := login("one too many"); s.paramsShared {
		t.Fatalf("more than %d parameter sets shared", maxParamSets)
	}
}
