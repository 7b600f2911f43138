package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	metricRow  = regexp.MustCompile("(?m)^\\| `(poolerd_[a-z_]+)` \\|")
	metricName = regexp.MustCompile(`\bpoolerd_[a-z_]+`)
)

// TestMetricNamesAreDocumented: every poolerd_* metric that a doc, an
// alert rule or the Grafana dashboard names is a family of the metric
// tables in docs/observability.md (which test/integration checks against a
// live /metrics), so that no query names a metric that does not exist.
func TestMetricNamesAreDocumented(t *testing.T) {
	obs, err := os.ReadFile(filepath.Join(root, "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range metricRow.FindAllStringSubmatch(string(obs), -1) {
		known[m[1]] = true
	}
	if len(known) < 20 {
		t.Fatalf("only %d metrics in docs/observability.md's tables", len(known))
	}
	files := append(docFiles(t), filepath.Join(root, "deploy", "grafana", "poolerd.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range metricName.FindAllString(line, -1) {
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(m, suf); ok && known[b] {
						base = b
					}
				}
				// poolerd_s<N> is the name of poolerd's prepared
				// statements, not a metric.
				if !known[base] && m != "poolerd_s" {
					t.Errorf("%s:%d: %s is not a metric of docs/observability.md's tables", name, i+1, m)
				}
			}
		}
	}
}
