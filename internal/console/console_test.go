package console

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/observe"
	"github.com/poolerd/poolerd/internal/pool"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/internal/wire"
)

func TestParseAdmin(t *testing.T) {
	for _, tc := range []struct {
		sql      string
		cmd, arg string
		ok       bool
	}{
		{"SHOW POOLS", "SHOW", "POOLS", true},
		{"  show pools ;  ", "show", "pools", true},
		{"PAUSE", "PAUSE", "", true},
		{`PAUSE "my db"`, "PAUSE", "my db", true},
		{`PAUSE "a""b"`, "PAUSE", `a"b`, true},
		{`PAUSE ""`, "", "", false},
		{`PAUSE "open`, "", "", false},
		{"KILL_CLIENT 42", "KILL_CLIENT", "42", true},
		{"SHOW POOLS extra", "", "", false},
		{"SHOW-POOLS", "", "", false},
		{`SHOW"x"`, "", "", false},
		{"", "", "", false},
		{";", "", "", false},
	} {
		cmd, arg, ok := parseAdmin(tc.sql)
		if cmd != tc.cmd || arg != tc.arg || ok != tc.ok {
			t.Errorf("parseAdmin(%q) = %q, %q, %v; want %q, %q, %v", tc.sql, cmd, arg, ok, tc.cmd, tc.arg, tc.ok)
		}
	}
}

func TestParseSet(t *testing.T) {
	for _, tc := range []struct {
		sql        string
		key, value string
		ok, bad    bool
	}{
		{"SET max_size = 10", "max_size", "10", true, false},
		{"set max_size to 10;", "max_size", "10", true, false},
		{"SET query_timeout = 30s", "query_timeout", "30s", true, false},
		{"SET admin_users = 'a, b'", "admin_users", "a, b", true, false},
		{"SET x = 'it''s'", "x", "it's", true, false},
		{"SET x TO'v'", "x", "v", true, false},
		{"SET x = 'open", "", "", false, true},
		{"SET x = 'v' trailing", "", "", false, true},
		{"SET x = a b", "", "", false, true},
		{"SET x", "", "", false, true},
		{"SET = 1", "", "", false, true},
		{"SET x = " + strings.Repeat("9", 256), "x", strings.Repeat("9", 256), true, true},
		{"SHOW POOLS", "", "", false, false},
		{"SETTINGS", "", "", false, false},
	} {
		key, value, ok, bad := parseSet(tc.sql)
		if key != tc.key || value != tc.value || ok != tc.ok || bad != tc.bad {
			t.Errorf("parseSet(%q) = %q, %q, %v, %v; want %q, %q, %v, %v", tc.sql, key, value, ok, bad,
				tc.key, tc.value, tc.ok, tc.bad)
		}
	}
}

// TestResultSetBytes pins the encoding PgBouncer's tools read: no table,
// typmod -1, text format, int4 of size 4, NULL as length -1.
func TestResultSetBytes(t *testing.T) {
	r := newResult(text("a"), int4("b"))
	r.row("x", null{})
	var nilString *string
	s := "y"
	r.row(&s, nilString)
	got := r.done("SHOW")
	var want []byte
	want = append(want, 'T', 0, 0, 0, 46, 0, 2)
	want = append(want, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0)
	want = append(want, 'b', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 23, 0, 4, 0xff, 0xff, 0xff, 0xff, 0, 0)
	want = append(want, 'D', 0, 0, 0, 15, 0, 2, 0, 0, 0, 1, 'x', 0xff, 0xff, 0xff, 0xff)
	want = append(want, 'D', 0, 0, 0, 15, 0, 2, 0, 0, 0, 1, 'y', 0xff, 0xff, 0xff, 0xff)
	want = append(want, 'C', 0, 0, 0, 9, 'S', 'H', 'O', 'W', 0)
	if !bytes.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}

// fakeProxy is a Proxy with fixed snapshots that records the control calls.
type fakeProxy struct {
	cfg      *config.Config
	pause    proxy.PauseState
	pools    []proxy.PoolStats
	clients  []proxy.ClientInfo
	servers  []proxy.ServerInfo
	totals   map[string]proxy.Totals
	avgs     map[string]observe.Averages
	pauseErr error
	// pauseWait: Pause blocks until its context ends.
	pauseWait bool
	resumeErr error
	killed    []uint64
	calls     []string
	rates     []proxy.RateLimitInfo
	peerPools []proxy.PeerPoolStats
}

