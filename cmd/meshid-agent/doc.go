// Command meshid-agent is the lean node agent for the sidecar image: the
// same command, flags and istio-agent environment fallbacks as
// `meshid agent`, without the CA side, client-go, cfssl or plotting linked
// in (docs/benchmarks.md, "Lean agent", has its size and memory).
package main
