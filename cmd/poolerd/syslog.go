package main

import (
	"fmt"
	"log/syslog"
	"strings"

	"go.uber.org/zap/zapcore"

	"github.com/poolerd/poolerd/internal/config"
)

// syslogCore writes the log to syslog as well (syslog, syslog_ident,
// syslog_facility): each entry one message, its severity the level's.
type syslogCore struct {
	zapcore.LevelEnabler
	enc zapcore.Encoder
	w   *syslog.Writer
}

// newSyslogCore connects to the syslog daemon at network and addr (both
// empty: the local one, /dev/log) as ident, with facility.
func newSyslogCore(network, addr, ident, facility string, enc zapcore.Encoder, level zapcore.LevelEnabler) (*syslogCore, error) {
	f, ok := config.SyslogFacility(facility)
	if !ok {
		return nil, fmt.Errorf("syslog_facility %q is not auth, authpriv, daemon, user or local0 to local7", facility)
	}
	w, err := syslog.Dial(network, addr, f|syslog.LOG_INFO, ident)
	if err != nil {
		return nil, fmt.Errorf("syslog: %w", err)
	}
	return &syslogCore{LevelEnabler: level, enc: enc, w: w}, nil
}

func (c *syslogCore) With(fields []zapcore.Field) zapcore.Core {
	enc := c.enc.Clone()
	for _, f := range fields {
		f.AddTo(enc)
	}
	return &syslogCore{LevelEnabler: c.LevelEnabler, enc: enc, w: c.w}
}

func (c *syslogCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *syslogCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	buf, err := c.enc.EncodeEntry(ent, fields)
	if err != nil {
		return err
	}
	msg := strings.TrimSuffix(buf.String(), "\n")
	buf.Free()
	switch {
	case ent.Level <= zapcore.DebugLevel:
		return c.w.Debug(msg)
	case ent.Level == zapcore.InfoLevel:
		return c.w.Info(msg)
	case ent.Level == zapcore.WarnLevel:
		return c.w.Warning(msg)
	case ent.Level == zapcore.ErrorLevel:
		return c.w.Err(msg)
	default:
		return c.w.Crit(msg)
	}
}

func (c *syslogCore) Sync() error { return nil }
