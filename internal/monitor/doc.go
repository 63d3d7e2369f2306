// Package monitor serves a component's operational HTTP endpoints:
// /metrics (Prometheus), /healthz (the process is up) and /readyz (the
// component can do its job), plus any extra handlers the command adds.
package monitor
