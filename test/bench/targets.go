package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/test/pgtest"
)

const (
	targetDirect    = "direct"
	targetPoolerd   = "poolerd"
	targetPgbouncer = "pgbouncer"
	targetBare      = "bare relay"

	benchUser = pgtest.RoleApp
	benchDB   = pgtest.DBApp
	benchPass = pgtest.Password
)

// target is something pgbench connects to: PostgreSQL itself or a pooler
// in front of it.
type target struct {
	name string
	port int
	// proc is the pooler process (nil for direct); launch (re)starts it.
	proc   *proc
	launch func() (*proc, error)
	// cmdline describes how the target was started, for the report.
	cmdline string
	// tls: clients (the harness's own logins too) connect with TLS.
	tls bool
	// matrixOnly: the target runs in the pgbench -S matrix only (the bare
	// relay: one PostgreSQL connection per client, no logins of its own),
	// not in the storm, churn and idle tests.
	matrixOnly bool
	events     []string // restarts and why
}

func (t *target) pid() int {
	if t.proc == nil {
		return 0
	}
	return t.proc.pid()
}

func (t *target) addr() string { return fmt.Sprintf("127.0.0.1:%d", t.port) }

// start launches the pooler and waits until a client can log in.
func (t *target) start(ctx context.Context) error {
	if t.launch == nil {
		return nil
	}
	p, err := t.launch()
	if err != nil {
		return err
	}
	t.proc = p
	if err := waitLogin(ctx, t.addr(), p, 30*time.Second, t.tls); err != nil {
		p.stop()
		return fmt.Errorf("%s did not accept logins: %w\nlog tail:\n%s", t.name, err, p.logTail(20))
	}
	return nil
}

func (t *target) stop() {
	if t.proc != nil {
		t.proc.stop()
	}
}

// ensureRunning restarts a pooler that died, recording why.
func (t *target) ensureRunning(ctx context.Context, logf func(string, ...any)) error {
	if t.proc == nil || t.proc.alive() {
		return nil
	}
	ev := fmt.Sprintf("%s exited (%v); restarted. Log tail: %s", t.name, t.proc.waitErr,
		strings.ReplaceAll(t.proc.logTail(5), "\n", " | "))
	t.events = append(t.events, ev)
	logf("bench: %s", ev)
	t.proc.stop()
	return t.start(ctx)
}

func waitLogin(ctx context.Context, addr string, p *proc, limit time.Duration, useTLS bool) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p != nil && !p.alive() {
			return fmt.Errorf("process exited: %v", p.waitErr)
		}
		c, err := login(addr, benchUser, benchPass, benchDB, 5*time.Second, useTLS)
		if err == nil {
			c.Close()
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %v: %v", limit, last)
}

// buildPoolerd builds ./cmd/poolerd into root/bin/poolerd, as `make build`.
func buildPoolerd(ctx context.Context, root string) (string, error) {
	bin := filepath.Join(root, "bin", "poolerd")
	version := "dev"
	if out, err := exec.Command("git", "-C", root, "describe", "--tags", "--always", "--dirty").Output(); err == nil {
		version = strings.TrimSpace(string(out))
	}
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags", "-X main.version="+version, "-o", bin, "./cmd/poolerd")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/poolerd: %w\n%s", err, out)
	}
	return bin, nil
}

// repoRoot returns the directory of the main module's go.mod.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module: run from the poolerd repository")
	}
	return filepath.Dir(mod), nil
}

// poolerdTarget prepares poolerd in transaction mode, pool size 20, SCRAM
// client auth, log level warn. With tlsFiles (-tls) it requires TLS from
// clients (client_tls_sslmode require, tlsFiles' server certificate) and
// uses TLS to PostgreSQL (server_tls_sslmode require). extra are more
// POOLERD_ settings (-poolerd-env), shown in the report's command line.
func poolerdTarget(bin, workDir string, pg *pgtest.Server, maxClients int, tlsFiles *pgtest.TLSFiles, extra ...string) (*target, error) {
	port, err := pgtest.FreePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := pgtest.FreePort()
	if err != nil {
		return nil, err
	}
	upstream := fmt.Sprintf("postgres://%s:%s@%s/%s", benchUser, benchPass, pg.Addr(), benchDB)
	argv := []string{bin,
		"--upstream", upstream,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--pool-mode", "transaction",
		"--pool-size", "20",
		"--auth-type", "scram-sha-256",
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"--log-level", "warn",
	}
	settings := []string{fmt.Sprintf("POOLERD_MAX_CLIENT_CONN=%d", maxClients)}
	if tlsFiles != nil {
		settings = append(settings, "POOLERD_CLIENT_TLS_SSLMODE=require",
			"POOLERD_CLIENT_TLS_CERT_FILE="+tlsFiles.ServerCert, "POOLERD_CLIENT_TLS_KEY_FILE="+tlsFiles.ServerKey,
			"POOLERD_SERVER_TLS_SSLMODE=require")
	}
	settings = append(settings, extra...)
	env := append([]string(nil), settings...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "POOLERD_") && !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	t := &target{name: targetPoolerd, port: port, tls: tlsFiles != nil,
		cmdline: fmt.Sprintf("%s %s", strings.Join(settings, " "), strings.Join(argv, " "))}
	n := 0
	t.launch = func() (*proc, error) {
		n++
		return startProc(targetPoolerd, argv, env, workDir, filepath.Join(workDir, fmt.Sprintf("poolerd-%d.log", n)), nil)
	}
	return t, nil
}

