package pgbini

import (
	"path/filepath"
	"reflect"
	"testing"
)

func TestConnectQuerySettings(t *testing.T) {
	for q, want := range map[string]map[string]string{
		"SET statement_timeout = 30000":                                   {"statement_timeout": "30000"},
		"set statement_timeout to '30s'; SET search_path TO app, public;": {"statement_timeout": "30s", "search_path": "app, public"},
		`SET SESSION "myapp.tenant" = 'a''b'`:                             {"myapp.tenant": "a'b"},
		"SET TIME ZONE 'Europe/Paris'":                                    {"timezone": "Europe/Paris"},
		`SET search_path = "Mixed", public`:                               {"search_path": `"Mixed", public`},
		"SET work_mem = '64MB'; SET jit = off":                            {"work_mem": "64MB", "jit": "off"},
	} {
		got, ok := connectQuerySettings(q)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %v %v, want %v", q, got, ok, want)
		}
	}
	for _, q := range []string{"", "SELECT 1", "SET LOCAL work_mem = '1MB'", "SET work_mem = DEFAULT", "SET work_mem",
		"SET a = 1; LOAD 'auto_explain'", "SET a = 'x", "SET search_path = a,", "SET a = 1 -- comment", "RESET ALL"} {
		if got, ok := connectQuerySettings(q); ok {
			t.Errorf("%q: taken as %v", q, got)
		}
	}
}

// An entry's connect_query of SET statements joins its server_parameters;
// another is reported.
func TestConnectQueryEntry(t *testing.T) {
	dir := t.TempDir()
	ini := filepath.Join(dir, "p.ini")
	writeFile(t, ini, "[pgbouncer]\nlisten_addr = 127.0.0.1\n[databases]\na = host=x timezone=UTC connect_query='SET statement_timeout = 5000; SET search_path TO app, public'\n"+
		"b = host=x connect_query='SELECT 1'\n")
	res, err := Load(ini)
	if err != nil {
		t.Fatal(err)
	}
	dbs := res.Tree["databases"].([]any)
	want := map[string]any{"timezone": "UTC", "statement_timeout": "5000", "search_path": "app, public"}
	if got := dbs[0].(map[string]any)["server_parameters"]; !reflect.DeepEqual(got, want) {
		t.Errorf("server_parameters %v, want %v", got, want)
	}
	if got := settings(res); !reflect.DeepEqual(got, []string{"[databases] b: connect_query"}) {
		t.Errorf("reported %q", got)
	}
}
