package metric

import "github.com/prometheus/client_golang/prometheus"

// Counter returns an unregistered counter.
func Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec returns an unregistered counter with the given label, its
// children for values created so that they are exported as 0 before the
// first increment.
func CounterVec(name, help, label string, values ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for _, val := range values {
		v.WithLabelValues(val)
	}
	return v
}

// Gauge returns an unregistered gauge.
func Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeFunc returns an unregistered gauge whose value is f's at scrape time.
func GaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
}

// Histogram returns an unregistered histogram with the given buckets.
func Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// Register registers cs with reg, all or none: on the first error it
// unregisters those it registered and returns the error unwrapped (so
// that callers can match prometheus.AlreadyRegisteredError). A nil reg
// registers nothing.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}
