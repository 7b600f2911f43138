package txstate

import "testing"

func TestTxExitStmt(t *testing.T) {
	for q, want := range map[string]bool{
		"ROLLBACK": true, "  commit;": true, "END": true, "abort": true, "ROLLBACK TO SAVEPOINT sp1": true,
		"PREPARE TRANSACTION 'x'": true, "prepare p AS SELECT 1": false, "SELECT 1": false, "": false,
		"BEGIN": false, "rollbacks": false,
	} {
		if got := TxExitStmt([]byte(q + "\x00")); got != want {
			t.Errorf("TxExitStmt(%q) = %v, want %v", q, got, want)
		}
	}
}
