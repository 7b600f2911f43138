package main

import (
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"

	"github.com/poolerd/poolerd/internal/config"
	"github.com/poolerd/poolerd/internal/pgbini"
)

// convert is `poolerd convert pgbouncer.ini`: it prints the equivalent
// YAML configuration, with the settings poolerd does not honour listed at
// its top, and says on stderr whether it is valid as it stands.
func convert(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(stderr, "Usage: poolerd convert pgbouncer.ini > poolerd.yaml")
		if len(args) == 1 {
			return 0
		}
		return 2
	}
	res, err := pgbini.Load(args[0])
	if err != nil {
		fmt.Fprintln(stderr, "poolerd convert:", err)
		return 1
	}
	out, err := res.YAML()
	if err != nil {
		fmt.Fprintln(stderr, "poolerd convert:", err)
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintln(stderr, "poolerd convert:", err)
		return 1
	}
	if n := len(res.Ignored); n > 0 {
		fmt.Fprintf(stderr, "poolerd convert: %d settings poolerd does not honour are listed at the top of the output\n", n)
	}
	loader, err := config.NewLoader([]string{"--config", args[0]}, io.Discard)
	if err == nil {
		loader.Translate = pgbini.Translate
		var cfg *config.Config
		if cfg, err = loader.Load(); err == nil {
			for _, w := range cfg.Warnings() {
				fmt.Fprintln(stderr, "poolerd convert: it starts, but:", w)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "poolerd convert: the configuration is not valid as it stands (fix the ini or the YAML):")
		fmt.Fprintln(stderr, indent(err.Error()))
	}
	return 0
}

// warnIni logs, once at start, the settings of a pgbouncer.ini given as
// --config that poolerd does not honour, in one warning, and the keys set
// to PgBouncer's defaults. It names settings, never their values.
func warnIni(file string, log *zap.Logger) {
	if file == "" {
		return
	}
	data, err := os.ReadFile(file)
	if err != nil || !pgbini.Detect(data) {
		return
	}
	res, err := pgbini.Load(file)
	if err != nil {
		return // Load already refused it; not reached
	}
	log.Info("reading a pgbouncer.ini", zap.String("file", file), zap.Strings("pgbouncer_defaults", res.Defaulted))
	if len(res.Ignored) > 0 {
		log.Warn("pgbouncer.ini settings poolerd does not honour", zap.String("file", file), zap.Strings("settings", res.Warning()))
	}
}
