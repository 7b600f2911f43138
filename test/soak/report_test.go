package soak

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// sample is poolerd's resource use at one moment, from its /metrics.
type sample struct {
	at         time.Duration // since the start of the soak
	label      string
	goroutines int
	fds        int
	rss        int64
	heap       int64 // Go heap in use (go_memstats_heap_inuse_bytes)
	clients    int
	sockets    socketCounts
}

// socketCounts are poolerd's open files by kind: its sockets by peer (from
// /proc, so Linux only) and the files that are not sockets.
type socketCounts struct {
	clients, servers, redis, otherSockets, files int
	// epolls counts the epoll instances among files.
	epolls int
	// fileKinds lists the other files by what they link to (a pipe, an
	// epoll instance, the log), for a failure to say which one is new.
	fileKinds string
}

func (c socketCounts) String() string {
	return fmt.Sprintf("%d client sockets, %d server sockets, %d Redis sockets, %d other sockets, %d other files",
		c.clients, c.servers, c.redis, c.otherSockets, c.files)
}

// socketsNow classifies poolerd's file descriptors.
func (s *soak) socketsNow() socketCounts {
	var c socketCounts
	pid := s.proc.Process.Pid
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return c
	}
	inodes := map[string]bool{}
	kinds := map[string]int{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		} else {
			c.files++
			if i := strings.Index(l, ":["); i > 0 && !strings.HasPrefix(l, "anon_inode:") {
				l = l[:i] // pipe:[123]: the kind, not the inode
			}
			kinds[l]++
			if l == "anon_inode:[eventpoll]" {
				c.epolls++
			}
		}
	}
	names := make([]string, 0, len(kinds))
	for k, n := range kinds {
		names = append(names, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(names)
	c.fileKinds = strings.Join(names, ", ")
	listenPort, _ := strconv.ParseInt(s.port(), 10, 64)
	found := 0
	for _, f := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			found++
			port := func(addr string) int64 {
				i := strings.LastIndexByte(addr, ':')
				p, _ := strconv.ParseInt(addr[i+1:], 16, 64)
				return p
			}
			local, remote := port(fs[1]), port(fs[2])
			switch {
			case fs[3] == "0A": // listening
				c.otherSockets++
			case remote == int64(s.pgProxy.Port()):
				c.servers++
			case remote == int64(s.redisProxy.Port()):
				c.redis++
			case local == listenPort:
				c.clients++
			default:
				c.otherSockets++
			}
		}
	}
	c.otherSockets += len(inodes) - found // unix sockets, epoll and the like
	return c
}

func (m sample) rssMiB() float64 { return float64(m.rss) / (1 << 20) }

// sampleNow scrapes /metrics.
func (s *soak) sampleNow(label string) sample {
	m := sample{at: time.Since(s.start), label: label}
	resp, err := http.Get("http://" + s.httpAddr + "/metrics")
	if err != nil {
		s.t.Errorf("scrape /metrics: %v", err)
		return m
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		s.t.Errorf("parse /metrics: %v", err)
		return m
	}
	val := func(name string) float64 {
		f, ok := fams[name]
		if !ok {
			return 0
		}
		sum := 0.0
		for _, x := range f.GetMetric() {
			switch {
			case x.GetGauge() != nil:
				sum += x.GetGauge().GetValue()
			case x.GetCounter() != nil:
				sum += x.GetCounter().GetValue()
			case x.GetUntyped() != nil:
				sum += x.GetUntyped().GetValue()
			}
		}
		return sum
	}
	m.goroutines = int(val("go_goroutines"))
	m.fds = int(val("process_open_fds"))
	m.rss = int64(val("process_resident_memory_bytes"))
	m.heap = int64(val("go_memstats_heap_inuse_bytes"))
	m.clients = int(val("poolerd_clients"))
	m.sockets = s.socketsNow()
	return m
}

// sampleLoop samples every sampleEvery until run ends.
func (s *soak) sampleLoop(run context.Context) {
	tick := time.NewTicker(s.sc.sampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-run.Done():
			return
		case <-tick.C:
		}
		m := s.sampleNow("")
		s.smMu.Lock()
		s.samples = append(s.samples, m)
		s.smMu.Unlock()
	}
}

