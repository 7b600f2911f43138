package main

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fakePauser records PAUSE and RESUME; its Pause blocks until its context
// ends, like a pause waiting for a busy server connection.
type fakePauser struct {
	mu       sync.Mutex
	events   []string
	shutting bool
}

func (f *fakePauser) ShuttingDown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.shutting
}

func (f *fakePauser) add(e string) {
	f.mu.Lock()
	f.events = append(f.events, e)
	f.mu.Unlock()
}

func (f *fakePauser) Pause(ctx context.Context, database string) error {
	f.add("pause")
	<-ctx.Done()
	f.add("pause interrupted")
	return ctx.Err()
}

func (f *fakePauser) Resume(database string) error {
	f.add("resume")
	return nil
}

func (f *fakePauser) get() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}

// SIGUSR1 pauses; a SIGUSR2 while the pause still waits ends that wait
// before resuming, so the resume cannot be overtaken by the pause.
func TestPauseOnSignals(t *testing.T) {
	f := &fakePauser{}
	sigs := make(chan os.Signal)
	done := make(chan struct{})
	go func() {
		pauseOnSignals(f, sigs, zap.NewNop())
		close(done)
	}()
	sigs <- syscall.SIGUSR1
	deadline := time.Now().Add(5 * time.Second)
	for len(f.get()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	sigs <- syscall.SIGUSR2
	close(sigs)
	<-done
	got := f.get()
	want := []string{"pause", "pause interrupted", "resume"}
	if len(got) != len(want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %q, want %q", got, want)
		}
	}
}

// During a shutdown SIGUSR2 is ignored (PgBouncer's "got SIGUSR2 while
// shutting down, ignoring"): nothing is resumed.
func TestSIGUSR2IgnoredDuringShutdown(t *testing.T) {
	f := &fakePauser{shutting: true}
	sigs := make(chan os.Signal)
	done := make(chan struct{})
	core, logs := observer.New(zap.InfoLevel)
	go func() {
		pauseOnSignals(f, sigs, zap.New(core))
		close(done)
	}()
	sigs <- syscall.SIGUSR2
	close(sigs)
	<-done
	if got := f.get(); len(got) != 0 {
		t.Fatalf("events %q during a shutdown, want none", got)
	}
	if logs.FilterMessage("got SIGUSR2 while shutting down, ignoring").Len() != 1 {
		t.Fatalf("log: %v", logs.All())
	}
}
