package integration

import (
	"context"
	"errors"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// showAll returns SHOW name for each name.
func showAll(t *testing.T, c *pgx.Conn, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		out[n] = scalarText(t, c, "SHOW "+n)
	}
	return out
}

// serverDefaults returns SHOW name on a fresh direct connection to
// PostgreSQL as app.
func serverDefaults(t *testing.T, names ...string) map[string]string {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	c, err := pgx.Connect(ctx, pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	return showAll(t, c, names...)
}

// pgErrorOf returns the PostgreSQL error in err.
func pgErrorOf(t *testing.T, err error) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("not a PostgreSQL error: %v", err)
	}
	return pe
}

// paramConfig is the pgx configuration of a client of p (as app, simple
// protocol) with startup parameters params, given as name=value pairs.
// pgx sends them as they are, which the URL form cannot do for values with
// spaces.
func paramConfig(t *testing.T, dsn string, params ...string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	for _, kv := range params {
		k, v, _ := strings.Cut(kv, "=")
		cfg.RuntimeParams[k] = v
	}
	return cfg
}

// connectParams connects to p as app with startup parameters params.
func connectParams(t *testing.T, p *instance, params ...string) *pgx.Conn {
	t.Helper()
	c, err := pgx.ConnectConfig(ctxTimeout(t, 15*time.Second), paramConfig(t, p.appDSN(), params...))
	if err != nil {
		t.Fatalf("connect with %q: %v", params, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// paramsLoginError connects with startup parameters params to dsn, which
// must fail with a PostgreSQL error.
func paramsLoginError(t *testing.T, dsn string, params ...string) *pgconn.PgError {
	t.Helper()
	c, err := pgx.ConnectConfig(ctxTimeout(t, 15*time.Second), paramConfig(t, dsn, params...))
	if err == nil {
		c.Close(context.Background())
		t.Fatalf("login with %q succeeded, want it refused", params)
	}
	return pgErrorOf(t, err)
}

func TestParamsStartupPerClient(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		c.ServerConnectTimeout = 5 * time.Second
	})
	names := []string{"application_name", "DateStyle", "search_path", "extra_float_digits"}
	defaults := serverDefaults(t, names...)
	if defaults["DateStyle"] != "ISO, MDY" || defaults["search_path"] != `"$user", public` || defaults["extra_float_digits"] != "1" {
		t.Fatalf("unexpected server defaults %v", defaults)
	}

	a := connectParams(t, p, "application_name=alpha", "datestyle=SQL,DMY",
		"options=-c search_path=foo", "extra_float_digits=0")
	b := connectParams(t, p, "application_name=beta")
	// A client with A's DateStyle and search_path, spelled differently.
	c := connectParams(t, p, "application_name=gamma", `options=--DateStyle=SQL,\ DMY --search-path=foo`)
	want := map[*pgx.Conn]map[string]string{
		a: {"application_name": "alpha", "DateStyle": "SQL, DMY", "search_path": "foo", "extra_float_digits": "0"},
		b: {"application_name": "beta", "DateStyle": defaults["DateStyle"], "search_path": defaults["search_path"],
			"extra_float_digits": defaults["extra_float_digits"]},
		c: {"application_name": "gamma", "DateStyle": "SQL, DMY", "search_path": "foo",
			"extra_float_digits": defaults["extra_float_digits"]},
	}
	label := map[*pgx.Conn]string{a: "A", b: "B", c: "C"}

	pid := scalarText(t, a, "SELECT pg_backend_pid()::text")
	for round := 0; round < 4; round++ {
		order := []*pgx.Conn{a, b, c}
		if round%2 == 1 {
			order = []*pgx.Conn{b, c, a}
		}
		for _, name := range names {
			for _, cl := range order {
				if got := scalarText(t, cl, "SHOW "+name); got != want[cl][name] {
					t.Errorf("round %d: client %s sees %s = %q, want %q", round, label[cl], name, got, want[cl][name])
				}
			}
		}
		for _, cl := range order {
			if got := scalarText(t, cl, "SELECT pg_backend_pid()::text"); got != pid {
				t.Fatalf("client %s on backend %s, want the single backend %s", label[cl], got, pid)
			}
		}
	}
	// The session's own date output follows its DateStyle.
	if got := scalarText(t, a, "SELECT '2024-03-05'::date::text"); got != "05/03/2024" {
		t.Errorf("A formats a date as %q, want 05/03/2024", got)
	}
	if got := scalarText(t, b, "SELECT '2024-03-05'::date::text"); got != "2024-03-05" {
		t.Errorf("B formats a date as %q, want 2024-03-05", got)
	}
}

func TestParamsParameterStatusAtLogin(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ServerConnectTimeout = 5 * time.Second })
	// Warm the pool with a client of other parameters first, so that the
	// values cannot just be the ones of the first server login.
	other := connectParams(t, p, "application_name=first", "datestyle=German")
	scalarText(t, other, "SELECT 1")

	c := connectParams(t, p, "application_name=alpha", "options=-c DateStyle=SQL,DMY")
	pc := c.PgConn()
	for name, want := range map[string]string{
		"application_name":            "alpha",
		"DateStyle":                   "SQL, DMY",
		"client_encoding":             "UTF8",
		"standard_conforming_strings": "on",
		"integer_datetimes":           "on",
	} {
		if got := pc.ParameterStatus(name); got != want {
			t.Errorf("ParameterStatus %s = %q, want %q", name, got, want)
		}
	}
	for _, name := range []string{"server_version", "TimeZone", "server_encoding", "IntervalStyle", "is_superuser", "session_authorization"} {
		if pc.ParameterStatus(name) == "" {
			t.Errorf("ParameterStatus %s missing", name)
		}
	}
	// What was reported is what the session has.
	if got := scalarText(t, c, "SHOW TimeZone"); got != pc.ParameterStatus("TimeZone") {
		t.Errorf("TimeZone reported %q, SHOW says %q", pc.ParameterStatus("TimeZone"), got)
	}
	if got := scalarText(t, c, "SELECT current_setting('server_version')"); got != pc.ParameterStatus("server_version") {
		t.Errorf("server_version reported %q, server says %q", pc.ParameterStatus("server_version"), got)
	}
	if got := other.PgConn().ParameterStatus("DateStyle"); got != "German, DMY" {
		t.Errorf("first client: DateStyle reported %q, want \"German, DMY\"", got)
	}
}

