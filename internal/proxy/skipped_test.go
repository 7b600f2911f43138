package proxy

import (
	"slices"
	"testing"
)

// The queue entries a server's error (or the end of their Sync group) shows
// skipped are undone the latest first, so that the server connection's list
// of prepared definitions and the client's names end as the server has them
// (issue #31, hole 8). Each case starts from a state, applies what sending
// its entries did (as stmtFrame, ensurePrepared and emitEvictions do), and
// has the server skip them all.
func TestStmtSkippedUndoOrder(t *testing.T) {
	x := &stmtDef{name: "poolerd_s1", key: "x"}
	y := &stmtDef{name: "poolerd_s2", key: "y"}
	type sent struct {
		op    stmtOp
		apply func(sc *serverConn, s *session)
	}
	evict := func(d *stmtDef) sent {
		return sent{stmtOp{kind: opEvict, close: true, swallow: true, name: d.name},
			func(sc *serverConn, _ *session) { sc.stmts.Remove(d.name) }}
	}
	inject := func(d *stmtDef) sent {
		return sent{stmtOp{kind: opInject, swallow: true, def: d},
			func(sc *serverConn, _ *session) { sc.stmts.Add(d.name) }}
	}
	parse := func(client string, d *stmtDef) sent {
		return sent{stmtOp{kind: opClientParse, client: client, def: d},
			func(sc *serverConn, s *session) { s.stmtSet(client, d); sc.stmts.Add(d.name) }}
	}
	closeStmt := func(client string, d *stmtDef) sent {
		return sent{stmtOp{kind: opClientClose, close: true, client: client, def: d},
			func(_ *serverConn, s *session) { delete(s.stmts, client) }}
	}
	cases := []struct {
		name       string
		server     []string            // prepared on the connection before
		names      map[string]*stmtDef // the client's names before
		sent       []sent
		wantServer []string
		wantNames  map[string]*stmtDef
	}{
		{name: "an eviction, then an injected Parse of the same definition",
			server: []string{x.name}, sent: []sent{evict(x), inject(x)}, wantServer: []string{x.name}},
		{name: "a Parse, then its eviction by the next Parse",
			sent: []sent{parse("a", x), evict(x), parse("b", y)}, wantServer: []string{}},
		{name: "a Close and a Parse of the same name with other SQL",
			server: []string{x.name}, names: map[string]*stmtDef{"s1": x},
			sent:       []sent{closeStmt("s1", x), parse("s1", y)},
			wantServer: []string{x.name}, wantNames: map[string]*stmtDef{"s1": x}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := &Server{stmts: newStmtRegistry()}
			s := &session{srv: srv}
			sc := &serverConn{}
			for _, n := range c.server {
				sc.stmts.Add(n)
			}
			for n, d := range c.names {
				s.stmtSet(n, d)
				srv.stmts.retain(d)
			}
			for _, x := range c.sent {
				x.apply(sc, s)
				op := x.op
				op.sess = s
				sc.stq.push(op)
				sc.nops.Add(1)
			}
			sc.stmtGroupEnded()
			got := sc.stmts.Names()
			slices.Sort(got)
			want := append([]string{}, c.wantServer...)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("server connection's list: %v, want %v", got, want)
			}
			for n, d := range c.wantNames {
				if s.stmts[n] != d {
					t.Errorf("client's %q: %v, want %v", n, s.stmts[n], d)
				}
			}
			if len(s.stmts) != len(c.wantNames) {
				t.Errorf("client's names: %v, want %v", s.stmts, c.wantNames)
			}
			if sc.stq.len() != 0 || sc.nops.Load() != 0 {
				t.Errorf("queue: %d entries, nops %d, want none", sc.stq.len(), sc.nops.Load())
			}
		})
	}
}

// The ReadyForQuery that ends a Sync group undoes the entries of that group
// still queued (the server skipped them: they arrived after the group's
// error) and leaves those of later groups.
func TestStmtGroupEndedKeepsLaterGroups(t *testing.T) {
	x := &stmtDef{name: "poolerd_s1", key: "x"}
	y := &stmtDef{name: "poolerd_s2", key: "y"}
	sc := &serverConn{}
	sc.stmts.Add(x.name)
	sc.stq.push(stmtOp{zseq: 4, kind: opInject, swallow: true, def: x})
	sc.stmts.Add(y.name)
	sc.stq.push(stmtOp{zseq: 5, kind: opInject, swallow: true, def: y})
	sc.nops.Store(2)
	sc.zRecv = 4
	sc.stmtGroupEnded()
	if got := sc.stmts.Names(); !slices.Equal(got, []string{y.name}) {
		t.Errorf("after group 4 ended: %v, want [%s]", got, y.name)
	}
	if sc.stq.len() != 1 || sc.stq.front().def != y || sc.nops.Load() != 1 {
		t.Errorf("queue after group 4 ended: %d entries, nops %d; want group 5's only", sc.stq.len(), sc.nops.Load())
	}
}
