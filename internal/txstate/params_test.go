package txstate

import (
	"maps"
	"reflect"
	"strings"
	"testing"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
		err  string
	}{
		{"-c search_path=a,b", map[string]string{"search_path": "a,b"}, ""},
		{"-csearch_path=x --work-mem=4MB", map[string]string{"search_path": "x", "work_mem": "4MB"}, ""},
		{`-c application_name=two\ words`, map[string]string{"application_name": "two words"}, ""},
		{"  -c a=1\t-c b=2  ", map[string]string{"a": "1", "b": "2"}, ""},
		{"-c", nil, "needs name=value"},
		{"-c novalue", nil, "not name=value"},
		{"-d 5", nil, "not supported"},
	} {
		got, err := ParseOptions(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: want error %q, got %v", tc.in, tc.err, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %v %v, want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestStartupParams(t *testing.T) {
	got, werr := StartupParams(map[string]string{
		"user": "u", "database": "d", "_pq_.x": "1", "DATESTYLE": "ISO", "application_name": "a",
		"options": "-c TimeZone=UTC", "replication": "false",
	}, nil)
	if werr != nil {
		t.Fatal(werr)
	}
	want := map[string]string{"DateStyle": "ISO", "application_name": "a", "TimeZone": "UTC"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
}

// TestStartupParamsIgnored: ignore_startup_parameters drops the parameters
// it lists, in the startup packet and in options, and with options listed
// every setting in options; never the ones PgBouncer always applies.
func TestStartupParamsIgnored(t *testing.T) {
	raw := map[string]string{
		"user": "u", "extra_float_digits": "3", "search_path": "s", "TimeZone": "UTC",
		"options": "-c Work_Mem=2MB -c enable_seqscan=off -c datestyle=German --intervalstyle=iso_8601",
	}
	all := map[string]string{"extra_float_digits": "3", "search_path": "s", "TimeZone": "UTC",
		"work_mem": "2MB", "enable_seqscan": "off", "DateStyle": "German", "IntervalStyle": "iso_8601"}
	without := func(names ...string) map[string]string {
		m := maps.Clone(all)
		for _, n := range names {
			delete(m, n)
		}
		return m
	}
	for _, tc := range []struct {
		ignore []string
		want   map[string]string
	}{
		{nil, all},
		{[]string{"EXTRA_FLOAT_DIGITS", "work_mem"}, without("extra_float_digits", "work_mem")},
		{[]string{"options"}, without("work_mem", "enable_seqscan")},
		{[]string{"search_path", "timezone", "DateStyle", "application_name"}, without("search_path")},
	} {
		got, err := StartupParams(raw, tc.ignore)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ignore %q:\n got %v %v\nwant %v", tc.ignore, got, err, tc.want)
		}
	}
	// An options poolerd cannot read is refused, unless options is listed.
	bad := map[string]string{"options": "-d 5", "extra_float_digits": "3"}
	if _, err := StartupParams(bad, nil); err == nil {
		t.Error("options -d 5 accepted")
	}
	if got, err := StartupParams(bad, []string{"options"}); err != nil || !reflect.DeepEqual(got, map[string]string{"extra_float_digits": "3"}) {
		t.Errorf("options -d 5 with options ignored: %v %v", got, err)
	}
}

func TestQuoting(t *testing.T) {
	if got := QuoteLiteral(`it's a \path`); got != `E'it''s a \\path'` {
		t.Errorf("QuoteLiteral: %s", got)
	}
	if got := QuoteIdent(`myapp.we"ird`); got != `"myapp"."we""ird"` {
		t.Errorf("QuoteIdent: %s", got)
	}
}

func TestParamSyncSQL(t *testing.T) {
	reported := map[string]string{"application_name": "", "DateStyle": "ISO, MDY", "server_version": "15"}
	applied := map[string]string{"work_mem": "64MB"}
	want := map[string]string{"application_name": "app", "DateStyle": "ISO, MDY", "extra_float_digits": "3"}
	got := ParamSyncSQL(want, reported, applied)
	exp := []SyncStmt{
		{SQL: "SELECT pg_catalog.set_config(E'application_name', E'app', false)"},
		{SQL: "SELECT pg_catalog.set_config(E'extra_float_digits', E'3', false)", Name: "extra_float_digits"},
		{SQL: "RESET \"work_mem\""},
	}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("got  %q\nwant %q", got, exp)
	}
	if !reflect.DeepEqual(applied, map[string]string{"extra_float_digits": "3"}) {
		t.Fatalf("applied %v", applied)
	}
	// The server reports the new application_name; nothing left to do.
	reported["application_name"] = "app"
	if got := ParamSyncSQL(want, reported, applied); got != nil {
		t.Fatalf("second sync: %q", got)
	}
	// A reported parameter that is not per client is never set.
	for _, st := range ParamSyncSQL(map[string]string{"server_version": "16"}, reported, applied) {
		if strings.Contains(st.SQL, "server_version") {
			t.Fatalf("tried to set server_version: %s", st.SQL)
		}
	}
}

func TestParamsKey(t *testing.T) {
	if ParamsKey(nil) == "" || ParamsKey(map[string]string{"a": "b=c"}) == ParamsKey(map[string]string{"a=b": "c"}) {
		t.Fatal("ParamsKey is empty or ambiguous")
	}
}
