// Package configs_test checks that the example configuration files in this
// directory are valid, so that they cannot silently rot when configuration
// keys or validation rules change.
package configs_test

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/poolerd/poolerd/internal/config"
)

// load loads configs/<name> with the real loader, as
// `poolerd --config configs/<name>` run from the repository root would.
//
// The examples are written to be run from the repository root: relative
// paths in them (auth_file: configs/userlist.txt) are resolved against the
// working directory, like poolerd does. go test runs in configs/, so the
// test changes to the parent directory first.
func load(t *testing.T, name string) *config.Config {
	t.Helper()
	t.Chdir("..")
	// POOLERD_* variables in the environment would override the file.
	for _, k := range config.Keys() {
		t.Setenv(k.Env(), "")
		os.Unsetenv(k.Env())
	}
	loader, err := config.NewLoader([]string{"--config", filepath.Join("configs", name)}, io.Discard)
	if err != nil {
		t.Fatalf("NewLoader: %v", err)
	}
	cfg, err := loader.Load()
	if err != nil {
		t.Fatalf("configs/%s is not valid:\n%v", name, err)
	}
	return cfg
}

func TestExamplesAreValid(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no configs/*.yaml found")
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) { load(t, f) })
	}
}

func TestSidecarExample(t *testing.T) {
	cfg := load(t, "sidecar.yaml")
	u := cfg.UpstreamInfo()
	if u == nil {
		t.Fatal("sidecar.yaml has no upstream")
	}
	if _, ok := cfg.ClientSecret(u.User); !ok {
		t.Errorf("sidecar.yaml: upstream user %q has no client secret", u.User)
	}
}

// TestFullExample checks that configs/poolerd.yaml stays complete: every
// top-level key is present and, except auth_file, set to its default.
func TestFullExample(t *testing.T) {
	const file = "poolerd.yaml"
	present := topLevelKeys(t, file)
	for _, k := range config.Keys() {
		if !present[k.Name] {
			t.Errorf("%s does not set %s; the full example lists every key", file, k.Name)
		}
	}
	for _, k := range []string{"databases", "users"} {
		if !present[k] {
			t.Errorf("%s has no %s list", file, k)
		}
	}

	cfg := load(t, file)
	def := config.Defaults()
	for _, k := range config.Keys() {
		if k.Name == "auth_file" {
			continue
		}
		// Compared in text form: an empty list and no list are the same.
		if got, want := config.FormatValue(cfg, k.Name), config.FormatValue(&def, k.Name); got != want {
			t.Errorf("%s: %s is %v, but its default is %v; the example shows the defaults", file, k.Name, got, want)
		}
	}

	// The auth_file was read: these users' secrets come only from it.
	for _, user := range []string{"app", "analyst"} {
		if _, ok := cfg.ClientSecret(user); !ok {
			t.Errorf("%s: user %q has no secret; was userlist.txt read?", file, user)
		}
	}
	var names []string
	for _, d := range cfg.Databases {
		names = append(names, d.Name)
	}
	if !reflect.DeepEqual(names, []string{"app", "reports", "*"}) {
		t.Errorf("%s databases = %q", file, names)
	}
	r, err := cfg.Route("reports", "analyst")
	if err != nil {
		t.Fatal(err)
	}
	if !r.ForcedUser || r.ServerUser != "report_reader" || r.DBName != "app" {
		t.Errorf("route for reports: %+v", r)
	}
	// analyst's session override wins over the database's session mode and
	// its max_size over the database's 5.
	if r.Settings.PoolMode != config.PoolSession || r.Settings.MaxSize != 4 {
		t.Errorf("analyst on reports: pool_mode %s max_size %d, want session 4", r.Settings.PoolMode, r.Settings.MaxSize)
	}
	if r, err := cfg.Route("anything", "app"); err != nil || r.DBName != "anything" || r.Settings.MaxSize != 40 {
		t.Errorf("wildcard route for app: %+v, %v", r, err)
	}
}

// topLevelKeys returns the keys written at the start of a line (top level)
// of configs/<name>.
func topLevelKeys(t *testing.T, name string) map[string]bool {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '#' || line[0] == '-' {
			continue
		}
		if k, _, ok := strings.Cut(line, ":"); ok {
			keys[k] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestWebConfigExample: configs/web-config.yml is a valid Prometheus web
// configuration for poolerd, and its hash is that of the password its
// comment gives.
func TestWebConfigExample(t *testing.T) {
	t.Chdir("..")
	for _, k := range config.Keys() {
		t.Setenv(k.Env(), "")
		os.Unsetenv(k.Env())
	}
	const file = "configs/web-config.yml"
	loader, err := config.NewLoader([]string{"--upstream", "postgres://app:secret@127.0.0.1:5432/app",
		"--http-web-config-file", file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loader.Load(); err != nil {
		t.Fatalf("%s is not valid: %v", file, err)
	}
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, hash, ok := strings.Cut(string(text), "\n  prometheus: ")
	if !ok || !strings.Contains(string(text), `password is "change-me"`) {
		t.Fatalf("%s: no prometheus user, or its password is not documented", file)
	}
	hash, _, _ = strings.Cut(hash, "\n")
	if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte("change-me")); err != nil {
		t.Fatalf("%s: the hash is not that of the documented password: %v", file, err)
	}
}
