package txstate

import (
	"testing"

	"github.com/poolerd/poolerd/internal/sqlscan"
)

// TestTxShape: what a request may have done to the transaction status,
// from a simple Query's text (ShapeOf) and from the statements of a Sync
// group's Executes in order (Then), which must agree with the text
// they make up.
func TestTxShape(t *testing.T) {
	cases := []struct {
		stmts []string // one per Execute; joined, one Query
		want  TxShape
	}{
		{[]string{"SELECT 1"}, 0},
		{[]string{"BEGIN", "INSERT INTO t VALUES (1)", "SELECT pg_sleep(3)"}, TxOpens},
		{[]string{"INSERT INTO t VALUES (1)", "BEGIN", "SELECT 1"}, TxOpens},
		{[]string{"BEGIN", "INSERT INTO t VALUES (1)", "ROLLBACK"}, TxEnds},
		{[]string{"ROLLBACK", "INSERT INTO t VALUES (1)", "SELECT pg_sleep(3)"}, TxEnds | TxAfterEnd},
		{[]string{"COMMIT", "BEGIN", "INSERT INTO t VALUES (1)"}, TxOpens},
		{[]string{"ROLLBACK", "SELECT 1", "BEGIN", "SELECT 2"}, TxOpens},
		{[]string{"END", "SELECT 1"}, TxEnds | TxAfterEnd},
		{[]string{"COMMIT AND CHAIN", "SELECT 1"}, 0},
		{[]string{"BEGIN", "COMMIT AND CHAIN", "SELECT 1"}, TxOpens},
		{[]string{"ROLLBACK TO SAVEPOINT s", "SELECT 1"}, 0},
		{[]string{"ROLLBACK", "ROLLBACK"}, TxEnds},
	}
	for _, c := range cases {
		var grp TxShape
		text := ""
		for i, st := range c.stmts {
			grp = grp.Then(ShapeOf(sqlscan.Scan(st), false))
			if i > 0 {
				text += "; "
			}
			text += st
		}
		if grp != c.want {
			t.Errorf("Executes %q: shape %b, want %b", c.stmts, grp, c.want)
		}
		if got := ShapeOf(sqlscan.Scan(text), false); got != c.want {
			t.Errorf("Query %q: shape %b, want %b", text, got, c.want)
		}
	}
	if got := ShapeOf(sqlscan.Scan("SELECT 1"), true); got != TxUnknown {
		t.Errorf("truncated text: shape %b, want TxUnknown", got)
	}
	if got := TxUnknown.Then(ShapeOf(sqlscan.Scan("ROLLBACK"), false)); got != TxEnds {
		t.Errorf("unknown, then ROLLBACK: shape %b, want TxEnds", got)
	}
	if got := (TxEnds).Then(TxUnknown); got != TxUnknown {
		t.Errorf("ROLLBACK, then unknown: shape %b, want TxUnknown", got)
	}
}
