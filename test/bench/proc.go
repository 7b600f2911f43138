package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cleaner runs registered cleanup functions once, last registered first,
// whichever of the normal exit, an error, a panic or a signal gets there
// first.
type cleaner struct {
	mu   sync.Mutex
	fns  []func()
	done bool
}

func (c *cleaner) add(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		f()
		return
	}
	c.fns = append(c.fns, f)
}

func (c *cleaner) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
	c.done = true
}

// proc is a long-running child (a pooler) started by the harness.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	exited  chan struct{}
	waitErr error

	stopOnce sync.Once
}

// startProc starts argv in its own process group with stdout and stderr
// appended to logPath. cred, when not nil, runs it as another OS user.
func startProc(name string, argv, env []string, dir, logPath string, cred *syscall.Credential) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = sysProcAttr(cred)
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, logFile: lf, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after 5 s.
func (p *proc) stop() {
	p.stopOnce.Do(func() {
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
			}
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // anything left in the group
		p.logFile.Close()
	})
}

// logTail returns the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cpuTicks returns utime+stime of pid in clock ticks, from /proc/PID/stat.
func cpuTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(data)
}

// parseStatCPU extracts utime+stime (fields 14 and 15) from a
// /proc/PID/stat line.
func parseStatCPU(data []byte) (int64, error) {
	st, err := parseStat(data)
	return st.utime + st.stime, err
}

// ctxSwitches returns the context switches of pid so far: the sum over its
// threads of voluntary_ctxt_switches and nonvoluntary_ctxt_switches from
// /proc/PID/task/TID/status. /proc/PID/status counts the main thread only,
// which would miss poolerd's event loops. The switches of threads that
// exited are lost, because /proc keeps no per-process total of them; that
// is acceptable here, as poolerd's and PgBouncer's threads live as long as
// the process.
func ctxSwitches(pid int) (int64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("context switches of %d: %w", pid, err)
	}
	var total int64
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join(dir, t.Name(), "status"))
		if err != nil {
			// The thread exited after ReadDir listed it; its switches
			// are lost like those of the threads that exited before.
			continue
		}
		n, err := parseCtxSwitches(data)
		if err != nil {
			return 0, fmt.Errorf("%s/%s/status: %w", dir, t.Name(), err)
		}
		total += n
	}
	return total, nil
}

// parseCtxSwitches returns voluntary_ctxt_switches +
// nonvoluntary_ctxt_switches of a /proc/PID/task/TID/status file. Both must
// be there: a status without them (a kernel without the fields) would
// otherwise read as a thread that never ran.
func parseCtxSwitches(data []byte) (int64, error) {
	var total int64
	var vol, nonvol bool
	for _, line := range strings.Split(string(data), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "voluntary_ctxt_switches":
			vol = true
		case "nonvoluntary_ctxt_switches":
			nonvol = true
		default:
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed %s: %w", key, err)
		}
		total += n
	}
	if !vol || !nonvol {
		return 0, errors.New("voluntary_ctxt_switches or nonvoluntary_ctxt_switches missing from /proc status")
	}
	return total, nil
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

// parseStat extracts the parent pid (field 4) and the CPU times (fields 14
// to 17) of a /proc/PID/stat line. The command name (field 2) may contain
// spaces and parentheses, so fields are counted from its closing
// parenthesis.
func parseStat(data []byte) (procStat, error) {
	var st procStat
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return st, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 15 {
		return st, errors.New("short /proc stat")
	}
	var v [4]int64
	for k := range v {
		n, err := strconv.ParseInt(f[11+k], 10, 64)
		if err != nil {
			return st, errors.New("malformed /proc stat times")
		}
		v[k] = n
	}
	st.ppid, _ = strconv.Atoi(f[1])
	st.utime, st.stime, st.cutime, st.cstime = v[0], v[1], v[2], v[3]
	return st, nil
}

// clusterTicks returns the CPU ticks a PostgreSQL cluster has used so far:
// the postmaster's own and those of the children it reaped
// (utime+stime+cutime+cstime), plus those of its live children.
func clusterTicks(pmPid int) int64 {
	if pmPid <= 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pmPid))
	if err != nil {
		return 0
	}
	pm, err := parseStat(data)
	if err != nil {
		return 0
	}
	total := pm.utime + pm.stime + pm.cutime + pm.cstime
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return total
	}
	for _, e := range dir {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		data, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		if st, err := parseStat(data); err == nil && st.ppid == pmPid {
			total += st.utime + st.stime
		}
	}
	return total
}

// postmasterPid reads the pid of a cluster's postmaster from its data
// directory.
func postmasterPid(dataDir string) int {
	data, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// machineBusyTicks returns the busy ticks of all CPUs from /proc/stat:
// everything but idle and iowait (user, nice, system, irq, softirq, steal).
func machineBusyTicks() int64 {
	busy, _ := machineTicks()
	return busy
}

// machineTicks returns the busy ticks of all CPUs (as machineBusyTicks)
// and, of those, the ticks the kernel charges to processes: all but the
// time stolen by the hypervisor (processes' utime and stime include the
// interrupt work done in their context, which /proc/stat lists apart).
func machineTicks() (busy, procs int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, s := range f[1:] {
		if i >= 8 { // user..steal; guest is already counted in user
			break
		}
		v, _ := strconv.ParseInt(s, 10, 64)
		switch i {
		case 3, 4: // idle, iowait
		case 7: // steal
			busy += v
		default: // user, nice, system, irq, softirq
			busy += v
			procs += v
		}
	}
	return busy, procs
}

// procStatusKB returns a "Vm..." field of /proc/PID/status in kB.
func procStatusKB(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", field, pid)
}

// openFilesLimit returns the soft "Max open files" of pid.
func openFilesLimit(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(line)
			if len(f) >= 5 {
				return f[3] + " (hard " + f[4] + ")"
			}
		}
	}
	return "?"
}

// ticksPerSecond is USER_HZ, set by main from clockTicks.
var ticksPerSecond int64 = 100

// selfTicks returns the harness's own utime+stime.
func selfTicks() int64 {
	t, _ := cpuTicks(os.Getpid())
	return t
}

// clockTicks returns the kernel's USER_HZ (getconf CLK_TCK), 100 if unknown.
func clockTicks() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}

// raiseNoFile raises the harness's RLIMIT_NOFILE soft limit to its hard
// limit. Children inherit it (calling Setrlimit also stops os/exec from
// restoring the original soft limit in children).
func raiseNoFile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return lim.Cur, nil
}