func TestParamsInvalidStartupParameter(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.ServerConnectTimeout = 5 * time.Second })
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"DateStyle", []string{"DateStyle=nonsense"}},
		{"options work_mem", []string{"options=-c work_mem=abc"}},
		{"unknown parameter", []string{"no_such_parameter=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// What PostgreSQL itself says about it.
			direct := paramsLoginError(t, pg.DSN(pgtest.RoleApp, pgtest.Password, pgtest.DBApp), tc.extra...)
			// Twice: the second time poolerd may answer from what it
			// learned.
			for i := 0; i < 2; i++ {
				pe := paramsLoginError(t, p.appDSN(), tc.extra...)
				if pe.Code != direct.Code || pe.Severity != "FATAL" {
					t.Errorf("attempt %d: got %s %s %q, PostgreSQL says %s %s %q",
						i+1, pe.Severity, pe.Code, pe.Message, direct.Severity, direct.Code, direct.Message)
				}
			}
		})
	}
	t.Run("pool still fine", func(t *testing.T) {
		t.Parallel()
		c := connectParams(t, p, "datestyle=ISO,DMY")
		if got := scalarText(t, c, "SHOW DateStyle"); got != "ISO, DMY" {
			t.Fatalf("DateStyle %q", got)
		}
	})
}

func TestParamsUnsupportedOptionsSwitch(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, nil)
	for _, opt := range []string{"-d 5", "-c", "-c novalue"} {
		t.Run(opt, func(t *testing.T) {
			pe := paramsLoginError(t, p.appDSN(), "options="+opt)
			if pe.Severity != "FATAL" || pe.Code == "" {
				t.Fatalf("got %s %s %q", pe.Severity, pe.Code, pe.Message)
			}
			if !strings.Contains(pe.Message, "options") {
				t.Errorf("message %q does not name the options parameter", pe.Message)
			}
			t.Logf("%s %s: %s (hint: %s)", pe.Severity, pe.Code, pe.Message, pe.Hint)
		})
	}
	pe := paramsLoginError(t, p.appDSN(), "options=-d 5")
	if !strings.Contains(pe.Message, "-d") {
		t.Errorf("message %q does not name the switch", pe.Message)
	}
}

