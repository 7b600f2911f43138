package proxy

import (
	"encoding/binary"
	"os"
	"reflect"
	"testing"
)

// row builds a DataRow body; a nil entry is NULL.
func row(cols ...*string) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(cols)))
	for _, c := range cols {
		if c == nil {
			b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(*c)))
		b = append(b, *c...)
	}
	return b
}

func str(s string) *string { return &s }

func TestHandoffSQLPrint(t *testing.T) {
	if os.Getenv("POOLERD_PRINT_HANDOFF_SQL") != "" {
		t.Log(handoffSQL([]string{"myapp.tenant"}))
	}
}

func TestParseHandoffRow(t *testing.T) {
	body := row(str("app"), str("app"), str("none"), nil, str("0"), nil, nil, nil, nil, nil)
	cols, ok := parseHandoffRow(body)
	if !ok {
		t.Fatal("not parsed")
	}
	want := []string{"app", "app", "none", "", "0", "", "", "", "", ""}
	if !reflect.DeepEqual(cols, want) {
		t.Fatalf("cols %q, want %q", cols, want)
	}
	for _, bad := range [][]byte{nil, {0}, {0, 3}, row(str("a")), body[:len(body)-1]} {
		if _, ok := parseHandoffRow(bad); ok {
			t.Errorf("parsed %v", bad)
		}
	}
}

func TestCheckHandoff(t *testing.T) {
	clean := []string{"app", "app", "none", "", "0", "", "", "", "", ""}
	with := func(i int, v string) []string {
		c := append([]string(nil), clean...)
		c[i] = v
		return c
	}
	base := handoffExpect{login: "app", tracked: true,
		params: map[string]string{"search_path": `"$user", public`, "TimeZone": "UTC"}}
	tests := []struct {
		name   string
		cols   []string
		expect func(e *handoffExpect)
		kinds  []string
	}{
		{"clean", clean, nil, nil},
		{"other current_user", with(0, "bob"), nil, []string{handoffRole}},
		{"role set to the login's", with(2, "app"), nil, []string{handoffRole}},
		{"other session_user", with(1, "bob"), nil, []string{handoffRole}},
		{"startup role", with(0, "bob"), func(e *handoffExpect) { e.role = "bob" }, nil},
		{"startup role lost", clean, func(e *handoffExpect) { e.role = "bob" }, []string{handoffRole}},
		{"role reset at next attach", with(0, "bob"), func(e *handoffExpect) { e.roleReset = true }, nil},
		{"session authorization even so", with(1, "bob"), func(e *handoffExpect) { e.roleReset = true }, []string{handoffRole}},
		{"listen", with(3, "ch"), nil, []string{handoffListen}},
		{"advisory lock", with(4, "2"), nil, []string{handoffAdvisoryLock}},
		{"temp table", with(5, "t"), nil, []string{handoffTempTable}},
		{"cursor", with(6, "c"), nil, []string{handoffCursor}},
		{"sql prepare", with(7, "p"), nil, []string{handoffSQLPrepare}},
		{"protocol prepare", with(8, "s1"), nil, []string{handoffProtoPrepare}},
		{"protocol prepare passed through", with(8, "s1"), func(e *handoffExpect) { e.tracked = false }, nil},
		{"reported parameter", with(9, `{"TimeZone": "UTC", "search_path": "x"}`), nil, nil},
		{"setting not by poolerd", with(9, `{"work_mem": "16MB"}`), nil, []string{handoffSetting}},
		{"setting not by poolerd, RESET ALL at next attach", with(9, `{"myapp.tenant": "a"}`), func(e *handoffExpect) { e.roleReset = true }, nil},
		{"setting applied", with(9, `{"work_mem": "16MB"}`), func(e *handoffExpect) {
			e.applied = map[string]string{"work_mem": "16MB"}
		}, nil},
		{"setting applied raw", with(9, `{"statement_timeout": "30s"}`), func(e *handoffExpect) {
			e.applied = map[string]string{"statement_timeout": "30000"}
		}, nil},
		{"setting changed", with(9, `{"work_mem": "32MB"}`), func(e *handoffExpect) {
			e.applied = map[string]string{"work_mem": "16MB"}
			e.norm = map[string]string{"work_mem": "16MB"}
		}, []string{handoffSetting}},
		{"setting gone", clean, func(e *handoffExpect) {
			e.applied = map[string]string{"work_mem": "16MB"}
		}, []string{handoffSetting}},
		{"startup role not a setting", with(0, "bob"), func(e *handoffExpect) {
			e.role = "bob"
			e.applied = map[string]string{"role": "bob"}
		}, nil},
		{"custom option reset", with(9, `{"myapp.tenant": ""}`), nil, nil},
		{"custom option left", with(9, `{"myapp.tenant": "a"}`), nil, []string{handoffSetting}},
		{"custom option applied", with(9, `{"myapp.tenant": "a"}`), func(e *handoffExpect) {
			e.applied = map[string]string{"myapp.tenant": "a"}
		}, nil},
		{"bad json", with(9, `{`), nil, []string{handoffCheckFailed}},
		{"several", with(3, "ch"), func(e *handoffExpect) { e.login = "other" }, []string{handoffRole, handoffListen}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base
			if tt.expect != nil {
				tt.expect(&e)
			}
			var kinds []string
			for _, f := range checkHandoff(tt.cols, e) {
				kinds = append(kinds, f.kind)
				if f.what == "" {
					t.Errorf("finding %s says nothing", f.kind)
				}
			}
			if !reflect.DeepEqual(kinds, tt.kinds) {
				t.Errorf("kinds %q, want %q", kinds, tt.kinds)
			}
		})
	}
}