func (f *fakeProxy) RateLimits() []proxy.RateLimitInfo { return f.rates }
func (f *fakeProxy) PeerPools() []proxy.PeerPoolStats  { return f.peerPools }

func (f *fakeProxy) Config() *config.Config                        { return f.cfg }
func (f *fakeProxy) Version() string                               { return "test" }
func (f *fakeProxy) PauseState() proxy.PauseState                  { return f.pause }
func (f *fakeProxy) Pools() []proxy.PoolStats                      { return slices.Clone(f.pools) }
func (f *fakeProxy) Clients() []proxy.ClientInfo                   { return f.clients }
func (f *fakeProxy) Servers() []proxy.ServerInfo                   { return f.servers }
func (f *fakeProxy) ClientCount() int                              { return len(f.clients) }
func (f *fakeProxy) LoginCount() int                               { return 1 }
func (f *fakeProxy) DatabaseTotals() map[string]proxy.Totals       { return f.totals }
func (f *fakeProxy) DatabaseAverages() map[string]observe.Averages { return f.avgs }
func (f *fakeProxy) Reload() error                                 { return f.call("RELOAD", "") }
func (f *fakeProxy) Set(key, value string) (string, error) {
	if key == "max_size" && value == "x" {
		return "", errors.New("max_size: not a number")
	}
	return "", f.call("SET", key+"="+value)
}
func (f *fakeProxy) RequestShutdown(mode string)        { _ = f.call("SHUTDOWN", mode) }
func (f *fakeProxy) DatabaseKnown(database string) bool { return database == "app" }
func (f *fakeProxy) Pause(ctx context.Context, database string) error {
	_ = f.call("PAUSE", database)
	if f.pauseWait {
		<-ctx.Done()
		return fmt.Errorf("pause interrupted: %w", context.Cause(ctx))
	}
	return f.pauseErr
}
func (f *fakeProxy) CancelPause(database string) { _ = f.call("CANCEL_PAUSE", database) }
func (f *fakeProxy) Suspend() error {
	_ = f.call("SUSPEND", "")
	return f.pauseErr
}
func (f *fakeProxy) Resume(database string) error {
	_ = f.call("RESUME", database)
	return f.resumeErr
}
func (f *fakeProxy) SetDisabled(database string, disabled bool) {
	_ = f.call("DISABLE", fmt.Sprintf("%s %v", database, disabled))
}
func (f *fakeProxy) Reconnect(database string) { _ = f.call("RECONNECT", database) }
func (f *fakeProxy) Kill(database string) error {
	_ = f.call("KILL", database)
	return f.pauseErr
}
func (f *fakeProxy) KillClient(id uint64) bool {
	f.killed = append(f.killed, id)
	return id < 100
}
func (f *fakeProxy) WaitClose(ctx context.Context, database string) error {
	return f.call("WAIT_CLOSE", database)
}

func (f *fakeProxy) call(cmd, arg string) error {
	f.calls = append(f.calls, cmd+" "+arg)
	return nil
}

var _ Proxy = (*fakeProxy)(nil)

func newFake(t *testing.T) *fakeProxy {
	t.Helper()
	cfg := config.Defaults()
	cfg.Listen = "127.0.0.1:6432"
	cfg.Upstream = "postgres://app:secret@db.example:5432/app"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return &fakeProxy{cfg: &cfg, totals: map[string]proxy.Totals{}, avgs: map[string]observe.Averages{}}
}

// testSession is a console session of an admin (or only a stats user)
// whose commands are run directly, without a connection.
func testSession(f *fakeProxy, admin bool) *session {
	return &session{c: New(f, f), pc: &proxy.ConsoleConn{ID: 7}, log: zap.NewNop(), ctx: context.Background(), admin: admin}
}

// reply is a decoded console reply.
type reply struct {
	cols   []string
	oids   []uint32
	rows   [][]*string
	tag    string
	err    *pgproto3.ErrorResponse
	notice *pgproto3.NoticeResponse
}

