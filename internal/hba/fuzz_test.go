package hba

import (
	"net"
	"testing"
)

// FuzzParse: no input makes Parse panic, and every rule it returns can be
// matched.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"local all all trust\n",
		"hostssl app,\"x y\" alice, bob 10.0.0.0 255.0.0.0 cert\n",
		"host all @inc ::1/128 md5 # c\n",
		"host \"a\"\"b\" all all reject \\\n  x=y\n",
	} {
		f.Add([]byte(s))
	}
	read := func(string) ([]byte, error) { return []byte("a, b @inc\n"), nil } // recursive
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, _ := Parse("f", data, read)
		rules.Match(Client{Addr: net.ParseIP("10.1.1.1"), Database: "app", User: "alice"})
		rules.Match(Client{Local: true, TLS: true, Database: "x", User: "x"})
	})
}
