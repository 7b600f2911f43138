package config

import (
	"bytes"
	"fmt"
	"os"

	"github.com/spf13/viper"
)

// readFile reads the --config file into v: through Translate when that
// recognises it (a pgbouncer.ini), as YAML otherwise.
func (l *Loader) readFile(v *viper.Viper) (translated bool, err error) {
	data, err := os.ReadFile(l.File)
	if err != nil {
		return false, fmt.Errorf("config file: %w", err)
	}
	if l.Translate != nil {
		tree, ok, err := l.Translate(l.File, data)
		if err != nil {
			return false, fmt.Errorf("config file %s: %w", l.File, err)
		}
		if ok {
			if err := v.MergeConfigMap(tree); err != nil {
				return false, fmt.Errorf("config file %s: %w", l.File, err)
			}
			return true, nil
		}
	}
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		return false, fmt.Errorf("config file %s: %w", l.File, err)
	}
	return false, nil
}