func run(t *testing.T, s *session, sql string) reply {
	t.Helper()
	out, quit, werr := s.command(sql)
	if quit {
		t.Fatalf("%s: the session ends", sql)
	}
	if werr != nil {
		out = werr.Append(nil)
	}
	return decode(t, out)
}

func decode(t *testing.T, b []byte) reply {
	t.Helper()
	var r reply
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("short frame %v", b)
		}
		typ, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		body := b[5 : 1+n]
		b = b[1+n:]
		switch typ {
		case 'T':
			var m pgproto3.RowDescription
			if err := m.Decode(body); err != nil {
				t.Fatal(err)
			}
			for _, f := range m.Fields {
				r.cols = append(r.cols, string(f.Name))
				r.oids = append(r.oids, f.DataTypeOID)
			}
		case 'D':
			var m pgproto3.DataRow
			if err := m.Decode(body); err != nil {
				t.Fatal(err)
			}
			row := make([]*string, len(m.Values))
			for i, v := range m.Values {
				if v != nil {
					s := string(v)
					row[i] = &s
				}
			}
			if len(row) != len(r.cols) {
				t.Fatalf("row of %d values for %d columns", len(row), len(r.cols))
			}
			r.rows = append(r.rows, row)
		case 'C':
			r.tag = string(body[:len(body)-1])
		case 'E':
			r.err = &pgproto3.ErrorResponse{}
			if err := r.err.Decode(body); err != nil {
				t.Fatal(err)
			}
		case 'N':
			r.notice = &pgproto3.NoticeResponse{}
			if err := r.notice.Decode(body); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected message %q", typ)
		}
	}
	return r
}

// val returns row i's value of column name ("NULL" for NULL).
func (r reply) val(t *testing.T, i int, name string) string {
	t.Helper()
	j := slices.Index(r.cols, name)
	if j < 0 || i >= len(r.rows) {
		t.Fatalf("no row %d column %s in %v (%d rows)", i, name, r.cols, len(r.rows))
	}
	if v := r.rows[i][j]; v != nil {
		return *v
	}
	return "NULL"
}

func (r reply) wantError(t *testing.T, code, msg string) {
	t.Helper()
	if r.err == nil || r.err.Code != code || r.err.Message != msg {
		t.Errorf("got %+v, want ERROR %s %q", r.err, code, msg)
	}
}

func TestShowHelpAndVersion(t *testing.T) {
	s := testSession(newFake(t), false)
	r := run(t, s, "SHOW HELP")
	if r.notice == nil || r.notice.Message != "Console usage" || !strings.Contains(r.notice.Detail, "KILL_CLIENT <client_id>") || r.tag != "SHOW" {
		t.Errorf("SHOW HELP: %+v", r)
	}
	r = run(t, s, "select version;")
	if r.val(t, 0, "version") != "PgBouncer 1.25.2 (poolerd test)" || r.tag != "SHOW" {
		t.Errorf("SHOW VERSION: %+v", r)
	}
}

// SHOW RATE_LIMITS: a row per bucket; measured buckets show what they
// were charged and the waits their debt caused, count buckets NULL there.
func TestShowRateLimits(t *testing.T) {
	f := newFake(t)
	f.rates = []proxy.RateLimitInfo{
		{Rule: "share", Mode: "wait", KeyBy: "application_name", Bucket: "queries", Limit: 100, Per: time.Second,
			MaxWait: 30 * time.Second, Unit: "requests", Refused: 2, Backend: "memory"},
		{Rule: "share", Mode: "wait", KeyBy: "application_name", Bucket: "server_time", Measured: true, Limit: 30000,
			Per: time.Minute, MaxWait: 30 * time.Second, Unit: "ms", Charged: 1234.5, DebtWaits: 7, Backend: "memory"},
	}
	r := run(t, testSession(f, false), "SHOW RATE_LIMITS")
	for col, want := range map[string]string{"rule": "share", "bucket": "queries", "kind": "count", "limit": "100",
		"unit": "requests", "per_seconds": "1", "mode": "wait", "max_wait_seconds": "30", "key_by": "application_name",
		"backend": "memory", "refused": "2"} {
		if got := r.val(t, 0, col); got != want {
			t.Errorf("row 0 %s = %q, want %q", col, got, want)
		}
	}
	for col, want := range map[string]string{"bucket": "server_time", "kind": "measured", "limit": "30000", "unit": "ms",
		"per_seconds": "60", "charged": "1234.5", "debt_waits": "7"} {
		if got := r.val(t, 1, col); got != want {
			t.Errorf("row 1 %s = %q, want %q", col, got, want)
		}
	}
}

