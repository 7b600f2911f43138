package integration

// Issue #31, hole 8: a Parse the server never completed is taken as
// prepared. In a pipeline whose Sync group fails (a Parse or Bind with an
// error), PostgreSQL skips the rest of the group up to its Sync: the Parses
// and Closes there never happen. Each case below runs a few clients'
// requests on direct connections and through poolerd, and every answer must
// be PostgreSQL's own, message for message: the statements prepared before
// the error exist, the ones whose Parse was skipped do not (26000), and
// another client that prepares the same SQL on the same server connection
// gets it prepared.

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// spStep is one client's request in a case.
type spStep struct {
	client string
	st     txpStep
}

// spUntilError reads an answer up to the first ErrorResponse: PostgreSQL
// sends an error at once, before the Sync that ends its group arrives.
func spUntilError(name string, msgs ...pgproto3.FrontendMessage) txpStep {
	return txpStep{name: name, until: "ErrorResponse", msgs: msgs}
}

func spRFQ(name string, n int, msgs ...pgproto3.FrontendMessage) txpStep {
	return txpStep{name: name, rfq: n, msgs: msgs}
}

func spDescribePortal() *pgproto3.Describe { return &pgproto3.Describe{ObjectType: 'P'} }

// spCompare runs steps on connections (one per client, opened in order of
// first use) to dsn and returns the answers.
func spRun(t *testing.T, dsn string, steps []spStep) [][]string {
	t.Helper()
	ctx := ctxTimeout(t, 60*time.Second)
	conns := map[string]*txpRaw{}
	defer func() {
		for _, r := range conns {
			r.close()
		}
	}()
	var out [][]string
	for _, x := range steps {
		r := conns[x.client]
		if r == nil {
			var err error
			if r, err = txpDial(ctx, dsn); err != nil {
				t.Fatalf("%s: connect: %v", x.client, err)
			}
			conns[x.client] = r
		}
		tr, err := r.run(x.st)
		if err != nil {
			t.Fatalf("%s: %s: %v (answers so far: %v)", x.client, x.st.name, err, out)
		}
		out = append(out, tr)
	}
	return out
}

