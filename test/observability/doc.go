// Package observability tests meshid's Prometheus alerts and Grafana
// dashboard (deploy/observability, shipped by the Helm chart) against the
// metrics a real CA and real agents export.
//
// It is a module of its own so that github.com/prometheus/prometheus (its
// rule parser, rulefmt, and its PromQL engine) stays out of meshid's go.mod
// and out of the production binaries. The tests start the CA (ca/caserver)
// and agents (sds/agent) in-process, drive them into healthy and failing
// states, scrape their /metrics endpoints over HTTP, load the scrapes into
// Prometheus's TSDB at chosen times and evaluate every alert expression
// there with PromQL, asserting which alerts fire.
package observability