func TestShowState(t *testing.T) {
	f := newFake(t)
	s := testSession(f, false)
	for _, tc := range []struct {
		st   proxy.PauseState
		want []string
	}{
		{proxy.PauseState{}, []string{"yes", "no", "no"}},
		{proxy.PauseState{Paused: true}, []string{"no", "yes", "no"}},
		{proxy.PauseState{Suspended: true}, []string{"no", "no", "yes"}},
	} {
		f.pause = tc.st
		r := run(t, s, "SHOW STATE")
		got := []string{r.val(t, 0, "value"), r.val(t, 1, "value"), r.val(t, 2, "value")}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.st, got, tc.want)
		}
	}
}

// TestShowPoolsCounts: the console row counts console sessions; server
// states come from the snapshot's facts.
func TestShowPoolsCounts(t *testing.T) {
	f := newFake(t)
	f.pools = []proxy.PoolStats{
		{Database: "b", User: "u", Mode: "transaction", Clients: 4, Stats: pool.Stats{Waiting: 1, Opening: 1, OldestWait: 1500 * time.Millisecond}},
		{Database: "a", User: "u", Mode: "session"},
	}
	f.servers = []proxy.ServerInfo{
		{Database: "b", User: "u", Link: "0x1"},
		{Database: "b", User: "u", Link: "0x2", Cancelling: true},
		{Database: "b", User: "u", ConnInfo: pool.ConnInfo{Idle: true}},
		{Database: "b", User: "u", ConnInfo: pool.ConnInfo{Idle: true, Stale: true}},
		{Database: "b", User: "u"},
	}
	c := New(f, f)
	c.sessions.Store(2)
	s := &session{c: c, pc: &proxy.ConsoleConn{}, log: zap.NewNop(), ctx: context.Background()}
	r := run(t, s, "SHOW POOLS")
	if len(r.cols) != 17 || len(r.rows) != 3 {
		t.Fatalf("%d columns, %d rows", len(r.cols), len(r.rows))
	}
	if r.val(t, 0, "database") != "pgbouncer" || r.val(t, 0, "cl_active") != "2" || r.val(t, 0, "load_balance_hosts") != "NULL" {
		t.Errorf("admin row %v", r.rows[0])
	}
	if r.val(t, 1, "database") != "a" || r.val(t, 2, "database") != "b" {
		t.Errorf("pools not sorted: %v %v", r.rows[1], r.rows[2])
	}
	for col, want := range map[string]string{"cl_active": "3", "cl_waiting": "1", "sv_active": "1", "sv_active_cancel": "1",
		"sv_idle": "1", "sv_used": "1", "sv_tested": "1", "sv_login": "1", "maxwait": "1", "maxwait_us": "500000",
		"pool_mode": "transaction"} {
		if got := r.val(t, 2, col); got != want {
			t.Errorf("%s = %s, want %s", col, got, want)
		}
	}
}