// settle waits, after the load, until goroutines and open files are back
// within the slack of the baseline (idle_timeout closes the server
// connections the load opened), for at most a minute, and returns the last
// sample.
func (s *soak) settle(base sample) sample {
	deadline := time.Now().Add(time.Minute)
	for {
		m := s.sampleNow("after")
		s.smMu.Lock()
		s.samples = append(s.samples, m)
		s.smMu.Unlock()
		if backToBase(base, m) || time.Now().After(deadline) {
			s.logf("after the load: %d goroutines, %d open files (%s), RSS %.1f MiB", m.goroutines, m.fds, m.sockets, m.rssMiB())
			return m
		}
		time.Sleep(2 * time.Second)
	}
}

// report logs the summary and, with SOAK_REPORT, writes it as Markdown with
// an SVG plot beside it.
func (s *soak) report(base, end sample) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak report\n\n")
	fmt.Fprintf(&b, "Produced by `%s` on %s (%s); seed %d; load %s.\n\n", command(s.sc), time.Now().UTC().Format("2006-01-02"), s.sc.name, s.seed, s.sc.dur)
	fmt.Fprintf(&b, "| result | value |\n|---|---|\n")
	l := func(name string, v any) { fmt.Fprintf(&b, "| %s | %v |\n", name, v) }
	for _, x := range []struct {
		name string
		l    *ledger
	}{{"pgx transfers (acked / failed / unknown)", s.transfers}, {"psycopg transactions", s.pyLog}, {"psql transactions", s.psqlLog}} {
		c, _, _ := x.l.check(nil)
		l(x.name, fmt.Sprintf("%d / %d / %d", c[acked], c[failed], c[unknown]))
	}
	l("pgbench runs / clients aborted by faults", fmt.Sprintf("%d / %d", s.pgbenchRuns.Load(), s.pgbenchAborts.Load()))
	l("COPY in / out", fmt.Sprintf("%.0f MiB / %.0f MiB", float64(s.copyIn.Load())/(1<<20), float64(s.copyOut.Load())/(1<<20)))
	l("notifications sent / received (session mode)", fmt.Sprintf("%d / %d", s.notifySent.Load(), s.notifyGot.Load()))
	l("idle client logins", s.idleLogins.Load())
	s.errs.mu.Lock()
	codes := make([]string, 0, len(s.errs.bySQL))
	for c, n := range s.errs.bySQL {
		codes = append(codes, fmt.Sprintf("%s ×%d", c, n))
	}
	sort.Strings(codes)
	l("client errors with a SQLSTATE", strings.Join(codes, ", "))
	l("Go client errors without an ErrorResponse / hung clients / dirty server connections", fmt.Sprintf("%d / %d / %d", s.errs.dropped, s.errs.hung, s.errs.dirty))
	l("closes reported by client libraries that were sent the FATAL (libpq: a FATAL behind a ReadyForQuery; pgconn: mid-COPY)", s.errs.closeReported)
	l("streams ended mid-message (server lost mid-frame: no message possible)", s.errs.midMessage)
	l("connects to poolerd unanswered while no listen queue overflowed (the machine's network, not poolerd)", s.errs.dialLost)
	s.errs.mu.Unlock()
	l("goroutines (baseline → after)", fmt.Sprintf("%d → %d", base.goroutines, end.goroutines))
	l("open files (baseline → after)", fmt.Sprintf("%d → %d", base.fds, end.fds))
	l("open files after the load, by kind", end.sockets)
	l("RSS (baseline → after)", fmt.Sprintf("%.1f MiB → %.1f MiB", base.rssMiB(), end.rssMiB()))
	if sl, ok := s.memorySlope(); ok {
		l(fmt.Sprintf("memory slope over the last %s of the load (least squares, %d samples)", sl.window.Round(time.Minute), sl.n),
			fmt.Sprintf("RSS %+.1f MiB/h, Go heap %+.1f MiB/h (bound when the window is %s or more: %d and %d MiB/h)",
				sl.rssPerHour, sl.heapPerHour, slopeMinWindow, rssSlopeBound, heapSlopeBound))
	}
	l("failed checks", map[bool]string{true: "some (see the test output)", false: "none"}[s.t.Failed()])

	fmt.Fprintf(&b, "\n## p99 latency per minute (short pgx transfers: BEGIN, 6 statements, COMMIT)\n\n| minute | transfers | p99 |\n|---|---|---|\n")
	mins, p99, n := s.lat.p99()
	for i, m := range mins {
		fmt.Fprintf(&b, "| %d | %d | %s |\n", m+1, n[i], p99[i].Round(100*time.Microsecond))
	}
	fmt.Fprintf(&b, "\n## Faults and recovery\n\nRecovery: from the end of the fault to the first successful `SELECT 1` sent through poolerd after it (a probe every 50 ms).\n\n| at | fault | lasted | recovery |\n|---|---|---|---|\n")
	s.evMu.Lock()
	for _, ev := range s.events {
		rec := "never"
		if ev.recovery >= 0 {
			rec = ev.recovery.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", ev.start.Sub(s.start).Round(time.Second), ev.fault, ev.end.Sub(ev.start).Round(time.Millisecond), rec)
	}
	s.evMu.Unlock()
	text := b.String()
	s.t.Log("\n" + text)
	path := os.Getenv("SOAK_REPORT")
	if path == "" {
		return
	}
	svgPath := strings.TrimSuffix(path, filepath.Ext(path)) + ".svg"
	text += fmt.Sprintf("\n## Resources over time\n\n![goroutines, open files, RSS and clients of poolerd during the soak](%s)\n", filepath.Base(svgPath))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		s.t.Errorf("write %s: %v", path, err)
	}
	if err := os.WriteFile(svgPath, []byte(s.plot()), 0o644); err != nil {
		s.t.Errorf("write %s: %v", svgPath, err)
	}
}

