package metric_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
)

func TestCounterVecExportsValuesAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	v := metric.CounterVec("meshid_test_total", "Test.", "result", "ok", "error")
	if err := metric.Register(reg, v); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || len(mfs[0].GetMetric()) != 2 {
		t.Fatalf("gathered %v, want one family with two series (one per value, at 0)", mfs)
	}
}

func TestRegisterAllOrNone(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := metric.Register(reg, metric.Gauge("meshid_test_taken", "Taken.")); err != nil {
		t.Fatal(err)
	}
	fresh := metric.Counter("meshid_test_fresh_total", "Fresh.")
	err := metric.Register(reg, fresh, metric.Gauge("meshid_test_taken", "Taken."))
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) {
		t.Fatalf("err = %v, want AlreadyRegisteredError", err)
	}
	// fresh was rolled back, so it can be registered again.
	if err := reg.Register(fresh); err != nil {
		t.Fatalf("fresh left registered after a failed Register: %v", err)
	}
}

func TestRegisterNilRegistry(t *testing.T) {
	if err := metric.Register(nil, metric.Counter("meshid_test_total", "Test.")); err != nil {
		t.Fatal(err)
	}
}