func TestShowClients(t *testing.T) {
	f := newFake(t)
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5000}
	f.clients = []proxy.ClientInfo{
		{ID: 3, User: "app", Database: "app", RemoteAddr: addr, Ptr: "0xa", AppName: "web", Pinned: "temp_table"},
		{ID: 4, User: "app", Database: "app", Link: "0xs", Ptr: "0xb"},
		{ID: 5, User: "app", Database: "app", Waiting: true, Wait: 2*time.Second + 3*time.Microsecond, Ptr: "0xc"},
		{ID: 6, User: "admin", Database: "poolerd", Console: true, Ptr: "0xd"},
	}
	r := run(t, testSession(f, false), "SHOW CLIENTS")
	if len(r.cols) != 22 || r.cols[21] != "pinned" {
		t.Fatalf("columns %v", r.cols)
	}
	for i, want := range [][]string{
		{"idle", "app", "", "10.0.0.1", "5000", "web", "temp_table", "3"},
		{"active", "app", "0xs", "", "0", "", "", "4"},
		{"waiting", "app", "", "", "0", "", "", "5"},
		{"active", "pgbouncer", "", "", "0", "", "", "6"},
	} {
		got := []string{r.val(t, i, "state"), r.val(t, i, "database"), r.val(t, i, "link"), r.val(t, i, "addr"),
			r.val(t, i, "port"), r.val(t, i, "application_name"), r.val(t, i, "pinned"), r.val(t, i, "id")}
		if !slices.Equal(got, want) {
			t.Errorf("row %d: %v, want %v", i, got, want)
		}
	}
	if r.val(t, 2, "wait") != "2" || r.val(t, 2, "wait_us") != "3" {
		t.Errorf("wait %s s %s us", r.val(t, 2, "wait"), r.val(t, 2, "wait_us"))
	}
}

// TestShowSockets: clients and servers in one list under PgBouncer's socket
// states, with its 28 columns, ids from the one sequence.
func TestShowSockets(t *testing.T) {
	f := newFake(t)
	f.clients = []proxy.ClientInfo{
		{ID: 3, User: "app", Database: "app", Ptr: "0xa"},
		{ID: 5, User: "app", Database: "app", Waiting: true, Ptr: "0xc"},
		{ID: 6, User: "admin", Database: "poolerd", Console: true, Ptr: "0xd"},
	}
	f.servers = []proxy.ServerInfo{
		{ConnInfo: pool.ConnInfo{ID: 4}, Database: "app", User: "app", Link: "0xa"},
		{ConnInfo: pool.ConnInfo{ID: 7, Idle: true}, Database: "app", User: "app"},
		{ConnInfo: pool.ConnInfo{ID: 8, Idle: true, Stale: true}, Database: "app", User: "app"},
		{ConnInfo: pool.ConnInfo{ID: 9}, Database: "app", User: "app", Link: "0xe", Cancelling: true},
	}
	r := run(t, testSession(f, false), "SHOW SOCKETS")
	if len(r.cols) != 28 || r.cols[20] != "id" || r.cols[27] != "send_avail" {
		t.Fatalf("columns %v", r.cols)
	}
	for i, want := range [][]string{
		{"C", "cl_active", "app", "3"}, {"C", "cl_waiting", "app", "5"}, {"C", "cl_active", "pgbouncer", "6"},
		{"S", "sv_active", "app", "4"}, {"S", "sv_idle", "app", "7"}, {"S", "sv_used", "app", "8"}, {"S", "sv_active", "app", "9"},
	} {
		got := []string{r.val(t, i, "type"), r.val(t, i, "state"), r.val(t, i, "database"), r.val(t, i, "id")}
		if !slices.Equal(got, want) {
			t.Errorf("row %d: %v, want %v", i, got, want)
		}
	}
	if len(r.rows) != 7 {
		t.Errorf("%d rows, want 7", len(r.rows))
	}
	// The lists PgBouncer has and poolerd has nothing for (and the peers,
	// without peer_id): PgBouncer's columns, no rows.
	for sql, cols := range map[string]string{
		"SHOW ACTIVE_SOCKETS": strings.Join(r.cols, ","), "SHOW PEERS": "peer_id,host,port,pool_size",
		"SHOW PEER_POOLS": "peer_id,cl_active_cancel_req,cl_waiting_cancel_req,sv_active_cancel,sv_login",
		"SHOW DNS_HOSTS":  "hostname,ttl,addrs", "SHOW DNS_ZONES": "zonename,serial,count",
	} {
		e := run(t, testSession(f, false), sql)
		if got := strings.Join(e.cols, ","); got != cols || len(e.rows) != 0 {
			t.Errorf("%s: columns %s, %d rows; want %s, none", sql, got, len(e.rows), cols)
		}
	}
	// With peer_id and peers: one row per other peer, pool_size 0 shown
	// as the max_size it stands for.
	f.cfg.PeerID = 1
	f.cfg.Peers = []config.Peer{{ID: 1, Host: "/run/a", Port: 6432}, {ID: 2, Host: "/run/b", Port: 6433}, {ID: 3, Host: "10.0.0.3", Port: 6432, PoolSize: 4}}
	f.peerPools = []proxy.PeerPoolStats{{ID: 2}, {ID: 3, Active: 4, Waiting: 1}}
	p := run(t, testSession(f, false), "SHOW PEERS")
	if len(p.rows) != 2 || p.val(t, 0, "peer_id") != "2" || p.val(t, 0, "host") != "/run/b" || p.val(t, 0, "port") != "6433" ||
		p.val(t, 0, "pool_size") != strconv.Itoa(f.cfg.MaxSize) || p.val(t, 1, "pool_size") != "4" {
		t.Errorf("SHOW PEERS: %v", p.rows)
	}
	pp := run(t, testSession(f, false), "SHOW PEER_POOLS")
	if len(pp.rows) != 2 || pp.val(t, 1, "peer_id") != "3" || pp.val(t, 1, "cl_active_cancel_req") != "4" ||
		pp.val(t, 1, "cl_waiting_cancel_req") != "1" || pp.val(t, 1, "sv_active_cancel") != "4" {
		t.Errorf("SHOW PEER_POOLS: %v", pp.rows)
	}
	m := run(t, testSession(f, false), "SHOW MEM")
	if strings.Join(m.cols, ",") != "name,size,used,free,memtotal" || len(m.rows) != 3 || m.val(t, 0, "name") != "heap" || m.val(t, 0, "used") == "0" {
		t.Errorf("SHOW MEM: %v %v", m.cols, m.rows)
	}
}

