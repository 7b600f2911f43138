// Package pgtest starts throwaway PostgreSQL servers for integration tests.
//
// A server is created with Start, which runs initdb into a fresh temporary
// directory, starts PostgreSQL on 127.0.0.1 and creates a fixed set of
// fixtures (roles, databases, pg_hba.conf rules) described by the exported
// constants of this package.
//
// The postmaster is started through pg_ctl and therefore runs detached from
// the test binary: it is NOT killed automatically when the test process
// exits. Callers must call Server.Cleanup when they are done, normally from
// TestMain after m.Run (or via t.Cleanup for a per-test server):
//
//	func TestMain(m *testing.M) {
//		srv, err := pgtest.Start(pgtest.Options{})
//		if err != nil { ... }
//		code := m.Run()
//		srv.Cleanup()
//		os.Exit(code)
//	}
//
// When the test process runs as root (uid 0), every initdb/pg_ctl/postgres
// invocation is run as the "postgres" OS user via runuser, because
// PostgreSQL refuses to run as root; the temporary directory is chowned to
// that user.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Fixture names created by Start. Other tests rely on these names.
const (
	// Password is the password of every fixture role.
	Password = "secret"

	// RoleApp is a LOGIN role with a SCRAM-SHA-256 stored password; it owns
	// DBApp and DBOther.
	RoleApp = "app"
	// RoleSCRAM is a LOGIN role with a SCRAM-SHA-256 stored password,
	// authenticated with the scram-sha-256 method over TCP.
	RoleSCRAM = "scram_user"
	// RoleMD5 is a LOGIN role whose password is stored as an MD5 hash and
	// which is authenticated with the md5 method over TCP.
	RoleMD5 = "md5_user"
	// RoleClear is a LOGIN role authenticated with the cleartext "password"
	// method over TCP (its password is stored as SCRAM-SHA-256).
	RoleClear = "clear_user"
	// RoleTrust is a LOGIN role authenticated with the trust method over
	// TCP: no password is required (it still has Password set).
	RoleTrust = "trust_user"

	// DBApp is a database owned by RoleApp. Every fixture role has
	// CONNECT/CREATE on it and USAGE/CREATE on its public schema.
	DBApp = "app"
	// DBOther is a second database owned by RoleApp, with the same grants
	// as DBApp.
	DBOther = "other"

	// SuperUser is the name of the bootstrap superuser. Its password is
	// generated per server and only available through SuperDSN.
	SuperUser = "postgres"
)

// fixtureRoles lists every fixture role.
var fixtureRoles = []string{RoleApp, RoleSCRAM, RoleMD5, RoleClear, RoleTrust}

// hbaConf replaces the pg_hba.conf written by initdb. First match wins.
const hbaConf = `# pg_hba.conf written by poolerd test/pgtest
local all all trust
local replication all trust
host all ` + RoleMD5 + ` 127.0.0.1/32 md5
host all ` + RoleClear + ` 127.0.0.1/32 password
host all ` + RoleTrust + ` 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
`

const (
	readyTimeout = 30 * time.Second
	// cmdTimeout bounds a single initdb/pg_ctl invocation (pg_ctl itself
	// is given -t 30).
	cmdTimeout    = 90 * time.Second
	logFileName   = "server.log"
	confFileName  = "pgtest.conf"
	postgresOSUsr = "postgres"
	// maxSocketPath is the usable length of a Unix socket path
	// (sizeof(sun_path)-1 on Linux).
	maxSocketPath = 107
)

// Options configures Start.
type Options struct {
	// Port to listen on (127.0.0.1 only); 0 picks a free port.
	Port int
	// ExtraConf lines appended to postgresql.conf.
	ExtraConf []string
	// Logf receives harness progress (e.g. t.Logf); nil = silent.
	Logf func(format string, args ...any)
	// SSL turns ssl on with a throwaway certificate authority (Server.TLS)
	// and accepts TCP connections over SSL only (hostssl rules; plain TCP
	// is rejected with 28000).
	SSL bool
}

