package console

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pgbini"
	"github.com/poolerd/poolerd/internal/proxy"
	"github.com/poolerd/poolerd/internal/wire"
)

// control runs a command that changes something (admin users only).
func (s *session) control(cmd, arg string) ([]byte, bool, *wire.Error) {
	p := s.c.p
	tag := func() ([]byte, bool, *wire.Error) { return wire.AppendCommandComplete(nil, cmd), false, nil }
	switch cmd {
	case "RELOAD":
		if err := p.Reload(); err != nil {
			return nil, false, &wire.Error{Severity: "ERROR", Code: "F0000", Message: "RELOAD failed, see logs for additional details",
				Detail: err.Error(), Hint: "the running configuration is unchanged; fix the file and RELOAD again"}
		}
		return tag()
	case "SHUTDOWN":
		mode := strings.ToUpper(arg)
		p.RequestShutdown(mode)
		if mode == "" {
			return nil, true, nil // like PgBouncer: no reply, the process exits
		}
		return tag()
	case "SUSPEND":
		switch err := p.Suspend(); {
		case errors.Is(err, proxy.ErrPaused):
			return nil, false, errAlreadyPaused()
		case errors.Is(err, proxy.ErrDatabasesPaused):
			return nil, false, adminError("cannot suspend with paused databases")
		case err != nil:
			return nil, false, resumeError(err, "")
		}
		s.log.Info("admin console command", zap.String("command", cmd), zap.String("target", arg))
		return tag()
	case "KILL_CLIENT":
		id, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || arg == "" {
			return nil, false, adminError("invalid client pointer supplied")
		}
		if id == s.pc.ID || !p.KillClient(id) {
			return nil, false, adminError("client not found")
		}
		s.log.Info("admin console: client killed", zap.Uint64("killed_session", id))
		return tag()
	}
	// The rest take an optional or required database.
	if arg != "" && proxy.IsConsoleDatabase(arg) {
		verb := map[string]string{"PAUSE": "pause", "DISABLE": "disable", "ENABLE": "disable", "RECONNECT": "reconnect",
			"KILL": "kill", "WAIT_CLOSE": "wait in", "RESUME": "resume"}[cmd]
		return nil, false, adminError("cannot %s admin db: %s", verb, arg)
	}
	if arg == "" && (cmd == "DISABLE" || cmd == "ENABLE") {
		return nil, false, adminError("a database is required")
	}
	if arg != "" && !p.DatabaseKnown(arg) {
		return nil, false, adminError("no such database: %s", arg)
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	s.waitMu.Lock()
	s.waitCancel = cancel // a cancel request on this connection interrupts a wait
	s.waitMu.Unlock()
	defer func() {
		s.waitMu.Lock()
		s.waitCancel = nil
		s.waitMu.Unlock()
	}()
	var werr *wire.Error
	switch cmd {
	case "PAUSE":
		err := p.Pause(ctx, arg)
		switch {
		case errors.Is(err, proxy.ErrPaused):
			werr = errAlreadyPaused()
		case err != nil || context.Cause(ctx) != nil:
			// PgBouncer: a cancel request while PAUSE waits resumes.
			p.CancelPause(arg)
			werr = &wire.Error{Severity: "ERROR", Code: "57014", Message: "canceling PAUSE due to user request; resumed again"}
		}
	case "RESUME":
		werr = resumeError(p.Resume(arg), arg)
	case "DISABLE", "ENABLE":
		p.SetDisabled(arg, cmd == "DISABLE")
	case "RECONNECT":
		p.Reconnect(arg)
	case "KILL":
		if errors.Is(p.Kill(arg), proxy.ErrPaused) {
			werr = errAlreadyPaused()
		}
	case "WAIT_CLOSE":
		if p.WaitClose(ctx, arg) != nil {
			werr = &wire.Error{Severity: "ERROR", Code: "57014", Message: "canceling WAIT_CLOSE due to user request"}
		}
	}
	if werr != nil {
		return nil, false, werr
	}
	s.log.Info("admin console command", zap.String("command", cmd), zap.String("target", arg))
	return tag()
}

func errAlreadyPaused() *wire.Error { return adminError("already suspended/paused") }

// resumeError words the refusal of RESUME database ("" for all).
func resumeError(err error, database string) *wire.Error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, proxy.ErrShutdownInProgress):
		return adminError("pooler is shutting down")
	case database == "":
		return adminError("pooler is not paused/suspended")
	default:
		return adminError("database %s is not paused", database)
	}
}

// set runs SET key = value: a top-level key that can change at run time,
// applied like a reload; others are refused with the reason.
func (s *session) set(key, value string) ([]byte, bool, *wire.Error) {
	if !s.admin {
		return nil, false, errAdminAccess()
	}
	p := s.c.p
	// PgBouncer's names and units (server_idle_timeout = 30, seconds);
	// one of its settings may become more than one key (server_lifetime).
	settings, err := pgbini.SetKeys(key, value)
	if err != nil {
		return nil, false, &wire.Error{Severity: "ERROR", Code: "08P01", Message: "SET failed", Detail: err.Error(),
			Hint: "SHOW CONFIG lists the keys that can be set"}
	}
	for _, kv := range settings {
		if proxy.RestartRequired(kv.Key) {
			return nil, false, adminError("SET failed: %s can only change with a restart", kv.Key)
		}
	}
	var out []byte
	tag := "SET "
	for i, kv := range settings {
		key, value := kv.Key, fmt.Sprint(kv.Value)
		notice, err := p.Set(key, value)
		if err != nil {
			return nil, false, &wire.Error{Severity: "ERROR", Code: "08P01", Message: "SET failed", Detail: err.Error(),
				Hint: "SHOW CONFIG lists the keys; durations are seconds (30) or have a unit (30s, 500ms), lists are comma-separated"}
		}
		if notice != "" {
			out = (&wire.Error{Severity: "NOTICE", Code: "01000", Message: notice,
				Hint: "set the matching certificate, key or CA file too; the new TLS settings apply once they load together"}).AppendNotice(out)
		}
		// Never the password of the upstream or Redis URL.
		s.log.Info("admin console: setting changed", zap.String(key, config.Redact(key, value)))
		shown := value
		if key == "upstream" || key == "redis_url" {
			shown = config.FormatValue(p.Config(), key) // without the password
		}
		if i > 0 {
			tag += " "
		}
		tag += key + "=" + shown
	}
	return wire.AppendCommandComplete(out, tag), false, nil
}
