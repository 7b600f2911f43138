package integration

// Tests of configuration reload: RELOAD on the admin console (in-process,
// with a config.Loader on a YAML file as the reloader) and SIGHUP on the
// real binary. A broken file must leave the running configuration alone
// and say what is wrong; a good one takes effect without dropping clients.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// obSidecarYAML is a configuration file for a sidecar poolerd in front of
// pg (app:secret), with app as admin; body adds keys (it must not repeat
// these).
func obSidecarYAML(body string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
http_listen: ""
upstream: postgres://%s:%s@%s:%d/%s
checkout_timeout: 10s
shutdown_timeout: 5s
log_level: debug
admin_users: [%s]
`, pgtest.RoleApp, pgtest.Password, pg.Host, pg.Port, pgtest.DBApp, pgtest.RoleApp) + body
}

// obWriteFile (re)writes path.
func obWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// obStartFile writes content to a file in a temporary directory and starts
// poolerd from it, with RELOAD reading the file again. It returns the
// instance and the file's path.
func obStartFile(t *testing.T, content string) (*obInst, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "poolerd.yaml")
	obWriteFile(t, path, content)
	loader, err := config.NewLoader([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loader.Load()
	if err != nil {
		t.Fatalf("initial configuration: %v", err)
	}
	return obStart(t, obOpts{cfg: cfg, reload: loader.Load}), path
}

// obReloadErr runs RELOAD, which must fail with F0000; it returns the
// error.
func obReloadErr(t *testing.T, adm *pgconn.PgConn) *pgconn.PgError {
	t.Helper()
	pe := obErr(t, adm, "RELOAD", "F0000", "RELOAD failed, see logs for additional details")
	t.Logf("RELOAD refused: detail %q", pe.Detail)
	return pe
}

func TestReloadBrokenFileKeepsServing(t *testing.T) {
	t.Parallel()
	good := obSidecarYAML("max_size: 4\n")
	p, path := obStartFile(t, good)
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	c := obConn(t, p.instance, pgtest.DBApp, "obreload")
	obExec(t, c, "SELECT 1")
	if v := obConfigValue(t, adm, "max_size"); v != "4" {
		t.Fatalf("max_size %q at start", v)
	}
	// Nothing changed: RELOAD is fine.
	obCmd(t, adm, "RELOAD", "RELOAD")

	for _, tc := range []struct {
		name, content string
		detail        []string // the detail must contain each
	}{
		{"syntax error", good + "max_size: [5\n", []string{path, "yaml"}},
		{"invalid value", obSidecarYAML("max_size: 0\n"), []string{"max_size 0 must be at least 1"}},
		{"min above max", obSidecarYAML("max_size: 2\nmin_size: 3\n"), []string{"min_size (3) exceeds max_size (2)"}},
		{"unknown key", obSidecarYAML("max_size: 6\nmax_sise: 7\n"), []string{"max_sise"}},
		{"duration without unit", obSidecarYAML("max_size: 6\nquery_timeout: 30\n"), []string{"query_timeout", "unit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obWriteFile(t, path, tc.content)
			pe := obReloadErr(t, adm)
			for _, want := range tc.detail {
				if !strings.Contains(pe.Detail, want) {
					t.Errorf("detail %q does not contain %q", pe.Detail, want)
				}
			}
			// Still serving, with the old values.
			obExec(t, c, "SELECT 1")
			connectDSN(t, p.appDSN(txExecMode))
			if v := obConfigValue(t, adm, "max_size"); v != "4" {
				t.Errorf("SHOW CONFIG max_size %q after a failed RELOAD, want 4", v)
			}
			obCheckMaxSize(t, p.instance, adm, 4, "after a failed RELOAD")
		})
	}
	if !strings.Contains(p.logs.String(), "configuration reload failed; keeping the running configuration") {
		t.Errorf("the failed reloads are not logged")
	}

	// Fixed: the new values take effect, for clients connected before too.
	obWriteFile(t, path, obSidecarYAML("max_size: 7\nquery_timeout: 400ms\n"))
	obCmd(t, adm, "RELOAD", "RELOAD")
	if v := obConfigValue(t, adm, "max_size"); v != "7" {
		t.Errorf("SHOW CONFIG max_size %q after RELOAD, want 7", v)
	}
	if v := obConfigValue(t, adm, "query_timeout"); v != "400ms" {
		t.Errorf("SHOW CONFIG query_timeout %q after RELOAD, want 400ms", v)
	}
	obCheckMaxSize(t, p.instance, adm, 7, "after RELOAD")
	t0 := time.Now()
	_, err := c.Exec(ctxTimeout(t, 20*time.Second), "SELECT pg_sleep(5)")
	took := time.Since(t0)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" || !strings.Contains(pe.Message, "query_timeout") {
		t.Fatalf("a query past the reloaded query_timeout on a connected client: %v after %s, want 57014 query_timeout", err, took)
	}
	if took < 350*time.Millisecond || took > 3*time.Second {
		t.Errorf("cancelled after %s, want about 400ms", took)
	}
	obExec(t, c, "SELECT 1")

	// SET is dropped by RELOAD: the file is the reference again.
	obCmd(t, adm, "SET max_size = 2", "SET max_size=2")
	obCmd(t, adm, "RELOAD", "RELOAD")
	if v := obConfigValue(t, adm, "max_size"); v != "7" {
		t.Errorf("max_size %q after SET and RELOAD, want the file's 7", v)
	}
}

func TestReloadAddRemoveDatabase(t *testing.T) {
	t.Parallel()
	base := fmt.Sprintf(`listen: 127.0.0.1:0
http_listen: ""
log_level: debug
checkout_timeout: 10s
shutdown_timeout: 5s
admin_users: [%s]
users:
  - name: %s
    password: %s
databases:
  - name: %s
    host: %s
    port: %d
`, pgtest.RoleApp, pgtest.RoleApp, pgtest.Password, pgtest.DBApp, pg.Host, pg.Port)
	extra := fmt.Sprintf(`  - name: obextra
    host: %s
    port: %d
    dbname: %s
`, pg.Host, pg.Port, pgtest.DBOther)
	p, path := obStartFile(t, base)
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	extraDSN := p.dsn(pgtest.RoleApp, pgtest.Password, "obextra", txExecMode)

	if pe := obLoginErr(t, extraDSN); pe.Code != "3D000" {
		t.Fatalf("login to an unknown database: %s %q, want 3D000", pe.Code, pe.Message)
	}

	// Added.
	obWriteFile(t, path, base+extra)
	obCmd(t, adm, "RELOAD", "RELOAD")
	k := connectDSN(t, extraDSN)
	if db := scalarText(t, k, "SELECT current_database()"); db != pgtest.DBOther {
		t.Fatalf("obextra is database %q, want %q", db, pgtest.DBOther)
	}
	dbs := obShow(t, adm, "SHOW DATABASES")
	if i := dbs.must(t, "SHOW DATABASES", "name", "obextra"); dbs.val(i, "database") != pgtest.DBOther {
		t.Errorf("SHOW DATABASES obextra:\n%s", dbs)
	}

	// Removed: new logins are refused, the connected client goes on.
	obWriteFile(t, path, base)
	obCmd(t, adm, "RELOAD", "RELOAD")
	if pe := obLoginErr(t, extraDSN); pe.Code != "3D000" || pe.Severity != "FATAL" {
		t.Fatalf("login to the removed database: %s %s %q, want FATAL 3D000", pe.Severity, pe.Code, pe.Message)
	}
	ctx := ctxTimeout(t, 20*time.Second)
	for i := range 3 {
		tx, err := k.Begin(ctx)
		if err != nil {
			t.Fatalf("transaction %d of the connected client: %v", i, err)
		}
		if db := scalarText(t, k, "SELECT current_database()"); db != pgtest.DBOther {
			t.Fatalf("connected client now on %q", db)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The app database is unaffected.
	obExec(t, connectDSN(t, p.appDSN(txExecMode)), "SELECT 1")
	// When the last client leaves, the pool goes.
	if err := k.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the removed database's pool to close", func() bool {
		for _, ps := range p.srv.Pools() {
			if ps.Database == "obextra" {
				return false
			}
		}
		return true
	})
	if i := obShow(t, adm, "SHOW DATABASES").find("name", "obextra"); i >= 0 {
		t.Errorf("SHOW DATABASES still lists obextra")
	}
}

// A reload whose file changes a key only a restart can change applies the
// rest and keeps that key's running value, with a WARN naming it (as
// PostgreSQL and PgBouncer reload).
func TestReloadRestartKeyKept(t *testing.T) {
	t.Parallel()
	p, path := obStartFile(t, obSidecarYAML("max_size: 4\n"))
	adm := obAdmin(t, p.instance, pgtest.RoleApp)
	content := strings.Replace(obSidecarYAML("max_size: 9\nquery_timeout: 1s\nhttp_pprof: true\n"), "listen: 127.0.0.1:0", "listen: 127.0.0.1:1", 1)
	obWriteFile(t, path, content)
	obCmd(t, adm, "RELOAD", "RELOAD")
	for key, want := range map[string]string{"max_size": "9", "query_timeout": "1s", "listen": "127.0.0.1:0", "http_pprof": "false"} {
		if v := obConfigValue(t, adm, key); v != want {
			t.Errorf("%s = %q after the RELOAD, want %q", key, v, want)
		}
	}
	obCheckMaxSize(t, p.instance, adm, 9, "after the RELOAD")
	logs := p.logs.String()
	for _, want := range []string{"settings that can only change with a restart keep their running values until then", `listen (running \"127.0.0.1:0\", file \"127.0.0.1:1\")`, "http_pprof (running"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log has no %q", want)
		}
	}
	obExec(t, connectDSN(t, p.appDSN(txExecMode)), "SELECT 1")
}

