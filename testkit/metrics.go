package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metric returns the value of the first sample of the metric family name in
// g whose labels include labels (name, value pairs): a counter's or gauge's
// value, or a histogram's sample count. It fails the test when there is no
// such sample.
//
// Tests are black-box, so they see a registry rather than the collectors
// that prometheus/testutil.ToFloat64 reads; and testutil's text comparisons
// cannot read one labelled sample out of a family.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := LookupMetric(t, g, name, labels...)
	if !ok {
		t.Fatalf("metric %s%v not found", name, labels)
	}
	return v
}

// LookupMetric is Metric for a series that may not exist yet (a condition
// polled until it does): ok is false while it is absent.
func LookupMetric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				return value(m), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return m.GetGauge().GetValue()
}
