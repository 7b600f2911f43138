package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poolerd/poolerd/test/faultproxy"
)

// fault is one kind of chaos event. do injects it and returns when it is
// over (for a fault that lasts, after it has been lifted).
type fault struct {
	name string
	do   func(ctx context.Context, s *soak) error
}

// faults are the kinds of chaos the schedule draws from; every kind runs
// at least once per soak.
var faults = []fault{
	{"pg_restart_fast", func(ctx context.Context, s *soak) error { return s.pg.Restart() }},
	{"pg_restart_immediate", func(ctx context.Context, s *soak) error { return s.pg.RestartImmediate() }},
	{"backend_kill", func(ctx context.Context, s *soak) error {
		_, err := s.super(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'app'")
		return err
	}},
	{"backend_freeze", freezeBackend},
	{"net_delay", func(ctx context.Context, s *soak) error {
		s.pgProxy.SetDelay(200 * time.Millisecond)
		sleepCtx(ctx, 5*time.Second)
		s.pgProxy.SetDelay(0)
		return nil
	}},
	{"net_blackhole", func(ctx context.Context, s *soak) error {
		s.pgProxy.SetMode(faultproxy.Blackhole)
		sleepCtx(ctx, 4*time.Second)
		// Connections that lost bytes are out of step with PostgreSQL
		// for good: what a real blackhole leaves behind is a dead TCP
		// connection, so reset those that were open through it.
		s.pgProxy.ResetAll()
		s.pgProxy.SetMode(faultproxy.Forward)
		return nil
	}},
	{"net_reset", func(ctx context.Context, s *soak) error { s.pgProxy.ResetAll(); return nil }},
	{"client_gone_mid_tx", clientGoneMidTx},
	{"client_gone_mid_copy", clientGoneMidCopy},
	{"config_reload", func(ctx context.Context, s *soak) error { return s.reload() }},
	{"redis_stop", func(ctx context.Context, s *soak) error {
		if err := s.redisProxy.Pause(); err != nil {
			return err
		}
		s.redisProxy.ResetAll()
		sleepCtx(ctx, 3*time.Second)
		return s.redisProxy.Resume()
	}},
}

// event is one fault injected at a time of the run.
type event struct {
	fault      string
	start, end time.Time
	err        error
	recovery   time.Duration // end until the first successful probe; -1: none
}

// schedule draws the order of the faults from the seed: every kind once in
// a shuffled round, then more rounds while the run lasts.
func schedule(seed int64) func() fault {
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	var round []fault
	return func() fault {
		if len(round) == 0 {
			round = append([]fault(nil), faults...)
			rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		f := round[0]
		round = round[1:]
		return f
	}
}

// chaos injects faults one at a time, a random gap apart, until run ends.
func (s *soak) chaos(run context.Context) {
	next := schedule(s.seed)
	rng := rand.New(rand.NewPCG(uint64(s.seed), 2))
	// Let the load settle first.
	sleepCtx(run, s.sc.gap/2)
	for run.Err() == nil && time.Until(s.loadEnd) > s.sc.gap/2 {
		f := next()
		ev := event{fault: f.name, start: time.Now()}
		ev.err = f.do(run, s)
		ev.end = time.Now()
		s.logf("chaos: %s (%s)%s", f.name, ev.end.Sub(ev.start).Round(time.Millisecond), errSuffix(ev.err))
		s.evMu.Lock()
		s.events = append(s.events, ev)
		s.evMu.Unlock()
		gap := s.sc.gap/2 + time.Duration(rng.Int64N(int64(s.sc.gap)))
		sleepCtx(run, gap)
	}
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// super runs a query as the superuser straight on PostgreSQL and returns
// the first column of the first row as text.
func (s *soak) super(ctx context.Context, sql string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, s.pg.SuperDSN("soak"))
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	var v any
	if err := c.QueryRow(cctx, sql).Scan(&v); err != nil {
		return "", err
	}
	return fmt.Sprint(v), nil
}

// freezeBackend stops a backend of app that is running a statement or idle
// in a transaction (any of app's when none is) with SIGSTOP for longer than
// server_response_timeout, then lets it go on.
func freezeBackend(ctx context.Context, s *soak) error {
	var pid int32
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, s.pg.SuperDSN("soak"))
	if err != nil {
		return err
	}
	err = c.QueryRow(cctx, `SELECT pid FROM pg_stat_activity WHERE usename = 'app' AND datname = 'soak'
		ORDER BY state = 'idle', random() LIMIT 1`).Scan(&pid)
	_ = c.Close(context.Background())
	if err != nil {
		return err
	}
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP backend %d: %w", pid, err)
	}
	sleepCtx(ctx, s.sc.serverResponseTimeout+2*time.Second)
	if err := syscall.Kill(int(pid), syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGCONT backend %d: %w", pid, err)
	}
	return nil
}

// clientGoneMidTx opens a transaction that inserts a row, then closes the
// client's socket without a Terminate: the row must never be committed.
func clientGoneMidTx(ctx context.Context, s *soak) error {
	c, err := s.connectPgx(ctx, "soak")
	if err != nil {
		return err
	}
	id := s.nextID.Add(1)
	s.gone.record(id, failed)
	if _, err := c.Exec(ctx, fmt.Sprintf("BEGIN; INSERT INTO gone (id) VALUES (%d)", id)); err != nil {
		_ = c.Close(context.Background())
		return err
	}
	return c.PgConn().Conn().Close()
}

// clientGoneMidCopy starts a COPY FROM STDIN and closes the client's socket
// half way: none of the batch may be committed.
func clientGoneMidCopy(ctx context.Context, s *soak) error {
	c, err := s.connectPgx(ctx, "soak")
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	batch := -s.nextID.Add(1) // negative: not a copyLoop batch
	s.gone.record(batch, failed)
	rows := s.sc.copyBytes / copyRowBytes
	nc := c.PgConn().Conn()
	cctx, cancel := context.WithTimeout(ctx, 5*s.sc.opTimeout)
	defer cancel()
	_, err = c.PgConn().CopyFrom(cctx, newCopyReader(batch, rows, rows/2, func() { _ = nc.Close() }),
		"COPY copy_in (batch, payload) FROM STDIN")
	if err == nil {
		return errors.New("COPY completed although its client went away")
	}
	return nil
}