// Server is a throwaway PostgreSQL server started by Start.
type Server struct {
	// Host is the address the server listens on: always "127.0.0.1".
	Host string
	// Port is the TCP port the server listens on.
	Port int
	// DataDir is the PostgreSQL data directory (inside a temp dir).
	DataDir string
	// BinDir is the directory where initdb/pg_ctl/postgres were found.
	BinDir string
	// TLS are the certificate files of an SSL server (Options.SSL).
	TLS TLSFiles

	superPassword string
	rootDir       string // temp dir holding DataDir; removed by Cleanup
	socketDir     string // unix_socket_directories
	extraSockDir  string // separate short socket dir to remove, if any
	logFile       string
	extraConf     []string
	logf          func(format string, args ...any)
	asPostgres    bool // run server commands via runuser -u postgres
	uid, gid      int  // owner for files when asPostgres

	mu      sync.Mutex
	running bool
	cleaned bool
}

// FindBinDir returns the directory holding initdb, pg_ctl and postgres: the
// directory of the initdb found on PATH (symlinks resolved) if present, else
// the highest-versioned /usr/lib/postgresql/*/bin.
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		candidates := []string{}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
		for _, dir := range candidates {
			if hasServerBinaries(dir) {
				return dir, nil
			}
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	type cand struct {
		dir string
		ver []int
	}
	var cands []cand
	for _, m := range matches {
		if !hasServerBinaries(m) {
			continue
		}
		cands = append(cands, cand{m, parseVersion(filepath.Base(filepath.Dir(m)))})
	}
	if len(cands) == 0 {
		return "", errors.New("pgtest: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; install PostgreSQL: apt-get install postgresql")
	}
	sort.Slice(cands, func(i, j int) bool { return versionLess(cands[j].ver, cands[i].ver) })
	return cands[0].dir, nil
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

func parseVersion(s string) []int {
	var v []int
	for _, part := range strings.Split(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return append(v, -1)
		}
		v = append(v, n)
	}
	return v
}

func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// FreePort returns a TCP port on 127.0.0.1 that was free at the time of the
// call.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start runs initdb into a new temp dir, configures and starts PostgreSQL,
// waits until it accepts connections (timeout 30s; the error includes the
// tail of the server log) and creates the fixtures (see the package
// constants). If anything fails midway, the server is stopped and the temp
// dir removed. Callers must call Cleanup when done.
func Start(opts Options) (_ *Server, err error) {
	begin := time.Now()
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{
		Host:      "127.0.0.1",
		Port:      opts.Port,
		BinDir:    binDir,
		extraConf: append([]string(nil), opts.ExtraConf...),
		logf:      opts.Logf,
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(postgresOSUsr)
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root requires the %q OS user to run PostgreSQL (install PostgreSQL: apt-get install postgresql): %w", postgresOSUsr, err)
		}
		s.uid, _ = strconv.Atoi(u.Uid)
		s.gid, _ = strconv.Atoi(u.Gid)
		s.asPostgres = true
		if _, err := runuserPath(); err != nil {
			return nil, err
		}
	}
	if s.Port == 0 {
		if s.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}

	pw := make([]byte, 16)
	if _, err := rand.Read(pw); err != nil {
		return nil, fmt.Errorf("pgtest: generate password: %w", err)
	}
	s.superPassword = hex.EncodeToString(pw)

	base, err := s.baseTempDir()
	if err != nil {
		return nil, err
	}
	s.rootDir, err = os.MkdirTemp(base, "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: create temp dir: %w", err)
	}
	defer func() {
		if err != nil {
			if cerr := s.Cleanup(); cerr != nil {
				err = fmt.Errorf("%w (cleanup also failed: %v)", err, cerr)
			}
		}
	}()
	if err := s.chown(s.rootDir); err != nil {
		return nil, err
	}
	s.DataDir = filepath.Join(s.rootDir, "data")
	s.logFile = filepath.Join(s.DataDir, logFileName)
	if err := s.pickSocketDir(); err != nil {
		return nil, err
	}

	// initdb
	pwFile := filepath.Join(s.rootDir, "pwfile")
	if err := os.WriteFile(pwFile, []byte(s.superPassword+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("pgtest: write password file: %w", err)
	}
	if err := s.chown(pwFile); err != nil {
		return nil, err
	}
	s.logf("pgtest: initdb %s (bin %s)", s.DataDir, s.BinDir)
	_, err = s.run("initdb",
		"-D", s.DataDir,
		"-U", SuperUser,
		"--auth-local=trust",
		"--auth-host=scram-sha-256",
		"--pwfile="+pwFile,
		"-E", "UTF8",
		"--locale=C",
		"--no-sync",
	)
	os.Remove(pwFile)
	if err != nil {
		return nil, err
	}

	// Configuration. pg_hba.conf is installed before the first start, which
	// is equivalent to writing it afterwards and reloading, without the
	// race of an asynchronous reload.
	hba := hbaConf
	if opts.SSL {
		if s.TLS, err = MakeTLSFiles(s.rootDir); err != nil {
			return nil, err
		}
		for _, f := range []struct{ from, to string }{{s.TLS.ServerCert, "server.crt"}, {s.TLS.ServerKey, "server.key"}, {s.TLS.CA, "root.crt"}} {
			data, err := os.ReadFile(f.from)
			if err != nil {
				return nil, err
			}
			if err := s.writeFile(filepath.Join(s.DataDir, f.to), data); err != nil {
				return nil, err
			}
		}
		s.extraConf = append(s.extraConf, "ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'", "ssl_ca_file = 'root.crt'")
		hba = strings.ReplaceAll(hba, "\nhost ", "\nhostssl ")
	}
	if err := s.writeFile(filepath.Join(s.DataDir, "pg_hba.conf"), []byte(hba)); err != nil {
		return nil, err
	}
	if err := s.appendFile(filepath.Join(s.DataDir, "postgresql.conf"),
		"\n# added by poolerd test/pgtest\ninclude '"+confFileName+"'\n"); err != nil {
		return nil, err
	}

	// Start; when the port was picked by us, retry with another port if
	// somebody grabbed it in the meantime.
	for attempt := 1; ; attempt++ {
		if err := s.writeConf(); err != nil {
			return nil, err
		}
		err = s.start()
		if err == nil {
			break
		}
		if opts.Port != 0 || attempt >= 3 || !strings.Contains(err.Error(), "could not bind") {
			return nil, err
		}
		s.logf("pgtest: port %d taken, retrying with another port", s.Port)
		if s.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}

	if err := s.createFixtures(); err != nil {
		return nil, fmt.Errorf("%w\nserver log tail:\n%s", err, s.LogTail(30))
	}
	s.logf("pgtest: PostgreSQL ready on %s (data %s) in %v", s.Addr(), s.DataDir, time.Since(begin).Round(time.Millisecond))
	return s, nil
}