// TestShowDatabasesFlags: a database paused or disabled with no pool has a
// row; the global pause shows on every row but the console's.
func TestShowDatabasesFlags(t *testing.T) {
	f := newFake(t)
	f.pools = []proxy.PoolStats{{Database: "app", User: "app", ServerUser: "app", Clients: 2, Stats: pool.Stats{Total: 3}}}
	f.pause = proxy.PauseState{Databases: map[string]proxy.DatabaseState{"gone": {Disabled: true}, "other": {}}}
	s := testSession(f, false)
	r := run(t, s, "SHOW DATABASES")
	if len(r.rows) != 3 || r.val(t, 0, "name") != "pgbouncer" || r.val(t, 0, "port") != "6432" ||
		r.val(t, 1, "name") != "app" || r.val(t, 2, "name") != "gone" {
		t.Fatalf("rows %v", r.rows)
	}
	if r.val(t, 1, "current_connections") != "3" || r.val(t, 1, "current_client_connections") != "2" ||
		r.val(t, 1, "host") != "db.example" || r.val(t, 1, "paused") != "0" || r.val(t, 2, "disabled") != "1" {
		t.Errorf("rows %v", r.rows)
	}
	f.pause.Paused = true
	r = run(t, s, "SHOW DATABASES")
	if r.val(t, 0, "paused") != "0" || r.val(t, 1, "paused") != "1" || r.val(t, 2, "paused") != "1" {
		t.Errorf("global pause: %v", r.rows)
	}
}

// TestShowTotals: totals add up; mean times are weighted by their rates.
func TestShowTotals(t *testing.T) {
	f := newFake(t)
	f.totals = map[string]proxy.Totals{"a": {Xacts: 1, Binds: 2}, "b": {Xacts: 10, Binds: 20}}
	f.avgs = map[string]observe.Averages{"a": {Xacts: 1, XactTimeUs: 100}, "b": {Xacts: 3, XactTimeUs: 500}}
	r := run(t, testSession(f, false), "SHOW TOTALS")
	got := map[string]string{}
	for i := range r.rows {
		got[r.val(t, i, "name")] = r.val(t, i, "value")
	}
	if len(r.rows) != 22 || got["total_xact_count"] != "11" || got["total_ps_bind_count"] != "22" ||
		got["avg_xact_count"] != "4" || got["avg_xact_time"] != "400" {
		t.Errorf("SHOW TOTALS %v", got)
	}
	r = run(t, testSession(f, false), "SHOW STATS")
	if len(r.cols) != 23 || len(r.rows) != 3 || r.val(t, 0, "database") != "pgbouncer" || r.val(t, 2, "avg_xact_time") != "500" {
		t.Errorf("SHOW STATS %v %v", r.cols, r.rows)
	}
}

