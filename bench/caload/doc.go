// Package caload drives a meshid (or any Istio-compatible) CA with
// CreateCertificate calls, like ghz but CSR-aware, and reports throughput,
// latency percentiles and errors by gRPC code.
//
// Each request carries a CSR for one of the configured identities and that
// identity's bearer token, so the CA does its full authentication and
// authorization work. With Pregen, one key and CSR per identity are made
// before the clock starts, so client key generation is not measured; without
// it every request generates a fresh key, as a real agent does, and the
// client's key generation competes with the CA for the machine's CPUs.
//
// A Loader runs the same load at several concurrency levels (a sweep), so
// that a chart of throughput against concurrency shows where the CA
// saturates.
package caload
