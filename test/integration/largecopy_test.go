package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"testing"
	"time"
)

// TestLargeCopyExact: 100 MB go into PostgreSQL with COPY FROM STDIN and
// come back with COPY TO STDOUT through poolerd, byte for byte (make test
// runs it on event loops too: frames far larger than any buffer, both ways).
func TestLargeCopyExact(t *testing.T) {
	if testing.Short() {
		t.Skip("100 MB both ways")
	}
	p := startPoolerd(t, nil)
	ctx := ctxTimeout(t, 3*time.Minute)
	c := p.connect(t)
	table := fmt.Sprintf("large_copy_%d", time.Now().UnixNano())
	if _, err := c.Exec(ctx, "CREATE UNLOGGED TABLE "+table+" (id int, v text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = appDirect(t).Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	const size = 100 << 20
	row := func(i int, dst []byte) []byte {
		dst = fmt.Appendf(dst, "%d\t", i)
		for j := range 1000 {
			dst = append(dst, 'a'+byte((i+j)%26))
		}
		return append(dst, '\n')
	}
	var in bytes.Buffer
	for i := 0; in.Len() < size; i++ {
		in.Write(row(i, nil))
	}
	want := sha256.Sum256(in.Bytes())
	tag, err := c.PgConn().CopyFrom(ctx, bytes.NewReader(in.Bytes()), "COPY "+table+" FROM STDIN")
	if err != nil {
		t.Fatalf("COPY FROM STDIN: %v", err)
	}
	h := sha256.New()
	n := &countWriter{w: h}
	if _, err := c.PgConn().CopyTo(ctx, n, "COPY (SELECT * FROM "+table+" ORDER BY id) TO STDOUT"); err != nil {
		t.Fatalf("COPY TO STDOUT: %v", err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) || n.n != int64(in.Len()) {
		t.Fatalf("COPY TO gave %d bytes (sha256 %x), COPY FROM sent %d (%x)", n.n, got, in.Len(), want)
	}
	t.Logf("%s: %d bytes in and out, identical", tag, in.Len())
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}
