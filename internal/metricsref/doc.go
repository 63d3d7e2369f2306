// Package metricsref builds docs/reference/metrics.md, the reference of
// every Prometheus metric meshid's components register, from their
// source: the metric definitions (internal/metric's helpers, client_golang's
// constructors and descriptors) found in the module's non-test Go files,
// and the renamed metrics of internal/metric.Renames.
//
// Regenerate the file with `go run ./internal/metricsref/gen`; a test
// fails when the checked-in file differs, and another checks that every
// metric a running CA and agent register is in it and passes promlint.
package metricsref
