// Package agent assembles the node agent that `meshid agent` and
// `meshid-agent` run: the CA client (sds/caclient), the SecretManager
// (sds/secretcache), the Envoy SDS server on a Unix socket (sds) and the
// monitoring listener with its /debug/rotate endpoint.
//
// A Config holds every option as a typed value with its defaults; New
// validates it and builds the parts; Run serves until its context ends.
//
// The agent runs beside every pod, so this package and everything it
// imports stay lean: no CA side (ca/...), no client-go, cfssl or plotting
// (TestLean checks the import graph).
package agent