// ---------------------------------------------------------------------------
// SIGHUP on the real binary.

// obBuildBinary builds cmd/poolerd into a temporary directory.
func obBuildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not on PATH: cannot build the poolerd binary")
	}
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v %s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "poolerd")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, "./cmd/poolerd")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/poolerd: %v\n%s", err, out)
	}
	return bin
}

// obOutput collects a process's output.
type obOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *obOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *obOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// obFreeAddr returns 127.0.0.1:<a free port>.
func obFreeAddr(t *testing.T) string {
	t.Helper()
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func TestReloadSIGHUP(t *testing.T) {
	t.Parallel()
	bin := obBuildBinary(t)
	listen, httpListen := obFreeAddr(t), obFreeAddr(t)
	conf := func(body string) string {
		return fmt.Sprintf(`listen: %s
http_listen: %s
upstream: postgres://%s:%s@%s:%d/%s
admin_users: [%s]
shutdown_timeout: 5s
`, listen, httpListen, pgtest.RoleApp, pgtest.Password, pg.Host, pg.Port, pgtest.DBApp, pgtest.RoleApp) + body
	}
	path := filepath.Join(t.TempDir(), "poolerd.yaml")
	obWriteFile(t, path, conf("max_size: 3\n"))

	cmd := exec.Command(bin, "--config", path)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, config.EnvPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out := &obOutput{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		// SIGINT: the safe shutdown ends idle clients (SIGTERM would
		// wait for them to leave).
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("poolerd exit after SIGINT: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("poolerd did not stop within 10s of SIGINT")
		}
		if t.Failed() {
			dumpLog(t, "poolerd output", out.String())
		}
	})
	running := func() {
		t.Helper()
		select {
		case err := <-exited:
			t.Fatalf("poolerd exited: %v\n%s", err, out.String())
		default:
		}
	}

	p := &instance{addr: listen}
	var adm *pgconn.PgConn
	eventually(t, 15*time.Second, "the admin console", func() bool {
		running()
		c, err := pgconn.Connect(ctxTimeout(t, 2*time.Second), p.dsn(pgtest.RoleApp, pgtest.Password, "pgbouncer"))
		if err != nil {
			return false
		}
		adm = c
		return true
	})
	t.Cleanup(func() { _ = adm.Close(context.Background()) })
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	statsMaxSize := func() int {
		t.Helper()
		resp, err := hc.Get("http://" + httpListen + "/stats")
		if err != nil {
			t.Fatalf("/stats: %v", err)
		}
		defer resp.Body.Close()
		var doc struct {
			Database struct {
				Pool struct {
					MaxSize int `json:"max_size"`
				} `json:"pool"`
			} `json:"database"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
			t.Fatalf("/stats: %v", err)
		}
		return doc.Database.Pool.MaxSize
	}
	if v := obConfigValue(t, adm, "max_size"); v != "3" {
		t.Fatalf("max_size %q at start", v)
	}
	if n := statsMaxSize(); n != 3 {
		t.Fatalf("/stats max_size %d at start", n)
	}
	c := connectDSN(t, p.appDSN(txExecMode))
	obExec(t, c, "SELECT 1")

	if strings.Contains(out.String(), "\tDEBUG\t") {
		t.Fatalf("DEBUG lines at log_level info:\n%s", out.String())
	}

	obWriteFile(t, path, conf("max_size: 6\nlog_level: debug\n"))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "max_size 6 after SIGHUP", func() bool {
		return obConfigValue(t, adm, "max_size") == "6" && statsMaxSize() == 6
	})
	// The new log level applies: new server connections are logged at
	// debug level.
	obCmd(t, adm, "RECONNECT", "RECONNECT")
	obExec(t, c, "SELECT 1")
	eventually(t, 5*time.Second, "a DEBUG line after log_level: debug", func() bool {
		return strings.Contains(out.String(), "\tDEBUG\t")
	})
	if n := obPoolSize(t, adm, pgtest.DBApp); n != 6 {
		t.Errorf("SHOW DATABASES pool_size %d after SIGHUP, want 6", n)
	}
	obExec(t, c, "SELECT 1")

	// A broken file: logged, and the process goes on as it was.
	obWriteFile(t, path, conf("max_size: 6\nlog_level: debug\nmax_size: [\n"))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the failed reload logged", func() bool {
		return strings.Contains(out.String(), "configuration reload failed")
	})
	running()
	if !strings.Contains(out.String(), "SIGHUP received") {
		t.Errorf("SIGHUP not logged")
	}
	obExec(t, c, "SELECT 1")
	obExec(t, connectDSN(t, p.appDSN(txExecMode)), "SELECT 1")
	if v := obConfigValue(t, adm, "max_size"); v != "6" {
		t.Errorf("max_size %q after a broken SIGHUP reload, want 6", v)
	}
	if n := statsMaxSize(); n != 6 {
		t.Errorf("/stats max_size %d after a broken SIGHUP reload", n)
	}
}
