package config

import (
	"os"
	"strings"
	"testing"
)

// TestReferenceListsEveryKey keeps docs/configuration.md true: every key,
// its environment variable and its flag appear in the reference.
func TestReferenceListsEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	for _, k := range Keys() {
		for _, s := range []string{"`" + k.Name + "`", "`" + k.Env() + "`"} {
			if !strings.Contains(text, s) {
				t.Errorf("docs/configuration.md does not mention %s", s)
			}
		}
		if k.Flag != "" && !strings.Contains(text, "`--"+k.Flag+"`") {
			t.Errorf("docs/configuration.md does not mention --%s", k.Flag)
		}
	}
}