// pickSocketDir sets the server's Unix socket directory: its data dir, or
// a short directory of its own when that path would be too long.
func (s *Server) pickSocketDir() error {
	s.socketDir = s.DataDir
	if len(s.socketDir)+len("/.s.PGSQL.65535.lock") > maxSocketPath {
		var err error
		s.extraSockDir, err = os.MkdirTemp("/tmp", "pgs")
		if err != nil {
			return fmt.Errorf("pgtest: create socket dir: %w", err)
		}
		if err := s.chown(s.extraSockDir); err != nil {
			return err
		}
		s.socketDir = s.extraSockDir
	}
	return nil
}

// StartReplica makes a streaming replica of s (pg_basebackup -R over s's
// Unix socket) and starts it, hot standby, on a port of its own. It has
// s's roles, databases and superuser password. Callers must call its
// Cleanup.
func (s *Server) StartReplica() (_ *Server, err error) {
	r := &Server{Host: s.Host, BinDir: s.BinDir, superPassword: s.superPassword, logf: s.logf,
		extraConf: append([]string(nil), s.extraConf...), asPostgres: s.asPostgres, uid: s.uid, gid: s.gid, TLS: s.TLS}
	if r.Port, err = FreePort(); err != nil {
		return nil, err
	}
	base, err := r.baseTempDir()
	if err != nil {
		return nil, err
	}
	if r.rootDir, err = os.MkdirTemp(base, "pgtest-replica-"); err != nil {
		return nil, fmt.Errorf("pgtest: create temp dir: %w", err)
	}
	defer func() {
		if err != nil {
			if cerr := r.Cleanup(); cerr != nil {
				err = fmt.Errorf("%w (cleanup also failed: %v)", err, cerr)
			}
		}
	}()
	if err := r.chown(r.rootDir); err != nil {
		return nil, err
	}
	r.DataDir = filepath.Join(r.rootDir, "data")
	r.logFile = filepath.Join(r.DataDir, logFileName)
	if err := r.pickSocketDir(); err != nil {
		return nil, err
	}
	if _, err := r.run("pg_basebackup", "-D", r.DataDir, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
		"-h", s.socketDir, "-p", strconv.Itoa(s.Port), "-U", SuperUser); err != nil {
		return nil, err
	}
	if err := r.writeConf(); err != nil { // its own port and socket directory
		return nil, err
	}
	if err := r.start(); err != nil {
		return nil, err
	}
	s.logf("pgtest: replica of %s ready on %s", s.Addr(), r.Addr())
	return r, nil
}