func TestParamsClientSetFollowsClient(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) { c.MaxSize = 1 })
	mine := connectParams(t, p, "application_name=initial")
	ctx := ctxTimeout(t, 15*time.Second)
	if _, err := mine.Exec(ctx, "SET application_name = 'mine'"); err != nil {
		t.Fatal(err)
	}
	if _, err := mine.Exec(ctx, "SET DateStyle = 'Postgres, DMY'"); err != nil {
		t.Fatal(err)
	}
	if got := mine.PgConn().ParameterStatus("application_name"); got != "mine" {
		t.Errorf("pgx was told application_name %q", got)
	}
	others := []*pgx.Conn{
		connectParams(t, p),
		connectParams(t, p, "application_name=other"),
	}
	for round := 0; round < 3; round++ {
		for i, o := range others {
			want := []string{"", "other"}[i]
			if got := scalarText(t, o, "SHOW application_name"); got != want {
				t.Errorf("round %d: other client %d sees application_name %q, want %q", round, i, got, want)
			}
			if got := scalarText(t, o, "SHOW DateStyle"); got != "ISO, MDY" {
				t.Errorf("round %d: other client %d sees DateStyle %q", round, i, got)
			}
		}
		if got := scalarText(t, mine, "SHOW application_name"); got != "mine" {
			t.Errorf("round %d: application_name %q after other clients used the server, want mine", round, got)
		}
		if got := scalarText(t, mine, "SHOW DateStyle"); got != "Postgres, DMY" {
			t.Errorf("round %d: DateStyle %q, want \"Postgres, DMY\"", round, got)
		}
	}
	// After RESET (which, unlike on a direct connection, cannot restore the
	// startup value: poolerd applied it with SET), the value the client was
	// told is the one it keeps.
	if _, err := mine.Exec(ctx, "RESET application_name"); err != nil {
		t.Fatal(err)
	}
	told := mine.PgConn().ParameterStatus("application_name")
	scalarText(t, others[1], "SELECT 1")
	if got := scalarText(t, mine, "SHOW application_name"); got != told {
		t.Errorf("after RESET: application_name %q, but the client was told %q", got, told)
	}
}

func TestParamsSessionModeResetQuery(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.MaxSize = 1
		c.PoolMode = config.PoolSession
	})
	defaults := serverDefaults(t, "work_mem", "statement_timeout")
	table := "reset_probe_" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	ctx := ctxTimeout(t, 15*time.Second)

	a := p.connect(t)
	pidA := scalarText(t, a, "SELECT pg_backend_pid()::text")
	for _, sql := range []string{
		"CREATE TEMP TABLE " + table + " (x int)",
		"SET work_mem = '77MB'",
		"SET statement_timeout = '42s'",
		"PREPARE probe_stmt AS SELECT 1",
	} {
		if _, err := a.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if got := scalarText(t, a, "SHOW work_mem"); got != "77MB" {
		t.Fatalf("work_mem %q", got)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}

	b := p.connect(t)
	if got := scalarText(t, b, "SELECT pg_backend_pid()::text"); got != pidA {
		t.Fatalf("B got backend %s, A had %s: the test needs the same server connection", got, pidA)
	}
	if got := scalarText(t, b, "SELECT count(*)::text FROM pg_class WHERE relname = '"+table+"'"); got != "0" {
		t.Errorf("A's temporary table survives for B")
	}
	if got := showAll(t, b, "work_mem", "statement_timeout"); got["work_mem"] != defaults["work_mem"] || got["statement_timeout"] != defaults["statement_timeout"] {
		t.Errorf("B sees %v, want the defaults %v", got, defaults)
	}
	if got := scalarText(t, b, "SELECT count(*)::text FROM pg_prepared_statements WHERE name = 'probe_stmt'"); got != "0" {
		t.Errorf("A's prepared statement survives for B")
	}
}

func TestParamsUnknownDatabase(t *testing.T) {
	t.Parallel()

	t.Run("not in databases", func(t *testing.T) {
		t.Parallel()
		p := startPoolerd(t, func(c *config.Config) {
			c.Upstream = ""
			c.Databases = []config.Database{{Name: pgtest.DBApp, Host: pg.Host, Port: pg.Port}}
			c.Users = []config.User{{Name: pgtest.RoleApp, Password: pgtest.Password}}
		})
		c := p.connect(t)
		scalarText(t, c, "SELECT 1")
		// "other" exists on the server, but poolerd does not serve it.
		for _, db := range []string{pgtest.DBOther, "no_such_db"} {
			pe := loginPgError(t, p.dsn(pgtest.RoleApp, pgtest.Password, db))
			if pe.Code != "3D000" || pe.Severity != "FATAL" {
				t.Errorf("%s: got %s %s %q, want FATAL 3D000", db, pe.Severity, pe.Code, pe.Message)
			}
			if !strings.Contains(pe.Message, db) || pe.Hint == "" {
				t.Errorf("%s: message %q hint %q: want the name and a hint", db, pe.Message, pe.Hint)
			}
		}
	})

	t.Run("not on the server", func(t *testing.T) {
		t.Parallel()
		p := startPoolerd(t, nil)
		pe := loginPgError(t, p.dsn(pgtest.RoleApp, pgtest.Password, "no_such_db"))
		if pe.Code != "3D000" || pe.Severity != "FATAL" {
			t.Fatalf("got %s %s %q, want FATAL 3D000", pe.Severity, pe.Code, pe.Message)
		}
		if !strings.Contains(pe.Message, "no_such_db") {
			t.Errorf("message %q does not name the database", pe.Message)
		}
		// The known database still works.
		c := p.connect(t)
		scalarText(t, c, "SELECT 1")
	})
}

