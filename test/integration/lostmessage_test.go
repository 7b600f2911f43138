package integration

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/test/pgtest"
)

// TestServerResetMessageReachesClient: when the network to PostgreSQL resets
// server connections in the middle of clients' transactions, every client
// whose session ends (a COMMIT was in flight) reads poolerd's FATAL before
// the connection closes, every client that keeps its session gets an ERROR
// (internal/proxy/keep.go), and the stream it reads stays well formed. The client reads the raw
// protocol: libpq-based clients may not report a FATAL that arrives in the
// same packet as the ReadyForQuery before it (they find it only after
// sending their next query, and report the close instead).
func TestServerResetMessageReachesClient(t *testing.T) {
	fp := toStartProxy(t)
	p := toStartViaProxy(t, fp, func(c *config.Config) {
		c.PoolMode = config.PoolTransaction
		c.MaxSize = 8
	})
	// One login before the faults start: the pool learns the server's
	// parameters from its first connection, and later logins need none.
	warm := dialFE(t, p.addr)
	warm.startup(pgtest.RoleApp)
	warm.authenticate(pgtest.Password)
	_ = warm.nc.Close()
	const clients = 4
	stop := make(chan struct{})
	var mu sync.Mutex
	var ends, withMsg, midMsg, kept int
	var bad []string
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := dialFE(t, p.addr)
				ft := &frameTracker{r: c.nc}
				c.fe = pgproto3.NewFrontend(ft, c.nc)
				c.startup(pgtest.RoleApp)
				c.authenticate(pgtest.Password)
				var last pgproto3.BackendMessage
				var err error
			session:
				for _, q := range []string{"BEGIN", "SELECT pg_sleep(0.05)", "SELECT 1", "COMMIT"} {
					c.fe.Send(&pgproto3.Query{String: q})
					if err = c.fe.Flush(); err != nil {
						break
					}
					for {
						var m pgproto3.BackendMessage
						if m, err = c.fe.Receive(); err != nil {
							break session
						}
						last = m
						if e, ok := m.(*pgproto3.ErrorResponse); ok && e.Severity == "ERROR" && (e.Code == "08006" || e.Code == "08007") {
							mu.Lock()
							kept++
							mu.Unlock()
						}
						if _, ok := m.(*pgproto3.ReadyForQuery); ok {
							break
						}
					}
				}
				_ = c.nc.Close()
				if err == nil {
					continue
				}
				mu.Lock()
				ends++
				if e, ok := last.(*pgproto3.ErrorResponse); ok && e.Severity == "FATAL" {
					withMsg++
				} else if ft.midMessage() {
					// Cut in the middle of a message from the server: no
					// message can follow (it would be read as the rest),
					// the stream just ends, as with PgBouncer.
					midMsg++
				} else if len(bad) < 5 {
					bad = append(bad, fmt.Sprintf("session ended after %T without a FATAL: %v", last, err))
				}
				mu.Unlock()
			}
		}()
	}
	for range 100 {
		time.Sleep(70 * time.Millisecond)
		fp.ResetAll()
	}
	close(stop)
	wg.Wait()
	t.Logf("%d sessions ended by a reset, %d with a FATAL, %d in the middle of a message; %d requests answered with an ERROR, their sessions kept", ends, withMsg, midMsg, kept)
	for _, b := range bad {
		t.Error(b)
	}
	if ends == 0 && kept == 0 {
		t.Fatal("the resets neither ended a session nor were survived by one")
	}
}

// frameTracker passes a server's byte stream through and follows its
// message boundaries: midMessage says whether the stream so far ends inside
// a message (a header or a body not read whole).
type frameTracker struct {
	r    io.Reader
	hdr  int // header bytes of the current message seen (0-5)
	len  [4]byte
	left int // body bytes of the current message still to come
}

func (f *frameTracker) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	for _, b := range p[:n] {
		switch {
		case f.left > 0:
			f.left--
		case f.hdr == 0:
			f.hdr = 1 // the type byte
		default:
			f.len[f.hdr-1] = b
			f.hdr++
			if f.hdr == 5 {
				f.left = int(binary.BigEndian.Uint32(f.len[:])) - 4
				f.hdr = 0
			}
		}
	}
	return n, err
}

func (f *frameTracker) midMessage() bool { return f.hdr > 0 || f.left > 0 }