// Promote ends recovery on a replica (pg_ctl promote) and waits until it
// accepts writes.
func (s *Server) Promote() error {
	_, err := s.run("pg_ctl", "promote", "-w", "-t", "30", "-D", s.DataDir)
	return err
}

// baseTempDir returns the directory in which the server's temp dir is
// created. When running as root, the postgres OS user must be able to
// traverse every ancestor, so fall back to /tmp if os.TempDir() is not.
func (s *Server) baseTempDir() (string, error) {
	if !s.asPostgres {
		return os.TempDir(), nil
	}
	for _, d := range []string{os.TempDir(), "/tmp"} {
		if traversableByOthers(d) {
			return d, nil
		}
	}
	return "", errors.New("pgtest: neither $TMPDIR nor /tmp is traversable by the postgres OS user")
}

func traversableByOthers(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	abs, err = filepath.EvalSymlinks(abs)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == "/" {
			return true
		}
	}
}

func (s *Server) writeConf() error {
	lines := []string{
		"# generated by poolerd test/pgtest",
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", s.Port),
		"unix_socket_directories = " + quoteConf(s.socketDir),
		"max_connections = 300",
		"fsync = off",
		"synchronous_commit = off",
		"full_page_writes = off",
		"shared_buffers = 128MB",
		"logging_collector = off",
		"password_encryption = 'scram-sha-256'",
	}
	if len(s.extraConf) > 0 {
		lines = append(lines, "# Options.ExtraConf")
		lines = append(lines, s.extraConf...)
	}
	return s.writeFile(filepath.Join(s.DataDir, confFileName), []byte(strings.Join(lines, "\n")+"\n"))
}

func quoteConf(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// writeFile writes a file inside the data dir and makes it owned by the
// server's OS user.
func (s *Server) writeFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("pgtest: write %s: %w", path, err)
	}
	return s.chown(path)
}

func (s *Server) appendFile(path, data string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: open %s: %w", path, err)
	}
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		return fmt.Errorf("pgtest: append to %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pgtest: close %s: %w", path, err)
	}
	return s.chown(path)
}

func (s *Server) chown(path string) error {
	if !s.asPostgres {
		return nil
	}
	if err := os.Chown(path, s.uid, s.gid); err != nil {
		return fmt.Errorf("pgtest: chown %s to %s: %w", path, postgresOSUsr, err)
	}
	return nil
}