// A database entry's server_parameters (PgBouncer's per-database timezone,
// datestyle, client_encoding, application_name) are its clients' defaults:
// reported at login and in effect, on every server connection, unless a
// client sets its own, which stays its own.
func TestParamsServerParameters(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 1 // every client on the one server connection
		c.Databases = []config.Database{{Name: "tokyo", DBName: pgtest.DBApp,
			// As viper hands them over from YAML: lower case.
			// statement_timeout: what a pgbouncer.ini's connect_query of
			// SETs becomes, not a reported parameter.
			ServerParameters: map[string]string{"timezone": "Asia/Tokyo", "application_name": "from-entry", "datestyle": "SQL, DMY",
				"statement_timeout": "123s"}}}
	})
	plain := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "tokyo"))
	own := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "tokyo", "timezone=UTC", "application_name=mine"))
	for i := range 2 {
		if ps := plain.PgConn().ParameterStatus("TimeZone"); ps != "Asia/Tokyo" {
			t.Errorf("TimeZone reported at login %q, want the entry's", ps)
		}
		got := showAll(t, plain, "TimeZone", "application_name", "DateStyle", "statement_timeout")
		if want := map[string]string{"TimeZone": "Asia/Tokyo", "application_name": "from-entry", "DateStyle": "SQL, DMY", "statement_timeout": "123s"}; !maps.Equal(got, want) {
			t.Errorf("round %d: a client that sets nothing has %v, want the entry's %v", i, got, want)
		}
		got = showAll(t, own, "TimeZone", "application_name", "DateStyle")
		if want := map[string]string{"TimeZone": "UTC", "application_name": "mine", "DateStyle": "SQL, DMY"}; !maps.Equal(got, want) {
			t.Errorf("round %d: a client with its own has %v, want %v", i, got, want)
		}
		// A client's RESET ALL takes its session back to the entry's
		// values (startup parameters), not to the server's defaults.
		if _, err := plain.Exec(ctxTimeout(t, 10*time.Second), "SET statement_timeout = '1s'; SET TimeZone = 'UTC'; RESET ALL"); err != nil {
			t.Fatal(err)
		}
	}
}

// disable_pqexec ends a client that sends a simple Query, as PgBouncer
// does; extended-protocol statements run. application_name_add_host
// appends the client's address to its application_name at login.
func TestParamsPQExecAndAppNameHost(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.DisablePQExec = true
		c.ApplicationNameAddHost = true
	})
	ctx := ctxTimeout(t, 30*time.Second)
	c := connectDSN(t, p.appDSN("application_name=billing"))
	var app string
	if err := c.QueryRow(ctx, "SELECT current_setting($1)", "application_name").Scan(&app); err != nil {
		t.Fatalf("an extended-protocol query with disable_pqexec: %v", err)
	}
	if want := "billing - " + c.PgConn().Conn().LocalAddr().String(); app != want {
		t.Errorf("application_name %q, want %q", app, want)
	}
	_, err := c.PgConn().Exec(ctx, "SELECT 1; SELECT 2").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "08P01" || !strings.Contains(pe.Message, "PQexec disallowed") {
		t.Errorf("a simple query with disable_pqexec: %v", err)
	}
	anon := connectDSN(t, p.appDSN())
	if err := anon.QueryRow(ctx, "SELECT current_setting($1)", "application_name").Scan(&app); err != nil || !strings.HasPrefix(app, "app - 127.0.0.1:") {
		t.Errorf("application_name without one given: %q %v", app, err)
	}
}