// scramSecret is the role's SCRAM secret as PostgreSQL stores it (what
// auth_query would return).
func scramSecret(ctx context.Context, pg *pgtest.Server, role string) (string, error) {
	conn, err := pgx.Connect(ctx, pg.SuperDSN(benchDB))
	if err != nil {
		return "", fmt.Errorf("reading %s's SCRAM secret: %w", role, err)
	}
	defer conn.Close(ctx)
	var secret string
	if err := conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&secret); err != nil {
		return "", fmt.Errorf("reading %s's SCRAM secret: %w", role, err)
	}
	return secret, nil
}

// pgbouncerTarget prepares PgBouncer with poolerd's settings: transaction
// mode, default_pool_size 20, SCRAM client auth from an auth_file. The
// auth_file holds secret, the role's SCRAM secret from PostgreSQL, as
// PgBouncer is deployed with SCRAM (the password itself when secret is
// ""): PgBouncer then logs in to PostgreSQL with the client's proof, and
// derives no key per login, as poolerd derives none (its salted password
// is cached). PgBouncer
// refuses to run as root: as root it runs as the postgres OS user, from a
// directory that user owns. With tlsFiles (-tls) it requires TLS from
// clients and uses TLS to PostgreSQL, as poolerdTarget: client_tls_sslmode
// and server_tls_sslmode require, with copies of tlsFiles' server
// certificate and key that PgBouncer's user can read.
func pgbouncerTarget(bin, workDir string, pg *pgtest.Server, maxClients int, tlsFiles *pgtest.TLSFiles, secret string) (*target, error) {
	port, err := pgtest.FreePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(workDir, "pgbouncer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root: pgbouncer needs the postgres OS user: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	users := filepath.Join(dir, "users.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	iniText := fmt.Sprintf(`[databases]
%s = host=127.0.0.1 port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = transaction
default_pool_size = 20
max_client_conn = %d
log_connections = 0
log_disconnections = 0
ignore_startup_parameters = extra_float_digits
`, benchDB, pg.Port, benchDB, port, users, maxClients)
	usersLine := fmt.Sprintf("%q %q", benchUser, benchPass)
	shown := usersLine
	if secret != "" {
		usersLine = fmt.Sprintf("%q %q", benchUser, secret)
		shown = fmt.Sprintf("%q \"SCRAM-SHA-256$...\" (the role's secret from pg_authid)", benchUser)
	}
	files := map[string]string{users: usersLine + "\n"}
	if tlsFiles != nil {
		cert, key := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
		for from, to := range map[string]string{tlsFiles.ServerCert: cert, tlsFiles.ServerKey: key} {
			data, err := os.ReadFile(from)
			if err != nil {
				return nil, fmt.Errorf("pgbouncer TLS files: %w", err)
			}
			files[to] = string(data)
		}
		iniText += fmt.Sprintf(`client_tls_sslmode = require
client_tls_cert_file = %s
client_tls_key_file = %s
server_tls_sslmode = require
`, cert, key)
	}
	files[ini] = iniText
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	if cred != nil {
		owned := []string{dir}
		for path := range files {
			owned = append(owned, path)
		}
		for _, p := range owned {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, err
			}
		}
	}
	argv := []string{bin, ini}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	as := ""
	if cred != nil {
		as = " (as OS user postgres)"
	}
	t := &target{name: targetPgbouncer, port: port, tls: tlsFiles != nil,
		cmdline: strings.Join(argv, " ") + as + "\n\n" + strings.TrimSpace(iniText) + "\n\n# users.txt: " + shown}
	n := 0
	t.launch = func() (*proc, error) {
		n++
		return startProc(targetPgbouncer, argv, env, dir, filepath.Join(workDir, fmt.Sprintf("pgbouncer-%d.log", n)), cred)
	}
	return t, nil
}

// bareRelayTarget builds the bare Go relay of ../shared/rig/bare-relay (dir)
// into workDir and prepares it: one event loop whose epoll descriptor waits
// in the runtime's poller, sockets off their net.Conn, no pooling, no
// parsing, one PostgreSQL connection per client. It is the yardstick of
// what Go itself costs per transaction: what poolerd spends above it is its
// own design's (issue 32).
func bareRelayTarget(ctx context.Context, dir, workDir string, pg *pgtest.Server) (*target, error) {
	bin := filepath.Join(workDir, "bare-relay")
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the bare relay in %s: %w\n%s", dir, err, out)
	}
	port, err := pgtest.FreePort()
	if err != nil {
		return nil, err
	}
	argv := []string{bin, "-mode", "nested", "-loops", "1", "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-upstream", pg.Addr()}
	t := &target{name: targetBare, port: port, matrixOnly: true,
		cmdline: fmt.Sprintf("%s (built from %s)", strings.Join(argv, " "), dir)}
	n := 0
	t.launch = func() (*proc, error) {
		n++
		return startProc(targetBare, argv, os.Environ(), workDir, filepath.Join(workDir, fmt.Sprintf("bare-relay-%d.log", n)), nil)
	}
	return t, nil
}