func runuserPath() (string, error) {
	if p, err := exec.LookPath("runuser"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("pgtest: running as root requires runuser (util-linux) to run PostgreSQL as the postgres user")
}

// cleanEnv drops PG* variables so they cannot redirect the tools.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// run executes one of the server binaries (as the postgres OS user when
// running as root) and returns its combined output; a failure's error
// includes that output.
func (s *Server) run(tool string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	bin := filepath.Join(s.BinDir, tool)
	var cmd *exec.Cmd
	if s.asPostgres {
		ru, err := runuserPath()
		if err != nil {
			return "", err
		}
		cmd = exec.CommandContext(ctx, ru, append([]string{"-u", postgresOSUsr, "--", bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	cmd.Dir = s.rootDir // the postgres user may not be able to access our cwd
	cmd.Env = cleanEnv()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// The postmaster's output is redirected to the log file by pg_ctl, but
	// never hang on a pipe held open by a stray grandchild.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		who := ""
		if s.asPostgres {
			who = " (as OS user " + postgresOSUsr + ")"
		}
		return out.String(), fmt.Errorf("pgtest: %s %s%s failed: %w\noutput:\n%s",
			tool, strings.Join(args, " "), who, err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// start runs pg_ctl start and waits until the server accepts TCP
// connections as the superuser.
func (s *Server) start() error {
	deadline := time.Now().Add(readyTimeout)
	s.logf("pgtest: starting PostgreSQL on %s", s.Addr())
	_, err := s.run("pg_ctl", "start", "-w", "-t", "30", "-D", s.DataDir, "-l", s.logFile)
	if err != nil {
		// pg_ctl may time out while the postmaster is still coming up.
		s.mu.Lock()
		s.running = s.pidFileExists()
		s.mu.Unlock()
		return fmt.Errorf("%w\nserver log tail:\n%s", err, s.LogTail(30))
	}
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	if err := s.waitReady(deadline); err != nil {
		return fmt.Errorf("%w\nserver log tail:\n%s", err, s.LogTail(30))
	}
	return nil
}

func (s *Server) waitReady(deadline time.Time) error {
	var lastErr error
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		cfg, err := pgx.ParseConfig(s.SuperDSN("postgres"))
		if err != nil {
			cancel()
			return fmt.Errorf("pgtest: parse superuser DSN: %w", err)
		}
		cfg.ConnectTimeout = 5 * time.Second
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.Background())
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: PostgreSQL on %s not ready after %v: %w", s.Addr(), readyTimeout, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Server) pidFileExists() bool {
	_, err := os.Stat(filepath.Join(s.DataDir, "postmaster.pid"))
	return err == nil
}

func quoteLiteral(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

func (s *Server) createFixtures() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pw := quoteLiteral(Password)
	others := pgx.Identifier{RoleSCRAM}.Sanitize() + ", " + pgx.Identifier{RoleMD5}.Sanitize() + ", " +
		pgx.Identifier{RoleClear}.Sanitize() + ", " + pgx.Identifier{RoleTrust}.Sanitize()
	all := pgx.Identifier{RoleApp}.Sanitize() + ", " + others
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }

	// Statements are sent one by one: CREATE DATABASE cannot run inside the
	// implicit transaction of a multi-statement query, and the md5 SET must
	// happen in the same session as its CREATE ROLE.
	stmts := []string{
		"SET password_encryption = 'scram-sha-256'",
		"CREATE ROLE " + id(RoleApp) + " LOGIN PASSWORD " + pw,
		"CREATE ROLE " + id(RoleSCRAM) + " LOGIN PASSWORD " + pw,
		"CREATE ROLE " + id(RoleClear) + " LOGIN PASSWORD " + pw,
		"CREATE ROLE " + id(RoleTrust) + " LOGIN PASSWORD " + pw,
		"SET password_encryption = 'md5'",
		"CREATE ROLE " + id(RoleMD5) + " LOGIN PASSWORD " + pw,
		"RESET password_encryption",
		"CREATE DATABASE " + id(DBApp) + " OWNER " + id(RoleApp),
		"CREATE DATABASE " + id(DBOther) + " OWNER " + id(RoleApp),
		"GRANT CONNECT, CREATE ON DATABASE " + id(DBApp) + " TO " + all,
		"GRANT CONNECT, CREATE ON DATABASE " + id(DBOther) + " TO " + all,
	}
	if err := s.execAll(ctx, "postgres", stmts); err != nil {
		return err
	}
	for _, db := range []string{DBApp, DBOther} {
		if err := s.execAll(ctx, db, []string{
			"GRANT USAGE, CREATE ON SCHEMA public TO " + all,
		}); err != nil {
			return err
		}
	}
	s.logf("pgtest: created roles %v and databases %s, %s", fixtureRoles, DBApp, DBOther)
	return nil
}

func (s *Server) execAll(ctx context.Context, db string, stmts []string) error {
	conn, err := pgx.Connect(ctx, s.SuperDSN(db))
	if err != nil {
		return fmt.Errorf("pgtest: connect as superuser to %q: %w", db, err)
	}
	defer conn.Close(context.Background())
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgtest: %s: %w", q, err)
		}
	}
	return nil
}

// Stop stops the server with pg_ctl stop -m fast and keeps the data dir so
// that StartAgain can resume it. Stopping a stopped server is a no-op.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

func (s *Server) stopLocked() error {
	return s.stopModeLocked("fast")
}

// stopModeLocked runs pg_ctl stop with the given shutdown mode (smart, fast
// or immediate).
func (s *Server) stopModeLocked(mode string) error {
	if s.cleaned {
		return errors.New("pgtest: server already cleaned up")
	}
	if !s.running && !s.pidFileExists() {
		return nil
	}
	s.logf("pgtest: stopping PostgreSQL on %s", s.Addr())
	_, err := s.run("pg_ctl", "stop", "-w", "-t", "30", "-D", s.DataDir, "-m", mode)
	if err != nil && !s.pidFileExists() {
		err = nil // already gone
	}
	if err != nil {
		return fmt.Errorf("%w\nserver log tail:\n%s", err, s.LogTail(30))
	}
	s.running = false
	return nil
}

// StartAgain starts the stopped server again (pg_ctl start) on the same
// data dir and port, and waits until it accepts connections.
func (s *Server) StartAgain() error {
	s.mu.Lock()
	cleaned, running := s.cleaned, s.running
	s.mu.Unlock()
	if cleaned {
		return errors.New("pgtest: server already cleaned up")
	}
	if running {
		return fmt.Errorf("pgtest: server on %s is already running", s.Addr())
	}
	return s.start()
}

// Restart stops the server (fast shutdown) and starts it again on the same
// data dir and port.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.StartAgain()
}

// RestartImmediate stops the server with an immediate shutdown (every
// backend is killed at once, no checkpoint: what a crash looks like; the
// start runs crash recovery) and starts it again on the same data dir and
// port.
func (s *Server) RestartImmediate() error {
	s.mu.Lock()
	err := s.stopModeLocked("immediate")
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.StartAgain()
}

// Cleanup stops the server if it is running and removes its temp dir.
// It is safe to call more than once. Callers must call it (typically in
// TestMain or t.Cleanup): the server otherwise outlives the test binary.
func (s *Server) Cleanup() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cleaned {
		return nil
	}
	var errs []error
	if s.DataDir != "" && (s.running || s.pidFileExists()) {
		if err := s.stopLocked(); err != nil {
			errs = append(errs, err)
			if _, err := s.run("pg_ctl", "stop", "-w", "-t", "30", "-D", s.DataDir, "-m", "immediate"); err != nil && s.pidFileExists() {
				s.killPostmaster()
			}
		}
	}
	s.running = false
	for _, dir := range []string{s.rootDir, s.extraSockDir} {
		if dir == "" {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("pgtest: remove %s: %w", dir, err))
		}
	}
	s.cleaned = true
	return errors.Join(errs...)
}