// TestParamsIgnoreStartupParameters: ignore_startup_parameters drops the
// parameters it lists, sent on their own or in options, and with options
// listed every setting in options, as PgBouncer does: the session has the
// server's defaults for them. The others, and those PgBouncer always
// applies (TimeZone here), are applied; a value PostgreSQL would refuse
// does not matter when it is dropped.
func TestParamsIgnoreStartupParameters(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{config.PoolTransaction, config.PoolSession} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			p := startPoolerd(t, func(c *config.Config) {
				c.PoolMode = mode
				c.AdminUsers = []string{pgtest.RoleApp}
				c.IgnoreStartupParameters = []string{"Extra_Float_Digits", "search_path", "TimeZone"}
			})
			c := connectParams(t, p, "extra_float_digits="+strings.Repeat("1", 5000), "search_path=nowhere",
				"TimeZone=Asia/Tokyo", "options=-c work_mem=7MB -c extra_float_digits=3")
			want := map[string]string{"extra_float_digits": "1", "search_path": `"$user", public`,
				"TimeZone": "Asia/Tokyo", "work_mem": "7MB"}
			if got := showAll(t, c, "extra_float_digits", "search_path", "TimeZone", "work_mem"); !maps.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
			// The console's SET, as PgBouncer's suite sets it: for the
			// logins after it.
			adm := connectDSN(t, p.dsn(pgtest.RoleApp, pgtest.Password, "pgbouncer"))
			if _, err := adm.Exec(ctxTimeout(t, 10*time.Second), "set ignore_startup_parameters = options", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("SET ignore_startup_parameters on the console: %v", err)
			}
			c2 := connectParams(t, p, "extra_float_digits=2", "options=-c work_mem=7MB -c DateStyle=German")
			want = map[string]string{"extra_float_digits": "2", "work_mem": "4MB", "DateStyle": "German, DMY"}
			if got := showAll(t, c2, "extra_float_digits", "work_mem", "DateStyle"); !maps.Equal(got, want) {
				t.Errorf("options ignored: got %v, want %v", got, want)
			}
		})
	}
}

// TestParamsDefaultsNotAsked: a startup parameter whose value is the one
// the server reports as its default needs no question to the server at
// login: setting a parameter to its own report gives that report back.
// Shown with a server that runs no SQL at all: a database entry pointing
// at another poolerd's admin console, which a client then reads through
// this one (PgBouncer allows the same).
func TestParamsDefaultsNotAsked(t *testing.T) {
	t.Parallel()
	a := startPoolerd(t, func(c *config.Config) {
		c.AdminUsers = []string{pgtest.RoleApp}
	})
	host, port, _ := net.SplitHostPort(a.addr)
	portN, _ := strconv.Atoi(port)
	for _, mode := range []string{config.PoolTransaction, config.PoolSession} {
		t.Run(mode, func(t *testing.T) {
			b := startPoolerd(t, func(c *config.Config) {
				c.PoolMode = mode
				c.VerifyHandoff = "off" // the console answers no fingerprint query
				c.Databases = []config.Database{{Name: "acons", Host: host, Port: portN, DBName: "pgbouncer"}}
			})
			// What the console reports: client_encoding UTF8, DateStyle ISO,
			// TimeZone GMT.
			cfg := paramConfig(t, b.dsn(pgtest.RoleApp, pgtest.Password, "acons"), "client_encoding=UTF8", "DateStyle=ISO", "TimeZone=GMT")
			c, err := pgx.ConnectConfig(ctxTimeout(t, 15*time.Second), cfg)
			if err != nil {
				t.Fatalf("login through a database that is another poolerd's console: %v", err)
			}
			defer c.Close(context.Background())
			var version string
			if err := c.QueryRow(ctxTimeout(t, 10*time.Second), "SHOW VERSION").Scan(&version); err != nil || !strings.Contains(version, "poolerd") {
				t.Errorf("SHOW VERSION through it: %q %v", version, err)
			}
		})
	}
}

// TestParamsLoginBurstAsksOnce: logins that arrive together with
// parameters the pool has not seen ask the server one at a time, so the
// question takes one server connection, not one per login; the others
// find what the first learned.
func TestParamsLoginBurstAsksOnce(t *testing.T) {
	t.Parallel()
	p := startPoolerd(t, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MinSize = 0
		c.WarmPools = false
		c.MaxSize = 8
	})
	const n = 8
	errs := make(chan error, n)
	var conns sync.Map
	for i := range n {
		go func() {
			c, err := pgx.ConnectConfig(ctxTimeout(t, 15*time.Second), paramConfig(t, p.appDSN(), "application_name=burst", "datestyle=German"))
			if err == nil {
				conns.Store(i, c)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	conns.Range(func(_, c any) bool { _ = c.(*pgx.Conn).Close(context.Background()); return true })
	if st := p.poolStats(t, pgtest.DBApp, pgtest.RoleApp); st.ConnectAttempts != 1 {
		t.Errorf("%d logins together opened %d server connections, want 1 (one asks, the others wait for its answer)", n, st.ConnectAttempts)
	}
}
