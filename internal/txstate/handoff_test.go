package txstate

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
		t.Log(HandoffSQL([]string{"myapp.tenant"}))
	}
}

func TestParseHandoffRow(t *testing.T) {
	body := row(str("app"), str("app"), str("none"), nil, str("0"), nil, nil, nil, nil, nil)
	cols, ok := ParseHandoffRow(body)
	if !ok {
		t.Fatal("not parsed")
	}
	want := []string{"app", "app", "none", "", "0", "", "", "", "", ""}
	if !reflect.DeepEqual(cols, want) {
		t.Fatalf("cols %q, want %q", cols, want)
	}
	for _, bad := range [][]byte{nil, {0}, {0, 3}, row(str("a")), body[:len(body)-1]} {
		if _, ok := ParseHandoffRow(bad); ok {
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
	base := HandoffExpect{Login: "app", Tracked: true,
		Params: map[string]string{"search_path": `"$user", public`, "TimeZone": "UTC"}}
	tests := []struct {
		name   string
		cols   []string
		expect func(e *HandoffExpect)
		kinds  []string
	}{
		{"clean", clean, nil, nil},
		{"other current_user", with(0, "bob"), nil, []string{HandoffRole}},
		{"role set to the login's", with(2, "app"), nil, []string{HandoffRole}},
		{"other session_user", with(1, "bob"), nil, []string{HandoffRole}},
		{"startup role", with(0, "bob"), func(e *HandoffExpect) { e.Role = "bob" }, nil},
		{"startup role lost", clean, func(e *HandoffExpect) { e.Role = "bob" }, []string{HandoffRole}},
		{"role reset at next attach", with(0, "bob"), func(e *HandoffExpect) { e.RoleReset = true }, nil},
		{"session authorization even so", with(1, "bob"), func(e *HandoffExpect) { e.RoleReset = true }, []string{HandoffRole}},
		{"listen", with(3, "ch"), nil, []string{HandoffListen}},
		{"advisory lock", with(4, "2"), nil, []string{HandoffAdvisoryLock}},
		{"temp table", with(5, "t"), nil, []string{HandoffTempTable}},
		{"cursor", with(6, "c"), nil, []string{HandoffCursor}},
		{"sql prepare", with(7, "p"), nil, []string{HandoffSQLPrepare}},
		{"protocol prepare", with(8, "s1"), nil, []string{HandoffProtoPrepare}},
		{"protocol prepare passed through", with(8, "s1"), func(e *HandoffExpect) { e.Tracked = false }, nil},
		{"reported parameter", with(9, `{"TimeZone": "UTC", "search_path": "x"}`), nil, nil},
		{"setting not by poolerd", with(9, `{"work_mem": "16MB"}`), nil, []string{HandoffSetting}},
		{"setting not by poolerd, RESET ALL at next attach", with(9, `{"myapp.tenant": "a"}`), func(e *HandoffExpect) { e.RoleReset = true }, nil},
		{"setting applied", with(9, `{"work_mem": "16MB"}`), func(e *HandoffExpect) {
			e.Applied = map[string]string{"work_mem": "16MB"}
		}, nil},
		{"setting applied raw", with(9, `{"statement_timeout": "30s"}`), func(e *HandoffExpect) {
			e.Applied = map[string]string{"statement_timeout": "30000"}
		}, nil},
		{"setting changed", with(9, `{"work_mem": "32MB"}`), func(e *HandoffExpect) {
			e.Applied = map[string]string{"work_mem": "16MB"}
			e.Norm = map[string]string{"work_mem": "16MB"}
		}, []string{HandoffSetting}},
		{"setting gone", clean, func(e *HandoffExpect) {
			e.Applied = map[string]string{"work_mem": "16MB"}
		}, []string{HandoffSetting}},
		{"startup role not a setting", with(0, "bob"), func(e *HandoffExpect) {
			e.Role = "bob"
			e.Applied = map[string]string{"role": "bob"}
		}, nil},
		{"custom option reset", with(9, `{"myapp.tenant": ""}`), nil, nil},
		{"custom option left", with(9, `{"myapp.tenant": "a"}`), nil, []string{HandoffSetting}},
		{"custom option applied", with(9, `{"myapp.tenant": "a"}`), func(e *HandoffExpect) {
			e.Applied = map[string]string{"myapp.tenant": "a"}
		}, nil},
		{"bad json", with(9, `{`), nil, []string{HandoffCheckFailed}},
		{"several", with(3, "ch"), func(e *HandoffExpect) { e.Login = "other" }, []string{HandoffRole, HandoffListen}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base
			if tt.expect != nil {
				tt.expect(&e)
			}
			var kinds []string
			for _, f := range CheckHandoff(tt.cols, e) {
				kinds = append(kinds, f.Kind)
				if f.What == "" {
					t.Errorf("finding %s says nothing", f.Kind)
				}
			}
			if !reflect.DeepEqual(kinds, tt.kinds) {
				t.Errorf("kinds %q, want %q", kinds, tt.kinds)
			}
		})
	}
}