// spCases are the pipelines of hole 8. Client A's pipeline fails; B is
// another client, which with a pool of one gets the server connection A
// used, and with a pool of two either.
func spCases() []struct {
	name    string
	maxPrep int
	pools   []int // pool sizes (default 1 and 2)
	steps   []spStep
} {
	// B prepares SQL whose Parse A's pipeline skipped, inside a
	// transaction block (where poolerd cannot retry a statement answered
	// from its cache), then uses it.
	bUses := func(sql string) []spStep {
		return []spStep{
			{"B", spRFQ("B: BEGIN", 1, txpQuery("BEGIN"))},
			{"B", spRFQ("B: Parse, Bind, Execute of SQL A's skipped Parse had", 1,
				txpParse("b", sql), txpBind("b"), txpExec(), txpSync())},
			{"B", spRFQ("B: COMMIT", 1, txpQuery("COMMIT"))},
		}
	}
	type spCase = struct {
		name    string
		maxPrep int
		pools   []int
		steps   []spStep
	}
	var cases []spCase
	cases = append(cases, spCase{
		// PgBouncer's test_prepared_failed_prepare_pipeline, as psycopg
		// sends it: each statement is Parse, Bind, Describe, Execute, and
		// the Sync comes in a later write, after the error has arrived.
		name: "psycopg pipeline: the rest of the group after the error arrived",
		steps: append(append([]spStep{
			{"A", spUntilError("A: Parse p0 (ok) ... Parse p1 (unknown table) ..., no Sync",
				txpParse("p0", "SELECT 1"), txpBind("p0"), spDescribePortal(), txpExec(),
				txpParse("p1", "SELECT * FROM doesnotexistyet"), txpBind("p1"), spDescribePortal(), txpExec())},
			{"A", spRFQ("A: Parse p2 ..., Sync", 1,
				txpParse("p2", "SELECT 2"), txpBind("p2"), spDescribePortal(), txpExec(), txpSync())},
		}, bUses("SELECT 2")...),
			spStep{"A", spRFQ("A: Parse p2 again, Bind, Sync", 1,
				txpParse("p2", "SELECT 2"), txpBind("p2"), spDescribePortal(), txpExec(), txpSync())},
			spStep{"A", spRFQ("A: Bind p0, Sync", 1, txpBind("p0"), spDescribePortal(), txpExec(), txpSync())},
			spStep{"A", spRFQ("A: Parse p1 now, Sync", 1, txpParse("p1", "SELECT 11 AS eleven"), txpSync())},
		),
	}, spCase{
		name: "a failed Bind, then the rest of the group in a later write",
		steps: append(append([]spStep{
			{"A", spUntilError("A: Parse s1 (ok), Bind nosuch, Flush",
				txpParse("s1", "SELECT 1 AS one"), txpBind("nosuch"), &pgproto3.Flush{})},
			{"A", spRFQ("A: Parse s3, Describe s3, Parse s4, Sync", 1,
				txpParse("s3", "SELECT 3 AS three"), txpDescribeStmt("s3"), txpParse("s4", "SELECT 4 AS four"), txpSync())},
		}, bUses("SELECT 3 AS three")...),
			spStep{"A", spRFQ("A: Parse s3 and s4 again", 1,
				txpParse("s3", "SELECT 3 AS three"), txpParse("s4", "SELECT 4 AS four"),
				txpBind("s3"), txpExec(), txpBind("s4"), txpExec(), txpSync())},
			spStep{"A", spRFQ("A: Bind s1, Sync", 1, txpBind("s1"), txpExec(), txpSync())},
		),
	}, spCase{
		name: "several Syncs in one write, Describe and Bind between the Parses",
		steps: append([]spStep{
			{"A", spRFQ("A: Parse s1, Sync; Parse s2 (bad), Describe s2, Parse s3, Bind s3, Sync; Bind s1, Sync; Bind s3, Sync", 4,
				txpParse("s1", "SELECT 1 AS one"), txpSync(),
				txpParse("s2", "SELEC 2"), txpDescribeStmt("s2"), txpParse("s3", "SELECT 3 AS three"), txpBind("s3"), txpExec(), txpSync(),
				txpBind("s1"), txpExec(), txpSync(),
				txpBind("s3"), txpExec(), txpSync())},
		}, append(bUses("SELECT 3 AS three"),
			spStep{"A", spRFQ("A: Parse s2 and s3 now", 1,
				txpParse("s2", "SELECT 2 AS two"), txpParse("s3", "SELECT 3 AS three"), txpBind("s3"), txpExec(), txpSync())},
		)...),
	}, spCase{
		name: "a skipped Close and Parse of the same name",
		steps: []spStep{
			{"A", spRFQ("A: Parse s1", 1, txpParse("s1", "SELECT 1 AS one"), txpSync())},
			{"A", spRFQ("A: Bind nosuch, Close s1, Parse s1 with other SQL, Sync", 1,
				txpBind("nosuch"), txpCloseStmt("s1"), txpParse("s1", "SELECT 'other' AS other"), txpSync())},
			{"A", spRFQ("A: Bind s1 (the first SQL)", 1, txpBind("s1"), txpExec(), txpSync())},
			{"A", spRFQ("A: Close s1, Parse s1 with other SQL", 1,
				txpCloseStmt("s1"), txpParse("s1", "SELECT 'other' AS other"), txpBind("s1"), txpExec(), txpSync())},
		},
	}, spCase{
		// Each Parse evicts the one before it from the server connection
		// (max_prepared_statements 1): the skipped evictions and Parses
		// must leave the connection's list as the server has it.
		name:    "skipped Parses that evict each other",
		maxPrep: 1,
		steps: append([]spStep{
			{"A", spRFQ("A: Parse s1", 1, txpParse("s1", "SELECT 'one' AS v"), txpSync())},
			{"A", spRFQ("A: Bind nosuch, Parse s2, Parse s3, Sync", 1,
				txpBind("nosuch"), txpParse("s2", "SELECT 'two' AS v"), txpParse("s3", "SELECT 'three' AS v"), txpSync())},
			{"A", spRFQ("A: Bind s1", 1, txpBind("s1"), txpExec(), txpSync())},
		}, bUses("SELECT 'two' AS v")...),
	}, spCase{
		// The later groups of the pipeline are written before the answers
		// to the earlier ones arrive: what the skipped group would have
		// prepared or closed on the server connection must not count yet.
		name:    "a statement injected in the skipped group, used in a later one",
		maxPrep: 1,
		steps: []spStep{
			{"A", spRFQ("A: Parse s1, Sync; Parse s2, Sync", 2,
				txpParse("s1", "SELECT 'one' AS v"), txpSync(), txpParse("s2", "SELECT 'two' AS v"), txpSync())},
			{"A", spRFQ("A: Bind nosuch, Bind s1, Sync; Bind s1, Execute, Sync; Bind s2, Execute, Sync", 3,
				txpBind("nosuch"), txpBind("s1"), txpExec(), txpSync(),
				txpBind("s1"), txpExec(), txpSync(),
				txpBind("s2"), txpExec(), txpSync())},
		},
	}, spCase{
		name:    "an eviction in the skipped group, the statement used in a later one",
		maxPrep: 1,
		steps: []spStep{
			{"A", spRFQ("A: Parse s1", 1, txpParse("s1", "SELECT 'one' AS v"), txpSync())},
			{"A", spRFQ("A: Bind nosuch, Parse s2, Sync; Bind s1, Execute, Sync; Sync", 3,
				txpBind("nosuch"), txpParse("s2", "SELECT 'two' AS v"), txpSync(),
				txpBind("s1"), txpExec(), txpSync(), txpSync())},
			{"A", spRFQ("A: Bind s1, Bind s2", 2, txpBind("s1"), txpExec(), txpSync(), txpBind("s2"), txpExec(), txpSync())},
		},
	}, spCase{
		name: "the SQL of a skipped Parse prepared under another name in a later group",
		steps: []spStep{
			{"A", spRFQ("A: Bind nosuch, Parse s3, Sync; Parse s5 (same SQL), Bind s5, Execute, Sync; Sync", 3,
				txpBind("nosuch"), txpParse("s3", "SELECT 3 AS three"), txpSync(),
				txpParse("s5", "SELECT 3 AS three"), txpBind("s5"), txpExec(), txpSync(), txpSync())},
			{"A", spRFQ("A: Bind s3, Bind s5", 2, txpBind("s3"), txpExec(), txpSync(), txpBind("s5"), txpExec(), txpSync())},
		},
	}, spCase{
		// The unnamed statement on the server connection is still B's.
		name: "a skipped unnamed Parse",
		steps: []spStep{
			{"B", spRFQ("B: Parse unnamed, Bind, Execute", 1,
				txpParse("", "SELECT 'B' AS who"), txpBind(""), txpExec(), txpSync())},
			{"A", spRFQ("A: Bind nosuch, Parse unnamed, Sync", 1,
				txpBind("nosuch"), txpParse("", "SELECT 'A' AS who"), txpSync())},
			{"A", spRFQ("A: Bind unnamed", 1, txpBind(""), txpExec(), txpSync())},
		},
	}, spCase{
		name: "a skipped unnamed Parse, bound in a later group of the pipeline",
		steps: []spStep{
			{"B", spRFQ("B: Parse unnamed, Bind, Execute", 1,
				txpParse("", "SELECT 'B' AS who"), txpBind(""), txpExec(), txpSync())},
			{"A", spRFQ("A: Bind nosuch, Parse unnamed, Sync; Bind unnamed, Execute, Sync", 2,
				txpBind("nosuch"), txpParse("", "SELECT 'A' AS who"), txpSync(), txpBind(""), txpExec(), txpSync())},
		},
	}, spCase{
		// PostgreSQL drops the unnamed statement before parsing the new
		// one. With a pool of two, B's block holds one server connection
		// and A's Bind goes to the other.
		name:  "a failed unnamed Parse, the Bind on another server connection",
		pools: []int{2},
		steps: []spStep{
			{"A", spRFQ("A: Parse unnamed", 1, txpParse("", "SELECT 'A' AS who"), txpSync())},
			{"A", spRFQ("A: Parse unnamed (bad), Sync", 1, txpParse("", "SELEC 'A2'"), txpSync())},
			{"B", spRFQ("B: BEGIN", 1, txpQuery("BEGIN"))},
			{"A", spRFQ("A: Bind unnamed", 1, txpBind(""), txpExec(), txpSync())},
			{"B", spRFQ("B: COMMIT", 1, txpQuery("COMMIT"))},
			{"A", spRFQ("A: Bind unnamed again", 1, txpBind(""), txpExec(), txpSync())},
		},
	})
	return cases
}

// Every case of spCases answers through poolerd as directly, over a pool of
// one and a pool of two server connections.
func TestTxPreparedSkippedParse(t *testing.T) {
	t.Parallel()
	for _, c := range spCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			golden := spRun(t, directDSN(pgtest.DBApp), c.steps)
			pools := c.pools
			if pools == nil {
				pools = []int{1, 2}
			}
			for _, size := range pools {
				p := startPoolerd(t, func(cf *config.Config) {
					cf.PoolMode = config.PoolTransaction
					cf.MaxSize = size
					if c.maxPrep > 0 {
						cf.MaxPreparedStatements = c.maxPrep
					}
					cf.CheckoutTimeout = 3 * time.Second
					cf.LogLevel = "info"
				})
				got := spRun(t, p.appDSN(), c.steps)
				for i, x := range c.steps {
					if g, w := strings.Join(got[i], " | "), strings.Join(golden[i], " | "); g != w {
						t.Errorf("pool of %d, step %q:\n    direct:  %s\n    poolerd: %s", size, x.st.name, w, g)
					}
				}
			}
		})
	}
}