func TestCommandErrors(t *testing.T) {
	f := newFake(t)
	admin, stats := testSession(f, true), testSession(f, false)
	for _, tc := range []struct {
		s        *session
		sql, msg string
	}{
		{stats, "SHOW NOTHING", "invalid command 'SHOW NOTHING', use SHOW HELP;"},
		{stats, "FROB", "invalid command 'FROB', use SHOW HELP;"},
		{stats, "RELOAD now", "invalid command 'RELOAD now', use SHOW HELP;"},
		{stats, "SHUTDOWN SOON", "invalid command 'SHUTDOWN SOON', use SHOW HELP;"},
		{stats, "PAUSE", "admin access needed"},
		{stats, "SET max_size = 3", "admin access needed"},
		{stats, "SET max_size = 'x", "bad arguments"},
		{stats, "KILL " + strings.Repeat("d", 64), "bad arguments"},
		{admin, "KILL_CLIENT x", "invalid client pointer supplied"},
		{admin, "KILL_CLIENT 7", "client not found"},
		{admin, "KILL_CLIENT 100", "client not found"},
		{admin, "PAUSE pgbouncer", "cannot pause admin db: pgbouncer"},
		{admin, "WAIT_CLOSE poolerd", "cannot wait in admin db: poolerd"},
		{admin, "DISABLE", "a database is required"},
		{admin, "KILL nodb", "no such database: nodb"},
		{admin, "SET listen = ':1'", "SET failed: listen can only change with a restart"},
		{admin, "SET max_size = x", "SET failed"},
		{admin, "SUSPEND now", "invalid command 'SUSPEND now', use SHOW HELP;"},
		{stats, "SUSPEND", "admin access needed"},
		{stats, "show fds", "SHOW FDS is not supported by poolerd"},
		{stats, "SHOW NOTHING", "invalid command 'SHOW NOTHING', use SHOW HELP;"},
	} {
		r := run(t, tc.s, tc.sql)
		r.wantError(t, "08P01", tc.msg)
		if strings.Contains(tc.msg, "not supported") && (r.err == nil || r.err.Detail == "") {
			t.Errorf("%s: no DETAIL says why", tc.sql)
		}
	}
	if !slices.Equal(f.killed, []uint64{100}) {
		t.Errorf("KillClient calls %v: the session's own id must not reach the proxy", f.killed)
	}
	if len(f.calls) != 0 {
		t.Errorf("refused commands reached the proxy: %v", f.calls)
	}
}

func TestControl(t *testing.T) {
	f := newFake(t)
	s := testSession(f, true)
	for _, tc := range []struct{ sql, tag, call string }{
		{"RELOAD", "RELOAD", "RELOAD "},
		{"PAUSE app", "PAUSE", "PAUSE app"},
		{"SUSPEND", "SUSPEND", "SUSPEND "},
		{"RESUME", "RESUME", "RESUME "},
		{"DISABLE app", "DISABLE", "DISABLE app true"},
		{"enable app", "ENABLE", "DISABLE app false"},
		{"RECONNECT", "RECONNECT", "RECONNECT "},
		{"KILL app", "KILL", "KILL app"},
		{"WAIT_CLOSE app", "WAIT_CLOSE", "WAIT_CLOSE app"},
		{"SHUTDOWN WAIT_FOR_CLIENTS", "SHUTDOWN", "SHUTDOWN WAIT_FOR_CLIENTS"},
		{"SET max_size = 7", "SET max_size=7", "SET max_size=7"},
		// PgBouncer's names and seconds.
		{"SET server_idle_timeout = 30", "SET idle_timeout=30s", "SET idle_timeout=30s"},
		{"SET default_pool_size = 15", "SET max_size=15", "SET max_size=15"},
		{"SET query_timeout = 1", "SET query_timeout=1s", "SET query_timeout=1s"},
		{"SET verbose = 1", "SET log_level=debug", "SET log_level=debug"},
		{"SET upstream = 'postgres://app:hunter2@h/app'", "SET upstream=" + config.FormatValue(f.cfg, "upstream"),
			"SET upstream=postgres://app:hunter2@h/app"},
	} {
		f.calls = nil
		r := run(t, s, tc.sql)
		if r.err != nil || r.tag != tc.tag || !slices.Equal(f.calls, []string{tc.call}) {
			t.Errorf("%s: tag %q error %+v calls %v; want %q, %q", tc.sql, r.tag, r.err, f.calls, tc.tag, tc.call)
		}
	}
	if _, quit, werr := s.command("SHUTDOWN"); !quit || werr != nil {
		t.Errorf("SHUTDOWN: quit %v, error %v", quit, werr)
	}
	if strings.Contains(run(t, s, "SET upstream = 'postgres://app:hunter2@h/app'").tag, "hunter2") {
		t.Error("SET upstream echoes the password")
	}
}