func command(sc scale) string {
	if v := os.Getenv("SOAK_MINUTES"); v != "" {
		return "make soak SOAK_MINUTES=" + v
	}
	return "go test -run TestSoak -v ./test/soak/"
}

// plot draws the samples as four small line charts in one SVG.
func (s *soak) plot() string {
	s.smMu.Lock()
	samples := append([]sample(nil), s.samples...)
	s.smMu.Unlock()
	s.evMu.Lock()
	events := append([]event(nil), s.events...)
	s.evMu.Unlock()
	series := []struct {
		name string
		v    func(sample) float64
	}{
		{"goroutines", func(m sample) float64 { return float64(m.goroutines) }},
		{"open files", func(m sample) float64 { return float64(m.fds) }},
		{"RSS (MiB)", func(m sample) float64 { return m.rssMiB() }},
		{"clients connected", func(m sample) float64 { return float64(m.clients) }},
	}
	const w, h, pad, left = 760, 150, 30, 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, len(series)*(h+pad)+pad)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	if len(samples) == 0 {
		b.WriteString("</svg>\n")
		return b.String()
	}
	tMax := samples[len(samples)-1].at.Seconds()
	x := func(sec float64) float64 { return left + (sec/tMax)*float64(w-left-20) }
	for i, sr := range series {
		top := float64(pad + i*(h+pad))
		vMax := 1.0
		for _, m := range samples {
			vMax = max(vMax, sr.v(m))
		}
		y := func(v float64) float64 { return top + float64(h) - v/vMax*float64(h) }
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, top-8, html.EscapeString(sr.name))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#999"/>`+"\n", left, top+float64(h), w-20, top+float64(h))
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%.0f</text>`+"\n", left-4, top+8, vMax)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">0</text>`+"\n", left-4, top+float64(h))
		for _, ev := range events {
			ex := x(ev.start.Sub(s.start).Seconds())
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#f4b6b6"><title>%s</title></line>`+"\n", ex, top, ex, top+float64(h), ev.fault)
		}
		var pts []string
		for _, m := range samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(m.at.Seconds()), y(sr.v(m))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="%s"/>`+"\n", strings.Join(pts, " "))
	}
	last := float64(pad + len(series)*(h+pad))
	fmt.Fprintf(&b, `<text x="%d" y="%.0f">seconds since start: 0 … %.0f; red lines: faults</text>`+"\n", left, last-8, tMax)
	b.WriteString("</svg>\n")
	return b.String()
}

// slope is how poolerd's memory moved during the load: the least-squares
// slope of RSS and of the Go heap over the samples of its last three
// quarters (the last 45 minutes of an hour), in MiB per hour.
type slope struct {
	window                  time.Duration
	n                       int
	rssPerHour, heapPerHour float64
}

// Bounds of the memory slope, checked when the window is at least
// slopeMinWindow (a shorter one is dominated by warm-up and faults). A leak
// of 1 KiB per transaction at the soak's rate is hundreds of MiB an hour.
const (
	slopeMinWindow = 30 * time.Minute
	rssSlopeBound  = 16 // MiB per hour
	heapSlopeBound = 8  // MiB per hour
)

// memorySlope computes the slope of the load's samples (label ""); false
// with fewer than 10 of them.
func (s *soak) memorySlope() (slope, bool) {
	s.smMu.Lock()
	var load []sample
	for _, m := range s.samples {
		if m.label == "" && m.rss > 0 {
			load = append(load, m)
		}
	}
	s.smMu.Unlock()
	if len(load) < 10 {
		return slope{}, false
	}
	from := load[0].at + (load[len(load)-1].at-load[0].at)/4
	i := 0
	for i < len(load) && load[i].at < from {
		i++
	}
	load = load[i:]
	if len(load) < 10 {
		return slope{}, false
	}
	fit := func(y func(sample) float64) float64 {
		var sx, sy, sxx, sxy float64
		for _, m := range load {
			x := m.at.Hours()
			sx += x
			sy += y(m)
			sxx += x * x
			sxy += x * y(m)
		}
		n := float64(len(load))
		den := n*sxx - sx*sx
		if den == 0 {
			return 0
		}
		return (n*sxy - sx*sy) / den
	}
	const mib = 1 << 20
	return slope{
		window:      load[len(load)-1].at - load[0].at,
		n:           len(load),
		rssPerHour:  fit(func(m sample) float64 { return float64(m.rss) / mib }),
		heapPerHour: fit(func(m sample) float64 { return float64(m.heap) / mib }),
	}, true
}

// memorySlope fits the load's last three quarters: the warm-up and the
// samples after the load are left out.
func TestMemorySlope(t *testing.T) {
	s := &soak{}
	const mib = 1 << 20
	// Warm-up: 100 MiB in the first 15 minutes, then 4 MiB/h of RSS and a
	// flat heap with noise, then the settle samples far above.
	for i := 0; i <= 120; i++ {
		at := time.Duration(i) * 30 * time.Second
		rss := 20.0 + 100*min(at.Minutes()/15, 1) + 4*at.Hours() + float64(i%3)
		s.samples = append(s.samples, sample{at: at, rss: int64(rss * mib), heap: int64((30 + float64(i%2)) * mib)})
	}
	s.samples = append(s.samples, sample{at: 61 * time.Minute, label: "after", rss: 900 * mib, heap: 900 * mib})
	sl, ok := s.memorySlope()
	if !ok || sl.window != 45*time.Minute || sl.n != 91 {
		t.Fatalf("%+v, %v: want the last 45 minutes, 91 samples", sl, ok)
	}
	if sl.rssPerHour < 3.5 || sl.rssPerHour > 4.5 || sl.heapPerHour < -0.5 || sl.heapPerHour > 0.5 {
		t.Errorf("slopes RSS %.2f, heap %.2f MiB/h; want about 4 and 0", sl.rssPerHour, sl.heapPerHour)
	}
	if _, ok := (&soak{samples: s.samples[:5]}).memorySlope(); ok {
		t.Error("a slope from 5 samples")
	}
}
