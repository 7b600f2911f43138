package auth

import (
	"errors"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParseUserlist(t *testing.T) {
	scram := NewSCRAMVerifier("pw", []byte("0123456789abcdef"), 4096).String()
	type want struct {
		name string
		kind SecretKind
		pw   string // for plain secrets
		line int
	}
	tests := []struct {
		name  string
		input string
		want  []want
	}{
		{"empty file", "", nil},
		{"simple", `"bob" "secret"` + "\n", []want{{"bob", SecretPlain, "secret", 1}}},
		{"no trailing newline", `"bob" "secret"`, []want{{"bob", SecretPlain, "secret", 1}}},
		{"crlf", "\"bob\" \"secret\"\r\n\"amy\" \"pw\"\r\n", []want{{"bob", SecretPlain, "secret", 1}, {"amy", SecretPlain, "pw", 2}}},
		{"tabs and leading blanks", "\t  \"bob\"\t\t\"secret\"", []want{{"bob", SecretPlain, "secret", 1}}},
		{"doubled quotes", `"a""b" "p""w"""`, []want{{`a"b`, SecretPlain, `p"w"`, 1}}},
		{"only a quote", `"""" """"`, []want{{`"`, SecretPlain, `"`, 1}}},
		{"spaces inside", `"user name" "pass word "`, []want{{"user name", SecretPlain, "pass word ", 1}}},
		{"semicolon inside", `"bob" "a;b#c"`, []want{{"bob", SecretPlain, "a;b#c", 1}}},
		{"trailing fields ignored", `"bob" "secret" "extra" whatever`, []want{{"bob", SecretPlain, "secret", 1}}},
		{"trailing garbage ignored", `"bob" "secret"garbage`, []want{{"bob", SecretPlain, "secret", 1}}},
		{"comments and blank lines", "; comment\n# comment\n\n   \n  ; indented\n\t# indented\n\"bob\" \"x\"\n",
			[]want{{"bob", SecretPlain, "x", 7}}},
		{"md5 and scram", "\"a\" \"md539c4422cad2e8aa743c2904bf0925538\"\n\"b\" \"" + scram + "\"\n",
			[]want{{"a", SecretMD5, "", 1}, {"b", SecretSCRAM, "", 2}}},
		{"empty secret", `"trusted" ""`, []want{{"trusted", 0, "", 1}}},
		{"bom", "\uFEFF\"bob\" \"x\"", []want{{"bob", SecretPlain, "x", 1}}},
		{"case-sensitive names", "\"Bob\" \"a\"\n\"bob\" \"b\"", []want{{"Bob", SecretPlain, "a", 1}, {"bob", SecretPlain, "b", 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseUserlist(strings.NewReader(tt.input))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d entries, want %d", len(got), len(tt.want))
			}
			for i, w := range tt.want {
				g := got[i]
				if g.Name != w.name || g.Secret.Kind() != w.kind || g.Line != w.line {
					t.Errorf("entry %d = {%q %v line %d}, want {%q %v line %d}", i, g.Name, g.Secret.Kind(), g.Line, w.name, w.kind, w.line)
				}
				if w.kind == SecretPlain {
					if pw, _ := g.Secret.Plain(); pw != w.pw {
						t.Errorf("entry %d password = %q, want %q", i, pw, w.pw)
					}
				}
			}
		})
	}
}

func TestParseUserlistErrors(t *testing.T) {
	const pw = "topsecretpw"
	tests := []struct {
		name  string
		input string
		line  int
		want  string
	}{
		{"unquoted name", "bob \"" + pw + "\"", 1, "user name in double quotes"},
		{"unquoted both", "bob " + pw, 1, "user name in double quotes"},
		{"missing closing quote on name", "\"bob " + pw, 1, "unterminated quoted user name"},
		{"one field", "\n\"" + pw + "\"", 2, "missing secret field"},
		{"one field trailing blanks", "\"" + pw + "\"   \t", 1, "missing secret field"},
		{"unquoted secret", "\"bob\" " + pw, 1, "secret in double quotes"},
		{"no blank between fields", "\"bob\"x\"" + pw + "\"", 1, "secret in double quotes"},
		{"missing closing quote on secret", "; c\n\"bob\" \"" + pw, 2, "unterminated quoted secret"},
		{"doubled quote at end of secret", "\"bob\" \"" + pw + "\"\"", 1, "unterminated quoted secret"},
		{"empty name", `"" "` + pw + `"`, 1, "empty user name"},
		{"nul in name", "\"b\x00b\" \"" + pw + "\"", 1, "NUL"},
		{"nul in secret", "\"bob\" \"" + pw + "\x00\"", 1, "NUL"},
		{"bad scram", "\"bob\" \"SCRAM-SHA-256$4096:" + pw + "\"", 1, `user "bob": invalid secret: SCRAM-SHA-256 secret`},
		{"duplicate", "\"bob\" \"a\"\n# c\n\"bob\" \"" + pw + "\"", 3, `duplicate user "bob" (first defined on line 1)`},
		{"too long line", "\"bob\" \"" + strings.Repeat("x", maxUserlistLine+10) + "\"", 1, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entries, err := ParseUserlist(strings.NewReader(tt.input))
			if err == nil {
				t.Fatalf("no error; entries %v", entries)
			}
			var ue *UserlistError
			if !errors.As(err, &ue) {
				t.Fatalf("error %T is not *UserlistError", err)
			}
			if ue.Line != tt.line {
				t.Errorf("Line = %d, want %d (%v)", ue.Line, tt.line, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "line ") || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not contain %q", msg, tt.want)
			}
			if strings.Contains(msg, pw) {
				t.Errorf("error %q contains the secret", msg)
			}
		})
	}
}

func TestParseUserlistReadError(t *testing.T) {
	_, err := ParseUserlist(iotest.ErrReader(errors.New("disk on fire")))
	var ue *UserlistError
	if !errors.As(err, &ue) || ue.Line != 0 || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("err = %v", err)
	}
}
