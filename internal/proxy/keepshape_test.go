package proxy

import (
	"testing"

	"github.com/poolerd/poolerd/internal/sqlscan"
)

// TestTxShape: what a request may have done to the transaction status,
// from a simple Query's text (shapeOf) and from the statements of a Sync
// group's Executes in order (then), which must agree with the text
// they make up.
func TestTxShape(t *testing.T) {
	cases := []struct {
		stmts []string // one per Execute; joined, one Query
		want  txShape
	}{
		{[]string{"SELECT 1"}, 0},
		{[]string{"BEGIN", "INSERT INTO t VALUES (1)", "SELECT pg_sleep(3)"}, txOpens},
		{[]string{"INSERT INTO t VALUES (1)", "BEGIN", "SELECT 1"}, txOpens},
		{[]string{"BEGIN", "INSERT INTO t VALUES (1)", "ROLLBACK"}, txEnds},
		{[]string{"ROLLBACK", "INSERT INTO t VALUES (1)", "SELECT pg_sleep(3)"}, txEnds | txAfterEnd},
		{[]string{"COMMIT", "BEGIN", "INSERT INTO t VALUES (1)"}, txOpens},
		{[]string{"ROLLBACK", "SELECT 1", "BEGIN", "SELECT 2"}, txOpens},
		{[]string{"END", "SELECT 1"}, txEnds | txAfterEnd},
		{[]string{"COMMIT AND CHAIN", "SELECT 1"}, 0},
		{[]string{"BEGIN", "COMMIT AND CHAIN", "SELECT 1"}, txOpens},
		{[]string{"ROLLBACK TO SAVEPOINT s", "SELECT 1"}, 0},
		{[]string{"ROLLBACK", "ROLLBACK"}, txEnds},
	}
	for _, c := range cases {
		var grp txShape
		text := ""
		for i, st := range c.stmts {
			grp = grp.then(shapeOf(sqlscan.Scan(st), false))
			if i > 0 {
				text += "; "
			}
			text += st
		}
		if grp != c.want {
			t.Errorf("Executes %q: shape %b, want %b", c.stmts, grp, c.want)
		}
		if got := shapeOf(sqlscan.Scan(text), false); got != c.want {
			t.Errorf("Query %q: shape %b, want %b", text, got, c.want)
		}
	}
	if got := shapeOf(sqlscan.Scan("SELECT 1"), true); got != txUnknown {
		t.Errorf("truncated text: shape %b, want txUnknown", got)
	}
	if got := txUnknown.then(shapeOf(sqlscan.Scan("ROLLBACK"), false)); got != txEnds {
		t.Errorf("unknown, then ROLLBACK: shape %b, want txEnds", got)
	}
	if got := (txEnds).then(txUnknown); got != txUnknown {
		t.Errorf("ROLLBACK, then unknown: shape %b, want txUnknown", got)
	}
}