// killPostmaster is the last resort when pg_ctl cannot stop our server: it
// SIGKILLs the postmaster recorded in this server's postmaster.pid (its
// backends exit when they notice the postmaster died).
func (s *Server) killPostmaster() {
	data, err := os.ReadFile(filepath.Join(s.DataDir, "postmaster.pid"))
	if err != nil {
		return
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return
	}
	s.logf("pgtest: killing postmaster pid %d", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50; i++ {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Addr returns the server's TCP address, "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
}

// SuperDSN returns a URL DSN for the superuser (postgres) and database db:
// postgres://postgres:<pw>@127.0.0.1:port/db?sslmode=disable.
func (s *Server) SuperDSN(db string) string {
	return s.DSN(SuperUser, s.superPassword, db)
}

// DSN returns a URL DSN postgres://user:password@127.0.0.1:port/db?sslmode=disable
// (sslmode=require for a server started with Options.SSL) with all parts
// URL-escaped. An empty password omits the password part.
func (s *Server) DSN(user, password, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		Host:     s.Addr(),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	if s.TLS.CA != "" {
		u.RawQuery = "sslmode=require"
	}
	if password == "" {
		u.User = url.User(user)
	} else {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// Exec runs sql on database db as the superuser over a fresh pgx
// connection. Without arguments pgx uses the simple protocol, so sql may
// contain several statements (run in one implicit transaction).
func (s *Server) Exec(ctx context.Context, db, sql string) error {
	conn, err := pgx.Connect(ctx, s.SuperDSN(db))
	if err != nil {
		return fmt.Errorf("pgtest: connect as superuser to %q: %w", db, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: exec on %q: %w", db, err)
	}
	return nil
}

// LogTail returns the last n lines of the server log, for failure
// messages. It returns "" if the log cannot be read.
func (s *Server) LogTail(n int) string {
	if s.logFile == "" || n <= 0 {
		return ""
	}
	data, err := os.ReadFile(s.logFile)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
