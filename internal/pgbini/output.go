package pgbini

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/poolerd/poolerd/internal/config"
)

// Warning is the one message poolerd logs at start for the settings it
// does not honour, one per line; empty when there are none. It names
// settings, never their values.
func (res *Result) Warning() []string {
	out := make([]string, 0, len(res.Ignored))
	for _, ig := range res.Ignored {
		out = append(out, ig.String())
	}
	return out
}

// YAML writes the translated configuration as a poolerd YAML file: a
// header naming the ini and, as comments, every setting not honoured; the
// top-level keys in the order of docs/configuration.md, then databases and
// users. Loading it gives the same configuration as loading the ini.
func (res *Result) YAML() ([]byte, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# poolerd configuration converted from %s by `poolerd convert`.\n", res.File)
	fmt.Fprintf(&buf, "# Mapping and differences: docs/migrating-from-pgbouncer.md\n")
	if len(res.Ignored) > 0 {
		buf.WriteString("#\n# Settings poolerd does not honour:\n")
		for _, ig := range res.Ignored {
			fmt.Fprintf(&buf, "#   %s\n", ig)
		}
	}
	doc := &yaml.Node{Kind: yaml.MappingNode}
	var names []string
	for _, k := range config.Keys() {
		if _, ok := res.Tree[k.Name]; ok {
			names = append(names, k.Name)
		}
	}
	var rest []string
	for k := range res.Tree {
		if !slices.Contains(names, k) && k != "databases" && k != "users" {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	names = append(append(names, rest...), "databases", "users")
	for _, name := range names {
		v, ok := res.Tree[name]
		if !ok {
			continue
		}
		key := &yaml.Node{Kind: yaml.ScalarNode, Value: name}
		if slices.Contains(res.Defaulted, name) {
			key.HeadComment = "PgBouncer's default (the file does not set it)"
		}
		var val yaml.Node
		if err := val.Encode(orderEntries(v)); err != nil {
			return nil, fmt.Errorf("encode %s: %w", name, err)
		}
		doc.Content = append(doc.Content, key, &val)
	}
	buf.WriteString("\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	if !bytes.HasSuffix(buf.Bytes(), []byte("\n")) {
		buf.WriteByte('\n')
	}
	return buf.Bytes(), nil
}

// orderEntries gives the maps of the databases, users and peers lists a
// stable order, name (or a peer's id) first.
func orderEntries(v any) any {
	list, ok := v.([]any)
	if !ok {
		return v
	}
	var out []*yaml.Node
	for _, item := range list {
		m := item.(map[string]any)
		var first, keys []string
		for k := range m {
			if k == "name" || k == "id" {
				first = append(first, k)
			} else {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		n := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
		for _, k := range append(first, keys...) {
			var val yaml.Node
			_ = val.Encode(m[k])
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &val)
		}
		out = append(out, n)
	}
	return out
}

// MarkdownTable is the key-by-key table of docs/migrating-from-pgbouncer.md,
// generated from Rules so that the guide says what the code does.
func MarkdownTable() string {
	var b strings.Builder
	section := ""
	for _, r := range Rules() {
		if r.Section != section {
			section = r.Section
			fmt.Fprintf(&b, "\n### `[%s]`\n\n| PgBouncer | poolerd | notes |\n|---|---|---|\n", section)
		}
		to := "not honoured"
		if r.Honoured() {
			to = "`" + r.To + "`"
			if r.Section == "databases" || r.Section == "users" || r.Section == "peers" {
				to = "`" + r.Section + "[]." + r.To + "`"
			}
		}
		note := r.Note
		if r.Honoured() {
			if r.kind == kindSeconds {
				note = strings.TrimSpace("seconds become a duration. " + note)
			}
			if r.Default != "" {
				note = strings.TrimSpace(note + fmt.Sprintf(" Unset: PgBouncer's default `%s` is written.", r.Default))
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.Key, to, strings.ReplaceAll(note, "|", `\|`))
	}
	return strings.TrimPrefix(b.String(), "\n")
}
