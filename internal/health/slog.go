package health

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapHandler is a slog.Handler writing to a zap logger: exporter-toolkit
// logs with log/slog, poolerd with zap. Groups are flattened into the keys.
type zapHandler struct {
	log    *zap.Logger
	prefix string
}

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l >= slog.LevelError:
		return zapcore.ErrorLevel
	case l >= slog.LevelWarn:
		return zapcore.WarnLevel
	case l >= slog.LevelInfo:
		return zapcore.InfoLevel
	}
	return zapcore.DebugLevel
}

func (h zapHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.log.Core().Enabled(zapLevel(l))
}

func (h zapHandler) Handle(_ context.Context, r slog.Record) error {
	ce := h.log.Check(zapLevel(r.Level), r.Message)
	if ce == nil {
		return nil
	}
	fields := make([]zap.Field, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		fields = append(fields, h.field(a))
		return true
	})
	ce.Write(fields...)
	return nil
}

func (h zapHandler) field(a slog.Attr) zap.Field {
	return zap.Any(h.prefix+a.Key, a.Value.Resolve().Any())
}

func (h zapHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	fields := make([]zap.Field, len(attrs))
	for i, a := range attrs {
		fields[i] = h.field(a)
	}
	return zapHandler{log: h.log.With(fields...), prefix: h.prefix}
}

func (h zapHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return zapHandler{log: h.log, prefix: h.prefix + name + "."}
}