func TestControlRefusals(t *testing.T) {
	f := newFake(t)
	s := testSession(f, true)
	f.pauseErr = proxy.ErrPaused
	run(t, s, "PAUSE").wantError(t, "08P01", "already suspended/paused")
	run(t, s, "KILL").wantError(t, "08P01", "already suspended/paused")
	run(t, s, "SUSPEND").wantError(t, "08P01", "already suspended/paused")
	f.pauseErr = proxy.ErrShutdownInProgress
	run(t, s, "SUSPEND").wantError(t, "08P01", "pooler is shutting down")
	f.pauseErr = proxy.ErrDatabasesPaused
	run(t, s, "SUSPEND").wantError(t, "08P01", "cannot suspend with paused databases")
	for _, tc := range []struct {
		err      error
		sql, msg string
	}{
		{proxy.ErrShutdownInProgress, "RESUME", "pooler is shutting down"},
		{proxy.ErrNotPaused, "RESUME", "pooler is not paused/suspended"},
		{fmt.Errorf("database app: %w", proxy.ErrNotPaused), "RESUME app", "database app is not paused"},
	} {
		f.resumeErr = tc.err
		run(t, s, tc.sql).wantError(t, "08P01", tc.msg)
	}
}

// TestPauseCancelled: a cancel request while PAUSE waits undoes the pause
// and answers 57014; so does the session's end.
func TestPauseCancelled(t *testing.T) {
	for _, cancel := range []func(s *session){
		func(s *session) { s.Cancel() },
		func(s *session) { s.cancelWait(errTerminated) },
	} {
		f := newFake(t)
		f.pauseWait = true
		s := testSession(f, true)
		done := make(chan reply)
		go func() { done <- run(t, s, "PAUSE app") }()
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.waitMu.Lock()
			waiting := s.waitCancel != nil
			s.waitMu.Unlock()
			if waiting || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel(s)
		r := <-done
		r.wantError(t, "57014", "canceling PAUSE due to user request; resumed again")
		if !slices.Equal(f.calls, []string{"PAUSE app", "CANCEL_PAUSE app"}) {
			t.Errorf("calls %v", f.calls)
		}
	}
}

// TestQueryLogsNoSecret: a refused SET is logged without its value, and
// the refusal goes to the client with ReadyForQuery.
func TestQueryLogsNoSecret(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	s := testSession(newFake(t), false)
	s.log = zap.New(core)
	client, server := net.Pipe()
	defer client.Close()
	s.conn = server
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		got <- b
	}()
	if s.query("SET upstream = 'postgres://a:hunter2@h/db'") {
		t.Fatal("SET ended the session")
	}
	_ = server.Close()
	out := <-got
	if r := decode(t, out[:len(out)-6]); r.err == nil || r.err.Message != "admin access needed" {
		t.Errorf("reply %+v", r)
	}
	if !bytes.HasSuffix(out, wire.AppendReadyForQuery(nil, wire.TxIdle)) {
		t.Errorf("no ReadyForQuery at the end of %v", out)
	}
	entries := logs.FilterMessage("admin console command refused").All()
	if len(entries) != 1 || entries[0].ContextMap()["command"] != "SET upstream" {
		t.Errorf("log entries %v", entries)
	}
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), "hunter2") {
			t.Errorf("logged the password: %v", e.ContextMap())
		}
	}
}
