// Package spire proves meshid's SPIFFE federation against a real SPIRE
// (issue 31): spire-server and spire-agent, built from
// github.com/spiffe/spire v1.13.3 by scripts/build-spire.sh, run on
// loopback beside a meshid CA and agent (the ca/caserver and sds/agent
// assemblies), each trust domain federating with the other over
// https_spiffe, and a workload of each completes mTLS with the other.
//
// It is a module of its own, like test/observability, so that it is not
// part of the main module's `go test ./...` (it needs the SPIRE binaries,
// `make spire-binary`); SPIRE's own module is built apart, in
// test/spire/tools, and is a dependency of neither.
package spire
