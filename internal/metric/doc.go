// Package metric builds and registers the Prometheus collectors of
// meshid's components, so that each component's metrics file lists only
// its names, help texts and labels.
package metric
