package metricsref_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/meshid/meshid/internal/metricsref"
)

const root = "../.."

func TestReferenceUpToDate(t *testing.T) {
	want, err := metricsref.Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, metricsref.File))
	if err != nil {
		t.Fatalf("%v: run `%s` at the module's root", err, metricsref.Regenerate)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what the source defines: run `%s` at the module's root and commit the result", metricsref.File, metricsref.Regenerate)
	}
}

// Every metric defined in the source, the ones only a Kubernetes or
// federating CA registers included, passes promlint.
func TestDefinedMetricsLint(t *testing.T) {
	ms, err := metricsref.Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 50 {
		t.Fatalf("found %d metrics, fewer than the 50 or more the components define: the scan misses definitions", len(ms))
	}
	var mfs []*dto.MetricFamily
	for _, m := range ms {
		mfs = append(mfs, family(m))
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// family is a metric family with m's name, help and type and one series,
// what promlint reads.
func family(m metricsref.Metric) *dto.MetricFamily {
	name, help := m.Name, m.Help
	one := 1.0
	mf := &dto.MetricFamily{Name: &name, Help: &help}
	var s dto.Metric
	switch m.Type {
	case "counter":
		mf.Type = dto.MetricType_COUNTER.Enum()
		s.Counter = &dto.Counter{Value: &one}
	case "gauge":
		mf.Type = dto.MetricType_GAUGE.Enum()
		s.Gauge = &dto.Gauge{Value: &one}
	case "histogram":
		mf.Type = dto.MetricType_HISTOGRAM.Enum()
		s.Histogram = &dto.Histogram{}
	default:
		mf.Type = dto.MetricType_UNTYPED.Enum()
		s.Untyped = &dto.Untyped{Value: &one}
	}
	for _, l := range m.Labels {
		l, v := l, "x"
		s.Label = append(s.Label, &dto.LabelPair{Name: &l, Value: &v})
	}
	mf.Metric = []*dto.Metric{&s}
	return mf
}

// The scan reads the definitions as written: a metric added in a way it
// does not know is an error, not a silent omission.
func TestScanRefusesUnreadableDefinition(t *testing.T) {
	dir := t.TempDir()
	src := `package x

import "github.com/prometheus/client_golang/prometheus"

func f(name string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "H."})
}
`
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := metricsref.Scan(dir); err == nil || !strings.Contains(err.Error(), "not a constant") {
		t.Fatalf("Scan = %v, want an error naming the non-constant name", err)
	}
}
