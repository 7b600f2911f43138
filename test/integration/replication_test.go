package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/test/pgtest"
)

// replRole is the role the replication tests log in as (REPLICATION).
const replRole = "repl_user"

// startReplicationServer starts a PostgreSQL of the test's own with
// wal_level logical and a REPLICATION role, and a poolerd in front of it
// in transaction mode (replication connections are passed through in any
// mode), whose admin console replRole may use.
func startReplicationServer(t *testing.T, mutate func(c *config.Config)) (*pgtest.Server, *instance) {
	t.Helper()
	srv, err := pgtest.Start(pgtest.Options{ExtraConf: []string{"wal_level = logical"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Cleanup() })
	ctx := ctxTimeout(t, time.Minute)
	if err := srv.Exec(ctx, "postgres", fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", replRole, pgtest.Password)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, pgtest.DBApp, "CREATE TABLE repl_t (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	p := startPoolerd(t, func(c *config.Config) {
		c.Upstream = srv.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp)
		c.PoolMode = config.PoolTransaction
		c.Users = []config.User{{Name: replRole, Password: pgtest.Password}}
		c.AdminUsers = []string{replRole}
		c.LogLevel = "info"
		if mutate != nil {
			mutate(c)
		}
	})
	return srv, p
}

// replConnString is a libpq connection string for poolerd as replRole.
func (p *instance) replConnString() string {
	host, port, _ := strings.Cut(p.addr, ":")
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, replRole, pgtest.DBApp)
}

// runTool runs one of PostgreSQL's client programs with replRole's
// password, failing the test with its output if it fails.
func runTool(t *testing.T, ctx context.Context, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pgtest.Password)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// walSenders counts the server's walsender backends.
func walSenders(t *testing.T, ctx context.Context, srv *pgtest.Server) int {
	t.Helper()
	c, err := pgx.Connect(ctx, srv.SuperDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// queryString runs a query returning one text value on srv's app
// database as the superuser.
func queryString(t *testing.T, ctx context.Context, srv *pgtest.Server, sql string) string {
	t.Helper()
	c, err := pgx.Connect(ctx, srv.SuperDSN(pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var v string
	if err := c.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// TestReplicationTools runs PostgreSQL's own replication clients through
// poolerd: a base backup with its WAL streamed (pg_basebackup -X stream,
// two replication connections at once), WAL archiving (pg_receivewal) and
// logical decoding with a slot (pg_recvlogical). Each server connection is
// the client's own: it is closed with the client, never pooled.
func TestReplicationTools(t *testing.T) {
	t.Parallel()
	srv, p := startReplicationServer(t, nil)
	ctx := ctxTimeout(t, 3*time.Minute)
	dir := t.TempDir()

	t.Run("pg_basebackup", func(t *testing.T) {
		out := filepath.Join(dir, "base")
		runTool(t, ctx, "pg_basebackup", "-d", p.replConnString(), "-D", out, "-X", "stream", "-c", "fast", "--no-sync")
		for _, f := range []string{"PG_VERSION", "backup_manifest", "global/pg_control"} {
			if _, err := os.Stat(filepath.Join(out, f)); err != nil {
				t.Errorf("the backup lacks %s: %v", f, err)
			}
		}
	})

	t.Run("pg_receivewal", func(t *testing.T) {
		out := filepath.Join(dir, "wal")
		if err := os.Mkdir(out, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := srv.Exec(ctx, pgtest.DBApp, "INSERT INTO repl_t VALUES (1, 'archived')"); err != nil {
			t.Fatal(err)
		}
		end := queryString(t, ctx, srv, "SELECT pg_current_wal_lsn()::text")
		// WAL beyond the end, so that the stream passes it at once (else
		// pg_receivewal waits for more WAL to notice it reached the end).
		if err := srv.Exec(ctx, pgtest.DBApp, "INSERT INTO repl_t VALUES (3, 'beyond')"); err != nil {
			t.Fatal(err)
		}
		runTool(t, ctx, "pg_receivewal", "-d", p.replConnString(), "-D", out, "--endpos", end, "--no-loop", "--no-sync")
		files, _ := os.ReadDir(out)
		if len(files) == 0 {
			t.Fatalf("pg_receivewal wrote no WAL file up to %s", end)
		}
	})

	t.Run("pg_recvlogical", func(t *testing.T) {
		conn := p.replConnString()
		runTool(t, ctx, "pg_recvlogical", "-d", conn, "--slot", "tools_slot", "--create-slot", "-P", "test_decoding")
		// Streams the slot's changes to stdout until stopped, as a CDC
		// consumer does; rows are inserted until one is decoded (a
		// transaction that commits right after the slot's creation may
		// precede its consistent point).
		cmd := exec.CommandContext(ctx, "pg_recvlogical", "-d", conn, "--slot", "tools_slot", "--start", "--no-loop", "-f", "-")
		cmd.Env = append(os.Environ(), "PGPASSWORD="+pgtest.Password)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		var got string
	insert:
		for id := 10; got == "" && id < 40; id++ {
			if err := srv.Exec(ctx, pgtest.DBApp, fmt.Sprintf("INSERT INTO repl_t VALUES (%d, 'decoded through poolerd')", id)); err != nil {
				t.Fatal(err)
			}
			wait := time.After(time.Second)
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						break insert
					}
					if strings.Contains(l, "INSERT: id[integer]:") && strings.Contains(l, "'decoded through poolerd'") {
						got = l
					}
					continue
				case <-wait:
				}
				break
			}
		}
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("pg_recvlogical --start, stopped with SIGINT: %v", err)
		}
		if got == "" {
			t.Fatal("pg_recvlogical decoded none of the inserts")
		}
		runTool(t, ctx, "pg_recvlogical", "-d", conn, "--slot", "tools_slot", "--drop-slot")
	})

	// Every tool has left: so have their walsenders, and the pool holds
	// none of their connections.
	eventually(t, 10*time.Second, "no walsender left", func() bool { return walSenders(t, ctx, srv) == 0 })
	if n := len(p.srv.ReplicationCounts()); n != 0 {
		t.Errorf("replication connections still counted: %v", p.srv.ReplicationCounts())
	}
	if st := p.poolStats(t, pgtest.DBApp, replRole); st.Total != 0 {
		t.Errorf("the pool of %s holds %d server connections; replication connections are never pooled", replRole, st.Total)
	}
}

// replConnect opens a replication connection through poolerd with pgconn
// (mode: "database" or "true"); extra are more connection parameters.
func replConnect(t *testing.T, ctx context.Context, p *instance, mode string, extra ...string) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.Connect(ctx, p.dsn(replRole, pgtest.Password, pgtest.DBApp, append([]string{"replication=" + mode, "application_name=repl_" + mode}, extra...)...))
	if err != nil {
		t.Fatalf("replication=%s login: %v", mode, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// startStream sends START_REPLICATION on c and waits for its
// CopyBothResponse.
func startStream(t *testing.T, ctx context.Context, c *pgconn.PgConn, sql string) {
	t.Helper()
	fe := c.Frontend()
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := receive(ctx, c)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return
		case *pgproto3.ErrorResponse:
			t.Fatalf("%s: %s (%s)", sql, m.Message, m.Code)
		}
	}
}

// receive reads c's next message, giving up with ctx.
func receive(ctx context.Context, c *pgconn.PgConn) (pgproto3.BackendMessage, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.Conn().SetReadDeadline(dl)
	}
	return c.Frontend().Receive()
}

// streamError reads a stream until its ErrorResponse.
func streamError(t *testing.T, ctx context.Context, c *pgconn.PgConn) *pgproto3.ErrorResponse {
	t.Helper()
	for {
		msg, err := receive(ctx, c)
		if err != nil {
			t.Fatalf("the stream ended without an ErrorResponse: %v", err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			return e
		}
	}
}

// TestReplicationProtocol checks a replication connection's life in
// poolerd with the protocol itself: the welcome and commands of both
// modes, a cancel request forwarded to its walsender, SHOW CLIENTS and
// SHOW SERVERS, the metric, KILL_CLIENT in the middle of a stream (a FATAL
// at a message boundary, the walsender gone), and a shutdown.
func TestReplicationProtocol(t *testing.T) {
	t.Parallel()
	srv, p := startReplicationServer(t, nil)
	ctx := ctxTimeout(t, 2*time.Minute)

	// Physical: IDENTIFY_SYSTEM answers with the server's system id.
	phys := replConnect(t, ctx, p, "true")
	res, err := phys.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("IDENTIFY_SYSTEM: %v %v", res, err)
	}
	// Logical: SQL works on a replication=database connection, with the
	// startup options the client sent, and a cancel request reaches its
	// backend.
	logical := replConnect(t, ctx, p, "database", "options=-c enable_seqscan=off")
	if res, err := logical.Exec(ctx, "SHOW enable_seqscan").ReadAll(); err != nil || string(res[0].Rows[0][0]) != "off" {
		t.Fatalf("SHOW enable_seqscan with options -c enable_seqscan=off: %v %v", res, err)
	}
	if _, err := logical.Exec(ctx, "CREATE_REPLICATION_SLOT proto_slot LOGICAL test_decoding").ReadAll(); err != nil {
		t.Fatalf("CREATE_REPLICATION_SLOT: %v", err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = logical.CancelRequest(ctx)
	}()
	begin := time.Now()
	_, err = logical.Exec(ctx, "SELECT pg_sleep(30)").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" || time.Since(begin) > 20*time.Second {
		t.Fatalf("pg_sleep(30) with a cancel request: %v after %s, want 57014 soon", err, time.Since(begin))
	}

	adm := obAdmin(t, p, replRole)
	clients := obShow(t, adm, "SHOW CLIENTS")
	for mode, app := range map[string]string{"physical": "repl_true", "logical": "repl_database"} {
		i := clients.must(t, "SHOW CLIENTS", "application_name", app)
		if clients.val(i, "replication") != mode || clients.val(i, "state") != "active" {
			t.Errorf("SHOW CLIENTS of a %s replication client:\n%s", mode, clients)
		}
	}
	servers := obShow(t, adm, "SHOW SERVERS")
	if servers.find("replication", "physical") < 0 || servers.find("replication", "logical") < 0 {
		t.Errorf("SHOW SERVERS lacks the replication connections:\n%s", servers)
	}
	if got := p.srv.ReplicationCounts(); len(got) != 2 {
		t.Errorf("ReplicationCounts %v, want one physical and one logical", got)
	}

	// KILL_CLIENT in the middle of a stream: the client reads the FATAL
	// after whole messages, and the walsender goes.
	if err := srv.Exec(ctx, pgtest.DBApp, "INSERT INTO repl_t SELECT g, repeat('x', 1000) FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	startStream(t, ctx, logical, "START_REPLICATION SLOT proto_slot LOGICAL 0/0")
	id := clients.val(clients.must(t, "SHOW CLIENTS", "application_name", "repl_database"), "id")
	obCmd(t, adm, "KILL_CLIENT "+id, "KILL_CLIENT")
	if e := streamError(t, ctx, logical); e.Code != "08P01" || e.Message != "admin forced disconnect" {
		t.Errorf("KILL_CLIENT mid-stream: %s %q", e.Code, e.Message)
	}
	eventually(t, 10*time.Second, "one walsender left", func() bool { return walSenders(t, ctx, srv) == 1 })

	// A shutdown ends the physical one with 57P01 at once: a stream has no
	// idle point to wait for.
	startStream(t, ctx, phys, "START_REPLICATION "+string(res[0].Rows[0][2])) // IDENTIFY_SYSTEM's xlogpos
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	begin = time.Now()
	if err := p.srv.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if e := streamError(t, ctx, phys); e.Code != "57P01" {
		t.Errorf("shutdown mid-stream: %s %q", e.Code, e.Message)
	}
	if took := time.Since(begin); took > 10*time.Second {
		t.Errorf("shutdown took %s with a replication stream open", took)
	}
	eventually(t, 10*time.Second, "no walsender left", func() bool { return walSenders(t, ctx, srv) == 0 })
	if err := srv.Exec(ctx, pgtest.DBApp, "SELECT pg_drop_replication_slot('proto_slot')"); err != nil {
		t.Fatal(err)
	}
}

// TestReplicationRefusals: what a replication login is refused for, each
// with PostgreSQL's SQLSTATE and a hint: a value of the parameter
// PostgreSQL would not take, an access rule that is not for replication,
// and a role the server does not let replicate.
func TestReplicationRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	hbaFile := filepath.Join(dir, "hba.conf")
	rules := "host replication " + replRole + " 127.0.0.1/32 scram-sha-256\n" +
		"host all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(hbaFile, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	_, p := startReplicationServer(t, func(c *config.Config) {
		c.AuthType = config.AuthHBA
		c.AuthHBAFile = hbaFile
		c.Users = append(c.Users, config.User{Name: pgtest.RoleSCRAM, Password: pgtest.Password})
	})
	ctx := ctxTimeout(t, time.Minute)
	for _, tc := range []struct {
		name, user, mode, code, text string
	}{
		{"a value PostgreSQL refuses", replRole, "maybe", "22023", `invalid value for parameter "replication": "maybe"`},
		{"physical without a replication rule", pgtest.RoleSCRAM, "true", "28000", `no pg_hba.conf entry for replication connection from host "127.0.0.1", user "scram_user"`},
		// PostgreSQL's own refusal (15: "must be superuser or replication
		// role to start walsender"; 16: "permission denied to start WAL
		// sender"), passed on in DETAIL after PgBouncer's "login failed".
		{"a role without REPLICATION", pgtest.RoleSCRAM, "database", "42501", "to start "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pgconn.Connect(ctx, p.dsn(tc.user, pgtest.Password, pgtest.DBApp, "replication="+tc.mode))
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want %s %q", err, tc.code, tc.text)
			}
			// poolerd's own refusals (the value, its access rules) say
			// it in the message; the server's come after "login failed".
			text := pe.Message
			if tc.code == "42501" {
				text = pe.Detail
				if pe.Message != "login failed" {
					t.Errorf("message %q, want PgBouncer's login failed", pe.Message)
				}
			}
			if pe.Code != tc.code || !strings.Contains(text, tc.text) {
				t.Fatalf("got %v (detail %q), want %s %q", err, pe.Detail, tc.code, tc.text)
			}
			if pe.Hint == "" {
				t.Errorf("no hint: %v", err)
			}
		})
	}
	// The same roles log in where the rules let them: the replication
	// rule for physical, the database rule for logical.
	replConnect(t, ctx, p, "true")
	replConnect(t, ctx, p, "database")
	// And replication=false (or off, no, 0) is an ordinary client.
	c, err := pgconn.Connect(ctx, p.dsn(replRole, pgtest.Password, pgtest.DBApp, "replication=off"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
}

// TestReplicationCountsInPoolSize: a replication connection takes a place
// in its pool's size, as PgBouncer counts it in pool_size: a free place, or
// an idle connection's (closed for it); with every place taken, a checkout
// and another replication login wait (here until checkout_timeout), and a
// replication connection that closes gives its place to the next.
func TestReplicationCountsInPoolSize(t *testing.T) {
	t.Parallel()
	_, p := startReplicationServer(t, func(c *config.Config) {
		c.MaxSize = 2
		c.CheckoutTimeout = 2 * time.Second
	})
	ctx := ctxTimeout(t, time.Minute)
	poolOf := func() pool.Stats {
		for _, ps := range p.srv.Pools() {
			if ps.User == replRole {
				return ps.Stats
			}
		}
		return pool.Stats{}
	}
	normal := func() error {
		c, err := pgconn.Connect(ctx, p.dsn(replRole, pgtest.Password, pgtest.DBApp))
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "SELECT 1").ReadAll()
		return err
	}
	// Two idle server connections fill the pool.
	a, err := pgconn.Connect(ctx, p.dsn(replRole, pgtest.Password, pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	if _, err := a.Exec(ctx, "BEGIN; SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if err := normal(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "COMMIT").ReadAll(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "two idle server connections", func() bool { st := poolOf(); return st.Idle == 2 && st.Total == 2 })

	// Each replication connection takes an idle one's place.
	r1 := replConnect(t, ctx, p, "database")
	replConnect(t, ctx, p, "database")
	if st := poolOf(); st.Total != 2 || st.Lent != 2 || st.Idle != 0 || st.Evictions["evicted"] != 2 {
		t.Fatalf("pool after two replication logins: total %d lent %d idle %d evictions %v; want 2, 2, 0, 2 evicted", st.Total, st.Lent, st.Idle, st.Evictions)
	}
	// Every place taken: a query and a third replication login wait.
	var pe *pgconn.PgError
	if err := normal(); !errors.As(err, &pe) || !strings.Contains(pe.Message, "checkout_timeout") {
		t.Errorf("a query with the pool full of replication connections: %v, want the checkout_timeout refusal", err)
	}
	_, err = pgconn.Connect(ctx, p.dsn(replRole, pgtest.Password, pgtest.DBApp, "replication=database"))
	if !errors.As(err, &pe) || pe.Severity != "FATAL" || !strings.Contains(pe.Message, "checkout_timeout") {
		t.Errorf("a third replication login: %v, want FATAL checkout_timeout", err)
	}
	// A replication connection that ends frees its place.
	r1.Close(context.Background())
	eventually(t, 5*time.Second, "the place to free", func() bool { return poolOf().Lent == 1 })
	if err := normal(); err != nil {
		t.Errorf("a query after a replication connection closed: %v", err)
	}
}
